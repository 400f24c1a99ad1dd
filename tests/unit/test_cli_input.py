"""Every input error is one line and exit status 2, decided before torch or vLLM is
imported where the input can be judged without them; --help answers at once."""

from __future__ import annotations

import ast
import importlib.metadata
import json
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from vllm_rocm_asm_decode.tools import choices, cli
from vllm_rocm_asm_decode.tools.cli import _glue_serve_args, main

SHAREGPT_ON_THIS_FILE = ["--dataset=sharegpt", f"--dataset-path={__file__}"]
DATA = Path(__file__).resolve().parents[1] / "data"
STAND_IN_VLLM = str(Path(__file__).resolve().parents[1] / "standins" / "bin" / "vllm")
#: A file name longer than Linux file systems take (255 bytes), in a directory that exists.
LONG_NAME = "/tmp/" + "a" * 300 + ".json"
#: A directory to make whose second name is too long (its first does not exist either).
LONG_DIR = "/tmp/no-such-dir-here/" + "b" * 300
UNDER_FILE = f"{__file__}/results"
SHAREGPT_ON_DEV_NULL = ["--dataset=sharegpt", "--dataset-path=/dev/null"]
CASES = {
    # (trial 26) "give a command first" misled: --version is one of the tool's own.
    "top-level-typo": (
        ["--versio"],
        "vllm-rocm-asm-decode: error: unrecognized arguments: --versio (did you mean --version?)",
    ),
    "top-level-option-of-a-command": (
        ["--model", "m"],
        "vllm-rocm-asm-decode: error: unrecognized arguments: --model (give a command first",
    ),
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
    "block-past-memory": (  # without --num-gpu-blocks: one block is past the GPU
        ["plan", "--gpu", "mi300x", "--block-size", "1600000000000"],
        "--block-size 1600000000000: one block takes 122070312 GiB per rank, more than the "
        "MI300X's 192 GiB",
    ),
    "block-far-past-memory": (  # (trial 25) exact: no float artifact in its digits
        ["plan", "--gpu", "mi300x", "--block-size", "16000000000000000000000000"],
        "one block takes 1220703125000000000000 GiB per rank, more than the MI300X's",
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
    "vllm-a-directory": (  # (trial 13) said so, not that --result-dir lies in it
        ["bench", "serve", "--model", "m", "--vllm", "/tmp", "--result-dir", "/tmp/r"],
        "--vllm /tmp is a directory, not a program (is vLLM installed and on PATH?)",
    ),
    "result-dir-file": (
        ["bench", "serve", "--model", "m", "--vllm", STAND_IN_VLLM, "--result-dir", __file__],
        "is a file",
    ),
    "serve-json-unwritable": (
        ["bench", "serve", "--model", "m", "--vllm", STAND_IN_VLLM, "--json", "/no/dir/x.json"],
        "--json /no/dir/x.json: /no/dir does not exist",
    ),
    "serve-json-under-a-file": (
        ["bench", "serve", "--model", "m", "--vllm", STAND_IN_VLLM, "--json", f"{UNDER_FILE}/x"],
        f"--json {UNDER_FILE}/x: {__file__} is not a directory",
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
    "contexts-empty-item": (
        ["check", "accuracy", "--contexts", "1,"],
        "'1,' is not a comma-separated list of integers",
    ),
    "seqs-empty-item": (
        ["bench", "kernel", "--seqs", "1,,2"],
        "'1,,2' is not a comma-separated list of integers",
    ),
    # A list whose items each name a run, a row or a file refuses a repeated item.
    "concurrency-twice": (
        ["bench", "serve", "--model", "m", "--concurrency", "1,64,64", "--num-prompts", "2,4,4"],
        "argument --concurrency: '1,64,64': 64 is given twice",
    ),
    "seqs-twice": (["bench", "kernel", "--seqs", "16,16"], "'16,16': 16 is given twice"),
    "seeds-twice": (["check", "accuracy", "--seeds", "0,0"], "'0,0': 0 is given twice"),
    "heads-twice": (["check", "accuracy", "--heads", "32/4,32/4"], "32/4 is given twice"),
    "lengths-twice": (
        ["check", "passkey", "--model", "m", "--lengths", "3000,3000"],
        "'3000,3000': 3000 is given twice",
    ),
    "serve-arg-model": (
        ["bench", "serve", "--model", "m", "--vllm", STAND_IN_VLLM, "--serve-arg", "--model=foo"],
        "--serve-arg --model=foo: bench serve sets --model itself; use bench serve's --model",
    ),
    # (trial 26) Passed to the server, while the client asked for "m": every request
    # failed, minutes into the run.
    "serve-arg-served-model-name": (
        ["bench", "serve", "--model", "m", "--vllm", STAND_IN_VLLM, "--serve-arg=--served_model=x"],
        "--serve-arg --served_model=x: vLLM may read it as --served-model-name; bench serve sets "
        "--served-model-name itself (its client asks for the model by --model's name)",
    ),
    "serve-arg-tp": (
        ["bench", "serve", "--model", "m", "--vllm", STAND_IN_VLLM, "--serve-arg", "-tp 2"],
        "bench serve sets -tp itself; use bench serve's --tensor-parallel-size",
    ),
    "serve-arg-abbreviated": (
        ["bench", "serve", "--model", "m", "--vllm", STAND_IN_VLLM, "--serve-arg=--max_model=9"],
        "--serve-arg --max_model=9: vLLM may read it as --max-model-len; bench serve sets "
        "--max-model-len itself; use bench serve's --max-model-len",
    ),
    "serve-max-model-len-short": (
        ["bench", "serve", "--model", "m", "--vllm", STAND_IN_VLLM, "--max-model-len", "2047"],
        "--max-model-len 2047 is below a request's --input-len 1024 + --output-len 1024 tokens",
    ),
    "dataset-path-alone": (
        ["bench", "serve", "--model", "m", "--vllm", STAND_IN_VLLM, "--dataset-path", __file__],
        "is read only with --dataset sharegpt (the random dataset has no file)",
    ),
    "sharegpt-bom": (
        [
            "bench",
            "serve",
            "--model=m",
            f"--vllm={STAND_IN_VLLM}",
            "--dataset=sharegpt",
            f"--dataset-path={DATA / 'sharegpt-bom.json'}",
        ],
        "sharegpt-bom.json starts with a byte-order mark (U+FEFF), which vLLM's JSON",
    ),
    "serve-plot-not-png": (
        ["bench", "serve", "--model", "m", "--vllm", STAND_IN_VLLM, "--plot", "p.txt"],
        "--plot p.txt: the plot is a PNG: give a path ending in .png",
    ),
    "kernel-plot-no-suffix": (
        ["bench", "kernel", "--plot", "plot"],
        "--plot plot: the plot is a PNG: give a path ending in .png",
    ),
    "serve-vllm-empty": (
        ["bench", "serve", "--model", "m", "--vllm", ""],
        "bench serve: error: argument --vllm: must not be empty",
    ),
    "serve-vllm-not-executable": (
        ["bench", "serve", "--model", "m", "--vllm", __file__],
        f"--vllm {__file__} is not an executable file (chmod +x it",
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
    "plan-hugging-face-id-of-a-preset": (
        ["plan", "--model", "Qwen/Qwen3-8B"],
        "download the model, then give its directory); --model qwen3-8b plans it from its "
        "bundled config.json",
    ),
    "plan-preset-in-capitals": (
        ["plan", "--model", "QWEN3-8B"],
        "unknown model preset 'QWEN3-8B'; --model qwen3-8b plans it from its bundled",
    ),
    "passkey-length-below-a-prompt": (
        ["check", "passkey", "--model", "m", "--lengths", "3000,1"],
        "'3000,1': give integers of at least 100",
    ),
    "passkey-base-url-an-endpoint": (
        ["check", "passkey", "--model", "m", "--base-url", "http://h:8000/v1/completions"],
        "is an endpoint: give the server's URL",
    ),
    "kernel-skew-two-seqs": (
        ["bench", "kernel", "--skew", "--seqs", "1,2"],
        "bench kernel: error: --skew takes one --seqs value, not 2",
    ),
    "kernel-sweep-two-contexts": (
        ["bench", "kernel", "--sweep", "--contexts", "1024,2048"],
        "bench kernel: error: --sweep takes one --contexts value, not 2",
    ),
    "huge-seed": (["check", "accuracy", "--seeds", "99999999999999999999"], "at most"),
    "aiter-version-empty": (
        ["plan", "--model", "qwen3-8b", "--aiter-version", ""],
        "'' is not a version (e.g. 0.1.22), 'installed' or 'unknown'",
    ),
    # A list given twice: argparse would keep the second alone, unseen.
    "heads-option-twice": (
        ["check", "accuracy", "--heads", "40/8", "--heads", "32/8"],
        "check accuracy: error: argument --heads: given twice; give its values once, "
        "comma-separated (Q/KV,...)",
    ),
    "concurrency-option-twice": (
        ["bench", "serve", "--model", "m", "--concurrency", "1", "--concurrency=64"],
        "argument --concurrency: given twice",
    ),
    "accuracy-json-empty": (["check", "accuracy", "--json", ""], "must not be empty"),
    "kernel-precision": (["bench", "kernel", "--precision", "fast"], "'fast': use uhp or default"),
    "kernel-json-unwritable": (
        ["bench", "kernel", "--json", "/no/dir/k.json"],
        "/no/dir does not exist",
    ),
    "serve-model-empty": (["bench", "serve", "--model", ""], "must not be empty"),
    "serve-plot-unwritable": (
        ["bench", "serve", "--model", "m", "--vllm", STAND_IN_VLLM, "--plot", "/no/dir/s.png"],
        "--plot /no/dir/s.png: /no/dir does not exist",
    ),
    "accuracy-json-unwritable": (
        ["check", "accuracy", "--json", "/no/dir/a.json"],
        "--json /no/dir/a.json: /no/dir does not exist",
    ),
    # 3: names too long for the file system, before any work
    "accuracy-json-name-too-long": (
        ["check", "accuracy", "--json", LONG_NAME],
        f"check accuracy: error: --json {LONG_NAME}: File name too long",
    ),
    "kernel-json-name-too-long": (
        ["bench", "kernel", "--json", LONG_NAME],
        f"bench kernel: error: --json {LONG_NAME}: File name too long",
    ),
    "serve-json-name-too-long": (
        ["bench", "serve", "--model", "m", "--vllm", STAND_IN_VLLM, "--json", LONG_NAME],
        f"bench serve: error: --json {LONG_NAME}: File name too long",
    ),
    "result-dir-name-too-long": (
        ["bench", "serve", "--model", "m", "--vllm", STAND_IN_VLLM, "--result-dir", LONG_DIR],
        f"--result-dir {LONG_DIR} cannot be made: {'b' * 40}... is longer than 255 bytes",
    ),
    # --json naming a directory, or ending in a separator
    "accuracy-json-trailing-slash": (
        ["check", "accuracy", "--json", "no-such-dir/"],
        "--json no-such-dir/ ends in a path separator; give a file name",
    ),
    "kernel-json-a-directory": (
        ["bench", "kernel", "--json", "/tmp"],
        "bench kernel: error: --json /tmp is a directory",
    ),
    # 6: a result directory that cannot be made
    "result-dir-under-a-file": (
        ["bench", "serve", "--model", "m", "--vllm", STAND_IN_VLLM, "--result-dir", UNDER_FILE],
        f"--result-dir {UNDER_FILE} cannot be made: {__file__} is not a directory",
    ),
    "result-dir-empty": (
        ["bench", "serve", "--model", "m", "--result-dir", ""],
        "bench serve: error: argument --result-dir: must not be empty",
    ),
    "serve-arg-empty": (
        ["bench", "serve", "--model", "m", "--serve-arg", ""],
        "bench serve: error: argument --serve-arg: must not be empty",
    ),
    "dataset-path-empty": (
        ["bench", "serve", "--model", "m", "--dataset", "sharegpt", "--dataset-path", " "],
        "bench serve: error: argument --dataset-path: must not be empty",
    ),
    # 8, 9, 14: bounds on what an option can make a tool do or hold
    "passkey-timeout-huge": (
        ["check", "passkey", "--model", "m", "--timeout", "1e300"],
        "check passkey: error: argument --timeout: 1e300: at most 86400 seconds (a day)",
    ),
    "health-timeout-huge": (
        ["bench", "serve", "--model", "m", "--health-timeout", "1e9"],
        "argument --health-timeout: 1e9: at most 86400 seconds (a day)",
    ),
    "passkey-prompts-huge": (
        ["check", "passkey", "--model", "m", "--prompts", "100000000", "--lengths", "131072"],
        "argument --prompts: 100000000 is more than 10000 prompts per length",
    ),
    "passkey-in-flight-huge": (
        ["check", "passkey", "--model", "m", "--in-flight", "100000"],
        "argument --in-flight: 100000 is more than 1024 requests in flight",
    ),
    "repeats-huge": (
        ["bench", "serve", "--model", "m", "--repeats", "99999999999999999999"],
        "argument --repeats: 99999999999999999999 is more than 1000 repeats (each starts two",
    ),
    "accuracy-case-too-big": (
        ["check", "accuracy", "--heads", "4096/512", "--contexts", "131072"],
        "check accuracy: error: --heads 4096/512 over --contexts 131072 takes about",
    ),
    "accuracy-case-too-big-says-the-limit": (
        ["check", "accuracy", "--heads", "40/8,4096/512", "--contexts", "131072"],
        "GiB of memory per case, more than the 16.0 GiB allowed; give fewer heads or shorter",
    ),
    "kernel-case-too-big": (
        ["bench", "kernel", "--heads", "40/8", "--contexts", "131072", "--seqs", "100000"],
        "bench kernel: error: the largest case (40/8 heads, 100000 sequences of 131072 tokens) "
        "needs a KV cache of",
    ),
    "kernel-case-just-too-big": (  # 16 MiB over: the two sizes must not read alike
        ["bench", "kernel", "--heads", "40/8", "--contexts", "131072", "--seqs", "256"],
        "needs a KV cache of 64.02 GiB, more than the 64.00 GiB allowed",
    ),
    "kernel-skew-without-a-longer-length": (
        ["bench", "kernel", "--skew", "--contexts", "131072"],
        "give a --contexts value below 131072",
    ),
    # 21: URLs that cannot be dialled as written
    "passkey-host-label-64": (
        ["check", "passkey", "--model", "m", "--base-url", f"http://{'a' * 64}.example:8000"],
        "the host must be an IP address or a host name whose labels (between dots) are 1 to 63",
    ),
    "passkey-userinfo": (
        ["check", "passkey", "--model", "m", "--base-url", "http://u:p@127.0.0.1:18801"],
        "'http://u:p@127.0.0.1:18801': a user name or password in the URL is not supported",
    ),
    # 23: a dataset path that is not a regular file
    "dataset-path-dev-null": (
        ["bench", "serve", "--model", "m", f"--vllm={STAND_IN_VLLM}", *SHAREGPT_ON_DEV_NULL],
        "--dataset-path /dev/null is not a regular file (a FIFO, a device or /dev/null)",
    ),
    # numbers in ASCII digits only
    "tp-fullwidth-digit": (
        ["plan", "-tp", "\uff14"],
        "argument --tensor-parallel-size/-tp: '\uff14' is not a whole number (ASCII digits)",
    ),
    "seeds-arabic-indic": (
        ["check", "accuracy", "--seeds", "\u0663"],
        "argument --seeds: '\u0663' is not a comma-separated list of integers",
    ),
    "heads-arabic-indic": (
        ["check", "accuracy", "--heads", "\u0664\u0660/\u0668"],
        "argument --heads: '\u0664\u0660/\u0668': give query/KV head pairs",
    ),
    "timeout-arabic-indic": (
        ["check", "passkey", "--model", "m", "--timeout", "\u0663"],
        "argument --timeout: '\u0663' is not a number (ASCII digits)",
    ),
    "passkey-seed-underscore": (
        ["check", "passkey", "--model", "m", "--seed", "1_000"],
        "argument --seed: '1_000' is not a whole number (ASCII digits)",
    ),
    "passkey-seed-negative": (
        ["check", "passkey", "--model", "m", "--seed", "-1"],
        "argument --seed: -1 is not a seed from 0 to 4294967295",
    ),
    "kernel-iters-huge": (
        ["bench", "kernel", "--iters", "999999999999999999999"],
        "argument --iters: 999999999999999999999 is more than 1000000 graph replays",
    ),
    # unrecognized arguments name the subcommand
    "unrecognized-plan": (
        ["plan", "--bogus"],
        "vllm-rocm-asm-decode plan: error: unrecognized arguments: --bogus",
    ),
    "unrecognized-bench-serve": (
        ["bench", "serve", "--model", "m", "extra"],
        "vllm-rocm-asm-decode bench serve: error: unrecognized arguments: extra",
    ),
    "unrecognized-check-passkey": (
        ["check", "passkey", "--model", "m", "--jsn", "x"],
        "vllm-rocm-asm-decode check passkey: error: unrecognized arguments: --jsn x",
    ),
    "model-without-model": (  # as vllm serve takes it
        ["plan", "--gpu", "mi300x", "qwen3-8b"],
        "unrecognized arguments: qwen3-8b (name the model with --model qwen3-8b)",
    ),
    "upstream-dir-with-a-dash": (  # (trial 24) argparse took it for an option
        ["upstream", "--stage", "1", "-dash"],
        "required: DIR (-dash is not an option of upstream; a path that starts with a "
        "dash goes after --: vllm-rocm-asm-decode upstream -- -dash)",
    ),
    "upstream-without-dir": (  # no dashed word: argparse's line alone
        ["upstream", "--check"],
        "upstream: error: the following arguments are required: DIR",
    ),
    "serve-arg-with-its-value-apart": (
        ["bench", "serve", "--model", "m", "--serve-arg", "--max-num-seqs", "64"],
        "unrecognized arguments: 64 (--serve-arg takes one word: "
        "--serve-arg=--max-num-seqs=64, or --serve-arg --max-num-seqs --serve-arg 64)",
    ),
    # a path or value with a control character in it: still one line, no escape sequence
    "newline-in-a-model-path": (
        ["plan", "--model", "/nonexistent/no\nsuch"],
        r"plan: error: model directory /nonexistent/no\nsuch does not exist",
    ),
    "escape-sequence-in-a-tree-path": (
        ["upstream", "/nonexistent/x\x1b[31mred"],
        r"upstream: error: /nonexistent/x\x1b[31mred does not exist",
    ),
    "line-separator-in-a-json-path": (
        ["check", "accuracy", "--json", "/nonexistent/a\u2028b"],
        r"/nonexistent/a\u2028b",
    ),
    "undecodable-preset-name": (  # (trial 25) quoted: the bytes, not surrogates
        ["plan", "--model", "\udcff\udcfe"],
        "unknown model preset '\\xff\\xfe'; presets: ",
    ),
    "newline-in-an-unknown-option": (
        ["plan", "--bo\ngus"],
        r"plan: error: unrecognized arguments: --bo\ngus",
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
    err = capsys.readouterr().err
    assert err.endswith("\n") and "\x1b" not in err, err
    err = err.strip().splitlines()
    assert len(err) == 1 and message in err[0], err


def test_a_file_here_named_bare_as_vllm_is_told_it_is_not_on_path(tmp_path, monkeypatch, capsys):
    """(trial 22) A bare name is looked up on PATH, as subprocess runs it: a file of that
    name here is not run, and the line says how to name it."""
    monkeypatch.chdir(tmp_path)
    (tmp_path / "exists.json").write_text("{}")
    argv = ["bench", "serve", "--model", "m", "--vllm", "exists.json", "--result-dir", "r"]
    assert run(argv) == 2
    (line,) = capsys.readouterr().err.splitlines()
    assert line.endswith(
        "--vllm exists.json is not a program on PATH, and ./exists.json is not executable "
        "(chmod +x it)"
    )  # (trial 25) not advice that leads to a second refusal
    (tmp_path / "exists.json").chmod(0o755)
    assert run(argv) == 2
    (line,) = capsys.readouterr().err.splitlines()
    assert line.endswith(
        "--vllm exists.json is not a program on PATH (the file here is ./exists.json)"
    )


@pytest.mark.parametrize("given", ["--model=m", "--model m"], ids=["equals", "apart"])
def test_a_stray_word_beside_a_named_model_gets_no_model_advice(given, capsys):
    assert run(["check", "passkey", *given.split(), "extra"]) == 2
    (line,) = capsys.readouterr().err.splitlines()
    assert line.endswith("check passkey: error: unrecognized arguments: extra"), line


@pytest.mark.parametrize(
    "argv",
    [["--json", "out.json"], ["-tp", "2", "4"], ["--kv-cache-dtype", "fp8", "auto"]],
    ids=["json-path", "second-tp", "second-kv-dtype"],
)
def test_a_flags_extra_value_gets_no_model_advice(argv, capsys):
    """(trial 23) Only a directory with a config.json, or a preset, is advised as a
    model: a value given to a flag that takes none, or a second one, is not."""
    assert run(["plan", *argv]) == 2
    (line,) = capsys.readouterr().err.splitlines()
    assert line.endswith(f"plan: error: unrecognized arguments: {argv[-1]}"), line


@pytest.mark.parametrize("before", [[], ["--"]], ids=["bare", "after-double-dash"])
def test_a_model_directory_given_without_model_is_advised(tmp_path, capsys, before):
    (tmp_path / "my model").mkdir()
    (tmp_path / "my model" / "config.json").write_text("{}")
    assert run(["plan", *before, str(tmp_path / "my model")]) == 2
    (line,) = capsys.readouterr().err.splitlines()
    assert line.endswith(f"(name the model with --model '{tmp_path}/my model')"), line


@pytest.mark.parametrize(
    ("command", "before"),
    [("bench serve", []), ("bench serve", ["--vllm", "vllm"]), ("check passkey", [])],
    ids=["bench-serve", "after-an-option-value", "check-passkey"],
)
def test_a_model_directory_for_a_command_that_requires_model_is_advised(
    tmp_path, capsys, command, before
):
    """(trial 23) argparse's "required: --model" names the model given without it; a
    directory given as an option's value is not advised."""
    (tmp_path / "config.json").write_text("{}")
    assert run([*command.split(), *before, str(tmp_path)]) == 2
    (line,) = capsys.readouterr().err.splitlines()
    assert line.endswith(
        f"the following arguments are required: --model (name the model with --model {tmp_path})"
    ), line
    assert run([*command.split(), "--result-dir", str(tmp_path)]) == 2
    (line,) = capsys.readouterr().err.splitlines()
    assert line.endswith("the following arguments are required: --model"), line


MODEL_PATHS = {  # each a path the user meant, not a Hugging Face id to download
    "link-to-nothing": ("m/dangling", "--model m/dangling is a link to {tmp}/gone, which "),
    "trailing-slash": ("nodir/", "model directory nodir/ does not exist"),
    "in-a-directory-here": ("m/absent", "model directory m/absent does not exist"),
    "three-parts": ("a/b/c", "model directory a/b/c does not exist"),
    "hf-id": ("meta-llama/Llama-3.1-8B", "--model meta-llama/Llama-3.1-8B: only local"),
}


@pytest.mark.parametrize(("model", "says"), MODEL_PATHS.values(), ids=MODEL_PATHS)
def test_a_model_path_that_is_not_there_is_said_as_a_path(
    tmp_path, monkeypatch, capsys, model, says
):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "m").mkdir()
    (tmp_path / "m" / "dangling").symlink_to(tmp_path / "gone")
    assert run(["plan", "--model", model]) == 2
    (line,) = capsys.readouterr().err.splitlines()
    assert line.startswith("vllm-rocm-asm-decode plan: error: " + says.format(tmp=tmp_path))


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
    "quantization-config-string": (
        {"quantization_config": "fp8"},
        [],
        "quantization_config is a JSON string; a checkpoint's is an object",
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


def test_a_plain_decoders_cache_past_every_gpu_is_refused_before_vllm_loads():
    """The preset (a Qwen3: K and V pages in every layer) with --num-gpu-blocks past the
    largest GPU: refused from config.json alone, in a fresh interpreter."""
    code = (
        "import sys\n"
        "from vllm_rocm_asm_decode.tools.cli import main\n"
        "assert main(['plan', '--num-gpu-blocks', '99999999']) == 2\n"
        "print('LOADED', 'torch' in sys.modules, 'vllm' in sys.modules)"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert "LOADED False False" in out.stdout, out.stderr[-2000:]
    assert out.stderr.strip().splitlines() == [
        "vllm-rocm-asm-decode plan: error: --num-gpu-blocks 99999999: that KV cache takes "
        "122070 GiB per rank, more than any GPU's (at most the MI355X's 288 GiB)"
    ]


def test_help_and_usage_errors_import_neither_torch_nor_vllm():
    """In a fresh interpreter: what answering --help and a usage error imports (what
    makes them take seconds). Timing itself is measured, not gated: see the note."""
    code = (
        "import sys\n"
        "from vllm_rocm_asm_decode.tools.cli import main\n"
        "for argv in (['--help'], ['--version'], ['plan', '--help'], ['plan', '-tp', '0']):\n"
        "    try:\n"
        "        main(argv)\n"
        "    except SystemExit:\n"
        "        pass\n"
        "print('LOADED', 'torch' in sys.modules, 'vllm' in sys.modules)"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    loaded = [line for line in out.stdout.splitlines() if line.startswith("LOADED")]
    assert loaded == ["LOADED False False"], out.stderr[-2000:]


@pytest.mark.parametrize(
    "argv",
    [["upstream"], ["bench", "kernel"], ["bench", "serve"], ["check", "accuracy"],
     ["check", "passkey"], ["reproduce"], ["doctor"], ["plan"]],
    ids=lambda argv: "-".join(argv),
)  # fmt: skip
def test_help_shows_no_docstring_markup(argv, capsys):
    """(trial 12) --help prints the module's docstring as a terminal reads it."""
    with pytest.raises(SystemExit) as done:
        main([*argv, "--help"])
    out = capsys.readouterr().out
    assert done.value.code == 0 and "``" not in out and len(out.splitlines()) > 5


DOCS = {  # where each command's options are documented (README: "Where the details are")
    "plan": "usage.md",
    "doctor": "usage.md",
    "upstream": "upstream.md",
    "bench": "validation.md",
    "check": "validation.md",
    "reproduce": "validation.md",
}


def test_every_option_of_every_command_is_in_its_doc():
    """(trial 22) --help and the docs name the same options: bench kernel --iters,
    check passkey --seed and reproduce --gpu-tools were in --help alone."""
    docs = Path(__file__).parents[2] / "docs"
    missing = []
    for command, sub in cli.build_parser()._subparsers._group_actions[0].choices.items():
        text = (docs / DOCS[command]).read_text(encoding="utf-8")
        leaves = [sub]
        if sub._subparsers is not None:  # bench kernel, check passkey, ...
            leaves = list(sub._subparsers._group_actions[0].choices.values())
        for leaf in leaves:
            for action in leaf._actions:
                for option in action.option_strings:
                    if option.startswith("--") and option != "--help":
                        if not re.search(rf"(?<![\w-]){re.escape(option)}\b", text):
                            missing.append(f"{leaf.prog.split(' ', 1)[1]} {option}")
    assert not missing, missing


DOCSTRINGS = {  # module sources whose first statement is or is not a plain docstring
    "comment-first": '# c\n"""doc\n   more"""\nimport os\n',
    "then-code": '"doc"; x = 1\n',
    "concatenated": '"a" "b"\n',
    "parenthesized": '("a"\n "b")\n',
    "an-expression": '"doc".upper()\n',
    "bytes": 'b"doc"\n',
    "f-string": 'f"doc"\n',
    "raw": 'r"a\\nb"\n',
    "no-newline": '"doc"',
    "none": "x = 1\n",
    "empty": "",
}


@pytest.mark.parametrize("source", DOCSTRINGS.values(), ids=DOCSTRINGS)
def test_help_text_is_the_docstring_python_sees(source):
    assert cli._docstring(source) == (ast.get_docstring(ast.parse(source)) or "")


def test_every_tools_module_gives_its_docstring_to_help():
    for path in Path(cli.__file__).parent.rglob("*.py"):
        source = path.read_text(encoding="utf-8")
        assert cli._docstring(source) == (ast.get_docstring(ast.parse(source)) or ""), path


class _PasskeyServer:
    """A server on 127.0.0.1 for ``check passkey``: each connection is read to the end of
    its request, then answered with ``answer``, bytes sent as they are (any status line,
    a body shorter than its Content-Length) or ``answer(connection, server)`` (a trickle,
    a hang: ``stopped`` is set when the test is done with it)."""

    def __init__(self, answer):
        self.answer = answer
        self.stopped = threading.Event()
        self.requests: list[bytes] = []  # their request lines
        self._arrived = threading.Condition()
        self._listener = socket.create_server(("127.0.0.1", 0))
        self._listener.settimeout(0.05)
        self.url = f"http://127.0.0.1:{self._listener.getsockname()[1]}"
        self._threads = [threading.Thread(target=self._accept, daemon=True)]

    def __enter__(self) -> _PasskeyServer:
        self._threads[0].start()
        return self

    def __exit__(self, *exc_info) -> None:
        self.stopped.set()
        self._threads[0].join(5)  # no new connection after this
        for thread in self._threads[1:]:
            thread.join(5)
        self._listener.close()

    def wait_for(self, requests: int) -> bool:
        with self._arrived:
            return self._arrived.wait_for(lambda: len(self.requests) >= requests, 10)

    def _accept(self) -> None:
        while not self.stopped.is_set():
            try:
                conn, _ = self._listener.accept()
            except TimeoutError:
                continue
            thread = threading.Thread(target=self._serve, args=(conn,), daemon=True)
            self._threads.append(thread)
            thread.start()

    def _serve(self, conn: socket.socket) -> None:
        with conn:
            conn.settimeout(5)
            try:
                data = b""
                while b"\r\n\r\n" not in data and (chunk := conn.recv(65536)):
                    data += chunk
                head, _, body = data.partition(b"\r\n\r\n")
                length = re.search(rb"(?i)\r\ncontent-length: *(\d+)", head)
                while length and len(body) < int(length[1]) and (chunk := conn.recv(65536)):
                    body += chunk
                with self._arrived:
                    self.requests.append(head.split(b"\r\n")[0])
                    self._arrived.notify_all()
                if callable(self.answer):
                    self.answer(conn, self)
                else:
                    conn.sendall(self.answer)
            except OSError:  # the client went away (it read what it takes), or is slow
                pass


def _http(body: bytes, status: str = "200 OK", *headers: str, length: int | None = None) -> bytes:
    """An HTTP reply as sent; ``length`` a Content-Length other than the body's."""
    lines = [f"HTTP/1.1 {status}", f"Content-Length: {len(body) if length is None else length}"]
    return ("\r\n".join([*lines, *headers]) + "\r\n\r\n").encode("latin-1") + body


def _hang(conn: socket.socket, server: _PasskeyServer) -> None:
    server.stopped.wait(10)


def _passkey(url: str, *options: str) -> int:
    return run(["check", "passkey", "--model", "m", "--base-url", url, "--prompts", "1",
                "--lengths", "100", *options])  # fmt: skip


@pytest.mark.parametrize(
    ("answer", "message"),
    [
        (_http(json.dumps({"choices": []}).encode()), "the reply has no completion text"),
        (_http(b"<html>"), "the reply is not JSON"),
        (_http(b"context length exceeded", "400 Bad Request"), "HTTP 400: context length exceeded"),
        (
            _http(b'{"error": {"message": "The model `m` does not exist."}}', "404 Not Found"),
            "(the server serves another model: is --model the name it was started with?)",
        ),
        (_http(b"Not Found", "404 Not Found"), "is --base-url the vLLM server's?"),
        (
            _http(
                b"<!DOCTYPE HTML>\n<html><body>" + b"x" * 400,
                "501 Unsupported method",
                "Content-Type: text/html;charset=utf-8",
            ),
            "HTTP 501: Unsupported method (an HTML page) (no vLLM completions endpoint at",
        ),
    ],
    ids=[
        "empty-choices",
        "not-json",
        "http-400",
        "404-another-model",
        "404-no-endpoint",
        "html-page",
    ],
)
def test_passkey_server_answers_that_are_not_completions(answer, message, capsys):
    with _PasskeyServer(answer) as server:
        assert _passkey(server.url) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and message in err[0], err


@pytest.mark.parametrize(
    ("var", "value", "message"),
    [
        ("VLLM_ROCM_ASM_DECODE_CUT", "-1", "VLLM_ROCM_ASM_DECODE_CUT='-1'"),
        ("VLLM_ROCM_ASM_DECODE_TRUST_AITER", "2", "VLLM_ROCM_ASM_DECODE_TRUST_AITER='2'"),
        ("VLLM_PLUGINS", "x", "leaves out rocm_asm_decode"),
        ("VLLM_LOGGING_LEVEL", " info", "VLLM_LOGGING_LEVEL=' info' is not a logging level"),
        ("VLLM_LOGGING_LEVEL", "warning", "VLLM_LOGGING_LEVEL='warning' hides the INFO lines"),
        ("VLLM_LOGGING_LEVEL", "notset", "VLLM_LOGGING_LEVEL='notset' hides the INFO lines"),
        ("VLLM_CONFIGURE_LOGGING", "0", "VLLM_CONFIGURE_LOGGING='0' leaves the servers without"),
        ("VLLM_CONFIGURE_LOGGING", "no", "VLLM_CONFIGURE_LOGGING='no' is not an integer"),
    ],
    ids=[
        "cut",
        "trust",
        "plugins",
        "bad-logging-level",
        "logging-above-info",
        "logging-notset",  # the vllm logger then takes the root's WARNING
        "logging-not-configured",
        "logging-configure-not-int",
    ],
)
def test_bench_serve_refuses_an_environment_that_would_stop_or_skip_the_plugin(
    var, value, message, monkeypatch, capsys
):
    monkeypatch.setenv(var, value)
    assert run(["bench", "serve", "--model", "m", "--vllm", STAND_IN_VLLM]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and message in err[0], err


@pytest.mark.parametrize(
    "command",
    [["plan"], ["bench", "kernel", "--seqs", "1"], ["check", "accuracy", "--seeds", "1"]],
)
def test_another_vllm_first_on_the_path_is_refused_as_doctor_fails_it(monkeypatch, capsys, command):
    """The installed distribution is what the plugin judges; a copy of another version
    earlier on the path would run instead, unjudged: refused in one line, as doctor's
    vllm check fails it. A ROCm build's local tag (on its distribution only) is no
    other vLLM."""
    from vllm_rocm_asm_decode import vllm_support

    imported, installed = "0.33.0", vllm_support.installed_vllm_version()
    assert vllm_support.imported_vllm_version() == imported == installed
    real = vllm_support.module_source

    def moved_on(module):
        text = real(module)
        return text.replace(f"'{imported}'", "'0.34.0'") if module == "vllm._version" else text

    rocm_build = "0.33.0+rocm722"
    monkeypatch.setattr(vllm_support, "installed_vllm_version", lambda: rocm_build)
    assert vllm_support.same_vllm_build(imported, rocm_build)
    assert cli._vllm_problem() is None
    monkeypatch.setattr(vllm_support, "module_source", moved_on)
    assert vllm_support.imported_vllm_version() == "0.34.0"
    assert main(command) == 2
    (line,) = capsys.readouterr().err.splitlines()
    assert "error: vLLM 0.34.0 is first on Python's path, at " in line
    assert line.endswith(
        f"distribution is {rocm_build}: the plugin judges vLLM by the "
        "distribution, not the code that runs; keep one vLLM on the path"
    )


@pytest.mark.parametrize(
    ("version_file", "read"),
    [
        (None, "dev"),  # a source checkout never built: vllm.__version__ is "dev"
        ("__version__: str = '0.34.0'\n", "0.34.0"),
        ("__version__ = version = '0.33.0'\n", "0.33.0"),
        ("version = '0.33.0'\n", "dev"),
        ("def broken(:\n", "dev"),
    ],
    ids=["missing", "annotated", "chained", "no-dunder", "unparsable"],
)
def test_the_imported_vllms_version_is_read_as_vllm_reads_it(monkeypatch, version_file, read):
    from vllm_rocm_asm_decode import vllm_support

    real = vllm_support.module_source

    def copy(module):
        return version_file if module == "vllm._version" else real(module)

    monkeypatch.setattr(vllm_support, "module_source", copy)
    assert vllm_support.imported_vllm_version() == read
    problem = cli._vllm_problem()
    if read == "0.33.0":
        assert problem is None
    else:
        said = "dev (its vllm/_version.py names no version)" if read == "dev" else read
        assert problem.startswith(f"vLLM {said} is first on Python's path, at "), problem


@pytest.mark.parametrize(
    "arg",
    ["--log-level=WARNING", "--log-level", "--log-l", "--logging-config.log_level=ERROR",
     "--logging_config={}", "--log-config-file=x.json"],
)  # fmt: skip
def test_bench_serve_refuses_serve_args_that_set_the_servers_logging(arg, capsys):
    argv = ["bench", "serve", "--model", "m", "--vllm", STAND_IN_VLLM, "--serve-arg", arg]
    assert run(argv) == 2
    (line,) = capsys.readouterr().err.splitlines()
    assert f"--serve-arg {arg}: --log" in line and "for more, set VLLM_LOGGING_LEVEL=DEBUG" in line


@pytest.mark.parametrize(
    ("argv", "says"),
    [
        (["--baseline", "none"], "argument --baseline: 'none' is not one of plugin-off, mha-off"),
        (["--dataset", "sonnet"], "argument --dataset: 'sonnet' is not one of random, sharegpt"),
        (
            ["--concurrency", "1,8", "--num-prompts", "8"],
            "2 concurrencies but --num-prompts gives 1;",
        ),
        (["--dataset", "sharegpt"], "--dataset sharegpt needs --dataset-path"),
        (["--serve-arg", "--port=1"], "--serve-arg --port=1: bench serve sets --port itself"),
    ],
    ids=["baseline", "dataset-unknown", "concurrencies", "dataset", "serve-arg"],
)
def test_bench_serve_says_its_own_mistakes_before_what_the_machine_lacks(argv, says, capsys):
    """(trial 12) A mistake in the command is said first, not hidden behind a vLLM
    missing from PATH (which the user fixes only to meet the next mistake)."""
    assert run(["bench", "serve", "--model", "m", "--vllm", "no-such-vllm", *argv]) == 2
    (line,) = capsys.readouterr().err.splitlines()
    assert says in line and "no such executable" not in line, line


def test_a_logging_config_of_the_users_own_decides_the_level(monkeypatch):
    """With VLLM_LOGGING_CONFIG_PATH vLLM applies the user's configuration, not the
    level: nothing to judge here (the arms' check reads the logs)."""

    monkeypatch.setenv("VLLM_LOGGING_LEVEL", "WARNING")
    assert "hides the INFO lines" in choices.plugin_settings_problem()
    monkeypatch.setenv("VLLM_LOGGING_CONFIG_PATH", "/some/logging.json")
    assert choices.plugin_settings_problem() is None
    monkeypatch.setenv("VLLM_LOGGING_LEVEL", "DEBUG")
    monkeypatch.delenv("VLLM_LOGGING_CONFIG_PATH")
    assert choices.plugin_settings_problem() is None


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


def test_the_heavy_commands_refuse_another_vllm_and_doctor_reports_it(monkeypatch, capsys):
    """A vLLM of another series, or one that moved what the plugin builds on (here: as
    ``vllm_mismatch`` reads it from the source, without importing it), is one line and
    exit 2 before any of it is imported; doctor reports it as its ``vllm`` check."""
    from vllm_rocm_asm_decode import vllm_support

    why = "vLLM 0.34.0 is not 0.33.x, the vLLM this release extends"
    monkeypatch.setattr(vllm_support, "vllm_mismatch", lambda *a, **k: why)
    for argv in (["plan"], ["bench", "kernel"], ["check", "accuracy"]):
        assert run(argv) == 2
        (line,) = capsys.readouterr().err.strip().splitlines()
        assert line == (
            f"vllm-rocm-asm-decode {' '.join(argv)}: error: {why} (pip install vllm==0.33.* "
            "for this release)"
        )


@pytest.mark.slow  # vLLM imported afresh, in a process of its own
def test_doctor_imports_nothing_of_vllm_before_it_judges_it():
    """So that a vLLM missing what the plugin builds on is a FAIL line, not a traceback."""
    code = (
        "import sys, vllm_rocm_asm_decode.tools.doctor as d; "
        "print(sorted(m for m in sys.modules if m == 'vllm' or m.startswith('vllm.')))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]"


def test_a_model_directory_that_cannot_be_looked_into_is_one_line(monkeypatch, tmp_path):
    """Without search permission on it (as a non-root user), checking for its config.json
    raises PermissionError from pathlib: said as the system says it."""
    import pathlib

    real = pathlib.Path.is_dir

    def is_dir(path):
        if path.name == "config.json":
            raise PermissionError(13, "Permission denied", str(path))
        return real(path)

    (tmp_path / "m0").mkdir()
    monkeypatch.setattr(pathlib.Path, "is_dir", is_dir)
    with pytest.raises(choices.InputError) as raised:
        choices.resolve_model_dir(str(tmp_path / "m0"))
    assert str(raised.value) == f"cannot read {tmp_path / 'm0' / 'config.json'}: Permission denied"


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
        assert f"--host 127.0.0.1 --port {port}: cannot listen there" in line
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
        (b"garbage\r\n\r\n", "the reply is not an HTTP answer (BadStatusLine)"),
        (_http(json.dumps({"choices": {"a": 1}}).encode()), "the reply has no completion text"),
        (
            _http(b"[" * 200_000 + b"]" * 200_000),
            "the reply is not a completion (JSON nested too deeply)",
        ),
        (_http(b" " * (2 << 20)), "the reply is over 1048576 bytes: not a completion"),
    ],
    ids=["not-http", "choices-not-a-list", "nested-200000-deep", "two-mib"],
)
def test_passkey_replies_that_are_not_completions_are_one_line(reply, says, capsys):
    with _PasskeyServer(reply) as server:
        assert _passkey(server.url) == 2
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


@pytest.mark.parametrize(
    ("signum", "code", "said"),
    [(signal.SIGINT, 130, "interrupted"), (signal.SIGTERM, 143, "terminated (SIGTERM)")],
    ids=["ctrl-c", "sigterm"],
)
def test_a_signal_an_import_swallowed_is_still_one_line(monkeypatch, capsys, signum, code, said):
    """A Ctrl-C (or SIGTERM) landing inside numpy's or torch's import can be swallowed
    there and surface as another error; it is reported as the signal it was."""

    def import_swallowing_it(*_args, **_kwargs):
        try:
            os.kill(os.getpid(), signum)
        except KeyboardInterrupt:
            pass  # what the import did with it
        raise RuntimeError("CPU dispatcher tracer already initlized")

    for name in ("_plan", "_missing_runtime", "_settings_problem"):
        monkeypatch.setattr(cli, name, import_swallowing_it if name == "_plan" else lambda: None)
    assert cli.main(["plan"]) == code
    out, err = capsys.readouterr()
    assert out == "" and err.strip() == f"vllm-rocm-asm-decode: {said}"
    assert signal.getsignal(signal.SIGINT) is signal.default_int_handler  # undone


def test_an_error_without_a_signal_is_not_taken_for_one(monkeypatch):
    def fails(*_args, **_kwargs):
        raise RuntimeError("a bug")

    for name in ("_plan", "_missing_runtime", "_settings_problem"):
        monkeypatch.setattr(cli, name, fails if name == "_plan" else lambda: None)
    with pytest.raises(RuntimeError, match="a bug"):
        cli.main(["plan"])


# --------------------------------------------------------------------------------------
# Result files checked before the work: read-only files and directories (17, 6)


def _deny_writing(monkeypatch, denied: Path) -> None:
    """``os.access`` as a non-root user sees ``denied`` after chmod a-w (these tests may
    run as root, for whom access() ignores the mode bits)."""
    real = os.access

    def access(path, mode, *a, **kw):
        if Path(path).resolve() == denied.resolve() and mode & os.W_OK:
            return False
        return real(path, mode, *a, **kw)

    denied.chmod(0o555 if denied.is_dir() else 0o444)
    monkeypatch.setattr(os, "access", access)


@pytest.mark.parametrize(
    "command",
    [
        ["check", "accuracy"],
        ["bench", "kernel"],
        ["bench", "serve", "--model", "m", "--vllm", STAND_IN_VLLM],
    ],
    ids=["check-accuracy", "bench-kernel", "bench-serve"],
)
def test_a_read_only_json_file_is_refused_before_the_run(command, tmp_path, monkeypatch, capsys):
    target = tmp_path / "old.json"
    target.write_text("{}")
    _deny_writing(monkeypatch, target)
    assert run([*command, "--json", str(target)]) == 2
    out, err = capsys.readouterr()
    name = " ".join(command[:2])
    assert err.splitlines() == [
        f"vllm-rocm-asm-decode {name}: error: --json {target} exists and is not writable"
    ]
    assert out == "" and target.read_text() == "{}"


def test_a_result_dir_under_a_read_only_directory_is_refused(tmp_path, monkeypatch, capsys):
    parent = tmp_path / "ro"
    parent.mkdir()
    _deny_writing(monkeypatch, parent)
    argv = ["bench", "serve", "--model", "m", "--vllm", STAND_IN_VLLM]
    assert run([*argv, "--result-dir", str(parent / "a" / "b")]) == 2
    (line,) = capsys.readouterr().err.splitlines()
    assert line == (
        f"vllm-rocm-asm-decode bench serve: error: --result-dir {parent}/a/b cannot be made: "
        f"{parent} is not writable"
    )
    assert not (parent / "a").exists()


# --------------------------------------------------------------------------------------
# stdout closed or full (7)


def _cli(*argv: str, **kw) -> subprocess.Popen:
    code = "import sys\nfrom vllm_rocm_asm_decode.tools.cli import main\nsys.exit(main())\n"
    return subprocess.Popen([sys.executable, "-c", code, *argv], text=True, **kw)


@pytest.mark.parametrize(
    "argv",
    [["--version"], ["check", "passkey", "--help"]],
    ids=["version", "help"],
)
def test_a_reader_that_went_away_ends_the_command_quietly_with_141(argv):
    read, write = os.pipe()
    os.close(read)  # the reader is gone before the command writes
    proc = _cli(*argv, stdout=write, stderr=subprocess.PIPE)
    os.close(write)
    _, err = proc.communicate(timeout=60)
    assert (proc.returncode, err) == (141, "")


def test_a_full_stdout_is_one_line_and_exit_1():
    with open("/dev/full", "w") as full:
        proc = _cli("--version", stdout=full, stderr=subprocess.PIPE)
        _, err = proc.communicate(timeout=60)
    assert proc.returncode == 1
    assert err.splitlines() == [
        "vllm-rocm-asm-decode: error: cannot write to stdout: No space left on device"
    ]


def run_with_closed(*argv: str, fd: int = 1) -> subprocess.CompletedProcess:
    """The command started as ``cmd >&-`` (``fd`` 1) or ``cmd 2>&-`` (``fd`` 2) starts
    it: that file descriptor closed."""
    code = "import sys\nfrom vllm_rocm_asm_decode.tools.cli import main\nsys.exit(main())\n"
    return subprocess.run(
        [sys.executable, "-c", code, *argv],
        stdout=subprocess.PIPE if fd == 2 else None,
        stderr=subprocess.PIPE if fd == 1 else None,
        text=True,
        timeout=120,
        preexec_fn=lambda: os.close(fd),
    )


@pytest.mark.slow  # a process a case
@pytest.mark.parametrize(
    ("argv", "env", "code", "out"),
    [
        (["plan", "--help"], {}, 0, "usage: vllm-rocm-asm-decode plan"),
        (["plan", "--json"], {"VLLM_ROCM_ASM_DECODE": "yes"}, 2, ""),
        (["plan", "--bogus"], {}, 2, ""),
    ],
    ids=["help", "setting", "usage"],
)
def test_a_closed_stderr_keeps_stdout_for_the_answer(argv, env, code, out, monkeypatch):
    """Started with stderr closed (``2>&-``): what goes to stderr goes nowhere, not to
    stdout (where ``print(file=None)`` would put it); the answer is as ever."""
    for name, value in env.items():
        monkeypatch.setenv(name, value)
    proc = run_with_closed(*argv, fd=2)
    assert proc.returncode == code and proc.stdout.startswith(out), proc.stdout
    assert out or proc.stdout == ""


@pytest.mark.parametrize(
    ("argv", "who"),
    [
        (["--version"], ""),
        (["plan", "--help"], " plan"),
        (["bench", "serve", "-h"], " bench serve"),
    ],
    ids=["version", "help", "bench-serve-help"],
)
def test_a_closed_stdout_is_one_line_and_exit_1(argv, who):
    """Not a traceback (argparse's help) nor a silent exit 0 (print() to no stdout): the
    answer cannot go out, as on a full disk; the line names the command."""
    proc = run_with_closed(*argv)
    assert (proc.returncode, proc.stderr.splitlines()) == (
        1,
        [f"vllm-rocm-asm-decode{who}: error: cannot write to stdout: Bad file descriptor"],
    )


@pytest.mark.slow
def test_check_accuracy_writes_its_json_before_a_gone_reader_ends_it(tmp_path):
    """The file is written first; the table then meets the closed pipe: exit 141, no
    traceback (a fresh interpreter: torch and vLLM load, some seconds)."""
    read, write = os.pipe()
    os.close(read)
    target = tmp_path / "a.json"
    argv = ["check", "accuracy", "--heads", "8/1", "--contexts", "17", "--json", str(target)]
    proc = _cli(*argv, stdout=write, stderr=subprocess.PIPE)
    os.close(write)
    _, err = proc.communicate(timeout=300)
    assert (proc.returncode, err) == (141, "")
    rows = json.loads(target.read_text())["rows"]
    assert [(r["num_heads"], r["num_kv_heads"]) for r in rows] == [(8, 1)]


class _GoneReader:
    """A stdout whose reader has gone away."""

    def write(self, text: str) -> int:
        raise BrokenPipeError(32, "Broken pipe")

    def flush(self) -> None:
        raise BrokenPipeError(32, "Broken pipe")

    def fileno(self) -> int:
        import io

        raise io.UnsupportedOperation("fileno")


@pytest.mark.slow
def test_bench_serve_writes_its_json_before_a_gone_reader_ends_it(tmp_path, monkeypatch):
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = str(s.getsockname()[1])
    monkeypatch.setattr(sys, "stdout", _GoneReader())
    target = tmp_path / "serve.json"
    argv = [
        "bench", "serve", "--model", "m", "--vllm", STAND_IN_VLLM, "--port", port,
        "--concurrency", "1", "--num-prompts", "2", "--result-dir", str(tmp_path / "r"),
        "--json", str(target),
    ]  # fmt: skip
    assert main(argv) == 141
    data = json.loads(target.read_text())
    assert len(data["results"]) == 2 and data["error"] is None


# --------------------------------------------------------------------------------------
# passkey: lazy prompts, replies and URLs (7, 9, 21)


@pytest.mark.slow  # a server's replies timed
def test_passkey_holds_only_the_prompts_in_flight():
    from vllm_rocm_asm_decode.tools.validation import passkey

    made, answered, most = [0], [0], [0]

    def prompts():
        for prompt in passkey.make_prompts([100, 200], 500, seed=0):
            made[0] += 1
            most[0] = max(most[0], made[0] - answered[0])
            yield prompt

    def answer(prompt):
        answered[0] += 1
        return prompt.passkey if prompt.length == 100 else "no"

    tally = passkey.score(prompts(), answer, in_flight=4)
    assert tally == {100: [500, 500], 200: [0, 500]}
    assert most[0] <= 4 + 1  # in flight, and the one being made


def test_a_server_that_fails_after_answering_shows_the_results_so_far_and_exits_1(capsys):
    """Two replies (one passes, whatever the prompt: it answers every passkey it could
    be), then HTTP 500: the table of what was judged, the error line, exit 1 (not the
    input error's 2)."""
    everything = " ".join(str(n) for n in range(10000, 100000))
    good = _http(json.dumps({"choices": [{"text": everything}]}).encode())

    def answer(conn, server):
        ok = len(server.requests) <= 2
        conn.sendall(good if ok else _http(b"engine dead", "500 Internal Server Error"))

    with _PasskeyServer(answer) as server:
        code = _passkey(server.url, "--prompts", "4", "--in-flight", "1")
    out, err = capsys.readouterr()
    # (trial 26) "2/2" read as a full pass: 4 were asked for.
    assert code == 1 and "| 100 | 2/2 (2 of 4 not judged) |" in out.splitlines(), out
    assert err.strip().splitlines() == [
        f"vllm-rocm-asm-decode check passkey: error: {server.url}: HTTP 500: engine dead"
    ]


def test_passkey_stops_sending_at_the_first_error():
    from vllm_rocm_asm_decode.tools.validation import passkey

    made = [0]

    def prompts():
        for prompt in passkey.make_prompts([100], 10000, seed=0):
            made[0] += 1
            yield prompt

    def answer(prompt):
        raise passkey.ServerError("HTTP 500: boom")

    with pytest.raises(passkey.ServerError, match="boom"):
        passkey.score(prompts(), answer, in_flight=2)
    assert made[0] < 10


def test_passkey_url_errors_are_named_as_such(capsys):
    import random

    from vllm_rocm_asm_decode.tools.validation import passkey

    with socket.socket() as bound:  # bound, not listening: a connection is refused
        bound.bind(("127.0.0.1", 0))
        url = f"http://127.0.0.1:{bound.getsockname()[1]}"
        assert _passkey(url, "--timeout", "5") == 2
    (line,) = capsys.readouterr().err.strip().splitlines()
    assert f"cannot reach {url}/v1/completions: Connection refused" in line
    with _PasskeyServer(_hang) as server:
        assert _passkey(server.url, "--timeout", "0.3") == 2
    (line,) = capsys.readouterr().err.strip().splitlines()
    assert f"no answer from {server.url}/v1/completions within 0.3 s (--timeout)" in line
    # check passkey refuses such a URL itself; reproduce's own URLs reach ask() as they are
    prompt = passkey.make_prompt(100, random.Random(0))
    with pytest.raises(passkey.ServerError, match="cannot be used: encoding with 'idna'"):
        passkey.ask(f"http://{'a' * 64}.example:9", "m", prompt, 5)


def test_passkey_ctrl_c_ends_it_at_once_while_the_server_hangs():
    """(7) A Ctrl-C does not wait for the requests still out: one line, exit 130, at once
    (the interpreter's exit does not wait for them either)."""
    with _PasskeyServer(_hang) as server:
        proc = _cli(
            "check", "passkey", "--model", "m", "--base-url", server.url, "--prompts", "3",
            "--in-flight", "3", "--lengths", "100", "--timeout", "60",
            stdout=subprocess.PIPE, stderr=subprocess.PIPE,
        )  # fmt: skip
        try:
            assert server.wait_for(3), "the requests never came"
            proc.send_signal(signal.SIGINT)
            out, err = proc.communicate(timeout=1.5)
        finally:
            if proc.poll() is None:
                proc.kill()
                proc.communicate()
    assert (proc.returncode, out, err) == (130, "", "vllm-rocm-asm-decode: interrupted\n")


def _trickle(head: bytes):
    """Sends ``head``, then a byte each 0.05 s for 3 s: each read gets something in time."""

    def answer(conn: socket.socket, server: _PasskeyServer) -> None:
        conn.sendall(head)
        for _ in range(60):
            if server.stopped.wait(0.05):
                return
            conn.sendall(b"a")

    return answer


@pytest.mark.slow  # waits out its timeouts
@pytest.mark.parametrize(
    "head",
    [b"HTTP/1.1 200 OK\r\nX-Slow: ", b"HTTP/1.1 200 OK\r\nContent-Length: 1000\r\n\r\n"],
    ids=["headers", "body"],
)
def test_passkey_timeout_bounds_the_whole_request_not_each_read(head, capsys):
    """(8) --timeout is a deadline for the whole request: a server that trickles its
    reply a byte at a time runs out of it as one that says nothing would."""
    with _PasskeyServer(_trickle(head)) as server:
        start = time.monotonic()
        assert _passkey(server.url, "--timeout", "0.5") == 2
        took = time.monotonic() - start
    (line,) = capsys.readouterr().err.strip().splitlines()
    assert f"no answer from {server.url}/v1/completions within 0.5 s (--timeout)" in line
    assert took < 1.5


@pytest.mark.parametrize(
    ("reply", "says"),
    [
        (_http(b"", "500 Oops\x1b[2J\x00"), "HTTP 500: Oops\\x1b[2J\\x00"),
        (
            _http(
                "bad \x1b[31mred\x1b[0m\r\x00\x9b\u202e caf\u00e9 \u4f60\u597d".encode(),
                "500 Error",
            ),
            "HTTP 500: bad \\x1b[31mred\\x1b[0m \\x00\\x9b\\u202e caf\u00e9 \u4f60\u597d",
        ),
        (
            _http(b"", "301 Moved", "Location: http://elsewhere/\x1b]0;owned\x07"),
            "redirects to http://elsewhere/\\x1b]0;owned\\x07",
        ),
        (
            _http(json.dumps({"choices": [{"txt": "\x1b[2J\u00e9"}]}, ensure_ascii=False).encode()),
            'no completion text: {"choices": [{"txt": "\\u001b[2J\u00e9"}]}',
        ),
    ],
    ids=["reason", "body", "location", "json"],
)
def test_passkey_error_lines_escape_control_characters(reply, says, capsys):
    """(15) What the server says is quoted with its control characters escaped, the rest
    of Unicode as it is: no ESC, CR or NUL reaches the terminal."""
    with _PasskeyServer(reply) as server:
        assert _passkey(server.url) == 2
    (line,) = capsys.readouterr().err.strip().splitlines()
    assert says in line and line.isprintable(), ascii(line)


@pytest.mark.parametrize("code", [301, 302, 303, 307, 308])
def test_passkey_a_redirect_names_its_target(code, capsys):
    """(15) A 3xx is an error that says where it points; the prompt is not resent there
    (urllib would follow a 301-303 as a GET)."""
    with _PasskeyServer(_http(b"moved", f"{code} Moved", "Location: /v2/completions")) as server:
        assert _passkey(server.url) == 2
    (line,) = capsys.readouterr().err.strip().splitlines()
    assert f"HTTP {code}: the server redirects to {server.url}/v2/completions" in line, line
    assert server.requests == [b"POST /v1/completions HTTP/1.1"]


@pytest.mark.parametrize(
    ("reply", "says"),
    [
        (_http(b'{"choices"', length=100), "the reply was cut short: it ended after 10 of 100"),
        (
            b'HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n5\r\n{"cho\r\n20\r\nices"',
            "the reply was cut short: its chunked body ended after 10 bytes",
        ),
    ],
    ids=["content-length", "chunked"],
)
def test_passkey_a_reply_cut_short_says_so(reply, says, capsys):
    """(15) A reply that ends before its length is cut short, not "not JSON"."""
    with _PasskeyServer(reply) as server:
        assert _passkey(server.url) == 2
    (line,) = capsys.readouterr().err.strip().splitlines()
    assert says in line and "not JSON" not in line, line


# --------------------------------------------------------------------------------------
# the command line itself


def test_version_is_the_package_version():
    import re

    pyproject = Path(__file__).resolve().parents[2] / "pyproject.toml"
    version = re.search(r'^version = "([^"]+)"$', pyproject.read_text(), re.M).group(1)
    proc = _cli("--version", stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    out, err = proc.communicate(timeout=60)
    assert (proc.returncode, out, err) == (0, f"vllm-rocm-asm-decode {version}\n", "")


@pytest.mark.parametrize(
    ("argv", "says"),
    [
        (["upstream", "/no/such/tree"], "vllm-rocm-asm-decode upstream: error: /no/such/tree"),
        (
            ["bench", "serve", "--model", "m", "--vllm", "no-such-vllm"],
            "vllm-rocm-asm-decode bench serve: error: --vllm no-such-vllm: no such executable",
        ),
        (
            ["check", "accuracy"],
            "vllm-rocm-asm-decode check accuracy: error: VLLM_LOGGING_LEVEL='bogus' is not a "
            "logging level",
        ),
    ],
    ids=["upstream-ignores-it", "bench-serve-ignores-it", "check-accuracy-refuses-it"],
)
def test_vllm_logging_level_is_checked_only_where_vllm_is_imported(argv, says, monkeypatch, capsys):
    monkeypatch.setenv("VLLM_LOGGING_LEVEL", "bogus")
    assert run(argv) == 2
    (line,) = capsys.readouterr().err.strip().splitlines()
    assert line.startswith(says), line


@pytest.mark.parametrize(
    ("content", "argv", "says"),
    [
        (
            b'{"num_attention_heads": 40,\0 "num_hidden_layers": 2}',
            ["plan", "--model", "{dir}"],
            "{dir}/config.json has a NUL byte at byte offset 27: not JSON text",
        ),
        (
            '[{"conversations": ["\u00e9\0"]}]'.encode(),
            [
                "bench", "serve", "--model", "m", "--vllm", STAND_IN_VLLM,
                "--dataset", "sharegpt", "--dataset-path", "{dir}/config.json",
            ],
            "--dataset-path {dir}/config.json has a NUL byte at byte offset 23",
        ),
    ],
    ids=["config-json", "sharegpt"],
)  # fmt: skip
def test_a_nul_byte_is_reported_at_its_byte_offset(content, argv, says, tmp_path, capsys):
    (tmp_path / "config.json").write_bytes(content)
    assert run([a.replace("{dir}", str(tmp_path)) for a in argv]) == 2
    (line,) = capsys.readouterr().err.strip().splitlines()
    assert says.replace("{dir}", str(tmp_path)) in line, line


def test_the_accuracy_bound_lets_the_documented_longest_context_through():
    """--contexts up to 131072 is documented: with the default layouts it must fit."""
    assert choices.accuracy_memory_problem(None, [131072]) is None
    assert choices.accuracy_memory_problem(None, None) is None


# --------------------------------------------------------------------------------------
# The new-user try-out's findings of this round


def _one_line_exit_2(argv, capsys) -> str:
    try:
        code = main(argv)
    except SystemExit as exc:  # argparse's own errors
        code = exc.code
    err = capsys.readouterr().err
    assert code == 2 and err.count("\n") == 1, err
    return err


def test_a_config_nested_too_deep_is_one_line(tmp_path, capsys):
    (tmp_path / "config.json").write_text("[" * 100_000 + "]" * 100_000)
    err = _one_line_exit_2(["plan", "--model", str(tmp_path)], capsys)
    assert "nested too deep for JSON" in err


@pytest.mark.parametrize(
    ("argv", "says"),
    [
        (["bench"], "required: {kernel,serve}"),
        (["check"], "required: {accuracy,passkey}"),
        (
            ["check", "passkey", "--model", "m", "--base-url", "http://[::1"],
            "is not an http(s) URL with a host (an IPv6 host goes in [ ])",
        ),
    ],
    ids=["bench-alone", "check-alone", "unclosed-ipv6"],
)
def test_what_to_give_is_named(argv, says, capsys):
    assert says in _one_line_exit_2(argv, capsys)


def test_a_config_that_never_ends_is_one_line(tmp_path, capsys):
    """A config.json linked to /dev/zero is named a device (trial 25: it was "larger
    than 16 MiB"); a huge regular file is read up to a bound, not whole."""
    (tmp_path / "config.json").symlink_to("/dev/zero")
    err = _one_line_exit_2(["plan", "--model", str(tmp_path)], capsys)
    assert err.endswith(f"{tmp_path}/config.json is a device, not a model's config.json\n")
    (tmp_path / "config.json").unlink()
    with open(tmp_path / "config.json", "wb") as f:
        f.truncate(17 * 2**20)  # sparse
    err = _one_line_exit_2(["plan", "--model", str(tmp_path)], capsys)
    assert "is larger than 16 MiB: not a model's config.json" in err


def test_a_checkpoint_json_vllm_cannot_parse_is_named(tmp_path, capsys):
    """vLLM's and Transformers' JSON errors name no file: plan finds which it was."""
    shutil.copytree(choices.PRESETS_DIR / "qwen3-8b", tmp_path, dirs_exist_ok=True)
    (tmp_path / "hf_quant_config.json").write_text("{garbage")
    err = _one_line_exit_2(["plan", "--model", str(tmp_path)], capsys)
    assert f"vLLM refuses {tmp_path}: its hf_quant_config.json is not JSON (Expecting" in err


def test_a_multimodal_config_without_its_processor_files_names_the_file(tmp_path, capsys):
    """vLLM reads a multimodal model's processor (Llama 3.2 Vision: Transformers'
    backend) while it builds the ModelConfig: a directory with config.json alone is
    refused with the file it lacks, not Transformers' download advice."""
    text = dict(model_type="mllama_text_model", num_attention_heads=32, hidden_size=4096)
    text |= dict(num_key_value_heads=8, num_hidden_layers=40, cross_attention_layers=[3])
    config = dict(model_type="mllama", architectures=["MllamaForConditionalGeneration"])
    config |= dict(text_config=text, vision_config=dict(model_type="mllama_vision_model"))
    (tmp_path / "config.json").write_text(json.dumps(config))
    err = _one_line_exit_2(["plan", "--model", str(tmp_path)], capsys)
    assert err.endswith(
        f"{tmp_path} is a multimodal model whose processor vLLM reads to configure it, and "
        "Transformers cannot load it (no preprocessor_config.json): put the checkpoint's "
        "processor and tokenizer files beside its config.json\n"
    ), err
    processor = dict(processor_class="MllamaProcessor", image_processor_type="MllamaImageProcessor")
    (tmp_path / "preprocessor_config.json").write_text(json.dumps(processor))
    err = _one_line_exit_2(["plan", "--model", str(tmp_path)], capsys)  # no tokenizer
    assert "Transformers cannot load it (Failed to load the processor): put the" in err
    # (trial 23) With its tokenizer, it is read as vllm serve reads it, and planned.
    from tokenizers import Tokenizer, models

    vocab = {"<unk>": 0, "<|image|>": 1, "<|begin_of_text|>": 2}
    Tokenizer(models.WordLevel(vocab, unk_token="<unk>")).save(str(tmp_path / "tokenizer.json"))
    tokenizer = dict(tokenizer_class="PreTrainedTokenizerFast", unk_token="<unk>")
    (tmp_path / "tokenizer_config.json").write_text(json.dumps(tokenizer))
    assert main(["plan", "--model", str(tmp_path), "--max-model-len", "4096"]) == 0
    assert "40 layers; per rank 32 query / 8 KV heads (GQA 4)" in capsys.readouterr().out


PHI3_V_CONFIG = """
from transformers import PretrainedConfig


class Phi3VConfig(PretrainedConfig):  # the checkpoint's own code, as auto_map names it
    model_type = "phi3_v"
"""


def phi3_v(where, code=PHI3_V_CONFIG, auto_config="configuration_phi3_v.Phi3VConfig"):
    """A Phi-3-vision checkpoint directory whose config.json's auto_map names its config
    class (in ``code``, its configuration_phi3_v.py; None: no such file)."""
    config = dict(model_type="phi3_v", architectures=["Phi3VForCausalLM"])
    config |= dict(auto_map={"AutoConfig": auto_config}, torch_dtype="bfloat16")
    config |= dict(num_attention_heads=32, num_key_value_heads=32, num_hidden_layers=32)
    config |= dict(hidden_size=3072, max_position_embeddings=4096, vocab_size=32064)
    (where / "config.json").write_text(json.dumps(config))
    if code is not None:
        (where / "configuration_phi3_v.py").write_text(code)


def test_a_model_of_remote_code_is_read_with_trust_remote_code(tmp_path, capsys):
    """vLLM serves Phi-3-vision with --trust-remote-code: plan takes it too, and says
    to give it where a checkpoint's auto_map needs it (not Transformers' advice)."""
    phi3_v(tmp_path)
    err = _one_line_exit_2(["plan", "--model", str(tmp_path)], capsys)
    assert err.endswith(
        f"plan: error: {tmp_path} needs its own Python code to be read (config.json's "
        "auto_map): give --trust-remote-code to run it, as vllm serve takes it\n"
    ), err
    assert main(["plan", "--model", str(tmp_path), "--trust-remote-code"]) == 0
    assert "layers 0-31: HIP: head size 96\n" in capsys.readouterr().out


REMOTE_CODE = {  # (trial 23) what a checkpoint's auto_map code may do, and the line
    "exits": (
        ("import sys\nsys.exit(3)\n", "configuration_phi3_v.Cfg"),
        "'s own code exited (3) while vLLM read it",
    ),
    "exits-the-process": (  # (trial 24) os._exit skips SystemExit; not 0: were it
        ("import os\nos._exit(7)\n", "configuration_phi3_v.Cfg"),  # let through, the
        "'s own code exited (7) while vLLM read it",  # run would end 7, not pass
    ),
    "in-another-repo": (
        (None, "some-org/some-repo--configuration_x.Cfg"),
        "names code on the Hugging Face Hub (its auto_map), which",
    ),
    "raises": (  # not "vLLM refuses": the checkpoint's code raised it
        ('raise ValueError("needs flash_attn")\n', "configuration_phi3_v.Cfg"),
        "'s own code (configuration_phi3_v.py) raised ValueError: needs flash_attn",
    ),
    "does-not-parse": (
        ("def (:\n", "configuration_phi3_v.Cfg"),
        "'s own code, as config.json's auto_map names it, could not be loaded: SyntaxError",
    ),
    "names-no-class-there": (
        ("x = 1\n", "configuration_phi3_v.Cfg"),
        "could not be loaded: AttributeError: module 'transformers_modules.",
    ),
    "raises-a-base-exception": (
        ('raise GeneratorExit("odd")\n', "configuration_phi3_v.Cfg"),
        "'s own code raised GeneratorExit: odd",
    ),
    "auto-map-names-no-module": (
        (None, "Cfg"),
        "config.json: auto_map names 'Cfg', not a module.Class",
    ),
}


#: The cases scripts/test runs too (each reads a config through vLLM, about 2 s); CI's
#: --all runs every one.
_QUICK_REMOTE_CODE = {"exits", "exits-the-process", "raises"}


@pytest.mark.parametrize(
    ("checkpoint", "says"),
    [
        pytest.param(*case, id=name, marks=() if name in _QUICK_REMOTE_CODE else pytest.mark.slow)
        for name, case in REMOTE_CODE.items()
    ],
)
def test_what_a_models_own_code_does_is_one_line(tmp_path, capsys, checkpoint, says):
    code, auto_config = checkpoint
    phi3_v(tmp_path, code, auto_config)
    err = _one_line_exit_2(["plan", "--model", str(tmp_path), "--trust-remote-code"], capsys)
    assert says in err, err


@pytest.mark.parametrize("trust", [[], ["--trust-remote-code"]], ids=["untrusted", "trusted"])
def test_a_missing_file_of_a_models_own_code_is_named_at_once(tmp_path, capsys, trust):
    """(trial 23) Named on the first run, with or without --trust-remote-code (it took
    two runs: the flag first, then the file)."""
    phi3_v(tmp_path, code=None)
    err = _one_line_exit_2(["plan", "--model", str(tmp_path), *trust], capsys)
    assert err.endswith(
        f"{tmp_path}'s config.json names its own code in configuration_phi3_v.py (its "
        "auto_map), which is not beside it: put the checkpoint's .py files there\n"
    ), err


@pytest.mark.slow  # the installed command, in a process of its own; a minute of retries
def test_hub_code_that_cannot_be_reached_online_is_not_told_to_go_online(tmp_path):
    """(trial 24) With HF_HUB_OFFLINE=0 already, the line says the Hub cannot be reached
    (it said to set HF_HUB_OFFLINE=0)."""
    phi3_v(tmp_path, None, "some-org/some-repo--configuration_x.Cfg")
    exe = Path(sys.executable).with_name("vllm-rocm-asm-decode")
    argv = [str(exe), "plan", "--model", str(tmp_path), "--trust-remote-code"]
    emulation = ("PYTHONPATH", "VLLM_LOGGING_LEVEL", "HIP_VISIBLE_DEVICES")  # a user's
    env = {k: v for k, v in os.environ.items() if k not in emulation}
    env |= {"HF_HUB_OFFLINE": "0", "HF_ENDPOINT": "http://127.0.0.1:9"}  # no Hub either
    done = subprocess.run(argv, capture_output=True, text=True, timeout=300, env=env)
    assert done.returncode == 2 and done.stderr.count("\n") == 1, done.stderr
    assert done.stderr.endswith(
        "(its auto_map), which plan could not download: http://127.0.0.1:9 cannot be "
        "reached from here\n"
    ), done.stderr


@pytest.mark.slow  # the installed command, in a process of its own
def test_what_a_models_own_code_prints_stays_out_of_json(tmp_path):
    """(trials 23, 24) plan --json's stdout is the JSON object alone: print, a write to
    file descriptor 1 and a process the code starts go to stderr."""
    prints = 'import os, subprocess\nprint("hello")\nos.write(1, b"raw\\n")\n'
    prints += 'subprocess.run(["echo", "child"])\n'
    phi3_v(tmp_path, PHI3_V_CONFIG.replace("class Phi3VConfig", prints + "class Phi3VConfig"))
    exe = Path(sys.executable).with_name("vllm-rocm-asm-decode")
    argv = [str(exe), "plan", "--model", str(tmp_path), "--trust-remote-code", "--json"]
    done = subprocess.run(argv, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr
    assert json.loads(done.stdout)["model"] == str(tmp_path)
    assert all(said in done.stderr for said in ("hello", "raw", "child")), done.stderr


@pytest.mark.parametrize("kind", ["fifo", "directory"])
def test_a_config_json_that_is_no_file_is_one_line(tmp_path, capsys, kind):
    """A FIFO would block plan for ever; a directory is named once, not twice."""
    config = tmp_path / "config.json"
    os.mkfifo(config) if kind == "fifo" else config.mkdir()
    err = _one_line_exit_2(["plan", "--model", str(tmp_path)], capsys)
    said = "is a FIFO" if kind == "fifo" else "is a directory"
    assert f"{config} {said}, not a model's config.json" in err and err.count(str(config)) == 1


@pytest.mark.parametrize(
    "argv",
    [["upstream", "bad\udcffup", "--check"], ["plan", "--model", "m/bad\udcffname"]],
    ids=["upstream", "plan"],
)
def test_a_path_of_bytes_that_are_not_utf8_is_named_as_given(argv, tmp_path):
    """Under a UTF-8 locale Python writes stdout and stderr strictly: a path of other
    bytes (held as surrogates) is written back byte for byte, in one line, exit 2."""
    import subprocess

    env = os.environ | {"PYTHONIOENCODING": "utf-8"}
    code = f"from vllm_rocm_asm_decode.tools.cli import main; raise SystemExit(main({argv!r}))"
    proc = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, env=env, cwd=tmp_path, timeout=120
    )
    assert proc.returncode == 2, proc.stderr
    assert b"Traceback" not in proc.stderr and proc.stderr.count(b"\n") == 1, proc.stderr
    assert b"bad\xff" in proc.stderr


def test_stdout_under_a_utf8_locale_writes_such_a_path_back_as_its_bytes():
    import io

    from vllm_rocm_asm_decode.tools import cli

    raw = io.BytesIO()
    out = io.TextIOWrapper(raw, encoding="utf-8", errors="strict")
    cli._keep_unencodable_text(out)
    out.write("tree bad\udcffup written, \u00e9 kept\n")
    out.flush()
    assert raw.getvalue() == b"tree bad\xffup written, \xc3\xa9 kept\n"


# --------------------------------------------------------------------------------------
# passkey: error bodies that cannot be read, proxies, reply shapes (1, 7, 10)


def _reset(head: bytes):
    """Sends ``head``, then resets the connection (an RST, not a FIN) once the client has
    had the time to read it."""

    import struct

    def answer(conn: socket.socket, server: _PasskeyServer) -> None:
        conn.sendall(head)
        server.stopped.wait(0.05)
        conn.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
        conn.close()

    return answer


def _stall(head: bytes):
    """Sends ``head``, then nothing until the test is done."""

    def answer(conn: socket.socket, server: _PasskeyServer) -> None:
        conn.sendall(head)
        server.stopped.wait(10)

    return answer


@pytest.mark.parametrize(
    ("answer", "says"),
    [
        (
            _reset(b"HTTP/1.1 500 Internal Server Error\r\nContent-Length: 100\r\n\r\n"),
            "HTTP 500 (its body could not be read: connection reset)",
        ),
        (
            b"HTTP/1.1 500 Oops\r\nTransfer-Encoding: chunked\r\n\r\nzz\r\n",
            "HTTP 500 (its body could not be read: its chunked encoding is malformed: "
            "b'zz\\r\\n' is not a hex chunk size)",
        ),
        (
            _stall(b"HTTP/1.1 500 Internal Server Error\r\nContent-Length: 100\r\n\r\n"),
            "HTTP 500 (its body could not be read: the --timeout of 0.5 s ran out)",
        ),
    ],
    ids=["reset", "bad-chunk-size", "stall"],
)
def test_passkey_an_error_whose_body_cannot_be_read_says_why(answer, says, capsys):
    """(1) An error status whose body cannot be read is one line that says why, not the
    status line's reason as if it were all the server said."""
    with _PasskeyServer(answer) as server:
        assert _passkey(server.url, "--timeout", "0.5") == 2
    (line,) = capsys.readouterr().err.strip().splitlines()
    assert line.endswith(f"{server.url}: {says}"), line


def _only_proxy(monkeypatch, **variables: str) -> None:
    """The environment's proxy variables (any case, no_proxy too) replaced by these."""
    for name in list(os.environ):
        if name.lower().endswith("_proxy"):
            monkeypatch.delenv(name)
    for name, value in variables.items():
        monkeypatch.setenv(name, value)


def test_passkey_names_the_proxy_a_request_goes_through(monkeypatch, capsys):
    """(7) urllib's proxy from the environment is used, and an error of a request sent
    through it names it and the variable it came from, its password left out."""
    with socket.socket() as bound:  # bound, not listening: the proxy refuses
        bound.bind(("127.0.0.1", 0))
        proxy = f"127.0.0.1:{bound.getsockname()[1]}"
        _only_proxy(monkeypatch, http_proxy=f"http://user:secret@{proxy}")
        with _PasskeyServer(_http(json.dumps({"choices": [{"text": "x"}]}).encode())) as server:
            assert _passkey(server.url) == 2
        assert server.requests == []
    (line,) = capsys.readouterr().err.strip().splitlines()
    assert (
        f"cannot reach {server.url}/v1/completions through the proxy http://***@{proxy} "
        "(from http_proxy): Connection refused"
    ) in line and "secret" not in line, line
    with _PasskeyServer(_http(b"no upstream", "502 Bad Gateway")) as proxy_server:
        _only_proxy(monkeypatch, HTTP_PROXY=proxy_server.url)
        assert _passkey("http://127.0.0.1:9") == 2
    (line,) = capsys.readouterr().err.strip().splitlines()
    assert proxy_server.requests == [b"POST http://127.0.0.1:9/v1/completions HTTP/1.1"]
    assert f"HTTP 502 through the proxy {proxy_server.url} (from HTTP_PROXY): no upstream" in line
    with _PasskeyServer(_http(b"down", "503 Unavailable")) as server:
        _only_proxy(monkeypatch, http_proxy=f"http://{proxy}", no_proxy="127.0.0.1")
        assert _passkey(server.url) == 2  # no_proxy: straight to the server
    (line,) = capsys.readouterr().err.strip().splitlines()
    assert line.endswith(f"{server.url}: HTTP 503: down"), line


@pytest.mark.parametrize(
    ("variable", "proxy", "says"),
    [
        ("HTTP_PROXY", "http://127.0.0.1:abc", "Port could not be cast to integer value"),
        ("http_proxy", "http:/127.0.0.1", "it is not a URL with a host"),
        ("http_proxy", "http://[::1", "Invalid IPv6 URL"),
        ("http_proxy", "http://127.0.0.1:99999", "Port out of range 0-65535"),
        ("http_proxy", "socks5://127.0.0.1:1080", "urllib sends requests only through http"),
    ],
    ids=["port", "no-authority", "ipv6", "port-range", "socks"],
)
def test_passkey_a_proxy_that_cannot_be_used_names_its_variable(
    variable, proxy, says, monkeypatch, capsys
):
    """(7) A proxy URL urllib cannot use is one line naming it and its variable, not "not
    an HTTP answer", a traceback or the server's refusal; nothing is sent."""
    _only_proxy(monkeypatch, **{variable: proxy})
    with _PasskeyServer(_http(json.dumps({"choices": [{"text": "x"}]}).encode())) as server:
        assert _passkey(server.url) == 2
    assert server.requests == []
    (line,) = capsys.readouterr().err.strip().splitlines()
    assert f"the proxy {proxy} (from {variable}) cannot be used: {says}" in line, line


def _first_passkey() -> str:
    import random

    from vllm_rocm_asm_decode.tools.validation import passkey

    return passkey.make_prompt(100, random.Random(0)).passkey  # --seed 0's first prompt


@pytest.mark.parametrize(
    ("reply", "says"),
    [
        (
            {"choices": [{"text": [_first_passkey()]}]},
            f'the reply is not a completion (its "text" is a list, not a string): '
            f'{{"choices": [{{"text": ["{_first_passkey()}"]}}]}}',
        ),
        (
            {"choices": [{"text": int(_first_passkey())}]},
            'the reply is not a completion (its "text" is a number, not a string)',
        ),
        ({"choices": [{"text": None}]}, 'no completion text: {"choices": [{"text": null}]}'),
    ],
    ids=["list", "number", "null"],
)
def test_passkey_a_completion_text_must_be_a_string(reply, says, capsys):
    """(10) A "text" that holds the passkey but is no string is no pass, a null one no
    miss: both are replies that are not completions."""
    with _PasskeyServer(_http(json.dumps(reply).encode())) as server:
        assert _passkey(server.url) == 2
    (line,) = capsys.readouterr().err.strip().splitlines()
    assert says in line, line


@pytest.mark.parametrize(
    ("reply", "says"),
    [
        (
            _http(b"{}", "200 OK", *[f"X-{i}: a" for i in range(101)]),
            "the reply has more than 100 header lines",
        ),
        (
            b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\nzz\r\n",
            "the reply could not be read: its chunked encoding is malformed: b'zz\\r\\n' is not",
        ),
        (_reset(b""), "no answer from {url}/v1/completions: Connection reset by peer"),
        (b"", "no answer from {url}/v1/completions: the connection was closed before a reply"),
    ],
    ids=["101-headers", "bad-chunk-size", "reset-before-a-reply", "closed-before-a-reply"],
)
def test_passkey_replies_http_client_refuses_name_the_cause(reply, says, capsys):
    """(10) What http.client refuses is named (not a bare "(HTTPException)"); a server
    that was reached is not one that could not be."""
    with _PasskeyServer(reply) as server:
        assert _passkey(server.url) == 2
    (line,) = capsys.readouterr().err.strip().splitlines()
    assert says.format(url=server.url) in line, line


def test_passkey_a_connect_timeout_points_to_timeout(capsys):
    """(10) No connection within --timeout says so as the read timeout does: a listener
    whose backlog is full drops the SYN, so the connect waits."""
    with socket.create_server(("127.0.0.1", 0), backlog=0) as listener:
        url = f"http://127.0.0.1:{listener.getsockname()[1]}"
        filling: list[socket.socket] = []
        try:
            for _ in range(8):
                client = socket.socket()
                filling.append(client)
                client.settimeout(0.2)
                try:
                    client.connect(listener.getsockname())
                except TimeoutError:
                    break
            else:
                pytest.skip("this system accepts connections past a full backlog")
            assert _passkey(url, "--timeout", "0.3") == 2
        finally:
            for client in filling:
                client.close()
    (line,) = capsys.readouterr().err.strip().splitlines()
    assert line.endswith(f"{url}: no connection to {url}/v1/completions within 0.3 s (--timeout)")


@pytest.mark.skipif(not os.path.isdir("/proc/self"), reason="needs Linux's /proc")
@pytest.mark.parametrize(
    ("option", "refusal"),
    [("--json", "--json /proc/x:"), ("--result-dir", "--result-dir /proc/x cannot be made:")],
    ids=["json", "result-dir"],
)
def test_a_result_path_in_proc_is_refused_before_the_run_even_for_root(option, refusal, capsys):
    """``os.access`` says yes to root for ``/proc``, where no file can be made (vLLM's
    ROCm images run as root): the check makes and removes a file there instead."""
    argv = ["bench", "serve", "--model", "m", "--vllm", STAND_IN_VLLM, option, "/proc/x"]
    assert run(argv) == 2
    (line,) = capsys.readouterr().err.splitlines()
    assert line.startswith(f"vllm-rocm-asm-decode bench serve: error: {refusal} ")
    assert line.endswith("no file can be made in /proc: No such file or directory"), line


@pytest.mark.parametrize(
    ("signum", "code", "said"),
    [(signal.SIGINT, 130, "interrupted"), (signal.SIGTERM, 143, "terminated (SIGTERM)")],
    ids=["ctrl-c", "sigterm"],
)
def test_a_signal_inside_an_import_ends_the_command_at_once(tmp_path, signum, code, said):
    """Raised inside an import, a Ctrl-C can abort the process in native code or be
    swallowed there; a command with nothing to release ends at once with its line."""
    (tmp_path / "heavy.py").write_text(
        "import os\n"
        f"try:\n    os.kill(os.getpid(), {int(signum)})\n    sum(range(10**6))\n"
        "except BaseException:\n    pass  # swallowed, as native imports can\n"
        "print('ran on')\n"
    )
    script = (
        "import sys\nfrom vllm_rocm_asm_decode.tools import cli\n"
        "cli._plan = lambda *a, **k: __import__('heavy') and 0\n"
        "cli._missing_runtime = cli._settings_problem = lambda: None\n"
        "sys.exit(cli.main(['plan']))\n"
    )
    env = os.environ | {"PYTHONPATH": os.pathsep.join([str(tmp_path), *sys.path])}
    proc = subprocess.run(
        [sys.executable, "-c", script], capture_output=True, text=True, env=env, timeout=120
    )
    assert (proc.returncode, proc.stdout, proc.stderr.strip()) == (
        code,
        "",
        f"vllm-rocm-asm-decode: {said}",
    )


SERVE = ["bench", "serve", "--model", "m", "--vllm", STAND_IN_VLLM]
LOST_RESULTS = {  # each would have been found only when the run ends, its results lost
    "link-to-nothing": (
        ["check", "accuracy", "--json", "dangling"],
        "check accuracy: error: --json dangling is a link to {tmp}/gone/x; "
        "{tmp}/gone does not exist",
    ),
    "plot-link-to-nothing": (
        [*SERVE, "--plot", "dangling.png"],
        "bench serve: error: --plot dangling.png is a link to {tmp}/gone/x.png; "
        "{tmp}/gone does not exist",
    ),
    "json-is-the-plot": (
        ["bench", "kernel", "--json", "k.png", "--plot", "./k.png"],
        "bench kernel: error: --json and --plot name the same file (./k.png); give each its own",
    ),
    "json-is-the-result-dir": (
        [*SERVE, "--result-dir", "rd", "--json", "rd"],
        "bench serve: error: --json rd is --result-dir; give a file name",
    ),
    "json-is-a-result-file": (
        [*SERVE, "--result-dir", "rd", "--json", "rd/plugin-off-r0-c64.json"],
        "bench serve: error: --json rd/plugin-off-r0-c64.json is a name bench serve gives "
        "its own files in --result-dir (server-ARM-rN.log, ARM-rN-cN.json); give another",
    ),
    "result-dir-link-to-nothing": (
        [*SERVE, "--result-dir", "ddir"],
        "bench serve: error: --result-dir ddir cannot be made: it is a link to "
        "{tmp}/gone/d, which does not exist",
    ),
    "result-dir-link-to-nothing-slash": (
        [*SERVE, "--result-dir", "ddir/"],
        "bench serve: error: --result-dir ddir/ cannot be made: it is a link to "
        "{tmp}/gone/d, which does not exist",
    ),
    "json-and-plot-hard-linked": (
        [*SERVE, "--json", "h.png", "--plot", "h2.png"],
        "bench serve: error: --json and --plot name the same file (h2.png); give each its own",
    ),
    "json-through-a-dir-nothing-makes": (  # the system reads rd/x/.. only if rd/x exists
        [*SERVE, "--result-dir", "rd", "--json", "rd/x/../new.json"],
        "bench serve: error: --json rd/x/../new.json: rd/x/.. does not exist",
    ),
    "json-is-the-dataset": (  # a downloaded ShareGPT file, lost
        [*SERVE, "--dataset", "sharegpt", "--dataset-path", "sg.json", "--json", "./sg.json"],
        "bench serve: error: --json ./sg.json would overwrite --dataset-path sg.json, which "
        "the run reads",
    ),
    "plot-is-the-vllm-program": (
        [*SERVE[:-1], "./vllm.png", "--plot", "vllm.png"],
        "bench serve: error: --plot vllm.png would overwrite --vllm ./vllm.png, which the run "
        "reads",
    ),
    "json-in-the-model-dir": (
        [*SERVE[:3], "model", *SERVE[4:], "--json", "model/new.json"],
        "bench serve: error: --json model/new.json is in --model model, which the run reads; "
        "give another",
    ),
    "result-dir-in-the-model-dir": (
        [*SERVE[:3], "model", *SERVE[4:], "--result-dir", "model/results"],
        "bench serve: error: --result-dir model/results is in --model model, which the run "
        "reads; give another",
    ),
}


@pytest.mark.parametrize(("argv", "says"), LOST_RESULTS.values(), ids=LOST_RESULTS)
def test_result_paths_a_run_would_lose_are_refused_before_it(
    tmp_path, monkeypatch, capsys, argv, says
):
    monkeypatch.chdir(tmp_path)
    for name, target in (("dangling", "x"), ("dangling.png", "x.png"), ("ddir", "d")):
        (tmp_path / name).symlink_to(tmp_path / "gone" / target)
    (tmp_path / "h.png").touch()
    (tmp_path / "h2.png").hardlink_to(tmp_path / "h.png")
    (tmp_path / "sg.json").write_text("[]")
    (tmp_path / "vllm.png").symlink_to(STAND_IN_VLLM)  # a program named so
    (tmp_path / "model").mkdir()
    (tmp_path / "model/config.json").write_text("{}")
    assert run(argv) == 2
    assert capsys.readouterr().err.splitlines() == [
        "vllm-rocm-asm-decode " + says.format(tmp=tmp_path)
    ]
    assert not (tmp_path / "gone").exists() and not (tmp_path / "rd").exists()


@pytest.mark.parametrize(
    ("dataset", "says"),
    [
        ("sharegpt", "is a directory"),
        ("random", "is read only with --dataset sharegpt (the random dataset has no file)"),
    ],
)
@pytest.mark.parametrize("result_dir", [[], ["--json", "summary.json"]], ids=["default", "json"])
def test_a_dataset_path_that_is_a_directory_is_said_before_the_results_inside_it(
    tmp_path, monkeypatch, capsys, dataset, says, result_dir
):
    """Run from a directory under the --dataset-path given: the default --result-dir (and
    --json) is in it, but the mistake is the directory, said as for any other one."""
    (tmp_path / "here").mkdir()
    monkeypatch.chdir(tmp_path / "here")
    argv = [*SERVE, "--dataset", dataset, "--dataset-path", str(tmp_path), *result_dir]
    assert run(argv) == 2
    assert capsys.readouterr().err.splitlines() == [
        f"vllm-rocm-asm-decode bench serve: error: --dataset-path {tmp_path} {says}"
    ]
    assert os.listdir(tmp_path / "here") == []  # no --result-dir made


@pytest.mark.parametrize("length", ["--input-len", "--output-len"])
def test_sharegpt_refuses_the_random_datasets_lengths(tmp_path, capsys, monkeypatch, length):
    """ShareGPT prompts keep their own lengths: a length given with them would be
    ignored, so it is refused in one line, as --dataset-path is for the random dataset."""
    monkeypatch.chdir(tmp_path)
    data = tmp_path / "sg.json"
    data.write_text('[{"conversations": [{"from": "human", "value": "hi"}]}]')
    argv = [*SERVE, "--dataset", "sharegpt", "--dataset-path", str(data), length, "10"]
    assert run(argv) == 2
    assert capsys.readouterr().err.splitlines() == [
        f"vllm-rocm-asm-decode bench serve: error: {length} is for --dataset random "
        "(sharegpt prompts keep their lengths)"
    ]
    assert os.listdir(tmp_path) == ["sg.json"]  # nothing made


@pytest.mark.parametrize(
    ("earlier", "says"),
    [
        (["server-asm-r0.log"], "1 file(s) of an earlier run (server-asm-r0.log)"),
        (
            ["stock-r1-c64.json", "asm-r0-c128.json"],
            "2 file(s) of an earlier run (asm-r0-c128.json, ...)",
        ),
    ],
    ids=["a-log", "two-results"],
)
def test_a_result_dir_with_an_earlier_runs_files_is_refused(
    tmp_path, monkeypatch, capsys, earlier, says
):
    """A second run would replace the files of the same names and leave the others
    beside its own; files bench serve does not write there are no one's business."""
    monkeypatch.chdir(tmp_path)
    (tmp_path / "rd").mkdir()
    for name in ["notes.txt", "asm-r0-c64.json.bak", *earlier]:
        (tmp_path / "rd" / name).write_text("{}")
    # The command's own mistakes first: moving the files away would not have helped.
    assert run([*SERVE, "--result-dir", "rd", "--max-model-len", "100"]) == 2
    assert "error: --max-model-len 100 is below" in capsys.readouterr().err
    monkeypatch.setenv("VLLM_ROCM_ASM_DECODE_CUT", "abc")
    assert run([*SERVE, "--result-dir", "rd"]) == 2
    assert "VLLM_ROCM_ASM_DECODE_CUT" in capsys.readouterr().err
    monkeypatch.delenv("VLLM_ROCM_ASM_DECODE_CUT")
    assert run([*SERVE, "--result-dir", "rd"]) == 2
    assert capsys.readouterr().err.splitlines() == [
        f"vllm-rocm-asm-decode bench serve: error: --result-dir rd holds {says}, which this "
        "run would mix with its own; give a new directory, or move them away"
    ]
    for name in earlier:
        (tmp_path / "rd" / name).unlink()
    from vllm_rocm_asm_decode.tools.validation.serve_bench import earlier_run_files

    assert earlier_run_files(tmp_path / "rd") == []  # the others are not a run's


def test_a_result_file_in_the_result_dir_the_run_makes_is_writable(tmp_path, monkeypatch):
    """bench serve makes --result-dir first: a file straight in it is writable, one in a
    directory under it that nothing makes is not; a link to a writable place is."""
    from vllm_rocm_asm_decode.tools.validation.serve_bench import OWN_FILE

    monkeypatch.chdir(tmp_path)
    (tmp_path / "link.json").symlink_to(tmp_path / "made-by-the-write.json")
    assert cli._result_files_problem("new/summary.json", None, ("new", OWN_FILE)) is None
    assert cli._result_files_problem("link.json", None, ("new", OWN_FILE)) is None
    assert cli._result_files_problem("new/sub/s.json", None, ("new", OWN_FILE)) == (
        "--json new/sub/s.json: new/sub does not exist"
    )


def test_a_ctrl_c_while_the_command_line_loads_is_its_one_line():
    """The console script's guard (tools/console.py): a Ctrl-C that lands inside the
    import of the command line itself, before main() takes Ctrl-C over, is the same
    one line and exit 130, not a traceback."""
    script = (
        "import os, signal, sys\n"
        "class CtrlC:  # presses Ctrl-C as the command line starts to load\n"
        "    def find_spec(self, name, path=None, target=None):\n"
        "        if name == 'vllm_rocm_asm_decode.tools.cli':\n"
        "            os.kill(os.getpid(), signal.SIGINT)\n"
        "sys.meta_path.insert(0, CtrlC())\n"
        "from vllm_rocm_asm_decode.tools.console import main\n"
        "sys.exit(main())\n"
    )
    proc = subprocess.run(
        [sys.executable, "-c", script, "--version"], capture_output=True, text=True, timeout=60
    )
    assert (proc.returncode, proc.stdout, proc.stderr) == (
        130,
        "",
        "vllm-rocm-asm-decode: interrupted\n",
    )
    (script,) = importlib.metadata.entry_points(group="console_scripts", name=cli.PROG)
    assert script.value == "vllm_rocm_asm_decode.tools.console:main"


@pytest.mark.parametrize("signum", [signal.SIGINT, signal.SIGTERM], ids=["ctrl-c", "sigterm"])
def test_a_signal_once_the_command_is_done_ends_it_with_its_own_status(signum):
    """The console script: a Ctrl-C or SIGTERM while Python shuts down after the command
    returned (torch's and vLLM's exit handlers take seconds) ends the process at once
    with the command's status (doctor's 2 here), no word, no exit handler's traceback."""
    script = (
        "import atexit, os, sys, time\n"
        "from vllm_rocm_asm_decode.tools import cli, console\n"
        "cli.main = lambda: print('the answer') or 2\n"
        "def exit_handler():  # a slow one, as torch's and vLLM's are\n"
        f"    os.kill(os.getpid(), {int(signum)})\n"
        "    time.sleep(30)\n"
        "    print('not reached')\n"
        "atexit.register(exit_handler)\n"
        "sys.exit(console.main())\n"
    )
    started = time.monotonic()
    proc = subprocess.run(
        [sys.executable, "-c", script], capture_output=True, text=True, timeout=60
    )
    assert (proc.returncode, proc.stdout, proc.stderr) == (2, "the answer\n", "")
    assert time.monotonic() - started < 20


def test_the_console_script_ends_after_every_exit_handler_the_command_brought():
    """The console script ends the process itself once the exit handlers ran: those
    registered while the command ran (a temporary directory's finalizer, logging's
    flush to a file, as torch and vLLM bring) still run, and the status is the
    command's."""
    script = (
        "import logging, sys, tempfile\n"
        "from vllm_rocm_asm_decode.tools import cli, console\n"
        "def command():\n"
        "    global kept\n"
        "    kept = tempfile.TemporaryDirectory()\n"
        "    log = logging.getLogger('x')\n"
        "    log.addHandler(logging.FileHandler(kept.name + '.log', delay=True))\n"
        "    log.warning('flushed at exit')\n"
        "    print(kept.name)\n"
        "    return 3\n"
        "cli.main = command\n"
        "sys.exit(console.main())\n"
    )
    proc = subprocess.run(
        [sys.executable, "-c", script], capture_output=True, text=True, timeout=60
    )
    assert (proc.returncode, proc.stderr) == (3, "")
    kept = Path(proc.stdout.strip())
    assert not kept.exists()  # the finalizer ran
    log = kept.with_name(kept.name + ".log")
    assert log.read_text() == "flushed at exit\n"
    log.unlink()


@pytest.mark.parametrize(
    "command",
    [["bench", "serve", "--model", "m"], ["check", "accuracy"], ["bench", "kernel"]],
    ids=["bench-serve", "check-accuracy", "bench-kernel"],
)
def test_what_is_wrong_with_a_result_file_follows_its_name_without_a_colon(
    command, tmp_path, capsys
):
    """(trial 17) ``--json jf: is not a regular file`` had a stray colon; a sentence of
    its own (``--json x/y: x does not exist``) keeps one."""
    fifo = tmp_path / "jf"
    os.mkfifo(fifo)
    assert run([*command, "--json", str(fifo)]) == 2
    (line,) = capsys.readouterr().err.splitlines()
    assert line.endswith(
        f"error: --json {fifo} is not a regular file (a FIFO, a device or a "
        "socket); give a file name"
    ), line
    assert run([*command, "--json", str(tmp_path / "no" / "x.json")]) == 2
    (line,) = capsys.readouterr().err.splitlines()
    assert line.endswith(f"--json {tmp_path / 'no' / 'x.json'}: {tmp_path / 'no'} does not exist")


@pytest.mark.skipif(not os.path.isfile("/proc/version"), reason="needs Linux's /proc")
def test_an_existing_kernel_file_is_no_result_file():
    """Root may open /proc/version for writing; the write fails at the end of the run."""
    assert choices.unwritable("/proc/version") == (
        "is a kernel interface file (/proc, /sys), not a result file"
    )


def test_python_dash_m_runs_the_command():
    """``python -m vllm_rocm_asm_decode`` where the console script is not on PATH
    (trial 15: it was "a package and cannot be directly executed")."""
    import subprocess

    for argv, code, out in ((["--version"], 0, "vllm-rocm-asm-decode "), (["plan", "-x"], 2, "")):
        proc = subprocess.run(
            [sys.executable, "-m", "vllm_rocm_asm_decode", *argv],
            capture_output=True,
            text=True,
            timeout=60,
        )
        assert proc.returncode == code and proc.stdout.startswith(out), proc
        assert proc.stderr.count("\n") == (1 if code else 0), proc.stderr
