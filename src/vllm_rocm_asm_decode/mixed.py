"""Mixed prefill+decode steps: the decode requests on the asm kernel, the prefill
requests on vLLM's prefill kernel. Stage 2 of ``vllm-rocm-asm-decode upstream`` writes
everything below the imports into vLLM's ``rocm_attn.py`` as it stands here.

A step is split only when every one-token request leads the batch (the builder asks
vLLM to put decodes first), their query heads are above the cut, and no CUDA graph can
freeze the split (the mixed graph mode is not FULL, and a capture build drops it);
speculative decoding keeps mixed steps whole (its decodes carry several tokens).
"""

from dataclasses import dataclass

import numpy as np
import torch
from vllm.config import CUDAGraphMode, VllmConfig
from vllm.v1.attention.backend import CommonAttentionMetadata
from vllm.v1.kv_cache_interface import AttentionSpec

from .core import asm_decode_rejections


@dataclass(frozen=True)
class AsmDecodeSplit:
    """A mixed step cut in two as views made once per step: the leading decode
    requests (rows [0, num_decodes)) for pa_fwd_asm, the requests from a multiple of
    4 on for the prefill kernel, which skips one-token requests."""

    num_decodes: int
    decode_seq_lens: torch.Tensor
    decode_block_table: torch.Tensor
    prefill_query_start_loc: torch.Tensor
    prefill_seq_lens: torch.Tensor
    prefill_block_table: torch.Tensor


def asm_split_reorders(
    vllm_config: VllmConfig, spec: AttentionSpec, layer_names: list[str]
) -> bool:
    """Whether to ask the runner to put decode requests first, so that a mixed step
    splits at one boundary: only the V1 runner needs asking (Model Runner V2 always
    puts them first), and only for layers the rule admits. The runner asks before it
    allocates the KV cache: the rule sees one page of the spec's dense layout."""
    from vllm.platforms.rocm import on_mi3xx

    if vllm_config.use_v2_model_runner:
        return False
    page = (2, 1, spec.block_size, spec.num_kv_heads * spec.head_size)
    cache = torch.empty(page, dtype=torch.uint8, device="meta").transpose(0, 1)
    layers = vllm_config.compilation_config.static_forward_context
    model, mi3xx = vllm_config.model_config, on_mi3xx()
    return all(
        not asm_decode_rejections(layers[name].impl, cache, model, mi3xx)
        for name in layer_names
    )


def asm_split_off(vllm_config: VllmConfig) -> str | None:
    """Why no mixed step may be split; None when they may."""
    if vllm_config.compilation_config.cudagraph_mode.mixed_mode() == CUDAGraphMode.FULL:
        return "cudagraph_mode is FULL for mixed steps"
    if vllm_config.speculative_config is not None:
        return "speculative decoding is on"
    return None


def leading_decodes(query_start_loc: np.ndarray) -> int | None:
    """How many requests at the head of the batch have one query token, or None when
    one stands after a longer one (the prefill kernel would skip it)."""
    one = np.diff(query_start_loc) == 1
    num_decodes = len(one) if one.all() else int(np.argmin(one))
    return None if one[num_decodes:].any() else num_decodes


def split_asm_decode(
    common: CommonAttentionMetadata, vllm_config: VllmConfig, num_heads: int, cut: int
) -> AsmDecodeSplit | None:
    """The split of a mixed step whose leading decodes are above the cut, from host
    data; None when the step stays whole. (The graph mode is read here, per mixed step:
    Model Runner V2 resolves it after it makes the builders.)"""
    num_reqs = common.num_reqs
    if common.max_query_len == 1 or (num_reqs - 1) * num_heads <= cut:
        return None
    if asm_split_off(vllm_config) is not None:
        return None
    num_decodes = leading_decodes(common.query_start_loc_cpu.numpy()[: num_reqs + 1])
    if num_decodes is None or num_decodes * num_heads <= cut:
        return None
    # Views from a multiple of 4 requests keep the base tensors' 16-byte alignment,
    # so the Triton prefill runs the variant stock compiled.
    start = num_decodes - num_decodes % 4
    block_table = common.block_table_tensor
    return AsmDecodeSplit(
        num_decodes=num_decodes,
        decode_seq_lens=common.seq_lens[:num_decodes],
        decode_block_table=block_table[:num_decodes],
        prefill_query_start_loc=common.query_start_loc[start:],
        prefill_seq_lens=common.seq_lens[start:],
        prefill_block_table=block_table[start:],
    )
