"""The console script ``vllm-rocm-asm-decode``: loads the command line (:mod:`.cli`)
and runs it.

The command line takes Ctrl-C over once :func:`.cli.main` starts. A Ctrl-C that lands
earlier, while :mod:`.cli` and the standard modules it needs load (the first tens of
milliseconds), ends the command here with the same one line and exit 130, not a
traceback. Only this module and the two package ``__init__`` files, which import
nothing, load before the guard.
"""

import sys


def main() -> int:
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
    return command()
