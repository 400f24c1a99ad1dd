"""On a real GPU: AITER on and the plugin registered for the hardware tests (the session
fixture of ``tests/conftest.py`` registers it under the stand-ins)."""

from __future__ import annotations

import os

import pytest


@pytest.fixture(scope="module", autouse=True)
def _plugin():
    os.environ.setdefault("VLLM_ROCM_USE_AITER", "1")
    from vllm._aiter_ops import rocm_aiter_ops

    rocm_aiter_ops.refresh_env_variables()
    from vllm_rocm_asm_decode.plugin import register

    register()
