"""``vllm-rocm-asm-decode``: the command line.

``plan``  what the asm decode will do for a model on a GPU (runs anywhere).
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import sys

PROG = "vllm-rocm-asm-decode"


class _Parser(argparse.ArgumentParser):
    """Usage errors as one line on stderr, exit status 2."""

    def error(self, message: str) -> None:  # type: ignore[override]
        self.exit(2, f"{self.prog}: error: {message}\n")


def build_parser() -> argparse.ArgumentParser:
    from .plan import DEFAULT_GPU, DEFAULT_PRESET, GPUS, presets

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
        default=DEFAULT_PRESET,
        metavar="PRESET|DIR",
        help=f"a preset ({', '.join(presets())}; default {DEFAULT_PRESET}) or a local "
        "directory with a Hugging Face config.json (read offline by vLLM's ModelConfig)",
    )
    plan.add_argument(
        "--gpu",
        metavar="|".join(GPUS),
        help=f"the GPU (default: the live GPU on ROCm, else {DEFAULT_GPU})",
    )
    plan.add_argument(
        "--tensor-parallel-size",
        "-tp",
        type=int,
        default=1,
        metavar="N",
        help="tensor-parallel ranks; heads are divided as vLLM divides them (default 1)",
    )
    plan.add_argument(
        "--kv-cache-dtype",
        default="fp8",
        metavar="|".join(KV_CACHE_DTYPES),
        help="vLLM's --kv-cache-dtype (default fp8)",
    )
    plan.add_argument(
        "--block-size", type=int, default=16, metavar="N", help="KV cache block size (default 16)"
    )
    plan.add_argument(
        "--dtype",
        default="bfloat16",
        metavar="|".join(DTYPES),
        help="model (query) dtype (default bfloat16)",
    )
    plan.add_argument(
        "--max-model-len",
        type=int,
        default=None,
        metavar="N",
        help="vLLM's --max-model-len (default: the model's context length)",
    )
    plan.add_argument("--json", action="store_true", help="print one JSON object")
    return parser


KV_CACHE_DTYPES = ("fp8", "fp8_e4m3", "fp8_e5m2", "auto", "bfloat16", "float16")
DTYPES = ("bfloat16", "float16", "float32", "auto")


def _plan(args: argparse.Namespace) -> int:
    from .plan import PlanError, make_plan, render

    try:
        if args.kv_cache_dtype not in KV_CACHE_DTYPES:
            raise PlanError(
                f"--kv-cache-dtype {args.kv_cache_dtype!r} is not one of "
                + ", ".join(KV_CACHE_DTYPES)
            )
        if args.dtype not in DTYPES:
            raise PlanError(f"--dtype {args.dtype!r} is not one of " + ", ".join(DTYPES))
        if args.block_size < 1 or (args.max_model_len is not None and args.max_model_len < 1):
            raise PlanError("--block-size and --max-model-len must be positive")
        plan = make_plan(
            model=args.model,
            gpu=args.gpu,
            tensor_parallel_size=args.tensor_parallel_size,
            kv_cache_dtype=args.kv_cache_dtype,
            block_size=args.block_size,
            dtype=args.dtype,
            max_model_len=args.max_model_len,
        )
    except PlanError as exc:
        print(f"{PROG} plan: error: {exc}", file=sys.stderr)
        return 2
    print(json.dumps(plan.to_json(), indent=2) if args.json else render(plan))
    return 0


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    # vLLM's and torch's start-up warnings would drown the answer (VLLM_LOGGING_LEVEL,
    # when set, wins for vLLM's).
    level = os.environ.get("VLLM_LOGGING_LEVEL", "ERROR")
    logging.getLogger("vllm").setLevel(level)
    logging.getLogger("torch").setLevel(logging.ERROR)
    if args.command == "plan":
        return _plan(args)
    raise AssertionError(args.command)


if __name__ == "__main__":
    sys.exit(main())
