"""Progress on stderr: a line with the current step, the time spent and an ETA (redrawn
each second on a terminal, printed at each step's start elsewhere), and one line per
finished step."""

from __future__ import annotations

import contextlib
import sys
import threading
import time
from typing import TextIO

from .state import StepRecord
from .steps import Step


def duration(seconds: float) -> str:
    seconds = max(0, round(seconds))
    m, s = divmod(seconds, 60)
    h, m = divmod(m, 60)
    return f"{h}h{m:02d}m" if h else f"{m}m{s:02d}s"


class Progress:
    """ETA: the estimates of the steps left, scaled by how this invocation's finished
    steps compared with theirs."""

    WIDTH = 20

    def __init__(self, steps: list[Step], done: set[str], stream: TextIO | None = None) -> None:
        self.steps = steps
        self.done = set(done)
        self.stream = stream if stream is not None else sys.stderr
        self.tty = bool(getattr(self.stream, "isatty", lambda: False)())
        self.current: Step | None = None
        self.started = 0.0
        self.spent = 0.0
        self.estimated = 0.0
        self._stop = threading.Event()
        self._lock = threading.Lock()
        self._thread: threading.Thread | None = None

    def _say(self, text: str, end: str = "\n") -> None:
        with contextlib.suppress(OSError, ValueError):
            self.stream.write(text + end)
            self.stream.flush()

    def eta(self) -> float:
        scale = self.spent / self.estimated if self.estimated > 0 else 1.0
        left = sum(s.estimate_s for s in self.steps if s.name not in self.done)
        if self.current is not None:
            left -= min(self.current.estimate_s, time.monotonic() - self.started)
        return max(0.0, left * scale)

    def line(self) -> str:
        n, finished = len(self.steps), len(self.done)
        filled = round(self.WIDTH * finished / n) if n else self.WIDTH
        bar = "#" * filled + "-" * (self.WIDTH - filled)
        step = self.current
        what = f"{step.name}: {step.title}" if step else "done"
        spent = duration(time.monotonic() - self.started) if step else ""
        return f"[{bar}] {finished}/{n} {what} ({spent} in step, ETA {duration(self.eta())})"

    def _redraw(self) -> None:
        while not self._stop.wait(1.0):
            with self._lock:
                if self.current is not None:
                    self._say("\r\033[K" + self.line(), end="")

    def start(self, step: Step) -> None:
        with self._lock:
            self.current, self.started = step, time.monotonic()
            if self.tty:
                self._say("\r\033[K" + self.line(), end="")
                if self._thread is None:
                    self._thread = threading.Thread(target=self._redraw, daemon=True)
                    self._thread.start()
            else:
                self._say(self.line())

    def note(self, text: str) -> None:
        """One line of what the run does outside its steps."""
        with self._lock:
            self._say(text)

    def skip(self, step: Step, record: StepRecord) -> None:
        self._say(
            f"done    {step.name} (invocation {record.invocation}; "
            f"--redo {step.name} runs it again)"
        )

    def finish(self, step: Step, record: StepRecord, summary: str) -> None:
        with self._lock:
            self.done.add(step.name)
            self.spent += record.seconds
            self.estimated += step.estimate_s
            self.current = None
            status = "ok     " if record.ok else "FAILED "
            text = f"{status} {step.name} in {duration(record.seconds)}: {summary}"
            self._say(("\r\033[K" if self.tty else "") + text)

    def close(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=2)
        with self._lock:
            if self.tty and self.current is not None:
                self._say("\r\033[K", end="")
            self.current = None
