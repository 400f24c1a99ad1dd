"""Every script in ``benchmarks/`` runs at a smoke size and prints its table, so that none
rots unseen; no timing is asserted. And each uses only the package's public names."""

from __future__ import annotations

import ast
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


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["--jobs", "0"], "argument --jobs: 0: give 1 or more"),
        (["--timeout", "0"], "argument --timeout: 0: give more than 0"),
        (["--timeout", "nan"], "argument --timeout: nan: give more than 0"),
        (["--only", "no-such-mutant"], "no mutant id contains 'no-such-mutant'"),
    ],
    ids=["jobs-0", "timeout-0", "timeout-nan", "only-nothing"],
)
def test_the_mutation_runs_bad_arguments_are_one_line(argv, message):
    script = Path(__file__).resolve().parents[2] / "scripts" / "mutants.py"
    done = subprocess.run(
        [sys.executable, str(script), *argv], capture_output=True, text=True, timeout=60
    )
    assert done.returncode == 2 and done.stdout == "", done
    assert done.stderr.count("\n") == 1 and message in done.stderr, done.stderr
