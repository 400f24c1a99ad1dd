"""On an AMD gfx942/gfx950 GPU with AITER: the real ``pa_fwd_asm`` through the backend,
against the contract model, the stock HIP decode and an fp32 reference; CUDA-graph
capture and replay; no host sync. Skipped, with the reason, everywhere else.

Run on an MI300X/MI325X/MI355X box: ``VLLM_ROCM_USE_AITER=1 pytest tests/rocm -v``.
"""

from __future__ import annotations

import importlib.util

import pytest
import torch

import harness
from conftest import ARCH, REAL_ROCM

pytestmark = [
    pytest.mark.rocm,
    pytest.mark.skipif(not REAL_ROCM, reason="needs a ROCm GPU (none on this machine)"),
    pytest.mark.skipif(
        REAL_ROCM and ARCH not in ("gfx942", "gfx950"),
        reason=f"asm decode kernels exist for gfx942/gfx950, not {ARCH}",
    ),
    pytest.mark.skipif(importlib.util.find_spec("aiter") is None, reason="AITER is not installed"),
]

#: From the seed's measurements vs fp32 (fp8 cache): HIP max 0.0072; asm uhp max 0.026
#: and mean 0.00078. Bounds leave headroom for bf16 output rounding.
HIP_MAX, ASM_MAX, ASM_MEAN = 0.0072 * 2, 0.026 * 1.5, 0.00078 * 2
LAYOUTS = [(40, 8), (32, 8), (64, 8), (32, 4)]
CONTEXTS = [1, 15, 16, 17, 255, 1000, 4000]


def model_for(tmp_path, heads, kvh, num_seqs, ctx, dtype="bfloat16"):
    blocks = num_seqs * (ctx // 16 + 2) + 8
    return harness.build_model(
        tmp_path,
        num_heads=heads,
        num_kv_heads=kvh,
        num_layers=1,
        num_blocks=blocks,
        device="cuda",
        dtype=dtype,
    )


def errors(out, ref):
    diff = (out.float().cpu() - ref).abs()
    return float(diff.max()), float(diff.mean())


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16], ids=["bf16", "fp16"])
@pytest.mark.parametrize("seed", [0, 1, 2])
@pytest.mark.parametrize(("heads", "kvh"), LAYOUTS, ids=[f"{h}-{k}" for h, k in LAYOUTS])
def test_asm_through_the_backend_matches_reference_and_contract_model(
    tmp_path, heads, kvh, seed, dtype, monkeypatch
):
    """bf16 and fp16 queries at high_precision=2 (AITER's own tests run Hp=2 for bf16
    only, so the plugin lets fp16 layers use it once trusted: this is such a proof)."""
    monkeypatch.setenv("VLLM_ROCM_ASM_DECODE_TRUST_AITER", "1")
    from vllm_rocm_asm_decode.kernel import current_arch, load_asm_kernel
    from vllm_rocm_asm_decode.tools.contract_model import PagedAttentionAsmModel

    # Above the cut: enough sequences for 2 x CUs query heads, contexts sampled 1..4000.
    num_seqs = max(64, 2 * 304 // heads + 1)
    seq_lens = [CONTEXTS[i % len(CONTEXTS)] for i in range(num_seqs)]
    model = model_for(
        tmp_path, heads, kvh, num_seqs, max(seq_lens), str(dtype).removeprefix("torch.")
    )
    batch = harness.make_batch(model, seq_lens, seed=seed, dtype=dtype)
    harness.fill_context(model, batch)
    metadata = model.builder.build(0, batch.common)
    name = model.names[0]
    layer = model.layers[name]
    assert metadata.use_asm_decode and model.builder.binding(name) is not None
    out = harness.run_layer(model, name, batch, metadata)
    torch.cuda.synchronize()
    ref = harness.reference(model, batch, layer)
    max_err, mean_err = errors(out, ref)
    assert max_err <= ASM_MAX and mean_err <= ASM_MEAN, (max_err, mean_err)
    # The contract model on the very views and tables the kernel got, moved to the CPU.
    b = model.builder.binding(name)
    kernel, _ = load_asm_kernel(current_arch())
    model_out = PagedAttentionAsmModel(kernel.table)(
        batch.query.cpu(),
        b.key_cache.cpu(),
        b.value_cache.cpu(),
        batch.block_table.cpu(),
        batch.common.seq_lens.cpu(),
        batch.block_table.stride(0),
        K_QScale=b.k_scale_table.cpu(),
        V_QScale=b.v_scale_table.cpu(),
        high_precision=2,
    )
    assert errors(out, model_out.float())[0] <= ASM_MAX


@pytest.mark.parametrize(("heads", "kvh"), LAYOUTS, ids=[f"{h}-{k}" for h, k in LAYOUTS])
def test_below_the_cut_runs_the_stock_hip_decode(tmp_path, heads, kvh):
    model = model_for(tmp_path, heads, kvh, 4, 4000)
    batch = harness.make_batch(model, [4000, 1000, 17, 1])
    harness.fill_context(model, batch)
    metadata = model.builder.build(0, batch.common)
    assert not metadata.use_asm_decode
    name = model.names[0]
    out = harness.run_layer(model, name, batch, metadata)
    torch.cuda.synchronize()
    max_err, _ = errors(out, harness.reference(model, batch, model.layers[name]))
    assert max_err <= HIP_MAX


def test_cuda_graph_capture_and_replay_of_forward(tmp_path):
    model = model_for(tmp_path, 40, 8, 64, 1000)
    batch = harness.make_batch(model, [1000] * 48, pad_to=64)  # padded as vLLM captures
    harness.fill_context(model, batch)
    harness.write_step(model, batch)  # as Attention does before impl.forward
    metadata = model.builder.build(0, batch.common)
    assert metadata.use_asm_decode
    name = model.names[0]
    layer = model.layers[name]
    out = torch.empty_like(batch.query)

    def step():
        layer.impl.forward(
            layer, batch.query, batch.key, batch.value, layer.kv_cache, metadata, out
        )

    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())  # the cache writes above come first
    with torch.cuda.stream(stream):
        step()  # warm-up outside capture
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        step()
    out.zero_()
    graph.replay()
    torch.cuda.synchronize()
    ref = harness.reference(model, batch, layer)
    max_err, _ = errors(out[:48], ref[:48])
    assert max_err <= ASM_MAX
    assert torch.isfinite(out[48:]).all()  # the padding rows of the captured batch


def test_no_host_sync_on_the_asm_path(tmp_path):
    model = model_for(tmp_path, 40, 8, 64, 1000)
    batch = harness.make_batch(model, [1000] * 64)
    harness.fill_context(model, batch)
    metadata = model.builder.build(0, batch.common)
    assert metadata.use_asm_decode
    name = model.names[0]
    layer = model.layers[name]
    out = torch.empty_like(batch.query)
    layer.impl.forward(
        layer, batch.query, batch.key, batch.value, layer.kv_cache, metadata, out
    )  # first call outside the check
    torch.cuda.synchronize()
    torch.cuda.set_sync_debug_mode("error")
    try:
        metadata = model.builder.build(0, batch.common)
        layer.impl.forward(
            layer, batch.query, batch.key, batch.value, layer.kv_cache, metadata, out
        )
    finally:
        torch.cuda.set_sync_debug_mode("default")
    torch.cuda.synchronize()


def test_block_ids_above_65536_through_the_backend(tmp_path, monkeypatch):
    """AITER before 0.1.17 reads block id b as b & 0xFFFF. A fixed AITER must pass the
    probe; on any AITER, the backend without the trust switch keeps a pool past 65536
    blocks on the HIP decode, with the right answer."""
    from vllm_rocm_asm_decode.aiter_version import AiterBuild
    from vllm_rocm_asm_decode.kernel import load_asm_kernel
    from vllm_rocm_asm_decode.tools.validation import selftest

    check = selftest.block_id_probe("cuda")
    aiter = AiterBuild.installed()
    if aiter.block_id_fix:
        assert check.ok, check.detail
    monkeypatch.delenv("VLLM_ROCM_ASM_DECODE_TRUST_AITER", raising=False)
    load_asm_kernel.cache_clear()
    model = harness.build_model(tmp_path / "pool", num_layers=1, num_blocks=70000, device="cuda")
    n = selftest.sequences_above_cut(40)
    pages = [[67000 - i] for i in range(n)]
    batch = harness.make_batch(model, [16] * n, pages=pages)
    harness.fill_context(model, batch)
    metadata = model.builder.build(0, batch.common)
    layer = model.layers[model.names[0]]
    assert metadata.use_asm_decode is aiter.reads_high_block_ids
    out = harness.run_layer(model, model.names[0], batch, metadata)
    torch.cuda.synchronize()
    limit = ASM_MAX if aiter.reads_high_block_ids else HIP_MAX
    assert errors(out, harness.reference(model, batch, layer))[0] <= limit


def test_padding_rows_stay_finite_after_the_asm_call():
    from vllm_rocm_asm_decode.tools.validation import selftest

    check = selftest.padding_probe("cuda")
    assert check.ok, check.detail


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16], ids=["bf16", "fp16"])
def test_selftest_accuracy_probe(dtype):
    from vllm_rocm_asm_decode.tools.validation import selftest

    check = selftest.accuracy_probe("cuda", dtype)
    assert check.ok, check.detail


@pytest.mark.parametrize(("heads", "kvh"), [(40, 8), (32, 4)], ids=["40-8", "32-4"])
def test_mixed_step_splits_decodes_to_asm_and_prefills_to_the_prefill_kernel(tmp_path, heads, kvh):
    """A mixed step above the cut: the leading decodes through the real asm kernel, the
    prefill chunks through vLLM's Triton prefill kernel on the split's views."""
    from vllm_rocm_asm_decode.tools.validation import selftest

    nd = max(selftest.sequences_above_cut(heads), 16)
    seq_lens = [CONTEXTS[i % len(CONTEXTS)] for i in range(nd)] + [600, 130]
    query_lens = [1] * nd + [512, 37]
    model = model_for(tmp_path, heads, kvh, nd + 2, max(seq_lens))
    batch = harness.make_batch(model, seq_lens, query_lens)
    harness.fill_context(model, batch)
    metadata = model.builder.build(0, batch.common)
    assert not metadata.use_asm_decode and metadata.asm_split is not None
    assert metadata.asm_split.num_decodes == nd
    name = model.names[0]
    out = harness.run_layer(model, name, batch, metadata)
    torch.cuda.synchronize()
    ref = harness.reference(model, batch, model.layers[name])
    max_err, mean_err = errors(out[:nd], ref[:nd])
    assert max_err <= ASM_MAX and mean_err <= ASM_MEAN, (max_err, mean_err)
    assert errors(out[nd:], ref[nd:])[0] <= ASM_MAX  # the Triton prefill rows


def test_per_layer_scale_tables_are_aliased_and_a_reload_reaches_a_captured_graph():
    """Two layers with distinct checkpoint scales on aliased tables (one chunk of device
    memory each); a weight reload between two replays of a captured CUDA graph."""
    from vllm_rocm_asm_decode.tools.validation import selftest

    check = selftest.scale_table_probe("cuda")
    assert check.ok, check.detail
    assert "(aliased," in check.detail and "graph replay read the refilled" in check.detail
