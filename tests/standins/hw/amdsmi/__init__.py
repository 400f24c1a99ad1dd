"""Stand-in for AMD's ``amdsmi`` hardware query, for tests on machines without an AMD GPU.

vLLM's ROCm platform asks ``amdsmi`` at import time whether a GPU is present and
which graphics architecture it has. This module answers for one device whose
architecture is ``$ASM_DECODE_TEST_GFX`` (default ``gfx950``). It fakes the
hardware query only; everything vLLM does with the answer runs unmodified.
"""

from __future__ import annotations

import os
from enum import IntEnum

_HANDLE = "standin-gpu-0"


class AmdSmiException(Exception):
    """Raised by the real library on query failures."""


class AmdSmiMemoryType(IntEnum):
    VRAM = 0
    VIS_VRAM = 1
    GTT = 2


def amdsmi_init(*_args: object) -> None:
    return None


def amdsmi_shut_down() -> None:
    return None


def amdsmi_get_processor_handles() -> list[str]:
    return [_HANDLE]


def amdsmi_get_gpu_asic_info(_handle: str) -> dict[str, str]:
    arch = os.environ.get("ASM_DECODE_TEST_GFX", "gfx950")
    device_id = {"gfx942": "0x74a1", "gfx950": "0x75a0"}.get(arch, "0x0000")
    return {"target_graphics_version": arch, "device_id": device_id, "market_name": "stand-in"}


def amdsmi_get_gpu_device_uuid(_handle: str) -> str:
    return "00000000-0000-0000-0000-000000000000"


def amdsmi_get_gpu_memory_total(_handle: str, _kind: AmdSmiMemoryType) -> int:
    return 192 * 1024**3


def amdsmi_topo_get_link_type(_a: str, _b: str) -> dict[str, int]:
    return {"hops": 0, "type": 0}


def amdsmi_topo_get_numa_node_number(_handle: str) -> int:
    return 0
