"""The asm decode's core: the kernel's hard facts, the per-layer rule, the per-step
decision and the call. Stage 1 of ``vllm-rocm-asm-decode upstream`` writes everything
below the imports into vLLM's ``rocm_attn.py`` as it stands here, so this module reads
as vLLM code: no plugin setting, no AITER version, no memory budget (those are the
plugin's guards, :mod:`.eligibility`, around it).

``rocm_aiter_ops`` is vLLM's (:mod:`.aiter_ops` hands the plugin vLLM's own class where
it passes ``high_precision`` on to AITER, else a subclass that does).
"""

import math
from typing import TYPE_CHECKING

import torch
from vllm.config import ModelConfig
from vllm.v1.attention.backend import AttentionType, CommonAttentionMetadata
from vllm.v1.attention.ops.chunked_prefill_paged_decode import (
    has_native_kv_cache_layout,
)
from vllm.v1.attention.ops.paged_attn import PagedAttention

from .aiter_ops import rocm_aiter_ops

if TYPE_CHECKING:
    from vllm.v1.attention.backends.rocm_attn import RocmAttentionImpl

# AITER's asm paged attention (pa_fwd_asm) reads the fp8 cache of 16-token blocks
# as it is: V [blocks, kv_heads, head_size, 16] is its shuffled V. Its ultra-precision
# kernel, as accurate as the HIP decode, exists on gfx942/gfx950 for head size 128
# (the scale 1/sqrt(128) built in), GQA up to 8 and fp8 e4m3.
ASM_ARCHS = ("gfx942", "gfx950")
ASM_KV_CACHE_DTYPES = ("fp8", "fp8_e4m3")
ASM_BLOCK_SIZE = 16
ASM_HEAD_SIZE = 128
ASM_MAX_GQA = 8
ASM_PRECISION = 2
ASM_MAX_MODEL_LEN = 128 * 1024  # the HIP decode's envelope
# One workgroup per (KV head, sequence): the GPU is full from two query heads per CU.
ASM_HEADS_PER_CU = 2
# Each workgroup walks its sequence's whole context (AITER asm_pa.cu launches a grid of
# (num_kv_heads, batch)), where the HIP decode splits contexts into 256-token
# partitions, so one long sequence can make the asm step the slower one. Fitted to the
# original MI355X kernel table (HIP about 6.9 us + 53 ps per head-token, that is context
# token x KV head; an asm workgroup 5.9 us + 3.5 ns per token): asm is the slower
# kernel once 67 x the longest context passes the head-tokens plus 19,500.
ASM_SKEW_RATIO = 67
ASM_SKEW_HEAD_TOKENS = 19_500
# The per-slot K and V scale tables pa_fwd_asm reads, by layer.
AsmScales = dict[torch.nn.Module, tuple[torch.Tensor, torch.Tensor]]


def asm_decode_rejections(
    impl: "RocmAttentionImpl",
    kv_cache: torch.Tensor,
    model_config: ModelConfig,
    gcn_arch: str,
) -> list[str]:
    """Why pa_fwd_asm cannot decode this layer; empty when it can."""
    if impl.attn_type != AttentionType.DECODER:
        return ["not decoder self-attention"]
    key_cache, value_cache = PagedAttention.split_kv_cache(
        kv_cache.transpose(0, 1), impl.num_kv_heads, impl.head_size
    )
    block_size, gqa = value_cache.shape[3], impl.num_heads // impl.num_kv_heads
    query_dtype, max_model_len = model_config.dtype, model_config.max_model_len
    scale_ok = math.isclose(impl.scale, ASM_HEAD_SIZE**-0.5, rel_tol=1e-6)
    clauses = (
        (any(arch in gcn_arch for arch in ASM_ARCHS), f"GPU {gcn_arch or 'unknown'}"),
        (impl.kv_cache_dtype in ASM_KV_CACHE_DTYPES, f"{impl.kv_cache_dtype} KV cache"),
        (block_size == ASM_BLOCK_SIZE, f"block size {block_size}"),
        (impl.head_size == ASM_HEAD_SIZE, f"head size {impl.head_size}"),
        (query_dtype in (torch.bfloat16, torch.float16), f"{query_dtype} query"),
        (gqa <= ASM_MAX_GQA, f"GQA {gqa}"),
        (scale_ok, f"softmax scale {impl.scale:g} != 1/sqrt(128)"),
        (impl.sliding_window == (-1, -1), "sliding window"),
        (impl.alibi_slopes is None, "ALiBi"),
        (not impl.logits_soft_cap, "logits soft cap"),
        (impl.sinks is None, "attention sinks"),
        (has_native_kv_cache_layout(key_cache, value_cache), "KV pages not dense"),
        (max_model_len <= ASM_MAX_MODEL_LEN, f"max_model_len {max_model_len}"),
    )
    return [reason for ok, reason in clauses if not ok]


def use_asm_decode(
    common: CommonAttentionMetadata,
    num_heads: int,
    num_kv_heads: int,
    cut: int,
    skew: int = ASM_SKEW_RATIO,
) -> bool:
    """A pure-decode step (one query token per request) above the cut, whose longest
    sequence does not make pa_fwd_asm the slower kernel (``skew`` 0: not asked)."""
    pure_decode = (
        common.max_query_len == 1 and common.num_reqs == common.num_actual_tokens
    )
    if not pure_decode or common.num_actual_tokens * num_heads <= cut:
        return False
    return not asm_decode_skewed(common, common.num_reqs, num_kv_heads, skew)


def asm_decode_skewed(
    common: CommonAttentionMetadata,
    num_reqs: int,
    num_kv_heads: int,
    skew: int = ASM_SKEW_RATIO,
) -> bool:
    """Whether the longest of the first ``num_reqs`` requests' contexts, times ``skew``,
    passes their head-tokens plus ``ASM_SKEW_HEAD_TOKENS``. Host integers only: vLLM's
    upper bounds of the lengths, else the requests taken as all of ``max_seq_len``."""
    if skew <= 0:
        return False
    lens = common.seq_lens_cpu_upper_bound
    if lens is None:
        longest, total = common.max_seq_len, common.max_seq_len * num_reqs
    else:
        host = lens.numpy()[:num_reqs]
        longest, total = int(host.max()), int(host.sum())
    return longest * skew > total * num_kv_heads + ASM_SKEW_HEAD_TOKENS


def asm_decode(
    query: torch.Tensor,
    key_cache: torch.Tensor,
    value_cache: torch.Tensor,
    block_table: torch.Tensor,
    seq_lens: torch.Tensor,
    scales: tuple[torch.Tensor, torch.Tensor],
    output: torch.Tensor,
) -> None:
    """pa_fwd_asm of one query token per request over the fp8 cache views."""
    rocm_aiter_ops.pa_fwd_asm(
        Q=query,
        K=key_cache,
        V=value_cache.unsqueeze(2),
        block_tables=block_table,
        context_lens=seq_lens,
        block_tables_stride0=block_table.stride(0),
        K_QScale=scales[0],
        V_QScale=scales[1],
        out_=output,
        high_precision=ASM_PRECISION,
    )
