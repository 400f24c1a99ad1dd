"""Which kernel a decode step and a call run: decided on host integers only.

The rule (the layer part lives in :mod:`.eligibility`):

* step: a pure-decode batch (``max_query_len == 1``, one query token per request)
  whose ``num_tokens x num_heads`` query heads exceed the cut. The asm kernel runs one
  workgroup per (KV head, sequence); below about ``2 x compute units`` query heads the
  GPU is under-occupied and the HIP kernel is as fast or faster, the same cut AITER's
  ``paged_attention_common`` uses between its asm and HIP kernels.
* call: the step says asm, the layer is eligible, no fused output quantization was
  asked for, and the call's tensors are what the kernel reads: the query in the layer's
  bf16/fp16 dtype (not an fp8 query) with dense heads, and a dense output.

* mixed step (prefill and decode requests in one step): the decode requests, when they
  all lead the batch (one query token each) and their ``num_decodes x num_heads`` query
  heads exceed the cut, run the asm kernel and the prefill requests vLLM's prefill
  kernel; only where no CUDA graph can freeze the split (the mixed graph mode is not
  FULL, the build is not a capture build) and without speculative decoding.

The step decision is made once per step by the metadata builder, so a CUDA graph
captured for a (padded) batch size holds exactly one decode kernel.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np


def default_cut(compute_units: int) -> int:
    """Query heads above which the asm kernel fills the GPU: two per compute unit."""
    return 2 * compute_units


def resolve_cut(compute_units: int, override: int | None = None) -> int:
    """``override`` (``VLLM_ROCM_ASM_DECODE_CUT``) when set, else
    :func:`default_cut`."""
    return override if override is not None else default_cut(compute_units)


def describe_cut(compute_units: int, override_source: str | None = None) -> str:
    """Where the cut comes from, for logs and ``plan``: ``override_source`` (the setting
    that overrode it) or the compute units."""
    if override_source is not None:
        return f"set by {override_source}"
    return f"2 x {compute_units} CUs"


def step_uses_asm(
    *,
    max_query_len: int,
    num_tokens: int,
    num_reqs: int,
    num_heads: int,
    cut: int,
) -> bool:
    """Whether a step's decode runs the asm kernel (host integers only)."""
    return (
        max_query_len == 1
        # The kernel's batch is len(context_lens): one query row per request.
        and num_reqs == num_tokens
        and num_tokens * num_heads > cut
    )


def leading_decodes(query_start_loc: Sequence[int] | np.ndarray) -> int | None:
    """From a step's query start locations (host data): how many requests at the head of
    the batch have one query token, or None when a one-token request also stands after
    the first longer one (the decodes do not lead: vLLM's prefill kernel would skip it
    and no kernel would compute it)."""
    one = np.diff(np.asarray(query_start_loc)) == 1
    num_decodes = len(one) if one.all() else int(np.argmin(one))
    if one[num_decodes:].any():
        return None
    return num_decodes


def prefill_view_start(num_decodes: int) -> int:
    """Where a split step's prefill views start: the last multiple of 4 requests at or
    before the first prefill, so their int32 pointers keep the 16-byte alignment of the
    base tensors stock passes and vLLM's Triton prefill runs the variant stock compiled
    (Triton specializes on pointer alignment). The up to 3 decode requests this takes in
    are skipped by that kernel (``skip_decode``) and computed by asm."""
    return num_decodes - num_decodes % 4


def mixed_step_uses_asm(
    *,
    max_query_len: int,
    num_decodes: int | None,
    num_heads: int,
    cut: int,
    split_allowed: bool,
    capturing: bool,
) -> bool:
    """Whether a step's decode requests run asm while its prefill requests do not.

    ``num_decodes`` is :func:`leading_decodes` of the step; ``split_allowed`` is False
    where the mixed CUDA-graph mode is FULL or speculative decoding is on.
    """
    return (
        max_query_len > 1  # the step has prefill rows
        and num_decodes is not None  # every decode leads
        and num_decodes * num_heads > cut
        and split_allowed
        and not capturing
    )


def call_uses_asm(
    *,
    step_asm: bool,
    layer_eligible: bool,
    output_quant_requested: bool,
    tensors_ok: bool,
) -> bool:
    """Whether one ``forward`` call runs the asm kernel."""
    return step_asm and layer_eligible and not output_quant_requested and tensors_ok
