"""Every input error is one line and exit status 2, decided before torch or vLLM is
imported where the input can be judged without them; --help answers at once."""

from __future__ import annotations

import json
import subprocess
import sys
import urllib.error
from pathlib import Path

import pytest

from vllm_rocm_asm_decode.tools import choices
from vllm_rocm_asm_decode.tools.cli import _glue_serve_args, main

STAND_IN_VLLM = str(Path(__file__).resolve().parents[1] / "standins" / "bin" / "vllm")
CASES = {
    "tp-zero": (["plan", "-tp", "0"], "argument --tensor-parallel-size/-tp: 0 must be at least 1"),
    "block-word": (["plan", "--block-size", "x"], "argument --block-size: 'x' is not a whole"),
    "blocks-zero": (["plan", "--num-gpu-blocks", "0"], "--num-gpu-blocks: 0 must be at least 1"),
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
        "--host no.such.invalid does not resolve",
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
