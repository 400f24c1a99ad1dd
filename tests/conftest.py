"""Test session set-up: vLLM runs its ROCm code path on this CPU (see rocm_emulation)."""

from __future__ import annotations

import logging
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


class _Records(logging.Handler):
    def __init__(self) -> None:
        super().__init__(logging.DEBUG)
        self.messages: list[str] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.messages.append(record.getMessage())


@pytest.fixture
def plugin_log():
    """Messages of the plugin's logger during one test, with vLLM's once-caches and the
    plugin's once-per-process announcement reset so every test sees its own lines."""
    from vllm import logger as vllm_logger

    import vllm_rocm_asm_decode.backend as backend
    from vllm_rocm_asm_decode.log import LOGGER_NAME

    for fn in (vllm_logger._print_info_once, vllm_logger._print_warning_once):
        fn.cache_clear()
    backend._announced = False
    handler = _Records()
    log = logging.getLogger(LOGGER_NAME)
    old_level = log.level
    log.setLevel(logging.DEBUG)
    log.addHandler(handler)
    yield handler.messages
    log.removeHandler(handler)
    log.setLevel(old_level)
