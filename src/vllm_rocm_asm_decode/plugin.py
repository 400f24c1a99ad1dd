"""The ``vllm.general_plugins`` entry point: point ``ROCM_ATTN`` at the asm-decode
backend.

vLLM calls :func:`register` in every process it starts (API server, engine core,
workers), possibly more than once, so it is cheap (no AITER import, no GPU query) and
idempotent. It overrides ``AttentionBackendEnum.ROCM_ATTN`` through vLLM's registry
only when the asm decode can work; otherwise it registers nothing, stock ``ROCM_ATTN``
stays in place, and it says why once.
"""

from __future__ import annotations

from importlib.util import find_spec

from . import settings
from .kernel import unavailable_reason
from .log import logger

BACKEND_PATH = "vllm_rocm_asm_decode.backend.RocmAsmDecodeBackend"


#: The package the in-tree form adds to vLLM (``vllm-rocm-asm-decode upstream``).
IN_TREE_PACKAGE = "vllm.v1.attention.backends.rocm_asm_decode"


def vllm_carries_asm_decode() -> bool:
    """Whether the installed vLLM already has the asm decode in ``ROCM_ATTN`` (the
    in-tree form's package is there). Finds the module without importing it."""
    try:
        return find_spec(IN_TREE_PACKAGE) is not None
    except ImportError:  # a parent package is missing: not a vLLM that carries it
        return False


def inactive_reason() -> str | None:
    """Why the override must not be registered in this process; None when it should be.

    Raises :class:`~vllm_rocm_asm_decode.settings.SettingError` on a bad setting on
    ROCm, even where the plugin is switched off (a typo must not silently change which
    kernel serves traffic). Where the plugin can never act (not ROCm, or a vLLM that
    carries the asm decode itself) a bad setting stops nothing: it is reported once and
    the plugin stays inactive.
    """
    from vllm.platforms import current_platform

    for never, why in (
        (not current_platform.is_rocm(), "not ROCm"),
        (
            vllm_carries_asm_decode(),
            f"the installed vLLM already carries the ROCM_ATTN asm decode "
            f"({IN_TREE_PACKAGE}); vLLM's VLLM_ROCM_ASM_DECODE and "
            f"VLLM_ROCM_ASM_DECODE_CUT apply",
        ),
    ):
        if never:
            for problem in settings.problems():
                logger.warning_once(
                    "ROCM_ATTN asm decode plugin: %s (ignored: %s)", problem, why
                )
            return why
    settings.check_all()
    if not settings.asm_decode_switch():
        return f"{settings.SWITCH_ENV}=0"
    return unavailable_reason()


def register() -> None:
    """Entry point ``rocm_asm_decode`` of the ``vllm.general_plugins`` group."""
    from vllm.v1.attention.backends.registry import (
        AttentionBackendEnum,
        register_backend,
    )

    reason = inactive_reason()
    if reason is not None:
        logger.info_once("ROCM_ATTN asm decode plugin inactive: %s", reason)
        return
    register_backend(AttentionBackendEnum.ROCM_ATTN, BACKEND_PATH)
    logger.info_once("ROCM_ATTN asm decode plugin registered (%s)", BACKEND_PATH)
