"""``bench kernel`` and ``check accuracy``: what runs without an AMD GPU."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
from pathlib import Path

import pytest
import torch

from conftest import REAL_ROCM
from vllm_rocm_asm_decode.tools.cli import main
from vllm_rocm_asm_decode.tools.validation import accuracy as acc
from vllm_rocm_asm_decode.tools.validation import kernel_bench as kb


def test_default_grid_is_the_seeds():
    cases = kb.grid(None, None, None)
    assert len(cases) == 12
    assert {(h, k) for h, k, _, _ in cases} == {(40, 8), (32, 8)}
    assert {n for h, _, _, n in cases if h == 32} == {24, 64, 256}
    assert {n for h, _, _, n in cases if h == 40} == {16, 64, 256}
    assert {c for _, _, c, _ in cases} == {1024, 4096}


def timings(pairs, heads=40):
    return [kb.Timing(heads, 8, 4096, n, hip, asm) for n, (hip, asm) in pairs.items()]


def test_crossover_and_suggested_cut():
    # The seed's shape at ctx 4096: asm slower for 1-4 sequences, faster from 16 on.
    t = timings(
        {
            1: (8.0, 20.0),
            4: (10.7, 20.6),
            8: (14.0, 15.0),
            16: (26.7, 22.5),
            64: (130.1, 95.1),
            256: (448.3, 363.0),
        }
    )
    assert kb.crossover(t) == 16
    assert kb.suggested_cut(t) == 8 * 40  # asm from 9 sequences of 40 heads on
    text = kb.render(t, "uhp", True, 512)
    assert "asm faster from 16 sequences (640 query heads)" in text
    assert "VLLM_ROCM_ASM_DECODE_CUT=320" in text and "| 40/8 | 4096 | 16 | 640 |" in text


def test_crossover_needs_asm_to_stay_faster():
    t = timings({8: (10.0, 9.0), 16: (20.0, 21.0), 32: (40.0, 30.0)})
    assert kb.crossover(t) == 32
    assert kb.crossover(timings({8: (1.0, 2.0), 16: (2.0, 3.0)})) is None
    assert kb.suggested_cut(timings({8: (1.0, 2.0)})) is None
    assert kb.suggested_cut(timings({1: (2.0, 1.0), 2: (3.0, 1.0)})) == 0


#: These check what the tools do where no AMD GPU is; tests/rocm and the AMD CI steps
#: run the tools themselves on one.
without_amd_gpu = pytest.mark.skipif(REAL_ROCM, reason="checks the behaviour without an AMD GPU")


@without_amd_gpu
@pytest.mark.parametrize("command", [["bench", "kernel"], ["bench", "kernel", "--sweep"]])
def test_bench_kernel_without_an_amd_gpu_exits_2_in_one_line(command, capsys):
    assert main(command) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "needs a gfx942/gfx950 GPU with AITER" in err[0]


def test_kernel_plot(tmp_path):
    from vllm_rocm_asm_decode.tools.validation.plots import plot_kernel

    plot_kernel(timings({16: (26.7, 22.5), 64: (130.1, 95.1)}), 512, str(tmp_path / "k.png"))
    assert (tmp_path / "k.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


@without_amd_gpu
def test_accuracy_contract_mode_passes_and_says_what_it_checks(tmp_path, capsys):
    assert main(["check", "accuracy", "--json", str(tmp_path / "a.json")]) == 0
    out = capsys.readouterr().out.splitlines()
    assert "contract model" in out[0] and "no precision modes, no HIP kernel" in out[0]
    data = json.loads((tmp_path / "a.json").read_text())
    rows = data["rows"]
    assert data["probes"] == []  # the backend probes need the GPU
    assert {(r["num_heads"], r["num_kv_heads"], r["query_dtype"]) for r in rows} == {
        (40, 8, "bf16"),
        (32, 4, "bf16"),
    }
    assert all(r["max_abs"] <= acc.MAX_TOL and r["mean_abs"] <= acc.MEAN_TOL for r in rows)
    assert out[-1].endswith("within tolerance")


def test_accuracy_catches_a_layout_mistake():
    """V handed over without the shuffled view's dense pages (V read as K) is caught."""
    from vllm_rocm_asm_decode.kernel_table import fallback_table
    from vllm_rocm_asm_decode.tools.contract_model import PagedAttentionAsmModel

    model = PagedAttentionAsmModel(fallback_table("gfx950"))
    fp8 = torch.float8_e4m3fn

    def wrong(case):
        out = torch.empty_like(case.query)
        blocks, kvh = case.key_cache.shape[:2]
        model(
            case.query,
            case.key_cache.view(fp8),
            case.key_cache.view(fp8).view(blocks, kvh, 1, 128, 16),
            case.block_table,
            case.seq_lens,
            case.block_table.stride(0),
            K_QScale=torch.full((blocks, kvh, 16), acc.K_SCALE),
            V_QScale=torch.full((blocks, kvh, 16), acc.V_SCALE),
            out_=out,
            high_precision=2,
        )
        return out

    rows = acc.measure({"wrong": wrong}, [(40, 8)], [0], [17, 255], "cpu", fp8)
    assert acc.verdict(rows, "wrong")


def test_passkey_prompts_hide_the_key_and_scoring_finds_it():
    import random

    from vllm_rocm_asm_decode.tools.validation import passkey

    rng = random.Random(0)
    p = passkey.make_prompt(8000, rng)
    assert p.text.count(p.passkey) == 2 and len(p.passkey) == 5
    assert 6000 < len(p.text.split()) * 1.3 < 12000  # about the target length in tokens
    assert passkey.passed(p, f" {p.passkey}.") and not passkey.passed(p, " 12")


def test_passkey_without_a_server_is_a_clear_error(capsys):
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    code = main(
        [
            "check",
            "passkey",
            "--model",
            "m",
            "--base-url",
            f"http://127.0.0.1:{port}",
            "--lengths",
            "100",
            "--prompts",
            "1",
            "--timeout",
            "5",
        ]
    )
    assert code == 2 and "check passkey: error" in capsys.readouterr().err


def test_amd_ci_pipeline_runs_the_hardware_tests_and_checks_on_both_families():
    from pathlib import Path

    import yaml

    pipeline = yaml.safe_load(
        (Path(__file__).resolve().parents[2] / ".buildkite" / "test-amd.yaml").read_text()
    )
    pools = {s["agent_pool"]: " ".join(s["commands"]) for s in pipeline["steps"]}
    assert set(pools) == {"mi300_1", "mi355_1"}
    for commands in pools.values():
        assert "pytest -v tests/rocm" in commands and "check accuracy" in commands


@pytest.mark.parametrize(
    ("where", "says"),
    [
        ("/nonexistent/dir/x.json", ": /nonexistent/dir does not exist"),
        ("DIR", " is a directory; give a file name"),
    ],
    ids=["no-dir", "a-dir"],
)
def test_accuracy_json_path_is_checked_before_the_run(where, says, tmp_path, capsys):
    path = str(tmp_path) if where == "DIR" else where
    assert main(["check", "accuracy", "--json", path]) == 2
    captured = capsys.readouterr()
    err = captured.err.strip().splitlines()
    assert len(err) == 1 and err[0].endswith(f"--json {path}{says}"), err
    assert captured.out == ""  # nothing ran


def skew_timings(ratios: dict[int, tuple[float, float]]) -> list[kb.SkewTiming]:
    return [kb.SkewTiming(40, 8, 1024, 127, long, hip, asm) for long, (hip, asm) in ratios.items()]


def test_the_skew_crossover_and_the_ratio_it_suggests():
    t = skew_timings({2048: (70.0, 60.0), 4096: (72.0, 66.0), 8192: (75.0, 80.0), 16384: (80, 99)})
    faster, slower = kb.skew_crossover(t)
    assert (faster.long, slower.long) == (4096, 8192)
    # head-tokens per long token: (4096 + 127 * 1024) * 8 / 4096 = 262.0 and
    # (8192 + 127 * 1024) * 8 / 8192 = 135.0; their geometric mean 188.07
    assert kb.suggested_skew(t) == 188
    assert "suggested VLLM_ROCM_ASM_DECODE_SKEW=188 (built in: 67)" in kb.render_skew(t, "uhp", 67)
    # asm faster again further out: no crossover is claimed
    assert kb.skew_crossover(skew_timings({2048: (1, 0.5), 8192: (1, 2), 16384: (1, 0.9)})) is None


def test_bench_kernel_skew_writes_its_plot(tmp_path, monkeypatch, capsys):
    """--skew --plot: the PNG of the skew timings, written before the table is printed
    (the timing itself needs an AMD GPU: stood in here)."""
    t = skew_timings({2048: (70.0, 60.0), 8192: (75.0, 80.0)})
    monkeypatch.setattr(kb, "rocm_gpu_problem", lambda: None)
    monkeypatch.setattr(kb, "skew_setup", lambda args: ((40, 8), 1024, 127, [2048, 8192]))
    monkeypatch.setattr(kb, "measure_skew", lambda heads, short, count, long, *_: t[long > 2048])
    png = tmp_path / "skew.png"
    assert main(["bench", "kernel", "--skew", "--plot", str(png)]) == 0
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert "crossover: asm slower from one sequence of 8192 tokens on" in capsys.readouterr().out


# --------------------------------------------------------------------------------------
# scripts/aiter-pa-addressing: how AITER's shipped decode kernels address the KV pages

ADDRESSING = Path(__file__).resolve().parents[2] / "scripts" / "aiter-pa-addressing"


@pytest.mark.parametrize(
    ("argv", "says"),
    [
        ([], "usage: scripts/aiter-pa-addressing AITER_GIT [REV]"),
        (["/nonexistent"], "scripts/aiter-pa-addressing: /nonexistent is not a git repository"),
        (
            ["-x"],
            "scripts/aiter-pa-addressing: unknown option -x"
            " (usage: scripts/aiter-pa-addressing AITER_GIT [REV])",
        ),
        (
            ["/nonexistent", "--rev"],
            "scripts/aiter-pa-addressing: unknown option --rev"
            " (usage: scripts/aiter-pa-addressing AITER_GIT [REV])",
        ),
    ],
    ids=["no-repository", "not-a-repository", "unknown-option", "unknown-option-second"],
)
def test_the_addressing_script_refuses_bad_input_in_one_line(argv, says):
    proc = subprocess.run([str(ADDRESSING), *argv], capture_output=True, text=True)
    assert (proc.returncode, proc.stdout, proc.stderr.strip().splitlines()) == (2, "", [says])


@pytest.mark.parametrize("argv", [["-h"], ["--help"], ["/nonexistent", "--help"]])
def test_the_addressing_script_prints_its_usage_on_help(argv):
    """(trial) --help was taken for the repository: "--help is not a git repository"."""
    proc = subprocess.run([str(ADDRESSING), *argv], capture_output=True, text=True)
    assert (proc.returncode, proc.stderr) == (0, ""), proc
    lines = proc.stdout.splitlines()
    assert lines[0] == "usage: scripts/aiter-pa-addressing AITER_GIT [REV]"
    assert lines[2].startswith("How AITER's one-token fp8 ultra-precision decode kernels")
    assert lines[-1] == "the kernel sets (printed as the s_mov_b32 of 0x80000000: 2 GiB)."


def test_the_addressing_script_says_a_revision_or_a_repository_is_wrong(tmp_path):
    """(trial 16) A revision the repository lacks, and a repository without AITER's
    kernels, printed "(not at REV)" four times and exited 0."""
    git = ["git", "-C", str(tmp_path), "-c", "user.name=t", "-c", "user.email=t@t"]
    subprocess.run([*git, "init", "-q"], check=True)
    subprocess.run([*git, "commit", "-q", "--allow-empty", "-m", "x"], check=True)
    for rev in ("nope", ""):
        bad = subprocess.run([str(ADDRESSING), str(tmp_path), rev], capture_output=True, text=True)
        said = f"scripts/aiter-pa-addressing: {rev} is not a commit of {tmp_path}"
        assert (bad.returncode, bad.stdout, bad.stderr.strip()) == (2, "", said)
    empty = subprocess.run([str(ADDRESSING), str(tmp_path)], capture_output=True, text=True)
    assert (empty.returncode, empty.stdout, empty.stderr.count("\n")) == (2, "", 1)
    assert empty.stderr.strip().endswith(
        f"at HEAD of {tmp_path}: not ROCm/aiter, or a revision before these kernels"
    )


#: A git repository of ROCm/aiter (a clone or a bare mirror), for the test below.
AITER_GIT = os.environ.get("ASM_DECODE_TEST_AITER_GIT", "/work/.mirror/ROCm+aiter/repo")


@pytest.mark.skipif(
    shutil.which("llvm-objdump") is None or not Path(AITER_GIT).is_dir(),
    reason="needs llvm-objdump (amdgcn) and ROCm/aiter's git history ($ASM_DECODE_TEST_AITER_GIT)",
)
def test_the_shipped_uhp_kernels_load_each_page_at_a_64_bit_address():
    """AITER at b847e4d8 (its block-id fix): global loads on 64-bit products; the commit
    before it: buffer loads on 24-bit products (what misread block ids >= 65536)."""
    repo = AITER_GIT
    fixed = subprocess.run([str(ADDRESSING), repo, "b847e4d8"], capture_output=True, text=True)
    old = subprocess.run([str(ADDRESSING), repo, "b847e4d8~1"], capture_output=True, text=True)
    rows = [line.split() for line in fixed.stdout.splitlines()[1:]]
    assert len(rows) == 4 and all(r[2:6] == ["80", "0", "48", "0"] for r in rows), fixed.stdout
    rows = [line.split() for line in old.stdout.splitlines()[1:]]
    assert len(rows) == 4 and all(r[2:6] == ["0", "80", "0", "58"] for r in rows), old.stdout


def test_the_accuracy_summary_gives_a_range_only_where_the_runs_differ():
    from vllm_rocm_asm_decode.tools.validation.accuracy import Measurement, render

    one = [Measurement(40, 8, 0, "bf16", "asm", 0.0039, 0.00021)]
    two = [*one, Measurement(40, 8, 1, "bf16", "asm", 0.0051, 0.00021)]
    assert render(one).splitlines()[-1] == "asm: max 0.0039 / mean 0.00021"
    assert render(two).splitlines()[-1] == "asm: max 0.0039-0.0051 / mean 0.00021"
