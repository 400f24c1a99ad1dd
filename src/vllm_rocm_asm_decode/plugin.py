"""The ``vllm.general_plugins`` entry point: point ``ROCM_ATTN`` at the asm-decode backend.

vLLM calls :func:`register` in every process it starts (API server, engine core,
workers), possibly more than once, so it is cheap (no AITER import, no GPU query) and
idempotent. It overrides ``AttentionBackendEnum.ROCM_ATTN`` through vLLM's registry
only when the asm decode can work; otherwise it registers nothing, stock ``ROCM_ATTN``
stays in place, and it says why once.
"""

from __future__ import annotations

from importlib.util import find_spec

from . import settings
from .log import logger

BACKEND_PATH = "vllm_rocm_asm_decode.backend.RocmAsmDecodeBackend"


def inactive_reason() -> str | None:
    """Why the override must not be registered in this process; None when it should be.

    Raises :class:`~vllm_rocm_asm_decode.settings.SettingError` on a bad setting on ROCm,
    even where the plugin is switched off (a typo must not silently change which kernel
    serves traffic). Where the plugin can never act (not ROCm) a bad setting stops
    nothing: it is reported once and the plugin stays inactive.
    """
    from vllm.platforms import current_platform

    if not current_platform.is_rocm():
        for problem in settings.problems():
            logger.warning_once("ROCM_ATTN asm decode plugin: %s (ignored: not ROCm)", problem)
        return "not ROCm"
    settings.check_all()
    if not settings.asm_decode_switch():
        return f"{settings.SWITCH_ENV}=0"
    if find_spec("aiter") is None:
        return "the aiter package is not installed"
    from vllm._aiter_ops import rocm_aiter_ops

    if not rocm_aiter_ops.is_enabled():
        return "AITER is off (set VLLM_ROCM_USE_AITER=1) or not supported on this GPU"
    if not rocm_aiter_ops.is_mha_enabled():
        return "VLLM_ROCM_USE_AITER_MHA=0"
    return None


def register() -> None:
    """Entry point ``rocm_asm_decode`` of the ``vllm.general_plugins`` group."""
    from vllm.v1.attention.backends.registry import AttentionBackendEnum, register_backend

    reason = inactive_reason()
    if reason is not None:
        logger.info_once("ROCM_ATTN asm decode plugin inactive: %s", reason)
        return
    register_backend(AttentionBackendEnum.ROCM_ATTN, BACKEND_PATH)
    logger.info_once("ROCM_ATTN asm decode plugin registered (%s)", BACKEND_PATH)
