"""Kernel availability follows the launcher's lookup rule over AITER's table."""

from __future__ import annotations

import io
from pathlib import Path

import pytest

from vllm_rocm_asm_decode.kernel_table import (
    KernelTable,
    fallback_table,
    load_table,
    parse_table,
)

HEADER = "qType,kvType,Gqa,Mtp,Msk,Hp,blkSz,knl_name,co_name,ps,qTile,quant_type\n"
STANDIN_HSA = Path(__file__).resolve().parents[1] / "standins" / "kernels" / "aiter" / "hsa"
#: AITER's shipped tables (tests/data/aiter-hsa/SOURCE.md says from which commit).
SHIPPED = Path(__file__).resolve().parents[1] / "data" / "aiter-hsa"


def table(*rows: str, arch: str = "gfx950") -> KernelTable:
    return KernelTable(
        arch=arch, rows=parse_table(io.StringIO(HEADER + "\n".join(rows))), source="test"
    )


def uhp(t: KernelTable, gqa: int, q: str = "bf16", block_size: int = 16):
    return t.find(q_type=q, kv_type="fp8", gqa=gqa, block_size=block_size, high_precision=2)


def test_gqa_is_tried_exactly_then_rounded_up_to_a_multiple_of_8():
    t = table("bf16,fp8,8,0,0,2,16,k,gqa8.co,0,0,0", "bf16,fp8,5,0,0,2,16,k,gqa5.co,0,0,0")
    assert uhp(t, 5).co_name == "gqa5.co"  # exact match first
    assert uhp(t, 3).co_name == "gqa8.co"  # 3 -> 8
    assert uhp(t, 8).co_name == "gqa8.co"
    assert uhp(t, 9) is None  # 9 -> 16: no row
    assert uhp(t, 16) is None


def test_precision_two_matches_only_ultra_precision_rows():
    t = table("bf16,fp8,8,0,0,0,16,k,hp0.co,0,0,0", "bf16,fp8,8,0,0,1,16,k,hp1.co,0,0,0")
    assert uhp(t, 8) is None
    assert (
        t.find(q_type="bf16", kv_type="fp8", gqa=8, block_size=16, high_precision=1).co_name
        == "hp0.co"
    )  # 1 takes the first match
    assert (
        t.find(q_type="bf16", kv_type="fp8", gqa=8, block_size=16, high_precision=0).co_name
        == "hp0.co"
    )


@pytest.mark.parametrize("column", ["ps", "qTile", "quant_type"])
def test_rows_with_nonzero_ps_qtile_or_quant_type_are_never_picked(column):
    values = {"ps": "1,0,0", "qTile": "0,16,0", "quant_type": "0,0,2"}[column]
    t = table(f"bf16,fp8,16,0,0,2,16,k,trap.co,{values}")
    assert uhp(t, 16) is None


def test_block_size_q_type_mtp_and_mask_must_match():
    t = table("fp16,fp8,8,0,0,2,16,k,a.co,0,0,0", "bf16,fp8,8,13,1,2,16,k,mtp.co,0,0,0")
    assert uhp(t, 8, q="bf16") is None  # only the MTP row is bf16
    assert uhp(t, 8, q="fp16").co_name == "a.co"
    assert uhp(t, 8, q="fp16", block_size=32) is None


@pytest.mark.parametrize("arch", ["gfx942", "gfx950"])
def test_standin_tables_give_the_shipped_verdict(arch):
    t, note = load_table(STANDIN_HSA, arch)
    assert note is None
    for q in ("bf16", "fp16"):
        assert all(uhp(t, g, q) is not None for g in range(1, 9))
        assert all(uhp(t, g, q) is None for g in range(9, 17))


@pytest.mark.parametrize("arch", ["gfx942", "gfx950"])
def test_aiters_shipped_tables_have_uhp_kernels_for_gqa_up_to_8_only(arch):
    t, note = load_table(SHIPPED, arch)
    assert note is None and len(t.rows) == {"gfx942": 55, "gfx950": 51}[arch]  # every row
    assert t.missing_files == {row.co_name for row in t.rows}  # data only, no kernels
    for q in ("bf16", "fp16"):
        assert [g for g in range(1, 33) if uhp(t, g, q) is not None] == list(range(1, 9))
        assert uhp(t, 8, q, block_size=32) is None


def test_unreadable_table_falls_back_and_says_why(tmp_path):
    t, note = load_table(tmp_path, "gfx950")
    assert note is not None and "pa_asm.csv" in note
    assert uhp(t, 8) is not None and uhp(t, 16) is None
    t, note = load_table(None, "gfx942:sramecc+:xnack-")
    assert t.arch == "gfx942" and note == "AITER_ASM_DIR is not set"
    assert uhp(t, 4, "fp16") is not None


@pytest.mark.parametrize("arch", ["gfx1250", "gfx1201", "gfx90a"])
def test_other_archs_have_no_kernel(arch):
    assert all(uhp(fallback_table(arch), g) is None for g in range(1, 17))


def test_bad_row_is_an_error(tmp_path):
    (tmp_path / "gfx950" / "pa").mkdir(parents=True)
    (tmp_path / "gfx950" / "pa" / "pa_asm.csv").write_text(HEADER + "bf16,fp8,eight,0\n")
    t, note = load_table(tmp_path, "gfx950")
    assert note is not None and "bad pa_asm.csv row" in note
    assert t.source.startswith("built-in")
