"""``reproduce``'s report against known inputs: the original's tables as its pull request
printed them, this run's rows beside them, the verdicts at the edges of the original's
spread, failed and missing steps; and its input errors (one line, exit 2)."""

from __future__ import annotations

import json
import os
import socket
import sys
from pathlib import Path

import pytest

from vllm_rocm_asm_decode.tools import cli
from vllm_rocm_asm_decode.tools.reproduce import compare, report, state
from vllm_rocm_asm_decode.tools.reproduce.state import StepRecord, Store
from vllm_rocm_asm_decode.tools.reproduce.steps import Settings, plan

BIN = Path(__file__).resolve().parents[1] / "standins" / "bin"
DASH = "\u2013"

#: The original pull request's serving table, its cells as it printed them.
PR_SERVING = [
    "| Qwen3-14B-FP8 | 1 | 128 -> 129 | 943 -> 947 | 1756 -> 1798 (+2.4%) "
    "| 4898 -> 5105 (+4.2%) | 6224 -> 6612 (+6.2%) |",
    "| Llama-3.1-8B-Instruct | 1 | 282 -> 282 | 1727 -> 1726 | 3232 -> 3229 "
    "| 9390 -> 9983 (+6.3%) | 12661 -> 13670 (+8.0%) |",
    "| Qwen3-8B | 1 | 255 -> 253 | 1739 -> 1739 | 3321 -> 3329 | 8963 -> 9390 (+4.8%) "
    "| 12026 -> 13089 (+8.8%) |",
    "| Qwen3-14B-FP8 | 2 | 175 -> 175 | 1261 -> 1262 | 2331 -> 2332 | 6066 -> 6231 (+2.7%) "
    "| 7750 -> 8066 (+4.1%) |",
    "| Llama-3.1-8B-Instruct | 2 | 388 -> 388 | 2314 -> 2322 | 4241 -> 4239 "
    "| 10540 -> 10926 (+3.7%) | 13279 -> 13864 (+4.4%) |",
]
PR_KERNEL = [
    "| 40/8 | 1024 | 16 / 64 / 256 | 10.69 / 28.58 / 139.59 | 8.33 / 22.75 / 97.25 "
    "| 0.78 / 0.80 / 0.70 |",
    "| 40/8 | 4096 | 16 / 64 / 256 | 26.71 / 130.10 / 448.27 | 22.47 / 95.05 / 363.04 "
    "| 0.84 / 0.73 / 0.81 |",
    "| 32/8 | 1024 | 24 / 64 / 256 | 14.26 / 26.54 / 132.85 | 10.62 / 22.73 / 96.25 "
    "| 0.74 / 0.86 / 0.72 |",
    "| 32/8 | 4096 | 24 / 64 / 256 | 35.05 / 123.93 / 439.31 | 31.05 / 94.69 / 362.53 "
    "| 0.89 / 0.76 / 0.83 |",
]
PR_GSM8K = [
    f"| Qwen3-14B-FP8 | 1 | 0.9239 (0.9227{DASH}0.9257) | 0.9213 (0.9166{DASH}0.9257) |",
    f"| Llama-3.1-8B-Instruct | 1 | 0.8309 (0.8294{DASH}0.8332) | 0.8327 (0.8287{DASH}0.8378) |",
    f"| Qwen3-8B | 1 | 0.8948 (0.8901{DASH}0.8984) | 0.8976 (0.8923{DASH}0.9022) |",
    "| Llama-3.1-8B-Instruct | 2 | 0.8362 | 0.8347 |",
    "| Qwen3-14B-FP8 | 2 | 0.9189 | 0.9189 |",
]


def summary_row(c: int, change_pct: float, base: float = 1000.0) -> dict:
    cand = base * (1 + change_pct / 100)
    return {
        "concurrency": c, "baseline_tok_s": base, "candidate_tok_s": cand,
        "change_pct": change_pct, "baseline_tpot_ms": 10.0, "candidate_tpot_ms": 9.0,
        "baseline_p99_itl_ms": 16.0, "candidate_p99_itl_ms": 16.0,
        "runs": {"plugin-off": 1, "asm-decode": 1},
    }  # fmt: skip


def test_the_original_serving_table_renders_as_its_pull_request_printed_it():
    lines = report.serving_table([], "m", 1)
    assert lines[0] == "| model | TP | conc 1 | conc 8 | conc 16 | conc 64 | conc 128 |"
    assert lines[2:] == PR_SERVING


def test_the_original_kernel_table_renders_as_its_pull_request_printed_it():
    lines = report.kernel_table(report.original_kernel_timings())
    assert lines[0] == "| heads (q/kv) | ctx | seqs | HIP (today) | asm | asm / HIP |"
    assert lines[2:] == PR_KERNEL


def test_the_original_gsm8k_table_renders_as_its_pull_request_printed_it():
    assert report.gsm8k_table({}, "m", 1)[2:] == PR_GSM8K


def test_this_runs_serving_row_sits_under_the_originals_with_not_run_gaps():
    rows = [summary_row(64, 5.0, 4000.0), summary_row(128, 0.5, 6000.0)]
    last = report.serving_table(rows, "org/My-Model", 2)[-1]
    assert last == (
        "| **this run: org/My-Model** | 2 | not run | not run | not run "
        "| 4000 -> 4200 (+5.0%) | 6000 -> 6030 |"
    )


def test_this_runs_gsm8k_row_is_mean_and_min_max_over_its_runs():
    runs = {"plugin-off": [0.83, 0.84, 0.85], "asm-decode": [0.8327]}
    assert report.gsm8k_table(runs, "m", 1)[-1] == (
        f"| **this run: m** | 1 | 0.8400 (0.8300{DASH}0.8500) | 0.8327 |"
    )


def test_repeats_are_shown_as_min_max():
    results = [
        {"concurrency": 64, "arm": arm, "output_throughput": v}
        for arm, v in [("plugin-off", 4852), ("plugin-off", 4899), ("asm-decode", 5105),
                       ("asm-decode", 5115)]
    ]  # fmt: skip
    assert report.repeat_ranges(results) == [
        f"| 64 | 4852{DASH}4899 (2 runs) | 5105{DASH}5115 (2 runs) |"
    ]
    assert report.repeat_ranges(results[::2]) == []  # one run per arm: no range


def test_the_spread_comes_from_the_originals_repeats():
    # main 4852-4899 and the change 5105-5115 at 64; 6024-6229 and 6612-6635 at 128
    assert compare.spread_pts(64) == pytest.approx(0.9687 + 0.1959, abs=1e-3)
    assert compare.spread_pts(128) == pytest.approx(3.4030 + 0.3478, abs=1e-3)
    assert compare.spread_pts(1) == compare.spread_pts(64)  # the nearest with repeats
    assert compare.gsm8k_spread() == pytest.approx(0.0099)  # Qwen3-8B's change, 0.8923-0.9022


@pytest.mark.parametrize(
    ("c", "change", "verdict"),
    [
        (64, 3.1, "holds"),  # the original's low end +4.2 less 1.17 points is +3.04
        (64, 3.0, "does not hold"),
        (64, 9.0, "holds"),  # above the range
        (128, 2.5, "holds"),  # +6.2 less 3.75 points is +2.48
        (128, 2.4, "does not hold"),
    ],
    ids=["c64-inside-spread", "c64-past-spread", "c64-above", "c128-inside", "c128-past"],
)
def test_a_speed_claim_holds_down_to_the_original_low_end_less_the_spread(c, change, verdict):
    claims = compare.speed_claims([summary_row(c, change)], 1, "some/other-model")
    assert {x.name: x.verdict for x in claims}[f"output throughput at concurrency {c}"] == verdict


def test_a_speed_claim_at_a_tp_the_original_never_ran_is_not_measured():
    claims = compare.speed_claims([summary_row(64, 5.0)], 4, "m")
    assert claims[0].verdict == "not measured" and "TP 4" in claims[0].original


def test_the_speed_claim_names_the_originals_figure_for_the_same_model():
    claims = compare.speed_claims([summary_row(64, 5.0)], 1, "/models/qwen3-8b")
    assert claims[0].original == "+4.2 to +6.3% (TP 1, 3 models); Qwen3-8B: +4.8%"


@pytest.mark.parametrize(
    ("cand", "verdict"),
    [(0.8395, "holds"), (0.8205, "holds"), (0.8405, "does not hold"), (0.8195, "does not hold")],
    ids=["up-within", "down-within", "up-outside", "down-outside"],
)
def test_gsm8k_holds_within_the_widest_original_spread(cand, verdict):
    claim = compare.gsm8k_claim({"plugin-off": [0.83], "asm-decode": [cand]}, "m", 1)
    assert claim.verdict == verdict


def test_one_missed_passkey_breaks_the_claim():
    full = {"3072": [24, 24], "32768": [24, 24]}
    claim = compare.passkey_claim({"plugin-off": full, "asm-decode": full | {"32768": [23, 24]}})
    assert claim.verdict == "does not hold" and claim.why == "missed: asm-decode 32768: 23/24"


def test_a_sync_check_that_failed_before_checking_measured_nothing():
    """(trial 16) A server that never started reported no synchronization: the claim is
    not measured; one whose log shows a synchronization does not hold."""
    name = "sync-check"
    died = _record(name, ok=False, error="server exited with code 3 before /health answered")
    claim = compare.sync_claim(died.__dict__)
    assert (claim.this_run, claim.verdict) == ("failed", "not measured")
    assert claim.why == "server exited with code 3 before /health answered"
    found = _record(name, False, {"reported": ["GPU<->CPU sync detected"]}, "a sync was ...")
    assert compare.sync_claim(found.__dict__).verdict == "does not hold"


@pytest.mark.parametrize("failed", [False, True], ids=["finished", "server-died"])
def test_a_synchronization_in_the_server_log_fails_the_sync_check(tmp_path, failed):
    """Also where the check's raise stopped the server before the step could scan it."""
    from types import SimpleNamespace

    from vllm_rocm_asm_decode.tools.reproduce import runners

    ctx, result = SimpleNamespace(files=tmp_path), {"arm": "asm-decode"}
    error = runners.StepError("GSM8K: the server died", {"gsm8k": {}}) if failed else None
    (tmp_path / "server.log").write_text("INFO started\n")
    runners._raise_if_a_sync_was_reported(ctx, result, error)  # type: ignore[arg-type]
    (tmp_path / "server.log").write_text("ERROR: GPU<->CPU sync detected in forward\n")
    with pytest.raises(runners.StepError, match="a synchronization was reported") as raised:
        runners._raise_if_a_sync_was_reported(ctx, result, error)  # type: ignore[arg-type]
    assert raised.value.result["reported"] == ["ERROR: GPU<->CPU sync detected in forward"]
    assert ("gsm8k" in raised.value.result) is failed and ("died" in str(raised.value)) is failed


@pytest.mark.parametrize(
    ("printed", "said"),
    [("notjson", "its output is not a JSON object ('notjson')"),
     ("5", "its output is not a JSON object ('5')"), ("", "no output")],
    ids=["text", "a-number", "nothing"],
)  # fmt: skip
def test_a_doctor_without_its_json_object_is_said_so(tmp_path, printed, said):
    """(trial 16) It said "no output" where stdout had some; a JSON number raised."""
    from types import SimpleNamespace

    from vllm_rocm_asm_decode.tools.reproduce import runners

    tools = SimpleNamespace(gpu_tools=[sys.executable, "-c", f"print({printed!r})"])
    ctx = SimpleNamespace(tools=tools, files=tmp_path)
    with pytest.raises(runners.StepError) as raised:
        runners.doctor(None, ctx)  # type: ignore[arg-type]
    assert str(raised.value) == f"doctor exited with 0 without its JSON: {said}"


def test_a_sync_check_whose_server_died_of_a_synchronization_fails_the_claim(tmp_path, monkeypatch):
    """The check's own raise stopped the server mid-GSM8K: the step says so."""
    from types import SimpleNamespace

    from vllm_rocm_asm_decode.tools.reproduce import runners

    def died(step, ctx, result):
        (tmp_path / "server.log").write_text("RuntimeError: GPU<->CPU sync detected\n")
        raise runners.StepError("GSM8K: the server died", {"gsm8k": {}})

    monkeypatch.setattr(runners, "_armed_work", died)
    step, ctx = SimpleNamespace(options={"arm": "asm-decode"}), SimpleNamespace(files=tmp_path)
    with pytest.raises(runners.StepError, match="a synchronization was reported") as raised:
        runners.sync_check(step, ctx)  # type: ignore[arg-type]
    assert raised.value.result["reported"] == ["RuntimeError: GPU<->CPU sync detected"]


def test_a_doctor_on_an_unusable_vllm_names_it_not_the_gpu(tmp_path):
    """(trial 16's review) doctor's exit 2 for a vLLM that cannot be used is named as
    such, not as a machine without an AMD GPU."""
    from types import SimpleNamespace

    from vllm_rocm_asm_decode.tools.reproduce import runners
    from vllm_rocm_asm_decode.tools.validation.check import NO_VLLM

    bad = {"name": "vllm", "ok": False, "detail": "the vLLM at /x does not import (E: e)"}
    out = json.dumps({"checks": [bad], "self_test": NO_VLLM, "exit_code": 2})
    code = f"import sys; print({out!r}); sys.exit(2)"
    ctx = SimpleNamespace(tools=SimpleNamespace(gpu_tools=[sys.executable, "-c", code]))
    ctx.files = tmp_path
    with pytest.raises(runners.StepError) as raised:
        runners.doctor(None, ctx)  # type: ignore[arg-type]
    assert str(raised.value) == f"doctor exited with 2: FAIL vllm: {bad['detail']}"
    assert raised.value.cannot_run


def _run(records: dict[str, StepRecord | None], stopped: str | None = None) -> report.Run:
    settings = Settings(model="m", quick=True)
    steps = plan(settings)
    return report.Run(settings, steps, {s.name: records.get(s.name) for s in steps}, [], stopped)


def _record(name: str, ok: bool = True, result: dict | None = None, error: str | None = None):
    return StepRecord(name, "ok" if ok else "failed", 61.0, "t", 1, result or {}, error)


def test_a_failed_step_is_in_the_report_as_failed_and_the_rest_as_not_run_with_why():
    run = _run(
        {
            "doctor": _record("doctor", ok=False, error="doctor exited with 1: FAIL selftest"),
        },
        stopped="doctor failed (doctor exited with 1: FAIL selftest)",
    )
    text = report.render_markdown(run)
    assert "| doctor | **FAILED** | 1m01s | 1 | doctor exited with 1: FAIL selftest |" in text
    assert (
        "| serve-random | not run | — | — | doctor failed (doctor exited with 1: FAIL selftest) |"
        in text
    )
    assert (
        "- `sync-check` (asm arm under VLLM_GPU_SYNC_CHECK=error: GSM8K): not run: doctor failed"
        in text
    )
    assert "0 of 8 steps passed, 1 failed (doctor), 7 not run." in text
    data = report.to_json(run)
    assert data["steps"][0]["status"] == "failed"
    assert data["steps"][1] == {
        "name": "kernel-table",
        "title": "kernel time at the original shapes",
        "status": "not run",
        "why": "doctor failed (doctor exited with 1: FAIL selftest)",
    }


def test_the_help_names_every_step_the_plan_runs(capsys):
    with pytest.raises(SystemExit) as exit_:
        cli.main(["reproduce", "--help"])
    assert exit_.value.code == 0
    text = capsys.readouterr().out
    for step in plan(Settings(model="m", dataset="x")):
        assert step.name.replace("plugin-off", "ARM").replace("asm-decode", "ARM") in text
    assert "--quick" in text and "--redo STEP[,STEP]" in text


def _stand_ins() -> list[str]:
    return ["--vllm", str(BIN / "vllm"), "--lm-eval", str(BIN / "lm_eval")]


@pytest.fixture
def taken_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        s.listen()
        yield s.getsockname()[1]


def _settings_file(tmp_path: Path, finished: bool = True) -> Path:
    """An --out of a reproduction of ``--model m --quick``; its doctor step finished."""
    out = tmp_path / "earlier"
    out.mkdir()
    (out / "reproduction.json").write_text(
        json.dumps({"model": "m", "tp": 1, "quick": True, "dataset": None})
    )
    if finished:
        (out / "steps").mkdir()
        (out / "steps" / "doctor.json").write_text(
            json.dumps(
                {"name": "doctor", "status": "ok", "seconds": 1.0, "finished": "then"}
                | {"invocation": 1, "result": {}}
            )
        )
    return out


M = ["--model", "m"]
NO_LM_EVAL = ["--vllm", str(BIN / "vllm"), "--lm-eval", "no-such-lm-eval"]
INPUT_ERRORS = {
    "no-model": ([], "the following arguments are required: --model"),
    "tp-zero": (
        [*M, "--tp", "0"],
        "argument --tp/--tensor-parallel-size/-tp: 0 must be at least 1",
    ),
    "port": ([*M, "--port", "70000"], "70000 is not a TCP port"),
    "unknown-step": (
        [*M, "--redo", "kernel"],
        "--redo kernel: no such step here; the steps: doctor,",
    ),
    "step-not-in-quick": (
        [*M, "--redo", "gsm8k-asm-decode-2", "--quick"],
        "--redo gsm8k-asm-decode-2: no such step here (--quick leaves it out); the steps:",
    ),
    "step-needs-a-dataset": (
        [*M, "--redo", "serve-sharegpt"],
        "--redo serve-sharegpt: no such step here (it needs --dataset); the steps:",
    ),
    "empty-step-in-a-list": (
        [*M, "--redo", "doctor,,kernel-skew"],
        "argument --redo: 'doctor,,kernel-skew' has an empty step name; give STEP[,STEP]",
    ),
    "out-is-file": ([*M, "--out", __file__], "is a file"),
    "model-path": (
        ["--model", "/no/such/model"],
        "--model /no/such/model: not a model directory with a config.json",
    ),
    "no-dataset": ([*M, "--dataset", "/no/such.json"], "--dataset /no/such.json does not exist"),
    "not-sharegpt": ([*M, "--dataset", __file__], "is not a JSON list"),
    "no-vllm": ([*M, "--vllm", "no-such-vllm"], "--vllm no-such-vllm: no such executable"),
    "no-lm-eval": (
        [*M, *NO_LM_EVAL],
        "--lm-eval no-such-lm-eval: no such executable (pip install 'lm-eval[api]')",
    ),
    "no-gpu-tools": (
        [*M, "--vllm", str(BIN / "vllm"), "--lm-eval", str(BIN / "lm_eval"), "--gpu-tools", "/x"],
        "--gpu-tools /x: no such executable",
    ),
    "timeout-zero": ([*M, "--health-timeout", "0"], "must be a finite number above 0"),
    "out-name-too-long": ([*M, "--out", "a" * 300], "cannot be used: File name too long"),
    "model-name-too-long": (["--model", "/" + "b" * 300], "not a model directory"),
    "home-of-nobody": (["--model", "~nosuchuser/x"], "--model ~nosuchuser/x: not a model"),
}


@pytest.mark.parametrize(("args", "says"), INPUT_ERRORS.values(), ids=INPUT_ERRORS.keys())
def test_an_input_error_is_one_line_and_exit_2(args, says, capsys, tmp_path):
    try:
        code = cli.main(["reproduce", "--out", str(tmp_path / "out"), *args])
    except SystemExit as exc:  # argparse's own errors
        code = exc.code
    err = capsys.readouterr().err
    assert code == 2
    assert err.count("\n") == 1 and err.startswith("vllm-rocm-asm-decode reproduce: error: ")
    assert says in err
    assert not (tmp_path / "out").exists()  # nothing written


def test_a_dataset_that_is_a_directory_is_said_so_with_out_inside_it(capsys, tmp_path):
    """As bench serve says it: the directory, not where --out lies."""
    out = tmp_path / "out"
    code = cli.main(["reproduce", "--out", str(out), *M, "--dataset", str(tmp_path), *_stand_ins()])
    assert code == 2 and not out.exists()
    assert capsys.readouterr().err == (
        f"vllm-rocm-asm-decode reproduce: error: --dataset {tmp_path} is a directory\n"
    )


@pytest.mark.parametrize("level", ["ERROR", "info "])
def test_a_logging_level_that_hides_or_breaks_the_arms_lines_is_refused(
    capsys, tmp_path, monkeypatch, level
):
    """Each serving arm is confirmed from the INFO lines of its server's log: a level
    above INFO would end the run unconfirmed, one vLLM refuses would stop each server."""
    monkeypatch.setenv("VLLM_LOGGING_LEVEL", level)
    code = cli.main(["reproduce", "--out", str(tmp_path / "out"), *M, *_stand_ins()])
    err = capsys.readouterr().err
    assert code == 2 and err.count("\n") == 1 and not (tmp_path / "out").exists()
    assert f"VLLM_LOGGING_LEVEL={level!r} " in err


def test_a_switch_value_doctor_would_refuse_is_refused_before_the_run(
    capsys, tmp_path, monkeypatch
):
    """The arms set VLLM_ROCM_ASM_DECODE themselves, but the doctor step reads the
    user's: a value it does not understand stops the run at once, not after doctor."""
    monkeypatch.setenv("VLLM_ROCM_ASM_DECODE", "yes")
    code = cli.main(["reproduce", "--out", str(tmp_path / "out"), *M, *_stand_ins()])
    err = capsys.readouterr().err
    assert code == 2 and err.count("\n") == 1 and not (tmp_path / "out").exists()
    assert "VLLM_ROCM_ASM_DECODE='yes' is not understood" in err and "doctor step" in err


def test_a_rerun_with_other_options_into_the_same_out_is_refused(capsys, tmp_path):
    out = _settings_file(tmp_path)
    code = cli.main(["reproduce", "--model", "m", "--out", str(out), *_stand_ins()])
    err = capsys.readouterr().err
    assert code == 2 and err.count("\n") == 1
    assert err.strip().endswith(
        f"--out {out} holds a reproduction of --model m --tp 1 --quick (this run: without "
        "--quick); rerun with those options to resume it, or give another --out (or remove "
        "it: its finished steps go with it)"
    )


def test_a_rerun_hears_of_a_missing_path_before_the_options_it_changed(capsys, tmp_path):
    """(trial 13) A rerun into the same --out that names a missing --dataset is told so,
    not only that --quick differs (which it would hear next)."""
    out = _settings_file(tmp_path)
    args = ["--model", "m", "--out", str(out), "--dataset", str(tmp_path / "none.json")]
    code = cli.main(["reproduce", *args, *_stand_ins()])
    err = capsys.readouterr().err
    assert code == 2 and err.count("\n") == 1 and "none.json does not exist" in err


def test_the_reports_are_written_with_the_mode_a_new_file_gets(tmp_path):
    """(trial 13) Written through a temporary file, they were private (0600)."""
    old = os.umask(0o022)
    try:
        state.write_text(tmp_path / "report.md", "x")
        state.write_json(tmp_path / "report.json", {})
    finally:
        os.umask(old)
    assert {oct(p.stat().st_mode & 0o777) for p in tmp_path.iterdir()} == {"0o644"}


def test_a_port_in_use_is_refused_before_anything_runs(capsys, tmp_path, taken_port):
    args = ["--model", "m", "--out", str(tmp_path / "o"), "--port", str(taken_port)]
    code = cli.main(["reproduce", *args, *_stand_ins()])
    err = capsys.readouterr().err
    assert code == 2 and err.count("\n") == 1
    assert f"--port {taken_port}: cannot listen there" in err and "left by a killed run" in err


def test_input_errors_come_before_torch_or_vllm_is_imported(tmp_path):
    import subprocess

    code = (
        "import sys\nfrom vllm_rocm_asm_decode.tools.cli import main\n"
        f"rc = main(['reproduce', '--model', 'm', '--out', {str(tmp_path)!r}, '--redo', 'x'])\n"
        "assert rc == 2, rc\nassert 'torch' not in sys.modules and 'vllm' not in sys.modules\n"
    )
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr


OUT_NOT_OURS = {
    "users-files": "holds other files and no reproduction.json: give a new or empty directory",
    "steps-a-file": "steps is not a directory this command made",
    "dangling-link": "which does not exist",
}


@pytest.mark.parametrize("case", OUT_NOT_OURS, ids=OUT_NOT_OURS)
def test_an_out_this_command_did_not_make_is_refused_and_left_alone(case, capsys, tmp_path):
    out = tmp_path / "o"
    if case == "users-files":
        out.mkdir()
        (out / "report.md").write_text("mine")
    elif case == "steps-a-file":
        out = _settings_file(tmp_path, finished=False)
        (out / "steps").write_text("x")
    else:
        out.symlink_to(tmp_path / "nowhere" / "x")
    code = cli.main(["reproduce", "--model", "m", "--quick", "--out", str(out), *_stand_ins()])
    err = capsys.readouterr().err
    assert code == 2 and err.count("\n") == 1, err
    assert OUT_NOT_OURS[case] in err
    if case == "users-files":
        assert sorted(p.name for p in out.iterdir()) == ["report.md"]
        assert (out / "report.md").read_text() == "mine"


CONFIGS_NOT_A_MODEL = {
    "a-list": ("[1]", "config.json is not a JSON object"),
    "null": ("null", "config.json is not a JSON object"),
    "nested": ("[" * 100_000 + "]" * 100_000, "nested too deep"),
    "bom": ("\ufeff{}", "config.json: Unexpected UTF-8 BOM"),
    "latin-1": ('{"n": "\xe9"}', "config.json: 'utf-8' codec can't decode"),
}


@pytest.mark.parametrize(("text", "says"), CONFIGS_NOT_A_MODEL.values(), ids=CONFIGS_NOT_A_MODEL)
def test_a_model_directory_whose_config_is_no_models_is_one_line(text, says, capsys, tmp_path):
    """--model DIR's config.json read as plan reads it (bounded, a JSON object, the file
    named in the line), not a traceback."""
    model = tmp_path / "m"
    model.mkdir()
    (model / "config.json").write_bytes(text.encode("latin-1" if "\xe9" in text else "utf-8"))
    code = cli.main(["reproduce", "--model", str(model), "--out", str(tmp_path / "o")])
    err = capsys.readouterr().err
    assert code == 2 and err.count("\n") == 1, err
    assert says in err.replace("cannot read ", "").replace(f"{model}/", "")
    assert not (tmp_path / "o").exists()


SETTINGS_NOT_OURS = {
    "a-list": "[]",
    "a-string": '"str"',
    "a-field-of-its-own": '{"model": "m", "tp": 1, "quick": true, "dataset": null, "x": 1}',
    "a-field-missing": '{"model": "m"}',
    "fifo": None,
}


@pytest.mark.parametrize("content", SETTINGS_NOT_OURS.values(), ids=SETTINGS_NOT_OURS)
def test_a_reproduction_json_this_command_did_not_write_is_one_line(content, capsys, tmp_path):
    """A foreign reproduction.json (another shape, unknown fields, a FIFO that would never
    end a read) is refused in one line before anything runs, and left as it was."""
    out = tmp_path / "o"
    out.mkdir()
    path = out / "reproduction.json"
    if content is None:
        os.mkfifo(path)
    else:
        path.write_text(content)
    code = cli.main(["reproduce", "--model", "m", "--out", str(out), *_stand_ins()])
    err = capsys.readouterr().err
    assert code == 2 and err.count("\n") == 1, err
    assert f"--out {out}: cannot read its reproduction.json" in err and "another --out" in err
    assert sorted(p.name for p in out.iterdir()) == ["reproduction.json"]


def test_records_this_command_did_not_write_count_as_not_finished(tmp_path):
    """A step record whose figures are not a step's (hand-edited, say), a FIFO in its place
    and an environment file named otherwise are left out, never a crash."""
    from vllm_rocm_asm_decode.tools.reproduce import command

    store = Store(tmp_path)
    (tmp_path / "steps").mkdir()
    (tmp_path / "environment").mkdir()
    (tmp_path / "environment" / "notes.json").write_text("{}")
    (tmp_path / "environment" / "1.json").write_text('{"invocation": 1}')
    settings = Settings(model="m", quick=True)
    steps = plan(settings)
    odd = StepRecord("kernel-table", "ok", 1.0, "now", 1, {"timings": [{"hip": 1}]})
    store.save(odd)
    os.mkfifo(store.step_path("doctor"))
    assert store.record("doctor") is None  # returns at once: the FIFO is not opened
    assert store.record("kernel-table") == odd
    assert command._readable(settings, steps, "kernel-table", odd) is None
    assert [e["invocation"] for e in store.environments()] == [1]
    assert store.begin({}) == 2


def _script(path: Path, body: str) -> str:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(f"#!{sys.executable}\nimport sys\n{body}\n")
    path.chmod(0o755)
    return str(path)


def _gsm8k_result(tmp_path: Path, extra: dict) -> dict:
    """What the GSM8K runner keeps from an lm_eval results file with ``extra`` in it."""
    from vllm_rocm_asm_decode.tools.reproduce import gsm8k

    out = tmp_path / "gsm8k" / "m"
    out.mkdir(parents=True)
    scores = {"exact_match,flexible-extract": 0.83, "exact_match,strict-match": 0.82}
    (out / "results_1.json").write_text(json.dumps({"results": {"gsm8k": scores}} | extra))
    return gsm8k.parse(tmp_path / "gsm8k")


def _tool_rows(env: dict, gsm8k_result: dict | None) -> dict[str, str]:
    records = {}
    if gsm8k_result is not None:
        result = {"arm": "plugin-off", "eager": False, "gsm8k": gsm8k_result}
        records["accuracy-plugin-off"] = _record("accuracy-plugin-off", result=result)
    run = _run(records)
    run.environments = [env]
    rows = [line[2:-2].split(" | ") for line in report.environment_lines(run)[2:]]
    return {row[0]: row[1] for row in rows if len(row) == 2}


#: What vLLM's command line may print on stdout before its version: its log lines.
VLLM_VERSION = (
    "print('INFO 12-06 10:00:00 [__init__.py:216] Automatically detected platform rocm.')"
)


def test_the_tool_versions_are_those_of_the_executables_that_ran(tmp_path):
    """--vllm's version is what it answers to --version (past its log lines), not this
    Python's vLLM; lm_eval's is what its results file says it was, not 'not installed'."""
    from vllm_rocm_asm_decode.tools.reproduce import environment

    vllm = _script(
        tmp_path / "bin" / "vllm",
        f"{VLLM_VERSION}\nprint('0.34.1+rocm700') if sys.argv[1:] == ['--version'] else exit(3)",
    )
    lm_eval = _script(tmp_path / "bin" / "lm_eval", "exit('never asked')")
    env = environment.record("m", 1, ["reproduce"], vllm=vllm, lm_eval=lm_eval)
    assert env["vllm_executable"] == vllm and env["vllm_executable_version"] == "0.34.1+rocm700"
    assert env["lm_eval_executable"] == lm_eval
    result = _gsm8k_result(tmp_path, {"lm_eval_version": "0.4.9.1"})
    assert result["lm_eval_version"] == "0.4.9.1"
    rows = _tool_rows(env, result | {"lm_eval": lm_eval})
    assert rows["vLLM (servers)"] == f"0.34.1+rocm700 ({vllm})"
    assert rows["lm_eval"] == f"0.4.9.1 ({lm_eval})"
    assert rows["vLLM (doctor)"] == "unknown (doctor not run)"  # not this Python's vLLM


def test_a_tool_version_not_learned_from_the_tool_is_unknown_with_its_path(tmp_path):
    """A vllm whose --version fails or prints no version, and an lm_eval whose results
    file names none (an older lm_eval) or only its failure to look itself up: each is
    'unknown (PATH)', never this Python's version nor 'not installed'."""
    from vllm_rocm_asm_decode.tools.reproduce import environment

    vllm = _script(tmp_path / "bin" / "vllm", f"{VLLM_VERSION}\nexit(1)")
    lm_eval = _script(tmp_path / "bin" / "lm_eval", "exit(2)")
    env = environment.record("m", 1, ["reproduce"], vllm=vllm, lm_eval=lm_eval)
    assert env["vllm_executable_version"] is None
    rows = _tool_rows(env, None)
    assert (
        rows["vLLM (servers)"] == f"unknown ({vllm})" and rows["lm_eval"] == f"unknown ({lm_eval})"
    )
    wordy = _script(tmp_path / "bin2" / "vllm", "print('vLLM, the fast one')")
    assert (
        environment.record("m", 1, [], vllm=wordy, lm_eval=lm_eval)["vllm_executable_version"]
        is None
    )
    failed = "No package metadata was found for lm_eval"
    for extra in ({}, {"lm_eval_version": failed}):
        result = _gsm8k_result(tmp_path / str(len(extra)), extra)
        assert result["lm_eval_version"] is None
        assert _tool_rows(env, result | {"lm_eval": lm_eval})["lm_eval"] == f"unknown ({lm_eval})"


def _changes(environments: list[dict]) -> list[str]:
    """The report's "environment changed" sentences for these invocations' records."""
    run = _run({})
    run.environments = environments
    said = "\nThe environment changed between invocations: "
    return [line.removeprefix(said) for line in report.environment_lines(run) if said in line]


def test_a_resume_from_a_record_without_the_executables_keys_reports_no_change():
    """A record written before the executables were recorded lacks their keys: resuming
    from it is no change of them; a later real change is said, against the first
    invocation that recorded the key."""
    old = {"invocation": 1, "vllm": "0.33.0", "settings": {}}
    new = old | {
        "invocation": 2,
        "vllm_executable": "/usr/bin/vllm",
        "vllm_executable_version": "0.33.0",
        "lm_eval_executable": "/usr/bin/lm_eval",
    }
    assert _changes([old, new]) == []
    moved = new | {"invocation": 3, "vllm_executable": "/opt/vllm/bin/vllm"}
    assert _changes([old, new, moved]) == [
        "invocation 3: vllm_executable '/usr/bin/vllm' -> '/opt/vllm/bin/vllm'."
    ]


def test_a_vllm_version_not_learned_once_is_unknown_not_a_change():
    """``vllm --version`` timed out (None) at one invocation and answered at others: no
    change either way; two answers that differ are one."""
    env = {"vllm_executable": "/usr/bin/vllm", "settings": {}}
    timed_out = env | {"invocation": 1, "vllm_executable_version": None}
    answered = env | {"invocation": 2, "vllm_executable_version": "0.33.0"}
    again = env | {"invocation": 3, "vllm_executable_version": None}
    assert _changes([timed_out, answered, again]) == []
    newer = env | {"invocation": 4, "vllm_executable_version": "0.34.0"}
    assert _changes([timed_out, answered, again, newer]) == [
        "invocation 4: vllm_executable_version '0.33.0' -> '0.34.0'."
    ]


def test_a_version_is_in_ascii_digits_only(tmp_path):
    """'٠.٣٣' (Arabic-Indic digits) is no version, from ``--version`` or elsewhere."""
    from vllm_rocm_asm_decode.tools.reproduce import environment

    arabic = "\u0660.\u0663\u0663"
    assert environment.is_version("0.33") and not environment.is_version(arabic)
    vllm = _script(tmp_path / "bin" / "vllm", f"print({arabic!r})")
    assert environment.executable_version(vllm) is None
