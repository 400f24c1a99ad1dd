"""``vllm-rocm-asm-decode``: the command line.

``plan``            what the asm decode will do for a model on a GPU (runs anywhere)
``bench kernel``    impl.forward in a CUDA graph, HIP against asm (ROCm GPU with AITER)
``bench serve``     A/B serving benchmark around ``vllm serve`` / ``vllm bench serve``
``check accuracy``  decode error against an fp32 reference (contract model without a GPU)
``check passkey``   long-context retrieval against a running server
``doctor``          the environment the plugin trusts, and a GPU self-test
``upstream DIR``    write this change into a vLLM 0.33.x source tree (the in-tree form)
``reproduce``       the original change's whole validation on an AMD GPU, one report

A reader of stdout that goes away (``| head``) ends a command quietly with exit 141
(128 + SIGPIPE, what a shell shows for a command killed by the signal); result files
(``--json``, ``--plot``) are written before stdout, so they are there either way. A
stdout that cannot be written (a full disk, ``> /dev/full``) is one line and exit 1.
"""

from __future__ import annotations

import argparse
import codecs
import contextlib
import errno
import itertools
import json
import logging
import os
import re
import shlex
import signal
import sys
import threading
from collections.abc import Callable, Iterator, Sequence
from types import FrameType

from . import choices
from .choices import one_line
from .stopping import Terminated, sigterm_taken, stopped_by

PROG = "vllm-rocm-asm-decode"
#: The exit status when stdout's reader went away: 128 + SIGPIPE.
EXIT_BROKEN_PIPE = 141
#: The exit status after a SIGTERM (128 + SIGTERM), as a shell reports it.
EXIT_TERMINATED = 143
#: The commands that import vLLM (and torch) themselves.
HEAVY = ("plan", "doctor", "bench kernel", "check accuracy")


class _ListOnce(argparse.Action):
    """A comma-separated list option: given twice, a usage error, where argparse would
    let the second list replace the first unseen (``--heads 40/8 --heads 32/8``)."""

    def __call__(self, parser, namespace, values, option_string=None) -> None:
        given = namespace.__dict__.setdefault(_LISTS_GIVEN, set())
        if self.dest in given:
            parser.error(
                f"argument {option_string}: given twice; give its values once, "
                f"comma-separated ({self.metavar})"
            )
        given.add(self.dest)
        setattr(namespace, self.dest, values)


#: Where :class:`_ListOnce` notes the lists given during one parse (removed after it).
_LISTS_GIVEN = "_lists_given"


class _Parser(argparse.ArgumentParser):
    """Usage errors as one line on stderr, exit status 2; no abbreviated options (an
    abbreviation would slip past the ``--serve-arg`` handling)."""

    def __init__(self, *args, **kwargs) -> None:
        kwargs.setdefault("allow_abbrev", False)
        super().__init__(*args, **kwargs)

    def error(self, message: str) -> None:  # type: ignore[override]
        if message.startswith("the following arguments are required: --model"):
            message += _model_hint(_argv)
        elif message.startswith("the following arguments are required: "):
            message += self._dash_hint(_argv)
        # The line, then its newline: see _OneLineErrors.
        self._print_message(f"{self.prog}: error: {one_line(message)}", sys.stderr)
        self.exit(2, "\n")

    def _dash_hint(self, argv: list[str]) -> str:
        """Advice for a missing positional argument where a word before ``--`` starts
        with a dash and is none of this command's options: a path such as ``-dash``,
        which argparse takes for an unknown option. Else nothing."""
        words = argv[: argv.index("--")] if "--" in argv else argv
        for word in words:
            unknown = word.split("=", 1)[0] not in self._option_string_actions
            if word.startswith("-") and word != "-" and unknown:
                return (
                    f" ({word} is not an option of {self.prog.split()[-1]}; a path that "
                    f"starts with a dash goes after --: {self.prog} -- {shlex.quote(word)})"
                )
        return ""

    def parse_known_args(self, args=None, namespace=None):  # type: ignore[override]
        parsed, rest = super().parse_known_args(args, namespace)
        parsed.__dict__.pop(_LISTS_GIVEN, None)
        return parsed, rest

    def _print_message(self, message: str, file=None) -> None:
        """argparse's, except that a failed write to stdout (``--help | true``) is not
        swallowed: :func:`main` ends the command as it ends any other."""
        if message and file is sys.stdout:
            file.write(message)
        else:
            super()._print_message(message, file)


class _Version(argparse.Action):
    """``--version``: the package's version from its metadata (nothing heavy imported)."""

    def __init__(self, option_strings: Sequence[str], dest: str, **kwargs) -> None:
        super().__init__(option_strings, dest, nargs=0, help="print the version and exit")

    def __call__(self, parser, namespace, values, option_string=None) -> None:
        from importlib import metadata

        try:
            version = metadata.version(PROG)
        except metadata.PackageNotFoundError:
            version = "(not installed: no package metadata)"
        print(f"{PROG} {version}")
        parser.exit(0)


def build_parser() -> argparse.ArgumentParser:
    """The whole command line; imports nothing heavy (no torch, no vLLM), so ``--help``
    and every input error answer at once."""

    parser = _Parser(prog=PROG, description="ROCM_ATTN asm decode for vLLM on AMD Instinct GPUs.")
    parser.add_argument("--version", action=_Version)
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
        type=choices.block_size,
        default=16,
        metavar="N",
        help="KV cache block size, a multiple of 16 as ROCM_ATTN takes (default 16)",
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
        type=choices.max_model_len,
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
    for flag, does in (  # vllm serve's switches, as it takes them (--no-... too)
        (
            "--language-model-only",
            "a multimodal model serves its text model alone (Gemma 3's then runs on ROCM_ATTN)",
        ),
        (
            "--trust-remote-code",
            "run the checkpoint's own Python code (its config.json's auto_map), which some "
            "models need to be read",
        ),
    ):
        plan.add_argument(
            flag,
            action=argparse.BooleanOptionalAction,
            default=False,
            help=f"as vllm serve takes it: {does}",
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
        help="write stages 1..N of the change (1: the asm decode in rocm_attn.py and "
        "its switch, AttentionConfig.use_aiter_asm_decode in config/attention.py, the "
        "first pull request; 2: mixed prefill+decode steps; 3: scale tables for "
        "ROCM_AITER_FA and ROCM_ATTN); default 1",
    )
    up.add_argument(
        "--check",
        action="store_true",
        help="compute the change from DIR's files as a run does and print the diff stat; "
        "DIR is not written (exit 1 when there are changes to make)",
    )

    bench = sub.add_parser("bench", help="measure on an AMD GPU").add_subparsers(
        dest="bench", required=True, parser_class=_Parser, metavar="{kernel,serve}"
    )
    _add_bench_kernel(bench)
    _add_bench_serve(bench)
    check = sub.add_parser("check", help="check numerics").add_subparsers(
        dest="check", required=True, parser_class=_Parser, metavar="{accuracy,passkey}"
    )
    _add_check_accuracy(check)
    _add_check_passkey(check)
    from .reproduce.options import add_parser as add_reproduce

    add_reproduce(sub, _documented_parser)
    return parser


def _module_doc(module: str) -> str:
    """A tools module's docstring, read from its source without importing it (the
    validation modules import torch), as a terminal shows it: ``code`` marks dropped."""
    from importlib.util import find_spec

    spec = find_spec(f"{__package__}.{module}")
    if spec is None or spec.origin is None:
        return ""
    with open(spec.origin, encoding="utf-8") as f:
        return _docstring(f.read()).strip().replace("``", "")


def _docstring(source: str) -> str:
    """``ast.get_docstring`` of ``source``, from its first tokens where the docstring is
    one plain string statement (every command builds every subcommand's parser, and
    compiling the seven modules took 70 ms of each start), else from its whole tree."""
    import ast
    import inspect
    import io
    import tokenize

    head = []  # the first two tokens that are not comments or blank lines
    try:
        for token in tokenize.generate_tokens(io.StringIO(source).readline):
            if token.type not in (tokenize.COMMENT, tokenize.NL):
                head.append(token)
                if len(head) == 2:
                    break
    except (tokenize.TokenError, SyntaxError):
        head = []
    ends = (tokenize.NEWLINE, tokenize.ENDMARKER)
    if len(head) == 2 and head[0].type == tokenize.STRING and head[1].type in ends:
        try:
            value = ast.literal_eval(head[0].string)
        except (SyntaxError, ValueError):  # an f-string, before Python 3.12
            value = None
        if isinstance(value, str):
            return inspect.cleandoc(value)
    return ast.get_docstring(ast.parse(source)) or ""


def _stage(text: str) -> int:
    from .upstream.stages import STAGES

    # As every number here: ASCII digits, a sign and spaces around them allowed.
    if not re.fullmatch(r"\s*\+?[0-9]+\s*", text) or int(text) not in STAGES:
        raise argparse.ArgumentTypeError(f"{text!r}: choose 1 to {max(STAGES)}")
    return int(text)


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
        "--heads",
        type=choices.layouts,
        default=None,
        metavar="Q/KV,...",
        help=heads_help,
        action=_ListOnce,
    )
    p.add_argument(
        "--contexts",
        type=choices.contexts,
        default=None,
        metavar="N,...",
        action=_ListOnce,
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
        type=choices.one_of(sb.BASELINES),
        default="plugin-off",
        metavar="|".join(sb.BASELINES),
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
        type=choices.distinct_positive_ints,
        default=list(sb.DEFAULT_CONCURRENCIES),
        metavar="C,C,...",
        action=_ListOnce,
        help="--max-concurrency values (default 1,8,16,64,128)",
    )
    p.add_argument(
        "--num-prompts",
        type=choices.positive_ints,
        default=list(sb.DEFAULT_NUM_PROMPTS),
        metavar="N,N,...",
        action=_ListOnce,
        help="prompts per concurrency (default 8,32,64,256,256)",
    )
    p.add_argument(
        "--repeats",
        type=choices.repeats,
        default=1,
        metavar="N",
        help=f"runs per arm, arms alternating (default 1, at most {choices.MAX_REPEATS})",
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
        type=choices.one_of(sb.DATASETS),
        default="random",
        metavar="|".join(sb.DATASETS),
        help="random: 1024 in / 1024 out with --ignore-eos, the original change's run "
        "(default); sharegpt: vLLM's ShareGPT run, chat-like lengths (needs --dataset-path)",
    )
    p.add_argument(
        "--dataset-path",
        type=choices.nonempty,
        default=None,
        metavar="FILE",
        help="the ShareGPT JSON file (a regular file)",
    )
    p.add_argument(
        "--input-len",
        type=choices.positive_int,
        default=None,
        help="random dataset: prompt tokens (default 1024)",
    )
    p.add_argument(
        "--output-len",
        type=choices.positive_int,
        default=None,
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
        type=choices.nonempty,
        default="asm-decode-serve-results",
        help="where result files and server logs go: a new directory, or one holding no "
        "earlier run's files (default asm-decode-serve-results)",
    )
    p.add_argument(
        "--vllm",
        type=choices.nonempty,
        default="vllm",
        help="the vllm executable (default: vllm on PATH)",
    )
    p.add_argument(
        "--health-timeout",
        type=choices.seconds,
        default=1800.0,
        metavar="SECONDS",
        help=f"how long a server may take to answer /health (default 1800, at most "
        f"{choices.MAX_SECONDS})",
    )
    p.add_argument(
        "--serve-arg",
        type=choices.nonempty,
        action="append",
        default=[],
        metavar="ARG",
        help="extra argument for vllm serve (repeatable; --serve-arg --enforce-eager works, "
        "as does --serve-arg=--enforce-eager); not the options bench serve sets itself "
        "(--host, --port, --kv-cache-dtype, ..., nor a prefix vLLM would read as one, such "
        "as --max-model); each arm's VLLM_ROCM_ASM_DECODE and "
        "VLLM_ROCM_USE_AITER_MHA are set by bench serve, whatever the environment says",
    )
    p.add_argument(
        "--json",
        type=choices.nonempty,
        metavar="PATH",
        help="write all runs and the summary as JSON (a file, written before the table is printed)",
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
        "head layouts (default: the original change's grid, 40/8 and 32/8)",
        "context length of every sequence (default 1024,4096)",
    )
    p.add_argument(
        "--seqs",
        type=choices.distinct_positive_ints,
        default=None,
        metavar="N,...",
        action=_ListOnce,
        help="batch sizes (default 16,64,256; 24,64,256 for 32/8)",
    )
    p.add_argument(
        "--precision",
        type=choices.precision,
        default="uhp",
        metavar="uhp|default",
        help="asm precision: uhp = high_precision=2 as shipped (default); "
        "default = AITER's default, to compare with the original change's timings",
    )
    mode = p.add_mutually_exclusive_group()
    mode.add_argument(
        "--sweep",
        action="store_true",
        help="walk batch sizes from 1 at one layout and context (one --heads and one "
        "--contexts value; --seqs gives the sizes) and report "
        "the crossover and the VLLM_ROCM_ASM_DECODE_CUT it suggests",
    )
    mode.add_argument(
        "--skew",
        action="store_true",
        help="one long sequence (2K to 128K tokens) among --seqs short ones (default 127 "
        "of one --contexts value, default 1024; one --heads): where asm turns slower, and the "
        "VLLM_ROCM_ASM_DECODE_SKEW that suggests",
    )
    p.add_argument(
        "--iters",
        type=choices.iters,
        default=100,
        help=f"graph replays per timing (default 100, at most {choices.MAX_ITERS})",
    )
    p.add_argument(
        "--json", type=choices.nonempty, metavar="PATH", help="write the raw numbers as JSON"
    )
    p.add_argument(
        "--plot",
        type=choices.nonempty,
        metavar="PATH",
        help="write a PNG of µs vs sequences (with --skew: vs the long sequence's tokens)",
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
        help="the server's URL, with or without /v1 (default http://127.0.0.1:8000), "
        "without user:password@; prompts go to <url>/v1/completions",
    )
    p.add_argument(
        "--lengths",
        type=choices.passkey_lengths,
        default=[3000, 8000, 16000, 32000],
        metavar="N,...",
        action=_ListOnce,
        help=f"target prompt lengths in tokens, each {choices.MIN_PASSKEY_LENGTH} to "
        f"{choices.MAX_CONTEXT} (default 3000,8000,16000,32000)",
    )
    p.add_argument(
        "--prompts",
        type=choices.prompts,
        default=24,
        help=f"prompts per length (default 24, at most {choices.MAX_PROMPTS})",
    )
    p.add_argument(
        "--in-flight",
        type=choices.in_flight,
        default=30,
        help=f"concurrent requests (default 30, at most {choices.MAX_IN_FLIGHT})",
    )
    p.add_argument(
        "--seed",
        type=choices.seed,
        default=0,
        help="seed of the passkeys and their places, 0 to 4294967295 (default 0)",
    )
    p.add_argument(
        "--timeout",
        type=choices.seconds,
        default=600.0,
        metavar="SECONDS",
        help="each request's whole time, connect to last byte of the reply, not each read "
        f"(default 600, at most {choices.MAX_SECONDS})",
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
        "head layouts (default 40/8,32/8,64/8,32/4; without a GPU 40/8,32/4)",
        "context lengths sampled (default 1,15,16,17,255,1000,4000; without a GPU 1,15,16,17,255)",
    )
    p.add_argument(
        "--seeds",
        type=choices.seeds,
        default=None,
        metavar="N,...",
        help="seeds (default 0,1,2; without a GPU 0)",
        action=_ListOnce,
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
        from .plan_input import check_cache_size, check_config, check_head_size, check_model_path

        check_model_path(args.model)
        model_dir, label = choices.resolve_model_dir(args.model)
        choices.check_model_config(model_dir, args.tensor_parallel_size)
        check_config(model_dir, args.dtype)
        check_head_size(model_dir)
        check_cache_size(
            model_dir,
            args.gpu,
            args.tensor_parallel_size,
            args.kv_cache_dtype,
            args.block_size,
            args.num_gpu_blocks,
        )
        if mismatch := _vllm_problem():
            raise choices.InputError(mismatch)
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
                language_model_only=args.language_model_only,
                trust_remote_code=args.trust_remote_code,
            )
    except (choices.InputError, SettingError) as exc:
        print(f"{PROG} plan: error: {exc}", file=sys.stderr)
        return 2
    print(json.dumps(plan.to_json(), indent=2) if args.json else render(plan))
    return 0


def _bench_serve(args: argparse.Namespace) -> int:
    from pathlib import Path

    from .validation import serve_bench as sb

    # What can be judged before starting servers for an hour: the command's own
    # mistakes first, then what this machine lacks.
    problem, inputs, cfg = None, _serve_inputs(args), None
    if why := sb.dataset_problem(args.dataset, args.dataset_path):
        problem = why  # before the result paths, which may lie in a directory given as it
    elif args.dataset != "random" and (args.input_len or args.output_len):
        given = "--input-len" if args.input_len else "--output-len"
        problem = f"{given} is for --dataset random ({args.dataset} prompts keep their lengths)"
    elif why := choices.uncreatable_dir(args.result_dir):
        problem = f"--result-dir {args.result_dir} {why}"
    elif read := _inside_an_input(args.result_dir, inputs):
        problem = f"--result-dir {args.result_dir} is in {read}, which the run reads; give another"
    elif why := _result_files_problem(args.json, args.plot, (args.result_dir, sb.OWN_FILE), inputs):
        problem = why
    else:
        try:
            cfg = sb.ServeConfig(
                model=args.model, baseline=args.baseline,
                tensor_parallel_size=args.tensor_parallel_size, concurrencies=args.concurrency,
                num_prompts=args.num_prompts, repeats=args.repeats, host=args.host,
                port=args.port, input_len=args.input_len or sb.RANDOM_LEN,
                output_len=args.output_len or sb.RANDOM_LEN, max_model_len=args.max_model_len,
                gpu_memory_utilization=args.gpu_memory_utilization,
                result_dir=Path(args.result_dir), vllm=args.vllm, serve_args=args.serve_arg,
                health_timeout=args.health_timeout, dataset=args.dataset,
                dataset_path=None if args.dataset_path is None else Path(args.dataset_path),
            )  # fmt: skip
        except ValueError as exc:
            problem = str(exc)
    problem = problem or _serve_machine_problem(args)
    if problem or cfg is None:
        print(f"{PROG} bench serve: error: {problem}", file=sys.stderr)
        return 2
    if earlier := sb.earlier_run_files(cfg.result_dir):  # after the command's own mistakes
        print(
            f"{PROG} bench serve: error: --result-dir {args.result_dir} holds {len(earlier)} "
            f"file(s) of an earlier run ({earlier[0]}{', ...' if len(earlier) > 1 else ''}), "
            "which this run would mix with its own; give a new directory, or move them away",
            file=sys.stderr,
        )
        return 2
    outcome = sb.run_ab(cfg, log=_say)
    sb.flag_outliers(outcome.results)
    rows = sb.summarize(outcome.results, cfg.baseline)
    unconfirmed = [a for a in outcome.arms if not a.confirmed]
    # What to mend follows from why: lines missing from a log, or a log that says no
    # layer could take the asm decode (plan --model says why for a model).
    mend = (
        "see that the servers log at INFO (VLLM_LOGGING_CONFIG_PATH) and load the plugin"
        if any(" line in the log" in a.detail for a in unconfirmed)
        else f"see why with {PROG} plan --model {cfg.model}"
    )
    doubt = (
        "could not confirm the arm of "
        + "; ".join(f"{a.arm} repeat {a.repeat} ({a.detail})" for a in unconfirmed)
        + f" from its server log; the comparison may not be what it says: {mend}, then "
        "rerun with another --result-dir"
        if unconfirmed
        else None
    )
    # The files first: a reader of stdout that has gone away must not cost them.
    try:
        if args.json:
            data = outcome.to_json() | {"summary": [vars(r) for r in rows]}
            data["error"] = data["error"] or doubt
            Path(args.json).write_text(json.dumps(data, indent=2))
        if args.plot and rows:
            from .validation.plots import plot_serve

            plot_serve(rows, cfg.baseline, cfg.model, args.plot)
    except OSError as exc:  # the path went away during the run
        if outcome.results:
            print(sb.render(rows, outcome.results, cfg.baseline, cfg.model, outcome.arms))
        print(
            f"{PROG} bench serve: error: {exc} (results kept in {cfg.result_dir})", file=sys.stderr
        )
        return 130 if outcome.interrupted else 1
    if outcome.results:  # nothing measured: no table of nothing
        print(sb.render(rows, outcome.results, cfg.baseline, cfg.model, outcome.arms))
    if outcome.error:
        kept = (
            f"results so far kept in {cfg.result_dir}"
            if outcome.results
            else "nothing was measured"
        )
        if sb.earlier_run_files(cfg.result_dir):  # a rerun into it would be refused
            kept += f"; rerun with another --result-dir, or move {cfg.result_dir}'s files away"
        said = stopped_by() if outcome.interrupted else outcome.error
        print(f"{PROG} bench serve: error: {said} ({kept})", file=sys.stderr)
        return 130 if outcome.interrupted else 1
    if doubt:
        print(f"{PROG} bench serve: error: {doubt}", file=sys.stderr)
        return 1
    return 0


def _serve_machine_problem(args: argparse.Namespace) -> str | None:
    """What this machine lacks for ``bench serve``'s servers (the vLLM program, valid
    plugin settings, the host and a free port); None when nothing."""
    from .validation.serve_bench import host_problem

    if why := choices.not_executable(args.vllm, "is vLLM installed and on PATH?"):
        return choices.said_of(f"--vllm {args.vllm}", why)
    if bad := choices.plugin_settings_problem():
        return bad
    return host_problem(args.host, args.port) or _port_taken(args.host, args.port)


def _say(line: str) -> None:
    """A progress line of ``bench serve`` on stderr; a stderr that has gone away does
    not stop an hour's run (its results go to files)."""
    with contextlib.suppress(OSError):
        print(line, file=sys.stderr, flush=True)


def _doctor(args: argparse.Namespace) -> int:
    try:
        from .doctor import render, run

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
    """Why the servers could not listen on ``host:port`` (something holds it already),
    tried in the host's address family; None when they can."""
    from .validation.serve_bench import listen_problem

    why = listen_problem(host, port)
    return None if why is None else f"--host {host} --port {port}: cannot listen there ({why})"


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


def _vllm_problem() -> str | None:
    """Why the vLLM on the path is not one this release runs on (another series, or
    what the plugin builds on moved), read from its source before any of it is imported
    (``plan``, ``bench kernel`` and ``check accuracy`` ask it once their own input is
    judged; ``doctor`` reports it as a check); None when it is."""
    from importlib.util import find_spec

    from ..vllm_support import (
        another_vllm_first,
        imported_vllm_version,
        installed_vllm_version,
        vllm_mismatch,
    )

    imported, installed = imported_vllm_version(), installed_vllm_version()
    if None not in (imported, installed):  # else vllm_mismatch says it is not installed
        spec = find_spec("vllm")
        where = next(iter(spec.submodule_search_locations or []), None) if spec else None
        if first := another_vllm_first(imported, where, installed):
            return first
    mismatch = vllm_mismatch()
    if mismatch is None:
        return None
    return f"{mismatch} (pip install vllm==0.33.* for this release)"


def _settings_problem() -> str | None:
    """Every plugin setting that does not parse, in one line (as ``plan`` and vLLM
    refuse them); None when all do."""
    from .. import settings

    return "; ".join(settings.problems()) or None


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


#: The command line being parsed, for the advice a usage error gives.
_argv: list[str] = []


def _model_advice(word: str) -> str:
    """Advice to name ``word`` with ``--model`` where it names a model as ``vllm serve``
    takes one (a preset, or a directory with a config.json); else nothing."""
    if word in choices.presets() or os.path.isfile(os.path.join(word, "config.json")):
        return f" (name the model with --model {shlex.quote(word)})"
    return ""


def _model_hint(argv: list[str]) -> str:
    """Advice for a missing ``--model`` when a word of ``argv`` that is no option's value
    names a model (``bench serve DIR``)."""
    for before, word in itertools.pairwise(["", *argv]):
        takes_value = before.startswith("-") and "=" not in before
        if not word.startswith("-") and not takes_value and (advice := _model_advice(word)):
            return advice
    return ""


def _stray_hint(argv: list[str], args: argparse.Namespace, stray: str) -> str:
    """Advice for a stray word: one after a ``--serve-arg``, which takes one word
    (``--serve-arg --max-num-seqs 64``), or a model named as ``vllm serve`` takes it,
    without ``--model`` (a directory with a config.json, or a preset: never a flag's
    value); else nothing."""
    for before, word in itertools.pairwise(argv):
        if word == stray and before.startswith("--serve-arg="):
            option = before.split("=", 1)[1]
            return (
                f" (--serve-arg takes one word: --serve-arg={option}={stray}, or "
                f"--serve-arg {option} --serve-arg {stray})"
            )
    named = any(arg.split("=")[0] == "--model" for arg in argv)
    return _model_advice(stray) if hasattr(args, "model") and not named else ""


#: The subcommand being run (``["bench", "serve"]``), for a line said after it ends.
_running: list[str] = []


class _StdoutError(Exception):
    """stdout cannot be written (a full disk, ``> /dev/full``)."""

    def __init__(self, cause: OSError) -> None:
        super().__init__(cause.strerror or str(cause))


class _GuardedStdout:
    """sys.stdout while a command runs: a write or flush that fails says it was stdout
    that failed (:class:`_StdoutError`; a reader gone away stays BrokenPipeError)."""

    def __init__(self, stream) -> None:
        self._stream = stream

    def write(self, text: str) -> int:
        try:
            return self._stream.write(text)
        except BrokenPipeError:
            raise
        except OSError as exc:
            raise _StdoutError(exc) from exc

    def flush(self) -> None:
        try:
            self._stream.flush()
        except BrokenPipeError:
            raise
        except OSError as exc:
            raise _StdoutError(exc) from exc

    def __getattr__(self, name: str):
        return getattr(self._stream, name)


class _OneLineErrors:
    """sys.stderr while a command runs: a write of one of the command's own lines (they
    begin with its name; print() writes a line and its newline apart) goes out as
    :func:`one_line` makes it; anything else, as written."""

    def __init__(self, stream) -> None:
        self._stream = stream

    def write(self, text: str) -> int:
        if text.startswith(PROG):
            text = one_line(text)
        return self._stream.write(text)

    def __getattr__(self, name: str):
        return getattr(self._stream, name)


class _ClosedStdout:
    """stdout for a command started without one (``cmd >&-``): a write fails as one to a
    closed file descriptor does, so the command ends as on ``> /dev/full``."""

    def write(self, text: str) -> int:
        raise OSError(errno.EBADF, os.strerror(errno.EBADF))

    def flush(self) -> None:
        pass

    def isatty(self) -> bool:
        return False


def _as_given(exc: UnicodeError) -> tuple[str | bytes, int]:
    """Text a stream's encoding cannot write: a path's undecodable bytes (which Python
    holds as lone surrogates) go out as they came in, anything else as ``\\x..``."""
    assert isinstance(exc, UnicodeEncodeError)
    text = exc.object[exc.start : exc.end]
    if all("\udc80" <= c <= "\udcff" for c in text):
        return bytes(ord(c) - 0xDC00 for c in text), exc.end
    return codecs.backslashreplace_errors(exc)


codecs.register_error("vllm_rocm_asm_decode", _as_given)


def _keep_unencodable_text(*streams) -> None:
    """A file name of bytes that are not UTF-8 is printed as given, not a
    UnicodeEncodeError (Python writes stdout strictly under a UTF-8 locale) nor
    ``\\udcff`` (stderr's escapes)."""
    for stream in streams:
        errors = getattr(stream, "errors", None)
        if errors in ("strict", "backslashreplace") and hasattr(stream, "reconfigure"):
            with contextlib.suppress(AttributeError, ValueError, OSError):
                stream.reconfigure(errors="vllm_rocm_asm_decode")


def _take_sigterm_as_ctrl_c() -> Callable[[], None]:
    """SIGTERM raises :class:`~.stopping.Terminated` in the main thread, so every command's Ctrl-C
    path (``bench serve`` and ``reproduce`` stop their servers and keep their results)
    runs for it too, and a second SIGTERM is a second Ctrl-C (the server killed at
    once). Returns the undo."""
    try:
        previous = signal.getsignal(signal.SIGTERM)

        def terminated(signum: int, frame: FrameType | None) -> None:
            sigterm_taken.set()
            _end_now_inside_an_import(frame, terminated=True)
            raise Terminated

        sigterm_taken.clear()
        signal.signal(signal.SIGTERM, terminated)
    except ValueError:  # not the main thread: SIGTERM keeps its own handling
        return lambda: None
    return lambda: signal.signal(signal.SIGTERM, previous)


def _note_ctrl_c() -> Callable[[], None]:
    """Ctrl-C raises KeyboardInterrupt as Python's own handler does, unless it lands
    inside an import of a command without servers (:func:`_end_now_inside_an_import`),
    and is remembered: one that an import of ``bench serve`` or ``reproduce`` swallowed
    and that surfaced as another error is reported by :func:`main` as the interrupt it
    was. Left alone where SIGINT is ignored (a background job) or handled by the
    embedder. Returns the undo."""
    _sigint_taken.clear()
    try:
        if signal.getsignal(signal.SIGINT) is not signal.default_int_handler:
            return lambda: None

        def interrupted(signum: int, frame: FrameType | None) -> None:
            _sigint_taken.set()
            _end_now_inside_an_import(frame, terminated=False)
            raise KeyboardInterrupt

        signal.signal(signal.SIGINT, interrupted)
    except ValueError:  # not the main thread
        return lambda: None
    return lambda: signal.signal(signal.SIGINT, signal.default_int_handler)


#: Set once this run of the command has taken a Ctrl-C.
_sigint_taken = threading.Event()

#: Commands that start servers: their Ctrl-C stops them first, so it is always raised.
_STOP_THEIR_SERVERS = (["bench", "serve"], ["reproduce"])


def _end_now_inside_an_import(frame: FrameType | None, terminated: bool) -> None:
    """A signal that lands inside an import (torch's, vLLM's) ends a command that holds
    nothing yet to release or keep there and then, with its one line: raised in the
    import, it can abort the process in native code ("terminate called after throwing
    ... KeyboardInterrupt"), or be swallowed and the command run on."""
    if _running[:2] in _STOP_THEIR_SERVERS or _running[:1] in _STOP_THEIR_SERVERS:
        return
    while frame is not None:
        if frame.f_code.co_filename.startswith("<frozen importlib"):
            code = _interrupted(terminated)
            with contextlib.suppress(OSError, ValueError):
                sys.stderr.flush()
            os._exit(code)
        frame = frame.f_back


def main(argv: list[str] | None = None) -> int:
    """The ``vllm-rocm-asm-decode`` command. Ctrl-C ends it with one line and exit 130
    (``bench serve`` first stops its server and keeps its results), SIGTERM the same
    way with exit 143 (128 + SIGTERM). A reader of stdout
    that went away ends it quietly with :data:`EXIT_BROKEN_PIPE`; a stdout that cannot
    be written, with one line and exit 1. argparse's own exits (``--help``, a usage
    error) pass through as SystemExit. Paths of bytes that are not UTF-8 are printed
    as given."""
    _keep_unencodable_text(sys.stdout, sys.stderr)
    real, real_err = sys.stdout, sys.stderr
    # None: started with stderr closed (``2>&-``): what it says goes nowhere
    errors = open(os.devnull, "w") if real_err is None else real_err  # closed below
    sys.stderr = _OneLineErrors(errors)
    # None: started with stdout closed (``>&-``), where print() would write nothing.
    sys.stdout = _GuardedStdout(_ClosedStdout() if real is None else real)
    undo_sigterm, undo_sigint = _take_sigterm_as_ctrl_c(), _note_ctrl_c()
    try:
        try:
            code = _main(argv)
            # A command that took the SIGTERM as its Ctrl-C returned 130 for it.
            return EXIT_TERMINATED if code == 130 and sigterm_taken.is_set() else code
        finally:  # what is still buffered goes out here, inside the handlers below
            if sys.stdout is not None:
                sys.stdout.flush()
    except KeyboardInterrupt as exc:
        return _interrupted(isinstance(exc, Terminated))
    except BrokenPipeError:
        _drop(real)
        return EXIT_BROKEN_PIPE
    except _StdoutError as exc:
        _drop(real)
        who = " ".join((PROG, *_running))
        _complain(f"{who}: error: cannot write to stdout: {exc}")
        return 1
    except Exception:
        # A Ctrl-C or SIGTERM an import swallowed, surfacing as another error (numpy's
        # "no attribute 'ndarray'", torch's "dispatcher tracer already initlized").
        if _sigint_taken.is_set() or sigterm_taken.is_set():
            return _interrupted(sigterm_taken.is_set())
        raise
    finally:
        sys.stdout = real
        sys.stderr = real_err
        if real_err is None:
            errors.close()
        undo_sigterm()
        undo_sigint()


def _interrupted(terminated: bool) -> int:
    """The one line and exit status of a Ctrl-C (130) or a SIGTERM (143)."""
    # On a terminal the ^C (or a loading note) ends the line first.
    _complain(("\n" if sys.stderr.isatty() else "") + f"{PROG}: {stopped_by(terminated)}")
    return EXIT_TERMINATED if terminated else 130


def _drop(stream) -> None:
    """Point ``stream``'s file at /dev/null, so that the interpreter's last flush of
    what is still buffered does not fail again at exit."""
    try:
        fd = stream.fileno()
    except (AttributeError, OSError, ValueError):  # not a file (a test's capture)
        return
    null = os.open(os.devnull, os.O_WRONLY)
    try:
        os.dup2(null, fd)
    finally:
        os.close(null)


def _complain(line: str) -> None:
    with contextlib.suppress(OSError):
        print(line, file=sys.stderr)


def _leaf_parser(parser: argparse.ArgumentParser, args: argparse.Namespace):
    """The (sub)parser of the command ``args`` names: ``bench serve``'s for
    ``bench serve``."""
    current = parser
    while True:
        action = next(
            (a for a in current._actions if isinstance(a, argparse._SubParsersAction)), None
        )
        name = None if action is None else getattr(args, action.dest, None)
        if name is None:
            return current
        current = action.choices[name]


def _command_words(argv: list[str]) -> list[str]:
    """The command ``argv`` names, before it is parsed: ``["bench", "serve"]``."""
    words: list[str] = []
    for arg in argv[:2]:
        if arg.startswith("-") or (words and words[0] not in ("bench", "check")):
            break
        words.append(arg)
    known = ("plan", "doctor", "upstream", "bench", "check", "reproduce")
    return words if words and words[0] in known else []


def _name(args: argparse.Namespace) -> str:
    """The command's words: ``plan``, ``bench serve``."""
    if args.command in ("bench", "check"):
        return f"{args.command} {getattr(args, args.command)}"
    return args.command


def _main(argv: list[str] | None) -> int:
    argv = _glue_serve_args(list(sys.argv[1:] if argv is None else argv))
    _running[:] = _command_words(argv)  # for what --help, while parsing, cannot write
    _argv[:] = argv
    parser = build_parser()
    if argv and argv[0].startswith("-") and argv[0] not in ("-h", "--help", "--version"):
        # Before argparse, which would only miss the command.
        near = [o for o in ("--help", "--version") if o.startswith(argv[0].split("=")[0])]
        if len(argv[0]) > 2 and argv[0].startswith("--") and near:  # a typo of one of them
            parser.error(f"unrecognized arguments: {argv[0]} (did you mean {near[0]}?)")
        parser.error(f"unrecognized arguments: {argv[0]} (give a command first; see --help)")
    args, extra = parser.parse_known_args(argv)
    if extra:  # said by the subcommand's parser, so the line names the subcommand
        stray = next((word for word in extra if word != "--"), extra[0])
        said = f"unrecognized arguments: {' '.join(extra)}{_stray_hint(argv, args, stray)}"
        _leaf_parser(parser, args).error(said)
    name = _name(args)
    _running[:] = name.split()
    if name in HEAVY:
        # vLLM's and torch's start-up warnings would drown the answer (VLLM_LOGGING_LEVEL,
        # when set, wins for vLLM's).
        from .. import settings

        bad = settings.logging_level_problem()  # as vLLM reads it
        if bad and args.command != "doctor":  # doctor reports it as a failed check
            print(f"{PROG} {name}: error: {bad}", file=sys.stderr)
            return 2
        level = "ERROR" if bad else os.environ.get("VLLM_LOGGING_LEVEL", "ERROR").upper()
        logging.getLogger("vllm").setLevel(level)
        logging.getLogger("torch").setLevel(logging.ERROR)
        # vLLM's import logs torch deprecations that would drown the answer.
        os.environ.setdefault("TORCH_LOGS", "-all")
        if missing := _missing_runtime():
            print(f"{PROG} {name}: error: {missing}", file=sys.stderr)
            return 2
    if args.command == "plan":
        return _plan(args)
    if args.command == "doctor":
        return _doctor(args)
    if args.command == "upstream":
        from .upstream import main as upstream

        return upstream(args.directory, args.check, args.stage)
    if name == "bench serve":
        return _bench_serve(args)
    if name == "bench kernel":
        return _bench_kernel(args)
    if name == "check passkey":
        from .validation.passkey import main as check_passkey

        return check_passkey(args)
    if name == "check accuracy":
        if args.json and (problem := choices.unwritable(args.json)):
            said = choices.said_of(f"--json {args.json}", problem)
            print(f"{PROG} check accuracy: error: {said}", file=sys.stderr)
            return 2
        if problem := choices.accuracy_memory_problem(args.heads, args.contexts):
            print(f"{PROG} check accuracy: error: {problem}", file=sys.stderr)
            return 2
        if problem := _settings_problem() or _vllm_problem():
            print(f"{PROG} check accuracy: error: {problem}", file=sys.stderr)
            return 2
        from .validation.accuracy import main as check_accuracy

        return check_accuracy(args)
    if args.command == "reproduce":
        from .reproduce.command import main as reproduce

        return reproduce(args)
    raise AssertionError(args.command)


def _serve_inputs(args: argparse.Namespace) -> list[tuple[str, str]]:
    """What bench serve reads, by option: the vLLM program, the ShareGPT file and a
    local model directory (a result file must not overwrite any of them)."""
    import shutil

    vllm = shutil.which(args.vllm) or args.vllm
    inputs = [] if os.path.isdir(vllm) else [("--vllm", vllm)]  # a directory: no program
    if args.dataset_path:
        inputs.append(("--dataset-path", args.dataset_path))
    if os.path.isdir(args.model):
        inputs.append(("--model", args.model))
    return inputs


def _inside_an_input(path: str, inputs: Sequence[tuple[str, str]]) -> str | None:
    """The input directory (option and path) that ``path`` is or is inside; None when
    none is."""
    real = os.path.join(os.path.realpath(path), "")
    for source, read in inputs:
        if os.path.isdir(read) and real.startswith(os.path.join(os.path.realpath(read), "")):
            return f"{source} {read}"
    return None


def _result_files_problem(
    json_path: str | None,
    plot_path: str | None,
    result_dir: tuple[str, re.Pattern] | None = None,
    inputs: Sequence[tuple[str, str]] = (),
) -> str | None:
    """Why ``--json`` or ``--plot`` cannot be written after the run, said before it; None
    when both can (or neither was asked for): two different files, each writable, the
    plot a .png with matplotlib there. With ``result_dir`` (bench serve's directory, and
    the names of the files it writes there), neither is that directory or one of those
    files, and a new file in it is writable once the run has made it. Neither is one of
    ``inputs`` (option, path: what the run reads) or inside an input directory."""
    from importlib.util import find_spec
    from pathlib import PurePath

    files = [(opt, path) for opt, path in (("--json", json_path), ("--plot", plot_path)) if path]
    if len(files) == 2 and _same_file(files[0][1], files[1][1]):
        return f"--json and --plot name the same file ({plot_path}); give each its own"
    for option, path in files:
        if where := _inside_an_input(path, inputs):
            return f"{option} {path} is in {where}, which the run reads; give another"
        for source, read in inputs:
            if _same_file(path, read):
                return f"{option} {path} would overwrite {source} {read}, which the run reads"
    for option, path in files:
        if option == "--plot" and (why := choices.not_png(path)):
            return f"--plot {path}: {why}"
        if result_dir is not None:
            (directory, own_files), real = result_dir, os.path.realpath(path)
            if real == (real_dir := os.path.realpath(directory)):
                return f"{option} {path} is --result-dir; give a file name"
            if os.path.dirname(real) == real_dir:
                if own_files.fullmatch(os.path.basename(real)):
                    return (
                        f"{option} {path} is a name bench serve gives its own files in "
                        "--result-dir (server-ARM-rN.log, ARM-rN-cN.json); give another"
                    )
                here = PurePath(os.getcwd())  # ".." kept, as the system reads it
                if not os.path.isdir(directory) and (
                    here / os.path.dirname(path) == here / directory
                ):
                    continue  # straight in it: the run makes it before it writes anything
        if why := choices.unwritable(path):
            return choices.said_of(f"{option} {path}", why)
    if plot_path and find_spec("matplotlib") is None:
        return f"--plot {plot_path} needs matplotlib (pip install matplotlib)"
    return None


def _same_file(a: str, b: str) -> bool:
    """Whether two result paths name one file: the same path once links and ".." are
    resolved, or two names (hard links) of one existing file."""
    if os.path.realpath(a) == os.path.realpath(b):
        return True
    try:
        return os.path.samefile(a, b)
    except OSError:  # one of them is not there yet
        return False


def _bench_kernel(args: argparse.Namespace) -> int:
    from .validation import kernel_bench as kb

    problem = _result_files_problem(args.json, args.plot)
    # --skew times one layout, --sweep walks the batch sizes of one: a second value of
    # what they hold fixed would be dropped unseen.
    if problem is None and (args.skew or args.sweep):
        fixed = ("heads", "contexts", "seqs") if args.skew else ("heads", "contexts")
        if many := [n for n in fixed if len(getattr(args, n) or ()) > 1]:
            mode = "--skew" if args.skew else "--sweep"
            problem = f"{mode} takes one --{many[0]} value, not {len(getattr(args, many[0]))}"
    if problem is None and args.skew and not kb.skew_setup(args)[3]:
        problem = (
            f"--skew times long sequences of up to {kb.SKEW_LONG[-1]} tokens among short "
            f"ones: give a --contexts value below {kb.SKEW_LONG[-1]}"
        )
    problem = problem or kb.memory_problem(args) or _settings_problem() or _vllm_problem()
    if problem:
        print(f"{PROG} bench kernel: error: {problem}", file=sys.stderr)
        return 2
    return kb.main(args)


if __name__ == "__main__":
    sys.exit(main())
