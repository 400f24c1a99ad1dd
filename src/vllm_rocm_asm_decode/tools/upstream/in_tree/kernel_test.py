"""ROCM_ATTN's asm decode: AITER's pa_fwd_asm (ultra precision) reading ROCM_ATTN's
own fp8 KV cache, through the real metadata builder and forward, against the HIP decode
and an fp32 reference. The kernel tests need a gfx942/gfx950 GPU with AITER; the
rule's tests run anywhere."""

import json
import math
from dataclasses import replace
from importlib.util import find_spec
from types import SimpleNamespace

import pytest
import torch

from vllm._aiter_ops import rocm_aiter_ops
from vllm.config import (
    CacheConfig,
    DeviceConfig,
    ModelConfig,
    VllmConfig,
    set_current_vllm_config,
)
from vllm.model_executor.layers.attention import Attention
from vllm.platforms import current_platform
from vllm.utils.platform_utils import num_compute_units
from vllm.utils.torch_utils import set_random_seed
from vllm.v1.attention.backend import CommonAttentionMetadata
from vllm.v1.attention.backends.registry import AttentionBackendEnum
from vllm.v1.attention.backends.rocm_attn import RocmAttentionImpl
from vllm_rocm_asm_decode.core import ASM_HEADS_PER_CU, asm_decode_rejections

#: Where the kernel tests' tensors live.
DEVICE = "cuda"
HEAD_SIZE = 128
BLOCK_SIZE = 16
LAYER = "model.layers.0.self_attn.attn"
#: Per-tensor KV scales (not 1, so that a table of the wrong scale fails).
K_SCALE, V_SCALE = 0.5, 2.0
#: Error bounds vs fp32 on an fp8 cache: HIP max 0.0072; asm at high_precision=2 max
#: 0.026 and mean 0.00078 (MI355X), with headroom for bf16/fp16 output rounding.
HIP_MAX = 0.0072 * 2
ASM_MAX, ASM_MEAN = 0.026 * 1.5, 0.00078 * 2
# The original change's layouts, then every other GQA ratio the rule admits (1-8).
LAYOUTS = [
    (40, 8),
    (32, 8),
    (64, 8),
    (32, 4),
    (32, 32),
    (16, 8),
    (24, 8),
    (48, 8),
    (56, 8),
]
CONTEXTS = [1, 15, 16, 17, 255, 1000, 4000]


def _skip_reason() -> str | None:
    """Why this machine cannot run the kernel tests (AITER is not imported)."""
    if not current_platform.is_rocm() or not torch.accelerator.is_available():
        return "needs an AMD GPU with ROCm"
    from vllm.platforms.rocm import on_mi3xx

    if not on_mi3xx():
        return "pa_fwd_asm's ultra-precision kernels exist on gfx942/gfx950 only"
    if find_spec("aiter") is None:
        return "needs AITER"
    return None


_SKIP = _skip_reason()
requires_asm = pytest.mark.skipif(_SKIP is not None, reason=_SKIP or "")


@pytest.fixture(autouse=True)
def aiter_attention_on(monkeypatch):
    """AITER's attention on, as deployments of the asm decode set it."""
    monkeypatch.setenv("VLLM_ROCM_USE_AITER", "1")
    monkeypatch.delenv("VLLM_ROCM_USE_AITER_MHA", raising=False)
    rocm_aiter_ops.refresh_env_variables()
    yield
    monkeypatch.undo()
    rocm_aiter_ops.refresh_env_variables()


def make_config(tmp_path, num_heads: int, num_kv_heads: int, dtype) -> VllmConfig:
    """A Llama-shaped model (config only, no weights) with an fp8 cache of 16-token
    blocks."""
    model_dir = tmp_path / "model"
    model_dir.mkdir(parents=True, exist_ok=True)
    config = {
        "architectures": ["LlamaForCausalLM"],
        "model_type": "llama",
        "hidden_size": num_heads * HEAD_SIZE,
        "head_dim": HEAD_SIZE,
        "num_attention_heads": num_heads,
        "num_key_value_heads": num_kv_heads,
        "num_hidden_layers": 1,
        "intermediate_size": 1024,
        "vocab_size": 1000,
        "max_position_embeddings": 8192,
        "rms_norm_eps": 1e-5,
    }
    (model_dir / "config.json").write_text(json.dumps(config))
    model_config = ModelConfig(
        model=str(model_dir), skip_tokenizer_init=True, dtype=dtype, max_model_len=8192
    )
    return VllmConfig(
        model_config=model_config,
        cache_config=CacheConfig(cache_dtype="fp8", block_size=BLOCK_SIZE),
        device_config=DeviceConfig(device=DEVICE),
    )


class Setup:
    """One ROCM_ATTN layer with a bound fp8 KV cache, and its metadata builder."""

    def __init__(self, tmp_path, num_heads, num_kv_heads, dtype, num_blocks):
        self.vllm_config = make_config(tmp_path, num_heads, num_kv_heads, dtype)
        with set_current_vllm_config(self.vllm_config):
            self.layer = Attention(
                num_heads=num_heads,
                head_size=HEAD_SIZE,
                scale=HEAD_SIZE**-0.5,
                num_kv_heads=num_kv_heads,
                cache_config=self.vllm_config.cache_config,
                prefix=LAYER,
            )
        self.layer.to(DEVICE)
        self.layer._k_scale.fill_(K_SCALE)
        self.layer._v_scale.fill_(V_SCALE)
        self.layer._k_scale_float, self.layer._v_scale_float = K_SCALE, V_SCALE
        # ROCM_ATTN's cache as vLLM binds it under LHBNC: a K group and a V group,
        # each spanning every block, seen as [num_blocks, 2, block_size, heads].
        groups = torch.zeros(
            2,
            num_blocks,
            BLOCK_SIZE,
            num_kv_heads * HEAD_SIZE,
            dtype=torch.uint8,
            device=DEVICE,
        )
        self.layer.kv_cache = groups.transpose(0, 1)
        backend = AttentionBackendEnum.ROCM_ATTN.get_class()
        spec = backend.customize_spec(self.layer.get_kv_cache_spec(self.vllm_config))
        self.builder = backend.get_builder_cls()(
            spec, [LAYER], self.vllm_config, torch.device(DEVICE)
        )
        self.impl = self.layer.impl
        self.dtype = dtype
        self.num_blocks = num_blocks

    def fill(self, seq_lens, pages):
        """Random K/V for every token, written by vLLM's cache writer; returns each
        sequence's K and V as the fp8 cache holds them, in fp32."""
        fp8 = current_platform.fp8_dtype()
        contexts = []
        for seq_len, blocks in zip(seq_lens, pages, strict=True):
            shape = (seq_len, self.impl.num_kv_heads, HEAD_SIZE)
            k = torch.randn(shape).to(self.dtype)
            v = torch.randn(shape).to(self.dtype)
            pos = torch.arange(seq_len)
            slots = torch.tensor(blocks, dtype=torch.long)[pos // BLOCK_SIZE]
            slots = slots * BLOCK_SIZE + pos % BLOCK_SIZE
            self.impl.do_kv_cache_update(
                self.layer,
                k.to(DEVICE),
                v.to(DEVICE),
                self.layer.kv_cache,
                slots.to(DEVICE),
            )
            k_fp8 = (k.float() / K_SCALE).to(fp8).float() * K_SCALE
            v_fp8 = (v.float() / V_SCALE).to(fp8).float() * V_SCALE
            contexts.append((k_fp8, v_fp8))
        return contexts

    def step(self, seq_lens, pages, query_lens=None):
        """A step's metadata from the builder (pure decode unless ``query_lens`` says
        otherwise; null-block rows for padding requests, which have length 0)."""
        n = len(seq_lens)
        query_lens = query_lens or [1] * n
        width = max(len(p) for p in pages) + 1
        table = torch.zeros(n, width, dtype=torch.int32)
        for i, blocks in enumerate(pages):
            table[i, : len(blocks)] = torch.tensor(blocks, dtype=torch.int32)
        query_start_loc = torch.tensor([0, *query_lens], dtype=torch.int32).cumsum(0)
        query_start_loc = query_start_loc.to(torch.int32)
        num_tokens = sum(query_lens)
        common = CommonAttentionMetadata(
            query_start_loc=query_start_loc.to(DEVICE),
            query_start_loc_cpu=query_start_loc,
            seq_lens=torch.tensor(seq_lens, dtype=torch.int32, device=DEVICE),
            num_reqs=n,
            num_actual_tokens=num_tokens,
            max_query_len=max(query_lens),
            max_seq_len=max(seq_lens),
            block_table_tensor=table.to(DEVICE),
            slot_mapping=torch.full((num_tokens,), -1, dtype=torch.long, device=DEVICE),
        )
        return self.builder.build(0, common)

    def forward(self, query, metadata, out=None):
        out = torch.zeros_like(query) if out is None else out
        new = torch.zeros(
            query.shape[0],
            self.impl.num_kv_heads,
            HEAD_SIZE,
            dtype=query.dtype,
            device=query.device,
        )
        self.impl.forward(
            self.layer, query, new, new, self.layer.kv_cache, metadata, out
        )
        return out


def random_pages(seq_lens, num_blocks):
    """Distinct random blocks for each sequence (block 0 is vLLM's null block)."""
    counts = [math.ceil(n / BLOCK_SIZE) for n in seq_lens]
    free = (torch.randperm(num_blocks - 1) + 1).tolist()
    starts = [sum(counts[:i]) for i in range(len(counts))]
    return [free[a : a + c] for a, c in zip(starts, counts, strict=True)]


def reference(query, contexts, scale):
    """fp32 attention of each sequence's query token over its whole context."""
    rows = []
    for q, (k, v) in zip(query.float().cpu(), contexts, strict=True):
        group = q.shape[0] // k.shape[1]
        kk = k.repeat_interleave(group, dim=1)
        vv = v.repeat_interleave(group, dim=1)
        probs = torch.softmax(torch.einsum("hd,thd->ht", q, kk) * scale, dim=-1)
        rows.append(torch.einsum("ht,thd->hd", probs, vv))
    return torch.stack(rows)


def above_the_cut(num_heads: int) -> int:
    """The fewest sequences whose query heads are above the builder's cut."""
    return ASM_HEADS_PER_CU * num_compute_units() // num_heads + 1


def decode_case(tmp_path, heads, kvh, dtype, seq_lens, num_blocks=None):
    counts = sum(math.ceil(n / BLOCK_SIZE) for n in seq_lens)
    setup = Setup(tmp_path, heads, kvh, dtype, num_blocks or counts + 1)
    pages = random_pages(seq_lens, setup.num_blocks)
    contexts = setup.fill(seq_lens, pages)
    query = torch.randn(len(seq_lens), heads, HEAD_SIZE).to(DEVICE, dtype)
    return setup, pages, contexts, query


@requires_asm
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16], ids=["bf16", "fp16"])
@pytest.mark.parametrize(
    ("heads", "kvh"), LAYOUTS, ids=[f"{h}-{k}" for h, k in LAYOUTS]
)
def test_asm_decode_matches_fp32_and_the_hip_decode(tmp_path, heads, kvh, dtype):
    set_random_seed(0)
    n = above_the_cut(heads)
    seq_lens = [CONTEXTS[i % len(CONTEXTS)] for i in range(n)]
    setup, pages, contexts, query = decode_case(tmp_path, heads, kvh, dtype, seq_lens)
    metadata = setup.step(seq_lens, pages)
    assert metadata.use_asm_decode
    ref = reference(query, contexts, setup.impl.scale)
    asm = setup.forward(query, metadata).float().cpu()
    hip = setup.forward(query, replace(metadata, use_asm_decode=False)).float().cpu()
    torch.testing.assert_close(asm, ref, atol=ASM_MAX, rtol=0)
    assert (asm - ref).abs().mean() <= ASM_MEAN
    torch.testing.assert_close(hip, ref, atol=HIP_MAX, rtol=0)
    assert not torch.equal(asm, hip), "the asm step ran the HIP decode"


@requires_asm
def test_the_builder_cuts_at_two_query_heads_per_compute_unit(tmp_path):
    set_random_seed(1)
    n = above_the_cut(40)
    seq_lens = [33] * n
    setup, pages, _, _ = decode_case(tmp_path, 40, 8, torch.bfloat16, seq_lens)
    assert setup.step(seq_lens, pages).use_asm_decode
    assert not setup.step(seq_lens[:-1], pages[:-1]).use_asm_decode
    # A step with a prefill (two query tokens) is not a pure decode.
    mixed = setup.step(seq_lens, pages, query_lens=[1] * (n - 1) + [2])
    assert not mixed.use_asm_decode


@requires_asm
def test_cuda_graph_padding_rows_are_finite_and_ignored(tmp_path):
    set_random_seed(2)
    n = above_the_cut(40)
    seq_lens = [CONTEXTS[i % len(CONTEXTS)] for i in range(n)]
    setup, pages, _, query = decode_case(tmp_path, 40, 8, torch.bfloat16, seq_lens)
    real = setup.forward(query, setup.step(seq_lens, pages))
    padded_query = torch.cat([query, torch.randn_like(query[:4])])
    padded = setup.step(seq_lens + [0] * 4, pages + [[]] * 4)
    assert padded.use_asm_decode
    out = setup.forward(padded_query, padded)
    assert torch.equal(out[:n], real)
    assert torch.isfinite(out[n:]).all()


@requires_asm
def test_cuda_graph_capture_and_replay(tmp_path):
    set_random_seed(3)
    n = above_the_cut(40)
    seq_lens = [CONTEXTS[i % len(CONTEXTS)] for i in range(n)]
    setup, pages, _, query = decode_case(tmp_path, 40, 8, torch.bfloat16, seq_lens)
    metadata = setup.step(seq_lens, pages)
    eager = setup.forward(query, metadata)
    out = torch.zeros_like(query)
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):
        setup.forward(query, metadata, out)  # warm up
    torch.cuda.current_stream().wait_stream(stream)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        setup.forward(query, metadata, out)
    out.zero_()
    graph.replay()
    torch.accelerator.synchronize()
    torch.testing.assert_close(out, eager, atol=0, rtol=0)


@requires_asm
def test_block_ids_past_65536(tmp_path):
    """Blocks 65537, 67000, 131077 and 262145, each beside the block an AITER that
    narrows block ids (before 0.1.17) would read instead."""
    set_random_seed(4)
    setup = Setup(tmp_path, 40, 8, torch.bfloat16, num_blocks=262146)
    high = [[65537], [67000], [131077], [262145]]
    contexts = setup.fill([16] * len(high), high)
    copies = math.ceil(above_the_cut(40) / len(high))
    pages, seq_lens = high * copies, [16] * len(high) * copies
    query = torch.randn(len(pages), 40, HEAD_SIZE).to(DEVICE, torch.bfloat16)
    metadata = setup.step(seq_lens, pages)
    assert metadata.use_asm_decode
    out = setup.forward(query, metadata).float().cpu()
    ref = reference(query, contexts * copies, setup.impl.scale)
    torch.testing.assert_close(out, ref, atol=ASM_MAX, rtol=0)


def rule_case(num_heads=40, num_kv_heads=8, head_size=128, block_size=16, cache="fp8"):
    """A ROCM_ATTN impl and a KV cache laid out as vLLM binds it (on the meta device:
    the rule reads shapes and strides only)."""
    impl = RocmAttentionImpl(
        num_heads, head_size, HEAD_SIZE**-0.5, num_kv_heads, None, None, cache
    )
    groups = torch.empty(
        2, 4, block_size, num_kv_heads * head_size, dtype=torch.uint8, device="meta"
    )
    return impl, groups.transpose(0, 1)


def model(dtype=torch.bfloat16, max_model_len=40960):
    """What the rule reads of the model config."""
    return SimpleNamespace(dtype=dtype, max_model_len=max_model_len)


def test_the_rule_takes_llama_and_qwen3_layers():
    impl, kv_cache = rule_case()
    assert asm_decode_rejections(impl, kv_cache, model(), "gfx950") == []
    assert asm_decode_rejections(impl, kv_cache, model(torch.float16), "gfx942") == []


@pytest.mark.parametrize(
    ("case", "reason"),
    [
        (dict(num_heads=64, num_kv_heads=4), "GQA 16"),
        (dict(head_size=64), "head size 64"),
        (dict(block_size=32), "block size 32"),
        (dict(cache="fp8_e5m2"), "fp8_e5m2"),
    ],
    ids=["gqa-16", "head-64", "block-32", "fp8-e5m2"],
)
def test_the_rule_refuses_what_the_kernel_cannot_serve(case, reason):
    impl, kv_cache = rule_case(**case)
    reasons = asm_decode_rejections(impl, kv_cache, model(), "gfx950")
    assert len(reasons) == 1 and reason in reasons[0]
