"""This run against the original change's figures (``tools/data/original_measurements.json``):
the relative change, and whether each claim holds within the original's run-to-run
spread. Every original figure and range here is computed from that data file.

The spread: the original repeated Qwen3-14B-FP8 at TP1, concurrency 64 and 128 (main four
times, the change five). At each of those concurrencies the spread is the width of main's
range plus the width of the change's range, each relative to its lowest run, in percent
points; a concurrency without repeats takes the nearest one's. For GSM8K the spread is
the widest min-max range of any arm of any model in the original's table.
"""

from __future__ import annotations

import statistics
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from pathlib import PurePath
from typing import Any

from .. import original

HOLDS, FAILS, NOT_MEASURED = "holds", "does not hold", "not measured"


def pct(before: float, after: float) -> float:
    return (after / before - 1) * 100


@dataclass
class Claim:
    name: str
    original: str
    this_run: str
    verdict: str
    why: str

    def to_json(self) -> dict[str, Any]:
        return asdict(self)


def serving() -> dict[str, Any]:
    return original.load()["serving"]


def serving_changes(tp: int) -> dict[int, list[float]]:
    """The original's change in percent per concurrency over its rows at ``tp``."""
    data = serving()
    out: dict[int, list[float]] = {c: [] for c in data["concurrency"]}
    for row in data["rows"]:
        if row["tp"] == tp:
            for c, a, b in zip(data["concurrency"], row["main"], row["change"], strict=True):
                out[c].append(pct(a, b))
    return {c: v for c, v in out.items() if v}


def spread_pts(concurrency: int) -> float:
    """The original's run-to-run spread at ``concurrency``, in percent points."""
    spread = serving()["spread"]
    known = sorted(int(c) for c in spread["main"])
    nearest = min(known, key=lambda c: (abs(c - concurrency), c))
    width = 0.0
    for arm in ("main", "change"):
        low, high = spread[arm][str(nearest)]
        width += (high / low - 1) * 100
    return width


def model_row(section: str, model: str, tp: int) -> dict[str, Any] | None:
    """The original's row of ``section`` for this model (its last path part, any case)
    at this TP, if the original measured it."""
    name = PurePath(model.rstrip("/")).name.lower()
    for row in original.load()[section]["rows"]:
        if row["model"].lower() == name and row["tp"] == tp:
            return row
    return None


def _fmt_range(values: Sequence[float]) -> str:
    low, high = min(values), max(values)
    return f"{low:+.1f}%" if round(low, 1) == round(high, 1) else f"{low:+.1f} to {high:+.1f}%"


def speed_claims(summary: Sequence[dict[str, Any]], tp: int, model: str) -> list[Claim]:
    """Output throughput above the cut (64, 128), nothing lost below it (1, 8), and the
    median TPOT at 64-128."""
    by_c = {r["concurrency"]: r for r in summary}
    changes = serving_changes(tp)
    mine = model_row("serving", model, tp)
    claims = []
    for c in (64, 128):
        name = f"output throughput at concurrency {c}"
        if c not in changes:
            claims.append(
                Claim(
                    name,
                    f"no original run at TP {tp}",
                    "—",
                    NOT_MEASURED,
                    "the original ran TP 1 and 2 only",
                )
            )
            continue
        low, high = min(changes[c]), max(changes[c])
        orig = f"{_fmt_range(changes[c])} (TP {tp}, {len(changes[c])} models)"
        if mine is not None:
            i = serving()["concurrency"].index(c)
            orig += f"; {mine['model']}: {pct(mine['main'][i], mine['change'][i]):+.1f}%"
        row = by_c.get(c)
        if row is None or row.get("change_pct") is None:
            claims.append(Claim(name, orig, "—", NOT_MEASURED, "no figure for both arms"))
            continue
        x, tol = row["change_pct"], spread_pts(c)
        if x >= low - tol:
            where = (
                "within the original's range"
                if x <= high + tol and x >= low
                else (
                    "above the original's range" if x > high else "below the range, within spread"
                )
            )
            verdict, why = HOLDS, f"{x:+.1f}% {where} (spread {tol:.1f} points)"
        else:
            verdict, why = (
                FAILS,
                f"{x:+.1f}% is below {low:+.1f}% by more than the spread ({tol:.1f} points)",
            )
        claims.append(Claim(name, orig, f"{x:+.1f}%", verdict, why))
    below = [by_c[c] for c in (1, 8) if c in by_c and by_c[c].get("change_pct") is not None]
    orig_below = [v for c in (1, 8) for v in changes.get(c, [])]
    name = "below the cut unchanged (concurrency 1 and 8)"
    if not below or not orig_below:
        claims.append(
            Claim(
                name,
                _fmt_range(orig_below) if orig_below else "—",
                "—",
                NOT_MEASURED,
                "concurrency 1 or 8 not run" if not below else f"no original run at TP {tp}",
            )
        )
    else:
        tol = spread_pts(8)
        worst = max(below, key=lambda r: abs(r["change_pct"]))
        text = ", ".join(f"{r['concurrency']}: {r['change_pct']:+.1f}%" for r in below)
        ok = abs(worst["change_pct"]) <= tol
        where = "within" if ok else "outside"
        why = f"largest change {worst['change_pct']:+.1f}% {where} the spread ({tol:.1f} points)"
        claims.append(Claim(name, _fmt_range(orig_below), text, HOLDS if ok else FAILS, why))
    claims.append(tpot_claim(by_c))
    return claims


def tpot_claim(by_c: dict[int, dict[str, Any]]) -> Claim:
    claim = serving()["tpot_drop"]
    low, high = claim["pct"]
    cs = claim["concurrency"]
    orig = f"drops {low}-{high}% at concurrency {'-'.join(map(str, cs))}"
    name = "median TPOT above the cut"
    drops = {}
    for c in cs:
        r = by_c.get(c)
        if r and r.get("baseline_tpot_ms") and r.get("candidate_tpot_ms"):
            drops[c] = (1 - r["candidate_tpot_ms"] / r["baseline_tpot_ms"]) * 100
    if not drops:
        return Claim(name, orig, "—", NOT_MEASURED, "concurrency 64 and 128 not run")
    text = ", ".join(f"{c}: drops {d:.1f}%" for c, d in drops.items())
    short = {c: d for c, d in drops.items() if d < low - spread_pts(c)}
    if short:
        c = next(iter(short))
        return Claim(
            name,
            orig,
            text,
            FAILS,
            f"at {c} it drops less than {low}% by more than the spread "
            f"({spread_pts(c):.1f} points)",
        )
    return Claim(name, orig, text, HOLDS, f"every drop at least {low}% less the spread")


def gsm8k_spread() -> float:
    rows = original.load()["gsm8k"]["rows"]
    return max(max(r[arm][1:]) - min(r[arm][1:]) for r in rows for arm in ("main", "change"))


def gsm8k_claim(runs: dict[str, list[float]], model: str, tp: int) -> Claim:
    """``runs``: flexible-match scores per arm (baseline, asm-decode)."""
    rows = original.load()["gsm8k"]["rows"]
    tol = gsm8k_spread()
    diffs = [r["change"][0] - r["main"][0] for r in rows]
    orig = (
        f"change minus main {min(diffs):+.4f} to {max(diffs):+.4f} over {len(rows)} model/TP runs"
    )
    mine = model_row("gsm8k", model, tp)
    if mine is not None:
        orig += f"; {mine['model']} TP {tp}: {mine['main'][0]:.4f} -> {mine['change'][0]:.4f}"
    name = "GSM8K unchanged (flexible match)"
    base, cand = runs.get("plugin-off") or [], runs.get("asm-decode") or []
    if not base or not cand:
        return Claim(name, orig, "—", NOT_MEASURED, "GSM8K missing for an arm")
    diff = statistics.fmean(cand) - statistics.fmean(base)
    text = f"{statistics.fmean(base):.4f} -> {statistics.fmean(cand):.4f} ({diff:+.4f})"
    ok = abs(diff) <= tol
    why = f"difference {'within' if ok else 'outside'} the original's run-to-run spread ({tol:.4f})"
    return Claim(name, orig, text, HOLDS if ok else FAILS, why)


def passkey_claim(tallies: dict[str, dict[str, list[int]]]) -> Claim:
    """``tallies``: per arm, ``{length: [found, sent]}``."""
    data = original.load()["passkey"]
    lengths = ", ".join(str(n) for n in data["lengths"])
    orig = f"{data['found']}/{data['of']} at {lengths} tokens, both arms"
    name = "passkey retrieval"
    if set(tallies) != {"plugin-off", "asm-decode"}:
        return Claim(name, orig, "—", NOT_MEASURED, "passkey missing for an arm")
    missed = [
        f"{arm} {n}: {ok}/{sent}"
        for arm, t in tallies.items()
        for n, (ok, sent) in t.items()
        if ok < sent
    ]
    found = sum(ok for t in tallies.values() for ok, _ in t.values())
    sent = sum(s for t in tallies.values() for _, s in t.values())
    text = f"{found}/{sent} found over both arms"
    if missed:
        return Claim(name, orig, text, FAILS, "missed: " + ", ".join(missed))
    return Claim(name, orig, text, HOLDS, "every passkey found in both arms")


def kernel_rows(timings: Sequence[dict[str, Any]]) -> list[dict[str, Any]]:
    """The original's above-cut kernel rows, each with this run's timing beside it."""
    mine = {(t["num_heads"], t["num_kv_heads"], t["context"], t["num_seqs"]): t for t in timings}
    rows = []
    for o in original.kernel_timings(below_cut=False):
        t = mine.get((o.heads, o.kv_heads, o.context, o.seqs))
        rows.append({"original": asdict(o), "this_run": t})
    return rows


def kernel_claim(timings: Sequence[dict[str, Any]]) -> Claim:
    rows = kernel_rows(timings)
    ratios = [r["original"]["asm_us"] / r["original"]["hip_us"] for r in rows]
    orig = (
        f"asm faster in {len(rows)} of {len(rows)} rows, "
        f"asm/HIP {min(ratios):.2f}-{max(ratios):.2f}"
    )
    name = "asm kernel faster above the cut"
    measured = [r["this_run"] for r in rows if r["this_run"]]
    if not measured:
        return Claim(name, orig, "—", NOT_MEASURED, "the kernel table was not measured")
    mine = [t["asm_us"] / t["hip_us"] for t in measured]
    faster = sum(1 for x in mine if x < 1)
    text = (
        f"asm faster in {faster} of {len(measured)} rows, asm/HIP {min(mine):.2f}-{max(mine):.2f}"
    )
    if faster == len(measured):
        return Claim(name, orig, text, HOLDS, "asm/HIP below 1 at every original shape")
    return Claim(name, orig, text, FAILS, f"asm not faster in {len(measured) - faster} row(s)")


def below_cut_kernel_claim(sweep: Sequence[dict[str, Any]]) -> Claim:
    low = original.load()["kernel"]["below_cut"]
    orig_rows = {r["seqs"]: r for r in low["rows"]}
    orig = ", ".join(
        f"{n} seq: asm {r['asm_us']} vs HIP {r['hip_us']} µs" for n, r in orig_rows.items()
    )
    name = f"asm slower below the cut ({low['heads']}/{low['kv_heads']}, ctx {low['context']})"
    mine = {
        t["num_seqs"]: t
        for t in sweep
        if (t["num_heads"], t["num_kv_heads"], t["context"])
        == (low["heads"], low["kv_heads"], low["context"])
    }
    have = [mine[n] for n in orig_rows if n in mine]
    if not have:
        return Claim(name, orig, "—", NOT_MEASURED, "the sweep did not run at these shapes")
    text = ", ".join(
        f"{t['num_seqs']} seq: asm {t['asm_us']:.1f} vs HIP {t['hip_us']:.1f} µs" for t in have
    )
    slower = all(t["asm_us"] > t["hip_us"] for t in have)
    return Claim(
        name,
        orig,
        text,
        HOLDS if slower else FAILS,
        "asm slower at each" if slower else "asm not slower at every batch the original timed",
    )


def sync_claim(record: dict[str, Any] | None) -> Claim:
    orig = (
        "no synchronization reported ("
        + original.load()["sync_check"].split("(")[1].split(")")[0]
        + ")"
    )
    name = "no host synchronization (VLLM_GPU_SYNC_CHECK=error)"
    if record is None:
        return Claim(name, orig, "—", NOT_MEASURED, "the sync check did not run")
    if record["status"] == "ok":
        g = record["result"].get("gsm8k", {}).get("flexible")
        text = "none reported" + (f", GSM8K {g:.4f}" if g is not None else "")
        return Claim(name, orig, text, HOLDS, "the server ran its work with the check armed")
    if (record.get("result") or {}).get("reported"):  # the check found one
        return Claim(name, orig, "failed", FAILS, record.get("error") or "")
    # The step failed before the check could say (no server, no GSM8K): nothing measured.
    return Claim(name, orig, "failed", NOT_MEASURED, record.get("error") or "")
