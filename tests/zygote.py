"""The parent of the checks' Python processes (see ``background.run(preloaded=True)``).

Every check that runs Python imports torch (with dynamo and inductor, which vLLM pulls in
at import) and Transformers before anything of its own: about four seconds of CPU each,
a dozen times a session on two cores. This process imports them once, then forks one
child per request, which becomes what ``python -c CODE`` or ``python -m MODULE`` would
be: a session of its own, the request's working directory, environment, ``sys.path``
(``PYTHONPATH`` first) and argv, stdin from /dev/null, stdout and stderr to the request's
files. Nothing of vLLM, this package or the tests is imported here, so each child
imports those fresh, with its own environment.

Only what reads no setting the checks vary is preloaded: torch reads its thread count
when it loads (every check runs with one thread, this process too); Hugging Face's offline
switch is the session's in every check. Triton, which inductor loads, defines its own
library kernels then, compiled or interpreted by ``TRITON_INTERPRET``: a check that runs
Triton's interpreter keeps a process of its own.

Protocol, one JSON object per line. In (stdin): ``{"id", "argv", "env", "cwd", "stdout",
"stderr"}``, argv without the interpreter. Out (stdout): ``{"id", "pid"}`` once the child
is forked, then ``{"pid", "code"}`` when it ends. End of stdin ends this process.
"""

from __future__ import annotations

import contextlib
import gc
import json
import os
import select
import signal
import sys

PRELOAD = ("torch", "torch._dynamo", "torch._inductor", "transformers")


def _child(request: dict, wakeup: tuple[int, int], own_path: list[str]) -> None:
    """In the forked child: become the requested process; never returns."""
    code: object = 1
    try:
        os.setsid()
        with contextlib.suppress(OSError):  # its session's group too (background.NICE)
            with open("/proc/self/autogroup", "w") as group:
                group.write("19")
        signal.set_wakeup_fd(-1)
        signal.signal(signal.SIGCHLD, signal.SIG_DFL)
        for fd in wakeup:
            os.close(fd)
        os.dup2(os.open(os.devnull, os.O_RDONLY), 0)
        for fd, path in ((1, request["stdout"]), (2, request["stderr"])):
            os.dup2(os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600), fd)
        sys.stdin = sys.__stdin__ = open(0, closefd=False)
        sys.stdout = sys.__stdout__ = open(1, "w", buffering=1, closefd=False)
        sys.stderr = sys.__stderr__ = open(
            2, "w", buffering=1, errors="backslashreplace", closefd=False
        )
        os.chdir(request["cwd"] or os.getcwd())
        os.environ.clear()
        os.environ.update(request["env"])
        flag, target, *args = request["argv"]
        extra = [p for p in os.environ.get("PYTHONPATH", "").split(os.pathsep) if p]
        # As the interpreter builds it: '' for -c, the working directory for -m, then
        # PYTHONPATH, then the standard and site folders (this file's folder left out).
        sys.path[:] = ["" if flag == "-c" else os.getcwd(), *extra, *own_path]
        sys.path_importer_cache.clear()
        import importlib

        importlib.invalidate_caches()
        try:
            if flag == "-c":
                import builtins
                import types

                main = types.ModuleType("__main__")
                main.__dict__["__builtins__"] = builtins
                sys.modules["__main__"] = main
                sys.argv = ["-c", *args]
                exec(compile(target, "<string>", "exec"), main.__dict__)
            elif flag == "-m":
                import runpy

                sys.argv = [target, *args]
                runpy.run_module(target, run_name="__main__", alter_sys=True)
            else:
                raise SystemExit(f"zygote: only -c and -m, not {flag}")
            code = 0
        except SystemExit as exc:
            code = exc.code
        except BaseException:
            import traceback

            traceback.print_exc()
            code = 1
        import atexit

        atexit._run_exitfuncs()
    finally:
        if code is None:
            code = 0
        elif not isinstance(code, int):
            print(code, file=sys.stderr)
            code = 1
        for stream in (sys.stdout, sys.stderr):
            try:
                stream.flush()
            except Exception:
                pass
        os._exit(code)


def main() -> None:
    for name in PRELOAD:
        __import__(name)
    # What was preloaded stays out of the children's collector passes (which would walk
    # it through every full pass of vLLM's import); the collector then writes none of its
    # pages, so the children copy fewer of them.
    gc.collect()
    gc.freeze()
    here = os.path.dirname(os.path.abspath(__file__))
    inherited = [p for p in os.environ.get("PYTHONPATH", "").split(os.pathsep) if p]
    own_path = [p for p in sys.path[1:] if p not in inherited and p != here]
    wake_r, wake_w = os.pipe()
    os.set_blocking(wake_r, False)
    os.set_blocking(wake_w, False)
    signal.set_wakeup_fd(wake_w)
    signal.signal(signal.SIGCHLD, lambda *_: None)
    stdin, stdout = sys.stdin.fileno(), sys.stdout.fileno()

    def say(message: dict) -> None:
        os.write(stdout, (json.dumps(message) + "\n").encode())

    def reap() -> None:
        while True:
            try:
                pid, status = os.waitpid(-1, os.WNOHANG)
            except ChildProcessError:
                return
            if pid == 0:
                return
            say({"pid": pid, "code": os.waitstatus_to_exitcode(status)})

    pending = b""
    while True:
        ready, _, _ = select.select([stdin, wake_r], [], [])
        if wake_r in ready:
            while True:
                try:
                    if not os.read(wake_r, 512):
                        break
                except BlockingIOError:
                    break
        if stdin in ready:
            data = os.read(stdin, 1 << 16)
            if not data:
                return
            pending += data
            while b"\n" in pending:
                line, pending = pending.split(b"\n", 1)
                request = json.loads(line)
                pid = os.fork()
                if pid == 0:
                    _child(request, (wake_r, wake_w), own_path)
                say({"id": request["id"], "pid": pid})
        reap()


if __name__ == "__main__":
    main()
