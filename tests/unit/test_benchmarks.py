"""Every script in ``benchmarks/`` runs at a smoke size and prints its table, so that none
rots unseen; no timing is asserted. And each uses only the package's public names."""

from __future__ import annotations

import ast
import os
import subprocess
import sys
from pathlib import Path

import pytest

import background

BENCHMARKS = Path(__file__).resolve().parents[2] / "benchmarks"

#: Each script, its smoke-size arguments, and the header its table starts with.
SMOKE = {
    "host_overhead.py": (
        ["--repeats", "1", "--calls", "2"],
        ["| model | heads | seqs | what | plugin kernel |", "the reload check takes"],
    ),
    "kernel_time_fit.py": ([], ["| heads | ctx | seqs | HIP | model |"]),
    "scale_table_memory.py": (
        ["--standin", "--blocks", "32768", "--layers", "2", "--repeats", "1"],
        ["| kind | tables | table MiB |", "| aliased | 4 |", "| allocated | 4 |"],
    ),
}


def _run(script: str):
    def run(env: dict[str, str]):
        args, _ = SMOKE[script]
        return background.run(
            [sys.executable, str(BENCHMARKS / script), *args],
            env | background.ONE_THREAD,
            timeout=600,
        )

    return run


for _script in SMOKE:
    background.declare(
        f"benchmark-{_script}",
        __file__,
        ["test_a_benchmark_runs_at_smoke_size"],
        _run(_script),
        seconds=90 if _script == "host_overhead.py" else 15,
        slow=True,
    )


def test_every_benchmark_has_a_smoke_run():
    assert sorted(SMOKE) == sorted(p.name for p in BENCHMARKS.glob("*.py"))


@pytest.mark.slow
@pytest.mark.parametrize("script", sorted(SMOKE))
def test_a_benchmark_runs_at_smoke_size(script):
    done = background.result(f"benchmark-{script}")
    assert done.returncode == 0, done.stderr[-3000:]
    for header in SMOKE[script][1]:
        assert header in done.stdout, done.stdout[-3000:]


def _private_uses(path: Path) -> list[str]:
    """Names starting with one underscore that the script imports from the package or
    reads as attributes (``x._name``)."""
    found = []
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.ImportFrom) and (node.module or "").startswith(
            "vllm_rocm_asm_decode"
        ):
            found += [a.name for a in node.names if a.name.startswith("_")]
            found += [p for p in (node.module or "").split(".") if p.startswith("_")]
        elif isinstance(node, ast.Attribute) and node.attr.startswith("_"):
            if not node.attr.startswith("__"):
                found.append(node.attr)
    return found


@pytest.mark.parametrize("script", sorted(SMOKE))
def test_a_benchmark_uses_only_public_names(script):
    assert _private_uses(BENCHMARKS / script) == []


# scripts/mutants.py and scripts/test: their refusals and their help

MUTANTS = Path(__file__).resolve().parents[2] / "scripts" / "mutants.py"
SCRIPTS = MUTANTS.parent


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["--jobs", "0"], "argument --jobs: 0: give 1 or more"),
        (["--timeout", "0"], "argument --timeout: 0: give more than 0"),
        (["--timeout", "nan"], "argument --timeout: nan: give more than 0"),
        (["--only", "no-such-mutant"], "no mutant id contains 'no-such-mutant'"),
        # One part that matches nothing ran the others alone, without a word.
        (["--only", "skew,zzzz"], "no mutant id contains 'zzzz'"),
        # An empty part matched every id: the whole run started.
        (["--only", ""], "argument --only: '': give parts of mutant ids"),
        (["--only", "skew,"], "argument --only: 'skew,': give parts of mutant ids"),
        (["--target", "abc"], "argument --target: 'abc' is not a kill rate in %"),
        (["--target", "nan"], "argument --target: nan: give a kill rate from 0 to 100"),
        (["--target", "101"], "argument --target: 101: give a kill rate from 0 to 100"),
    ],
    ids=[
        "jobs-0",
        "timeout-0",
        "timeout-nan",
        "only-nothing",
        "only-one-part-unmatched",
        "only-empty",
        "only-empty-part",
        "target-abc",
        "target-nan",
        "target-101",
    ],
)
def test_the_mutation_runs_bad_arguments_are_one_line(argv, message):
    done = subprocess.run(
        [sys.executable, str(MUTANTS), *argv], capture_output=True, text=True, timeout=60
    )
    assert done.returncode == 2 and done.stdout == "", done
    assert done.stderr.count("\n") == 1 and message in done.stderr, done.stderr


def test_the_mutation_runs_help_is_its_whole_description():
    """(trial) --help stopped mid-sentence: it gave the docstring's first line only."""
    done = subprocess.run(
        [sys.executable, str(MUTANTS), "--help"], capture_output=True, text=True, timeout=60
    )
    assert (done.returncode, done.stderr) == (0, ""), done
    assert "exit 1 below\n``--target`` (default 95 %)." in done.stdout
    assert "is reported as stale (the code\nmoved): update it." in done.stdout


@pytest.mark.parametrize("flag", ["-h", "--help"])
def test_the_test_scripts_help_runs_nothing(flag, tmp_path):
    """(trial) scripts/test --help ran ruff over the checkout, then pytest --help. Were the
    checks to start, the missing $VENV and PYTHON=false would stop them at once (exit 1)."""
    env = dict(os.environ, VENV=str(tmp_path / "no-venv"), PYTHON="false")
    done = subprocess.run(
        [str(SCRIPTS / "test"), flag], capture_output=True, text=True, timeout=60, env=env
    )
    assert (done.returncode, done.stderr) == (0, ""), done
    lines = done.stdout.splitlines()
    assert lines[0] == "usage: scripts/test [--all] [pytest arguments]"
    assert "The other arguments go to pytest" in done.stdout
    assert not (tmp_path / "no-venv").exists()
