"""The original change's measurements, as data (``data/original_measurements.json``, with
their source): the kernel-latency table, the serving A/B, GSM8K, passkey retrieval and
the error against fp32, all on one MI355X. The time model of the contract model is fitted
to the kernel table; reports set this project's figures beside them."""

from __future__ import annotations

import functools
import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

PATH = Path(__file__).resolve().parent / "data" / "original_measurements.json"


@functools.cache
def load() -> dict[str, Any]:
    """The whole record (read once)."""
    return json.loads(PATH.read_text(encoding="utf-8"))


@dataclass(frozen=True)
class KernelTiming:
    """One row of the kernel table: every sequence at ``context`` tokens."""

    heads: int
    kv_heads: int
    context: int
    seqs: int
    hip_us: float
    asm_us: float

    @property
    def contexts(self) -> list[int]:
        return [self.context] * self.seqs


def kernel_timings(below_cut: bool = True) -> list[KernelTiming]:
    """The kernel table's rows, and (``below_cut``) the asm-forced-below-the-cut ones."""
    kernel = load()["kernel"]
    rows = [KernelTiming(**row) for row in kernel["rows"]]
    if below_cut:
        low = kernel["below_cut"]
        rows += [
            KernelTiming(low["heads"], low["kv_heads"], low["context"], **row)
            for row in low["rows"]
        ]
    return rows
