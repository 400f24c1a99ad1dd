"""The console script ``vllm-rocm-asm-decode``: loads the command line (:mod:`.cli`)
and runs it.

The command line takes Ctrl-C over once :func:`.cli.main` starts. A Ctrl-C that lands
earlier, while :mod:`.cli` and the standard modules it needs load (the first tens of
milliseconds), ends the command here with the same one line and exit 130, not a
traceback. Only this module and the two package ``__init__`` files, which import
nothing, load before the guard. Once the command has returned, see :func:`_end_quietly`.
"""

import sys

#: The command's exit status once it has returned; None before.
_status: int | None = None


def main() -> int:
    global _status
    import atexit

    # Registered before torch and vLLM load, so it runs after their exit handlers.
    atexit.register(_end_after_the_exit_handlers)
    try:
        from .cli import main as command
    except KeyboardInterrupt:
        try:  # stderr may be closed (``2>&-``) or gone
            newline = "\n" if sys.stderr.isatty() else ""  # after the terminal's ^C
            sys.stderr.write(f"{newline}vllm-rocm-asm-decode: interrupted\n")
            sys.stderr.flush()
        except (AttributeError, OSError, ValueError):
            pass
        return 130
    _status = command()
    _end_quietly(_status)
    return _status


def _end_quietly(code: int) -> None:
    """Once the command has said all it says, a Ctrl-C or SIGTERM while the exit
    handlers run (torch's and vLLM's: up to a second or two after ``plan`` or
    ``doctor``) ends the process at once with the command's own status and no word.
    Raised there, it printed tracebacks from exit handlers. A signal ignored or handled
    by the caller stays so."""
    import contextlib
    import signal

    def now(signum: int, frame: object) -> None:
        _exit(code)

    for sig in (signal.SIGINT, signal.SIGTERM):
        with contextlib.suppress(ValueError, OSError):  # not the main thread
            if signal.getsignal(sig) in (signal.default_int_handler, signal.SIG_DFL):
                signal.signal(sig, now)


def _end_after_the_exit_handlers() -> None:
    """The last exit handler: once the command has returned, the process ends here with
    its status. What Python would do after it (free every module's objects: over a
    second once torch and vLLM are loaded) has nothing left to say or write, and it puts
    the signal handlers back to the system's default, where a Ctrl-C killed the process
    without a word and turned ``doctor``'s exit 2 into 130."""
    if _status is not None:
        _exit(_status)


def _exit(code: int) -> None:
    import contextlib
    import os

    for stream in (sys.stdout, sys.stderr):
        with contextlib.suppress(Exception):
            stream.flush()
    os._exit(code)
