"""``bench serve``: commands, orchestration against a stand-in ``vllm``, results."""

from __future__ import annotations

import json
import os
import socket
from pathlib import Path

import pytest

from vllm_rocm_asm_decode.tools.validation import serve_bench as sb

FAKE_VLLM = str(Path(__file__).resolve().parents[1] / "standins" / "bin" / "vllm")


@pytest.fixture(autouse=True)
def quick_health_polls(monkeypatch):
    """The stand-in server answers within a second; ask it often (real servers take
    minutes and are asked every half second)."""
    monkeypatch.setattr(sb, "HEALTH_POLL_SECONDS", 0.05)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def config(tmp_path, **kw) -> sb.ServeConfig:
    base = dict(
        model="Qwen/Qwen3-14B-FP8",
        concurrencies=(1, 64),
        num_prompts=(8, 256),
        port=free_port(),
        result_dir=tmp_path / "results",
        vllm=FAKE_VLLM,
        health_timeout=30,
        stop_timeout=5,
    )
    base.update(kw)
    return sb.ServeConfig(**base)


@pytest.fixture(scope="module")
def vllm_serve_parser():
    """vLLM 0.33's own ``vllm serve`` argument parser."""
    from vllm.entrypoints.common.cli_args import make_arg_parser
    from vllm.utils.argparse_utils import FlexibleArgumentParser

    return make_arg_parser(FlexibleArgumentParser(prog="vllm serve"))


def test_every_way_vllm_reads_an_owned_option_is_refused(vllm_serve_parser, capsys):
    """Each prefix of a harness-owned option, dashed or with underscores, parsed by vLLM's
    real ``vllm serve`` parser: wherever vLLM sets the owned option from it,
    ``owned_serve_option`` names that option; no vLLM option is a prefix of one."""
    parser = vllm_serve_parser
    actions = {o: a for a in parser._actions for o in a.option_strings}
    values = {"--kv-cache-dtype": "fp8", "--gpu-memory-utilization": "0.5"}
    default = vars(parser.parse_args([]))
    refused = 0
    for owned in sb.OWNED_SERVE_OPTIONS:
        assert not [o for o in actions if owned.startswith(o) and o != owned]
        dest, value = actions[owned].dest, values.get(owned, "7")
        first = 3 if owned.startswith("--") else 2
        for said in {
            spelling
            for n in range(first, len(owned) + 1)
            for spelling in (owned[:n], owned[:2] + owned[2:n].replace("-", "_"))
        }:
            try:
                parsed = vars(parser.parse_args([f"{said}={value}"]))
            except SystemExit:  # ambiguous, or not an option: vLLM stops, sets nothing
                continue
            if parsed[dest] != default[dest]:
                assert sb.owned_serve_option(f"{said}={value}") == owned, said
                refused += 1
    capsys.readouterr()
    assert refused >= 40  # the abbreviations vLLM takes: --po, --max-model, -t, ...
    for theirs in ("--kv-cache-dtype-skip-layers", "--max-num-seqs", "--enforce-eager", "--seed"):
        assert sb.owned_serve_option(theirs) is None, theirs


def test_serve_command_has_the_seeds_defaults():
    cfg = sb.ServeConfig(model="m", tensor_parallel_size=2, port=8123, serve_args=("--seed", "1"))
    cmd = sb.serve_command(cfg)
    assert cmd[:3] == ["vllm", "serve", "m"]
    joined = " ".join(cmd)
    for part in (
        "--kv-cache-dtype fp8",
        "--max-model-len 40960",
        "--gpu-memory-utilization 0.85",
        "--port 8123",
        "--tensor-parallel-size 2",
    ):
        assert part in joined
    assert cmd[-2:] == ["--seed", "1"]
    assert "--tensor-parallel-size" not in sb.serve_command(sb.ServeConfig(model="m"))


def test_bench_command_is_vllms_random_dataset_run():
    cmd = sb.bench_command(sb.ServeConfig(model="m"), 64, 256, "x.json")
    assert cmd[:3] == ["vllm", "bench", "serve"]
    joined = " ".join(cmd)
    for part in (
        "--dataset-name random",
        "--random-input-len 1024",
        "--random-output-len 1024",
        "--ignore-eos",
        "--max-concurrency 64",
        "--num-prompts 256",
        "--save-result",
        "--result-filename x.json",
    ):
        assert part in joined


def test_bench_command_for_sharegpt(tmp_path):
    data = tmp_path / "sharegpt.json"
    data.write_text(json.dumps([{"id": "a", "conversations": [{"from": "human", "value": "hi"}]}]))
    cmd = sb.bench_command(
        sb.ServeConfig(model="m", dataset="sharegpt", dataset_path=data), 64, 256, "x.json"
    )
    joined = " ".join(cmd)
    assert f"--dataset-name sharegpt --dataset-path {data}" in joined
    assert "--random-input-len" not in joined and "--ignore-eos" not in joined


@pytest.mark.parametrize(
    ("text", "says"),
    [
        ("", "is empty, not a JSON list"),
        ('{"conversations": []}', "is not a JSON list"),
        (
            "{bad",
            "is not JSON (Expecting property name enclosed in double quotes at byte offset 1)",
        ),
        ("  []", "is an empty JSON list"),
        (
            '[{"conversations": [}',
            "is not JSON (Expecting value at byte offset 20, in its first entry)",
        ),
        ('[{"id": 1}, ', "has no 'conversations' list in its first entry"),
        ("[1, 2]", "has no 'conversations' list in its first entry"),
        ('\n[{"conversations": [{"from": "human", "value": "' + "x" * (3 << 20) + '"}]}', None),
    ],
    ids=[
        "empty",
        "object",
        "not-json",
        "empty-list",
        "broken",
        "no-conversations",
        "numbers",
        "long-entry",
    ],
)
def test_a_sharegpt_file_is_judged_on_its_first_entry(tmp_path, text, says):
    path = tmp_path / "data.json"
    path.write_text(text)
    assert sb.sharegpt_problem(path) == says


@pytest.mark.parametrize(
    ("kw", "message"),
    [
        (dict(dataset="sharegpt"), "--dataset sharegpt needs --dataset-path FILE"),
        (dict(dataset="sharegpt", dataset_path="/no/such.json"), "/no/such.json does not exist"),
        (dict(dataset="sharegpt", dataset_path="/tmp"), "--dataset-path /tmp is a directory"),
        (dict(dataset="sonnet"), "--dataset 'sonnet': use random or sharegpt"),
    ],
    ids=["no-path", "missing-file", "a-directory", "unknown"],
)
def test_bad_dataset_is_refused(kw, message):
    with pytest.raises(ValueError, match=message):
        sb.ServeConfig(model="m", **kw)


@pytest.mark.parametrize(
    ("arm", "log", "confirmed", "detail"),
    [
        (
            "asm-decode",
            "x ROCM_ATTN asm decode plugin registered (p)\n"
            "x ROCM_ATTN asm decode: 40 of 40 layers eligible on gfx950 (KV cache of 512 blocks)\n"
            "x ROCM_ATTN asm decode: 0 of 40 layers eligible on gfx950 (KV cache of 183104)\n",
            False,
            "0 of 40 layers eligible: the asm decode never ran",
        ),
        (
            "asm-decode",
            "ROCM_ATTN asm decode plugin registered\n"
            "ROCM_ATTN asm decode: 40 of 40 layers eligible on gfx950 (KV cache of 183104)\n",
            True,
            "asm decode on: 40 of 40 layers eligible",
        ),
        ("asm-decode", "", False, "no 'ROCM_ATTN asm decode plugin registered' line"),
        (
            "plugin-off",
            "ROCM_ATTN asm decode plugin inactive: VLLM_ROCM_ASM_DECODE=0\n",
            True,
            "asm decode off (VLLM_ROCM_ASM_DECODE=0)",
        ),
        (
            "mha-off",
            "ROCM_ATTN asm decode plugin registered\n",
            False,
            "the plugin registered although VLLM_ROCM_USE_AITER_MHA=0 was set",
        ),
    ],
    ids=["candidate-none-eligible", "candidate", "candidate-quiet", "baseline", "mha-leak"],
)
def test_the_arm_is_confirmed_from_the_server_log(arm, log, confirmed, detail):
    ok, said = sb.confirm_arm(arm, log)
    assert ok is confirmed and said.startswith(detail)


def test_arms_alternate_and_switches_do_not_leak():
    assert list(sb.arm_order("plugin-off", 3)) == [
        (0, "plugin-off"),
        (0, "asm-decode"),
        (1, "asm-decode"),
        (1, "plugin-off"),
        (2, "plugin-off"),
        (2, "asm-decode"),
    ]
    env = sb.arm_env("asm-decode", {"VLLM_ROCM_ASM_DECODE": "0", "PATH": "/bin"})
    assert "VLLM_ROCM_ASM_DECODE" not in env and env["VLLM_ROCM_USE_AITER"] == "1"
    assert sb.arm_env("mha-off", {})["VLLM_ROCM_USE_AITER_MHA"] == "0"
    assert sb.arm_env("plugin-off", {})["VLLM_ROCM_ASM_DECODE"] == "0"


@pytest.mark.parametrize(
    "kw",
    [dict(baseline="off"), dict(concurrencies=(1, 2)), dict(repeats=0)],
    ids=["baseline", "prompts", "repeats"],
)
def test_bad_configuration_is_refused(kw):
    with pytest.raises(ValueError):
        sb.ServeConfig(
            model="m", num_prompts=(8,) if "concurrencies" in kw else (8, 32, 64, 256, 256), **kw
        )


def result_file(tmp_path, **overrides) -> Path:
    """A result with the fields vLLM 0.33's ``vllm bench serve --save-result`` writes."""
    data = {
        "date": "20261129-120000",
        "backend": "vllm",
        "model_id": "m",
        "num_prompts": 256,
        "max_concurrency": 64,
        "duration": 30.0,
        "completed": 256,
        "failed": 0,
        "request_throughput": 8.5,
        "output_throughput": 9390.5,
        "total_token_throughput": 18000.0,
        "mean_tpot_ms": 6.5,
        "median_tpot_ms": 6.4,
        "p99_tpot_ms": 7.0,
        "mean_itl_ms": 6.5,
        "median_itl_ms": 6.3,
        "p99_itl_ms": 15.5,
    }
    data.update(overrides)
    path = tmp_path / "r.json"
    path.write_text(json.dumps(data))
    return path


def test_parse_result(tmp_path):
    r = sb.parse_result(result_file(tmp_path), "asm-decode", 1)
    assert (r.concurrency, r.num_prompts, r.output_throughput) == (64, 256, 9390.5)
    assert (r.median_tpot_ms, r.p99_itl_ms, r.completed) == (6.4, 15.5, 256)


def test_parse_result_rejects_other_files(tmp_path):
    path = tmp_path / "x.json"
    path.write_text(json.dumps({"throughput": 1}))
    with pytest.raises(sb.ServeError, match="not a vllm bench serve result"):
        sb.parse_result(path, "asm-decode", 0)


@pytest.mark.parametrize(
    ("overrides", "why"),
    [
        ({"output_throughput": float("nan")}, "output_throughput nan"),
        ({"p99_itl_ms": float("inf")}, "p99_itl_ms inf"),
        ({"median_tpot_ms": None}, "must be a string or a real number"),
    ],
    ids=["nan-throughput", "inf-itl", "null-tpot"],
)
def test_a_result_without_finite_figures_is_refused_in_one_line(tmp_path, overrides, why):
    path = result_file(tmp_path, **overrides)
    with pytest.raises(sb.ServeError) as refused:
        sb.parse_result(path, "asm-decode", 0)
    message = str(refused.value)
    assert "not a vllm bench serve result" in message and why in message
    assert "\n" not in message and "Error(" not in message


def test_a_result_missing_a_figure_names_it(tmp_path):
    path = tmp_path / "x.json"
    path.write_text(json.dumps({"max_concurrency": 1, "num_prompts": 1}))
    with pytest.raises(sb.ServeError, match="not a vllm bench serve result: no 'output_thr"):
        sb.parse_result(path, "asm-decode", 0)


def run(arm, c, tok, itl, repeat=0):
    return sb.RunResult(arm, repeat, c, 256, tok, 6.0, itl, 256, 0, f"{arm}-{repeat}-{c}")


def test_outliers_are_flagged_and_left_out_of_the_means():
    results = [
        run("plugin-off", 64, 4850, 15.5),
        run("plugin-off", 64, 4900, 16.0, 1),
        run("asm-decode", 64, 5105, 16.5),
        run("asm-decode", 64, 4000, 79.7, 1),
    ]
    flagged = sb.flag_outliers(results)
    assert [(r.arm, r.repeat) for r in flagged] == [("asm-decode", 1)]
    (row,) = sb.summarize(results, "plugin-off")
    assert row.baseline_tok_s == pytest.approx(4875) and row.candidate_tok_s == 5105
    assert row.change_pct == pytest.approx((5105 / 4875 - 1) * 100)
    assert row.runs == {"plugin-off": 2, "asm-decode": 1}
    text = sb.render([row], results, "plugin-off", "m")
    assert "4875 -> 5105" in text and "+4.7%" in text and "outlier left out" in text


def alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return True


class Spy:
    """Records servers so the test can check they were stopped."""

    def __init__(self, monkeypatch):
        self.servers: list[sb.Server] = []
        original = sb.Server.start

        def start(server):
            self.servers.append(server)
            original(server)

        monkeypatch.setattr(sb.Server, "start", start)

    def all_stopped(self) -> bool:
        return all(
            s.proc is None or (s.proc.poll() is not None and not alive(s.proc.pid))
            for s in self.servers
        )


@pytest.mark.slow
def test_full_ab_run_against_a_stand_in_server(tmp_path, monkeypatch):
    spy = Spy(monkeypatch)
    cfg = config(tmp_path, repeats=2)
    outcome = sb.run_ab(cfg, log=lambda _: None)
    assert outcome.error is None and not outcome.interrupted
    assert len(outcome.results) == 8  # 2 repeats x 2 arms x 2 concurrencies
    assert [s.arm for s in spy.servers] == ["plugin-off", "asm-decode", "asm-decode", "plugin-off"]
    assert spy.all_stopped() and not sb.port_in_use(cfg.host, cfg.port)
    assert [(a.arm, a.confirmed) for a in outcome.arms] == [
        ("plugin-off", True),
        ("asm-decode", True),
        ("asm-decode", True),
        ("plugin-off", True),
    ]
    rows = sb.summarize(outcome.results, "plugin-off")
    assert [r.concurrency for r in rows] == [1, 64]
    assert all(r.change_pct == pytest.approx(5.0) for r in rows)
    saved = json.loads((cfg.result_dir / "asm-decode-r1-c64.json").read_text())
    assert saved["aiter_env"] == "1"  # every arm runs with VLLM_ROCM_USE_AITER=1


@pytest.mark.slow
def test_a_stall_is_flagged_not_averaged(tmp_path, monkeypatch):
    monkeypatch.setenv("FAKE_VLLM_STALL", "64")
    outcome = sb.run_ab(config(tmp_path, repeats=2), log=lambda _: None)
    flagged = sb.flag_outliers(outcome.results)
    assert [(r.arm, r.repeat, r.concurrency) for r in flagged] == [("asm-decode", 0, 64)]


def test_server_that_fails_to_start(tmp_path, monkeypatch):
    spy = Spy(monkeypatch)
    monkeypatch.setenv("FAKE_VLLM_SERVE_FAIL", "1")
    outcome = sb.run_ab(config(tmp_path), log=lambda _: None)
    said = "exited with code 3 before /health answered: vLLM found no GPU on this machine "
    said += "(Failed to infer device type), where it serves (log: "  # (trial 22)
    assert outcome.results == [] and said in outcome.error
    assert spy.all_stopped()


def test_a_server_that_does_not_answer_in_time_is_stopped_and_said_so(tmp_path, monkeypatch):
    """(trial 14) After a failure the stop may take the server's whole grace period: it is
    said before it starts, not after a silent minute."""
    spy, said = Spy(monkeypatch), []
    outcome = sb.run_ab(config(tmp_path, health_timeout=0.01), log=said.append)
    assert outcome.error.startswith("plugin-off server did not answer /health within 0.01 s")
    assert said[-1].startswith("== stopping the plugin-off server (a second Ctrl-C")
    assert spy.all_stopped()


@pytest.mark.parametrize(
    ("log", "said"),
    [
        ("INFO start\nValueError: first\nERROR [core.py:9] torch.OutOfMemoryError: HIP out\n",
         "OutOfMemoryError: HIP out"),
        ("INFO ready\nKilled\n", None),
        ("RuntimeError: " + "x" * 300, "RuntimeError: " + "x" * 223 + "..."),
        ("\x1b[1;31mValueError: bad \x1b[0mmodel\n", "ValueError: bad model"),
    ],
    ids=["last-of-two", "none", "long", "colours"],
)  # fmt: skip
def test_the_last_error_a_server_logged(log, said):
    assert sb.last_error(log) == said


def test_port_in_use(tmp_path):
    cfg = config(tmp_path)
    with socket.socket() as s:
        s.bind((cfg.host, cfg.port))
        s.listen()
        outcome = sb.run_ab(cfg, log=lambda _: None)
    assert outcome.results == [] and f"port {cfg.port}" in outcome.error


@pytest.mark.slow
def test_crash_mid_run_keeps_partial_results(tmp_path, monkeypatch):
    spy = Spy(monkeypatch)
    monkeypatch.setenv("FAKE_VLLM_DIE_AFTER", "2")  # dies answering the second run
    outcome = sb.run_ab(config(tmp_path), log=lambda _: None)
    assert [(r.arm, r.concurrency) for r in outcome.results] == [("plugin-off", 1)]
    assert "died during concurrency 64" in outcome.error or "exited with" in outcome.error
    assert spy.all_stopped()


@pytest.mark.slow
def test_failed_requests_stop_the_run_and_name_the_arm(tmp_path, monkeypatch):
    """A result file that counts failed requests is no measurement: the run stops there
    (exit non-zero), keeping the runs before it, its server stopped."""
    spy = Spy(monkeypatch)
    monkeypatch.setenv("FAKE_VLLM_FAILED", "7")  # the candidate arm loses 7 requests
    outcome = sb.run_ab(config(tmp_path, concurrencies=(1,), num_prompts=(8,)), log=print)
    assert [(r.arm, r.concurrency) for r in outcome.results] == [("plugin-off", 1)]
    assert outcome.error.startswith("7 of 8 requests failed in the asm-decode arm at "), (
        outcome.error
    )
    assert spy.all_stopped()


@pytest.mark.slow
def test_ctrl_c_stops_the_server_and_keeps_results(tmp_path, monkeypatch):
    spy = Spy(monkeypatch)
    calls = []

    def bench(cmd):
        calls.append(cmd)
        if len(calls) == 3:
            raise KeyboardInterrupt
        return sb.run_bench_client(cmd)

    outcome = sb.run_ab(config(tmp_path), bench=bench, log=lambda _: None)
    assert outcome.interrupted and len(outcome.results) == 2
    assert [s.arm for s in spy.servers] == ["plugin-off", "asm-decode"]
    assert spy.all_stopped()


@pytest.mark.slow
def test_cli_exit_codes_and_json(tmp_path, monkeypatch, capsys):
    from vllm_rocm_asm_decode.tools.cli import main

    port = free_port()
    args = [
        "bench",
        "serve",
        "--model",
        "m",
        "--concurrency",
        "1,8",
        "--num-prompts",
        "4,8",
        "--port",
        str(port),
        "--result-dir",
        str(tmp_path / "r"),
        "--vllm",
        FAKE_VLLM,
        "--json",
        str(tmp_path / "out.json"),
    ]
    assert main(args) == 0
    out = capsys.readouterr().out
    assert "| 8 | 800 -> 840 | +5.0% |" in out
    data = json.loads((tmp_path / "out.json").read_text())
    assert len(data["results"]) == 4 and data["error"] is None
    assert [a["confirmed"] for a in data["arms"]] == [True, True]
    monkeypatch.setenv("FAKE_VLLM_QUIET", "1")  # no start-up lines: nothing to confirm
    assert main(args) == 2  # into the first run's --result-dir: refused
    assert "holds 6 file(s) of an earlier run" in capsys.readouterr().err
    args[args.index(str(tmp_path / "r"))] = str(tmp_path / "r2")
    assert main(args) == 1
    captured = capsys.readouterr()
    assert "plugin-off repeat 0: UNCONFIRMED" in captured.out
    assert (
        "could not confirm the arm of plugin-off repeat 0 (no 'ROCM_ATTN asm decode plugin "
        "inactive' line in the log); asm-decode repeat 0 (no 'ROCM_ATTN asm decode plugin "
        "registered' line in the log) from its server log;" in captured.err
    )
    assert "see that the servers log at INFO (VLLM_LOGGING_CONFIG_PATH)" in captured.err
    saved = json.loads((tmp_path / "out.json").read_text())  # the failure, as on stderr
    assert saved["error"].startswith("could not confirm the arm of plugin-off repeat 0")
    monkeypatch.delenv("FAKE_VLLM_QUIET")
    monkeypatch.setenv("FAKE_VLLM_ELIGIBLE", "0")  # (trial 14) logged, but no layer took asm
    args[args.index(str(tmp_path / "r2"))] = str(tmp_path / "r4")
    assert main(args) == 1
    err = capsys.readouterr().err
    assert "asm-decode repeat 0 (0 of 40 layers eligible: the asm decode never ran)" in err
    assert "see why with vllm-rocm-asm-decode plan --model m, then rerun" in err
    assert "VLLM_LOGGING_CONFIG_PATH" not in err
    monkeypatch.delenv("FAKE_VLLM_ELIGIBLE")
    args[args.index(str(tmp_path / "r4"))] = str(tmp_path / "r2")
    monkeypatch.setenv("FAKE_VLLM_SERVE_FAIL", "1")
    args[args.index(str(tmp_path / "r2"))] = str(tmp_path / "r3")
    assert main(args) == 1
    captured = capsys.readouterr()
    assert captured.out == ""  # nothing measured: no empty table
    (line,) = [x for x in captured.err.splitlines() if "bench serve: error" in x]
    assert "before /health" in line and line.endswith(
        f"(nothing was measured; rerun with another --result-dir, or move {tmp_path}/r3's "
        "files away)"
    )
    assert "results so far kept" not in captured.err


@pytest.mark.slow  # imports matplotlib
def test_serve_plot(tmp_path):
    from vllm_rocm_asm_decode.tools.validation.plots import plot_serve

    results = [run("plugin-off", 64, 4850, 15.5), run("asm-decode", 64, 5105, 16.5)]
    plot_serve(sb.summarize(results, "plugin-off"), "plugin-off", "m", str(tmp_path / "s.png"))
    assert (tmp_path / "s.png").read_bytes()[:4] == b"\x89PNG"


@pytest.mark.parametrize(
    ("content", "says"),
    [(None, "wrote no result file"), ("not json", "is not a vllm bench serve result")],
    ids=["missing", "garbage"],
)
def test_a_missing_or_broken_result_file_is_a_serve_error(tmp_path, content, says):
    path = tmp_path / "r.json"
    if content is not None:
        path.write_text(content)
    with pytest.raises(sb.ServeError, match=says):
        sb.parse_result(path, "asm-decode", 0)


def test_a_fifo_or_device_as_dataset_is_not_a_regular_file(tmp_path):
    fifo = tmp_path / "data.fifo"
    os.mkfifo(fifo)
    for path in (fifo, Path("/dev/null")):
        with pytest.raises(ValueError, match=f"--dataset-path {path} is not a regular file"):
            sb.ServeConfig(model="m", dataset="sharegpt", dataset_path=path)


def test_runs_are_made_as_the_run_reaches_them():
    """--repeats sizes nothing up front: the first runs of a huge count come at once."""
    import itertools

    first = list(itertools.islice(sb.arm_order("mha-off", 10**18), 3))
    assert first == [(0, "mha-off"), (0, "asm-decode"), (1, "asm-decode")]


def free_port6() -> int:
    with socket.socket(socket.AF_INET6) as s:
        s.bind(("::1", 0))
        return s.getsockname()[1]


@pytest.mark.slow
def test_an_ipv6_host_is_served_and_benchmarked(tmp_path):
    """--host ::1: the port is tried in IPv6, /health asked at http://[::1]:port."""
    from vllm_rocm_asm_decode.tools.cli import _port_taken

    port = free_port6()
    assert _port_taken("::1", port) is None and not sb.port_in_use("::1", port)
    outcome = sb.run_ab(config(tmp_path, host="::1", port=port), log=lambda _: None)
    assert outcome.error is None, outcome.error
    assert [(r.arm, r.concurrency) for r in outcome.results] == [
        ("plugin-off", 1),
        ("plugin-off", 64),
        ("asm-decode", 1),
        ("asm-decode", 64),
    ]


@pytest.mark.slow
def test_a_terminals_ctrl_c_reaches_the_command_not_the_benchmark_client(tmp_path):
    """A terminal's Ctrl-C signals the whole foreground process group. The benchmark
    client runs in a session of its own, so only bench serve takes it: it stops the
    client quietly, then the server, and says one line; no traceback of the client's."""
    import signal
    import subprocess
    import sys
    import threading
    import time

    port, result_dir = free_port(), tmp_path / "r"
    env = dict(os.environ, FAKE_VLLM_BENCH_SECONDS="60")
    code = "import sys\nfrom vllm_rocm_asm_decode.tools.cli import main\nsys.exit(main())\n"
    argv = [
        "bench", "serve", "--model", "m", "--vllm", FAKE_VLLM, "--port", str(port),
        "--concurrency", "1", "--num-prompts", "1", "--result-dir", str(result_dir),
    ]  # fmt: skip
    cli = subprocess.Popen(
        [sys.executable, "-c", code, *argv],
        env=env,
        stderr=subprocess.PIPE,
        text=True,
        start_new_session=True,  # its own process group, as a shell's foreground job
    )
    watchdog = threading.Timer(120, lambda: os.killpg(cli.pid, signal.SIGKILL))
    watchdog.start()
    lines = []
    try:
        for line in cli.stderr:
            lines.append(line)
            if line.startswith("== plugin-off (repeat 0): asm decode off"):
                time.sleep(1)  # the client is running its minute
                os.killpg(cli.pid, signal.SIGINT)  # what the terminal's Ctrl-C does
        cli.wait()
    finally:
        watchdog.cancel()
    assert cli.returncode == 130, lines
    assert "Traceback" not in "".join(lines) and "KeyboardInterrupt" not in "".join(lines)
    assert lines[-1].strip() == (
        "vllm-rocm-asm-decode bench serve: error: interrupted (nothing was measured; rerun "
        f"with another --result-dir, or move {result_dir}'s files away)"
    )
    assert not sb.port_in_use("127.0.0.1", port)


@pytest.mark.slow
@pytest.mark.parametrize(
    ("signame", "status", "said"),
    [("SIGINT", 130, "interrupted"), ("SIGTERM", 143, "terminated (SIGTERM)")],
)
def test_a_second_ctrl_c_kills_a_slow_server_and_the_json_is_written(
    tmp_path, signame, status, said
):
    """The first Ctrl-C (mid-run) stops the server, which drains slowly; the second
    kills its process group at once. --json is written, exit 130, no traceback. SIGTERM
    (timeout, systemd, Slurm) is taken the same way, exit 143, and named."""
    import signal
    import subprocess
    import sys
    import threading
    import time

    port, result_dir, target = free_port(), tmp_path / "r", tmp_path / "out.json"
    env = dict(os.environ, FAKE_VLLM_SLOW_STOP="300", FAKE_VLLM_BENCH_SECONDS="60")
    code = "import sys\nfrom vllm_rocm_asm_decode.tools.cli import main\nsys.exit(main())\n"
    argv = [
        "bench", "serve", "--model", "m", "--vllm", FAKE_VLLM, "--port", str(port),
        "--concurrency", "1", "--num-prompts", "1", "--result-dir", str(result_dir),
        "--json", str(target),
    ]  # fmt: skip
    cli = subprocess.Popen(
        [sys.executable, "-c", code, *argv], env=env, stderr=subprocess.PIPE, text=True
    )
    watchdog = threading.Timer(120, cli.kill)
    watchdog.start()
    server_log = result_dir / "server-plugin-off-r0.log"
    lines, second_at = [], None
    try:
        for line in cli.stderr:
            lines.append(line)
            if line.startswith("== plugin-off (repeat 0): asm decode off"):
                cli.send_signal(getattr(signal, signame))  # while vllm bench serve runs
            elif line.startswith("== stopping the plugin-off server"):
                deadline = time.monotonic() + 30
                while "stopping slowly" not in server_log.read_text():
                    assert time.monotonic() < deadline, server_log.read_text()
                    time.sleep(0.05)
                second_at = time.monotonic()
                cli.send_signal(getattr(signal, signame))  # again while it drains
                break
        cli.wait()
        ended_at = time.monotonic()
        # The rest of stderr, without waiting for its end: a Ctrl-C that lands while the
        # benchmark client is being started can leave that child (a terminal's Ctrl-C
        # reaches it too; this test's signal goes to the command alone) holding the pipe.
        os.set_blocking(cli.stderr.fileno(), False)
        lines += (cli.stderr.read() or "").splitlines(keepends=True)
    finally:
        watchdog.cancel()
    assert second_at is not None and ended_at - second_at < 20, lines
    assert cli.returncode == status, lines
    assert "Traceback" not in "".join(lines)
    assert lines[-1].strip() == (
        f"vllm-rocm-asm-decode bench serve: error: {said} (nothing was measured; rerun "
        f"with another --result-dir, or move {result_dir}'s files away)"
    )
    data = json.loads(target.read_text())
    assert data["interrupted"] is True and data["results"] == []
    assert data["error"] == said  # (trial 16: "interrupted" after a SIGTERM)
    pid = int(server_log.read_text().split("pid ", 1)[1].split()[0])
    assert not alive(pid)
    assert not sb.port_in_use("127.0.0.1", port)
