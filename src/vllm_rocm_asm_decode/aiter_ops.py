"""``rocm_aiter_ops`` as :mod:`.core` calls it: with ``pa_fwd_asm(...,
high_precision=...)``.

vLLM 0.33's ``rocm_aiter_ops.pa_fwd_asm`` does not pass ``high_precision`` to AITER
(stage 1 of the in-tree change adds it, with AITER's default). Where vLLM's wrapper
takes it, this is vLLM's own class; otherwise a subclass whose ``pa_fwd_asm`` passes it
on, and nothing else differs. vLLM's class is never patched.
"""

from __future__ import annotations

import inspect

import torch
from vllm._aiter_ops import rocm_aiter_ops as vllm_rocm_aiter_ops


class _RocmAiterOps(vllm_rocm_aiter_ops):
    @staticmethod
    def pa_fwd_asm(  # type: ignore[override]
        Q: torch.Tensor,  # noqa: N803 - AITER's argument names
        K: torch.Tensor,  # noqa: N803
        V: torch.Tensor,  # noqa: N803
        block_tables: torch.Tensor,
        context_lens: torch.Tensor,
        block_tables_stride0: int,
        K_QScale: torch.Tensor,  # noqa: N803
        V_QScale: torch.Tensor,  # noqa: N803
        out_: torch.Tensor,
        high_precision: int = 1,
    ) -> torch.Tensor:
        """``aiter.pa_fwd_asm`` by keyword, ``high_precision`` (AITER's default: 1)
        included; AITER is imported at the call, as vLLM's wrapper does."""
        from aiter import pa_fwd_asm

        return pa_fwd_asm(
            Q=Q,
            K=K,
            V=V,
            block_tables=block_tables,
            context_lens=context_lens,
            block_tables_stride0=block_tables_stride0,
            K_QScale=K_QScale,
            V_QScale=V_QScale,
            out_=out_,
            high_precision=high_precision,
        )


def _passes_high_precision() -> bool:
    try:
        return (
            "high_precision"
            in inspect.signature(vllm_rocm_aiter_ops.pa_fwd_asm).parameters
        )
    except (TypeError, ValueError):
        return False


rocm_aiter_ops: type[vllm_rocm_aiter_ops] = (
    vllm_rocm_aiter_ops if _passes_high_precision() else _RocmAiterOps
)
