"""``upstream DIR``: what a new user's tree holds where a file is read (trial 17): a FIFO,
a device, a file far past any vLLM source file's size or a dangling symlink, the version
file included, and the tree itself a dangling symlink: each one line on stderr naming
the path, exit 2, never a wait for ever nor a traceback. And the version file's lines
quoted as they are meant."""

from __future__ import annotations

import os
import resource
import shutil
import signal
import subprocess
import sys
from collections.abc import Iterator
from importlib.util import find_spec
from pathlib import Path

import pytest

from vllm_rocm_asm_decode.tools import upstream
from vllm_rocm_asm_decode.tools.cli import main

#: The files ``upstream`` reads from a tree (the ones it edits, and the version file).
READ = (
    upstream.ROCM_ATTN,
    upstream.AITER_OPS,
    upstream.ATTENTION_CONFIG,
    upstream.PAGED_DECODE,
    upstream.ROCM_AITER_FA,
    Path("vllm/envs.py"),
    Path("vllm/_version.py"),
)
VERSION = Path("vllm/_version.py")


@pytest.fixture
def tree(tmp_path: Path) -> Path:
    """The files ``upstream`` reads, copied from the installed vLLM 0.33."""
    spec = find_spec("vllm")
    assert spec is not None and spec.origin is not None
    installed = Path(spec.origin).parent.parent
    root = tmp_path / "vllm-src"
    for rel in READ:
        (root / rel).parent.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(installed / rel, root / rel)
    return root


class _WaitedError(Exception):
    """A read that waited past the test's patience (not an OSError: the code under test
    must not take it for one of its own)."""


@pytest.fixture
def patience() -> Iterator[None]:
    """A read that waits for ever (a FIFO with no writer) fails the test after 20 s."""

    def give_up(signum: int, frame: object) -> None:
        raise _WaitedError("upstream waited on a read for 20 s")

    previous = signal.signal(signal.SIGALRM, give_up)
    signal.alarm(20)
    try:
        yield
    finally:
        signal.alarm(0)
        signal.signal(signal.SIGALRM, previous)


def run(capsys, *argv: str) -> tuple[int, str, str]:
    code = main(["upstream", *argv])
    out, err = capsys.readouterr()
    return code, out, err


def one_line(capsys, *argv: str) -> str:
    """The one line on stderr of a run that exits 2 and prints nothing else."""
    code, out, err = run(capsys, *argv)
    assert code == 2 and out == "" and err.count("\n") == 1, (code, out, err)
    return err


@pytest.mark.parametrize("argv", [(), ("--check",)], ids=["apply", "check"])
def test_a_fifo_at_the_version_file_is_refused_not_waited_on(tree, capsys, patience, argv):
    (tree / VERSION).unlink()
    os.mkfifo(tree / VERSION)
    err = one_line(capsys, str(tree), *argv)
    assert f"{tree / VERSION} is not a regular file (a FIFO, a device or a socket)" in err, err


@pytest.mark.parametrize("argv", [(), ("--check",)], ids=["apply", "check"])
def test_a_dangling_symlink_at_the_version_file_is_named_so(tree, capsys, argv):
    (tree / VERSION).unlink()
    (tree / VERSION).symlink_to(tree / "gone.py")
    err = one_line(capsys, str(tree), *argv)
    assert f"{tree / VERSION} is a dangling symlink (to {tree / 'gone.py'})" in err, err
    assert "cannot tell which vLLM" not in err


def test_a_dangling_symlink_given_for_the_tree_is_named_so(tmp_path, capsys):
    link = tmp_path / "checkout"
    link.symlink_to(tmp_path / "moved")
    err = one_line(capsys, str(link), "--check")
    assert f"{link} is a dangling symlink (to {tmp_path / 'moved'}), not a directory" in err
    assert "does not exist" not in err


def _limit_memory() -> None:
    resource.setrlimit(resource.RLIMIT_AS, (3 * 2**30, 3 * 2**30))


@pytest.mark.parametrize(
    ("rel", "make", "says"),
    [
        (
            VERSION,
            lambda path: path.symlink_to("/dev/zero"),
            "is not a regular file (a FIFO, a device or a socket)",
        ),
        (
            upstream.ROCM_ATTN,
            lambda path: os.truncate(path, 4 * 2**30),  # sparse: no disk taken
            "is larger than 16 MiB",
        ),
    ],
    ids=["version-file-links-to-dev-zero", "rocm-attn-sparse-4-gib"],
)
@pytest.mark.parametrize("argv", [(), ("--check",)], ids=["apply", "check"])
def test_a_device_or_a_huge_file_is_one_line_under_a_memory_limit(tree, rel, make, says, argv):
    """Read whole, either fills memory: under a 3 GiB limit a MemoryError traceback. Both
    are refused before anything is read, in a process of their own (the limit)."""
    path = tree / rel
    if rel == VERSION:  # replaced by a link
        path.unlink()
    make(path)
    done = subprocess.run(
        [sys.executable, "-m", "vllm_rocm_asm_decode", "upstream", str(tree), *argv],
        capture_output=True,
        text=True,
        timeout=120,
        preexec_fn=_limit_memory,
    )
    assert done.returncode == 2 and done.stdout == "", done
    assert done.stderr.count("\n") == 1 and "Traceback" not in done.stderr, done.stderr
    assert f"{path} {says}" in done.stderr, done.stderr
    # The version file is the build's (no git checkout brings it); vLLM's own file goes
    # back where the change edits it (moved aside, it would be missing).
    fix = "pip install -e ." if rel == VERSION else "put vLLM 0.33's own file back"
    assert fix in done.stderr and "aside" not in done.stderr, done.stderr


def test_every_file_is_read_up_to_the_cap_only(tree, capsys, monkeypatch):
    """The cap holds for each file read, the version file (read first) included."""
    monkeypatch.setattr(upstream, "MAX_FILE_BYTES", 64)
    err = one_line(capsys, str(tree), "--check")
    assert f"{tree / VERSION} is larger than " in err, err


def test_an_empty_version_quotes_its_assignment_not_its_annotation(tree, capsys):
    """setuptools-scm writes ``version: str`` above the assignment: the line to quote is
    the one that gives no version."""
    text = (tree / VERSION).read_text()
    (tree / VERSION).write_text(text.replace("version = '0.33.0'", "version = ''"))
    err = one_line(capsys, str(tree), "--check")
    assert "gives no version string (\"__version__ = version = ''\";" in err, err
    assert "'version: str'" not in err


@pytest.mark.parametrize("version", ["0.34.0", "0.33.abc", "0.33.\u0663", "0.330.0"])
def test_another_vllm_version_says_what_to_do(tree, capsys, version):
    """(trial 26) 0.33.abc and an Arabic-Indic digit passed as 0.33."""
    (tree / VERSION).write_text(f"__version__ = version = '{version}'\n")
    err = one_line(capsys, str(tree), "--check")
    said = f"is vLLM {version} (from vllm/_version.py); this change is written for vLLM 0.33.x"
    assert said in err and "git checkout v0.33.0" in err, err


@pytest.mark.parametrize("version", ["0.33.0+rocm722", "0.33.1.dev5+g1a2b", "0.33rc1", "v0.33.0"])
def test_a_033_version_in_any_form_is_taken(tree, capsys, version):
    """(trial 26) "v0.33.0" was refused as not 0.33, in a line that named it."""
    (tree / VERSION).write_text(f"__version__ = version = '{version}'\n")
    assert upstream.check_tree(tree, 1) == version
