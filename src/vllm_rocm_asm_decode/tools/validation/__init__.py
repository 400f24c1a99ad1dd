"""Tools that produce the evidence on AMD GPUs: kernel timing, serving A/B, accuracy."""
