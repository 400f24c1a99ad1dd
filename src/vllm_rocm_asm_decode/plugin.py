"""The ``vllm.general_plugins`` entry point: point ``ROCM_ATTN`` at the asm-decode
backend.

vLLM calls :func:`register` in every process it starts (API server, engine core,
workers), possibly more than once, so it is cheap (no AITER import, no GPU query, no
import of vLLM's attention modules: the vLLM guard reads their source) and idempotent.
It overrides ``AttentionBackendEnum.ROCM_ATTN`` through vLLM's registry only when the
asm decode can work; otherwise it registers nothing, stock ``ROCM_ATTN`` stays in
place, and it says why once.
"""

from __future__ import annotations

from . import settings
from .kernel import unavailable_reason
from .log import logger
from .vllm_support import module_source, vllm_mismatch

BACKEND_PATH = "vllm_rocm_asm_decode.backend.RocmAsmDecodeBackend"


#: The module the in-tree form changes (``vllm-rocm-asm-decode upstream``), and what
#: stage 1 defines there.
IN_TREE_MODULE = "vllm.v1.attention.backends.rocm_attn"
IN_TREE_MARKER = "def _asm_decode_rejections("


def vllm_carries_asm_decode() -> bool:
    """Whether the installed vLLM already has the asm decode in ``ROCM_ATTN`` (its
    ``rocm_attn.py`` defines the rule stage 1 writes), read without an import."""
    source = module_source(IN_TREE_MODULE)
    return source is not None and IN_TREE_MARKER in source


def inactive_reason() -> str | None:
    """Why the override must not be registered in this process; None when it should be.

    Raises :class:`~vllm_rocm_asm_decode.settings.SettingError` on a bad setting on
    ROCm, even where the plugin is switched off (a typo must not silently change which
    kernel serves traffic). Where the plugin can never act (not ROCm, a vLLM that
    carries the asm decode itself, or a vLLM other than the one this release extends:
    :func:`~vllm_rocm_asm_decode.vllm_support.vllm_mismatch`) a bad setting stops
    nothing: it is reported once and the plugin stays inactive.
    """
    from vllm.platforms import current_platform

    for never, why in (
        (not current_platform.is_rocm(), "not ROCm"),
        (
            vllm_carries_asm_decode(),
            f"the installed vLLM already carries the ROCM_ATTN asm decode "
            f"({IN_TREE_MODULE}); --attention-config.use_aiter_asm_decode=true "
            "turns it on there",
        ),
    ):
        if never:
            return _never(why)
    mismatch = vllm_mismatch()
    if mismatch is not None:
        return _never(f"{mismatch}; stock ROCM_ATTN serves")
    settings.check_all()
    if not settings.asm_decode_switch():
        return f"{settings.SWITCH_ENV}=0"
    return unavailable_reason()


def _never(why: str) -> str:
    """Where the plugin can never act, a bad setting stops nothing: said once."""
    for problem in settings.problems():
        logger.warning_once(
            "ROCM_ATTN asm decode plugin: %s (ignored: %s)", problem, why
        )
    return why


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
