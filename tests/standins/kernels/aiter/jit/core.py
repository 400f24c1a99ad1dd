"""Stand-in for ``aiter.jit.core``: where the kernel tables live."""

import os
from pathlib import Path

AITER_ASM_DIR = str(Path(__file__).resolve().parent.parent / "hsa") + "/"
os.environ.setdefault("AITER_ASM_DIR", AITER_ASM_DIR)
