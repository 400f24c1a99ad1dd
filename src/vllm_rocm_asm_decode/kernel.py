"""The plugin's guard at the boundary to AITER: whether it is there and on, whether
``aiter.pa_fwd_asm`` takes the call :func:`.core.asm_decode` makes, which GPU this is,
and which kernels the installed AITER has.

Loaded once per worker process, at the first metadata build after the KV cache is
bound. The call itself goes through :mod:`.aiter_ops`.
"""

from __future__ import annotations

import functools
import inspect
import os
from collections.abc import Callable
from dataclasses import dataclass
from importlib.util import find_spec

import torch

from .aiter_version import AiterBuild
from .kernel_table import KernelTable, load_table, normalize_arch


def unavailable_reason() -> str | None:
    """Why the asm decode cannot run in this process at all (not ROCm, no AITER, AITER
    or its MHA switched off); None when it can. Cheap: imports no kernel."""
    from vllm.platforms import current_platform

    if not current_platform.is_rocm():
        return "not ROCm"
    if find_spec("aiter") is None:
        return "the aiter package is not installed"
    from vllm._aiter_ops import rocm_aiter_ops

    if not rocm_aiter_ops.is_enabled():
        return "AITER is off (set VLLM_ROCM_USE_AITER=1) or not supported on this GPU"
    if not rocm_aiter_ops.is_mha_enabled():
        return "VLLM_ROCM_USE_AITER_MHA=0"
    return None


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
    """A usable ``pa_fwd_asm``: the kernel table of the GPU it runs on."""

    table: KernelTable
    #: The installed AITER's version, and whether it is trusted with high KV blocks.
    aiter: AiterBuild
    #: Set when the installed table could not be read and the built-in fallback is used.
    table_note: str | None = None


def current_arch() -> str:
    """The running GPU's architecture (e.g. ``gfx950``): vLLM's resolved name, else the
    one torch reports for the current device, else ``""`` (unknown)."""
    from vllm.platforms import rocm

    arch = normalize_arch(getattr(rocm, "_GCN_ARCH", "") or "")
    if arch:
        return arch
    try:
        props = torch.cuda.get_device_properties(
            torch.accelerator.current_device_index()
        )
        return normalize_arch(props.gcnArchName or "")
    except Exception:  # no GPU, a torch without ROCm, or no gcnArchName
        return ""


def asm_dir() -> str | None:
    """Where AITER's kernels are installed: ``$AITER_ASM_DIR`` (``aiter.jit.core`` sets
    it on import), else that module's constant."""
    found = os.environ.get("AITER_ASM_DIR")
    if found:
        return found
    try:
        from aiter.jit import core
    except Exception:
        return None
    return getattr(core, "AITER_ASM_DIR", None)


def _parameter_names(fn: Callable[..., object]) -> set[str] | None:
    """The names ``fn`` takes; None when its signature cannot be inspected."""
    try:
        return set(inspect.signature(fn).parameters)
    except (TypeError, ValueError):
        return None


def signature_problem(fn: Callable[..., object]) -> str | None:
    """Why ``fn`` cannot be called as the asm decode calls ``pa_fwd_asm``; None if it
    can."""
    params = _parameter_names(fn)
    if params is None:
        return "aiter.pa_fwd_asm has no inspectable signature"
    missing = [name for name in REQUIRED_PARAMETERS if name not in params]
    if missing:
        return (
            "aiter.pa_fwd_asm has no " + ", ".join(missing) + " argument "
            "(an AITER older than the block_tables_stride0/high_precision signature)"
        )
    return None


@functools.cache
def load_asm_kernel(
    arch: str, trust_aiter: bool = False
) -> tuple[AsmKernel | None, str | None]:
    """``(kernel, None)``, or ``(None, why not)``. Cached for the process.

    ``trust_aiter``: take the installed AITER as reading every KV block right whatever
    its version says (see :mod:`.aiter_version`).
    """
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
    table, note = load_table(asm_dir(), arch)
    aiter_build = AiterBuild.installed(trusted=trust_aiter)
    return AsmKernel(table=table, aiter=aiter_build, table_note=note), None
