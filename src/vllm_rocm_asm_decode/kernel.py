"""The boundary to AITER: find ``aiter.pa_fwd_asm``, check its signature, know its kernels.

Loaded once per worker process, at the first metadata build after the KV cache is
bound (never in ``register()``, which runs in every vLLM process). The plugin calls
``aiter.pa_fwd_asm`` itself, by keyword: vLLM 0.33's ``rocm_aiter_ops.pa_fwd_asm``
wrapper does not pass ``high_precision``.
"""

from __future__ import annotations

import functools
import inspect
import os
from collections.abc import Callable
from dataclasses import dataclass

import torch

from .kernel_table import KernelTable, load_table, normalize_arch

#: Keywords the call passes. AITER releases before ``block_tables_stride0`` took a
#: positional ``max_num_blocks`` there and had no ``high_precision``.
REQUIRED_PARAMETERS = (
    "Q",
    "K",
    "V",
    "block_tables",
    "context_lens",
    "block_tables_stride0",
    "K_QScale",
    "V_QScale",
    "out_",
    "high_precision",
)


@dataclass(frozen=True)
class AsmKernel:
    """A usable ``pa_fwd_asm`` and the kernel table of the GPU it runs on."""

    run: Callable[..., torch.Tensor]
    table: KernelTable
    #: Set when the installed table could not be read and the built-in fallback is used.
    table_note: str | None = None


def current_arch() -> str:
    """The running GPU's architecture name as vLLM resolved it (e.g. ``gfx950``)."""
    from vllm.platforms import rocm

    return normalize_arch(getattr(rocm, "_GCN_ARCH", ""))


def signature_problem(fn: Callable[..., object]) -> str | None:
    """Why ``fn`` cannot be called as this plugin calls ``pa_fwd_asm``; None if it can."""
    try:
        params = inspect.signature(fn).parameters
    except (TypeError, ValueError):
        return "aiter.pa_fwd_asm has no inspectable signature"
    missing = [name for name in REQUIRED_PARAMETERS if name not in params]
    if missing:
        return (
            "aiter.pa_fwd_asm has no " + ", ".join(missing) + " argument "
            "(an AITER older than the block_tables_stride0/high_precision signature)"
        )
    return None


@functools.cache
def load_asm_kernel(arch: str) -> tuple[AsmKernel | None, str | None]:
    """``(kernel, None)``, or ``(None, why not)``. Cached for the process."""
    try:
        import aiter
    except Exception as exc:  # any import failure means: stay on HIP, say why
        return None, f"aiter cannot be imported ({type(exc).__name__}: {exc})"
    fn = getattr(aiter, "pa_fwd_asm", None)
    if fn is None:
        return None, "aiter has no pa_fwd_asm"
    problem = signature_problem(fn)
    if problem is not None:
        return None, problem
    # aiter.jit.core sets AITER_ASM_DIR when aiter is imported; read its constant otherwise.
    asm_dir = os.environ.get("AITER_ASM_DIR")
    if not asm_dir:
        try:
            from aiter.jit import core
        except Exception:
            core = None
        asm_dir = getattr(core, "AITER_ASM_DIR", None)
    table, note = load_table(asm_dir, arch)
    return AsmKernel(run=fn, table=table, table_note=note), None
