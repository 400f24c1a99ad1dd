"""Stand-in for AMD's ``aiter`` kernel library, for tests on machines without an AMD GPU.

Only what the plugin touches: ``pa_fwd_asm`` is the project's contract model of the asm
kernel (:mod:`vllm_rocm_asm_decode.tools.contract_model`), with its signature, for the
architecture the ``amdsmi`` stand-in reports, reading this package's
``hsa/<gfx>/pa/pa_asm.csv`` (test tables with the columns of AITER's, not AITER's own;
the ``.co`` files beside them are empty placeholders, present as installed kernels are).
Every call's arguments are appended to :data:`CALLS` so tests can see which kernel ran.
With ``ASM_DECODE_TEST_NOOP_KERNELS=1`` the call records and returns without computing.

Its version (``aiter._version``) is ``$ASM_DECODE_TEST_AITER_VERSION``; set below
0.1.17, the kernel misreads block ids >= 65536 as AITER's did before that release
(``block_id & 0xFFFF``). From 0.1.17 on (and with no version set) it has the fixed
kernels' span limit: pages of one wave whose byte distance reaches 2**31 are misread
(the contract model's ``span_limit``), unless ``$ASM_DECODE_TEST_AITER_SPAN=right``.
AITER's shipped uhp kernels read such pages right (64-bit page addresses in their code
objects, ``scripts/aiter-pa-addressing``); the stand-in misreads by default, stricter,
so that the plugin's bind-time probe is exercised.
"""

from __future__ import annotations

import inspect
import os
import re
from typing import Any

import torch

from vllm_rocm_asm_decode.kernel_table import load_table
from vllm_rocm_asm_decode.tools.contract_model import SPAN_LIMIT, PagedAttentionAsmModel

from .jit import core as _core

CALLS: list[dict[str, Any]] = []

_SIGNATURE = inspect.signature(PagedAttentionAsmModel.__call__)
_SIGNATURE = _SIGNATURE.replace(parameters=list(_SIGNATURE.parameters.values())[1:])


def _truncates_block_ids() -> bool:
    """Whether the stand-in's version predates AITER 0.1.17 (its own reading of the
    leading ``major.minor.patch``, independent of the plugin's)."""
    match = re.match(r"(\d+)\.(\d+)\.(\d+)", os.environ.get("ASM_DECODE_TEST_AITER_VERSION", ""))
    return match is not None and tuple(int(g) for g in match.groups()) < (0, 1, 17)


def _model() -> PagedAttentionAsmModel:
    arch = os.environ.get("ASM_DECODE_TEST_GFX", "gfx950")
    table, note = load_table(_core.AITER_ASM_DIR, arch)
    assert note is None, note
    if _truncates_block_ids():
        return PagedAttentionAsmModel(table, block_id_mask=0xFFFF)
    span = os.environ.get("ASM_DECODE_TEST_AITER_SPAN", "misread")
    assert span in ("misread", "right"), span
    return PagedAttentionAsmModel(table, span_limit=SPAN_LIMIT if span == "misread" else None)


def pa_fwd_asm(*args: Any, **kwargs: Any) -> torch.Tensor:
    call = _SIGNATURE.bind(*args, **kwargs)
    call.apply_defaults()
    CALLS.append(dict(call.arguments))
    if os.environ.get("ASM_DECODE_TEST_NOOP_KERNELS") == "1":
        out = call.arguments["out_"]
        return out if out is not None else torch.empty_like(call.arguments["Q"])
    return _model()(*call.args, **call.kwargs)


pa_fwd_asm.__signature__ = _SIGNATURE  # type: ignore[attr-defined]
