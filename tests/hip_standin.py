"""The HIP runtime's virtual-memory calls on the CPU (``standins/hip/hip_vm.c``), for the
runtime's own ``hipMem*`` path: :func:`build` compiles the library once per source (cached
by its hash, shared by the suite's processes), :class:`HipStandin` drives its test
controls, and :func:`runtime_vm` points ``asm_scale_tables`` at it.

Modes, as ``hip_vm.c`` models them from ROCm's source: ``clr=2026`` (minimum 4 KiB and
recommended 2 MiB granularity, every refusal returned) and ``clr=2024`` (4 KiB for both,
``hipMemMap`` returning success whatever became of the mapping); ``silent_map`` makes
every ``hipMemMap`` report success without mapping anything.
"""

from __future__ import annotations

import ctypes
import hashlib
import os
import shutil
import subprocess
import tempfile
from pathlib import Path

SOURCE = Path(__file__).resolve().parent / "standins" / "hip" / "hip_vm.c"
GRANULE_4K = 4096
GRANULE_2M = 2 << 20


def build() -> Path:
    """``libamdhip64.so`` built from :data:`SOURCE` (once per source text)."""
    text = SOURCE.read_bytes()
    digest = hashlib.sha256(text).hexdigest()[:16]
    out = Path(tempfile.gettempdir()) / f"asm-decode-hip-standin-{digest}" / "libamdhip64.so"
    if out.exists():
        return out
    compiler = shutil.which(os.environ.get("CC", "cc")) or shutil.which("gcc")
    if compiler is None:
        raise RuntimeError("no C compiler (cc or gcc) to build the HIP stand-in")
    out.parent.mkdir(parents=True, exist_ok=True)
    partial = out.with_name(f".{os.getpid()}.so")
    subprocess.run(
        [compiler, "-shared", "-fPIC", "-O1", "-Wall", "-Werror", "-o", str(partial), str(SOURCE)],
        check=True,
        capture_output=True,
    )
    partial.replace(out)  # atomic: processes building at once each get a whole library
    return out


class HipStandin:
    """The stand-in library as loaded in this process (the same copy the runtime loads)."""

    def __init__(self) -> None:
        self.path = build()
        self.lib = ctypes.CDLL(str(self.path))
        self.lib.hipStandinLiveMappings.restype = ctypes.c_long
        self.lib.hipStandinPhysicalBytes.restype = ctypes.c_size_t
        self.lib.hipStandinReservations.restype = ctypes.c_long
        self.configure()

    def configure(
        self,
        *,
        clr: int = 2026,
        min_granule: int = GRANULE_4K,
        rec_granule: int = GRANULE_2M,
        silent_map: bool = False,
        max_mappings: int = 65530,
        device_memory: int = 8 << 30,
    ) -> None:
        self.lib.hipStandinConfigure(
            ctypes.c_int(clr),
            ctypes.c_size_t(min_granule),
            ctypes.c_size_t(rec_granule),
            ctypes.c_int(int(silent_map)),
            ctypes.c_long(max_mappings),
            ctypes.c_int(1),
            ctypes.c_size_t(device_memory),
        )

    def live_mappings(self) -> int:
        return self.lib.hipStandinLiveMappings()

    def physical_bytes(self) -> int:
        return self.lib.hipStandinPhysicalBytes()

    def reservations(self) -> int:
        return self.lib.hipStandinReservations()


def runtime_vm(monkeypatch, module=None):
    """Point the runtime's virtual-memory calls (``asm_scale_tables``, or ``module``: the
    same file written into vLLM by stage 3) at the stand-in, for device ``cpu``; returns
    the :class:`HipStandin`."""
    if module is None:
        from vllm_rocm_asm_decode import asm_scale_tables as module

    standin = HipStandin()
    vm = module.VirtualMemory(library=str(standin.path), prefix="hip", device_type="cpu")
    monkeypatch.setattr(module, "_VM", [vm])
    return standin
