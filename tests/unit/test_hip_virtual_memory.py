"""Aliased scale tables through the runtime's own ``hipMem*`` path, on the HIP stand-in
(``tests/standins/hip/hip_vm.c``: ROCm's checks as clr's source states them, host memory
for device memory). What an MI300X/MI355X would refuse is refused here."""

from __future__ import annotations

import ctypes
import math

import hip_standin
import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st

from vllm_rocm_asm_decode import asm_scale_tables as tables
from vllm_rocm_asm_decode.asm_scale_tables import (
    MAX_MAPPINGS,
    MIN_CHUNK,
    AsmScaleTables,
    MappingLimitError,
    chunk_bytes,
    make_table,
    rocm_problem,
)

CPU = torch.device("cpu")
#: An MI355X cache of Qwen3-14B at TP1: 183,104 blocks of 8 KV heads (93.7 MB a table).
MI355X_SHAPE = (183_104, 8, 16)
HIP_INVALID_VALUE, HIP_OUT_OF_MEMORY = 1, 2


@pytest.fixture
def hip(monkeypatch):
    """The stand-in, and that no test leaves a mapping behind (the tests drop their
    tables; nothing of them is in a reference cycle)."""
    standin = hip_standin.runtime_vm(monkeypatch)
    yield standin
    standin.configure()
    assert standin.live_mappings() == 0 and standin.reservations() == 0


class Layer:
    """What the tables read of an attention layer."""

    def __init__(self, k: float, v: float) -> None:
        self._k_scale_float, self._v_scale_float = k, v


def reserve(hip, size: int, alignment: int) -> int:
    ptr = ctypes.c_uint64()
    return hip.lib.hipMemAddressReserve(
        ctypes.byref(ptr), ctypes.c_size_t(size), ctypes.c_size_t(alignment), None, 0
    )


@pytest.mark.parametrize(("clr", "refused"), [(2026, HIP_INVALID_VALUE), (2024, HIP_OUT_OF_MEMORY)])
def test_the_standin_refuses_what_rocm_refuses(hip, clr, refused):
    """hipMemAddressReserve takes a power-of-two alignment and a size that is a multiple
    of the granularity (clr hip_vm.cpp); the old chunk rule, 4 KiB x ceil(bytes / (4 KiB
    x 256)), gave a 360 KiB alignment for an MI355X table."""
    hip.configure(clr=clr)
    old_chunk = 4096 * math.ceil(math.prod(MI355X_SHAPE) * 4 / (4096 * 256))
    assert old_chunk == 360 * 1024
    assert reserve(hip, 256 * old_chunk, old_chunk) == refused
    assert reserve(hip, 4096 * 3 + 1, 0) == refused
    prop = tables._AllocationProp(type=1, location=tables._Location(1, 0))
    granularity = ctypes.c_size_t()
    got = []
    for option in (0, 1):
        assert (
            hip.lib.hipMemGetAllocationGranularity(
                ctypes.byref(granularity), ctypes.byref(prop), option
            )
            == 0
        )
        got.append(granularity.value)
    assert got == ([4096, 2 << 20] if clr == 2026 else [4096, 4096])
    handle = ctypes.c_uint64()
    assert (
        hip.lib.hipMemCreate(ctypes.byref(handle), ctypes.c_size_t(3000), ctypes.byref(prop), 0)
        == 1
    )
    bad = tables._AllocationProp(type=0, location=tables._Location(1, 0))
    assert (
        hip.lib.hipMemCreate(ctypes.byref(handle), ctypes.c_size_t(4096), ctypes.byref(bad), 0) == 1
    )
    assert hip.reservations() == 0


def test_the_tables_of_an_mi355x_cache_at_4k_granularity(hip):
    """The granularity a ROCm 7 driver reports as its minimum (4 KiB) and the 2024 one
    reports for both: a power-of-two chunk of 2 MiB, 45 mappings a table, every entry
    its scale, a refill seen everywhere, all released with the last tensor."""
    for clr in (2026, 2024):
        hip.configure(clr=clr)
        set_ = AsmScaleTables(CPU, strict=True)
        layers = [Layer(0.5 + i / 8, 0.25 + i / 8) for i in range(3)]
        got = [set_.get(layer, MI355X_SHAPE, own=True) for layer in layers]
        made = set_.tables()
        assert set_.aliased and all(t.aliased for t in made)
        assert {t.nbytes for t in made} == {MIN_CHUNK} and {t.mappings for t in made} == {45}
        assert hip.live_mappings() == tables.live_mappings() == 6 * 45
        assert hip.physical_bytes() == 6 * MIN_CHUNK
        for (k, v), layer in zip(got, layers, strict=True):
            assert torch.all(k == layer._k_scale_float) and torch.all(v == layer._v_scale_float)
        layers[1]._k_scale_float = 3.0  # a weight reload
        assert set_.follow_reload() == [layers[1]]
        assert torch.all(got[1][0] == 3.0)
        del set_, got, made, k, v
        assert hip.live_mappings() == tables.live_mappings() == 0 and hip.physical_bytes() == 0


def test_the_process_holds_at_most_the_mapping_bound(hip, monkeypatch):
    monkeypatch.setattr(tables, "mapping_bound", lambda: 100)
    first = make_table(CPU, MI355X_SHAPE, 1 / 3, fallback=False)  # read back as fp32 holds it
    assert first.mappings == 45 and torch.all(first.tensor == torch.tensor(1 / 3))
    second = make_table(CPU, MI355X_SHAPE, 0.5, fallback=False)
    with pytest.raises(MappingLimitError, match="bound of 100"):
        make_table(CPU, MI355X_SHAPE, 0.5, fallback=False)
    third = make_table(CPU, MI355X_SHAPE, 0.25)  # past the bound: allocated where allowed
    assert not third.aliased and torch.all(third.tensor == 0.25)
    assert hip.live_mappings() == 90 <= 100
    del first, second


def test_a_map_that_maps_nothing_is_caught_by_the_read_back(hip):
    """clr 2024 returns hipSuccess from hipMemMap whatever became of the mapping: only
    reading the table back tells, and nothing of it is left behind."""
    hip.configure(clr=2024, silent_map=True)
    with pytest.raises(RuntimeError, match="read back wrong"):
        make_table(CPU, MI355X_SHAPE, 0.5, fallback=False)
    assert tables.live_mappings() == 0 and hip.reservations() == 0
    allocated = make_table(CPU, MI355X_SHAPE, 0.5)
    assert not allocated.aliased and torch.all(allocated.tensor == 0.5)
    assert "read back wrong" in tables.aliasing_problem(CPU, MI355X_SHAPE)


def test_refused_mappings_surface_with_rocms_error(hip):
    """Past vm.max_map_count a ROCm 7 driver returns the mapping's failure."""
    hip.configure(max_mappings=10)
    with pytest.raises(RuntimeError, match="hipMemMap failed with error 2"):
        make_table(CPU, MI355X_SHAPE, 0.5, fallback=False)
    assert hip.live_mappings() == 0


@given(
    nbytes=st.integers(1, 1 << 40),
    granularity=st.sampled_from([4096, 65536, 2 << 20, 4 << 20]),
)
def test_a_chunk_is_a_power_of_two_every_driver_takes(nbytes, granularity):
    chunk = chunk_bytes(nbytes, granularity)
    assert chunk & (chunk - 1) == 0 and chunk >= MIN_CHUNK and chunk % granularity == 0
    assert math.ceil(nbytes / chunk) <= MAX_MAPPINGS
    assert (
        chunk == MIN_CHUNK
        or math.ceil(nbytes / (chunk // 2)) > MAX_MAPPINGS
        or (chunk // 2 < granularity)
    )


def test_a_granularity_no_power_of_two_is_a_multiple_of_is_refused():
    with pytest.raises(RuntimeError, match="divides no chunk"):
        chunk_bytes(1 << 20, 3 * 4096)


@pytest.mark.parametrize(
    ("version", "problem"),
    [
        ("7.0.51831-a3e329ad8", None),
        ("7.2.26015", None),
        ("10.0.1", None),
        ("6.4.43482-0f2d60242", "ROCm 6.4 is older than 7.0"),
        ("", "ROCm version '' not understood"),
    ],
)
def test_aliasing_needs_rocm_7(version, problem):
    assert rocm_problem(version) == problem


def test_a_rocm_6_torch_gets_no_virtual_memory(monkeypatch):
    monkeypatch.setattr(torch.version, "hip", "6.4.43482-0f2d60242")
    monkeypatch.setattr(tables, "_VM", [])
    assert tables.virtual_memory() is None
    assert tables.aliasing_problem(torch.device("cuda", 0)) == (
        "no GPU virtual memory: ROCm 6.4 is older than 7.0"
    )
