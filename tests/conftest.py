"""Test session set-up.

On a machine without a ROCm GPU (CI, laptops) vLLM runs its ROCm code path on the CPU
with two stand-ins (see ``rocm_emulation``). On a real ROCm GPU nothing is emulated: the
stand-in-based suites are left out and ``tests/rocm`` runs against the real kernels.
"""

from __future__ import annotations

import gc
import logging
import os
import signal
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

# The Ctrl-C tests interrupt the commands they start (which inherit this process's SIGINT
# disposition) or this process itself: a shell's background job (`scripts/test &`) starts
# with SIGINT ignored. So such a run, too, stops at a SIGINT.
if signal.getsignal(signal.SIGINT) is signal.SIG_IGN:
    signal.signal(signal.SIGINT, signal.default_int_handler)

import rocm_emulation

REAL_ROCM = rocm_emulation.real_rocm_gpu()
ARCH = rocm_emulation.real_arch() if REAL_ROCM else rocm_emulation.activate()

import pytest  # noqa: E402

import background  # noqa: E402
import in_tree  # noqa: E402, F401 - declares the in-tree sessions, which may start early

# The end-to-end suite needs the stand-ins; on real hardware tests/rocm covers that ground.
collect_ignore = ["e2e"] if REAL_ROCM else []

#: Options that select fewer tests than the paths hold: with any, checks start only once
#: collection says which tests run.
_NARROWING = (
    "keyword",
    "markexpr",
    "deselect",
    "ignore",
    "ignore_glob",
    "lf",
    "failedfirst",
    "stepwise",
    "stepwise_skip",
    "collectonly",
)


def pytest_sessionstart(session):
    """A run of whole files or directories starts the checks declared before collection
    (the in-tree sessions: see ``background.start_early``); under ``-m "not slow"``,
    those of the tests not marked slow."""
    config = session.config
    if REAL_ROCM or os.environ.get("ASM_DECODE_TEST_FORM") == "in-tree":
        return
    quick = config.option.markexpr == "not slow"  # plain scripts/test
    if quick:
        background.set_workers(1)
    narrowing = [n for n in _NARROWING if not (quick and n == "markexpr")]
    if any(getattr(config.option, name, None) for name in narrowing):
        return
    if any("::" in arg for arg in config.args):
        return
    paths = (Path(config.invocation_params.dir, arg) for arg in config.args)
    background.start_early(paths, slow=not quick)


def pytest_collection_modifyitems(session, config, items):
    """Tests that wait for a subprocess check run last (stable order otherwise)."""
    items.sort(
        key=lambda item: background.waits(
            Path(str(item.fspath)), item.name, getattr(item, "originalname", item.name)
        )
    )


def _freeze_the_heap() -> None:
    """Keeps what is alive now (torch, vLLM and the test modules, millions of objects)
    out of the garbage collector's full passes, which would otherwise walk it all some
    thirty times a run (0.5 s each: a sixth of the suite's time on 2 cores), and makes
    the passes rarer. Tests free their large tensors by reference counts, not cycles
    (the quick suite's peak resident memory stays under 3 GiB)."""
    gc.collect()
    gc.freeze()
    gc.set_threshold(10_000, 20, 50)


def pytest_collection_finish(session):
    """Start the subprocess checks of the selected tests (see ``background``): by now
    -k, -m, --deselect and --lf have dropped their items."""
    _freeze_the_heap()
    background.start_for(
        (Path(str(item.fspath)).resolve(), name)
        for item in session.items
        for name in (item.name, getattr(item, "originalname", item.name))
    )


def pytest_sessionfinish(session, exitstatus):
    background.shutdown()


@pytest.fixture(scope="session", autouse=True)
def _rocm_platform():
    """Import vLLM once the environment is set, answer the CU query, register the plugin."""
    if not REAL_ROCM:
        rocm_emulation.patch_compute_units(ARCH)
        import torch

        # The CPU tests' tensors are small; the other core runs the background checks.
        torch.set_num_threads(1)
    import harness

    if harness.IN_TREE:
        from vllm_rocm_asm_decode.plugin import vllm_carries_asm_decode

        if not vllm_carries_asm_decode():
            raise pytest.UsageError(
                "ASM_DECODE_TEST_FORM=in-tree needs a vLLM patched by "
                "`vllm-rocm-asm-decode upstream` on PYTHONPATH"
            )
    else:
        if REAL_ROCM:  # the hardware tests run the asm path: AITER on unless said off
            import os

            os.environ.setdefault("VLLM_ROCM_USE_AITER", "1")
            from vllm._aiter_ops import rocm_aiter_ops

            rocm_aiter_ops.refresh_env_variables()
        from vllm_rocm_asm_decode.plugin import register

        register()
    _freeze_the_heap()  # vLLM's modules, imported just now
    yield


@pytest.fixture
def kernels(monkeypatch):
    """Torch stand-ins for the HIP/Triton/cache-writer kernels; a clean asm-call log."""
    import harness

    log = harness.install_kernel_standins(monkeypatch)
    harness.reset_asm_calls()
    return log


class _Messages(list):
    """Log messages, with each one's level name at the same index of ``levels``."""

    def __init__(self) -> None:
        super().__init__()
        self.levels: list[str] = []


class _Records(logging.Handler):
    def __init__(self) -> None:
        super().__init__(logging.DEBUG)
        self.messages = _Messages()

    def emit(self, record: logging.LogRecord) -> None:
        self.messages.append(record.getMessage())
        self.messages.levels.append(record.levelname)


@pytest.fixture
def plugin_log():
    """Messages of the plugin's logger during one test, with vLLM's once-caches reset so
    every test sees its own lines."""
    from vllm import logger as vllm_logger

    from harness import LOGGER_NAME

    for fn in (
        vllm_logger._print_debug_once,
        vllm_logger._print_info_once,
        vllm_logger._print_warning_once,
    ):
        fn.cache_clear()
    handler = _Records()
    log = logging.getLogger(LOGGER_NAME)
    old_level = log.level
    log.setLevel(logging.DEBUG)
    log.addHandler(handler)
    yield handler.messages
    log.removeHandler(handler)
    log.setLevel(old_level)


@pytest.fixture
def aiter_version(monkeypatch):
    """Set the stand-in AITER's version (None: unknown; below 0.1.17 its kernel misreads
    block ids >= 65536 as AITER's did), with the trust switch unset and the kernel read
    afresh."""
    from vllm_rocm_asm_decode.kernel import load_asm_kernel

    def set_version(version: str | None) -> None:
        if version is None:
            monkeypatch.delenv("ASM_DECODE_TEST_AITER_VERSION", raising=False)
        else:
            monkeypatch.setenv("ASM_DECODE_TEST_AITER_VERSION", version)
        load_asm_kernel.cache_clear()

    monkeypatch.delenv("VLLM_ROCM_ASM_DECODE_TRUST_AITER", raising=False)
    yield set_version
    load_asm_kernel.cache_clear()


@pytest.fixture
def short_contexts(monkeypatch):
    """The self-test's accuracy probe on contexts up to 255 tokens: the CPU reference and
    contract model stay quick; the GPU runs the full list."""
    from vllm_rocm_asm_decode.tools.validation import selftest

    monkeypatch.setattr(selftest, "ACCURACY_CONTEXTS", (1, 15, 16, 17, 255))


@pytest.fixture
def hip_vm(monkeypatch):
    """The runtime's ``hipMem*`` path on the HIP stand-in (``standins/hip/hip_vm.c``,
    ROCm's checks, 4 KiB minimum granularity): scale tables on ``cpu`` tensors are then
    made as on an MI300X/MI355X, aliased over host memory. In-tree, the module stage 3
    writes into vLLM. Yields the stand-in's controls."""
    import importlib

    import hip_standin

    import harness

    name = (
        "vllm.v1.attention.backends.asm_scale_tables"
        if harness.IN_TREE
        else "vllm_rocm_asm_decode.asm_scale_tables"
    )
    standin = hip_standin.runtime_vm(monkeypatch, importlib.import_module(name))
    yield standin
    standin.configure()
