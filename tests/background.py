"""Subprocess checks that run beside the in-process tests.

Some checks need a process of their own (a fresh vLLM import, Triton's interpreter, the
installed command). Each is declared with the tests that need it and started once the
session knows which tests it runs (only for those that are selected), on a small thread
pool, so it runs while pytest's single thread works through the in-process tests; the
test that needs it waits for its result. Each check gets the environment as it was when
the session started (tests change ``os.environ`` as they go), runs its processes in a
session of their own, and is killed with its children when pytest finishes.

Python processes that only need vLLM imported fresh are forked from ``zygote.py``, which
has torch and Transformers imported already (``run(..., preloaded=True)``).
"""

from __future__ import annotations

import itertools
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
from collections.abc import Callable, Iterable, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any

#: For the checks' subprocesses: one compute thread each, so that they and pytest's own
#: process share the machine's cores instead of oversubscribing them.
ONE_THREAD = {"OMP_NUM_THREADS": "1", "MKL_NUM_THREADS": "1"}

#: What the checks' processes start under: the lowest CPU priority, so that pytest's own
#: process keeps a core whenever it has work. Each check runs in a session of its own,
#: which Linux schedules as a group of its own ("autogroup") whose priority a nice value
#: does not lower: the session's group is set apart, then the process's (plain
#: scripts/test on 2 cores, pytest's own time: 106-123 s at equal priority, 99-112 s with
#: nice alone, 97-101 s with both).
NICE = (
    ["sh", "-c", 'echo 19 > /proc/self/autogroup 2>/dev/null; exec nice -n 19 "$@"', "sh"]
    if shutil.which("nice")
    else []
)

#: Checks run at once: two beside pytest's own process for a whole run, where the checks
#: are most of the work; one for ``-m "not slow"`` (see :func:`set_workers`), where
#: pytest's process is and the checks would only slow it down.
_WORKERS = 2
_POOL: ThreadPoolExecutor | None = None


@dataclass(frozen=True)
class _Check:
    module: Path
    tests: frozenset[str]
    run: Callable[[dict[str, str]], Any]
    seconds: float
    slow: bool


_DECLARED: dict[str, _Check] = {}
_STARTED: dict[str, Future[Any]] = {}
_RUNNING: set[subprocess.Popen[str]] = set()
_ENV: dict[str, str] | None = None


def declare(
    name: str,
    module_file: str | Path,
    tests: Iterable[str],
    run: Callable[[dict[str, str]], Any],
    seconds: float,
    slow: bool = False,
) -> None:
    """A check that the named test functions of ``module_file`` need (a name with a
    parameter id, ``test_x[id]``, names that one case only). ``run(env)`` does it
    and returns its result (a failed check is a result the test asserts on; an exception
    is re-raised in the test). ``seconds``, about how long it takes, orders the start.
    ``slow``: its tests are marked ``slow`` (a run of ``-m "not slow"`` never starts it)."""
    module = Path(module_file).resolve()
    source = module.read_text()
    unknown = [t for t in tests if f"def {t.split('[')[0]}(" not in source]
    if unknown:  # a renamed test would silently never get its check
        raise ValueError(f"{module.name} has no test {', '.join(unknown)} for check {name}")
    _DECLARED[name] = _Check(module, frozenset(tests), run, seconds, slow)


def set_workers(count: int) -> None:
    """How many checks run at once; before any starts."""
    global _WORKERS
    assert _POOL is None, "checks have started"
    _WORKERS = count


def _pool() -> ThreadPoolExecutor:
    global _POOL
    if _POOL is None:
        _POOL = ThreadPoolExecutor(max_workers=_WORKERS, thread_name_prefix="background-check")
    return _POOL


def waits(module_file: str | Path, *names: str) -> bool:
    """Whether the test (its function name, or its name with a parameter id) waits for
    a check (such tests run last, so that the in-process tests keep the main thread busy
    while the checks run)."""
    module = Path(module_file).resolve()
    return any(c.module == module and c.tests & set(names) for c in _DECLARED.values())


def _start(needed: Callable[[_Check], bool]) -> None:
    """Start, longest first, every check not started yet that ``needed`` picks, with
    the environment as it is now."""
    global _ENV
    _ENV = dict(os.environ)
    for name, check in sorted(_DECLARED.items(), key=lambda kv: -kv[1].seconds):
        if name not in _STARTED and needed(check):
            _STARTED[name] = _pool().submit(check.run, dict(_ENV))


def start_for(selected: Iterable[tuple[Path, str]]) -> None:
    """Start every check a selected ``(module, test function or test name)`` needs."""
    wanted = set(selected)
    _start(lambda check: any((check.module, t) in wanted for t in check.tests))


def start_early(paths: Iterable[Path], slow: bool = True) -> None:
    """Start, before the session collects, every check whose test module lies under one
    of ``paths``. Only for a run that selects every test of the files it names (no -k,
    -m, --deselect, node ids...): then a check's tests are sure to run, and it gets the
    seconds collection takes (vLLM's import) on a core that would sit idle. ``slow``
    False: the run leaves out the tests marked slow, and so their checks."""
    roots = [p.resolve() for p in paths]
    _start(
        lambda check: (
            (slow or not check.slow)
            and any(check.module == r or r in check.module.parents for r in roots)
        )
    )


def result(name: str) -> Any:
    """The check's result, waiting for it (and starting it, if nothing did yet)."""
    if name not in _STARTED:
        _STARTED[name] = _pool().submit(_DECLARED[name].run, dict(_ENV or os.environ))
    return _STARTED[name].result()


def run(
    cmd: Sequence[str],
    env: dict[str, str],
    cwd: str | None = None,
    timeout: float = 900,
    preloaded: bool = False,
) -> subprocess.CompletedProcess[str]:
    """``subprocess.run`` in a session of its own, so that a timeout or the end of the
    test session stops the process and everything it started. ``preloaded``: ``cmd`` is
    ``[sys.executable, "-c" | "-m", ...]`` and runs as a child of the zygote."""
    if preloaded:
        assert cmd[0] == sys.executable and cmd[1] in ("-c", "-m"), cmd
        return _zygote().run(list(cmd), env, cwd, timeout)
    proc = subprocess.Popen(
        [*NICE, *cmd],
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


def _kill(proc: subprocess.Popen[Any]) -> None:
    try:
        os.killpg(proc.pid, signal.SIGKILL)
    except ProcessLookupError:
        pass


def _kill_group(pid: int) -> None:
    for kill, target in ((os.killpg, pid), (os.kill, pid)):
        try:
            kill(target, signal.SIGKILL)
            return
        except ProcessLookupError:
            continue


class _Zygote:
    """``zygote.py`` and the children it forks on request (see its docstring)."""

    def __init__(self, env: dict[str, str]) -> None:
        self._proc = subprocess.Popen(
            [*NICE, sys.executable, str(Path(__file__).with_name("zygote.py"))],
            env=env | ONE_THREAD,
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            start_new_session=True,
        )
        self._lock = threading.Lock()
        self._ids = itertools.count()
        self._started: dict[int, Future[tuple[int, Future[int]]]] = {}
        self._ended: dict[int, Future[int]] = {}
        self.children: set[int] = set()
        threading.Thread(target=self._read, name="zygote-reader", daemon=True).start()

    def _read(self) -> None:
        assert self._proc.stdout is not None
        for line in self._proc.stdout:
            message = json.loads(line)
            with self._lock:
                if "id" in message:
                    ended: Future[int] = Future()
                    self._ended[message["pid"]] = ended
                    self._started.pop(message["id"]).set_result((message["pid"], ended))
                else:
                    self._ended.pop(message["pid"]).set_result(message["code"])
        with self._lock:  # the zygote is gone: nothing pending will be answered
            for future in (*self._started.values(), *self._ended.values()):
                future.set_exception(RuntimeError("the zygote process ended"))
            self._started.clear()
            self._ended.clear()

    def run(
        self, cmd: list[str], env: dict[str, str], cwd: str | None, timeout: float
    ) -> subprocess.CompletedProcess[str]:
        with tempfile.TemporaryDirectory(prefix="zygote-child-") as folder:
            out, err = Path(folder, "stdout"), Path(folder, "stderr")
            started: Future[tuple[int, Future[int]]] = Future()
            with self._lock:
                request_id = next(self._ids)
                self._started[request_id] = started
                request = {"id": request_id, "argv": cmd[1:], "env": env, "cwd": cwd}
                request |= {"stdout": str(out), "stderr": str(err)}
                assert self._proc.stdin is not None
                self._proc.stdin.write((json.dumps(request) + "\n").encode())
                self._proc.stdin.flush()
            pid, ended = started.result(timeout=120)
            self.children.add(pid)
            note = ""
            try:
                code = ended.result(timeout=timeout)
            except TimeoutError:
                _kill_group(pid)
                code = ended.result(timeout=60)
                note = f"\n(killed after {timeout:.0f} s)"
            finally:
                self.children.discard(pid)
            read = lambda path: path.read_text(errors="backslashreplace")  # noqa: E731
            return subprocess.CompletedProcess(cmd, code, read(out), read(err) + note)

    def stop(self) -> None:
        for pid in list(self.children):
            _kill_group(pid)
        _kill(self._proc)


_ZYGOTE: _Zygote | None = None
_ZYGOTE_LOCK = threading.Lock()


def _zygote() -> _Zygote:
    global _ZYGOTE
    with _ZYGOTE_LOCK:
        if _ZYGOTE is None:
            _ZYGOTE = _Zygote(dict(_ENV or os.environ))
        return _ZYGOTE


def shutdown() -> None:
    """End of the session: drop checks not started, kill the running ones."""
    if _POOL is not None:
        _POOL.shutdown(wait=False, cancel_futures=True)
    for proc in list(_RUNNING):
        _kill(proc)
    if _ZYGOTE is not None:
        _ZYGOTE.stop()
