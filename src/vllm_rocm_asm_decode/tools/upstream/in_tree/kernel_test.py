"""ROCM_ATTN's asm decode: AITER's pa_fwd_asm (high_precision=2) on ROCM_ATTN's fp8 KV
cache. The rule, the step decision and the builder (on the CPU) run anywhere; the
kernel tests need AITER >= 0.1.17 on gfx942/gfx950."""

import json
import sys
from dataclasses import replace
from types import SimpleNamespace
from unittest import mock

import pytest
import torch
from packaging.version import InvalidVersion, Version

from vllm import config as cfg
from vllm._aiter_ops import rocm_aiter_ops
from vllm.config import CUDAGraphMode
from vllm.model_executor.layers.attention import Attention
from vllm.model_executor.layers.quantization.fp8 import Fp8Config
from vllm.model_executor.model_loader.reload import record_metadata_for_reloading
from vllm.model_executor.model_loader.reload.inplace import reload_weights
from vllm.model_executor.model_loader.utils import process_weights_after_loading
from vllm.platforms import current_platform
from vllm.utils.math_utils import cdiv
from vllm.v1.attention.backend import CommonAttentionMetadata
from vllm.v1.attention.backends import rocm_attn
from vllm.v1.attention.backends.registry import AttentionBackendEnum
from vllm_rocm_asm_decode.core import asm_decode_rejections, use_asm_decode

DEVICE, HEAD, BLOCK, PAD, CUS = "cuda", 128, 16, 8, 304
CONTEXTS = [1, 15, 16, 17, 255, 1000, 4000]
# Against fp32 on MI355X: asm (high_precision=2) max 0.026, mean 0.00078; HIP max
# 0.0072, mean 0.00018. asm against HIP: the sums, max x1.5 and mean x2 as headroom,
# times the V scale, which scales the output and its error (taken as 1 there).
ASM_MAX, ASM_MEAN = 0.05, 0.002
try:  # AITER before 0.1.17 misreads block ids >= 65536: the decode keeps HIP
    from aiter._version import __version__

    from vllm.platforms.rocm import on_mi3xx

    ASM = on_mi3xx() and Version(__version__) >= Version("0.1.17")
except (ImportError, InvalidVersion):  # no ROCm GPU, no AITER, or an unknown one
    ASM = False
requires_asm = pytest.mark.skipif(
    not (ASM and torch.accelerator.is_available()),
    reason="needs AITER >= 0.1.17 on a gfx942/gfx950 GPU",
)


@pytest.fixture(autouse=True)
def _aiter_on(monkeypatch):  # the asm decode is ROCM_ATTN's with AITER's MHA on
    monkeypatch.setattr(rocm_aiter_ops, "_AITER_ENABLED", True)
    monkeypatch.setattr(rocm_aiter_ops, "_MHA_ENABLED", True)


@pytest.fixture
def gfx942(monkeypatch):
    """The builder's host logic on any machine (its KV cache on the CPU): gfx942, 304
    CUs, AITER 0.1.17."""
    rocm = sys.modules.get("vllm.platforms.rocm", SimpleNamespace())  # ROCm's only
    monkeypatch.setitem(sys.modules, "vllm.platforms.rocm", rocm)
    monkeypatch.setattr(rocm, "on_mi3xx", lambda: True, raising=False)
    aiter_version = SimpleNamespace(__version__="0.1.17")
    monkeypatch.setitem(sys.modules, "aiter._version", aiter_version)
    monkeypatch.setattr(current_platform, "num_compute_units", lambda i=0: CUS)
    monkeypatch.setattr(rocm_aiter_ops, "is_mha_enabled", lambda: True)
    return aiter_version


def llama(path, heads=40, kvh=8, **kw):
    """The ModelConfig of a one-layer Llama checkpoint."""
    sizes = dict(num_attention_heads=heads, num_key_value_heads=kvh, head_dim=HEAD)
    sizes |= dict(hidden_size=heads * HEAD, num_hidden_layers=1, model_type="llama")
    sizes |= dict(architectures=["LlamaForCausalLM"], max_position_embeddings=2**20)
    (path / "config.json").write_text(json.dumps(sizes))
    return cfg.ModelConfig(str(path), skip_tokenizer_init=True, **kw)


def kv_scales(*layers):  # each layer's (K, V) scales, as a checkpoint's weights
    names = [f"layers.{i}.{kv}_scale" for i in range(len(layers)) for kv in "kv"]
    values = [torch.tensor(scale) for layer in layers for scale in layer]
    return list(zip(names, values, strict=True))


class Model(torch.nn.Module):
    """ROCM_ATTN layers of an fp8 checkpoint (K/V scales loaded and reloaded by vLLM's
    loader) on one random fp8 KV cache bound as vLLM binds it, and their builder."""

    def __init__(self, path, heads, kvh, blocks, dev, dtype, scales=((0.5, 2),)):
        super().__init__()
        model = llama(path, heads, kvh, dtype=dtype, max_model_len=4096)
        cache = cfg.CacheConfig(cache_dtype="fp8", block_size=BLOCK)
        self.config = cfg.VllmConfig(model, cache, device_config=cfg.DeviceConfig(dev))
        kw = dict(cache_config=cache, quant_config=Fp8Config())
        kw |= dict(attn_backend=AttentionBackendEnum.ROCM_ATTN.get_class())
        with cfg.set_current_vllm_config(self.config):
            self.layers = torch.nn.ModuleList(
                Attention(heads, HEAD, HEAD**-0.5, kvh, **kw, prefix=f"layers.{i}")
                for i in range(len(scales))
            )
        record_metadata_for_reloading(self)
        self.load_weights(kv_scales(*scales))
        process_weights_after_loading(self, model, torch.device(dev))
        # fp8 codes of either sign up to 2.0 (no NaN code of e4m3fn or e4m3fnuz).
        shape = (2, blocks, BLOCK, kvh * HEAD)  # on the GPU (8.6 GB for 4 GiB apart)
        codes = torch.randint(1, 65, shape, dtype=torch.uint8, device=dev)
        codes |= torch.randint_like(codes, 0, 2) << 7
        for layer in self.to(dev).layers:
            layer.kv_cache = codes.transpose(0, 1)  # vLLM's [blocks, 2, ...] view
        self.attn = self.layers[0]
        self.builder = self.new_builder()

    def new_builder(self, cls=None):
        backend = self.attn.attn_backend
        spec = backend.customize_spec(self.attn.get_kv_cache_spec(self.config))
        names = [x.layer_name for x in self.layers]
        cls = cls or backend.get_builder_cls()
        return cls(spec, names, self.config, self.config.device_config.device)

    def load_weights(self, weights):
        for name, tensor in weights:
            self.get_parameter(name).weight_loader(self.get_parameter(name), tensor)
        return {name for name, _ in weights}

    def run(self, query, meta, out=None, **kw):  # out is torch.empty in vLLM
        out = torch.full_like(query, torch.nan) if out is None else out
        kv, cache = query[:, : self.attn.num_kv_heads], self.attn.kv_cache  # kv unread
        self.attn.impl.forward(self.attn, query, kv, kv, cache, meta, out, **kw)
        return out

    def hip(self, query, meta):  # the HIP decode's answer for the rows with a context
        return self.run(query, replace(meta, use_asm_decode=False))[:-PAD].float()


def common(seq_lens, pages, query_lens=None, device="cpu"):
    """A step's CommonAttentionMetadata, as vLLM's runner makes it."""
    query_lens = query_lens or [1] * len(seq_lens)
    start = torch.tensor([0, *query_lens]).cumsum(0).to(torch.int32)
    lens, width = torch.tensor(seq_lens, dtype=torch.int32), max(map(len, pages))
    table = torch.tensor([p + [0] * (width - len(p)) for p in pages], dtype=torch.int32)
    tokens = sum(query_lens)
    return CommonAttentionMetadata(
        query_start_loc=start.to(device, copy=True),  # a capture zeroes it
        query_start_loc_cpu=start,
        seq_lens=lens.to(device, copy=True),  # a capture fills it with 1
        seq_lens_cpu_upper_bound=lens,
        num_reqs=len(seq_lens),
        num_actual_tokens=tokens,
        max_query_len=max(query_lens),
        max_seq_len=max(seq_lens),
        block_table_tensor=table.to(device),
        slot_mapping=torch.full((tokens,), -1, device=device),
    )


def decode(path, heads=40, kvh=8, dev=None, dtype=torch.bfloat16, **kw):
    """A model, and a decode step just above the cut on distinct random pages, then
    PAD rows of vLLM's FULL-graph padding (length 0, on the null block)."""
    dev = dev or DEVICE
    n = 2 * current_platform.num_compute_units() // heads + 1
    seq_lens = [CONTEXTS[i % len(CONTEXTS)] for i in range(n)] + [0] * PAD
    free = (torch.randperm(sum(cdiv(s, BLOCK) for s in seq_lens)) + 1).tolist()
    model = Model(path, heads, kvh, len(free) + 1, dev, dtype, **kw)
    pages = [[free.pop() for _ in range(cdiv(s, BLOCK))] for s in seq_lens]
    qkv = torch.randn(n + PAD, heads + 2 * kvh, HEAD, dtype=dtype, device=dev)
    query = qkv[:, :heads]  # as vLLM hands it: a view of the QKV projection
    return model, common(seq_lens, pages, device=dev), query


GQA = {f"bf16-{g}": (g, torch.bfloat16) for g in range(1, 9)}
GQA |= {"fp16-5": (5, torch.float16)}


@requires_asm
@pytest.mark.parametrize(("gqa", "dtype"), GQA.values(), ids=GQA)
def test_every_admitted_gqa_ratio(tmp_path, gqa, dtype):
    """One ultra-precision call within its bound of the HIP decode at K/V scales 0.5/2
    (a swapped or missing scale is off by 4x); every row with a context written."""
    import aiter

    model, step, query = decode(tmp_path, 8 * gqa, 8, dtype=dtype)
    metadata = model.builder.build(0, step)
    with mock.patch.object(aiter, "pa_fwd_asm", wraps=aiter.pa_fwd_asm) as pa:
        asm = model.run(query, metadata)[:-PAD].float()
    hip = model.hip(query, metadata)
    assert [call.kwargs["high_precision"] for call in pa.call_args_list] == [2]
    torch.testing.assert_close(asm, hip, atol=ASM_MAX * 2, rtol=0)  # V scale 2
    assert (asm - hip).abs().mean() <= ASM_MEAN * 2


@requires_asm
def test_pages_over_4_gib_apart_read_as_adjacent_ones(tmp_path):
    """AITER's own test (test_pa_block_id_truncation.py) reads one page per sequence."""
    blocks = 2**32 // (8 * HEAD * BLOCK) + 2
    model = Model(tmp_path, 64, 8, blocks, DEVICE, torch.bfloat16)
    end = model.attn.kv_cache.shape[0] - 1
    far, near = [p for i in range(16) for p in (1 + i, end - i)], list(range(17, 49))
    for plane in model.attn.kv_cache.unbind(1):  # the same content on adjacent pages
        plane[near] = plane[far]
    n = 2 * (current_platform.num_compute_units() // 64 + 1)  # above the cut
    query = torch.randn(1, 64, HEAD).to(DEVICE, torch.bfloat16).expand(n, -1, -1)
    step = common([512] * n, [far, near] * (n // 2), device=DEVICE)
    metadata = model.builder.build(0, step)
    out = model.run(query.contiguous(), metadata)
    assert metadata.use_asm_decode and torch.equal(out[0], out[1])


@requires_asm
def test_padding_rows_come_out_finite(tmp_path):
    """vLLM's FULL-graph padding (length 0, the null block): what the kernel writes
    there is in no source, and a NaN would reach real tokens through a per-tensor
    dynamic quantization of the output."""
    model, step, query = decode(tmp_path)
    metadata = model.builder.build(0, step)
    out = model.run(query, metadata, torch.zeros_like(query))  # stock leaves them so
    assert metadata.use_asm_decode and out[-PAD:].isfinite().all()


@requires_asm
def test_a_captured_graph_replays_asm_and_follows_a_weight_reload(tmp_path):
    """Captured through build_for_cudagraph_capture as vLLM's runner captures, replayed
    after vLLM's weight reloads (K and V equal, then apart: each its own table)."""
    model, step, query = decode(tmp_path, scales=[(1, 1)])
    metadata = model.builder.build_for_cudagraph_capture(step)
    metadata.seq_lens.copy_(step.seq_lens_cpu_upper_bound)  # as vLLM's runner does
    step.query_start_loc.copy_(step.query_start_loc_cpu)
    out, graph = torch.zeros_like(query), torch.cuda.CUDAGraph()
    model.run(query, metadata, out)  # warm up
    with torch.cuda.graph(graph):
        model.run(query, metadata, out)
    for k_scale, v_scale in ((1, 0.5), (0.25, 4)):
        reload_weights(model.config, model, kv_scales((k_scale, v_scale)), None, True)
        hip = model.hip(query, model.builder.build(0, step))  # refills the tables
        graph.replay()
        atol = ASM_MAX * v_scale
        assert metadata.use_asm_decode
        torch.testing.assert_close(out[:-PAD].float(), hip, atol=atol, rtol=0)


def test_one_table_per_distinct_k_and_v_scale_at_most_four(tmp_path, gfx942):
    """Layers at one scale share tables (K's apart from V's). Layers whose scales need
    more than four (made outside vLLM's KV cache sizing) all keep HIP."""
    model, step, _ = decode(tmp_path, dev="cpu", scales=[(1, 1), (1, 1), (0.5, 2)])
    tables = model.builder.build(0, step).asm_scales
    (k0, v0), (k1, v1), (k2, v2) = (tables[x] for x in model.layers)
    assert k0 is k1 and v0 is v1 and len({k0, v0, k2, v2}) == 4
    assert k0.shape == (model.attn.kv_cache.shape[0], 8, BLOCK)
    ratios = [(t / k0).unique().tolist() for t in (v0, k2, v2)]  # e4m3fnuz doubles
    assert k0.unique().numel() == 1 and ratios == [[1], [0.5], [2]]
    model, step, _ = decode(tmp_path, dev="cpu", scales=[(1, 1), (0.5, 2), (0.25, 4)])
    assert model.builder.build(0, step).asm_scales == {}


def test_a_drafters_builder_cuts_on_its_layers_heads(tmp_path, gfx942):
    """Its layers' 40 query heads, not its model's 8 (a step just above the cut)."""
    model, step, _ = decode(tmp_path, dev="cpu")
    model.config.model_config.model_arch_config.total_num_attention_heads = 8
    assert model.new_builder().build(0, step).use_asm_decode


def test_a_fused_output_quant_keeps_hip(tmp_path, gfx942):
    model, step, query = decode(tmp_path, dev="cpu")
    metadata = model.builder.build(0, step)
    with mock.patch.object(rocm_attn, "chunked_prefill_paged_decode") as hip:
        model.run(query, metadata, output_scale=torch.ones(1))
    assert metadata.use_asm_decode and hip.call_count == 1


@pytest.mark.parametrize("mode", ["PIECEWISE", "FULL"])
def test_a_reload_that_parts_the_layers_of_a_table(tmp_path, gfx942, mode):
    """Layers moving together refill their table in place. The layer that then moves
    alone goes back to HIP (one warning), or, where FULL graphs may replay the old
    table (a drafter's decode graphs under FULL too), build() stops."""
    model, step, _ = decode(tmp_path, dev="cpu", scales=[(1, 1), (1, 1)])
    model.config.compilation_config.cudagraph_mode = CUDAGraphMode[mode]
    k, v = model.builder.build(0, step).asm_scales[model.attn]
    reload_weights(model.config, model, kv_scales((2, 1), (2, 1)), None, True)
    assert len(model.builder.build(0, step).asm_scales) == 2 and (k / v).unique() == 2
    reload_weights(model.config, model, kv_scales((2, 1), (0.5, 1)), None, True)
    if not mode.startswith("FULL"):
        assert list(model.builder.build(0, step).asm_scales) == [model.attn]
    else:
        with pytest.raises(RuntimeError, match=r"layers\.1 left .*_AITER_MHA=0 or"):
            model.builder.build(0, step)


@pytest.mark.parametrize("version", ["0.1.16.post1", "0.1.17rc1", "unknown"])
def test_an_aiter_before_0_1_17_keeps_hip(tmp_path, gfx942, version):
    gfx942.__version__ = version
    model, step, _ = decode(tmp_path, dev="cpu")
    assert model.builder.build(0, step).asm_scales == {}


def test_only_rocm_attns_own_builder_with_aiters_mha_binds(tmp_path, gfx942):
    model, step, _ = decode(tmp_path, dev="cpu")
    derived = type("Derived", (type(model.builder),), {})  # another backend's
    assert model.new_builder(derived).build(0, step).asm_scales == {}
    with mock.patch.object(rocm_aiter_ops, "is_mha_enabled", return_value=False):
        assert model.new_builder().build(0, step).asm_scales == {}
    assert model.new_builder().build(0, step).asm_scales


def rule(path, head=HEAD, block=BLOCK, lbhnc=False, mi3xx=True, model=None, **kw):
    """The rule on vLLM's impl, a bound KV cache view (meta tensors) and ModelConfig."""
    kw = dict(num_heads=40, num_kv_heads=8, scale=HEAD**-0.5, kv_cache_dtype="fp8") | kw
    kw = dict(alibi_slopes=None, sliding_window=None) | kw
    impl = rocm_attn.RocmAttentionImpl(head_size=head, **kw)
    pages = torch.empty(2, 4, block, impl.num_kv_heads * head, dtype=torch.uint8)
    kv_cache = pages.view(4, 2, block, -1) if lbhnc else pages.transpose(0, 1)
    model = llama(path, **dict(max_model_len=4096) | (model or {}))
    return asm_decode_rejections(impl, kv_cache.to("meta"), model, mi3xx)


FP16_128K = dict(dtype=torch.float16, max_model_len=2**17)
RULE = {
    "bf16": ({}, []),
    "fp16-e4m3-128k": (dict(model=FP16_128K, kv_cache_dtype="fp8_e4m3"), []),
    "fp32": (dict(model=dict(dtype=torch.float32)), ["torch.float32 query"]),
    "over-128k": (dict(model=dict(max_model_len=2**17 + 1)), ["max_model_len 131073"]),
    "gfx90a": (dict(mi3xx=False), ["a GPU other than gfx942/gfx950"]),
    "gqa-9": (dict(num_heads=72), ["GQA 9"]),
    "head-256": (dict(head=256, num_heads=16), ["head size 256"]),
    "block-32": (dict(block=32), ["block size 32"]),
    "fp8-e5m2": (dict(kv_cache_dtype="fp8_e5m2"), ["fp8_e5m2 KV cache"]),
    "bf16-cache": (dict(kv_cache_dtype="auto"), ["auto KV cache"]),
    "lbhnc": (dict(lbhnc=True), ["KV pages not dense"]),
    "scale": (dict(scale=256**-0.5), ["softmax scale 0.0625 != 1/sqrt(128)"]),
    "window": (dict(sliding_window=4096), ["sliding window"]),
    "alibi": (dict(alibi_slopes=[0.5] * 40), ["ALiBi"]),
    "soft-cap": (dict(logits_soft_cap=30.0), ["logits soft cap"]),
    "sinks": (dict(sinks=torch.zeros(40)), ["attention sinks"]),
    "encoder": (dict(attn_type="encoder_only"), ["not decoder self-attention"]),
}


@pytest.mark.parametrize(("case", "reasons"), RULE.values(), ids=RULE)
def test_the_rule(tmp_path, case, reasons):
    assert [r.split(" > ")[0] for r in rule(tmp_path, **case)] == reasons


STEPS = {  # 40 query heads a request, a cut of 480 query heads
    "above-cut": ([1] * 13, True),
    "at-cut": ([1] * 12, False),
    "prefill": ([1] * 12 + [2, 0], False),  # as many tokens as requests
    "padding-row": ([1] * 13 + [0], False),  # more requests than tokens
}


@pytest.mark.parametrize(("query_lens", "asm"), STEPS.values(), ids=STEPS)
def test_the_step_decision(query_lens, asm):
    step = common([1024] * len(query_lens), [[1]] * len(query_lens), query_lens)
    assert use_asm_decode(step, 40, 480) is asm
