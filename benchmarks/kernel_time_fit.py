"""The time model of AITER's asm decode and of the HIP decode, fitted to the original
change's kernel table (MI355X, ``tools/data/original_measurements.json``): the fit, its
residual on every row, the skew clause it gives (``skew.ASM_SKEW_RATIO`` and
``skew.ASM_SKEW_HEAD_TOKENS``), and what it predicts for skewed batches.

    python benchmarks/kernel_time_fit.py

Arithmetic only (no GPU, no vLLM): the model is the contract model's
(``tools.contract_model.KernelTimeModel``), and the figures it is fitted to were
measured on one MI355X by the original change's author, not here. ``bench kernel`` and
``bench kernel --skew`` measure the same on a GPU.
"""

from __future__ import annotations

import argparse
import ast
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "src"))

from vllm_rocm_asm_decode.tools.contract_model import original_time_model
from vllm_rocm_asm_decode.tools.original import kernel_timings

SRC = Path(__file__).resolve().parents[1] / "src"

#: Skewed batches to predict: one long request among others of 1K, 40/8 heads.
SKEWED = ((127, 8192), (127, 32768), (127, 131072), (255, 32768), (31, 32768))


def core_constants() -> dict[str, int]:
    """The skew clause's constants as ``skew.py`` states them (read, not imported: it
    imports vLLM)."""
    tree = ast.parse((SRC / "vllm_rocm_asm_decode" / "skew.py").read_text())
    return {
        node.targets[0].id: ast.literal_eval(node.value)
        for node in tree.body
        if isinstance(node, ast.Assign)
        and isinstance(node.targets[0], ast.Name)
        and node.targets[0].id.startswith("ASM_SKEW")
    }


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--kv-heads", type=int, default=8, help="for the skewed batches")
    args = parser.parse_args()
    model = original_time_model()
    core = core_constants()
    ratio, slack = core["ASM_SKEW_RATIO"], core["ASM_SKEW_HEAD_TOKENS"]
    print("fit, µs: asm = max(wg0 + wg_token x longest, asm_ht x head-tokens); "
          "HIP = hip0 + hip_ht x head-tokens (head-tokens: contexts x KV heads)")  # fmt: skip
    print(
        f"  wg0 {model.wg0_us:.2f}  wg_token {model.wg_token_us * 1e3:.3f} ns  "
        f"asm_ht {model.asm_head_token_us * 1e6:.1f} ps  hip0 {model.hip0_us:.2f}  "
        f"hip_ht {model.hip_head_token_us * 1e6:.1f} ps"
    )
    print()
    print("| heads | ctx | seqs | HIP | model | resid | asm | model | resid | asm/HIP | model |")
    print("|---|---|---|---|---|---|---|---|---|---|---|")
    for t in kernel_timings():
        hip, asm = model.hip_us(t.contexts, t.kv_heads), model.asm_us(t.contexts, t.kv_heads)
        print(
            f"| {t.heads}/{t.kv_heads} | {t.context} | {t.seqs} | {t.hip_us:.2f} | {hip:.2f} | "
            f"{100 * (hip / t.hip_us - 1):+.0f} % | {t.asm_us:.2f} | {asm:.2f} | "
            f"{100 * (asm / t.asm_us - 1):+.0f} % | {t.asm_us / t.hip_us:.2f} | {asm / hip:.2f} |"
        )
    print()
    print(
        f"skew clause: asm is the slower kernel once {model.skew_ratio:.1f} x the longest "
        f"context passes the head-tokens + {model.skew_head_tokens:.0f}; the core has "
        f"{ratio} and {slack}"
    )
    print()
    print(f"predicted, {args.kv_heads} KV heads, one long request among short ones of 1024:")
    print("| short | long | HIP µs | asm µs | asm/HIP | the clause keeps |")
    print("|---|---|---|---|---|---|")
    for count, long in SKEWED:
        contexts = [long] + [1024] * count
        hip, asm = model.hip_us(contexts, args.kv_heads), model.asm_us(contexts, args.kv_heads)
        skewed = long * ratio > sum(contexts) * args.kv_heads + slack
        print(
            f"| {count} | {long} | {hip:.1f} | {asm:.1f} | {asm / hip:.2f} | "
            f"{'HIP' if skewed else 'asm'} |"
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
