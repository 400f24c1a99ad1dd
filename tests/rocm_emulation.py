"""Make vLLM take its ROCm code path on a CPU: call :func:`activate` before importing vLLM.

Two stand-ins (``tests/standins``) replace what needs an AMD GPU: ``amdsmi`` (the
hardware query vLLM's platform detection makes) and ``aiter`` (the kernel library,
whose ``pa_fwd_asm`` is the project's contract model). Everything else is the real
vLLM 0.33 package: platform, backend selection, layers, builders, ``forward``.
"""

from __future__ import annotations

import importlib.metadata
import os
import re
import sys
from collections.abc import Iterator
from pathlib import Path

STANDINS = Path(__file__).resolve().parent / "standins"
HARDWARE_STANDIN = STANDINS / "hw"  # amdsmi
KERNEL_STANDIN = STANDINS / "kernels"  # aiter

#: Compute units of the stand-in GPUs (MI300X/MI325X and MI355X).
COMPUTE_UNITS = {"gfx942": 304, "gfx950": 256}


class _AiterMetadata(importlib.metadata.Distribution):
    """The ``amd-aiter`` distribution's metadata, as AITER's wheel installs it: its name
    (``PACKAGE_NAME`` in ROCm/aiter ``setup.py``, HEAD e4048607) and version (its
    ``use_scm_version``), nothing else."""

    def __init__(self, version: str) -> None:
        self._text = f"Metadata-Version: 2.1\nName: amd-aiter\nVersion: {version}\n"

    def read_text(self, filename: str) -> str | None:
        return self._text if filename == "METADATA" else None

    def locate_file(self, path: str | os.PathLike[str]) -> Path:
        return KERNEL_STANDIN / path


class AiterDistributionFinder(importlib.metadata.DistributionFinder):
    """The stand-in AITER's distribution metadata for ``importlib.metadata`` (what
    vLLM's ``rocm_attn.py`` reads once stage 1 is written, and the plugin reads first):
    ``amd-aiter`` at ``$ASM_DECODE_TEST_AITER_VERSION``, read at each lookup as the
    stand-in's ``aiter._version`` reads it; unset, not installed."""

    def find_spec(self, *args: object, **kwargs: object) -> None:
        return None  # no module is imported through it

    def find_distributions(
        self, context: importlib.metadata.DistributionFinder.Context | None = None
    ) -> Iterator[importlib.metadata.Distribution]:
        name = getattr(context, "name", None)
        version = os.environ.get("ASM_DECODE_TEST_AITER_VERSION")
        if version and (name is None or re.sub(r"[-_.]+", "-", name.lower()) == "amd-aiter"):
            yield _AiterMetadata(version)


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
    if aiter and not any(isinstance(f, AiterDistributionFinder) for f in sys.meta_path):
        sys.meta_path.append(AiterDistributionFinder())
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
