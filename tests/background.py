"""Subprocess checks that run beside the in-process tests.

Some checks need a process of their own (a fresh vLLM import, Triton's interpreter, the
installed command). Each is declared by its test module and started as soon as the
session knows which tests it will run, on a small thread pool, so it runs while pytest's
single thread works through the in-process tests; the test that needs it then waits for
its result. A check whose tests are not selected never starts.
"""

from __future__ import annotations

from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor
from pathlib import Path
from typing import Any

_POOL = ThreadPoolExecutor(max_workers=2, thread_name_prefix="background-check")
_DECLARED: dict[str, tuple[Path, Callable[[], Any], float]] = {}
_STARTED: dict[str, Future[Any]] = {}


#: For the checks' subprocesses: one compute thread each, so that they and pytest's own
#: process share the machine's cores instead of oversubscribing them.
ONE_THREAD = {"OMP_NUM_THREADS": "1", "MKL_NUM_THREADS": "1"}


def declare(name: str, module_file: str, run: Callable[[], Any], seconds: float) -> None:
    """A check that the tests of ``module_file`` need; ``run`` does it and returns its
    result (it must not raise for a failed check: the test asserts on the result).
    ``seconds``, about how long it takes, orders the start: longest first."""
    _DECLARED[name] = (Path(module_file).resolve(), run, seconds)


def start_for(selected_files: set[Path]) -> None:
    """Start every declared check whose module has a selected test, longest first."""
    for name, (module, run, _) in sorted(_DECLARED.items(), key=lambda kv: -kv[1][2]):
        if module in selected_files and name not in _STARTED:
            _STARTED[name] = _POOL.submit(run)


def result(name: str) -> Any:
    """The check's result, waiting for it (and starting it, if nothing did yet)."""
    if name not in _STARTED:
        _STARTED[name] = _POOL.submit(_DECLARED[name][1])
    return _STARTED[name].result()
