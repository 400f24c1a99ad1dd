"""Aliased scale tables on a real GPU through the driver's virtual-memory calls: ``cuMem*``
where torch is a CUDA build (the same code drives ``hipMem*`` on ROCm). Skipped, with the
reason, where no GPU is reachable; CI has none.

Runs without vLLM (``asm_scale_tables`` imports only torch): on a bare CUDA machine,
``PYTHONPATH=src python -m pytest --noconftest tests/gpu``.
"""

from __future__ import annotations

import gc

import pytest
import torch

from vllm_rocm_asm_decode.asm_scale_tables import (
    MIN_CHUNK,
    aliasing_problem,
    live_mappings,
    make_table,
    make_tables,
    virtual_memory,
)

pytestmark = pytest.mark.skipif(
    not torch.cuda.is_available() or virtual_memory() is None,
    reason="needs a GPU whose driver offers virtual memory (cuMem*/hipMem*)",
)
DEVICE = torch.device("cuda", 0)
#: An MI355X-sized cache: 250k blocks of 8 KV heads.
SHAPE = (250_000, 8, 16)


def device_used() -> int:
    torch.accelerator.synchronize()
    free, total = torch.cuda.mem_get_info(DEVICE)
    return total - free


@pytest.fixture(autouse=True)
def _context():
    torch.ones(1, device=DEVICE)  # the driver calls need the device's context current


def test_one_chunk_reads_the_scale_everywhere():
    before = device_used()
    table = make_table(DEVICE, SHAPE, 0.375)
    taken = device_used() - before
    # One chunk (the driver may round what it reports up to a chunk more), where an
    # allocation would take the table's 122 MiB.
    assert table.aliased and taken <= 2 * table.nbytes < SHAPE[0] * 8 * 16 * 4 // 16
    assert table.tensor.shape == SHAPE and table.tensor.dtype == torch.float32
    assert table.mappings <= 256 and table.nbytes == table.chunk.numel() * 4
    assert torch.all(table.tensor == 0.375)


def test_forty_layers_of_distinct_scales_take_at_most_two_chunks_each():
    before = device_used()
    scales = [0.5 + i / 128 for i in range(80)]  # K and V of 40 layers
    tables, seconds = make_tables(DEVICE, SHAPE, scales)
    used = device_used() - before
    chunk = tables[0].nbytes
    assert all(t.aliased for t in tables) and used <= 40 * 2 * chunk, (used, chunk)
    for table, scale in zip(tables, scales, strict=True):
        assert float(table.tensor[-1, -1, -1]) == scale and float(table.tensor[0, 0, 0]) == scale
    assert seconds < 10
    del tables
    gc.collect()
    assert device_used() - before <= chunk  # released with the last tensor over them


def test_a_refill_is_seen_by_a_graph_captured_before_it():
    table = make_table(DEVICE, SHAPE, 0.5)
    picks = torch.tensor([0, 1, 124_999, 249_999], device=DEVICE)
    out = torch.zeros(4, 8, 16, device=DEVICE)
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):
        torch.index_select(table.tensor, 0, picks, out=out)  # warm up
    torch.cuda.current_stream().wait_stream(stream)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        torch.index_select(table.tensor, 0, picks, out=out)
    graph.replay()
    assert torch.all(out == 0.5)
    table.fill(2.25)  # a weight reload's new scale, in place
    graph.replay()
    assert torch.all(out == 2.25)


def test_the_plain_allocation_reads_and_refills_the_same():
    table = make_table(DEVICE, (64, 8, 16), 0.75, aliased=False)
    assert not table.aliased and table.nbytes == 64 * 8 * 16 * 4
    assert torch.all(table.tensor == 0.75)
    table.fill(1.5)
    assert torch.all(table.tensor == 1.5)


def test_a_table_of_more_than_256_granules_reads_right():
    """Past 256 chunks of 2 MiB (a 563 MB table) the chunk grows to the next power of
    two, 4 MiB, so the table takes at most 256 mappings; every entry reads its scale,
    and a refill reaches every entry."""
    shape = (1_100_000, 8, 16)
    nbytes = shape[0] * 8 * 16 * 4
    assert nbytes > 256 * MIN_CHUNK
    before = live_mappings()
    table = make_table(DEVICE, shape, 0.8125)
    assert table.aliased and table.nbytes == 2 * MIN_CHUNK
    assert table.mappings == -(-nbytes // (2 * MIN_CHUNK)) <= 256
    assert live_mappings() - before == table.mappings
    assert torch.all(table.tensor == 0.8125)
    table.fill(1.25)
    assert torch.all(table.tensor == 1.25)
    del table
    gc.collect()
    assert live_mappings() == before


def test_the_probe_at_a_real_tables_shape_passes():
    assert aliasing_problem(DEVICE, SHAPE) is None
