"""Stand-in for AMD's ``aiter`` kernel library, for tests on machines without an AMD GPU.

Only what the plugin touches: ``pa_fwd_asm`` is the project's contract model of the asm
kernel (:mod:`vllm_rocm_asm_decode.contract_model`) for the architecture the ``amdsmi``
stand-in reports, reading this package's ``hsa/<gfx>/pa/pa_asm.csv`` (test tables with
the columns of AITER's, not AITER's own). Every call is appended to :data:`CALLS` so
tests can see which kernel ran.
"""

from __future__ import annotations

import os
from typing import Any

import torch

from vllm_rocm_asm_decode.contract_model import PagedAttentionAsmModel
from vllm_rocm_asm_decode.kernel_table import load_table

from .jit import core as _core

CALLS: list[dict[str, Any]] = []


def _model() -> PagedAttentionAsmModel:
    arch = os.environ.get("ASM_DECODE_TEST_GFX", "gfx950")
    table, note = load_table(_core.AITER_ASM_DIR, arch)
    assert note is None, note
    return PagedAttentionAsmModel(table)


def pa_fwd_asm(
    Q: torch.Tensor,
    K: torch.Tensor,
    V: torch.Tensor,
    block_tables: torch.Tensor,
    context_lens: torch.Tensor,
    block_tables_stride0: int,
    max_qlen: int = 1,
    K_QScale: torch.Tensor | None = None,
    V_QScale: torch.Tensor | None = None,
    out_: torch.Tensor | None = None,
    qo_indptr: torch.Tensor | None = None,
    high_precision: int | None = 1,
    kernelName: str | None = None,
) -> torch.Tensor:
    CALLS.append(
        {
            "Q": Q,
            "K": K,
            "V": V,
            "block_tables": block_tables,
            "context_lens": context_lens,
            "block_tables_stride0": block_tables_stride0,
            "K_QScale": K_QScale,
            "V_QScale": V_QScale,
            "out_": out_,
            "high_precision": high_precision,
        }
    )
    if os.environ.get("ASM_DECODE_TEST_NOOP_KERNELS") == "1":
        return out_ if out_ is not None else torch.empty_like(Q)
    return _model()(
        Q,
        K,
        V,
        block_tables,
        context_lens,
        block_tables_stride0,
        max_qlen,
        K_QScale,
        V_QScale,
        out_,
        qo_indptr,
        high_precision,
        kernelName,
    )
