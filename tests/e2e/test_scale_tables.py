"""Per-slot scale tables: vLLM's shared store, one allocation per distinct scale."""

from __future__ import annotations

import torch

import harness
from vllm_rocm_asm_decode.scale_tables import shared_scale_tables


def bind(model):
    batch = harness.make_batch(model, [20] * 16)
    model.builder.build(0, batch.common)
    return [harness.scale_tables(model.builder, name) for name in model.names]


@harness.plugin_only
def test_store_is_the_one_rocm_aiter_fa_uses():
    from vllm.v1.attention.backends.rocm_aiter_fa import AiterFlashAttentionMetadataBuilder

    assert shared_scale_tables() is AiterFlashAttentionMetadataBuilder.asm_kv_scale_tables


def test_equal_scales_share_one_allocation(tmp_path):
    model = harness.build_model(tmp_path, num_layers=4, num_blocks=48, scales=[(0.75, 0.75)] * 4)
    bindings = bind(model)
    ptrs = {t.data_ptr() for b in bindings for t in b}
    assert len(ptrs) == 1
    table = bindings[0][0]
    assert table.dtype == torch.float32 and table.is_contiguous()
    assert tuple(table.shape) == (model.layers[model.names[0]].kv_cache.shape[0], 8, 16)
    assert torch.all(table == 0.75)


def test_different_scales_get_their_own_tables(tmp_path):
    scales = [(0.5, 0.25), (0.5, 0.25), (2.0, 0.25)]
    model = harness.build_model(tmp_path, num_layers=3, num_blocks=48, scales=scales)
    bindings = bind(model)
    for (k_table, v_table), (k, v) in zip(bindings, scales, strict=True):
        assert torch.all(k_table == k) and torch.all(v_table == v)
    assert bindings[0][0].data_ptr() == bindings[1][0].data_ptr()
    assert bindings[0][0].data_ptr() != bindings[2][0].data_ptr()
    assert bindings[0][1].data_ptr() == bindings[2][1].data_ptr()


def test_qwen3_14b_shape_costs_at_most_a_tenth_of_a_percent_of_the_kv_cache(tmp_path):
    """Qwen3-14B: 40 layers, 40 query / 8 KV heads of 128; scales as in its checkpoint
    (K and V different, equal across layers)."""
    model = harness.build_model(
        tmp_path,
        num_layers=40,
        num_heads=40,
        num_kv_heads=8,
        num_blocks=64,
        scales=[(1.0, 0.5)] * 40,
    )
    bindings = bind(model)
    tables = {t.data_ptr(): t for b in bindings for t in b}
    table_bytes = sum(t.numel() * t.element_size() for t in tables.values())
    kv_bytes = sum(
        layer.kv_cache.numel() * layer.kv_cache.element_size() for layer in model.layers.values()
    )
    share = table_bytes / kv_bytes
    assert len(tables) == 2
    assert share <= 0.001, share
