"""Make vLLM take its ROCm code path on a CPU: call :func:`activate` before importing vLLM.

Two stand-ins (``tests/standins``) replace what needs an AMD GPU: ``amdsmi`` (the
hardware query vLLM's platform detection makes) and ``aiter`` (the kernel library,
whose ``pa_fwd_asm`` is the project's contract model). Everything else is the real
vLLM 0.33 package: platform, backend selection, layers, builders, ``forward``.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

STANDINS = Path(__file__).resolve().parent / "standins"
HARDWARE_STANDIN = STANDINS / "hw"  # amdsmi
KERNEL_STANDIN = STANDINS / "kernels"  # aiter

#: Compute units of the stand-in GPUs (MI300X/MI325X and MI355X).
COMPUTE_UNITS = {"gfx942": 304, "gfx950": 256}


def activate(arch: str | None = None, *, gpu: bool = True, aiter: bool = True) -> str:
    """Put the stand-ins on ``sys.path`` and set the environment vLLM reads at import.

    ``gpu=False`` leaves the hardware query out (vLLM then finds no platform);
    ``aiter=False`` leaves the kernel library out (as on a ROCm box without AITER).
    """
    arch = arch or os.environ.get("ASM_DECODE_TEST_GFX", "gfx950")
    os.environ["ASM_DECODE_TEST_GFX"] = arch
    for wanted, path in ((gpu, HARDWARE_STANDIN), (aiter, KERNEL_STANDIN)):
        if wanted and str(path) not in sys.path:
            sys.path.insert(0, str(path))
    os.environ["HIP_VISIBLE_DEVICES"] = ""  # vLLM's lenient driver check; no GPU is opened
    os.environ.setdefault("VLLM_ROCM_USE_AITER", "1")
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    os.environ.setdefault("VLLM_LOGGING_LEVEL", "INFO")
    return arch


def patch_compute_units(arch: str) -> None:
    """``current_platform.num_compute_units()`` asks torch for a GPU: answer for the arch."""
    from vllm.platforms import current_platform
    from vllm.utils import platform_utils

    type(current_platform).num_compute_units = classmethod(  # type: ignore[method-assign]
        lambda cls, device_id=0: COMPUTE_UNITS[arch]
    )
    platform_utils.num_compute_units.cache_clear()


def real_rocm_gpu() -> bool:
    """A ROCm build of torch that sees a GPU (then nothing is emulated)."""
    if os.environ.get("ASM_DECODE_TEST_EMULATE") == "1":
        return False
    import torch

    return bool(getattr(torch.version, "hip", None)) and torch.cuda.is_available()


def real_arch() -> str:
    import torch

    return torch.cuda.get_device_properties(0).gcnArchName.split(":")[0]
