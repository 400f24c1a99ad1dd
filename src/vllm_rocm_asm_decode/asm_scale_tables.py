"""Per-slot KV scale tables for AITER's asm paged attention, at next to no memory cost,
that follow a weight reload.

``pa_fwd_asm`` reads one fp32 dequant scale per cache slot, ``[num_blocks, num_kv_heads,
block_size]``, while every slot of a layer holds the layer's per-tensor scale. Such a
table needs one physical chunk of device memory: GPU virtual memory (``cuMem*`` on
CUDA, ``hipMem*`` on ROCm, the calls vLLM's sleep mode makes; same structures and flag
values) maps one chunk at every chunk-sized step of an address range of the table's
size. Filling the chunk sets every entry at once, in place, so a CUDA graph that
captured the table reads the new scale: a weight reload refills it.

What the drivers take, from their source (ROCm/clr ``hipamd/src/hip_vm.cpp``): a chunk
is a power of two of at least 2 MiB, the reserved range's alignment (ROCm refuses an
alignment that is not a power of two) and a multiple of the allocation granularity
(4 KiB minimum and 2 MiB recommended on MI300X/MI355X; 2 MiB on CUDA). A table takes at
most 256 mappings (its chunk grows beyond), and the process's tables at most
:func:`mapping_bound` in all (ROCm 7.x makes a CPU mapping for every ``hipMemMap``,
counted against ``vm.max_map_count``). Older ROCm runtimes report a mapping made when it
failed underneath, so every aliased table is read back whole once, on the device, right
after it is filled (one host read, at bind time); aliasing needs ROCm 7.0 or later, the
first whose tests map one allocation at several addresses.

Where the driver offers no virtual memory (the CPU, an old driver, a container that
forbids it) or a table cannot be aliased, a table is a plain allocation of its full size
(or, where the caller allows none, ``RuntimeError``; :class:`MappingLimitError` past the
mapping bound). A table's memory is released when the last tensor over it is dropped.

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
import re
import time
import weakref
from dataclasses import dataclass
from typing import Any

import torch

#: A table's chunk is a power of two of at least this many bytes.
MIN_CHUNK = 2 << 20
# A table needs at most this many mappings; its chunk grows with it beyond that.
MAX_MAPPINGS = 256
#: The first ROCm whose own tests map one allocation at several addresses (hip-tests'
#: Map2MultVMMs) and check what ``hipMemMap`` did; PyTorch uses HIP virtual memory from
#: ROCm 7.0.2.
MIN_ROCM = (7, 0)
#: The share of ``vm.max_map_count`` the process's tables may take, and that count where
#: it cannot be read (the kernel's default).
MAP_COUNT_SHARE = 4
DEFAULT_MAX_MAP_COUNT = 65530

# Flag values, the same in CUDA and HIP.
_ALLOCATION_PINNED = 1
_LOCATION_DEVICE = 1
_ACCESS_READ_WRITE = 3
_GRANULARITY_MINIMUM = 0
_GRANULARITY_RECOMMENDED = 1


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


def rocm_problem(version: str | None) -> str | None:
    """Why this ROCm (``torch.version.hip``) gets no aliased tables; None if it does."""
    found = re.match(r"(\d+)\.(\d+)", version or "")
    if found is None:
        return f"ROCm version {version!r} not understood"
    if (int(found[1]), int(found[2])) < MIN_ROCM:
        return f"ROCm {found[1]}.{found[2]} is older than {MIN_ROCM[0]}.{MIN_ROCM[1]}"
    return None


class VirtualMemory:
    """The driver's virtual-memory calls: ``cu*`` from libcuda, or ``hip*`` from
    libamdhip64 on ROCm (the copy torch loaded); only the library and the prefix
    differ. Every call is resolved here: a library without one is no library.

    ``library``/``prefix`` name another library of the same calls, whose memory is that
    of ``device_type`` devices (the tests' HIP stand-in maps host memory: ``cpu``)."""

    def __init__(
        self,
        library: str | None = None,
        prefix: str | None = None,
        device_type: str = "cuda",
    ) -> None:
        if library is None:
            if torch.version.hip:
                problem = rocm_problem(torch.version.hip)
                if problem is not None:
                    raise OSError(problem)
                stem, default, prefix = "libamdhip64", "libamdhip64.so", "hip"
            else:
                stem, default, prefix = "libcuda", "libcuda.so.1", "cu"
            library = _loaded_library(stem) or default
        self.library, self.prefix = library, prefix or "cu"
        self.device_type = device_type
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


_VM: list[VirtualMemory | str] = []


def virtual_memory() -> VirtualMemory | None:
    """The driver's virtual-memory calls, or None where they cannot be loaded."""
    if not _VM:
        try:
            _VM.append(VirtualMemory())
        except OSError as exc:
            _VM.append(str(exc) or type(exc).__name__)
    vm = _VM[0]
    return vm if isinstance(vm, VirtualMemory) else None


def mapping_bound() -> int:
    """How many mappings the tables of this process may hold in all: a quarter of
    ``vm.max_map_count`` (ROCm 7.x makes a CPU mapping for every ``hipMemMap``)."""
    try:
        with open("/proc/sys/vm/max_map_count") as f:
            limit = int(f.read())
    except (OSError, ValueError):
        limit = DEFAULT_MAX_MAP_COUNT
    return limit // MAP_COUNT_SHARE


#: Mappings the tables of this process hold now.
_LIVE = [0]


def live_mappings() -> int:
    return _LIVE[0]


class MappingLimitError(RuntimeError):
    """A table would take the process past :func:`mapping_bound` mappings."""

    def __init__(self, needed: int, bound: int) -> None:
        super().__init__(
            f"{needed} more mappings would pass the bound of {bound} ({_LIVE[0]} held)"
        )
        self.bound = bound


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


def _tensor_over(
    ptr: int, numel: int, owner: object, device: torch.device
) -> torch.Tensor:
    """fp32 values at ``ptr`` as a tensor that keeps ``owner`` alive: device memory
    through ``__cuda_array_interface__``, host memory (the tests' HIP stand-in) as a
    buffer."""
    if device.type == "cpu":
        values = (ctypes.c_float * numel).from_address(ptr)
        values.owner = owner  # type: ignore[attr-defined]
        return torch.frombuffer(values, dtype=torch.float32)
    return torch.as_tensor(_DeviceArray(ptr, numel, owner), device=device)


def _device_memory(
    vm: VirtualMemory, device: torch.device
) -> tuple[_AllocationProp, int]:
    """Pinned memory on ``device`` (the current device when it has no index; 0 for host
    memory), and the driver's allocation granularity for it in bytes: the larger of its
    minimum and recommended ones."""
    index = device.index
    if index is None:
        index = 0 if device.type == "cpu" else torch.accelerator.current_device_index()
    prop = _AllocationProp(
        type=_ALLOCATION_PINNED, location=_Location(_LOCATION_DEVICE, index)
    )
    found = []
    for option in (_GRANULARITY_MINIMUM, _GRANULARITY_RECOMMENDED):
        granularity = ctypes.c_size_t()
        vm(
            "MemGetAllocationGranularity",
            ctypes.byref(granularity),
            ctypes.byref(prop),
            option,
        )
        found.append(granularity.value)
    return prop, max(found)


def chunk_bytes(nbytes: int, granularity: int) -> int:
    """The chunk of a table of ``nbytes``: the smallest power of two of at least
    :data:`MIN_CHUNK` and ``granularity`` that maps the table in at most
    :data:`MAX_MAPPINGS` steps; ``RuntimeError`` if the granularity divides none."""
    least = max(MIN_CHUNK, granularity, -(-nbytes // MAX_MAPPINGS), 1)
    chunk = 1 << (least - 1).bit_length()
    if granularity <= 0 or chunk % granularity:
        raise RuntimeError(f"allocation granularity {granularity} divides no chunk")
    return chunk


class _Mapping:
    """One chunk mapped over a reserved range; unmapped and freed with this object (or
    at once by :meth:`release`)."""

    def __init__(self, vm: VirtualMemory, device: torch.device, nbytes: int) -> None:
        prop, granularity = _device_memory(vm, device)
        self.chunk = chunk_bytes(nbytes, granularity)
        self.mappings = math.ceil(nbytes / self.chunk)
        bound = mapping_bound()
        if _LIVE[0] + self.mappings > bound:
            raise MappingLimitError(self.mappings, bound)
        size = self.mappings * self.chunk
        ptr, handle = ctypes.c_uint64(), ctypes.c_uint64()
        vm(
            "MemAddressReserve",
            ctypes.byref(ptr),
            ctypes.c_size_t(size),
            ctypes.c_size_t(self.chunk),  # a power of two, as ROCm requires
            ctypes.c_uint64(0),
            ctypes.c_uint64(0),
        )
        self.ptr = ptr.value
        state = {"mapped": 0, "handle": 0}
        self.release = weakref.finalize(
            self, _free, vm, self.ptr, size, self.chunk, state
        )
        # At exit the driver tears the context down itself.
        self.release.atexit = False
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
                _LIVE[0] += 1
            access = _AccessDesc(prop.location, _ACCESS_READ_WRITE)
            vm(
                "MemSetAccess",
                ctypes.c_uint64(self.ptr),
                ctypes.c_size_t(size),
                ctypes.byref(access),
                ctypes.c_size_t(1),
            )
        except BaseException:
            self.release()
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
        if name == "MemUnmap":  # unmapped now, or never mapped where the driver says so
            _LIVE[0] -= 1
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


def _aliased_table(
    vm: VirtualMemory, device: torch.device, shape: tuple[int, int, int], scale: float
) -> AsmScaleTable:
    """One chunk mapped over a table of ``shape``, filled with ``scale`` and read back
    whole on the device (one host read): ``RuntimeError`` if an entry is not ``scale``,
    as where the driver reported a mapping it did not make."""
    numel = math.prod(shape)
    mapping = _Mapping(vm, device, numel * 4)
    table = _tensor_over(mapping.ptr, numel, mapping, device).view(shape)
    chunk = _tensor_over(mapping.ptr, mapping.chunk // 4, mapping, device)
    result = AsmScaleTable(table, chunk, True, mapping.chunk, mapping.mappings, scale)
    result.fill(scale)
    # Smallest and largest entry: a reduction, so no table-sized temporary is allocated.
    stored = ctypes.c_float(scale).value  # the scale as fp32 holds it
    if torch.stack(torch.aminmax(table)).tolist() != [stored, stored]:
        del result, table, chunk
        mapping.release()
        raise RuntimeError(
            f"an aliased table of {numel * 4} bytes read back wrong after it was "
            "filled: the driver reported mappings it did not make"
        )
    return result


def make_table(
    device: torch.device,
    shape: tuple[int, int, int],
    scale: float,
    aliased: bool = True,
    fallback: bool = True,
) -> AsmScaleTable:
    """A table of ``shape`` holding ``scale``: aliased over one chunk where the driver
    offers virtual memory (and ``aliased``), else a plain allocation. Without
    ``fallback`` an aliased table that cannot be made raises ``RuntimeError``
    (:class:`MappingLimitError` past the process's mapping bound)."""
    vm = virtual_memory() if aliased else None
    if vm is not None and device.type != vm.device_type:
        vm = None
    if aliased and vm is None and not fallback:
        raise RuntimeError(f"no virtual memory on {device}")
    if vm is not None:
        try:
            return _aliased_table(vm, device, shape, scale)
        except (RuntimeError, TypeError, ValueError) as exc:
            if not fallback:
                if isinstance(exc, RuntimeError):
                    raise
                raise RuntimeError(f"aliased table on {device}: {exc}") from exc
            # not aliased here after all: allocate
    table = torch.full(shape, scale, dtype=torch.float32, device=device)
    return AsmScaleTable(table, table, False, table.numel() * 4, 1, scale)


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


def aliasing_problem(
    device: torch.device, shape: tuple[int, int, int] | None = None
) -> str | None:
    """Why tables on ``device`` are not aliased; None when they are. Probed once with a
    table of ``shape`` (a real table's; three chunks by default), made, read back whole
    and freed at once."""
    vm = virtual_memory()
    if vm is None or device.type != vm.device_type:
        if device.type != "cuda":
            return f"no GPU virtual memory for {device.type} tensors"
        return f"no GPU virtual memory: {_VM[0]}"
    if device.type == "cuda" and torch.cuda.is_current_stream_capturing():
        return "a CUDA graph is being captured"  # the probe reads back on the host
    if shape is None:
        try:
            _, granularity = _device_memory(vm, device)
        except RuntimeError as exc:
            return str(exc)
        shape = (3 * max(granularity, MIN_CHUNK) // 64, 1, 16)  # three chunks
    try:
        make_table(device, shape, 0.625, fallback=False)
    except RuntimeError as exc:
        return str(exc)
    return None


def aliasing_available(
    device: torch.device, shape: tuple[int, int, int] | None = None
) -> bool:
    """Whether tables on ``device`` can be aliased (see :func:`aliasing_problem`)."""
    return aliasing_problem(device, shape) is None


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
        #: Aliased where the device offers virtual memory (probed at the first table).
        self.aliased = aliased
        #: Why tables are not aliased (None while they are, or before the probe).
        self.problem: str | None = None
        #: Once aliased, a table the driver refuses raises ``RuntimeError`` (``strict``:
        #: the caller budgeted no allocation) or is allocated, the later ones too.
        self.strict = strict
        #: Tables shared by value, by (shape, 0 for K or 1 for V, scale, aliased): K's
        #: apart from V's, so that a reload parting equal K and V scales refills both.
        self.shared: dict[tuple, AsmScaleTable] = {}
        #: The layers that own their tables, their tables, and the scales they hold.
        self.owners: list[Any] = []
        self.owned: list[tuple[AsmScaleTable, AsmScaleTable]] = []
        self._k: list[float] = []
        self._v: list[float] = []
        #: Seconds spent making tables.
        self.seconds = 0.0

    def probe(self, shape: tuple[int, int, int]) -> bool:
        """Whether this set's tables are aliased: probed once, with a table of
        ``shape`` (see :func:`aliasing_problem`); ``problem`` says why not."""
        if self.aliased is None:
            self.problem = aliasing_problem(self.device, shape)
            self.aliased = self.problem is None
        return self.aliased

    def _make(
        self, shape: tuple[int, int, int], scale: float, aliased: bool
    ) -> AsmScaleTable:
        start = time.perf_counter()
        table = make_table(self.device, shape, scale, aliased, fallback=not self.strict)
        if aliased and not table.aliased:
            self.aliased = False
            self.problem = "an aliased table could not be made"
        self.seconds += time.perf_counter() - start
        return table

    def get(
        self,
        layer: Any,
        shape: tuple[int, int, int],
        own: bool | None = None,
        aliased: bool | None = None,
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """The K and V tables of ``layer``: its own where its scales may come from the
        checkpoint and tables are aliased (``own``, by default that), else shared with
        the layers of equal scale, as allocated tables always were. ``aliased``: False
        allocates them whatever the device offers."""
        k, v = layer._k_scale_float, layer._v_scale_float
        alias = self.probe(shape) and aliased is not False
        if own is None:
            own = alias and checkpoint_scales(layer)
        if own:
            tables = (self._make(shape, k, alias), self._make(shape, v, alias))
            self.owners.append(layer)
            self.owned.append(tables)
            self._k.append(k)
            self._v.append(v)
        else:
            tables = (
                self._shared(shape, 0, k, alias),
                self._shared(shape, 1, v, alias),
            )
        return tables[0].tensor, tables[1].tensor

    def _shared(
        self, shape: tuple[int, int, int], side: int, scale: float, aliased: bool
    ) -> AsmScaleTable:
        key = (shape, side, scale, aliased)
        table = self.shared.get(key)
        if table is None:
            table = self._make(shape, scale, aliased)
            self.shared[key] = table
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
