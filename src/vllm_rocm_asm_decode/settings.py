"""The plugin's own environment variables, parsed strictly.

``VLLM_ROCM_ASM_DECODE``      1 (default) / 0: turn only the asm decode on or off.
                              vLLM's ``VLLM_ROCM_USE_AITER_MHA=0`` turns it off too,
                              but also changes other vLLM choices; this switch changes
                              nothing else.
``VLLM_ROCM_ASM_DECODE_CUT``  Query heads per step above which a pure-decode batch runs
                              the asm kernel. Default: ``2 x compute units`` of the GPU.
``VLLM_ROCM_ASM_DECODE_SKEW``  The skew clause's ratio: a step whose longest context
                              times it passes the batch's head-tokens (contexts x KV
                              heads) keeps the HIP decode. Default: the core's 67,
                              fitted to MI355X; ``bench kernel --skew`` measures it on
                              a GPU. 0 turns the clause off.
``VLLM_ROCM_ASM_DECODE_TRUST_AITER``
                              0 (default) / 1: this AITER build passed ``doctor``'s
                              self-test on this GPU: take it as reading every KV block
                              right whatever its version says, and let fp16-query layers
                              use its ultra-precision kernel (unproven upstream).

A value that is not understood is an error that names the variable and the value: a
typo must not silently change which kernel serves traffic. The flags take the values
vLLM's own ROCm switches take as on or off (``1``/``true``, ``0``/``false``, any case,
nothing around them); what vLLM would quietly read as off (an empty value, ``yes``,
`` 1 ``, a typo) is an error here. The cut takes ASCII digits only. Every command reads
them through this module, the same way.
"""

from __future__ import annotations

import logging
import os

#: The plugin's name in ``vllm.general_plugins`` (what ``VLLM_PLUGINS`` lists).
ENTRY_POINT = "rocm_asm_decode"
SWITCH_ENV = "VLLM_ROCM_ASM_DECODE"
CUT_ENV = "VLLM_ROCM_ASM_DECODE_CUT"
SKEW_ENV = "VLLM_ROCM_ASM_DECODE_SKEW"
TRUST_ENV = "VLLM_ROCM_ASM_DECODE_TRUST_AITER"

_TRUE = ("1", "true")
_FALSE = ("0", "false")


class SettingError(ValueError):
    """An environment variable of this plugin has a value it does not accept."""


def _flag(name: str, default: bool, meaning: str) -> bool:
    raw = os.environ.get(name)
    if raw is None:
        return default
    value = raw.lower()
    if value in _TRUE:
        return True
    if value in _FALSE:
        return False
    raise SettingError(f"{name}={raw!r} is not understood; use {meaning}")


def asm_decode_switch() -> bool:
    """``VLLM_ROCM_ASM_DECODE``: True unless set to a false value."""
    return _flag(
        SWITCH_ENV, True, "1 or true (asm decode on, the default), or 0 or false (off)"
    )


def switch_as_written() -> str:
    """``VLLM_ROCM_ASM_DECODE=<value>`` as the environment spells the value (``False``
    stays ``False``), for reports; ``(unset)`` when it is not set."""
    raw = os.environ.get(SWITCH_ENV)
    return f"{SWITCH_ENV}={'(unset)' if raw is None else raw}"


def trust_aiter() -> bool:
    """``VLLM_ROCM_ASM_DECODE_TRUST_AITER``: False unless set to a true value."""
    return _flag(
        TRUST_ENV,
        False,
        "1 or true (the installed AITER passed doctor: trust it with every KV "
        "block and with fp16 queries), or 0 or false (the default: only AITER "
        "0.1.17 and later with caches past 65536 blocks, and bf16 queries only)",
    )


def problems() -> list[str]:
    """Every setting that does not parse, as its error message."""
    found = []
    for parse in (asm_decode_switch, cut_override, skew_override, trust_aiter):
        try:
            parse()
        except SettingError as exc:
            found.append(str(exc))
    return found


def check_all() -> None:
    """Parse every setting; raises :class:`SettingError` naming every bad one."""
    found = problems()
    if found:
        raise SettingError("; ".join(found))


def cut_override() -> int | None:
    """``VLLM_ROCM_ASM_DECODE_CUT`` as a positive int, or None when unset."""
    raw = os.environ.get(CUT_ENV)
    if raw is None:
        return None
    # ASCII digits only, as the flags take their exact spellings: no spaces, signs,
    # underscores or other scripts' digits, which int() would let through.
    value = int(raw) if raw.isascii() and raw.isdigit() and len(raw) <= 12 else 0
    if value <= 0:
        shown = raw if len(raw) <= 40 else raw[:40] + "..."
        raise SettingError(
            f"{CUT_ENV}={shown!r} is not a positive whole number of query heads "
            "(at most 12 ASCII digits, e.g. 512); unset it for the default of "
            "2 x compute units"
        )
    return value


def skew_override() -> int | None:
    """``VLLM_ROCM_ASM_DECODE_SKEW`` as a whole number >= 0, or None when unset."""
    raw = os.environ.get(SKEW_ENV)
    if raw is None:
        return None
    if raw.isascii() and raw.isdigit() and len(raw) <= 6:
        return int(raw)
    shown = raw if len(raw) <= 40 else raw[:40] + "..."
    raise SettingError(
        f"{SKEW_ENV}={shown!r}: give a whole number of at most 6 ASCII digits (e.g. "
        "67; 0 turns the skew clause off), or unset it for the default"
    )


def plugins_allow_list() -> list[str] | None:
    """``VLLM_PLUGINS`` as vLLM reads it (comma-separated names); None when unset."""
    raw = os.environ.get("VLLM_PLUGINS")
    return None if raw is None else raw.split(",")


def left_out_by_vllm_plugins() -> bool:
    """Whether ``VLLM_PLUGINS`` is set and does not name this plugin (vLLM then does not
    load it)."""
    allowed = plugins_allow_list()
    return allowed is not None and ENTRY_POINT not in allowed


def logging_level_problem() -> str | None:
    """What is wrong with ``VLLM_LOGGING_LEVEL`` as vLLM reads it (upper-cased, nothing
    stripped; its logging set-up refuses a name that is not a level); None when unset or
    a level."""
    raw = os.environ.get("VLLM_LOGGING_LEVEL")
    if raw is None or isinstance(logging.getLevelName(raw.upper()), int):
        return None
    return (
        f"VLLM_LOGGING_LEVEL={raw!r} is not a logging level (DEBUG, INFO, WARNING, "
        "ERROR, CRITICAL)"
    )


def cut_source() -> str | None:
    """The name of the setting that overrides the cut; None when none does."""
    return CUT_ENV if cut_override() is not None else None
