"""Test session set-up: vLLM runs its ROCm code path on this CPU (see rocm_emulation)."""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

import rocm_emulation  # noqa: E402

ARCH = rocm_emulation.activate()

import pytest  # noqa: E402


@pytest.fixture(scope="session", autouse=True)
def _rocm_platform():
    """Import vLLM once the environment is set, answer the CU query, register the plugin."""
    rocm_emulation.patch_compute_units(ARCH)
    from vllm_rocm_asm_decode.plugin import register

    register()
    yield


@pytest.fixture
def kernels(monkeypatch):
    """Torch stand-ins for the HIP/Triton/cache-writer kernels; a clean asm-call log."""
    import harness

    log = harness.install_kernel_standins(monkeypatch)
    harness.reset_asm_calls()
    return log
