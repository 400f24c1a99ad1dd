"""Every input error is one line and exit status 2, decided before torch or vLLM is
imported where the input can be judged without them; --help answers at once."""

from __future__ import annotations

import json
import subprocess
import sys
import urllib.error
from pathlib import Path

import pytest

from vllm_rocm_asm_decode.tools import choices, cli
from vllm_rocm_asm_decode.tools.cli import _glue_serve_args, main

SHAREGPT_ON_THIS_FILE = ["--dataset=sharegpt", f"--dataset-path={__file__}"]
STAND_IN_VLLM = str(Path(__file__).resolve().parents[1] / "standins" / "bin" / "vllm")
CASES = {
    "tp-zero": (["plan", "-tp", "0"], "argument --tensor-parallel-size/-tp: 0 must be at least 1"),
    "block-word": (["plan", "--block-size", "x"], "argument --block-size: 'x' is not a whole"),
    "blocks-zero": (["plan", "--num-gpu-blocks", "0"], "--num-gpu-blocks: 0 must be at least 1"),
    "blocks-past-int32": (
        ["plan", "--num-gpu-blocks", "1000000000000"],
        "1000000000000 is more blocks than vLLM's int32 block ids reach (2147483647)",
    ),
    "blocks-past-memory": (
        ["plan", "--gpu", "mi300x", "--num-gpu-blocks", "100000000"],
        "--num-gpu-blocks 100000000: that KV cache takes 122070 GiB per rank, more than the "
        "MI300X's 192 GiB",
    ),
    "graph-mode": (["plan", "--cudagraph-mode", "eager"], "'eager' is not one of FULL_AND"),
    "aiter-version": (["plan", "--aiter-version", "x.y"], "'x.y' is not a version"),
    "len-zero": (["plan", "--max-model-len", "0"], "--max-model-len: 0 must be at least 1"),
    "dtype": (["plan", "--dtype", "fp64"], "argument --dtype: 'fp64' is not one of"),
    "kv-dtype": (["plan", "--kv-cache-dtype", "int4"], "'int4' is not one of fp8, fp8_e4m3"),
    "file-as-model": (["plan", "--model", __file__], "is a file; give the model's directory"),
    "hf-id": (["plan", "--model", "meta-llama/Llama-3.1-8B"], "only local directories"),
    "empty-model": (["plan", "--model", " "], "--model is empty"),
    "wide-gqa": (["check", "accuracy", "--heads", "64/4"], "GQA above 8 has no"),
    "huge-context": (["check", "accuracy", "--contexts", "5000000"], "at most 131072"),
    "prompts-zero": (["check", "passkey", "--model", "m", "--prompts", "0"], "at least 1"),
    "in-flight-zero": (["check", "passkey", "--model", "m", "--in-flight", "0"], "at least 1"),
    "iters-zero": (["bench", "kernel", "--iters", "0"], "--iters: 0 must be at least 1"),
    "port": (["bench", "serve", "--model", "m", "--port", "99999"], "not a TCP port"),
    "utilization": (
        ["bench", "serve", "--model", "m", "--gpu-memory-utilization", "1.5"],
        "must be in (0, 1]",
    ),
    "no-vllm": (["bench", "serve", "--model", "m", "--vllm", "no-such-vllm"], "no such exec"),
    "result-dir-file": (
        ["bench", "serve", "--model", "m", "--vllm", STAND_IN_VLLM, "--result-dir", __file__],
        "is a file",
    ),
    "serve-json-unwritable": (
        ["bench", "serve", "--model", "m", "--vllm", STAND_IN_VLLM, "--json", "/no/dir/x.json"],
        "--json /no/dir/x.json: /no/dir is not a directory",
    ),
    "host-unresolvable": (
        ["bench", "serve", "--model", "m", "--vllm", STAND_IN_VLLM, "--host", "no.such.invalid"],
        "--host 'no.such.invalid' does not resolve",
    ),
    "serve-arg-port": (
        ["bench", "serve", "--model", "m", "--vllm", STAND_IN_VLLM, "--serve-arg", "--port=9000"],
        "--serve-arg --port=9000: bench serve sets --port itself; use bench serve's --port",
    ),
    "serve-arg-kv-dtype": (
        ["bench", "serve", "--model", "m", "--vllm", STAND_IN_VLLM, "--serve-arg=--kv_cache_dtype"],
        "--serve-arg --kv_cache_dtype: bench serve sets --kv-cache-dtype itself (both arms",
    ),
    "serve-arg-tp": (
        ["bench", "serve", "--model", "m", "--vllm", STAND_IN_VLLM, "--serve-arg", "-tp 2"],
        "bench serve sets -tp itself; use bench serve's --tensor-parallel-size",
    ),
    "dataset-path-alone": (
        ["bench", "serve", "--model", "m", "--vllm", STAND_IN_VLLM, "--dataset-path", __file__],
        "is read only with --dataset sharegpt (the random dataset has no file)",
    ),
    "sharegpt-not-json": (
        ["bench", "serve", "--model=m", f"--vllm={STAND_IN_VLLM}", *SHAREGPT_ON_THIS_FILE],
        "test_cli_input.py is not a JSON list",
    ),
    "host-empty": (["bench", "serve", "--model", "m", "--host", ""], "--host: must not be empty"),
    "host-label-too-long": (
        ["bench", "serve", "--model", "m", "--vllm", STAND_IN_VLLM, "--host", "a" * 64 + ".x"],
        "does not resolve (encoding with 'idna' codec failed",
    ),
    "gpu-unknown": (["plan", "--gpu", "mi250"], "argument --gpu: unknown GPU 'mi250'; choose"),
    "passkey-port-text": (
        ["check", "passkey", "--model", "m", "--base-url", "http://127.0.0.1:abc"],
        "'http://127.0.0.1:abc': the host or port is not valid",
    ),
    "passkey-url-space": (
        ["check", "passkey", "--model", "m", "--base-url", "http://h/a b"],
        "'http://h/a b' has spaces or control characters",
    ),
    "passkey-no-host": (
        ["check", "passkey", "--model", "m", "--base-url", "http://"],
        "'http://' is not an http(s) URL with a host",
    ),
    "passkey-url": (["check", "passkey", "--model", "m", "--base-url", "x"], "not an http(s) URL"),
    "passkey-timeout-inf": (
        ["check", "passkey", "--model", "m", "--timeout", "inf"],
        "must be a finite number above 0",
    ),
    "passkey-lengths": (["check", "passkey", "--model", "m", "--lengths", "200000000"], "at most"),
    "passkey-model-empty": (["check", "passkey", "--model", ""], "must not be empty"),
    "huge-seed": (["check", "accuracy", "--seeds", "99999999999999999999"], "at most"),
    "accuracy-json-empty": (["check", "accuracy", "--json", ""], "must not be empty"),
    "kernel-precision": (["bench", "kernel", "--precision", "fast"], "'fast': use uhp or default"),
    "kernel-json-unwritable": (["bench", "kernel", "--json", "/no/dir/k.json"], "is not a dir"),
    "serve-model-empty": (["bench", "serve", "--model", ""], "must not be empty"),
    "serve-plot-unwritable": (
        ["bench", "serve", "--model", "m", "--vllm", STAND_IN_VLLM, "--plot", "/no/dir/s.png"],
        "--plot /no/dir/s.png: /no/dir is not a directory",
    ),
    "accuracy-json-unwritable": (
        ["check", "accuracy", "--json", "/no/dir/a.json"],
        "--json /no/dir/a.json: /no/dir is not a directory",
    ),
}


def run(argv):
    try:
        return main(argv)
    except SystemExit as exc:  # argparse's own usage errors
        return exc.code


@pytest.mark.parametrize("case", list(CASES), ids=list(CASES))
def test_bad_input_is_one_line_and_exit_2(case, capsys):
    argv, message = CASES[case]
    assert run(argv) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and message in err[0], err


def test_seeds_may_start_at_zero_as_documented():
    assert choices.seeds("0,1,2") == [0, 1, 2]


def test_a_model_directory_wins_over_a_preset_of_the_same_name(tmp_path, monkeypatch):
    import harness

    harness.write_model_dir(tmp_path / "qwen3-8b", num_heads=16, num_kv_heads=4)
    (tmp_path / "qwen3-14b-fp8").mkdir()  # a stray directory without config.json
    (tmp_path / "llama-3.1-8b-instruct").write_text("a file")
    monkeypatch.chdir(tmp_path)
    path, label = choices.resolve_model_dir("qwen3-8b")
    assert path.resolve() == tmp_path / "qwen3-8b" and not label.startswith("preset")
    for preset in ("qwen3-14b-fp8", "llama-3.1-8b-instruct"):  # no model there: the preset
        assert choices.resolve_model_dir(preset)[1] == f"preset {preset}"
    with pytest.raises(choices.InputError, match="cannot read"):
        choices.resolve_model_dir("./qwen3-14b-fp8")  # written as a path: a path


def test_serve_args_that_look_like_options_are_accepted():
    assert _glue_serve_args(["bench", "serve", "--serve-arg", "--enforce-eager", "--x"]) == [
        "bench",
        "serve",
        "--serve-arg=--enforce-eager",
        "--x",
    ]


PRESET_CONFIG = choices.PRESETS_DIR / "qwen3-14b-fp8" / "config.json"  # 40 / 8 heads
#: config.json edits (and plan options) that config.json alone decides, and the line.
CONFIG_CASES = {
    "zero-layers": ({"num_hidden_layers": 0}, [], "num_hidden_layers is 0; it must be a whole"),
    "negative-layers": ({"num_hidden_layers": -2}, [], "num_hidden_layers is -2; it must be"),
    # plan builds a layer per count: a billion would run until memory ran out.
    "billion-layers": (
        {"num_hidden_layers": 10**9},
        [],
        "num_hidden_layers is 1000000000; no model has more than 1024 layers",
    ),
    "zero-kv-heads": ({"num_key_value_heads": 0}, [], "num_key_value_heads is 0; it must be"),
    "text-heads": ({"num_attention_heads": "40"}, [], 'num_attention_heads is "40"; it must'),
    "heads-not-a-multiple": (
        {"num_key_value_heads": 6},
        [],
        "num_attention_heads 40 is not a multiple of num_key_value_heads 6; not a model vLLM",
    ),
    "tp-splits-no-heads": ({}, ["-tp", "3"], "--tensor-parallel-size 3 does not divide the 40"),
    "tp-splits-no-kv-heads": (
        {"num_attention_heads": 48},
        ["-tp", "12"],
        "--tensor-parallel-size 12 neither divides the 8 KV heads nor is a multiple of them",
    ),
    "no-layer-count": ({"num_hidden_layers": None}, [], "has no layer count (num_hidden_layers)"),
    "nested-text-config": (
        {"text_config": {"num_attention_heads": 40, "num_hidden_layers": 0}},
        [],
        "num_hidden_layers is 0",
    ),
}


def _config_case(root: Path, case: str) -> list[str]:
    edit, options, _ = CONFIG_CASES[case]
    config = json.loads(PRESET_CONFIG.read_text())
    if "text_config" in edit:  # a multimodal config: the language model's fields nest
        config = {"model_type": "llava", "text_config": edit["text_config"]}
    else:
        config.update(edit)
        config = {k: v for k, v in config.items() if v is not None}  # None: left out
    model = root / case
    model.mkdir()
    (model / "config.json").write_text(json.dumps(config))
    return ["plan", "--model", str(model), *options]


@pytest.mark.parametrize("case", list(CONFIG_CASES), ids=list(CONFIG_CASES))
def test_what_config_json_decides_is_one_line_and_exit_2(case, tmp_path, capsys):
    assert run(_config_case(tmp_path, case)) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and CONFIG_CASES[case][2] in err[0], err


def test_config_json_errors_come_before_vllm_loads(tmp_path):
    """In a fresh interpreter: every config.json case answers without importing torch or
    vLLM, in well under a second each (vLLM takes about 10 s to import here)."""
    cases = {case: _config_case(tmp_path, case) for case in CONFIG_CASES}
    code = (
        "import json, sys, time\n"
        "from vllm_rocm_asm_decode.tools.cli import main\n"
        f"cases = json.loads({json.dumps(json.dumps(cases))})\n"
        "seconds = {}\n"
        "for name, argv in cases.items():\n"
        "    start = time.perf_counter()\n"
        "    assert main(argv) == 2, name\n"
        "    seconds[name] = time.perf_counter() - start\n"
        "print('LOADED', 'torch' in sys.modules, 'vllm' in sys.modules)\n"
        "print('SECONDS', json.dumps(seconds))\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    lines = dict(line.split(" ", 1) for line in out.stdout.splitlines() if " " in line)
    assert lines.get("LOADED") == "False False", out.stderr[-2000:]
    seconds = json.loads(lines["SECONDS"])
    assert set(seconds) == set(CONFIG_CASES) and max(seconds.values()) < 1.0, seconds


def test_help_and_usage_errors_import_neither_torch_nor_vllm():
    """In a fresh interpreter: what answering --help and a usage error imports (what
    makes them take seconds). Timing itself is measured, not gated: see the note."""
    code = (
        "import sys\n"
        "from vllm_rocm_asm_decode.tools.cli import main\n"
        "for argv in (['--help'], ['plan', '--help'], ['plan', '-tp', '0']):\n"
        "    try:\n"
        "        main(argv)\n"
        "    except SystemExit:\n"
        "        pass\n"
        "print('LOADED', 'torch' in sys.modules, 'vllm' in sys.modules)"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    loaded = [line for line in out.stdout.splitlines() if line.startswith("LOADED")]
    assert loaded == ["LOADED False False"], out.stderr[-2000:]


class _Reply:
    def __init__(self, body: bytes):
        self.body = body

    def __enter__(self):
        return self

    def __exit__(self, *a):
        return False

    def read(self):
        return self.body


@pytest.mark.parametrize(
    ("answer", "message"),
    [
        (json.dumps({"choices": []}).encode(), "the reply has no completion text"),
        (b"<html>", "the reply is not JSON"),
        ("http400", "HTTP 400: context length exceeded"),
    ],
    ids=["empty-choices", "not-json", "http-400"],
)
def test_passkey_server_answers_that_are_not_completions(answer, message, monkeypatch, capsys):
    import io

    from vllm_rocm_asm_decode.tools.validation import passkey

    def urlopen(request, timeout):
        if answer == "http400":
            raise urllib.error.HTTPError(
                request.full_url, 400, "Bad Request", {}, io.BytesIO(b"context length exceeded")
            )
        return _Reply(answer)

    monkeypatch.setattr(passkey.urllib.request, "urlopen", urlopen)
    assert run(["check", "passkey", "--model", "m", "--prompts", "1", "--lengths", "100"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and message in err[0], err


@pytest.mark.parametrize(
    ("var", "value", "message"),
    [
        ("VLLM_ROCM_ASM_DECODE_CUT", "-1", "VLLM_ROCM_ASM_DECODE_CUT='-1'"),
        ("VLLM_ROCM_ASM_DECODE_TRUST_AITER", "2", "VLLM_ROCM_ASM_DECODE_TRUST_AITER='2'"),
        ("VLLM_PLUGINS", "x", "leaves out rocm_asm_decode"),
    ],
    ids=["cut", "trust", "plugins"],
)
def test_bench_serve_refuses_an_environment_that_would_stop_or_skip_the_plugin(
    var, value, message, monkeypatch, capsys
):
    monkeypatch.setenv(var, value)
    assert run(["bench", "serve", "--model", "m", "--vllm", STAND_IN_VLLM]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and message in err[0], err


def test_plan_says_on_a_terminal_what_it_loads_when_it_takes_a_while(monkeypatch, capsys):
    """On a terminal the note shows while vLLM loads and is erased after (an error that
    follows stays one line); a pipe or a log gets no note."""
    import time

    from vllm_rocm_asm_decode.tools import cli

    with cli._said_after(0.0, "piped"):
        time.sleep(0.1)
    assert capsys.readouterr().err == ""
    monkeypatch.setattr(sys.stderr, "isatty", lambda: True)
    with cli._said_after(0.05, "slow"):
        time.sleep(0.3)
    with cli._said_after(5.0, "never"):
        pass
    assert capsys.readouterr().err == "slow\r\033[K"
    monkeypatch.setattr(cli, "NOTE_AFTER", 0.0)
    assert main(["plan", "--gpu", "mi355x"]) == 0
    captured = capsys.readouterr()
    note = "vllm-rocm-asm-decode plan: loading vLLM to read preset qwen3-14b-fp8 ..."
    assert captured.err == note + "\r\033[K"
    assert captured.out.startswith("model      preset qwen3-14b-fp8")


def test_the_heavy_commands_say_what_is_missing_without_torch_or_vllm(monkeypatch, capsys):
    import importlib.util

    real = importlib.util.find_spec
    monkeypatch.setattr(
        importlib.util, "find_spec", lambda name, *a: None if name == "torch" else real(name, *a)
    )
    for argv in (["plan"], ["doctor"], ["bench", "kernel"], ["check", "accuracy"]):
        assert run(argv) == 2
        (line,) = capsys.readouterr().err.strip().splitlines()
        assert line.startswith(f"vllm-rocm-asm-decode {' '.join(argv)}: error: torch not ")


def test_bench_serve_refuses_a_taken_port_and_a_plot_without_matplotlib(monkeypatch, capsys):
    import importlib.util
    import socket

    with socket.socket() as held:
        held.bind(("127.0.0.1", 0))
        held.listen()
        port = str(held.getsockname()[1])
        argv = ["bench", "serve", "--model", "m", "--vllm", STAND_IN_VLLM, "--port", port]
        assert run(argv) == 2
        (line,) = capsys.readouterr().err.strip().splitlines()
        assert f"--host '127.0.0.1' --port {port}: cannot listen there" in line
    real = importlib.util.find_spec
    monkeypatch.setattr(
        importlib.util, "find_spec", lambda n, *a: None if n == "matplotlib" else real(n, *a)
    )
    assert run(["bench", "serve", "--model", "m", "--vllm", STAND_IN_VLLM, "--plot", "p.png"]) == 2
    (line,) = capsys.readouterr().err.strip().splitlines()
    assert "--plot p.png needs matplotlib" in line


@pytest.mark.parametrize(
    ("reply", "says"),
    [
        ("bad-status", "the reply is not an HTTP answer (BadStatusLine)"),
        ("incomplete", "the reply is not an HTTP answer (IncompleteRead)"),
        (json.dumps({"choices": {"a": 1}}).encode(), "the reply has no completion text"),
    ],
    ids=["not-http", "cut-short", "choices-not-a-list"],
)
def test_passkey_replies_that_are_not_completions_are_one_line(reply, says, monkeypatch, capsys):
    import http.client

    from vllm_rocm_asm_decode.tools.validation import passkey

    def urlopen(request, timeout):
        if reply == "bad-status":
            raise http.client.BadStatusLine("garbage")
        if reply == "incomplete":
            raise http.client.IncompleteRead(b"{")
        return _Reply(reply)

    monkeypatch.setattr(passkey.urllib.request, "urlopen", urlopen)
    assert run(["check", "passkey", "--model", "m", "--prompts", "1", "--lengths", "100"]) == 2
    (line,) = capsys.readouterr().err.strip().splitlines()
    assert says in line


@pytest.mark.parametrize("command", [["plan"], ["check", "accuracy"], ["upstream", "."]])
def test_ctrl_c_is_one_line_and_exit_130(monkeypatch, capsys, command):
    """Ctrl-C mid-command (vLLM loading, a kernel running) ends it without a traceback."""

    def interrupted(*_args, **_kwargs):
        raise KeyboardInterrupt

    for name in ("_plan", "_missing_runtime", "_settings_problem"):
        monkeypatch.setattr(cli, name, interrupted if name == "_plan" else lambda: None)
    monkeypatch.setattr("vllm_rocm_asm_decode.tools.upstream.main", interrupted)
    monkeypatch.setattr("vllm_rocm_asm_decode.tools.validation.accuracy.main", interrupted)
    assert cli.main(command) == 130
    out, err = capsys.readouterr()
    assert out == "" and err.strip() == "vllm-rocm-asm-decode: interrupted"
