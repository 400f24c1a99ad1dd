"""Subprocess checks that run beside the in-process tests.

Some checks need a process of their own (a fresh vLLM import, Triton's interpreter, the
installed command). Each is declared with the tests that need it and started once the
session knows which tests it runs (only for those that are selected), on a small thread
pool, so it runs while pytest's single thread works through the in-process tests; the
test that needs it waits for its result. Each check gets the environment as it was when
the session started (tests change ``os.environ`` as they go), runs its processes in a
session of their own, and is killed with its children when pytest finishes.
"""

from __future__ import annotations

import os
import signal
import subprocess
from collections.abc import Callable, Iterable, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any

#: For the checks' subprocesses: one compute thread each, so that they and pytest's own
#: process share the machine's cores instead of oversubscribing them.
ONE_THREAD = {"OMP_NUM_THREADS": "1", "MKL_NUM_THREADS": "1"}

_POOL = ThreadPoolExecutor(max_workers=2, thread_name_prefix="background-check")


@dataclass(frozen=True)
class _Check:
    module: Path
    tests: frozenset[str]
    run: Callable[[dict[str, str]], Any]
    seconds: float


_DECLARED: dict[str, _Check] = {}
_STARTED: dict[str, Future[Any]] = {}
_RUNNING: set[subprocess.Popen[str]] = set()
_ENV: dict[str, str] | None = None


def declare(
    name: str,
    module_file: str,
    tests: Iterable[str],
    run: Callable[[dict[str, str]], Any],
    seconds: float,
) -> None:
    """A check that the named test functions of ``module_file`` need. ``run(env)`` does it
    and returns its result (a failed check is a result the test asserts on; an exception
    is re-raised in the test). ``seconds``, about how long it takes, orders the start."""
    module = Path(module_file).resolve()
    source = module.read_text()
    unknown = [t for t in tests if f"def {t}(" not in source]
    if unknown:  # a renamed test would silently never get its check
        raise ValueError(f"{module.name} has no test {', '.join(unknown)} for check {name}")
    _DECLARED[name] = _Check(module, frozenset(tests), run, seconds)


def waits(module_file: str | Path, test: str) -> bool:
    """Whether the test waits for a check (such tests run last, so that the in-process
    tests keep the main thread busy while the checks run)."""
    module = Path(module_file).resolve()
    return any(c.module == module and test in c.tests for c in _DECLARED.values())


def start_for(selected: Iterable[tuple[Path, str]]) -> None:
    """Start, longest first, every check a selected ``(module, test function)`` needs."""
    global _ENV
    _ENV = dict(os.environ)
    wanted = set(selected)
    for name, check in sorted(_DECLARED.items(), key=lambda kv: -kv[1].seconds):
        if name not in _STARTED and any((check.module, t) in wanted for t in check.tests):
            _STARTED[name] = _POOL.submit(check.run, dict(_ENV))


def result(name: str) -> Any:
    """The check's result, waiting for it (and starting it, if nothing did yet)."""
    if name not in _STARTED:
        _STARTED[name] = _POOL.submit(_DECLARED[name].run, dict(_ENV or os.environ))
    return _STARTED[name].result()


def run(
    cmd: Sequence[str], env: dict[str, str], cwd: str | None = None, timeout: float = 900
) -> subprocess.CompletedProcess[str]:
    """``subprocess.run`` in a session of its own, so that a timeout or the end of the
    test session stops the process and everything it started."""
    proc = subprocess.Popen(
        list(cmd),
        env=env,
        cwd=cwd,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        start_new_session=True,
    )
    _RUNNING.add(proc)
    try:
        out, err = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        _kill(proc)
        out, err = proc.communicate()
        err += f"\n(killed after {timeout:.0f} s)"
    finally:
        _RUNNING.discard(proc)
    return subprocess.CompletedProcess(proc.args, proc.returncode, out, err)


def _kill(proc: subprocess.Popen[str]) -> None:
    try:
        os.killpg(proc.pid, signal.SIGKILL)
    except ProcessLookupError:
        pass


def shutdown() -> None:
    """End of the session: drop checks not started, kill the running ones."""
    _POOL.shutdown(wait=False, cancel_futures=True)
    for proc in list(_RUNNING):
        _kill(proc)
