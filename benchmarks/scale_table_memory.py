"""Device memory of the asm decode's per-slot scale tables: aliased (one chunk mapped over
the table) against plain allocations, measured with ``mem_get_info`` on a GPU.

    python benchmarks/scale_table_memory.py            # 40 layers, 250k blocks, 8 KV heads

Needs a GPU (CUDA or ROCm) and torch only; prints a table (medians of ``--repeats``
rounds of bind-time mapping) and whether a CUDA graph captured before a refill reads the
new scale. Speed of the kernel is not measured here.

    python benchmarks/scale_table_memory.py --standin --blocks 4096   # no GPU

``--standin`` runs on the CPU through the HIP virtual-memory stand-in of the tests
(``tests/hip_standin.py``: ROCm's checks, host memory for device memory): the memory
column is then the stand-in's physical bytes (aliased) or the tensors' storage
(allocated), the times are the CPU's, and no graph is captured.
"""

from __future__ import annotations

import argparse
import gc
import statistics
import sys
from pathlib import Path

import pytest
import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "src"))

from vllm_rocm_asm_decode.asm_scale_tables import make_tables

#: The HIP stand-in under ``--standin`` (its physical bytes stand for device memory).
STANDIN: list = []


def used(device: torch.device) -> int:
    if device.type == "cpu":
        return STANDIN[0].physical_bytes()
    torch.accelerator.synchronize()
    free, total = torch.cuda.mem_get_info(device)
    return total - free


def release_cache(device: torch.device) -> None:
    gc.collect()
    if device.type != "cpu":
        torch.cuda.empty_cache()  # hand torch's cached blocks back


def measure(device, shape, scales, aliased: bool) -> dict:
    release_cache(device)
    before = used(device)
    tables, seconds = make_tables(device, shape, scales, aliased)
    taken = used(device) - before
    if device.type == "cpu" and not aliased:  # host tensors: their storage
        taken = sum(t.tensor.untyped_storage().nbytes() for t in tables)
    right = all(
        float(t.tensor[0, 0, 0]) == s and float(t.tensor[-1, -1, -1]) == s
        for t, s in zip(tables, scales, strict=True)
    )
    row = {
        "kind": "aliased" if all(t.aliased for t in tables) else "allocated",
        "tables": len(tables),
        "chunk_mib": tables[0].nbytes / 2**20,
        "mappings": tables[0].mappings,
        "device_mib": taken / 2**20,
        "table_mib": tables[0].tensor.numel() * 4 / 2**20,
        "ms": seconds * 1e3,
        "reads_right": right,
    }
    del tables
    release_cache(device)  # so that the next round allocates
    row["left_after_release_mib"] = (used(device) - before) / 2**20
    return row


def refill_seen_by_graph(device, shape) -> bool:
    (table,), _ = make_tables(device, shape, [0.5])
    picks = torch.tensor([0, shape[0] - 1], device=device)
    out = torch.zeros(2, *shape[1:], device=device)
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):
        torch.index_select(table.tensor, 0, picks, out=out)
    torch.cuda.current_stream().wait_stream(stream)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        torch.index_select(table.tensor, 0, picks, out=out)
    table.fill(3.0)
    graph.replay()
    return bool(torch.all(out == 3.0))


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--layers", type=int, default=40)
    parser.add_argument("--blocks", type=int, default=250_000)
    parser.add_argument("--kv-heads", type=int, default=8)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument(
        "--standin", action="store_true", help="on the CPU, through the tests' HIP stand-in"
    )
    args = parser.parse_args()
    if args.standin:
        device, name = torch.device("cpu"), "CPU, HIP stand-in (tests/hip_standin.py)"
        sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))
        import hip_standin

        STANDIN.append(hip_standin.runtime_vm(pytest.MonkeyPatch()))
    elif not torch.cuda.is_available():
        print("scale_table_memory: needs a GPU (or --standin)", file=sys.stderr)
        return 2
    else:
        device = torch.device("cuda", 0)
        torch.ones(1, device=device)
        name = torch.cuda.get_device_name(device)
    shape = (args.blocks, args.kv_heads, 16)
    scales = [0.5 + i / 256 for i in range(2 * args.layers)]  # K and V, every layer its own
    rows = []
    for aliased in (True, False):
        runs = [measure(device, shape, scales, aliased) for _ in range(args.repeats)]
        row = dict(runs[-1])
        row["ms"] = statistics.median(r["ms"] for r in runs)
        row["device_mib"] = statistics.median(r["device_mib"] for r in runs)
        rows.append(row)
    print(f"{args.layers} layers, K and V tables of {list(shape)} fp32, distinct scales, "
          f"{name}")  # fmt: skip
    print("| kind | tables | table MiB | chunk MiB | mappings | device MiB | bound ms | "
          "reads right | left after release MiB |")  # fmt: skip
    print("|---|---|---|---|---|---|---|---|---|")
    for r in rows:
        print(
            f"| {r['kind']} | {r['tables']} | {r['table_mib']:.1f} | {r['chunk_mib']:.1f} | "
            f"{r['mappings']} | {r['device_mib']:.1f} | {r['ms']:.1f} | {r['reads_right']} | "
            f"{r['left_after_release_mib']:.1f} |"
        )
    seen = "not run (no graphs on the CPU)" if args.standin else refill_seen_by_graph(device, shape)
    print(f"refill seen by a graph captured before it: {seen}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
