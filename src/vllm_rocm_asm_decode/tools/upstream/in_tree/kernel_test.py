"""ROCM_ATTN's asm decode: AITER's pa_fwd_asm (high_precision=2) on ROCM_ATTN's own fp8
KV cache, through the metadata builder and forward, against fp32 and the HIP decode.
The kernel tests need a gfx942/gfx950 GPU with AITER; the rule's tests run anywhere."""

import json
from importlib.util import find_spec

import pytest
import torch
from torch.nn.utils.rnn import pad_sequence

from vllm import config as cfg
from vllm._aiter_ops import rocm_aiter_ops
from vllm.model_executor.layers.attention import Attention
from vllm.model_executor.layers.quantization.fp8 import Fp8Config
from vllm.model_executor.model_loader.reload import record_metadata_for_reloading
from vllm.model_executor.model_loader.reload.inplace import reload_weights
from vllm.model_executor.model_loader.utils import process_weights_after_loading
from vllm.platforms import current_platform
from vllm.v1.attention.backend import AttentionType, CommonAttentionMetadata
from vllm.v1.attention.backends.registry import AttentionBackendEnum
from vllm.v1.attention.backends.rocm_attn import RocmAttentionImpl
from vllm.v1.attention.ops.paged_attn import PagedAttention
from vllm_rocm_asm_decode.core import asm_decode_rejections, use_asm_decode

DEVICE, HEAD, BLOCK = "cuda", 128, 16
CONTEXTS = [1, 15, 16, 17, 255, 1000, 4000]
# Against fp32 on an fp8 cache (MI355X, with headroom): HIP max 0.0072; asm at
# high_precision=2 max 0.026, mean 0.00078.
HIP_MAX, ASM_MAX, ASM_MEAN = 0.0144, 0.039, 0.0016


def _has_asm() -> bool:
    if not current_platform.is_rocm() or not torch.accelerator.is_available():
        return False
    from vllm.platforms.rocm import on_mi3xx

    return on_mi3xx() and find_spec("aiter") is not None


requires_asm = pytest.mark.skipif(not _has_asm(), reason="needs gfx942/gfx950, AITER")


@pytest.fixture(autouse=True)
def _aiter_on():
    """The asm decode is ROCM_ATTN's with AITER on (VLLM_ROCM_USE_AITER=1)."""
    with pytest.MonkeyPatch.context() as env:
        env.setenv("VLLM_ROCM_USE_AITER", "1")
        rocm_aiter_ops.refresh_env_variables()
        yield
    rocm_aiter_ops.refresh_env_variables()


class Model(torch.nn.Module):
    """One ROCM_ATTN layer of an fp8 checkpoint (its KV scales loaded, and reloaded, by
    vLLM's loader), a random fp8 KV cache bound as vLLM binds it, and its builder."""

    def __init__(self, path, heads, kvh, blocks, dtype=torch.bfloat16, scales=(0.5, 2)):
        super().__init__()
        llama = {"architectures": ["LlamaForCausalLM"], "model_type": "llama"}
        sizes = dict(hidden_size=heads * HEAD, num_attention_heads=heads, head_dim=HEAD)
        sizes |= dict(num_key_value_heads=kvh, num_hidden_layers=1, vocab_size=1000)
        (path / "config.json").write_text(json.dumps(llama | sizes))
        model = cfg.ModelConfig(str(path), dtype=dtype, skip_tokenizer_init=True)
        cache = cfg.CacheConfig(cache_dtype="fp8", block_size=BLOCK)
        dev = torch.device(DEVICE)
        self.config = cfg.VllmConfig(model, cache, device_config=cfg.DeviceConfig(dev))
        with cfg.set_current_vllm_config(self.config):
            self.attn = Attention(
                heads, HEAD, HEAD**-0.5, kvh, cache_config=cache,
                quant_config=Fp8Config(), prefix="model.layers.0.self_attn.attn",
            )  # fmt: skip
        record_metadata_for_reloading(self)
        self.load_weights(self.weights(scales))
        process_weights_after_loading(self, self.config.model_config, dev)
        self.to(dev)
        # fp8 codes of either sign up to 2.0 (no NaN code of e4m3fn or e4m3fnuz).
        shape = (2, blocks, BLOCK, kvh * HEAD)
        codes = torch.randint(1, 0x41, shape, dtype=torch.uint8, device=dev)
        codes |= torch.randint(0, 2, shape, dtype=torch.uint8, device=dev) << 7
        self.attn.kv_cache = codes.transpose(0, 1)
        backend = AttentionBackendEnum.ROCM_ATTN.get_class()
        spec = backend.customize_spec(self.attn.get_kv_cache_spec(self.config))
        builder = backend.get_builder_cls()
        self.builder = builder(spec, [self.attn.layer_name], self.config, dev)

    def weights(self, scales):
        k, v = scales
        return [("attn.k_scale", torch.tensor(k)), ("attn.v_scale", torch.tensor(v))]

    def load_weights(self, weights):
        for name, tensor in weights:
            self.get_parameter(name).weight_loader(self.get_parameter(name), tensor)
        return {name for name, _ in weights}

    def run(self, query, meta, out=None):
        out = torch.zeros_like(query) if out is None else out
        kv = query[:, : self.attn.num_kv_heads]  # this step's K/V: not written
        self.attn.impl.forward(self.attn, query, kv, kv, self.attn.kv_cache, meta, out)
        return out

    def reference(self, query, step):
        """fp32 attention over the cache as vLLM lays it out, at the layer's scales."""
        impl, fp8, rows = self.attn.impl, current_platform.fp8_dtype(), []
        kvh, group = impl.num_kv_heads, impl.num_heads // impl.num_kv_heads
        k, v = PagedAttention.split_kv_cache(
            self.attn.kv_cache.transpose(0, 1), kvh, HEAD
        )
        for i, q in enumerate(query.float().cpu()):
            n, pages = int(step.seq_lens_cpu_upper_bound[i]), step.block_table_tensor[i]
            pages = pages[: -(-n // BLOCK)].cpu()
            kk = k.view(fp8)[pages].float().cpu().permute(0, 3, 1, 2, 4).flatten(3)
            vv = v.view(fp8)[pages].float().cpu().permute(0, 3, 1, 2)
            kk = kk.reshape(-1, kvh, HEAD)[:n] * self.attn._k_scale_float
            vv = vv.reshape(-1, kvh, HEAD)[:n] * self.attn._v_scale_float
            s = torch.einsum("hd,thd->ht", q, kk.repeat_interleave(group, 1))
            rows.append(torch.einsum("ht,thd->hd", (s * HEAD**-0.5).softmax(-1),
                                     vv.repeat_interleave(group, 1)))  # fmt: skip
        return torch.stack(rows)


def common(seq_lens, pages, query_lens=None, device=None):
    """A step's CommonAttentionMetadata, as vLLM's runner makes it."""
    query_lens, device = query_lens or [1] * len(seq_lens), device or DEVICE
    table = pad_sequence([torch.tensor(p, dtype=torch.int32) for p in pages], True)
    start = torch.tensor([0, *query_lens]).cumsum(0).to(torch.int32)
    lens = torch.tensor(seq_lens, dtype=torch.int32)
    return CommonAttentionMetadata(
        query_start_loc=start.to(device),
        query_start_loc_cpu=start,
        seq_lens=lens.to(device),
        seq_lens_cpu_upper_bound=lens,
        num_reqs=len(seq_lens),
        num_actual_tokens=sum(query_lens),
        max_query_len=max(query_lens),
        max_seq_len=max(seq_lens),
        block_table_tensor=table.to(device),
        slot_mapping=torch.full((sum(query_lens),), -1, device=device),
    )


def decode(tmp_path, heads=40, kvh=8, **kw):
    """A model, and a decode step just above the cut on distinct random pages."""
    n = 2 * current_platform.num_compute_units() // heads + 1
    seq_lens = [CONTEXTS[i % len(CONTEXTS)] for i in range(n)]
    free = (torch.randperm(sum(-(-s // BLOCK) for s in seq_lens)) + 1).tolist()
    pages = [[free.pop() for _ in range(-(-s // BLOCK))] for s in seq_lens]
    model = Model(tmp_path, heads, kvh, sum(map(len, pages)) + 1, **kw)
    query = torch.randn(n, heads, HEAD).to(DEVICE, model.config.model_config.dtype)
    return model, seq_lens, pages, query


def check(model, step, query):
    """asm within its bounds of fp32, HIP within its own, and not the same kernel."""
    metadata = model.builder.build(0, step)
    assert metadata.use_asm_decode
    ref = model.reference(query, step)
    asm = model.run(query, metadata).float().cpu()
    torch.testing.assert_close(asm, ref, atol=ASM_MAX, rtol=0)
    assert (asm - ref).abs().mean() <= ASM_MEAN
    metadata.use_asm_decode = False
    hip = model.run(query, metadata).float().cpu()
    torch.testing.assert_close(hip, ref, atol=HIP_MAX, rtol=0)
    if DEVICE == "cuda":  # two kernels, two roundings (a CPU run may round alike)
        assert not torch.equal(asm, hip), "the asm step ran the HIP decode"


@requires_asm
@pytest.mark.parametrize("gqa", range(1, 9))
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16], ids=["bf16", "fp16"])
def test_every_admitted_gqa_ratio(tmp_path, gqa, dtype):
    """At K/V scales 0.5/2: a swapped or missing scale is off by 4x."""
    model, seq_lens, pages, query = decode(tmp_path, 8 * gqa, 8, dtype=dtype)
    check(model, common(seq_lens, pages), query)


@requires_asm
def test_padded_rows_leave_the_real_rows_alone(tmp_path):
    """vLLM pads a FULL graph's batch with rows of length 0 on the null block."""
    model, seq_lens, pages, query = decode(tmp_path)
    real = model.run(query, model.builder.build(0, common(seq_lens, pages)))
    step = common(seq_lens + [0] * 8, pages + [[]] * 8)
    out = model.run(torch.cat([query, query[:8]]), model.builder.build(0, step))
    assert torch.equal(out[: len(query)], real) and out.isfinite().all()


@requires_asm
def test_pages_over_4_gib_apart_read_as_adjacent_ones(tmp_path):
    """AITER's own test (test_pa_block_id_truncation.py) reads one page per sequence."""
    model = Model(tmp_path, 64, 8, 2**32 // (8 * HEAD * BLOCK) + 2)
    end = model.attn.kv_cache.shape[0] - 1
    far = [page for i in range(16) for page in (1 + i, end - i)]
    near = list(range(17, 49))
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
    model, seq_lens, pages, query = decode(tmp_path, scales=(1, 1))
    step = common(seq_lens, pages)
    metadata = model.builder.build_for_cudagraph_capture(step)
    assert metadata.use_asm_decode
    metadata.seq_lens.copy_(step.seq_lens_cpu_upper_bound)  # the capture set them to 1
    out, graph = torch.zeros_like(query), torch.cuda.CUDAGraph()
    model.run(query, metadata, out)  # warm up
    with torch.cuda.graph(graph):
        model.run(query, metadata, out)
    for scales in ((1, 0.5), (0.25, 4)):
        reload_weights(model.config, model, model.weights(scales), None, True)
        model.builder.build(0, step)
        graph.replay()
        ref = model.reference(query, step)
        torch.testing.assert_close(out.float().cpu(), ref, atol=ASM_MAX, rtol=0)


def rule_case(heads=40, kvh=8, head=HEAD, block=BLOCK, cache="fp8", lbhnc=False, **kw):
    """vLLM's impl and its bound KV cache view (meta tensors: shapes and strides)."""
    args = dict(scale=HEAD**-0.5, alibi_slopes=None, sliding_window=None) | kw
    impl = RocmAttentionImpl(
        heads, head, num_kv_heads=kvh, kv_cache_dtype=cache, **args
    )
    groups = torch.empty(2, 4, block, kvh * head, dtype=torch.uint8, device="meta")
    return impl, (groups.view(4, 2, block, -1) if lbhnc else groups.transpose(0, 1))


REFUSED = {
    "gqa-9": (dict(heads=72), "GQA 9"),
    "head-256": (dict(head=256, heads=16), "head size 256"),
    "block-32": (dict(block=32), "block size 32"),
    "fp8-e5m2": (dict(cache="fp8_e5m2"), "fp8_e5m2 KV cache"),
    "bf16-cache": (dict(cache="auto"), "auto KV cache"),
    "lbhnc": (dict(lbhnc=True), "KV pages not dense"),
    "scale": (dict(scale=256**-0.5), "softmax scale 0.0625 != 1/sqrt(128)"),
    "window": (dict(sliding_window=4096), "sliding window"),
    "alibi": (dict(alibi_slopes=[0.5] * 40), "ALiBi"),
    "soft-cap": (dict(logits_soft_cap=30.0), "logits soft cap"),
    "sinks": (dict(sinks=torch.zeros(40)), "attention sinks"),
    "encoder": (
        dict(attn_type=AttentionType.ENCODER_ONLY),
        "not decoder self-attention",
    ),
}


@pytest.mark.parametrize(("case", "reason"), REFUSED.values(), ids=REFUSED)
def test_the_rule_refuses_what_the_kernel_cannot_serve(case, reason):
    assert asm_decode_rejections(*rule_case(**case), torch.bfloat16, True) == [reason]


def test_the_rule_admits_fp16_and_needs_gfx942_or_gfx950():
    assert asm_decode_rejections(*rule_case(), torch.float16, True) == []
    refused = asm_decode_rejections(*rule_case(), torch.float32, False)
    assert refused == ["a GPU other than gfx942/gfx950", "torch.float32 query"]


STEPS = {
    "above-cut": ([1024] * 13, None, True),  # 13 x 40 = 520 query heads > 512
    "at-cut": ([1024] * 12, None, False),
    "prefill": ([1024] * 13, [1] * 12 + [2], False),
    "padding-rows": ([1024] * 13, [1] * 12 + [0], False),  # more requests than tokens
}


@pytest.mark.parametrize(("seq_lens", "query_lens", "asm"), STEPS.values(), ids=STEPS)
def test_the_step_decision(seq_lens, query_lens, asm):
    step = common(seq_lens, [[1]] * len(seq_lens), query_lens, device="cpu")
    assert use_asm_decode(step, 40, 512) is asm
