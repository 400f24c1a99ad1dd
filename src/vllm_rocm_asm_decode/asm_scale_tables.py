"""Per-slot KV scale tables for AITER's asm paged attention, at next to no memory cost.

``pa_fwd_asm`` reads one fp32 dequant scale per cache slot, ``[num_blocks, num_kv_heads,
block_size]``, while every slot of a layer holds the layer's per-tensor scale. Such a
table needs one physical chunk of device memory: GPU virtual memory (``cuMem*`` on
CUDA, ``hipMem*`` on ROCm, the calls vLLM's sleep mode makes; same structures and flag
values) maps one chunk at every chunk-sized step of an address range of the table's
size. Filling the chunk sets every entry at once, in place, so a CUDA graph that
captured the table reads the new scale: a weight reload refills it.

Where the driver offers no virtual memory (the CPU, an old driver, a container that
forbids it), a table is a plain allocation of its full size. A table's memory is
released when the last tensor over it is dropped.

Imports nothing but torch.
"""

import ctypes
import math
import time
import weakref
from dataclasses import dataclass

import torch

# A table needs at most this many mappings; its chunk grows with it beyond that.
MAX_MAPPINGS = 256

# Flag values, the same in CUDA and HIP.
_ALLOCATION_PINNED = 1
_LOCATION_DEVICE = 1
_ACCESS_READ_WRITE = 3


class _Location(ctypes.Structure):
    _fields_ = [("type", ctypes.c_int), ("id", ctypes.c_int)]


class _AllocationProp(ctypes.Structure):
    _fields_ = [
        ("type", ctypes.c_int),
        ("requested_handle_types", ctypes.c_int),
        ("location", _Location),
        ("win32_handle_metadata", ctypes.c_void_p),
        ("compression_type", ctypes.c_ubyte),
        ("gpu_direct_rdma_capable", ctypes.c_ubyte),
        ("usage", ctypes.c_ushort),
        ("reserved", ctypes.c_ubyte * 4),
    ]


class _AccessDesc(ctypes.Structure):
    _fields_ = [("location", _Location), ("flags", ctypes.c_int)]


class VirtualMemory:
    """The driver's virtual-memory calls: ``cu*`` from libcuda, or ``hip*`` from
    libamdhip64 on ROCm; only the library and the prefix differ."""

    def __init__(self) -> None:
        if torch.version.hip:
            self.library, self.prefix = "libamdhip64.so", "hip"
        else:
            self.library, self.prefix = "libcuda.so.1", "cu"
        self._lib = ctypes.CDLL(self.library)

    def __call__(self, name: str, *args) -> None:
        function = getattr(self._lib, self.prefix + name)
        error = function(*args)
        if error != 0:
            raise RuntimeError(f"{self.prefix}{name} failed with error {error}")


_VM: list[VirtualMemory | None] = []


def virtual_memory() -> VirtualMemory | None:
    """The driver's virtual-memory calls, or None where they cannot be loaded."""
    if not _VM:
        try:
            _VM.append(VirtualMemory())
        except OSError:
            _VM.append(None)
    return _VM[0]


class _DeviceArray:
    """Device memory as ``__cuda_array_interface__``: the tensor torch makes over it
    keeps this object, and with it the mapping, alive."""

    def __init__(self, ptr: int, numel: int, owner: object) -> None:
        self.owner = owner
        self.__cuda_array_interface__ = {
            "shape": (numel,),
            "typestr": "<f4",
            "data": (ptr, False),
            "version": 3,
            "strides": None,
        }


class _Mapping:
    """One chunk mapped over a reserved range; unmapped and freed with this object."""

    def __init__(self, vm: VirtualMemory, device: torch.device, nbytes: int) -> None:
        index = (
            torch.accelerator.current_device_index()
            if device.index is None
            else device.index
        )
        prop = _AllocationProp(
            type=_ALLOCATION_PINNED, location=_Location(_LOCATION_DEVICE, index)
        )
        granularity = ctypes.c_size_t()
        vm(
            "MemGetAllocationGranularity",
            ctypes.byref(granularity),
            ctypes.byref(prop),
            0,
        )
        step = granularity.value
        self.chunk = step * max(1, math.ceil(nbytes / (step * MAX_MAPPINGS)))
        self.mappings = math.ceil(nbytes / self.chunk)
        size = self.mappings * self.chunk
        ptr, handle = ctypes.c_uint64(), ctypes.c_uint64()
        vm(
            "MemAddressReserve",
            ctypes.byref(ptr),
            ctypes.c_size_t(size),
            ctypes.c_size_t(self.chunk),
            ctypes.c_uint64(0),
            ctypes.c_uint64(0),
        )
        self.ptr = ptr.value
        state = {"mapped": 0, "handle": 0}
        release = weakref.finalize(self, _free, vm, self.ptr, size, self.chunk, state)
        try:
            vm(
                "MemCreate",
                ctypes.byref(handle),
                ctypes.c_size_t(self.chunk),
                ctypes.byref(prop),
                ctypes.c_uint64(0),
            )
            state["handle"] = handle.value
            for i in range(self.mappings):
                vm(
                    "MemMap",
                    ctypes.c_uint64(self.ptr + i * self.chunk),
                    ctypes.c_size_t(self.chunk),
                    ctypes.c_size_t(0),
                    handle,
                    ctypes.c_uint64(0),
                )
                state["mapped"] += 1
            access = _AccessDesc(_Location(_LOCATION_DEVICE, index), _ACCESS_READ_WRITE)
            vm(
                "MemSetAccess",
                ctypes.c_uint64(self.ptr),
                ctypes.c_size_t(size),
                ctypes.byref(access),
                ctypes.c_size_t(1),
            )
        except BaseException:
            release()
            raise


def _free(vm: VirtualMemory, ptr: int, size: int, chunk: int, state: dict) -> None:
    """Unmap, release the chunk, free the range (what was made of them)."""
    try:
        for i in range(state["mapped"]):
            vm("MemUnmap", ctypes.c_uint64(ptr + i * chunk), ctypes.c_size_t(chunk))
        if state["handle"]:
            vm("MemRelease", ctypes.c_uint64(state["handle"]))
        vm("MemAddressFree", ctypes.c_uint64(ptr), ctypes.c_size_t(size))
    except RuntimeError:
        pass  # the driver is already shutting down with the process


@dataclass
class AsmScaleTable:
    """One ``[num_blocks, num_kv_heads, block_size]`` fp32 table of equal entries."""

    #: What the kernel reads.
    tensor: torch.Tensor
    #: Writing this sets every entry: the one chunk (aliased) or the whole table.
    chunk: torch.Tensor
    #: One chunk mapped over the table's range (else a plain allocation).
    aliased: bool
    #: Device memory the table holds.
    nbytes: int
    #: Its mappings (1 for a plain allocation).
    mappings: int
    #: The scale its entries hold.
    scale: float

    def fill(self, scale: float) -> None:
        """Set every entry to ``scale``, in place (a device write, no host read)."""
        self.chunk.fill_(scale)
        self.scale = scale


def make_table(
    device: torch.device,
    shape: tuple[int, int, int],
    scale: float,
    aliased: bool = True,
) -> AsmScaleTable:
    """A table of ``shape`` holding ``scale``: aliased over one chunk where the driver
    offers virtual memory (and ``aliased``), else a plain allocation."""
    numel = math.prod(shape)
    vm = virtual_memory() if aliased and device.type == "cuda" else None
    if vm is not None:
        try:
            mapping = _Mapping(vm, device, numel * 4)
            base = mapping.ptr
            table = torch.as_tensor(_DeviceArray(base, numel, mapping), device=device)
            chunk = torch.as_tensor(
                _DeviceArray(base, mapping.chunk // 4, mapping), device=device
            )
            result = AsmScaleTable(
                table.view(shape), chunk, True, mapping.chunk, mapping.mappings, scale
            )
            result.fill(scale)
            return result
        except (RuntimeError, TypeError, ValueError):
            pass  # no virtual memory here after all: allocate
    table = torch.full(shape, scale, dtype=torch.float32, device=device)
    return AsmScaleTable(table, table, False, numel * 4, 1, scale)


def make_tables(
    device: torch.device,
    shape: tuple[int, int, int],
    scales: list[float],
    aliased: bool = True,
) -> tuple[list[AsmScaleTable], float]:
    """One table per scale, and the seconds the mapping took."""
    start = time.perf_counter()
    tables = [make_table(device, shape, scale, aliased) for scale in scales]
    return tables, time.perf_counter() - start
