#!/usr/bin/env python
# ruff: noqa: E501 (the mutants are a table: one line each)
"""A mutation run of the runtime: each mutant is one plausible bug, made in a copy of
``src/`` that the test suite then imports (``PYTHONPATH``); a mutant the suite fails on is
killed, one it passes survived. Prints a table and the kill rate; exit 1 below
``--target`` (default 95 %).

    .venv/bin/python scripts/mutants.py                  # every mutant, two at a time
    .venv/bin/python scripts/mutants.py --only skew      # mutants whose id contains it

Each mutant runs the runtime's tests (``tests/unit`` and ``tests/e2e`` without the tool,
in-tree and benchmark modules) with ``-x``, so a killed mutant stops at its first
failure. A mutant whose text is not found exactly once is reported as stale (the code
moved): update it.
"""

from __future__ import annotations

import argparse
import os
import shutil
import subprocess
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
PACKAGE = "src/vllm_rocm_asm_decode"

#: The tests a mutant of the runtime runs against.
TESTS = ["tests/unit", "tests/e2e"]
IGNORED = [
    "tests/unit/test_cli_input.py",
    "tests/unit/test_serve_bench.py",
    "tests/unit/test_benchmarks.py",
    "tests/e2e/test_in_tree.py",
    "tests/e2e/test_plan.py",
    "tests/e2e/test_doctor.py",
    "tests/unit/test_upstream.py",
    "tests/unit/test_reproduce_flow.py",
    "tests/unit/test_reproduce_report.py",
    "tests/unit/test_plan_input.py",
    "tests/unit/test_vllm_support.py",  # installs the package: fails on any copy of src
]


@dataclass(frozen=True)
class Mutant:
    id: str
    file: str  # relative to the package
    old: str
    new: str


M = Mutant
# fmt: off
MUTANTS = [
    # core: the rule and the per-step decision
    M("core-gqa-9", "core.py", "ASM_MAX_GQA = 8", "ASM_MAX_GQA = 9"),
    M("core-head-ge", "core.py", "impl.head_size == ASM_HEAD_SIZE", "impl.head_size >= ASM_HEAD_SIZE"),
    M("core-block-any", "core.py", "block_size == ASM_BLOCK_SIZE", "block_size >= ASM_BLOCK_SIZE"),
    M("core-kv-dtype", "core.py", 'ASM_KV_DTYPES = ("fp8", "fp8_e4m3")', 'ASM_KV_DTYPES = ("fp8", "fp8_e4m3", "fp8_e5m2")'),
    M("core-scale-loose", "core.py", "- 1) < 1e-6", "- 1) < 1e-1"),
    M("core-no-window", "core.py", '(impl.sliding_window == (-1, -1), "sliding window"),', ""),
    M("core-no-alibi", "core.py", '(impl.alibi_slopes is None, "ALiBi"),', ""),
    M("core-no-softcap", "core.py", '(not impl.logits_soft_cap, "logits soft cap"),', ""),
    M("core-no-sinks", "core.py", '(impl.sinks is None, "attention sinks"),', ""),
    M("core-no-dense", "core.py", '(has_native_kv_cache_layout(key_cache, value_cache), "KV pages not dense"),', ""),
    M("core-no-arch", "core.py", '(mi3xx, "a GPU other than gfx942/gfx950"),', ""),
    M("core-fp32-query", "core.py", "dtype in (torch.bfloat16, torch.float16)", "dtype in (torch.bfloat16, torch.float16, torch.float32)"),
    M("core-cut-ge", "core.py", "common.num_actual_tokens * num_heads > cut", "common.num_actual_tokens * num_heads >= cut"),
    M("core-cut-kv", "core.py", "common.max_query_len == 1\n", "common.max_query_len <= 2\n"),
    M("core-no-pure", "core.py", "and common.num_reqs == common.num_actual_tokens\n", ""),
    M("core-precision-1", "core.py", "ASM_PRECISION = 2", "ASM_PRECISION = 1"),
    M("core-kv-swap", "core.py", "K_QScale=scales[0],\n        V_QScale=scales[1],", "K_QScale=scales[1],\n        V_QScale=scales[0],"),
    M("core-stride", "core.py", "block_tables_stride0=block_table.stride(0)", "block_tables_stride0=block_table.shape[1]"),
    M("core-heads-per-cu", "core.py", "ASM_HEADS_PER_CU = 2", "ASM_HEADS_PER_CU = 1"),
    # skew
    M("skew-off", "skew.py", "return skew > 0 and longest", "return skew < 0 and longest"),
    M("skew-kv-heads", "skew.py", "total * num_kv_heads +", "total +"),
    M("skew-all-reqs", "skew.py", "host = lens.numpy()[:num_reqs]", "host = lens.numpy()"),
    M("skew-ratio", "skew.py", "ASM_SKEW_RATIO = 67", "ASM_SKEW_RATIO = 6"),
    # mixed split
    M("mixed-cut-lt", "mixed.py", "num_decodes * num_heads <= cut", "num_decodes * num_heads < cut"),
    M("mixed-align", "mixed.py", "start = num_decodes - num_decodes % 4", "start = num_decodes"),
    M("mixed-no-off", "mixed.py", "    if asm_split_off(vllm_config) is not None:\n        return None\n", ""),
    M("mixed-decode-lens", "mixed.py", "decode_seq_lens=common.seq_lens[:num_decodes]", "decode_seq_lens=common.seq_lens[: num_decodes + 1]"),
    # backend: forward's guard and build's reload path
    M("fwd-no-k-check", "backend.py", "            or layer._k_scale_float != binding.k_scale\n", ""),
    M("fwd-no-v-check", "backend.py", "            or layer._v_scale_float != binding.v_scale\n", ""),
    M("fwd-no-cache-check", "backend.py", "            kv_cache is not binding.kv_cache\n            or ", "            "),
    M("fwd-no-dtype", "backend.py", "tensors_ok=query.dtype == binding.query_dtype\n            and ", "tensors_ok="),
    M("fwd-no-stride", "backend.py", "            and query.stride(-2) == self.head_size\n", ""),
    M("fwd-no-contig", "backend.py", "            and output.is_contiguous(),", ","),
    M("build-no-reload", "backend.py", "        elif bindings.tables is not None and bindings.tables.changed():", "        elif False:"),
    M("build-no-skew", "backend.py", "        ) and not asm_decode_skewed(\n            common_attn_metadata,\n            common_attn_metadata.num_reqs,", "        ) and not 0 and asm_decode_skewed(\n            common_attn_metadata,\n            common_attn_metadata.num_reqs,"),
    # scale tables
    M("tables-fill-one", "asm_scale_tables.py", "        self.chunk.fill_(scale)\n", "        self.chunk.fill_(1.0)\n"),
    M("tables-changed-k-only", "asm_scale_tables.py", "        return list(map(_K_FLOAT, self.owners)) != self._k or (\n            list(map(_V_FLOAT, self.owners)) != self._v\n        )", "        return list(map(_K_FLOAT, self.owners)) != self._k"),
    M("tables-reload-k-only", "asm_scale_tables.py", "            if (k, v) != (self._k[i], self._v[i]):", "            if k != self._k[i]:"),
    M("tables-reload-v-k", "asm_scale_tables.py", "                self.owned[i][1].fill(v)", "                self.owned[i][1].fill(k)"),
    M("tables-no-readback", "asm_scale_tables.py", "if torch.stack(torch.aminmax(table)).tolist() != [stored, stored]:", "if False:"),
    M("tables-chunk-min", "asm_scale_tables.py", "least = max(MIN_CHUNK, granularity,", "least = max(granularity,"),
    M("tables-chunk-pow2", "asm_scale_tables.py", "chunk = 1 << (least - 1).bit_length()", "chunk = least"),
    M("tables-share-scale", "asm_scale_tables.py", "key = (shape, side, scale, aliased)", "key = (shape, side, 1.0, aliased)"),
    M("tables-k-v-shared", "asm_scale_tables.py", "key = (shape, side, scale, aliased)", "key = (shape, 0, scale, aliased)"),
    M("budget-no-free", "scale_tables.py", "ok = left is None or cost == 0 or cost <= left", "ok = True"),
    M("budget-no-subtract", "scale_tables.py", "                left -= cost\n", "                pass\n"),
    M("budget-fp16", "scale_tables.py", "num_blocks * num_kv_heads * block_size * 4  # fp32", "num_blocks * num_kv_heads * block_size * 2  # fp32"),
    # AITER's version and the page span
    M("aiter-fix-gt", "aiter_version.py", "return Version(version) >= Version(FIRST_FIXED)", "return Version(version) > Version(FIRST_FIXED)"),
    M("aiter-old-trusted", "aiter_version.py", "if num_blocks <= limit or self.reads_high_block_ids:", "if True:"),
    M("aiter-limit-ge", "aiter_version.py", "if num_blocks <= limit or", "if num_blocks <= limit + 1 or"),
    M("span-reaches-gt", "page_span.py", "return span(key_cache) >= SPAN_LIMIT", "return span(key_cache) > 2 * SPAN_LIMIT"),
    M("span-always-same", "page_span.py", "    if same:\n        return None\n", "    return None\n"),
    M("span-no-restore", "page_span.py", "        k_bytes[touched] = saved[0]\n", "        pass\n"),
    # eligibility guards
    M("guard-fp16-trusted", "eligibility.py", "    if model_config.dtype == torch.float16 and not aiter.trusted:\n        reasons.append(FP16_UNPROVEN)\n    return reasons", "    return reasons"),
    M("guard-no-file", "eligibility.py", "elif (missing := kernels.missing_file(row)) is not None:", "elif (missing := kernels.missing_file(row)) is not None and False:"),
]
# fmt: on


def apply(mutant: Mutant, dest: Path) -> str | None:
    """The mutant written into ``dest`` (a copy of ``src``); a reason when it is stale."""
    path = dest / "vllm_rocm_asm_decode" / mutant.file
    text = path.read_text()
    if text.count(mutant.old) != 1:
        return f"stale: its text occurs {text.count(mutant.old)} times in {mutant.file}"
    path.write_text(text.replace(mutant.old, mutant.new))
    return None


def run(mutant: Mutant, python: str, timeout: float) -> tuple[str, float, str]:
    start = time.perf_counter()
    with tempfile.TemporaryDirectory(prefix=f"mutant-{mutant.id}-") as tmp:
        src = Path(tmp) / "src"
        shutil.copytree(REPO / "src", src, ignore=shutil.ignore_patterns("__pycache__"))
        stale = apply(mutant, src)
        if stale:
            return "stale", 0.0, stale
        env = dict(os.environ, PYTHONPATH=str(src), ASM_DECODE_TEST_GFX="gfx950")
        env.pop("PYTHONDONTWRITEBYTECODE", None)
        # Files, not folders: a folder would start the background checks of the modules
        # left out too (tests/background.py starts those of every module under a path).
        files = sorted(
            str(p.relative_to(REPO))
            for folder in TESTS
            for p in (REPO / folder).glob("test_*.py")
            if str(p.relative_to(REPO)) not in IGNORED
        )
        cmd = [python, "-m", "pytest", "-p", "no:cacheprovider", "-x", "-q", *files]
        try:
            done = subprocess.run(
                cmd, cwd=REPO, env=env, capture_output=True, text=True, timeout=timeout
            )
        except subprocess.TimeoutExpired:
            return "timeout", time.perf_counter() - start, ""
    seconds = time.perf_counter() - start
    if done.returncode == 0:
        return "SURVIVED", seconds, ""
    failed = [line for line in done.stdout.splitlines() if line.startswith("FAILED")]
    return "killed", seconds, (failed[0][7:] if failed else f"exit {done.returncode}")


class _Parser(argparse.ArgumentParser):
    def error(self, message: str):  # one line, as every command of this project
        self.exit(2, f"mutants.py: error: {message}\n")


def _at_least_one(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a whole number") from None
    if value < 1:
        raise argparse.ArgumentTypeError(f"{value}: give 1 or more")
    return value


def _seconds(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a number of seconds") from None
    if not 0 < value <= 86400:
        raise argparse.ArgumentTypeError(f"{text}: give more than 0 and at most 86400 seconds")
    return value


def _percent(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a kill rate in %") from None
    if not 0 <= value <= 100:  # nan and inf too
        raise argparse.ArgumentTypeError(f"{text}: give a kill rate from 0 to 100 (%)")
    return value


def _ids(text: str) -> list[str]:
    """``--only``: parts of mutant ids, comma-separated; an empty one would match every id."""
    parts = text.split(",")
    if "" in parts:
        raise argparse.ArgumentTypeError(
            f"{text!r}: give parts of mutant ids, comma-separated, none empty "
            "(leave --only out to run every mutant)"
        )
    return parts


def main() -> int:
    parser = _Parser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument(
        "--only",
        type=_ids,
        help="run the mutants whose id contains this (or one of a,b,...); default: every one",
    )
    parser.add_argument("--jobs", type=_at_least_one, default=2, help="mutants at a time")
    parser.add_argument(
        "--timeout",
        type=_seconds,
        default=900,
        help="seconds per mutant; one that runs longer is reported as timed out, not killed",
    )
    parser.add_argument(
        "--target", type=_percent, default=95.0, help="kill rate to reach, %% (0 to 100)"
    )
    args = parser.parse_args()
    unmatched = [p for p in args.only or () if not any(p in m.id for m in MUTANTS)]
    if unmatched:  # a misspelt part would quietly run fewer mutants than asked
        print(f"mutants.py: error: no mutant id contains {','.join(unmatched)!r}", file=sys.stderr)
        return 2
    chosen = [m for m in MUTANTS if args.only is None or any(p in m.id for p in args.only)]
    with ThreadPoolExecutor(args.jobs) as pool:
        results = list(pool.map(lambda m: (m, *run(m, sys.executable, args.timeout)), chosen))
    print("| mutant | file | verdict | seconds | first failing test |")
    print("|---|---|---|---|---|")
    for m, verdict, seconds, detail in results:
        print(f"| {m.id} | {m.file} | {verdict} | {seconds:.0f} | {detail} |")
    # A mutant that outlasts --timeout is not counted as killed: the suite did not fail
    # on it, and a --timeout too short would make every mutant look killed.
    judged = [r for r in results if r[1] in ("killed", "SURVIVED", "timeout")]
    killed = sum(r[1] == "killed" for r in judged)
    timed_out = sum(r[1] == "timeout" for r in judged)
    stale = len(results) - len(judged)
    rate = 100 * killed / len(judged) if judged else 0.0
    print(
        f"\n{killed}/{len(judged)} killed ({rate:.1f} %), {timed_out} timed out "
        f"(not counted as killed; --timeout {args.timeout:g} s), {stale} stale"
    )
    return 0 if rate >= args.target and not stale else 1


if __name__ == "__main__":
    sys.exit(main())
