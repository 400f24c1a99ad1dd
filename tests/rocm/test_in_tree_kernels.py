"""The kernel tests ``upstream`` writes into vLLM as
``tests/kernels/attention/test_rocm_attn_aiter_asm_decode.py``, run here through the
plugin: on an AMD gfx942/gfx950 GPU with AITER the kernel tests run, everywhere else they
skip with the reason and the rule's tests run. ``tests/e2e/test_in_tree.py`` runs the
kernel tests on the CPU with the contract model."""

from __future__ import annotations

import pytest

from vllm_rocm_asm_decode.tools.upstream.in_tree.kernel_test import *  # noqa: F403


@pytest.fixture(autouse=True)
def _trust_this_aiter(monkeypatch):
    """These tests prove the kernel on this GPU (fp16 queries included), which the
    plugin otherwise waits for before it lets fp16 layers use it. Their steps mix
    contexts of 1 to 4000 tokens, which the plugin's skew clause (not in vLLM) would
    keep on HIP: it is off here."""
    monkeypatch.setenv("VLLM_ROCM_ASM_DECODE_TRUST_AITER", "1")
    monkeypatch.setenv("VLLM_ROCM_ASM_DECODE_SKEW", "0")


# These tests read stage 1's shared tables, its metadata's fields and its raise, which the
# plugin does not have (it gives such layers tables of their own and has metadata of its
# own); the in-tree session runs them.
del test_the_builders_decisions  # noqa: F821
del test_what_keeps_every_layer_on_hip  # noqa: F821
