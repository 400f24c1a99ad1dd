"""The plugin's own environment variables, parsed strictly.

``VLLM_ROCM_ASM_DECODE``      1 (default) / 0: turn only the asm decode on or off. vLLM's
                              ``VLLM_ROCM_USE_AITER_MHA=0`` turns it off too, but also
                              changes other vLLM choices; this switch changes nothing else.
``VLLM_ROCM_ASM_DECODE_CUT``  Query heads per step above which a pure-decode batch runs
                              the asm kernel. Default: ``2 x compute units`` of the GPU.

A value that is not understood is an error that names the variable and the value: a
typo must not silently change which kernel serves traffic.
"""

from __future__ import annotations

import os

SWITCH_ENV = "VLLM_ROCM_ASM_DECODE"
CUT_ENV = "VLLM_ROCM_ASM_DECODE_CUT"

_TRUE = ("1", "true", "yes", "on")
_FALSE = ("0", "false", "no", "off")


class SettingError(ValueError):
    """An environment variable of this plugin has a value it does not accept."""


def asm_decode_switch() -> bool:
    """``VLLM_ROCM_ASM_DECODE``: True unless set to a false value."""
    raw = os.environ.get(SWITCH_ENV)
    if raw is None or raw.strip() == "":
        return True
    value = raw.strip().lower()
    if value in _TRUE:
        return True
    if value in _FALSE:
        return False
    raise SettingError(
        f"{SWITCH_ENV}={raw!r} is not understood; use 1 (asm decode on, the default) or 0 (off)"
    )


def cut_override() -> int | None:
    """``VLLM_ROCM_ASM_DECODE_CUT`` as a positive int, or None when unset."""
    raw = os.environ.get(CUT_ENV)
    if raw is None or raw.strip() == "":
        return None
    try:
        value = int(raw.strip())
    except ValueError:
        value = 0
    if value <= 0:
        raise SettingError(
            f"{CUT_ENV}={raw!r} is not a positive whole number of query heads "
            "(e.g. 512); unset it for the default of 2 x compute units"
        )
    return value
