"""``vllm-rocm-asm-decode``: the command line.

``plan``            what the asm decode will do for a model on a GPU (runs anywhere)
``bench kernel``    impl.forward in a CUDA graph, HIP against asm (ROCm GPU with AITER)
``bench serve``     A/B serving benchmark around ``vllm serve`` / ``vllm bench serve``
``check accuracy``  decode error against an fp32 reference (contract model without a GPU)
``check passkey``   long-context retrieval against a running server
``doctor``          the environment the plugin trusts, and a GPU self-test
``upstream DIR``    write this change into a vLLM 0.33.x source tree (the in-tree form)
"""

from __future__ import annotations

import argparse
import contextlib
import json
import logging
import os
import sys
import threading
from collections.abc import Iterator

from . import choices

PROG = "vllm-rocm-asm-decode"


class _Parser(argparse.ArgumentParser):
    """Usage errors as one line on stderr, exit status 2; no abbreviated options (an
    abbreviation would slip past the ``--serve-arg`` handling)."""

    def __init__(self, *args, **kwargs) -> None:
        kwargs.setdefault("allow_abbrev", False)
        super().__init__(*args, **kwargs)

    def error(self, message: str) -> None:  # type: ignore[override]
        self.exit(2, f"{self.prog}: error: {message}\n")


def build_parser() -> argparse.ArgumentParser:
    """The whole command line; imports nothing heavy (no torch, no vLLM), so ``--help``
    and every input error answer at once."""

    parser = _Parser(prog=PROG, description="ROCM_ATTN asm decode for vLLM on AMD Instinct GPUs.")
    sub = parser.add_subparsers(dest="command", required=True, parser_class=_Parser)
    plan = sub.add_parser(
        "plan",
        help="show which decode kernel each batch size runs for a model on a GPU",
        description=(
            "Show what the ROCM_ATTN asm decode will do for a model on a GPU: which layers "
            "are eligible and why not, the cut, the decode kernel at each of vLLM's "
            "CUDA-graph batch sizes, and the scale-table memory. Computed by the backend's "
            "own rule; runs on any machine (no GPU needed)."
        ),
    )
    plan.add_argument(
        "--model",
        default=choices.DEFAULT_PRESET,
        metavar="PRESET|DIR",
        help=f"a preset ({', '.join(choices.presets())}; default {choices.DEFAULT_PRESET}) "
        "or a local directory with a Hugging Face config.json (read offline by vLLM's "
        "ModelConfig; a directory wins over a preset of the same name)",
    )
    plan.add_argument(
        "--gpu",
        type=choices.gpu,
        metavar="|".join(choices.GPUS),
        help=f"the GPU (default: the live GPU on ROCm, else {choices.DEFAULT_GPU})",
    )
    plan.add_argument(
        "--tensor-parallel-size",
        "-tp",
        type=choices.positive_int,
        default=1,
        metavar="N",
        help="tensor-parallel ranks; heads are divided as vLLM divides them (default 1)",
    )
    plan.add_argument(
        "--kv-cache-dtype",
        type=choices.kv_cache_dtype,
        default="fp8",
        metavar="|".join(choices.KV_CACHE_DTYPES),
        help="vLLM's --kv-cache-dtype (default fp8)",
    )
    plan.add_argument(
        "--block-size",
        type=choices.positive_int,
        default=16,
        metavar="N",
        help="KV cache block size (default 16)",
    )
    plan.add_argument(
        "--dtype",
        type=choices.dtype,
        default="auto",
        metavar="|".join(choices.DTYPES),
        help="model (query) dtype, as vLLM's --dtype (default auto, vLLM's: the "
        "checkpoint's torch_dtype)",
    )
    plan.add_argument(
        "--max-model-len",
        type=choices.positive_int,
        default=None,
        metavar="N",
        help="vLLM's --max-model-len (default: the model's context length)",
    )
    plan.add_argument(
        "--aiter-version",
        type=choices.aiter_version,
        default="installed",
        metavar="VERSION|unknown|installed",
        help="the AITER version to plan for (default: the installed one, else unknown); "
        "before 0.1.17 a KV cache of more than 65536 blocks (fewer for pages above 32 KiB) "
        "keeps the HIP decode",
    )
    plan.add_argument(
        "--num-gpu-blocks",
        type=choices.gpu_blocks,
        default=None,
        metavar="N",
        help="KV cache blocks per layer (the '# GPU blocks' vLLM logs at start-up): decides "
        "the AITER block-id clause and sizes the scale tables",
    )
    plan.add_argument(
        "--cudagraph-mode",
        type=choices.cudagraph_mode,
        default=choices.CUDAGRAPH_MODES[0],
        metavar="|".join(choices.CUDAGRAPH_MODES),
        help="vLLM's compilation_config cudagraph_mode (default FULL_AND_PIECEWISE, "
        "vLLM's); under FULL every captured graph holds the HIP decode",
    )
    plan.add_argument("--json", action="store_true", help="print one JSON object")

    doc = _documented_parser(
        sub, "doctor", "check this machine before turning the plugin on (GPU self-test)", "doctor"
    )
    doc.add_argument("--json", action="store_true", help="print one JSON object")

    up = _documented_parser(
        sub, "upstream", "write this change into a vLLM 0.33.x source tree", "upstream"
    )
    up.add_argument(
        "directory",
        metavar="DIR",
        type=choices.nonempty,
        help="a vLLM 0.33.x git checkout, or a copy of an installed vLLM's Python files",
    )
    up.add_argument(
        "--stage",
        type=_stage,
        default=1,
        metavar="N",
        help="write stages 1..N of the change (1: the asm decode in rocm_attn.py, the "
        "first pull request; 2: mixed prefill+decode steps; 3: scale tables for "
        "ROCM_AITER_FA and ROCM_ATTN); default 1",
    )
    up.add_argument(
        "--check",
        action="store_true",
        help="apply to a temporary copy of the files it touches and print the diff stat; "
        "DIR is not written (exit 1 when there are changes to make)",
    )

    bench = sub.add_parser("bench", help="measure on an AMD GPU").add_subparsers(
        dest="bench", required=True, parser_class=_Parser
    )
    _add_bench_kernel(bench)
    _add_bench_serve(bench)
    check = sub.add_parser("check", help="check numerics").add_subparsers(
        dest="check", required=True, parser_class=_Parser
    )
    _add_check_accuracy(check)
    _add_check_passkey(check)
    return parser


def _module_doc(module: str) -> str:
    """A tools module's docstring, read from its source without importing it (the
    validation modules import torch)."""
    import ast
    from importlib.util import find_spec

    spec = find_spec(f"{__package__}.{module}")
    if spec is None or spec.origin is None:
        return ""
    with open(spec.origin, encoding="utf-8") as f:
        return (ast.get_docstring(ast.parse(f.read())) or "").strip()


def _stage(text: str) -> int:
    from .upstream.stages import STAGES

    value = choices.positive_int(text)
    if value not in STAGES:
        raise argparse.ArgumentTypeError(f"{value}: choose 1 to {max(STAGES)}")
    return value


def _documented_parser(sub, name: str, help: str, module: str) -> argparse.ArgumentParser:
    """A subcommand whose --help shows its module's docstring."""
    return sub.add_parser(
        name,
        help=help,
        description=_module_doc(module),
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )


def _add_layout_options(p: argparse.ArgumentParser, heads_help: str, contexts_help: str) -> None:
    p.add_argument(
        "--heads", type=choices.layouts, default=None, metavar="Q/KV,...", help=heads_help
    )
    p.add_argument(
        "--contexts",
        type=choices.contexts,
        default=None,
        metavar="N,...",
        help=contexts_help + f"; at most {choices.MAX_CONTEXT}",
    )


def _add_bench_serve(bench) -> None:
    from .validation import serve_bench as sb

    p = _documented_parser(
        bench,
        "serve",
        "A/B serving benchmark: baseline vs asm decode, fresh server per arm",
        "validation.serve_bench",
    )
    p.add_argument("--model", required=True, type=choices.nonempty, help="what vllm serve serves")
    p.add_argument(
        "--baseline",
        default="plugin-off",
        metavar="plugin-off|mha-off",
        help="baseline arm: VLLM_ROCM_ASM_DECODE=0 (default, everything else "
        "equal) or VLLM_ROCM_USE_AITER_MHA=0 (the original change's baseline)",
    )
    p.add_argument(
        "--tensor-parallel-size",
        "-tp",
        type=choices.positive_int,
        default=1,
        metavar="N",
        help="vllm serve's --tensor-parallel-size (default 1)",
    )
    p.add_argument(
        "--concurrency",
        type=choices.positive_ints,
        default=list(sb.DEFAULT_CONCURRENCIES),
        metavar="C,C,...",
        help="--max-concurrency values (default 1,8,16,64,128)",
    )
    p.add_argument(
        "--num-prompts",
        type=choices.positive_ints,
        default=list(sb.DEFAULT_NUM_PROMPTS),
        metavar="N,N,...",
        help="prompts per concurrency (default 8,32,64,256,256)",
    )
    p.add_argument(
        "--repeats",
        type=choices.positive_int,
        default=1,
        metavar="N",
        help="runs per arm, arms alternating (default 1)",
    )
    p.add_argument(
        "--host",
        type=choices.nonempty,
        default="127.0.0.1",
        help="the address both servers listen on and the client dials (default 127.0.0.1)",
    )
    p.add_argument(
        "--port", type=choices.port, default=8000, help="the servers' port (default 8000)"
    )
    p.add_argument(
        "--dataset",
        default="random",
        metavar="random|sharegpt",
        help="random: 1024 in / 1024 out with --ignore-eos, the original change's run "
        "(default); sharegpt: vLLM's ShareGPT run, chat-like lengths (needs --dataset-path)",
    )
    p.add_argument("--dataset-path", default=None, metavar="FILE", help="the ShareGPT JSON file")
    p.add_argument(
        "--input-len",
        type=choices.positive_int,
        default=1024,
        help="random dataset: prompt tokens (default 1024)",
    )
    p.add_argument(
        "--output-len",
        type=choices.positive_int,
        default=1024,
        help="random dataset: output tokens, with --ignore-eos (default 1024)",
    )
    p.add_argument(
        "--max-model-len",
        type=choices.positive_int,
        default=40960,
        help="vllm serve's --max-model-len (default 40960)",
    )
    p.add_argument(
        "--gpu-memory-utilization",
        type=choices.fraction,
        default=0.85,
        help="vllm serve's --gpu-memory-utilization (default 0.85)",
    )
    p.add_argument(
        "--result-dir",
        default="asm-decode-serve-results",
        help="where result files and server logs go (default asm-decode-serve-results)",
    )
    p.add_argument("--vllm", default="vllm", help="the vllm executable (default: vllm on PATH)")
    p.add_argument(
        "--health-timeout",
        type=choices.positive_float,
        default=1800.0,
        metavar="SECONDS",
        help="how long a server may take to answer /health (default 1800)",
    )
    p.add_argument(
        "--serve-arg",
        action="append",
        default=[],
        metavar="ARG",
        help="extra argument for vllm serve (repeatable; --serve-arg --enforce-eager works, "
        "as does --serve-arg=--enforce-eager); not the options bench serve sets itself "
        "(--host, --port, --kv-cache-dtype, ...); each arm's VLLM_ROCM_ASM_DECODE and "
        "VLLM_ROCM_USE_AITER_MHA are set by bench serve, whatever the environment says",
    )
    p.add_argument(
        "--json",
        type=choices.nonempty,
        metavar="PATH",
        help="write all runs and the summary as JSON",
    )
    p.add_argument(
        "--plot", type=choices.nonempty, metavar="PATH", help="write a PNG of tok/s per concurrency"
    )


def _add_bench_kernel(bench) -> None:
    p = _documented_parser(
        bench,
        "kernel",
        "impl.forward in a CUDA graph: HIP decode vs asm decode (ROCm GPU + AITER)",
        "validation.kernel_bench",
    )
    _add_layout_options(
        p,
        "head layouts (default: the seed's grid, 40/8 and 32/8)",
        "context length of every sequence (default 1024,4096)",
    )
    p.add_argument(
        "--seqs",
        type=choices.positive_ints,
        default=None,
        metavar="N,...",
        help="batch sizes (default 16,64,256; 24,64,256 for 32/8)",
    )
    p.add_argument(
        "--precision",
        type=choices.precision,
        default="uhp",
        metavar="uhp|default",
        help="asm precision: uhp = high_precision=2 as shipped (default); "
        "default = AITER's default, to compare with the seed's timings",
    )
    mode = p.add_mutually_exclusive_group()
    mode.add_argument(
        "--sweep",
        action="store_true",
        help="walk batch sizes from 1 at the first layout and context and report "
        "the crossover and the VLLM_ROCM_ASM_DECODE_CUT it suggests",
    )
    mode.add_argument(
        "--skew",
        action="store_true",
        help="one long sequence (2K to 128K tokens) among --seqs short ones (default 127 "
        "of --contexts' first value, default 1024): where asm turns slower, and the "
        "VLLM_ROCM_ASM_DECODE_SKEW that suggests",
    )
    p.add_argument(
        "--iters",
        type=choices.positive_int,
        default=100,
        help="graph replays per timing (default 100)",
    )
    p.add_argument(
        "--json", type=choices.nonempty, metavar="PATH", help="write the raw numbers as JSON"
    )
    p.add_argument(
        "--plot", type=choices.nonempty, metavar="PATH", help="write a PNG of µs vs sequences"
    )


def _add_check_passkey(check) -> None:
    p = _documented_parser(
        check,
        "passkey",
        "long-context passkey retrieval against a running server",
        "validation.passkey",
    )
    p.add_argument("--model", required=True, type=choices.nonempty, help="the served model name")
    p.add_argument(
        "--base-url",
        type=choices.http_url,
        default="http://127.0.0.1:8000",
        help="the server's URL, with or without /v1 (default http://127.0.0.1:8000); "
        "prompts go to <url>/v1/completions",
    )
    p.add_argument(
        "--lengths",
        type=choices.contexts,
        default=[3000, 8000, 16000, 32000],
        metavar="N,...",
        help="target prompt lengths in tokens (default 3000,8000,16000,32000)",
    )
    p.add_argument(
        "--prompts", type=choices.positive_int, default=24, help="prompts per length (default 24)"
    )
    p.add_argument(
        "--in-flight",
        type=choices.positive_int,
        default=30,
        help="concurrent requests (default 30)",
    )
    p.add_argument(
        "--seed", type=int, default=0, help="seed of the passkeys and their places (default 0)"
    )
    p.add_argument(
        "--timeout",
        type=choices.positive_float,
        default=600.0,
        metavar="SECONDS",
        help="per request (default 600)",
    )


def _add_check_accuracy(check) -> None:
    p = _documented_parser(
        check,
        "accuracy",
        "decode error vs an fp32 reference (contract model without a ROCm GPU)",
        "validation.accuracy",
    )
    _add_layout_options(
        p,
        "head layouts (default 40/8,32/8,64/8,32/4; small grid without GPU)",
        "context lengths sampled (default 1,15,16,17,255,1000,4000)",
    )
    p.add_argument(
        "--seeds", type=choices.seeds, default=None, metavar="N,...", help="seeds (default 0,1,2)"
    )
    p.add_argument(
        "--json", type=choices.nonempty, metavar="PATH", help="write every measurement as JSON"
    )


#: Seconds after which a command that is still loading says so on stderr.
NOTE_AFTER = 1.0


@contextlib.contextmanager
def _said_after(seconds: float, note: str) -> Iterator[None]:
    """``note`` on a terminal's stderr while the block is still running after
    ``seconds``, erased when it ends (so an error that follows stays one line; logs and
    pipes get no note)."""
    if not sys.stderr.isatty():
        yield
        return
    shown = threading.Event()

    def show() -> None:
        print(note, end="", file=sys.stderr, flush=True)
        shown.set()

    timer = threading.Timer(seconds, show)
    timer.daemon = True
    timer.start()
    try:
        yield
    finally:
        timer.cancel()
        timer.join()
        if shown.is_set():
            print("\r\033[K", end="", file=sys.stderr, flush=True)


def _plan(args: argparse.Namespace) -> int:
    from ..settings import SettingError, check_all

    try:
        check_all()  # the plugin's settings, as vLLM would apply them
        # What the arguments and config.json decide, before vLLM is imported.
        model_dir, label = choices.resolve_model_dir(args.model)
        choices.check_model_config(model_dir, args.tensor_parallel_size)
        with _said_after(NOTE_AFTER, f"{PROG} plan: loading vLLM to read {label} ..."):
            from .plan import make_plan, render

            plan = make_plan(
                model=args.model,
                gpu=args.gpu,
                tensor_parallel_size=args.tensor_parallel_size,
                kv_cache_dtype=args.kv_cache_dtype,
                block_size=args.block_size,
                dtype=args.dtype,
                max_model_len=args.max_model_len,
                aiter_version=args.aiter_version,
                num_gpu_blocks=args.num_gpu_blocks,
                cudagraph_mode=args.cudagraph_mode,
            )
    except (choices.InputError, SettingError) as exc:
        print(f"{PROG} plan: error: {exc}", file=sys.stderr)
        return 2
    print(json.dumps(plan.to_json(), indent=2) if args.json else render(plan))
    return 0


def _bench_serve(args: argparse.Namespace) -> int:
    import shutil
    import socket
    from importlib.util import find_spec
    from pathlib import Path

    from .validation import serve_bench as sb

    # What can be judged before starting servers for an hour.
    problem = None
    if shutil.which(args.vllm) is None:
        problem = f"--vllm {args.vllm}: no such executable (is vLLM installed and on PATH?)"
    elif Path(args.result_dir).exists() and not Path(args.result_dir).is_dir():
        problem = f"--result-dir {args.result_dir} is a file"
    elif args.json and (why := _unwritable(args.json)):
        problem = f"--json {args.json}: {why}"
    elif args.plot and (why := _unwritable(args.plot)):
        problem = f"--plot {args.plot}: {why}"
    elif args.plot and find_spec("matplotlib") is None:
        problem = f"--plot {args.plot} needs matplotlib (pip install matplotlib)"
    elif bad := _plugin_settings_problem():
        problem = bad
    else:
        try:
            socket.getaddrinfo(args.host, args.port)
        except (OSError, UnicodeError) as exc:  # UnicodeError: a label over 63 bytes
            why = getattr(exc, "strerror", None) or exc
            problem = f"--host {args.host!r} does not resolve ({why})"
        else:
            problem = _port_taken(args.host, args.port)
    if problem:
        print(f"{PROG} bench serve: error: {problem}", file=sys.stderr)
        return 2
    try:
        cfg = sb.ServeConfig(
            model=args.model, baseline=args.baseline,
            tensor_parallel_size=args.tensor_parallel_size, concurrencies=args.concurrency,
            num_prompts=args.num_prompts, repeats=args.repeats, host=args.host, port=args.port,
            input_len=args.input_len, output_len=args.output_len,
            max_model_len=args.max_model_len, gpu_memory_utilization=args.gpu_memory_utilization,
            result_dir=Path(args.result_dir), vllm=args.vllm, serve_args=args.serve_arg,
            health_timeout=args.health_timeout, dataset=args.dataset,
            dataset_path=None if args.dataset_path is None else Path(args.dataset_path),
        )  # fmt: skip
    except ValueError as exc:
        print(f"{PROG} bench serve: error: {exc}", file=sys.stderr)
        return 2
    outcome = sb.run_ab(cfg, log=lambda line: print(line, file=sys.stderr, flush=True))
    sb.flag_outliers(outcome.results)
    rows = sb.summarize(outcome.results, cfg.baseline)
    if outcome.results:  # nothing measured: no table of nothing
        print(sb.render(rows, outcome.results, cfg.baseline, cfg.model, outcome.arms))
    try:
        if args.json:
            data = outcome.to_json() | {"summary": [vars(r) for r in rows]}
            Path(args.json).write_text(json.dumps(data, indent=2))
        if args.plot and rows:
            from .validation.plots import plot_serve

            plot_serve(rows, cfg.baseline, cfg.model, args.plot)
    except OSError as exc:  # the path went away during the run
        print(
            f"{PROG} bench serve: error: {exc} (results kept in {cfg.result_dir})", file=sys.stderr
        )
        return 1
    if outcome.error:
        kept = (
            f"results so far kept in {cfg.result_dir}"
            if outcome.results
            else "nothing was measured"
        )
        print(f"{PROG} bench serve: error: {outcome.error} ({kept})", file=sys.stderr)
        return 130 if outcome.interrupted else 1
    unconfirmed = [f"{a.arm} repeat {a.repeat}" for a in outcome.arms if not a.confirmed]
    if unconfirmed:
        print(
            f"{PROG} bench serve: error: could not confirm the arm of {', '.join(unconfirmed)} "
            "from its server log (see above); the comparison may not be what it says",
            file=sys.stderr,
        )
        return 1
    return 0


def _doctor(args: argparse.Namespace) -> int:
    from .doctor import render, run

    try:
        report = run()
    except Exception as exc:  # an environment too broken to describe: say so in one line
        text = str(exc).strip().splitlines()
        print(
            f"{PROG} doctor: error: {type(exc).__name__}: {text[0] if text else ''}",
            file=sys.stderr,
        )
        return 1
    print(json.dumps(report.to_json(), indent=2) if args.json else render(report))
    return report.exit_code


def _port_taken(host: str, port: int) -> str | None:
    """Why the servers could not listen on ``host:port`` (something holds it already);
    None when they can."""
    import socket

    try:
        infos = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)
        family, kind, proto, _, address = infos[0]
        with socket.socket(family, kind, proto) as probe:
            probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            probe.bind(address)
    except OSError as exc:
        return f"--host {host!r} --port {port}: cannot listen there ({exc.strerror or exc})"
    return None


def _missing_runtime() -> str | None:
    """What this environment lacks of what ``plan``, ``doctor``, ``bench kernel`` and
    ``check accuracy`` run on (vLLM's own classes, torch); None when nothing."""
    from importlib.util import find_spec

    lacking = [name for name in ("torch", "vllm") if find_spec(name) is None]
    if not lacking:
        return None
    return (
        f"{' and '.join(lacking)} not installed here: this command runs vLLM's own code "
        "(vLLM's ROCm image has both; elsewhere pip install vllm==0.33.*)"
    )


def _settings_problem() -> str | None:
    """Every plugin setting that does not parse, in one line (as ``plan`` and vLLM
    refuse them); None when all do."""
    from .. import settings

    return "; ".join(settings.problems()) or None


def _plugin_settings_problem() -> str | None:
    """What in this environment would stop both arms' servers, or keep the plugin out of
    the candidate's (``bench serve`` sets ``VLLM_ROCM_ASM_DECODE`` per arm itself)."""
    from .. import settings

    bad = [p for p in settings.problems() if not p.startswith(f"{settings.SWITCH_ENV}=")]
    if bad:
        return "; ".join(bad)
    if settings.left_out_by_vllm_plugins():
        return (
            f"VLLM_PLUGINS={os.environ['VLLM_PLUGINS']!r} leaves out {settings.ENTRY_POINT}: "
            "no arm would run the plugin"
        )
    return None


def _unwritable(path: str) -> str | None:
    """Why a result file cannot be written at ``path`` (checked before a long run)."""
    from pathlib import Path

    target = Path(path)
    if target.is_dir():
        return "is a directory"
    parent = target.parent
    if not parent.is_dir():
        return f"{parent} is not a directory"
    if not os.access(parent, os.W_OK):
        return f"{parent} is not writable"
    return None


def _glue_serve_args(argv: list[str]) -> list[str]:
    """``--serve-arg --enforce-eager`` as ``--serve-arg=--enforce-eager``: argparse would
    take a value that starts with ``--`` for an option of its own."""
    out = []
    for i, word in enumerate(argv):
        if i and argv[i - 1] == "--serve-arg" and out and out[-1] == "--serve-arg":
            out[-1] = f"--serve-arg={word}"
        else:
            out.append(word)
    return out


def main(argv: list[str] | None = None) -> int:
    """The ``vllm-rocm-asm-decode`` command; Ctrl-C ends it with one line and exit 130
    (``bench serve`` first stops its server and keeps its results)."""
    try:
        return _main(argv)
    except KeyboardInterrupt:
        # On a terminal the ^C (or a loading note) ends the line first.
        print(("\n" if sys.stderr.isatty() else "") + f"{PROG}: interrupted", file=sys.stderr)
        return 130


def _main(argv: list[str] | None) -> int:
    argv = _glue_serve_args(list(sys.argv[1:] if argv is None else argv))
    args = build_parser().parse_args(argv)
    # vLLM's and torch's start-up warnings would drown the answer (VLLM_LOGGING_LEVEL,
    # when set, wins for vLLM's).
    level = os.environ.get("VLLM_LOGGING_LEVEL", "ERROR").strip().upper()  # vLLM's reading
    if not isinstance(logging.getLevelName(level), int):
        print(
            f"{PROG}: error: VLLM_LOGGING_LEVEL={os.environ['VLLM_LOGGING_LEVEL']!r} is not a "
            "logging level (DEBUG, INFO, WARNING, ERROR, CRITICAL)",
            file=sys.stderr,
        )
        return 2
    logging.getLogger("vllm").setLevel(level)
    logging.getLogger("torch").setLevel(logging.ERROR)
    if args.command != "bench" or args.bench != "serve":
        # vLLM's import logs torch deprecations that would drown the answer (a server the
        # benchmark starts keeps its own torch logging).
        os.environ.setdefault("TORCH_LOGS", "-all")
    heavy = args.command in ("plan", "doctor") or (
        args.command,
        getattr(args, "bench", None) or getattr(args, "check", None),
    ) in (("bench", "kernel"), ("check", "accuracy"))
    if heavy and (missing := _missing_runtime()):
        name = " ".join(
            filter(None, (args.command, getattr(args, "bench", None), getattr(args, "check", None)))
        )
        print(f"{PROG} {name}: error: {missing}", file=sys.stderr)
        return 2
    if args.command == "plan":
        return _plan(args)
    if args.command == "doctor":
        return _doctor(args)
    if args.command == "upstream":
        from .upstream import main as upstream

        return upstream(args.directory, args.check, args.stage)
    if args.command == "bench" and args.bench == "serve":
        return _bench_serve(args)
    if args.command == "bench" and args.bench == "kernel":
        for option, path in (("--json", args.json), ("--plot", args.plot)):
            if path and (problem := _unwritable(path)):
                print(f"{PROG} bench kernel: error: {option} {path}: {problem}", file=sys.stderr)
                return 2
        if problem := _settings_problem():
            print(f"{PROG} bench kernel: error: {problem}", file=sys.stderr)
            return 2
        from .validation.kernel_bench import main as bench_kernel

        return bench_kernel(args)
    if args.command == "check" and args.check == "passkey":
        from .validation.passkey import main as check_passkey

        return check_passkey(args)
    if args.command == "check" and args.check == "accuracy":
        if args.json and (problem := _unwritable(args.json)):
            print(f"{PROG} check accuracy: error: --json {args.json}: {problem}", file=sys.stderr)
            return 2
        if problem := _settings_problem():
            print(f"{PROG} check accuracy: error: {problem}", file=sys.stderr)
            return 2
        from .validation.accuracy import main as check_accuracy

        return check_accuracy(args)
    raise AssertionError(args.command)


if __name__ == "__main__":
    sys.exit(main())
