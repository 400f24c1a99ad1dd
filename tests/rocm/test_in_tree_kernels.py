"""The kernel tests ``upstream`` writes into vLLM as
``tests/kernels/attention/test_rocm_attn_asm_decode.py``, run here through the plugin on
an AMD gfx942/gfx950 GPU with AITER (skipped, with the reason, everywhere else).
``tests/e2e/test_in_tree.py`` runs them on the CPU with the contract model."""

from __future__ import annotations

import pytest

from vllm_rocm_asm_decode.tools.upstream.in_tree.kernel_test import *  # noqa: F403


@pytest.fixture(scope="module", autouse=True)
def _plugin():
    import os

    os.environ.setdefault("VLLM_ROCM_USE_AITER", "1")
    from vllm._aiter_ops import rocm_aiter_ops

    rocm_aiter_ops.refresh_env_variables()
    from vllm_rocm_asm_decode.plugin import register

    register()
