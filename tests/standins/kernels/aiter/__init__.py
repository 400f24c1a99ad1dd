"""Stand-in for AMD's ``aiter`` kernel library, for tests on machines without an AMD GPU.

Only what the plugin touches: ``pa_fwd_asm`` is the project's contract model of the asm
kernel (:mod:`vllm_rocm_asm_decode.contract_model`), with its signature, for the
architecture the ``amdsmi`` stand-in reports, reading this package's
``hsa/<gfx>/pa/pa_asm.csv`` (test tables with the columns of AITER's, not AITER's own).
Every call's arguments are appended to :data:`CALLS` so tests can see which kernel ran.
With ``ASM_DECODE_TEST_NOOP_KERNELS=1`` the call records and returns without computing.
"""

from __future__ import annotations

import inspect
import os
from typing import Any

import torch

from vllm_rocm_asm_decode.contract_model import PagedAttentionAsmModel
from vllm_rocm_asm_decode.kernel_table import load_table

from .jit import core as _core

CALLS: list[dict[str, Any]] = []

_SIGNATURE = inspect.signature(PagedAttentionAsmModel.__call__)
_SIGNATURE = _SIGNATURE.replace(parameters=list(_SIGNATURE.parameters.values())[1:])


def _model() -> PagedAttentionAsmModel:
    arch = os.environ.get("ASM_DECODE_TEST_GFX", "gfx950")
    table, note = load_table(_core.AITER_ASM_DIR, arch)
    assert note is None, note
    return PagedAttentionAsmModel(table)


def pa_fwd_asm(*args: Any, **kwargs: Any) -> torch.Tensor:
    call = _SIGNATURE.bind(*args, **kwargs)
    call.apply_defaults()
    CALLS.append(dict(call.arguments))
    if os.environ.get("ASM_DECODE_TEST_NOOP_KERNELS") == "1":
        out = call.arguments["out_"]
        return out if out is not None else torch.empty_like(call.arguments["Q"])
    return _model()(*call.args, **call.kwargs)


pa_fwd_asm.__signature__ = _SIGNATURE  # type: ignore[attr-defined]
