"""How a command was stopped: by Ctrl-C (KeyboardInterrupt) or by SIGTERM, which the
command line raises as :class:`Terminated` so that every Ctrl-C path (servers stopped,
finished work kept) runs for it too, and what the command's last line calls each."""

from __future__ import annotations

import threading


class Terminated(KeyboardInterrupt):
    """SIGTERM (``timeout``, systemd, Slurm, ``kill``), taken as Ctrl-C is taken."""


#: Set once this run of the command has taken a SIGTERM (the command line's handler
#: sets it, then raises :class:`Terminated`).
sigterm_taken = threading.Event()


def stopped_by(terminated: bool | None = None) -> str:
    """What a command stopped by a SIGTERM, or else by a Ctrl-C, says it was; without
    ``terminated``, whether this run has taken a SIGTERM decides (a path that caught the
    signal and raised a plain KeyboardInterrupt after stopping its servers says it
    right too)."""
    if terminated is None:
        terminated = sigterm_taken.is_set()
    return "terminated (SIGTERM)" if terminated else "interrupted"
