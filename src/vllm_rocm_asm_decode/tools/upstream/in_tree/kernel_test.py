"""ROCM_ATTN's asm decode on an AMD gfx942/gfx950 GPU with AITER: ``pa_fwd_asm``
(ultra precision) reading vLLM's own fp8 KV cache through ``RocmAttentionImpl.forward``,
against the HIP decode and an fp32 reference; CUDA-graph capture and replay; block ids
past 65536. Skipped, with the reason, everywhere else.
"""

import math
from importlib.util import find_spec
from types import SimpleNamespace

import pytest
import torch
from vllm.platforms import current_platform
from vllm.v1.attention.backends.registry import AttentionBackendEnum
from vllm.v1.attention.backends.rocm_attn import RocmAttentionMetadata

from vllm_rocm_asm_decode.aiter_version import BLOCK_ID_LIMIT
from vllm_rocm_asm_decode.asm_path import AsmBindings, AsmDecodeImplMixin
from vllm_rocm_asm_decode.eligibility import rejection_reasons
from vllm_rocm_asm_decode.kernel import current_arch, load_asm_kernel

#: Where the tensors live: the GPU (the CPU runs use AITER's contract model).
DEVICE = "cuda"
HEAD_SIZE = 128
BLOCK_SIZE = 16
#: Error bounds vs fp32 on an fp8 cache: HIP max 0.0072; asm at high_precision=2 max
#: 0.026 and mean 0.00078 (MI355X), with headroom for bf16/fp16 output rounding.
HIP_MAX = 0.0072 * 2
ASM_MAX, ASM_MEAN = 0.026 * 1.5, 0.00078 * 2
LAYOUTS = [(40, 8), (32, 8), (64, 8), (32, 4)]
CONTEXTS = [1, 15, 16, 17, 255, 1000, 4000]


#: Per-tensor KV scales of the layer (not 1, so a table of the wrong scale fails).
K_SCALE, V_SCALE = 0.5, 2.0


def _skip_reason() -> str | None:
    """Why this machine cannot run these tests (checked without importing AITER)."""
    if not current_platform.is_rocm() or not torch.cuda.is_available():
        return "needs an AMD GPU with ROCm"
    arch = current_arch()
    if arch not in ("gfx942", "gfx950"):
        return f"the asm decode kernels exist for gfx942/gfx950, not {arch or '?'}"
    if find_spec("aiter") is None:
        return "AITER is not installed"
    return None


_SKIP = _skip_reason()
pytestmark = pytest.mark.skipif(_SKIP is not None, reason=_SKIP or "")


@pytest.fixture(scope="module", autouse=True)
def _asm_kernel():
    kernel, why_not = load_asm_kernel(current_arch())
    if kernel is None:
        pytest.skip(f"the asm kernel cannot be used: {why_not}")


def make_impl(num_heads: int, num_kv_heads: int):
    """ROCM_ATTN's impl as vLLM selects it, for an fp8 cache of 16-token blocks."""
    backend = AttentionBackendEnum.ROCM_ATTN.get_class()
    impl = backend.get_impl_cls()(
        num_heads, HEAD_SIZE, HEAD_SIZE**-0.5, num_kv_heads, None, None, "fp8"
    )
    assert isinstance(impl, AsmDecodeImplMixin), "ROCM_ATTN has no asm decode"
    return impl


def make_layer(k_scale: float, v_scale: float) -> SimpleNamespace:
    """What ``forward`` and the cache writer read of an ``Attention`` layer."""
    scale = lambda x: torch.tensor(x, dtype=torch.float32, device=DEVICE)  # noqa: E731
    return SimpleNamespace(
        layer_name="model.layers.0.self_attn.attn",
        _k_scale=scale(k_scale),
        _v_scale=scale(v_scale),
        _k_scale_float=k_scale,
        _v_scale_float=v_scale,
        _q_scale_float=1.0,
    )


def make_kv_cache(num_blocks: int, num_kv_heads: int) -> torch.Tensor:
    """vLLM's ROCM_ATTN cache under LHBNC: the K and V groups each span every block;
    the view a layer is bound to is ``[num_blocks, 2, block_size, kv_heads * head]``."""
    groups = torch.zeros(
        2,
        num_blocks,
        BLOCK_SIZE,
        num_kv_heads * HEAD_SIZE,
        dtype=torch.uint8,
        device=DEVICE,
    )
    return groups.transpose(0, 1)


def fill(impl, layer, kv_cache, seq_lens, blocks, dtype, seed):
    """Random K/V for every token of every sequence, written by vLLM's cache writer;
    returns each sequence's K and V as the fp8 cache holds them, in fp32."""
    gen = torch.Generator().manual_seed(seed)
    contexts = []
    for seq_len, pages in zip(seq_lens, blocks, strict=True):
        k = torch.randn(seq_len, impl.num_kv_heads, HEAD_SIZE, generator=gen)
        v = torch.randn(seq_len, impl.num_kv_heads, HEAD_SIZE, generator=gen)
        pos = torch.arange(seq_len)
        slots = torch.tensor(pages)[pos // BLOCK_SIZE] * BLOCK_SIZE + pos % BLOCK_SIZE
        k, v = k.to(dtype), v.to(dtype)
        impl.do_kv_cache_update(
            layer, k.to(DEVICE), v.to(DEVICE), kv_cache, slots.to(DEVICE)
        )
        fp8 = current_platform.fp8_dtype()
        ks, vs = layer._k_scale_float, layer._v_scale_float
        contexts.append(
            (
                (k.float() / ks).to(fp8).float() * ks,
                (v.float() / vs).to(fp8).float() * vs,
            )
        )
    return contexts


def reference(query, contexts, scale):
    """fp32 attention of each sequence's one query token over its whole context."""
    rows = []
    for q, (k, v) in zip(query.float().cpu(), contexts, strict=True):
        group = q.shape[0] // k.shape[1]
        kk = k.repeat_interleave(group, dim=1)
        vv = v.repeat_interleave(group, dim=1)
        probs = torch.softmax(torch.einsum("hd,thd->ht", q, kk) * scale, dim=-1)
        rows.append(torch.einsum("ht,thd->hd", probs, vv))
    return torch.stack(rows)


def step(seq_lens, blocks, bindings: AsmBindings | None):
    """A pure-decode step's metadata: asm with ``bindings``, the HIP decode without."""
    width = max(len(p) for p in blocks) + 1
    table = torch.zeros(len(blocks), width, dtype=torch.int32)
    for i, pages in enumerate(blocks):
        table[i, : len(pages)] = torch.tensor(pages, dtype=torch.int32)
    n = len(seq_lens)
    metadata = RocmAttentionMetadata(
        num_actual_tokens=n,
        max_query_len=1,
        query_start_loc=torch.arange(n + 1, dtype=torch.int32, device=DEVICE),
        max_seq_len=max(seq_lens),
        seq_lens=torch.tensor(seq_lens, dtype=torch.int32, device=DEVICE),
        block_table=table.to(DEVICE),
        slot_mapping=torch.full((n,), -1, dtype=torch.long, device=DEVICE),
    )
    metadata.use_asm_decode = bindings is not None
    metadata.asm_split = None
    metadata.asm_bindings = bindings
    return metadata


def setup(heads, kvh, seq_lens, dtype, seed, num_blocks=None, blocks=None):
    impl = make_impl(heads, kvh)
    layer = make_layer(K_SCALE, V_SCALE)
    counts = [math.ceil(n / BLOCK_SIZE) for n in seq_lens]
    if blocks is None:
        gen = torch.Generator().manual_seed(seed)
        num_blocks = num_blocks or sum(counts) + 1
        free = (torch.randperm(num_blocks - 1, generator=gen) + 1).tolist()
        blocks = [
            free[sum(counts[:i]) : sum(counts[: i + 1])] for i in range(len(counts))
        ]
    assert num_blocks is not None
    kv_cache = make_kv_cache(num_blocks, kvh)
    contexts = fill(impl, layer, kv_cache, seq_lens, blocks, dtype, seed)
    kernel, why_not = load_asm_kernel(current_arch(), True)
    assert kernel is not None, why_not
    facts = impl.layer_facts(kv_cache, dtype, 40960)
    assert rejection_reasons(facts, kernel.table, kernel.aiter) == []
    binding = impl.make_binding(layer, kv_cache, kernel, dtype)
    bindings = AsmBindings({layer.layer_name: binding})
    gen = torch.Generator().manual_seed(seed + 1000)
    query = torch.randn(len(seq_lens), heads, HEAD_SIZE, generator=gen).to(
        DEVICE, dtype
    )
    return impl, layer, kv_cache, contexts, blocks, bindings, query


def run(impl, layer, kv_cache, query, metadata):
    out = torch.zeros_like(query)
    new = torch.zeros(query.shape[0], impl.num_kv_heads, HEAD_SIZE, dtype=query.dtype)
    new = new.to(DEVICE)
    impl.forward(layer, query, new, new, kv_cache, metadata, out)
    return out


def errors(out, ref):
    diff = (out.float().cpu() - ref).abs()
    return float(diff.max()), float(diff.mean())


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16], ids=["bf16", "fp16"])
@pytest.mark.parametrize(
    ("heads", "kvh"), LAYOUTS, ids=[f"{h}-{k}" for h, k in LAYOUTS]
)
def test_asm_decode_matches_fp32_and_the_hip_decode(heads, kvh, dtype, seed=0):
    seq_lens = [CONTEXTS[i % len(CONTEXTS)] for i in range(2 * len(CONTEXTS))]
    impl, layer, kv_cache, contexts, blocks, bindings, query = setup(
        heads, kvh, seq_lens, dtype, seed
    )
    ref = reference(query, contexts, impl.scale)
    asm = run(impl, layer, kv_cache, query, step(seq_lens, blocks, bindings))
    hip = run(impl, layer, kv_cache, query, step(seq_lens, blocks, None))
    asm_max, asm_mean = errors(asm, ref)
    assert asm_max <= ASM_MAX and asm_mean <= ASM_MEAN, (asm_max, asm_mean)
    assert errors(hip, ref)[0] <= HIP_MAX
    assert not torch.equal(asm, hip), "the asm step ran the HIP decode"


def test_a_layer_whose_scales_changed_runs_the_hip_decode(seed=1):
    seq_lens = [17, 255, 1000]
    impl, layer, kv_cache, _, blocks, bindings, query = setup(
        40, 8, seq_lens, torch.bfloat16, seed
    )
    hip = run(impl, layer, kv_cache, query, step(seq_lens, blocks, None))
    layer._k_scale_float = K_SCALE / 2  # a scale reload after the binding was made
    out = run(impl, layer, kv_cache, query, step(seq_lens, blocks, bindings))
    assert bindings.stale and torch.equal(out, hip)


def test_cuda_graph_capture_and_replay(seed=2):
    seq_lens = [1000, 17, 4000, 1]
    impl, layer, kv_cache, _, blocks, bindings, query = setup(
        40, 8, seq_lens, torch.bfloat16, seed
    )
    metadata = step(seq_lens, blocks, bindings)
    eager = run(impl, layer, kv_cache, query, metadata)
    out = torch.zeros_like(query)
    new = torch.zeros(len(seq_lens), 8, HEAD_SIZE, dtype=query.dtype, device=DEVICE)
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):
        impl.forward(layer, query, new, new, kv_cache, metadata, out)  # warm up
    torch.cuda.current_stream().wait_stream(stream)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        impl.forward(layer, query, new, new, kv_cache, metadata, out)
    out.zero_()
    graph.replay()
    torch.accelerator.synchronize()
    assert torch.equal(out, eager)


def test_block_ids_past_65536(seed=3):
    """Blocks 65537, 67000, 131077 and 262145: each sits beside the block an AITER that
    misreads high ids would read instead (1, 1464, 5, 1)."""
    kernel, _ = load_asm_kernel(current_arch())
    assert kernel is not None
    if not kernel.aiter.reads_high_block_ids:
        pytest.skip(
            f"AITER {kernel.aiter.version} misreads block ids >= {BLOCK_ID_LIMIT}; "
            "the backend keeps such caches on the HIP decode"
        )
    blocks = [[65537], [67000], [131077], [262145]]
    seq_lens = [16] * 4
    impl, layer, kv_cache, contexts, blocks, bindings, query = setup(
        40, 8, seq_lens, torch.bfloat16, seed, num_blocks=262146, blocks=blocks
    )
    ref = reference(query, contexts, impl.scale)
    asm = run(impl, layer, kv_cache, query, step(seq_lens, blocks, bindings))
    assert errors(asm, ref)[0] <= ASM_MAX
