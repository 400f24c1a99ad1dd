"""Every layer the kernel cannot serve keeps the stock path, and the log says why."""

from __future__ import annotations

import pytest
import torch

import harness
from conftest import ARCH
from rocm_emulation import COMPUTE_UNITS

CUT = 2 * COMPUTE_UNITS[ARCH]


@pytest.fixture
def stock_forward(monkeypatch):
    """The calls that reach the stock path (see ``harness.spy_stock_path``)."""
    return harness.spy_stock_path(monkeypatch)


CASES = {
    "fp8-e5m2-cache": (dict(cache_dtype="fp8_e5m2"), "fp8_e5m2 KV cache"),
    "bf16-cache": (dict(cache_dtype="auto"), "auto KV cache"),
    "block-32": (dict(block_size=32), "block size 32"),
    "head-size-64": (dict(head_size=64), "head size 64"),
    "fp16-is-fine-fp32-is-not": (dict(dtype="float32"), "torch.float32 query"),
    "gqa-16": (dict(num_heads=64, num_kv_heads=4), "GQA 16"),
    "gqa-10": (dict(num_heads=40, num_kv_heads=4), "GQA 10"),
    "gemma-scale": (dict(layer_kwargs=[{"scale": 0.0625}]), "softmax scale 0.0625 != 1/sqrt(128)"),
    "sliding-window": (dict(layer_kwargs=[{"per_layer_sliding_window": 128}]), "sliding window"),
    "alibi": (dict(layer_kwargs=[{"alibi_slopes": [0.5] * 40}]), "ALiBi"),
    "soft-cap": (dict(layer_kwargs=[{"logits_soft_cap": 30.0}]), "logits soft cap"),
    "lbhnc-layout": (dict(layout="LBHNC"), "KV pages not dense"),
}


@pytest.mark.parametrize("case", list(CASES), ids=list(CASES))
def test_ineligible_layer_keeps_stock_path_and_says_why(
    tmp_path, kernels, plugin_log, stock_forward, case
):
    overrides, reason = CASES[case]
    model = harness.build_model(tmp_path, num_layers=1, **overrides)
    name = model.names[0]
    layer = model.layers[name]
    dtype = {"float32": torch.float32}.get(overrides.get("dtype"), torch.bfloat16)
    batch = harness.make_batch(model, [40] * 32, dtype=dtype)  # 32 x heads > cut
    metadata = model.builder.build(0, batch.common)
    if not harness.IN_TREE:
        assert any(reason in r for r in layer.impl.asm_rejections)
        assert any("0 of 1 layers eligible" in m for m in plugin_log)
    assert harness.asm_layers(model.builder) == set()
    assert not metadata.use_asm_decode  # no eligible layer in the group: never asm
    out = torch.empty_like(batch.query)
    layer.impl.forward(layer, batch.query, batch.key, batch.value, layer.kv_cache, metadata, out)
    assert harness.asm_calls() == [] and harness.stock_layers(stock_forward, model) == [name]
    assert harness.kept_on_hip(plugin_log, reason), plugin_log


def test_fp16_model_is_eligible(tmp_path, kernels, monkeypatch):
    """In-tree, as in the original change; in the plugin once trusted (its fp16 guard:
    tests/e2e/test_aiter_trust.py::test_fp16_queries_wait_for_proof)."""
    if not harness.IN_TREE:
        monkeypatch.setenv("VLLM_ROCM_ASM_DECODE_TRUST_AITER", "1")
    model = harness.build_model(tmp_path, num_layers=1, dtype="float16")
    batch = harness.make_batch(model, [40] * 16, dtype=torch.float16)
    harness.fill_context(model, batch)
    metadata = model.builder.build(0, batch.common)
    assert metadata.use_asm_decode
    out = harness.run_layer(model, model.names[0], batch, metadata)
    ref = harness.reference(model, batch, model.layers[model.names[0]])
    torch.testing.assert_close(out.float(), ref, atol=2e-2, rtol=0)
    assert len(harness.asm_calls()) == 1


def test_mixed_layers_in_one_step(tmp_path, kernels, plugin_log, stock_forward):
    """A Gemma-style scale on one layer: that layer stays on stock, the others run asm,
    within the same step and the same metadata."""
    model = harness.build_model(tmp_path, num_layers=3, layer_kwargs=[{}, {"scale": 0.0625}])
    batch = harness.make_batch(model, [40] * 16)
    harness.fill_context(model, batch)
    metadata = model.builder.build(0, batch.common)
    assert metadata.use_asm_decode
    for name in model.names:
        harness.run_layer(model, name, batch, metadata)
    assert harness.stock_layers(stock_forward, model) == [model.names[1]]
    assert len(harness.asm_calls()) == 2
    assert harness.asm_layers(model.builder) == {model.names[0], model.names[2]}
    reasons = [m for m in plugin_log if harness.kept_on_hip([m], "softmax")]
    assert len(reasons) == 1 and "softmax scale 0.0625" in reasons[0]


def test_each_distinct_reason_is_logged_once(tmp_path, kernels, plugin_log):
    model = harness.build_model(tmp_path, num_layers=4, layer_kwargs=[{"scale": 0.0625}] * 3 + [{}])
    batch = harness.make_batch(model, [40] * 16)
    model.builder.build(0, batch.common)
    model.builder.build(0, batch.common)
    reasons = [m for m in plugin_log if harness.kept_on_hip([m], "softmax")]
    assert len(reasons) == 1
    if harness.IN_TREE:  # the one info line names the last layer the rule keeps on HIP
        assert reasons[0].endswith(
            f"decodes 1 of 4 layers above {CUT} query heads"
            f" ({model.names[2]} keeps HIP: softmax scale 0.0625 != 1/sqrt(128))"
        )
    else:
        assert sum("layers eligible" in m for m in plugin_log) == 1


@harness.plugin_only
def test_a_layer_is_decided_only_once_its_cache_is_bound(tmp_path, kernels):
    model = harness.build_model(tmp_path, num_layers=1)
    layer = model.layers[model.names[0]]
    bound = layer.kv_cache
    layer.kv_cache = torch.tensor([])  # as before initialize_kv_cache
    batch = harness.make_batch(model, [40] * 16)
    metadata = model.builder.build(0, batch.common)
    assert not metadata.use_asm_decode and layer.impl.asm_rejections is None
    layer.kv_cache = bound
    metadata = model.builder.build(0, batch.common)
    assert metadata.use_asm_decode and layer.impl.asm_rejections == []


def test_encoder_only_attention_is_decided_without_a_kv_cache(tmp_path, kernels, plugin_log):
    from vllm.config import set_current_vllm_config
    from vllm.model_executor.layers.attention import Attention
    from vllm.v1.attention.backend import AttentionType

    model = harness.build_model(tmp_path, num_layers=1)
    with set_current_vllm_config(model.vllm_config):
        encoder = Attention(
            num_heads=40,
            head_size=128,
            scale=128**-0.5,
            num_kv_heads=8,
            cache_config=model.vllm_config.cache_config,
            prefix="model.encoder.0.attn",
            attn_type=AttentionType.ENCODER_ONLY,
        )
    assert encoder.attn_backend is model.backend and encoder.kv_cache.dim() == 1
    builder = model.backend.get_builder_cls()(
        model.spec, ["model.encoder.0.attn"], model.vllm_config, torch.device("cpu")
    )
    metadata = builder.build(0, harness.make_batch(model, [40] * 16).common)
    assert not metadata.use_asm_decode and harness.asm_layers(builder) == set()
    if not harness.IN_TREE:
        assert builder.asm_layers_bound
        assert encoder.impl.asm_rejections == ["not decoder self-attention"]
    assert harness.kept_on_hip(plugin_log, "not decoder self-attention")


def test_no_scale_tables_where_no_decode_step_can_pass_the_cut(tmp_path, kernels, plugin_log):
    """A decode step is at most max_num_seqs tokens: where that many times the query
    heads is not above the cut, asm can never run, and no table is made for it."""
    model = harness.build_model(tmp_path, num_layers=1)  # 40 query heads
    model.vllm_config.scheduler_config.max_num_seqs = CUT // 40  # 40 x that <= the cut
    batch = harness.make_batch(model, [40] * 32)  # as if the scheduler sent more
    metadata = model.builder.build(0, batch.common)
    assert harness.asm_layers(model.builder) == set() and not metadata.use_asm_decode
    if harness.IN_TREE:
        line = f"decodes 0 of 1 layers (max_num_seqs x heads <= {CUT})"
    else:
        assert model.builder.asm_bindings.tables is None
        line = f"max_num_seqs {CUT // 40} x 40 query heads never passes the cut of {CUT}"
    assert any(line in m for m in plugin_log), plugin_log
    fresh = harness.build_model(tmp_path / "again", num_layers=1)
    fresh.vllm_config.scheduler_config.max_num_seqs = CUT // 40 + 1  # one more: above it
    assert fresh.builder.build(0, batch.common).use_asm_decode
