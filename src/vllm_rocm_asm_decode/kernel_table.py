"""Which ``pa_fwd_asm`` kernels exist: AITER's kernel table and the launcher's lookup
rule.

AITER ships one table per GPU architecture, ``hsa/<gfx>/pa/pa_asm.csv``, installed as
``$AITER_ASM_DIR/<gfx>/pa/pa_asm.csv``. The C++ launcher compiles a copy of it in and
picks a kernel with the rule in :func:`KernelTable.find`; the CSV is the readable proxy
for that copy. A request with no matching row is a hard error in the launcher, so the
backend asks this module before it routes a layer to the asm kernel.
"""

from __future__ import annotations

import csv
import os
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path

import torch

#: The precision mode this project runs: AITER's ultra-precision ("uhp") kernels.
ULTRA_PRECISION = 2

#: Archs whose shipped tables have the fp8-KV, 16-token-block, ``Hp=2``, ``ps=0``
#: decode kernel (for GQA 8). Used only when the installed table cannot be read.
_FALLBACK_ARCHS = ("gfx942", "gfx950")
_FALLBACK_GQA = 8


def normalize_arch(gcn_arch: str) -> str:
    """``gfx942:sramecc+:xnack-`` -> ``gfx942``."""
    return gcn_arch.split(":", 1)[0].strip()


def dtype_name(dtype: torch.dtype | str) -> str | None:
    """The launcher's name for a tensor dtype (its ``qType`` / ``kvType`` columns)."""
    if dtype == torch.float16:
        return "fp16"
    if dtype == torch.bfloat16:
        return "bf16"
    if dtype in (torch.int8, torch.uint8):
        return "int8"
    if dtype in (torch.float8_e4m3fn, torch.float8_e4m3fnuz):
        return "fp8"
    return None


@dataclass(frozen=True)
class KernelRow:
    """One row of ``pa_asm.csv`` (the columns the launcher matches on)."""

    q_type: str
    kv_type: str
    gqa: int
    mtp: int
    msk: int
    hp: int
    block_size: int
    co_name: str
    ps: int = 0
    q_tile: int = 0
    quant_type: int = 0


@dataclass(frozen=True)
class KernelTable:
    """The ``pa_fwd_asm`` kernels of one architecture, and where that knowledge came
    from."""

    arch: str
    rows: tuple[KernelRow, ...]
    source: str
    #: The directory the rows' ``.co`` files load from; None for the built-in fallback.
    kernel_dir: str | None = None
    #: ``co_name`` of every row whose file is not in ``kernel_dir`` (checked once, at
    #: load).
    missing_files: frozenset[str] = frozenset()

    def missing_file(self, row: KernelRow) -> str | None:
        """The path of ``row``'s kernel file when it is not installed; None when it is
        (or when the table is the built-in fallback, which names no files)."""
        if self.kernel_dir is None or row.co_name not in self.missing_files:
            return None
        return str(Path(self.kernel_dir) / row.co_name)

    def find(
        self,
        *,
        q_type: str,
        kv_type: str,
        gqa: int,
        block_size: int,
        high_precision: int,
        mtp: int = 0,
        msk: int = 0,
    ) -> KernelRow | None:
        """The row ``pa_fwd_asm`` would launch, or None where the launcher raises.

        The launcher's rule: the GQA ratio is tried exactly, then rounded up to a
        multiple of 8; ``high_precision=1`` takes the first row that matches in any
        precision, 0 and 2 only rows of exactly that precision; ``ps``, ``qTile``
        and ``quant_type`` must be 0 (persistent-scheduling rows are never picked).
        """
        for gqa_try in (gqa, (gqa + 7) // 8 * 8):
            for row in self.rows:
                if (
                    row.q_type == q_type
                    and row.kv_type == kv_type
                    and row.gqa == gqa_try
                    and row.mtp == mtp
                    and row.msk == msk
                    and (row.hp == high_precision or high_precision == 1)
                    and row.block_size == block_size
                    and row.ps == 0
                    and row.q_tile == 0
                    and row.quant_type == 0
                ):
                    return row
        return None


def parse_table(lines: Iterable[str]) -> tuple[KernelRow, ...]:
    """Parse AITER's ``pa_asm.csv`` (header line first). Raises ValueError on a bad
    row."""
    reader = csv.DictReader(lines)
    rows = []
    for record in reader:
        try:
            rows.append(
                KernelRow(
                    q_type=record["qType"].strip(),
                    kv_type=record["kvType"].strip(),
                    gqa=int(record["Gqa"]),
                    mtp=int(record["Mtp"]),
                    msk=int(record["Msk"]),
                    hp=int(record["Hp"]),
                    block_size=int(record["blkSz"]),
                    co_name=record["co_name"].strip(),
                    ps=int(record.get("ps") or 0),
                    q_tile=int(record.get("qTile") or 0),
                    quant_type=int(record.get("quant_type") or 0),
                )
            )
        except (KeyError, TypeError, ValueError) as exc:
            raise ValueError(f"bad pa_asm.csv row {record!r}: {exc}") from exc
    return tuple(rows)


def table_path(asm_dir: str | os.PathLike[str], arch: str) -> Path:
    return Path(asm_dir) / normalize_arch(arch) / "pa" / "pa_asm.csv"


def fallback_table(arch: str) -> KernelTable:
    """What the shipped gfx942/gfx950 tables hold for this project's kernel; empty
    elsewhere."""
    arch = normalize_arch(arch)
    rows: tuple[KernelRow, ...] = ()
    if arch in _FALLBACK_ARCHS:
        rows = tuple(
            KernelRow(q, "fp8", _FALLBACK_GQA, 0, 0, ULTRA_PRECISION, 16, "built-in")
            for q in ("bf16", "fp16")
        )
    return KernelTable(
        arch=arch, rows=rows, source="built-in (GQA <= 8 on gfx942/gfx950)"
    )


def load_table(
    asm_dir: str | os.PathLike[str] | None, arch: str
) -> tuple[KernelTable, str | None]:
    """The table for ``arch`` under ``asm_dir``, or the built-in fallback and why it was
    used.

    The launcher loads a row's kernel from ``co_name`` in the table's directory; rows
    whose file is absent (an AITER built for other GPUs) are recorded in
    ``missing_files``.
    """
    arch = normalize_arch(arch)
    if not arch:
        return fallback_table(arch), "the GPU architecture is unknown"
    if not asm_dir:
        return fallback_table(arch), "AITER_ASM_DIR is not set"
    path = table_path(asm_dir, arch)
    try:
        with path.open(newline="") as f:
            rows = parse_table(f)
    except (OSError, ValueError) as exc:
        return fallback_table(arch), f"cannot read {path}: {exc}"
    kernel_dir = path.parent
    missing = frozenset(
        r.co_name for r in rows if not (kernel_dir / r.co_name).is_file()
    )
    table = KernelTable(
        arch=arch,
        rows=rows,
        source=str(path),
        kernel_dir=str(kernel_dir),
        missing_files=missing,
    )
    return table, None
