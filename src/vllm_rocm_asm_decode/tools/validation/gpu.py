"""Whether this machine can run the real kernels: a ROCm GPU of gfx942/gfx950 with AITER."""

from __future__ import annotations

from importlib.util import find_spec


def rocm_gpu_problem() -> str | None:
    """What is missing for the real asm decode here, in a few words; None if nothing."""
    import torch

    if not getattr(torch.version, "hip", None):
        return "this PyTorch build has no ROCm support"
    if not torch.cuda.is_available():
        return "no ROCm GPU is visible"
    arch = torch.cuda.get_device_properties(0).gcnArchName.split(":")[0]
    if arch not in ("gfx942", "gfx950"):
        return f"{arch} has no asm decode kernels (gfx942 and gfx950 do)"
    if find_spec("aiter") is None:
        return "AITER is not installed"
    return None
