"""What a reproduction keeps in ``--out DIR``, and what of it is done.

``DIR/reproduction.json``      what this is a reproduction of (a rerun must match)
``DIR/steps/NAME.json``        one finished step: ok or failed, its figures, its time
``DIR/files/NAME/``            what the step's tools wrote (result files, server logs)
``DIR/environment/N.json``     the environment of invocation N (1, 2, ... on resumes)
``DIR/report.md``, ``report.json``, ``DIR/plots/*.png``

Every file is written whole (a temporary file renamed into place), so a run killed at
any moment leaves each step either recorded or not.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import stat
import tempfile
from collections.abc import Iterable
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from .. import choices

OK, FAILED = "ok", "failed"


@dataclass
class StepRecord:
    name: str
    status: str
    seconds: float
    finished: str
    invocation: int
    result: dict[str, Any]
    error: str | None = None

    @property
    def ok(self) -> bool:
        return self.status == OK


def write_json(path: Path, data: Any) -> None:
    """``data`` into ``path`` whole, as :func:`write_text` writes."""
    write_text(path, json.dumps(data, indent=2) + "\n")


def write_text(path: Path, text: str) -> None:
    """``text`` into ``path`` whole: a temporary file beside it, with the mode a new
    file gets, renamed over it."""
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.")
    try:
        with contextlib.suppress(OSError):  # a file system without modes
            os.fchmod(fd, choices.new_file_mode())
        with os.fdopen(fd, "w", encoding="utf-8") as f:
            f.write(text)
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise


class Store:
    """The results directory of one reproduction."""

    def __init__(self, root: Path) -> None:
        self.root = root

    @property
    def settings_path(self) -> Path:
        return self.root / "reproduction.json"

    def step_path(self, name: str) -> Path:
        return self.root / "steps" / f"{name}.json"

    def files(self, name: str) -> Path:
        """The step's own directory for what its tools write."""
        return self.root / "files" / name

    def settings(self, fields: Iterable[str]) -> dict[str, Any] | None:
        """The settings ``reproduction.json`` holds; None where there is none. Raises
        ValueError (OSError where unreadable) for one this command did not write: not a
        regular file, over 1 MiB, not a JSON object of ``fields``."""
        try:
            if not stat.S_ISREG(os.stat(self.settings_path).st_mode):
                raise ValueError("not a regular file")
        except FileNotFoundError:
            return None
        with open(self.settings_path, "rb") as f:
            data = f.read(2**20 + 1)
        if len(data) > 2**20:
            raise ValueError("larger than 1 MiB")
        stored = json.loads(data.decode("utf-8"))
        if not isinstance(stored, dict) or stored.keys() != set(fields):
            raise ValueError("not the settings this command writes")
        return stored

    def save_settings(self, settings: dict[str, Any]) -> None:
        write_json(self.settings_path, settings)

    def record(self, name: str) -> StepRecord | None:
        """The step's record, or None when it has not finished (or its file is not one
        this command wrote, which counts as not finished)."""
        path = self.step_path(name)
        try:
            if not stat.S_ISREG(os.stat(path).st_mode):  # a FIFO would never end a read
                return None
            return StepRecord(**json.loads(path.read_text(encoding="utf-8")))
        except (OSError, ValueError, TypeError, RecursionError):
            return None

    def save(self, record: StepRecord) -> None:
        write_json(self.step_path(record.name), asdict(record))

    def forget(self, name: str) -> None:
        """``--redo``: the step's record and files go; it runs again."""
        self.step_path(name).unlink(missing_ok=True)
        shutil.rmtree(self.files(name), ignore_errors=True)

    def start_over(self, names: Iterable[str]) -> None:
        """A reproduction of other options that finished no step is replaced: its
        steps' records and files and its invocations' environments go."""
        for name in names:
            self.forget(name)
        for path in self._environment_files():
            path.unlink(missing_ok=True)

    def fresh_files(self, name: str) -> Path:
        """The step's files directory, emptied of an earlier unfinished attempt."""
        path = self.files(name)
        shutil.rmtree(path, ignore_errors=True)
        path.mkdir(parents=True)
        return path

    def environments(self) -> list[dict[str, Any]]:
        found = []
        for path in sorted(self._environment_files(), key=lambda p: int(p.stem)):
            try:
                if stat.S_ISREG(os.stat(path).st_mode):
                    found.append(json.loads(path.read_text(encoding="utf-8")))
            except (OSError, ValueError, RecursionError):
                continue
        return found

    def _environment_files(self) -> list[Path]:
        """``environment/<n>.json``, the files :meth:`begin` writes (no other)."""
        folder = self.root / "environment"
        return [p for p in folder.glob("*.json") if p.stem.isascii() and p.stem.isdigit()]

    def begin(self, environment: dict[str, Any]) -> int:
        """Record this invocation's environment; returns its number (1 for the first)."""
        number = max((int(p.stem) for p in self._environment_files()), default=0) + 1
        write_json(
            self.root / "environment" / f"{number}.json", environment | {"invocation": number}
        )
        return number
