"""The plugin's long-sequence clause: a pure-decode step in which one long sequence
would make the asm kernel slower than the HIP decode keeps HIP.

AITER's launcher (``csrc/py_itfs_cu/asm_pa.cu``) starts one workgroup per (KV head,
sequence), each over its whole sequence, so one long sequence sets the step's time on
asm, where the HIP decode splits it into partitions. Fitted to the original MI355X
kernel timings (``tools/data/original_measurements.json``, ``benchmarks/
kernel_time_fit.py``): asm is slower once ``ASM_SKEW_RATIO`` x the longest context
passes the step's KV-head-tokens + ``ASM_SKEW_HEAD_TOKENS``.

Plugin-only: a captured CUDA graph replays its kernel for any lengths (vLLM captures
decode graphs with every sequence at one token), so the clause decides eager steps and
batches above the largest capture size only; the in-tree change states the limit
instead. Not fitted on gfx942 (MI300X/MI325X), where it is applied as on MI355X.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:  # doctor imports this module to name the clause, on any vLLM
    from vllm.v1.attention.backend import CommonAttentionMetadata

ASM_SKEW_RATIO = 67
ASM_SKEW_HEAD_TOKENS = 19_500


def asm_decode_skewed(
    common: CommonAttentionMetadata, num_reqs: int, num_kv_heads: int, skew: int
) -> bool:
    """Whether the first ``num_reqs`` requests are skewed by one long one, from host
    lengths (``seq_lens_cpu_upper_bound``, else ``max_seq_len`` for every request);
    ``skew`` 0 turns the clause off."""
    longest, total = common.max_seq_len, common.max_seq_len * num_reqs
    if (lens := common.seq_lens_cpu_upper_bound) is not None:
        host = lens.numpy()[:num_reqs]
        longest, total = int(host.max()), int(host.sum())
    return skew > 0 and longest * skew > total * num_kv_heads + ASM_SKEW_HEAD_TOKENS
