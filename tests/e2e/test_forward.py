"""End to end through vLLM 0.33's real classes on the emulated ROCm platform: layers
built under a VllmConfig, the backend vLLM selects, a KV cache planned, allocated and
bound as vLLM's worker does, the builder's metadata and ``Attention.forward``."""

from __future__ import annotations

import dataclasses
import tempfile

import pytest
import torch

import harness
from conftest import ARCH
from rocm_emulation import COMPUTE_UNITS

ATOL = 2e-2  # bf16 output rounding over an fp8 cache, values of order 1


def decode(model, seq_lens, **kw):
    batch = harness.make_batch(model, seq_lens, **kw)
    harness.fill_context(model, batch)
    metadata = model.builder.build(0, batch.common)
    return batch, metadata


def check_all_layers(model, batch, metadata):
    for name, layer in model.layers.items():
        out = harness.run_layer(model, name, batch, metadata)
        ref = harness.reference(model, batch, layer)
        real = [i for i, n in enumerate(batch.seq_lens) if n > 0]
        torch.testing.assert_close(out[real].float(), ref[real], atol=ATOL, rtol=0)


def test_vllm_selects_the_plugin_backend_under_the_rocm_attn_name(tmp_path):
    model = harness.build_model(tmp_path, num_layers=1)
    assert model.backend is harness.asm_backend()
    assert model.backend.get_name() == "ROCM_ATTN"
    assert model.layout.name == "LHBNC"


def test_builders_derived_from_rocm_attns_keep_the_stock_decode(tmp_path, kernels):
    """vLLM derives builders from the backend's (chunked local attention, static sinks,
    KV-sharing fast prefill, Whisper's block pooling) that rewrite the metadata before
    ``build()``: in both forms only ROCM_ATTN's own builder turns the asm path on."""
    from vllm.v1.attention.backend import subclass_attention_backend

    model = harness.build_model(tmp_path, num_layers=1)
    derived = subclass_attention_backend(
        name_prefix="Derived",
        attention_backend_cls=model.backend,
        builder_cls=type("DerivedBuilder", (model.backend.get_builder_cls(),), {}),
    )
    builder = derived.get_builder_cls()(
        model.spec, model.names, model.vllm_config, torch.device("cpu")
    )
    metadata = builder.build(0, harness.make_batch(model, [40] * 20).common)
    assert not harness.asm_enabled(builder) and not metadata.use_asm_decode
    assert model.builder.build(0, harness.make_batch(model, [40] * 20).common).use_asm_decode


def test_pure_decode_above_the_cut_runs_asm_and_matches_reference(tmp_path, kernels, plugin_log):
    model = harness.build_model(tmp_path, scales=[(0.5, 0.25), (1.0, 2.0)])
    # 20 sequences x 40 heads = 800 query heads > 2 x CUs (512 on gfx950, 608 on gfx942)
    batch, metadata = decode(model, [100, 37, 16, 1, 200, 17, 15, 64, 3, 90] * 2)
    # The step's choice is a declared field of the metadata (not an attribute set on it).
    assert "use_asm_decode" in {f.name for f in dataclasses.fields(metadata)}
    assert metadata.use_asm_decode
    check_all_layers(model, batch, metadata)
    calls = harness.asm_calls()
    assert len(calls) == 2 and kernels.hip_decode == 0
    assert all(c["high_precision"] == 2 for c in calls)
    assert kernels.cache_writes > 0  # this step's tokens went through vLLM's writer
    cut = 2 * COMPUTE_UNITS[ARCH]
    if harness.IN_TREE:
        line = f"decodes 2 of 2 layers above {cut} query heads"
        assert sum(line in m for m in plugin_log) == 1
    else:
        assert any(f"2 of 2 layers eligible on {ARCH}" in m and str(cut) in m for m in plugin_log)


@harness.plugin_only
@pytest.mark.parametrize(
    ("num_seqs", "asm"), [(12, False), (13, True)], ids=["at-cut-480", "above-cut-520"]
)
def test_cut_on_query_heads(tmp_path, kernels, monkeypatch, num_seqs, asm):
    monkeypatch.setenv("VLLM_ROCM_ASM_DECODE_CUT", "480")
    model = harness.build_model(tmp_path, num_layers=1)
    batch, metadata = decode(model, [33] * num_seqs)
    assert metadata.use_asm_decode is asm
    check_all_layers(model, batch, metadata)
    assert (len(harness.asm_calls()), kernels.hip_decode) == ((1, 0) if asm else (0, 1))


@harness.plugin_only
def test_layers_of_several_head_counts_keep_the_models_count_without_an_assert(tmp_path):
    """The cut counts a builder's layers' heads where they share one count; layers of
    several (which vLLM's get_num_attention_heads_from_layers would assert against, and
    stock ROCM_ATTN accepts) keep the model's count, as stock does."""
    model = harness.build_model(tmp_path, num_layers=2)
    model.layers[model.names[1]].impl.num_heads = 80
    builder = type(model.builder)(model.spec, model.names, model.vllm_config, model.builder.device)
    assert builder.num_heads_q == model.vllm_config.model_config.get_num_attention_heads(
        model.vllm_config.parallel_config
    )


@pytest.mark.parametrize("num_seqs", [1, 8, 12], ids=["1-seq", "8-seqs", "12-seqs-480"])
def test_below_the_default_cut_stays_on_hip(tmp_path, kernels, num_seqs):
    model = harness.build_model(tmp_path, num_layers=1)
    batch, metadata = decode(model, [300] * num_seqs)
    assert not metadata.use_asm_decode
    check_all_layers(model, batch, metadata)
    assert harness.asm_calls() == [] and kernels.hip_decode == 1


@pytest.mark.parametrize("where", ["last", "first"])
def test_a_request_without_a_query_token_keeps_the_step_on_hip(tmp_path, kernels, where):
    """The asm call maps query row i to request i: a request with no query token
    (more requests than tokens) keeps the step on HIP, above the cut too."""
    model = harness.build_model(tmp_path, num_layers=1)
    query_lens = [1] * 20 + [0] if where == "last" else [0] + [1] * 20  # 800 heads
    batch = harness.make_batch(model, [16] * 21, query_lens)
    assert not model.builder.build(0, batch.common).use_asm_decode
    assert model.builder.build(0, harness.make_batch(model, [16] * 20).common).use_asm_decode


@pytest.mark.parametrize("extra", [0, 1], ids=["at-the-cut", "one-above"])
def test_tables_only_where_a_max_num_seqs_step_passes_the_cut(tmp_path, kernels, extra):
    """``max_num_seqs`` x query heads at the cut: no step can pass it, so no layer is
    bound and no table made; one sequence more binds them."""
    cut = 2 * COMPUTE_UNITS[ARCH]
    model = harness.build_model(tmp_path, num_layers=1, num_heads=32)
    model.vllm_config.scheduler_config.max_num_seqs = cut // 32 + extra  # 32 | cut
    model.builder.build(0, harness.make_batch(model, [16] * 4).common)
    assert bool(harness.asm_layers(model.builder)) is bool(extra)


def skew_model(tmp_path):
    """GQA 8 over one KV head (4 KiB pages): room for a 32K request among 127 of 1K."""
    return harness.build_model(
        tmp_path, num_layers=1, num_heads=8, num_kv_heads=1, num_blocks=10_300
    )


@harness.plugin_only  # in-tree, the PR states the limit: graphs replay for any lengths
def test_one_long_sequence_keeps_the_step_on_hip_and_a_uniform_one_runs_asm(tmp_path, kernels):
    """One workgroup walks each sequence: one 32K request among 127 of 1K takes the asm
    kernel about 1.6x the HIP decode's time (the time model fitted to MI355X), so the
    step keeps HIP; 128 of 1K run asm, and so does vLLM's capture batch (one token a
    request, max_seq_len at max_model_len: the lengths it holds are uniform)."""
    model = skew_model(tmp_path)
    skewed = harness.make_batch(model, [32768] + [1024] * 127, contexts=False)
    uniform = harness.make_batch(model, [1024] * 128, contexts=False)
    lengths = model.builder.build(0, uniform.common)
    assert lengths.use_asm_decode
    ptr = lengths.seq_lens.data_ptr()  # the builder's buffer, which a graph would hold
    metadata = model.builder.build(0, skewed.common)
    assert not metadata.use_asm_decode
    # A graph of this size holds asm and replays it whatever the step decides: the step's
    # lengths are refilled in place all the same.
    assert metadata.seq_lens.data_ptr() == ptr
    assert metadata.seq_lens.tolist() == [32768] + [1024] * 127
    harness.run_layer(model, model.names[0], skewed, metadata)
    assert harness.asm_calls() == [] and kernels.hip_decode == 1
    # vLLM's capture batch: one token a request, claiming max_model_len.
    dummy = harness.make_batch(model, [1] * 128, contexts=False).common
    captured = dataclasses.replace(dummy, max_seq_len=40960)
    capture = model.builder.build_for_cudagraph_capture(captured)
    assert capture.use_asm_decode and capture.seq_lens.data_ptr() == ptr
    assert capture.seq_lens.tolist() == [1] * 128  # the capture's own lengths, never 0
    assert model.builder.build(0, uniform.common).seq_lens.tolist() == [1024] * 128


@harness.plugin_only
def test_the_skew_clause_follows_its_setting(tmp_path, kernels, monkeypatch):
    """VLLM_ROCM_ASM_DECODE_SKEW=0 turns the clause off; a ratio measured by bench
    kernel --skew moves it (here: low enough to let the 32K request through)."""
    skewed = [32768] + [1024] * 127  # (162,816 + 19,500) / 32,768 = 5.56 head-tokens a token
    for value, asm in (("0", True), ("5", True), ("6", False)):
        monkeypatch.setenv("VLLM_ROCM_ASM_DECODE_SKEW", value)
        model = skew_model(tmp_path / value)
        batch = harness.make_batch(model, skewed, contexts=False)
        assert model.builder.build(0, batch.common).use_asm_decode is asm, value


def test_mixed_prefill_and_decode_stays_on_hip(tmp_path, kernels):
    model = harness.build_model(tmp_path, num_layers=1)
    seq_lens = [100, 37, 16, 1, 200] * 4
    batch = harness.make_batch(model, seq_lens, [1, 5, 1, 1, 3] * 4)
    harness.fill_context(model, batch)
    metadata = model.builder.build(0, batch.common)
    assert not metadata.use_asm_decode
    check_all_layers(model, batch, metadata)
    assert harness.asm_calls() == [] and kernels.prefill == 1 and kernels.hip_decode == 1


def test_cuda_graph_padding_rows_do_not_disturb_real_rows(tmp_path, kernels):
    model = harness.build_model(tmp_path, num_layers=1)
    real = [45, 3, 160, 16, 17, 1, 80, 31, 64, 2, 99, 7]
    batch, metadata = decode(model, real, pad_to=16)  # 16 x 40 = 640 > 608 >= cut
    assert metadata.use_asm_decode and metadata.num_actual_tokens == 16
    call_tables = []
    for name in model.names:
        out = harness.run_layer(model, name, batch, metadata)
        ref = harness.reference(model, batch, model.layers[name])
        torch.testing.assert_close(out[:12].float(), ref[:12], atol=ATOL, rtol=0)
        call_tables.append(harness.asm_calls()[-1]["block_tables"])
    # The kernel writes a row of length 0 NaN: padding rows read one token of the null
    # block instead, from lengths of the builder's own (vLLM's keep their 0s).
    assert harness.asm_calls()[-1]["context_lens"].tolist() == real + [1] * 4
    assert batch.common.seq_lens.tolist() == real + [0] * 4
    assert out.isfinite().all()
    assert torch.all(call_tables[-1][12:] == 0)  # padding rows point at the null block


def test_micro_batches_build_on_builders_of_their_own(tmp_path, kernels):
    """DBO builds every micro-batch of a step before any runs. A builder's lengths
    buffer serves one metadata at a time, so vLLM must give each micro-batch its own
    builder: it does (``AttentionGroup.create_metadata_builders`` with one builder per
    ubatch, picked by ``get_metadata_builder(ubid)``: its comment there names builders'
    persistent CUDA-graph buffers as the reason). Micro-batch 0 keeps its lengths after
    micro-batch 1's build, and both decode right."""
    import inspect

    from vllm.v1.worker import gpu_model_runner
    from vllm.v1.worker.utils import AttentionGroup

    runner = inspect.getsource(gpu_model_runner.GPUModelRunner)
    assert "else self.parallel_config.num_ubatches" in runner  # builders per ubatch
    assert "builder = attn_group.get_metadata_builder(ubid or 0)" in runner
    model = harness.build_model(tmp_path, num_layers=1)
    group = AttentionGroup(model.backend, model.names, model.spec, 0)
    group.create_metadata_builders(model.vllm_config, torch.device("cpu"), num_metadata_builders=2)
    halves = [[100, 3, 45] * 6, [7, 60, 1] * 6]  # 18 x 40 heads each: above the cut
    batches = [harness.make_batch(model, lens, seed=i) for i, lens in enumerate(halves)]
    metadata = [
        group.get_metadata_builder(i).build(0, batch.common) for i, batch in enumerate(batches)
    ]
    for batch, meta, lens in zip(batches, metadata, halves, strict=True):
        assert meta.use_asm_decode and meta.seq_lens.tolist() == lens
        harness.fill_context(model, batch)
        out = harness.run_layer(model, model.names[0], batch, meta)
        ref = harness.reference(model, batch, model.layers[model.names[0]])
        torch.testing.assert_close(out.float(), ref, atol=ATOL, rtol=0)


def test_fused_output_quant_calls_stay_on_stock(tmp_path, kernels, monkeypatch):
    model = harness.build_model(tmp_path, num_layers=1)
    batch, metadata = decode(model, [50] * 20)
    assert metadata.use_asm_decode
    layer = model.layers[model.names[0]]
    stock_calls = harness.spy_stock_path(monkeypatch)
    out = torch.empty_like(batch.query)
    args = (layer, batch.query, batch.key, batch.value, layer.kv_cache, metadata, out)
    scale = torch.ones(1)
    layer.impl.forward(*args, output_scale=scale)
    with pytest.raises(NotImplementedError, match="block_scale"):  # stock refuses it
        layer.impl.forward(*args, output_block_scale=scale)
    assert harness.asm_calls() == [] and [c["output_scale"] for c in stock_calls] == [scale]
    layer.impl.forward(*args)  # the same call without it runs asm
    assert len(harness.asm_calls()) == 1 and len(stock_calls) == 1


@harness.plugin_only
def test_fp8_query_and_strided_tensor_calls_stay_on_stock(tmp_path, kernels, monkeypatch):
    """The plugin checks what the kernel reads of each call (vLLM's Attention layer
    always hands the backend a bf16/fp16 query with dense heads and a dense output)."""
    model = harness.build_model(tmp_path, num_layers=1)
    batch, metadata = decode(model, [50] * 20)
    assert metadata.use_asm_decode
    layer = model.layers[model.names[0]]
    stock_calls = harness.spy_stock_path(monkeypatch)
    out = torch.empty_like(batch.query)
    args = (layer, batch.query, batch.key, batch.value, layer.kv_cache, metadata, out)
    layer.impl.forward(*args, output_scale=torch.ones(1))
    fp8_q = batch.query.to(torch.float8_e4m3fn)
    layer.impl.forward(layer, fp8_q, *args[2:])
    assert harness.asm_calls() == []
    assert [c["query"].dtype for c in stock_calls] == [torch.bfloat16, torch.float8_e4m3fn]
    strided_out = torch.empty(out.shape[0], out.shape[1], 2 * out.shape[2], dtype=out.dtype)
    strided_out = strided_out[..., : out.shape[2]]
    layer.impl.forward(*args[:6], strided_out)  # the kernel writes out_ densely: stock
    assert harness.asm_calls() == [] and len(stock_calls) == 3
    # Heads not dense in the query (the kernel gets Q's row stride only): stock.
    spread_q = torch.empty(*batch.query.shape[:2], 2 * batch.query.shape[2], dtype=torch.bfloat16)
    spread_q = spread_q[..., : batch.query.shape[2]].copy_(batch.query)
    assert spread_q.stride(-1) == 1 and spread_q.stride(-2) != spread_q.shape[-1]
    layer.impl.forward(layer, spread_q, *args[2:])
    assert harness.asm_calls() == [] and len(stock_calls) == 4
    # An output of another dtype than the query (the kernel writes the query's): stock.
    layer.impl.forward(*args[:6], torch.empty_like(out, dtype=torch.float32))
    assert harness.asm_calls() == [] and len(stock_calls) == 5
    # A query (and output) of another dtype than the layer was bound for: stock.
    half_q, half_out = batch.query.to(torch.float16), out.to(torch.float16)
    layer.impl.forward(layer, half_q, *args[2:6], half_out)
    assert harness.asm_calls() == [] and len(stock_calls) == 6
    # A K or a V scale that moved since the binding (before any build saw it): stock.
    for side in ("_k_scale_float", "_v_scale_float"):
        bound = getattr(layer, side)
        setattr(layer, side, 2 * bound)
        layer.impl.forward(*args)
        setattr(layer, side, bound)
    assert harness.asm_calls() == [] and len(stock_calls) == 8
    layer.impl.forward(*args)  # the same call without any of them runs asm
    assert len(harness.asm_calls()) == 1 and len(stock_calls) == 8


@harness.plugin_only
def test_scale_reload_is_decided_again_at_the_next_build(tmp_path, kernels):
    """A binding made for other scales is never used: that call takes the stock path and
    the next build() (outside any graph capture) binds the new tables."""
    model = harness.build_model(tmp_path, num_layers=1, scales=[(1.0, 1.0)])
    name = model.names[0]
    layer = model.layers[name]
    batch, metadata = decode(model, [40] * 16)
    harness.run_layer(model, name, batch, metadata)
    first = model.builder.binding(name)
    harness.set_layer_scales(layer, 0.5, 0.5)  # weights reloaded with new scales
    batch, metadata = decode(model, [40] * 16, seed=1)
    check_all_layers(model, batch, metadata)  # stale: stock, still right
    assert (len(harness.asm_calls()), kernels.hip_decode) == (1, 1)
    assert metadata.asm_bindings.stale
    batch, metadata = decode(model, [40] * 16, seed=2)
    check_all_layers(model, batch, metadata)
    second = model.builder.binding(name)
    assert second is not first and second.k_scale == 0.5
    assert float(second.k_scale_table[0, 0, 0]) == 0.5
    assert (len(harness.asm_calls()), kernels.hip_decode) == (2, 1)


def test_the_view_the_kernel_gets_is_the_bound_cache(tmp_path, kernels):
    model = harness.build_model(tmp_path, num_layers=1)
    name = model.names[0]
    layer = model.layers[name]
    batch, metadata = decode(model, [40] * 16)
    harness.run_layer(model, name, batch, metadata)
    call = harness.asm_calls()[-1]
    base = layer.kv_cache.untyped_storage().data_ptr()
    assert call["K"].untyped_storage().data_ptr() == base  # no copy, no relayout
    assert call["V"].untyped_storage().data_ptr() == base
    assert tuple(call["K"].shape[1:]) == (8, 8, 16, 16)
    assert tuple(call["V"].shape[1:]) == (8, 1, 128, 16)
    assert call["out_"].is_contiguous() and tuple(call["out_"].shape) == (16, 40, 128)
    assert call["block_tables_stride0"] == call["block_tables"].stride(0)


@harness.plugin_only
def test_a_rebound_cache_is_decided_again(tmp_path, kernels, plugin_log, monkeypatch):
    model = harness.build_model(tmp_path, num_layers=1)
    name = model.names[0]
    layer = model.layers[name]
    batch, metadata = decode(model, [40] * 16)
    harness.run_layer(model, name, batch, metadata)
    first = model.builder.binding(name)
    # The same layout in new memory: the old views are never used again; the next build
    # binds the new cache and asm runs on it.
    old = layer.kv_cache
    layer.kv_cache = torch.empty_strided(old.shape, old.stride(), dtype=old.dtype)
    layer.kv_cache.copy_(old)
    check_all_layers(model, batch, metadata)
    assert (len(harness.asm_calls()), kernels.hip_decode) == (1, 1)
    batch, metadata = decode(model, [40] * 16, seed=1)
    check_all_layers(model, batch, metadata)
    assert model.builder.binding(name) is not first
    assert model.builder.binding(name).kv_cache is layer.kv_cache
    assert len(harness.asm_calls()) == 2
    # K and V pages interleaved (LBHNC strides): refused, stock path, and the log says why.
    stock_calls = harness.spy_stock_path(monkeypatch)
    side = old.stride(1) // old.shape[0]  # bytes of one K (or V) page
    layer.kv_cache = torch.empty_strided(
        old.shape, (2 * side, side, *old.stride()[2:]), dtype=old.dtype
    )
    out = torch.empty_like(batch.query)
    for _ in range(2):  # the stale call, then the call after the builder decided again
        metadata = model.builder.build(0, batch.common)
        layer.impl.forward(
            layer, batch.query, batch.key, batch.value, layer.kv_cache, metadata, out
        )
    assert len(stock_calls) == 2 and len(harness.asm_calls()) == 2
    assert model.builder.binding(name) is None and not metadata.use_asm_decode
    assert any("re-bind" in m and "not dense" in m for m in plugin_log)


def test_the_bindings_live_with_the_builder_not_the_layer(tmp_path, kernels):
    """vLLM's CUDA-graph profiling pass binds a small KV cache, then drops its builders
    and that cache: nothing on the layer may keep the cache alive."""
    import gc
    import weakref

    model = harness.build_model(tmp_path, num_layers=2)
    decode(model, [40] * 16)
    layer = model.layers[model.names[0]]
    cache = weakref.ref(layer.kv_cache.untyped_storage())
    assert harness.asm_layers(model.builder) == set(model.names)
    held_by_impl = [v for v in vars(layer.impl).values() if isinstance(v, torch.Tensor)]
    assert not any(t.untyped_storage() is cache() for t in held_by_impl)
    model.builder = None
    for layer in model.layers.values():  # vLLM's _cleanup_profiling_kv_cache
        layer.kv_cache = torch.tensor([])
    gc.collect()
    assert cache() is None


def full_capture_batch(model, num_tokens: int, max_num_seqs: int = 256):
    """The dummy batch vLLM's V1 runner captures a graph from when the mode is not a
    uniform-decode one (``cudagraph_mode=FULL``): the tokens spread over at most
    ``max_num_seqs`` requests, and ``max_query_len`` the whole token count."""
    num_reqs = min(num_tokens, max_num_seqs)
    query_lens = [num_tokens // num_reqs] * num_reqs
    query_lens[-1] += num_tokens % num_reqs
    seq_lens = [q + 15 for q in query_lens]
    batch = harness.make_batch(model, seq_lens, query_lens, contexts=False)
    return dataclasses.replace(batch.common, max_query_len=num_tokens)


@pytest.mark.parametrize("mode", ["FULL", "FULL_AND_PIECEWISE"])
def test_under_full_cudagraph_mode_no_captured_graph_holds_asm(tmp_path, kernels, mode):
    """The capture-time metadata at every capture size, from dummy batches shaped as
    vLLM's V1 runner shapes them (``_dummy_run``; nothing is captured on the CPU):
    FULL's mixed-looking batches decide HIP at every size (the asm decode then runs
    only on eager steps past the largest size); FULL_AND_PIECEWISE's uniform decodes
    decide asm above the cut."""
    from vllm.config import CUDAGraphMode

    model = harness.build_model(tmp_path, num_layers=1, num_blocks=600)
    model.vllm_config.compilation_config.cudagraph_mode = CUDAGraphMode[mode]
    sizes = [1, 2, 4, *range(8, 256, 8), *range(256, 513, 16)]
    uniform = mode != "FULL"
    cut = 2 * COMPUTE_UNITS[ARCH]
    decided = {}
    for n in sizes:
        if uniform:
            common = harness.make_batch(model, [16] * n, contexts=False).common
            # vLLM's capture batch claims the longest context a replay may meet.
            common = dataclasses.replace(common, max_seq_len=40960)
        else:
            common = full_capture_batch(model, n)
        decided[n] = model.builder.build_for_cudagraph_capture(common).use_asm_decode
    assert decided == {n: uniform and n * 40 > cut for n in sizes}
    assert any(decided.values()) is uniform


@harness.plugin_only
@pytest.mark.parametrize("mode", ["FULL", "FULL_AND_PIECEWISE", "FULL_DECODE_ONLY"])
def test_the_start_up_line_says_what_full_mode_captures(tmp_path, kernels, plugin_log, mode):
    from vllm.config import CUDAGraphMode

    model = harness.build_model(tmp_path, num_layers=1)
    model.vllm_config.compilation_config.cudagraph_mode = CUDAGraphMode[mode]
    model.builder.build(0, harness.make_batch(model, [40] * 4, contexts=False).common)
    full = [m for m in plugin_log if "cudagraph_mode=FULL " in m]
    if mode == "FULL":
        assert len(full) == 1
        assert "eager decode steps past the largest capture size" in full[0]
        assert "FULL_AND_PIECEWISE" in full[0]
    else:
        assert full == []


def test_a_model_without_a_folder_leaves_none_behind(tmp_path, monkeypatch):
    """The validation tools build their models without a folder: the config.json's goes."""
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))
    model = harness.build_model(num_layers=1)
    assert model.vllm_config.model_config.hf_config.num_attention_heads == 40
    assert not any(tmp_path.iterdir())
