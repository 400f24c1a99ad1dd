"""Per-slot KV scale tables for AITER's asm paged attention, at next to no memory cost,
that follow a weight reload.

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

:class:`AsmScaleTables` is one metadata builder's set: layers whose scales come from the
checkpoint own a K and a V table, refilled in place when a reload changes their scales
(:meth:`~AsmScaleTables.follow_reload`, host floats only); layers whose scales are fixed
share one table per scale. Imports nothing but torch (vLLM's quantization module only
when asked whether a layer's scales come from the checkpoint).
"""

import contextlib
import ctypes
import math
import operator
import time
import weakref
from dataclasses import dataclass
from typing import Any

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


_CALLS = (
    "MemGetAllocationGranularity",
    "MemAddressReserve",
    "MemCreate",
    "MemMap",
    "MemSetAccess",
    "MemUnmap",
    "MemRelease",
    "MemAddressFree",
)


def _loaded_library(stem: str, maps: str = "/proc/self/maps") -> str | None:
    """The path of the copy of ``stem`` this process has loaded (torch's), so that no
    second copy of the runtime comes in; None when none is loaded. Matched on the file
    name (``stem.so...`` or ``stem-<hash>.so...``) in ``/proc/self/maps``: ``libcudart``
    is not ``libcuda``."""
    try:
        with open(maps) as lines:
            for line in lines:
                path = line[line.find("/") :].strip() if "/" in line else ""
                name = path.rsplit("/", 1)[-1]
                if name.startswith((f"{stem}.so", f"{stem}-")):
                    return path
    except OSError:  # no /proc
        pass
    return None


class VirtualMemory:
    """The driver's virtual-memory calls: ``cu*`` from libcuda, or ``hip*`` from
    libamdhip64 on ROCm (the copy torch loaded); only the library and the prefix
    differ. Every call is resolved here: a library without one is no library."""

    def __init__(self) -> None:
        if torch.version.hip:
            stem, default, self.prefix = "libamdhip64", "libamdhip64.so", "hip"
        else:
            stem, default, self.prefix = "libcuda", "libcuda.so.1", "cu"
        self.library = _loaded_library(stem) or default
        lib = ctypes.CDLL(self.library)
        try:
            self._calls = {name: getattr(lib, self.prefix + name) for name in _CALLS}
        except AttributeError as exc:
            raise OSError(f"{self.library} lacks {exc}") from None
        for function in self._calls.values():
            function.restype = ctypes.c_int

    def __call__(self, name: str, *args) -> None:
        error = self._calls[name](*args)
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


def _device_memory(
    vm: VirtualMemory, device: torch.device
) -> tuple[_AllocationProp, int]:
    """Pinned memory on ``device`` (the current device when it has no index), and the
    driver's allocation granularity for it in bytes."""
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
    return prop, granularity.value


class _Mapping:
    """One chunk mapped over a reserved range; unmapped and freed with this object."""

    def __init__(self, vm: VirtualMemory, device: torch.device, nbytes: int) -> None:
        prop, step = _device_memory(vm, device)
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
        # At exit the driver tears the context down itself.
        release.atexit = False
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
            access = _AccessDesc(prop.location, _ACCESS_READ_WRITE)
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
    """Unmap, release the chunk, free the range (what was made of them). Runs when the
    last tensor over the table is dropped, which vLLM does only after the GPU work that
    reads it is done (it synchronizes before it drops a builder or a KV cache)."""
    calls: list[tuple[str, tuple[Any, ...]]] = [
        ("MemUnmap", (ctypes.c_uint64(ptr + i * chunk), ctypes.c_size_t(chunk)))
        for i in range(state["mapped"])
    ]
    if state["handle"]:
        calls.append(("MemRelease", (ctypes.c_uint64(state["handle"]),)))
    calls.append(("MemAddressFree", (ctypes.c_uint64(ptr), ctypes.c_size_t(size))))
    # Each on its own: one refused call (the driver already shutting down with the
    # process, say) does not keep the rest from being made.
    for name, args in calls:
        with contextlib.suppress(RuntimeError):
            vm(name, *args)


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
    fallback: bool = True,
) -> AsmScaleTable:
    """A table of ``shape`` holding ``scale``: aliased over one chunk where the driver
    offers virtual memory (and ``aliased``), else a plain allocation. Without
    ``fallback`` an aliased table that cannot be made raises ``RuntimeError``."""
    numel = math.prod(shape)
    vm = virtual_memory() if aliased and device.type == "cuda" else None
    if aliased and vm is None and not fallback:
        raise RuntimeError(f"no virtual memory on {device}")
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
        except (RuntimeError, TypeError, ValueError) as exc:
            if not fallback:
                if isinstance(exc, RuntimeError):
                    raise
                raise RuntimeError(f"aliased table on {device}: {exc}") from exc
            # no virtual memory here after all: allocate
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


def aliasing_available(device: torch.device) -> bool:
    """Whether tables on ``device`` can be aliased: a probe table of three mappings of
    one chunk, filled through the chunk and read back at its far end (one host read,
    at bind time), freed at once."""
    vm = virtual_memory() if device.type == "cuda" else None
    if vm is None:
        return False
    try:
        _, granularity = _device_memory(vm, device)
        rows = 3 * granularity // 64  # [rows, 1, 16] fp32: three chunks
        probe = make_table(device, (rows, 1, 16), 0.0, fallback=False)
        probe.fill(0.625)
        ok = probe.mappings == 3 and float(probe.tensor[-1, 0, -1]) == 0.625
    except RuntimeError:
        return False
    return ok


def checkpoint_scales(layer: Any) -> bool:
    """Whether a layer's KV scales may come from the checkpoint: vLLM gave it a
    KV-cache quantization method (every fp8 checkpoint's layers have one), which loads
    them, and loads them again on a weight reload; else they stay 1.0."""
    from vllm.model_executor.layers.quantization.kv_cache import BaseKVCacheMethod

    return isinstance(getattr(layer, "quant_method", None), BaseKVCacheMethod)


_K_FLOAT = operator.attrgetter("_k_scale_float")
_V_FLOAT = operator.attrgetter("_v_scale_float")


class AsmScaleTables:
    """One metadata builder's scale tables (released with it)."""

    def __init__(
        self, device: torch.device, aliased: bool | None = None, strict: bool = False
    ) -> None:
        self.device = device
        #: Aliased where the device offers virtual memory (decided at the first table).
        self.aliased = aliased
        #: Once aliased, a table the driver refuses raises ``RuntimeError`` (``strict``:
        #: the caller budgeted no allocation) or is allocated, the later ones shared.
        self.strict = strict
        self.shared: dict[tuple[tuple[int, int, int], float], AsmScaleTable] = {}
        #: The layers that own their tables, their tables, and the scales they hold.
        self.owners: list[Any] = []
        self.owned: list[tuple[AsmScaleTable, AsmScaleTable]] = []
        self._k: list[float] = []
        self._v: list[float] = []
        #: Seconds spent making tables.
        self.seconds = 0.0

    def _decide(self) -> bool:
        if self.aliased is None:
            self.aliased = aliasing_available(self.device)
        return self.aliased

    def _make(self, shape: tuple[int, int, int], scale: float) -> AsmScaleTable:
        aliased = self._decide()
        start = time.perf_counter()
        table = make_table(self.device, shape, scale, aliased, fallback=not self.strict)
        if aliased and not table.aliased:
            self.aliased = False
        self.seconds += time.perf_counter() - start
        return table

    def get(
        self, layer: Any, shape: tuple[int, int, int], own: bool | None = None
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """The K and V tables of ``layer``: its own where its scales may come from the
        checkpoint and tables are aliased (``own``, by default that), else shared with
        the layers of equal scale, as allocated tables always were."""
        k, v = layer._k_scale_float, layer._v_scale_float
        if own is None:
            own = self._decide() and checkpoint_scales(layer)
        if own:
            tables = (self._make(shape, k), self._make(shape, v))
            self.owners.append(layer)
            self.owned.append(tables)
            self._k.append(k)
            self._v.append(v)
        else:
            tables = (self._shared(shape, k), self._shared(shape, v))
        return tables[0].tensor, tables[1].tensor

    def _shared(self, shape: tuple[int, int, int], scale: float) -> AsmScaleTable:
        table = self.shared.get((shape, scale))
        if table is None:
            table = self.shared[(shape, scale)] = self._make(shape, scale)
        return table

    def changed(self) -> bool:
        """Whether a reload changed the scales of a layer that owns its tables (one
        comparison of host floats per layer)."""
        return list(map(_K_FLOAT, self.owners)) != self._k or (
            list(map(_V_FLOAT, self.owners)) != self._v
        )

    def follow_reload(self) -> list[Any]:
        """Refill, in place, the tables of the owning layers whose scales changed since
        (a weight reload); returns those layers. CUDA graphs captured before keep
        reading the same tables."""
        if not self.changed():
            return []
        changed = []
        for i, layer in enumerate(self.owners):
            k, v = _K_FLOAT(layer), _V_FLOAT(layer)
            if (k, v) != (self._k[i], self._v[i]):
                self.owned[i][0].fill(k)
                self.owned[i][1].fill(v)
                self._k[i], self._v[i] = k, v
                changed.append(self.owners[i])
        return changed

    def tables(self) -> list[AsmScaleTable]:
        return [*self.shared.values(), *(t for pair in self.owned for t in pair)]
