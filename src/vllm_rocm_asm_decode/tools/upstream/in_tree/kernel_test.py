"""ROCM_ATTN's asm decode: AITER's pa_fwd_asm (high_precision=2) on ROCM_ATTN's own fp8
KV cache, through the metadata builder and forward, against the HIP decode. The kernel
tests need AITER >= 0.1.17 on a gfx942/gfx950 GPU; the rest run anywhere."""

import json
from dataclasses import replace

import pytest
import torch
from packaging.version import Version
from torch.nn.utils.rnn import pad_sequence

from vllm import config as cfg
from vllm._aiter_ops import is_aiter_found_and_supported, rocm_aiter_ops
from vllm.config import CUDAGraphMode
from vllm.model_executor.layers.attention import Attention
from vllm.model_executor.layers.quantization.fp8 import Fp8Config
from vllm.model_executor.model_loader.reload import record_metadata_for_reloading
from vllm.model_executor.model_loader.reload.inplace import reload_weights
from vllm.model_executor.model_loader.utils import process_weights_after_loading
from vllm.platforms import current_platform
from vllm.utils.math_utils import cdiv
from vllm.v1.attention.backend import CommonAttentionMetadata
from vllm.v1.attention.backends.registry import AttentionBackendEnum
from vllm.v1.attention.backends.rocm_attn import RocmAttentionImpl
from vllm_rocm_asm_decode.core import asm_decode_rejections, use_asm_decode

DEVICE, HEAD, BLOCK, PAD = "cuda", 128, 16, 8
CONTEXTS = [1, 15, 16, 17, 255, 1000, 4000]
# Against fp32 on MI355X: asm (high_precision=2) max 0.026, mean 0.00078; HIP max
# 0.0072, mean 0.00018. asm against HIP: the sums, max x1.5 and mean x2 as headroom.
ASM_MAX, ASM_MEAN = 0.05, 0.002
try:  # AITER before 0.1.17 misreads block ids >= 65536: the decode keeps HIP
    from aiter._version import __version__

    ASM = is_aiter_found_and_supported() and Version(__version__) >= Version("0.1.17")
except ImportError:
    ASM = False
requires_asm = pytest.mark.skipif(
    not (ASM and torch.accelerator.is_available()),
    reason="needs AITER >= 0.1.17 on a gfx942/gfx950 GPU",
)


@pytest.fixture(autouse=True)
def _aiter_on(monkeypatch):  # the asm decode is ROCM_ATTN's with AITER on
    monkeypatch.setenv("VLLM_ROCM_USE_AITER", "1")
    rocm_aiter_ops.refresh_env_variables()
    yield
    monkeypatch.undo()
    rocm_aiter_ops.refresh_env_variables()


def llama(path, heads=40, kvh=8, **kw):
    """The ModelConfig of a one-layer Llama checkpoint."""
    sizes = dict(num_attention_heads=heads, num_key_value_heads=kvh, head_dim=HEAD)
    sizes |= dict(hidden_size=heads * HEAD, num_hidden_layers=1)
    sizes |= dict(architectures=["LlamaForCausalLM"], max_position_embeddings=2**20)
    (path / "config.json").write_text(json.dumps(sizes | dict(model_type="llama")))
    return cfg.ModelConfig(str(path), skip_tokenizer_init=True, **kw)


def kv_scales(*layers):  # each layer's (K, V) scales, as a checkpoint's weights
    names = [f"layers.{i}.{kv}_scale" for i in range(len(layers)) for kv in "kv"]
    return list(zip(names, map(torch.tensor, sum(layers, ())), strict=True))


class Model(torch.nn.Module):
    """ROCM_ATTN layers of an fp8 checkpoint (their K/V scales loaded, and reloaded, by
    vLLM's loader) on one random fp8 KV cache bound as vLLM binds it, and a builder."""

    def __init__(
        self, path, heads, kvh, blocks, dtype=torch.bfloat16, scales=((0.5, 2),)
    ):
        super().__init__()
        model, dev = llama(path, heads, kvh, dtype=dtype, max_model_len=4096), DEVICE
        cache = cfg.CacheConfig(cache_dtype="fp8", block_size=BLOCK)
        self.config = cfg.VllmConfig(model, cache, device_config=cfg.DeviceConfig(dev))
        fp8 = dict(cache_config=cache, quant_config=Fp8Config())
        with cfg.set_current_vllm_config(self.config):
            self.layers = torch.nn.ModuleList(
                Attention(heads, HEAD, HEAD**-0.5, kvh, **fp8, prefix=f"layers.{i}")
                for i in range(len(scales))
            )
        record_metadata_for_reloading(self)
        self.load_weights(kv_scales(*scales))
        process_weights_after_loading(self, model, torch.device(dev))
        # fp8 codes of either sign up to 2.0 (no NaN code of e4m3fn or e4m3fnuz).
        shape = (2, blocks, BLOCK, kvh * HEAD)  # on the GPU (8.6 GB for 4 GiB apart)
        codes = torch.randint(1, 65, shape, dtype=torch.uint8, device=dev)
        codes |= torch.randint_like(codes, 0, 2) << 7
        self.to(dev)
        for layer in self.layers:
            layer.kv_cache = codes.transpose(0, 1)  # vLLM's [blocks, 2, ...] view
        backend = AttentionBackendEnum.ROCM_ATTN.get_class()
        spec = backend.customize_spec(self.attn.get_kv_cache_spec(self.config))
        names, dev = [x.layer_name for x in self.layers], torch.device(dev)
        self.builder = backend.get_builder_cls()(spec, names, self.config, dev)

    @property
    def attn(self):
        return self.layers[0]

    def load_weights(self, weights):
        for name, tensor in weights:
            self.get_parameter(name).weight_loader(self.get_parameter(name), tensor)
        return {name for name, _ in weights}

    def run(self, query, meta, out=None):
        out = torch.zeros_like(query) if out is None else out
        kv = query[:, : self.attn.num_kv_heads]  # this step's K/V: not written
        self.attn.impl.forward(self.attn, query, kv, kv, self.attn.kv_cache, meta, out)
        return out

    def hip(self, query, meta):  # the HIP decode's answer for the rows with a context
        return self.run(query, replace(meta, use_asm_decode=False))[:-PAD].float()


def common(seq_lens, pages, query_lens=None, device=None):
    """A step's CommonAttentionMetadata, as vLLM's runner makes it."""
    query_lens, device = query_lens or [1] * len(seq_lens), device or DEVICE
    start = torch.tensor([0, *query_lens]).cumsum(0).to(torch.int32)
    lens = torch.tensor(seq_lens, dtype=torch.int32)
    table = pad_sequence([torch.tensor(p, dtype=torch.int32) for p in pages], True)
    return CommonAttentionMetadata(
        query_start_loc=start.to(device, copy=True),  # a capture zeroes it
        query_start_loc_cpu=start,
        seq_lens=lens.to(device, copy=True),  # a capture fills it with 1
        seq_lens_cpu_upper_bound=lens,
        num_reqs=len(seq_lens),
        num_actual_tokens=sum(query_lens),
        max_query_len=max(query_lens),
        max_seq_len=max(seq_lens),
        block_table_tensor=table.to(device),
        slot_mapping=torch.full((sum(query_lens),), -1, device=device),
    )


def decode(tmp_path, heads=40, kvh=8, **kw):
    """A model, and a decode step just above the cut on distinct random pages, then
    PAD rows of vLLM's FULL-graph padding (length 0, on the null block)."""
    n = 2 * current_platform.num_compute_units() // heads + 1
    seq_lens = [CONTEXTS[i % len(CONTEXTS)] for i in range(n)] + [0] * PAD
    free = (torch.randperm(sum(cdiv(s, BLOCK) for s in seq_lens)) + 1).tolist()
    model = Model(tmp_path, heads, kvh, len(free) + 1, **kw)
    pages = [[free.pop() for _ in range(cdiv(s, BLOCK))] for s in seq_lens]
    dtype = model.config.model_config.dtype
    query = torch.randn(n + PAD, heads, HEAD, dtype=dtype, device=DEVICE)
    return model, common(seq_lens, pages), query


@requires_asm
@pytest.mark.parametrize("gqa", range(1, 9))
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16], ids=["bf16", "fp16"])
def test_every_admitted_gqa_ratio(tmp_path, monkeypatch, gqa, dtype):
    """One ultra-precision call within its bound of the HIP decode at K/V scales 0.5/2
    (a swapped or missing scale is off by 4x), finite on the padding rows."""
    import aiter

    model, step, query = decode(tmp_path, 8 * gqa, 8, dtype=dtype)
    metadata, pa, calls = model.builder.build(0, step), aiter.pa_fwd_asm, []
    assert metadata.use_asm_decode
    monkeypatch.setattr(aiter, "pa_fwd_asm", lambda **kw: calls.append(kw) or pa(**kw))
    asm, hip = model.run(query, metadata).float(), model.hip(query, metadata)
    assert [kw["high_precision"] for kw in calls] == [2] and asm.isfinite().all()
    torch.testing.assert_close(asm[:-PAD], hip, atol=ASM_MAX, rtol=0)
    assert (asm[:-PAD] - hip).abs().mean() <= ASM_MEAN
    if DEVICE == "cuda":  # two kernels round apart
        assert not torch.equal(asm[:-PAD], hip), "the asm step ran the HIP decode"


@requires_asm
def test_pages_over_4_gib_apart_read_as_adjacent_ones(tmp_path):
    """AITER's own test (test_pa_block_id_truncation.py) reads one page per sequence."""
    model = Model(tmp_path, 64, 8, 2**32 // (8 * HEAD * BLOCK) + 2)
    end = model.attn.kv_cache.shape[0] - 1
    far, near = [p for i in range(16) for p in (1 + i, end - i)], list(range(17, 49))
    for plane in model.attn.kv_cache.unbind(1):  # the same content on adjacent pages
        plane[near] = plane[far]
    n = 2 * (current_platform.num_compute_units() // 64 + 1)  # above the cut
    query = torch.randn(1, 64, HEAD).to(DEVICE, torch.bfloat16).expand(n, -1, -1)
    metadata = model.builder.build(0, common([512] * n, [far, near] * (n // 2)))
    assert metadata.use_asm_decode
    out = model.run(query.contiguous(), metadata)
    assert torch.equal(out[0], out[1])


@requires_asm
def test_a_captured_graph_replays_asm_and_follows_a_weight_reload(tmp_path):
    """Captured through build_for_cudagraph_capture, as vLLM's runner captures; vLLM's
    weight reload between replays (the next build refills the tables in place). K and
    V start equal and then differ: each has its own table."""
    model, step, query = decode(tmp_path, scales=[(1, 1)])
    metadata = model.builder.build_for_cudagraph_capture(step)
    assert metadata.use_asm_decode
    metadata.seq_lens.copy_(step.seq_lens_cpu_upper_bound)  # as vLLM's runner does
    step.query_start_loc.copy_(step.query_start_loc_cpu)
    out, graph = torch.zeros_like(query), torch.cuda.CUDAGraph()
    model.run(query, metadata, out)  # warm up
    with torch.cuda.graph(graph):
        model.run(query, metadata, out)
    for scales in ((1, 0.5), (0.25, 4)):
        reload_weights(model.config, model, kv_scales(scales), None, True)
        hip = model.hip(query, model.builder.build(0, step))
        graph.replay()
        torch.testing.assert_close(out[:-PAD].float(), hip, atol=ASM_MAX, rtol=0)


@requires_asm
def test_layers_at_one_scale_share_tables_and_a_fifth_table_keeps_hip(tmp_path):
    """One fp32 table per distinct K and V scale (K's apart from V's), at most four:
    the last layer would add a fifth and a sixth, so it keeps the HIP decode."""
    model, step, _ = decode(tmp_path, scales=[(1, 1), (1, 1), (0.5, 2), (0.25, 4)])
    tables = model.builder.build(0, step).asm_scales
    assert model.builder._asm_cut == 2 * current_platform.num_compute_units()
    (k0, v0), (k1, v1), (k2, v2) = (tables[x] for x in model.layers[:3])
    assert k0 is k1 and v0 is v1 and len({k0, v0, k2, v2}) == 4
    ratios = [(t / k0).unique().tolist() for t in (v0, k2, v2)]  # e4m3fnuz doubles
    assert k0.unique().numel() == 1 and ratios == [[1], [0.5], [2]]
    assert model.layers[3] not in tables


@requires_asm
@pytest.mark.parametrize("mode", ["NONE", "FULL_AND_PIECEWISE"])
def test_a_reload_that_parts_the_layers_of_a_table(tmp_path, mode):
    """Layers moving together refill their table in place. Then, eager, the layer that
    moves alone goes back to HIP (one warning); where FULL decode graphs replay the old
    table, build() stops rather than decode at a stale scale."""
    model, step, _ = decode(tmp_path, scales=[(1, 1), (1, 1)])
    model.config.compilation_config.cudagraph_mode = CUDAGraphMode[mode]
    k, v = model.builder.build(0, step).asm_scales[model.attn]
    reload_weights(model.config, model, kv_scales((2, 1), (2, 1)), None, True)
    assert len(model.builder.build(0, step).asm_scales) == 2 and (k / v).unique() == 2
    reload_weights(model.config, model, kv_scales((2, 1), (0.5, 1)), None, True)
    if mode == "NONE":
        assert list(model.builder.build(0, step).asm_scales) == [model.attn]
    else:
        with pytest.raises(RuntimeError, match=r"layers\.1 left their shared"):
            model.builder.build(0, step)


@requires_asm
def test_an_old_aiter_and_builders_built_on_rocm_attns_keep_hip(tmp_path, monkeypatch):
    import aiter._version

    model, step, _ = decode(tmp_path)
    builder = model.builder
    derived = type("Derived", (type(builder),), {})  # e.g. another backend's builder
    derived = derived(builder.kv_cache_spec, ["layers.0"], model.config, builder.device)
    assert not derived.build(0, step).use_asm_decode
    monkeypatch.setattr(aiter._version, "__version__", "0.1.16")
    assert not builder.build(0, step).use_asm_decode


def rule(path, head=HEAD, block=BLOCK, lbhnc=False, mi3xx=True, model=None, **kw):
    """The rule on vLLM's impl, a bound KV cache view (meta tensors) and ModelConfig."""
    kw = dict(num_heads=40, num_kv_heads=8, scale=HEAD**-0.5, kv_cache_dtype="fp8") | kw
    kw = dict(alibi_slopes=None, sliding_window=None) | kw
    impl = RocmAttentionImpl(head_size=head, **kw)
    pages = torch.empty(2, 4, block, impl.num_kv_heads * head, dtype=torch.uint8)
    kv_cache = pages.view(4, 2, block, -1) if lbhnc else pages.transpose(0, 1)
    model = llama(path, **dict(max_model_len=4096) | (model or {}))
    return asm_decode_rejections(impl, kv_cache.to("meta"), model, mi3xx)


RULE = {
    "bf16": ({}, []),
    "fp16": (dict(model=dict(dtype=torch.float16)), []),
    "fp8-e4m3": (dict(kv_cache_dtype="fp8_e4m3"), []),
    "fp32": (dict(model=dict(dtype=torch.float32)), ["torch.float32 query"]),
    "128k": (dict(model=dict(max_model_len=2**17)), []),
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
    step = common([1024] * len(query_lens), [[1]] * len(query_lens), query_lens, "cpu")
    assert use_asm_decode(step, 40, 480) is asm
