"""Mixed prefill+decode steps: the leading decode requests on asm, the prefill requests on
vLLM's prefill kernel, decided on host data in the builder, never inside a CUDA graph
that could freeze the split. The plugin splits them, and the in-tree form from stage 2;
in stage 1 they stay whole on the stock path."""

from __future__ import annotations

import itertools
import json
import subprocess
import sys
from pathlib import Path

import pytest
import torch

import background
import harness
from conftest import ARCH
from op_audit import OpRecorder
from rocm_emulation import COMPUTE_UNITS

CUT = 2 * COMPUTE_UNITS[ARCH]
HEADS = 40
ABOVE = CUT // HEADS + 1  # decode requests just above the cut
ATOL = 2e-2


def mixed_batch(model, num_decodes, prefills=((100, 5), (37, 3)), seed=0):
    """``num_decodes`` one-token requests first, then prefill chunks (seq_len, q_len)."""
    seq_lens = [40 + i % 50 for i in range(num_decodes)] + [s for s, _ in prefills]
    query_lens = [1] * num_decodes + [q for _, q in prefills]
    batch = harness.make_batch(model, seq_lens, query_lens, seed=seed)
    harness.fill_context(model, batch)
    return batch


def rows_of(batch):
    starts = [0]
    for q in batch.query_lens:
        starts.append(starts[-1] + q)
    return starts


def check(model, batch, out, layer):
    ref = harness.reference(model, batch, layer)
    torch.testing.assert_close(out.float(), ref, atol=ATOL, rtol=0)


@harness.splits_mixed
def test_decodes_run_asm_and_prefills_the_prefill_kernel_each_row_once(tmp_path, kernels):
    # K and V scales apart: swapping them on either side of the split fails the check.
    model = harness.build_model(tmp_path, num_layers=2, scales=[(0.5, 0.25)] * 2)
    batch = mixed_batch(model, ABOVE)
    metadata = model.builder.build(0, batch.common)
    split = metadata.asm_split
    assert not metadata.use_asm_decode and split is not None
    assert split.num_decodes == ABOVE
    prefill_rows: list[int] = []
    real_prefill = harness.prefill_reference

    def spying_prefill(q, k, v, o, *args, **kwargs):
        starts = kwargs["b_start_loc"].tolist()
        for a, b in itertools.pairwise(starts):
            if b - a > 1:
                prefill_rows.extend(range(a, b))
        return real_prefill(q, k, v, o, *args, **kwargs)

    with pytest.MonkeyPatch.context() as mp:
        from vllm.v1.attention.ops import chunked_prefill_paged_decode as cppd

        mp.setattr(cppd, "context_attention_fwd", spying_prefill)
        for name, layer in model.layers.items():
            out = harness.run_layer(model, name, batch, metadata)
            check(model, batch, out, layer)
    calls = harness.asm_calls()
    assert len(calls) == 2 and kernels.hip_decode == 0
    decode_rows = set(range(calls[0]["out_"].shape[0]))
    assert decode_rows == set(range(ABOVE))  # asm gets exactly the decode rows
    assert calls[0]["context_lens"].shape[0] == ABOVE
    assert calls[0]["block_tables"].shape[0] == ABOVE
    starts = rows_of(batch)
    # Two layers: every prefill row once per layer, from the prefill kernel.
    assert sorted(prefill_rows) == sorted(list(range(starts[ABOVE], starts[-1])) * 2)
    assert not decode_rows & set(prefill_rows)


@harness.splits_mixed
def test_a_layer_called_without_key_and_value_reads_the_new_tokens_from_the_cache(
    tmp_path, kernels
):
    """Some models (shared-KV layers) call attention with key=value=None: the split hands
    the prefill kernel None, as stock does, and it reads the new tokens from the cache."""
    model = harness.build_model(tmp_path, num_layers=1)
    batch = mixed_batch(model, ABOVE)
    metadata = model.builder.build(0, batch.common)
    assert metadata.asm_split is not None
    name = model.names[0]
    layer = model.layers[name]
    harness.write_step(model, batch)  # the cache already holds this step's tokens
    out = torch.empty_like(batch.query)
    layer.impl.forward(layer, batch.query, None, None, layer.kv_cache, metadata, out)
    check(model, batch, out, layer)
    assert len(harness.asm_calls()) == 1 and kernels.prefill == 1


@harness.splits_mixed
def test_decodes_not_on_a_four_request_boundary_are_computed_once(tmp_path, kernels):
    """The prefill views start at the last multiple of 4 at or before the first prefill;
    the decode requests in between are skipped by the prefill kernel and run on asm."""
    model = harness.build_model(tmp_path, num_layers=1)
    nd = ABOVE + (3 - ABOVE % 4)  # nd % 4 == 3: three decodes inside the prefill views
    batch = mixed_batch(model, nd)
    metadata = model.builder.build(0, batch.common)
    split = metadata.asm_split
    assert split.num_decodes == nd and split.prefill_seq_lens.shape[0] == 2 + 3
    name = model.names[0]
    check(model, batch, harness.run_layer(model, name, batch, metadata), model.layers[name])
    assert harness.asm_calls()[0]["out_"].shape[0] == nd and kernels.hip_decode == 0


def test_a_small_decode_part_stays_stock(tmp_path, kernels):
    model = harness.build_model(tmp_path, num_layers=1)
    batch = mixed_batch(model, ABOVE - 1)  # (ABOVE - 1) x 40 <= cut
    metadata = model.builder.build(0, batch.common)
    assert getattr(metadata, "asm_split", None) is None and not metadata.use_asm_decode
    name = model.names[0]
    check(model, batch, harness.run_layer(model, name, batch, metadata), model.layers[name])
    assert harness.asm_calls() == [] and kernels.hip_decode == 1 and kernels.prefill == 1


def test_decodes_that_do_not_lead_stay_stock_and_correct(tmp_path, kernels):
    model = harness.build_model(tmp_path, num_layers=1)
    seq_lens = [100] + [40] * ABOVE + [37]
    query_lens = [5] + [1] * ABOVE + [3]
    batch = harness.make_batch(model, seq_lens, query_lens)
    harness.fill_context(model, batch)
    metadata = model.builder.build(0, batch.common)
    assert getattr(metadata, "asm_split", None) is None
    name = model.names[0]
    check(model, batch, harness.run_layer(model, name, batch, metadata), model.layers[name])
    assert harness.asm_calls() == [] and kernels.hip_decode == 1


@harness.splits_mixed
@pytest.mark.parametrize(
    ("extra", "splits"), [(0, False), (1, True)], ids=["heads-at-cut", "one-above"]
)
def test_a_mixed_step_splits_only_when_its_decodes_heads_pass_the_cut(
    tmp_path, kernels, extra, splits
):
    """32 query heads: CUT // 32 decodes carry exactly the cut's heads (no split), one
    more passes it."""
    model = harness.build_model(tmp_path, num_layers=1, num_heads=32, num_kv_heads=8)
    batch = mixed_batch(model, CUT // 32 + extra)
    metadata = model.builder.build(0, batch.common)
    assert (metadata.asm_split is not None) is splits
    assert not metadata.use_asm_decode


def test_a_sliding_window_layer_never_splits_a_mixed_step(tmp_path, kernels):
    """The rule refuses a sliding-window layer: its mixed steps stay whole on the stock
    path, however many decodes lead."""
    model = harness.build_model(
        tmp_path, num_layers=1, layer_kwargs=[{"per_layer_sliding_window": 64}]
    )
    batch = mixed_batch(model, ABOVE + 8)
    metadata = model.builder.build(0, batch.common)
    assert getattr(metadata, "asm_split", None) is None
    assert harness.asm_layers(model.builder) == set()


@pytest.mark.parametrize("runner", ["v1", "v2"])
def test_decodes_are_put_first_only_by_the_v1_runner_and_where_the_rule_admits(
    tmp_path, monkeypatch, runner
):
    """The V1 runner reorders a batch only when a builder sets a threshold (the lowest of
    all builders wins): set only where mixed steps can split, the layers pass the rule
    (predicted before the KV cache exists), and never before stage 2. Model Runner V2
    puts decodes first itself: no builder asks it."""
    from vllm.v1.attention.backends.rocm_attn import RocmAttentionMetadataBuilder

    monkeypatch.setenv("VLLM_USE_V2_MODEL_RUNNER", "1" if runner == "v2" else "0")
    stock = RocmAttentionMetadataBuilder.reorder_batch_threshold
    fp8 = harness.build_model(tmp_path / "fp8", num_layers=1)
    assert fp8.vllm_config.use_v2_model_runner is (runner == "v2")
    asks = harness.SPLITS_MIXED and runner == "v1"
    assert fp8.builder.reorder_batch_threshold == (1 if asks else stock)
    for name, refused in {
        "bf16": dict(cache_dtype="auto"),
        "gqa-16": dict(num_heads=128, num_kv_heads=8),
        "soft-cap": dict(layer_kwargs=[{"logits_soft_cap": 30.0}]),
        "sliding-window": dict(layer_kwargs=[{"per_layer_sliding_window": 64}]),
    }.items():
        model = harness.build_model(tmp_path / name, num_layers=1, **refused)
        assert model.builder.reorder_batch_threshold == stock, name


@pytest.mark.skipif(harness.SPLITS_MIXED, reason="this form splits mixed steps")
def test_before_stage_2_mixed_steps_stay_whole_on_the_stock_path(tmp_path, kernels):
    model = harness.build_model(tmp_path, num_layers=1)
    batch = mixed_batch(model, ABOVE + 8)
    metadata = model.builder.build(0, batch.common)
    assert not metadata.use_asm_decode and not hasattr(metadata, "asm_split")
    name = model.names[0]
    check(model, batch, harness.run_layer(model, name, batch, metadata), model.layers[name])
    assert harness.asm_calls() == [] and kernels.hip_decode == 1 and kernels.prefill == 1


def builder_under(model, mode):
    from vllm.config import CUDAGraphMode

    model.vllm_config.compilation_config.cudagraph_mode = CUDAGraphMode[mode]
    return model.backend.get_builder_cls()(
        model.spec, model.names, model.vllm_config, torch.device("cpu")
    )


@harness.splits_mixed
def test_full_mixed_graph_mode_keeps_mixed_steps_stock_but_not_pure_decodes(tmp_path, kernels):
    model = harness.build_model(tmp_path, num_layers=1)
    for mode, splits in (
        ("FULL", False),
        ("FULL_AND_PIECEWISE", True),
        ("FULL_DECODE_ONLY", True),
        ("PIECEWISE", True),
        ("NONE", True),
    ):
        builder = builder_under(model, mode)
        mixed = builder.build(0, mixed_batch(model, ABOVE).common)
        assert (mixed.asm_split is not None) is splits, mode
        pure = builder.build(0, harness.make_batch(model, [40] * ABOVE).common)
        assert pure.use_asm_decode, mode


@harness.splits_mixed
def test_capture_builds_never_split(tmp_path, kernels):
    model = harness.build_model(tmp_path, num_layers=1)
    builder = model.builder
    assert builder.build(0, mixed_batch(model, ABOVE).common).asm_split is not None
    captured = builder.build_for_cudagraph_capture(mixed_batch(model, ABOVE, seed=1).common)
    assert captured.asm_split is None
    assert builder.build(0, mixed_batch(model, ABOVE, seed=2).common).asm_split is not None


@harness.splits_mixed
def test_speculative_decoding_keeps_mixed_steps_stock(tmp_path, kernels):
    model = harness.build_model(tmp_path, num_layers=1)
    model.vllm_config.speculative_config = object()  # any speculative config
    builder = model.backend.get_builder_cls()(
        model.spec, model.names, model.vllm_config, torch.device("cpu")
    )
    assert harness.rule("asm_split_off")(model.vllm_config) == "speculative decoding is on"
    assert builder.build(0, mixed_batch(model, ABOVE).common).asm_split is None


@harness.splits_mixed
def test_ineligible_layers_and_failed_call_checks_take_stock_forward_whole(
    tmp_path, kernels, monkeypatch
):
    model = harness.build_model(tmp_path, num_layers=1)
    batch = mixed_batch(model, ABOVE)
    metadata = model.builder.build(0, batch.common)
    assert metadata.asm_split is not None
    stock = harness.spy_stock_path(monkeypatch)
    layer = model.layers[model.names[0]]
    out = torch.empty_like(batch.query)
    args = (layer, batch.query, batch.key, batch.value, layer.kv_cache, metadata, out)
    layer.impl.forward(*args, output_scale=torch.ones(1))  # fused output quant
    assert len(stock) == 1 and harness.asm_calls() == [] and kernels.prefill == 0
    if not harness.IN_TREE:  # the plugin checks the call's tensors too
        layer.impl.forward(layer, batch.query.to(torch.float8_e4m3fn), *args[2:])
        assert len(stock) == 2 and harness.asm_calls() == []
    if harness.IN_TREE:  # as for a layer the rule refused
        metadata.asm_scales.clear()
    else:
        metadata.asm_bindings.layers.clear()
    layer.impl.forward(*args)
    assert harness.asm_calls() == [] and not any(c.get("prefill_only") for c in stock)


@harness.splits_mixed
def test_mixed_forward_reads_nothing_on_the_host_and_allocates_nothing(tmp_path, monkeypatch):
    from vllm.v1.attention.ops import chunked_prefill_paged_decode as cppd

    monkeypatch.setenv("ASM_DECODE_TEST_NOOP_KERNELS", "1")
    prefill_calls = []
    monkeypatch.setattr(cppd, "context_attention_fwd", lambda **kw: prefill_calls.append(kw))
    harness.reset_asm_calls()
    model = harness.build_model(tmp_path, num_layers=2)
    batch = harness.make_batch(model, [40] * ABOVE + [100], [1] * ABOVE + [8], contexts=False)
    metadata = model.builder.build(0, batch.common)  # binds the layers (once)
    out = torch.empty_like(batch.query)
    with OpRecorder() as build_ops:
        metadata = model.builder.build(0, batch.common)
    assert metadata.asm_split is not None
    with OpRecorder() as forward_ops:
        for layer in model.layers.values():
            layer.impl.forward(
                layer, batch.query, batch.key, batch.value, layer.kv_cache, metadata, out
            )
    assert len(harness.asm_calls()) == 2 and len(prefill_calls) == 2
    assert forward_ops.host_reads == [] and forward_ops.allocations == [], forward_ops.ops
    # build() reads query_start_loc_cpu, a host tensor, and nothing on the device.
    assert build_ops.allocations == [], build_ops.ops
    split = metadata.asm_split
    assert split.decode_seq_lens.data_ptr() == metadata.seq_lens.data_ptr()  # views
    start = ABOVE - ABOVE % 4
    assert split.prefill_query_start_loc.data_ptr() == metadata.query_start_loc[start:].data_ptr()
    # The prefill kernel's pointers keep the 16-byte alignment of stock's base tensors, so
    # Triton runs the variant stock compiled.
    for view, base in (
        (split.prefill_query_start_loc, metadata.query_start_loc),
        (split.prefill_seq_lens, metadata.seq_lens),
        (split.prefill_block_table, metadata.block_table),
    ):
        assert (view.data_ptr() - base.data_ptr()) % 16 == 0
    call = prefill_calls[0]
    assert call["b_start_loc"] is split.prefill_query_start_loc  # made once per step
    assert (
        call["skip_decode"] is True and call["sm_scale"] == model.layers[model.names[0]].impl.scale
    )


INTERPRETED = r"""
import os, sys, json, pathlib
os.environ["TRITON_INTERPRET"] = "1"  # before vLLM's Triton kernels are defined
sys.path.insert(0, {tests!r})
import rocm_emulation
arch = rocm_emulation.activate()
import pytest, torch
import harness
rocm_emulation.patch_compute_units(arch)
from vllm_rocm_asm_decode.plugin import register
register()
from vllm.v1.attention.ops import chunked_prefill_paged_decode as cppd
real_prefill = cppd.context_attention_fwd
harness.install_kernel_standins(pytest.MonkeyPatch())
cppd.context_attention_fwd = real_prefill  # vLLM's own Triton prefill, interpreted
model = harness.build_model(
    num_layers=1, num_heads=8, num_kv_heads=1, num_blocks=200
)
nd = rocm_emulation.COMPUTE_UNITS[arch] * 2 // 8 + 1
batch = harness.make_batch(model, [20] * nd + [40, 23], [1] * nd + [6, 4])
harness.fill_context(model, batch)
name = model.names[0]
layer = model.layers[name]
md = model.builder.build(0, batch.common)
split = harness.run_layer(model, name, batch, md)
stock_md = md.__class__(**{{**vars(md), "asm_split": None}})
stock = torch.full_like(batch.query, float("nan"))
layer.impl.forward(layer, batch.query, batch.key, batch.value, layer.kv_cache, stock_md, stock)
ref = harness.reference(model, batch, layer)
print("RESULT " + json.dumps({{
    "split": md.asm_split is not None,
    "asm_calls": len(harness.asm_calls()),
    "prefill_rows_identical": torch.equal(split[nd:], stock[nd:]),
    "decode_err": float((split[:nd].float() - ref[:nd]).abs().max()),
}}))
"""


def _interpreted(env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    tests = str(Path(__file__).resolve().parents[1])
    clean = {k: v for k, v in env.items() if not k.startswith(("VLLM_", "ASM_DECODE_TEST_NOOP"))}
    return background.run(
        [sys.executable, "-c", INTERPRETED.format(tests=tests)],
        clean | background.ONE_THREAD,
        cwd=tests,
        timeout=600,
    )


background.declare(
    "mixed-interpreted-prefill",
    __file__,
    ["test_vllms_real_prefill_kernel_on_the_split_views_matches_the_stock_call"],
    _interpreted,
    seconds=25,
    slow=True,
)


@pytest.mark.slow
def test_vllms_real_prefill_kernel_on_the_split_views_matches_the_stock_call():
    """vLLM's Triton ``context_attention_fwd`` under Triton's interpreter (a fresh
    process: the interpreter is chosen when the kernels are defined). The prefill rows of
    the split step are bit-identical to the stock call's (which launches the kernel over
    every request); the decode rows come from asm and match fp32. Under the interpreter
    the fp8 prefill rows do not match the fp32 reference, stock and split alike, so they
    are compared with each other, not with it."""
    proc = background.result("mixed-interpreted-prefill")
    lines = [line for line in proc.stdout.splitlines() if line.startswith("RESULT ")]
    assert proc.returncode == 0 and lines, proc.stderr[-3000:]
    result = json.loads(lines[-1][len("RESULT ") :])
    assert result["split"] and result["asm_calls"] == 1
    assert result["prefill_rows_identical"]
    assert result["decode_err"] < ATOL


@harness.plugin_only
def test_the_startup_line_says_whether_mixed_steps_split(tmp_path, kernels, plugin_log):
    model = harness.build_model(tmp_path, num_layers=1)
    model.builder.build(0, mixed_batch(model, 2).common)
    builder_under(model, "FULL").build(0, mixed_batch(model, 2, seed=1).common)
    lines = [m for m in plugin_log if "layers eligible" in m]
    assert lines[0].endswith("; so do the leading decode requests of mixed steps")
    assert lines[1].endswith(
        "; mixed steps stay whole on the stock path (cudagraph_mode is FULL for mixed steps)"
    )


@harness.plugin_only
def test_plan_says_from_how_many_decodes_a_mixed_step_splits():
    from vllm_rocm_asm_decode.tools.plan import make_plan

    plan = make_plan(model="qwen3-14b-fp8", gpu="mi355x")
    assert plan.mixed_asm_from_decodes == 13  # 13 x 40 = 520 > 512; 12 x 40 = 480 is not
    assert make_plan(gpu="mi355x", kv_cache_dtype="auto").mixed_asm_from_decodes is None
