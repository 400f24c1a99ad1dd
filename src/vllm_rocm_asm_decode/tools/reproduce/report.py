"""``report.md`` and ``report.json``: the original's tables in the original's format with
this run's figures beside them, the claims, plots, what was not run and why. Written to
be pasted into a pull request."""

from __future__ import annotations

import statistics
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from .. import original
from . import compare, environment
from .state import StepRecord
from .steps import BASELINE, CANDIDATE, Settings, Step


@dataclass
class Run:
    """Everything a report is made of."""

    settings: Settings
    steps: list[Step]
    records: dict[str, StepRecord | None]
    environments: list[dict[str, Any]]
    #: Why steps were not reached: "interrupted", or the gate step's failure.
    stopped: str | None = None
    plots: dict[str, str] = field(default_factory=dict)
    plot_problem: str | None = None

    def result(self, name: str) -> dict[str, Any] | None:
        rec = self.records.get(name)
        return rec.result if rec is not None else None

    def ok(self, name: str) -> bool:
        rec = self.records.get(name)
        return rec is not None and rec.ok


# ----------------------------------------------------------------------------- formats

#: The original's ranges are written with an en dash.
DASH = "\u2013"


def row(*cells: object) -> str:
    """A Markdown table row."""
    return "| " + " | ".join(str(c) for c in cells) + " |"


def change_cell(before: float, after: float) -> str:
    """``main -> change``, with the change in percent where it is 1 % or more (the
    original's table shows it there only)."""
    change = compare.pct(before, after)
    cell = f"{before:.0f} -> {after:.0f}"
    return cell + (f" ({change:+.1f}%)" if abs(change) >= 1 else "")


def serving_table(this_run: Sequence[dict[str, Any]], model: str, tp: int) -> list[str]:
    data = original.load()["serving"]
    cs = data["concurrency"]
    lines = [
        "| model | TP | " + " | ".join(f"conc {c}" for c in cs) + " |",
        "|---|---|" + "---|" * len(cs),
    ]
    for row in data["rows"]:
        cells = [change_cell(a, b) for a, b in zip(row["main"], row["change"], strict=True)]
        lines.append(f"| {row['model']} | {row['tp']} | " + " | ".join(cells) + " |")
    if this_run:
        by_c = {r["concurrency"]: r for r in this_run}
        cells = []
        for c in cs:
            r = by_c.get(c)
            if r and r.get("baseline_tok_s") and r.get("candidate_tok_s"):
                cells.append(change_cell(r["baseline_tok_s"], r["candidate_tok_s"]))
            else:
                cells.append("not run")
        lines.append(f"| **this run: {model}** | {tp} | " + " | ".join(cells) + " |")
    return lines


def _slash(values: Sequence[float], fmt: str) -> str:
    return " / ".join(fmt.format(v) for v in values)


def kernel_table(timings: Sequence[dict[str, Any]]) -> list[str]:
    """Rows grouped by layout and context as the original's: ``16 / 64 / 256`` in a cell.
    ``timings`` in this run's JSON form (``num_heads``, ``hip_us``, ...)."""
    groups: dict[tuple[int, int, int], list[dict[str, Any]]] = {}
    for t in timings:
        groups.setdefault((t["num_heads"], t["num_kv_heads"], t["context"]), []).append(t)
    lines = [
        "| heads (q/kv) | ctx | seqs | HIP (today) | asm | asm / HIP |",
        "|---|---|---|---|---|---|",
    ]
    for (h, kv, ctx), ts in groups.items():
        ts = sorted(ts, key=lambda t: t["num_seqs"])
        lines.append(
            f"| {h}/{kv} | {ctx} | {_slash([t['num_seqs'] for t in ts], '{}')} "
            f"| {_slash([t['hip_us'] for t in ts], '{:.2f}')} "
            f"| {_slash([t['asm_us'] for t in ts], '{:.2f}')} "
            f"| {_slash([t['asm_us'] / t['hip_us'] for t in ts], '{:.2f}')} |"
        )
    return lines


def original_kernel_timings() -> list[dict[str, Any]]:
    return [
        {
            "num_heads": o.heads,
            "num_kv_heads": o.kv_heads,
            "context": o.context,
            "num_seqs": o.seqs,
            "hip_us": o.hip_us,
            "asm_us": o.asm_us,
        }
        for o in original.kernel_timings(below_cut=False)
    ]


def mean_range(values: Sequence[float]) -> str:
    """``0.9239 (0.9227–0.9257)``, the original's form; one value alone as itself."""
    if len(values) == 1:
        return f"{values[0]:.4f}"
    return f"{statistics.fmean(values):.4f} ({min(values):.4f}{DASH}{max(values):.4f})"


def gsm8k_table(runs: dict[str, list[float]], model: str, tp: int) -> list[str]:
    lines = ["| model | TP | main | this PR |", "|---|---|---|---|"]
    for row in original.load()["gsm8k"]["rows"]:
        main, change = row["main"], row["change"]
        cells = [
            f"{v[0]:.4f}" + ("" if v[1] == v[2] else f" ({v[1]:.4f}{DASH}{v[2]:.4f})")
            for v in (main, change)
        ]
        lines.append(f"| {row['model']} | {row['tp']} | {cells[0]} | {cells[1]} |")
    if runs:
        base = mean_range(runs[BASELINE]) if runs.get(BASELINE) else "not run"
        cand = mean_range(runs[CANDIDATE]) if runs.get(CANDIDATE) else "not run"
        lines.append(f"| **this run: {model}** | {tp} | {base} | {cand} |")
    return lines


# ------------------------------------------------------------------------------ gather


def gsm8k_runs(run: Run) -> dict[str, list[float]]:
    """Flexible-match scores per arm over the arm's GSM8K steps that finished."""
    runs: dict[str, list[float]] = {}
    for step in run.steps:
        if step.kind != "accuracy" or not run.ok(step.name):
            continue
        score = (run.result(step.name) or {}).get("gsm8k", {}).get("flexible")
        if score is not None:
            runs.setdefault(step.options["arm"], []).append(score)
    return runs


def gsm8k_per_run(run: Run) -> list[str]:
    lines = ["| step | arm | mode | flexible | strict |", "|---|---|---|---|---|"]
    for step in run.steps:
        if step.kind not in ("accuracy", "sync"):
            continue
        g = (run.result(step.name) or {}).get("gsm8k")
        if g:
            mode = (
                "sync check"
                if step.kind == "sync"
                else ("eager" if step.options.get("eager") else "CUDA graph")
            )
            lines.append(
                row(
                    step.name,
                    step.options["arm"],
                    mode,
                    f"{g['flexible']:.4f}",
                    f"{g['strict']:.4f}",
                )
            )
    return lines if len(lines) > 2 else []


def passkey_tallies(run: Run) -> dict[str, dict[str, list[int]]]:
    out = {}
    for arm in (BASELINE, CANDIDATE):
        result = run.result(f"accuracy-{arm}") or {}
        if "passkey" in result:
            out[arm] = result["passkey"]
    return out


def claims(run: Run) -> list[compare.Claim]:
    s = run.settings
    serve = run.result("serve-random") or {}
    found = compare.speed_claims(serve.get("summary", []), s.tp, s.model)
    table = run.result("kernel-table") or {}
    found.append(compare.kernel_claim(table.get("timings", [])))
    sweep = run.result("kernel-sweep") or {}
    found.append(compare.below_cut_kernel_claim(sweep.get("timings", [])))
    found.append(compare.gsm8k_claim(gsm8k_runs(run), s.model, s.tp))
    found.append(compare.passkey_claim(passkey_tallies(run)))
    rec = run.records.get("sync-check")
    found.append(
        compare.sync_claim(
            None
            if rec is None
            else {"status": rec.status, "result": rec.result, "error": rec.error}
        )
    )
    return found


def not_run(run: Run) -> list[str]:
    """What was not run, each with why."""
    said = []
    for step in run.steps:
        rec = run.records.get(step.name)
        if rec is None:
            why = run.stopped or "not reached yet: run the same command again to resume"
            said.append(f"`{step.name}` ({step.title}): not run: {why}")
    if not run.settings.dataset:
        said.append("ShareGPT-style mixed-length serving A/B: no data set given (`--dataset FILE`)")
    if run.settings.quick:
        said.append(
            "left out by `--quick`: concurrency 8 and 16, a second serving repeat (so no "
            "min\u2013max), the second CUDA-graph and the `--enforce-eager` GSM8K runs per arm, "
            "and the five concurrencies under the sync check"
        )
    said.append(
        "other models and TP sizes of the original's tables: this run is "
        f"{run.settings.model} at TP {run.settings.tp} only"
    )
    said.append(
        "asm at AITER's default precision and `ROCM_AITER_FA` GSM8K runs (the original's "
        "extra columns), and the error against fp32: not part of `reproduce` "
        "(`vllm-rocm-asm-decode check accuracy` measures the error)"
    )
    if run.plot_problem:
        said.append(f"plots: {run.plot_problem}")
    return said


# ------------------------------------------------------------------------------ render


def _duration(seconds: float) -> str:
    m, s = divmod(round(seconds), 60)
    h, m = divmod(m, 60)
    return f"{h}h{m:02d}m" if h else f"{m}m{s:02d}s"


def step_lines(run: Run) -> list[str]:
    lines = ["| step | status | time | invocation | detail |", "|---|---|---|---|---|"]
    for step in run.steps:
        rec = run.records.get(step.name)
        if rec is None:
            lines.append(f"| {step.name} | not run | — | — | {run.stopped or 'not reached'} |")
        else:
            detail = (rec.error or "").replace("|", "\\|")
            status = "ok" if rec.ok else "**FAILED**"
            lines.append(row(step.name, status, _duration(rec.seconds), rec.invocation, detail))
    return lines


def _executable_text(version: str | None, env: dict[str, Any], tool: str) -> str:
    """``VERSION (PATH)`` of an executable the run ran, ``unknown (PATH)`` when the
    version was not learned from it."""
    path = env.get(f"{tool}_executable") or "not recorded"
    return f"{version or 'unknown'} ({path})"


def _doctor_vllm(run: Run) -> str:
    """The vLLM the doctor step imported (and ``bench kernel`` imports), as it said."""
    doctor = run.result("doctor")
    if doctor is None:
        return "unknown (doctor not run)"
    if "vllm_version" not in doctor:
        return "unknown (doctor gave no JSON)"
    return doctor["vllm_version"] or "none (per doctor)"


def _lm_eval_text(run: Run, env: dict[str, Any]) -> str:
    """Each lm_eval that ran GSM8K, with the version its results file gave; the
    ``--lm-eval`` executable, version unknown, before any did."""
    ran: dict[str, None] = {}
    for rec in run.records.values():
        gsm8k = rec.result.get("gsm8k") if rec is not None else None
        if isinstance(gsm8k, dict):
            path = gsm8k.get("lm_eval") or env.get("lm_eval_executable") or "not recorded"
            ran[f"{gsm8k.get('lm_eval_version') or 'unknown'} ({path})"] = None
    return "; ".join(ran) or _executable_text(None, env, "lm_eval")


def environment_lines(run: Run) -> list[str]:
    env = run.environments[-1] if run.environments else {}
    doctor = run.result("doctor") or {}
    gpu = doctor.get("gpu") or {}
    gpu_text = ", ".join(env.get("gpus") or []) or "unknown (no rocminfo)"
    if gpu:
        gpu_text += f" ({gpu.get('arch')}, {gpu.get('compute_units')} CUs, per doctor)"
    rows = [
        ("GPU", gpu_text),
        ("ROCm", env.get("rocm") or "unknown"),
        ("vLLM (servers)", _executable_text(env.get("vllm_executable_version"), env, "vllm")),
        ("vLLM (doctor)", _doctor_vllm(run)),
        ("AITER", doctor.get("aiter_version") or env.get("aiter") or "not installed"),
        ("torch", env.get("torch") or "not installed"),
        ("lm_eval", _lm_eval_text(run, env)),
        (
            "plugin",
            f"{env.get('plugin')}, git {env.get('git_revision') or 'unknown (not a checkout)'}",
        ),
        ("model", f"{run.settings.model}, TP {run.settings.tp}"),
        (
            "server",
            "VLLM_ROCM_USE_AITER=1 vllm serve MODEL --kv-cache-dtype fp8 "
            "--max-model-len 40960 --gpu-memory-utilization 0.85",
        ),
        (
            "settings",
            ", ".join(f"{k}={v}" for k, v in (env.get("settings") or {}).items()) or "none set",
        ),
        ("invocations", str(len(run.environments))),
    ]
    lines = ["| | |", "|---|---|"] + [
        f"| {k} | `{v}` |" if k == "server" else f"| {k} | {v} |" for k, v in rows
    ]
    for change in environment.changes(run.environments):
        lines.append(f"\nThe environment changed between invocations: {change}.")
    return lines


def render_markdown(run: Run) -> str:
    s = run.settings
    recs = [r for r in run.records.values() if r is not None]
    failed = [r.name for r in recs if not r.ok]
    missing = [st.name for st in run.steps if run.records.get(st.name) is None]
    src = original.load()
    out = [
        f"# ROCM_ATTN asm decode: the original change's validation, reproduced on {gpu_name(run)}",
        "",
        f"`vllm-rocm-asm-decode reproduce {s.describe()}`: "
        f"{sum(r.ok for r in recs)} of {len(run.steps)} steps passed"
        + (f", {len(failed)} failed ({', '.join(failed)})" if failed else "")
        + (f", {len(missing)} not run" if missing else "")
        + ".",
        "",
        "The rows marked **this run** were measured by this command; every other figure "
        "is the original change's, read from this project's copy of them "
        f"({src['source'].rstrip('.')}). Changes and verdicts are computed from those "
        "figures.",
        "",
        "## Claims",
        "",
        "| claim | original | this run | verdict | why |",
        "|---|---|---|---|---|",
    ]
    for c in claims(run):
        verdict = c.verdict if c.verdict != compare.FAILS else f"**{c.verdict}**"
        out.append(f"| {c.name} | {c.original} | {c.this_run} | {verdict} | {c.why} |")
    out += ["", compare.__doc__.split("\n\n", 1)[1].strip().replace("\n", " "), ""]
    out += ["## Environment", "", *environment_lines(run), ""]

    serve = run.result("serve-random") or {}
    out += [
        "## Serving A/B",
        "",
        "Output tok/s, baseline (`VLLM_ROCM_ASM_DECODE=0`) -> asm decode, fresh server per "
        "arm, random 1024/1024 with `--ignore-eos`; the original's rows are main -> the "
        f"change (n = {_slash(src['serving']['prompts'], '{}')} prompts at concurrency "
        f"{_slash(src['serving']['concurrency'], '{}')}):",
        "",
    ]
    out += serving_table(serve.get("summary", []), s.model, s.tp)
    out += ["", *_serve_detail(serve, run.records.get("serve-random"))]
    out.append("")
    if s.dataset:
        sg = run.result("serve-sharegpt") or {}
        out += ["### ShareGPT lengths (mixed prefill+decode steps)", ""]
        out += _serve_detail(sg, run.records.get("serve-sharegpt")) or ["not run"]
        out.append("")

    table = run.result("kernel-table") or {}
    out += [
        "## Kernel latency",
        "",
        "impl.forward in a CUDA graph, µs per call, fp8 cache, all sequences at the given "
        "context length, asm at AITER's default precision. The original (MI355X):",
        "",
    ]
    out += kernel_table(original_kernel_timings())
    out += ["", "This run:", ""]
    out += (
        kernel_table(table["timings"])
        if table.get("timings")
        else [_why_missing(run, "kernel-table")]
    )
    out += ["", *_kernel_change(table.get("timings", [])), ""]
    skew = run.result("kernel-skew") or {}
    if skew.get("skew"):
        out += [
            "### One long sequence among short ones",
            "",
            "| long | HIP µs | asm µs | asm / HIP |",
            "|---|---|---|---|",
        ]
        out += [
            f"| {t['long']} | {t['hip_us']:.2f} | {t['asm_us']:.2f} | {t['ratio']:.2f} |"
            for t in skew["skew"]
        ]
        out += [
            "",
            f"Suggested `VLLM_ROCM_ASM_DECODE_SKEW`: {skew.get('suggested_skew')} "
            "(built in: 67, fitted to the original table).",
            "",
        ]
    sweep = run.result("kernel-sweep") or {}
    if sweep.get("timings"):
        out += [
            "### Crossover",
            "",
            "Batch sizes from 1 (40/8 heads, context 4096): asm faster from "
            f"{sweep.get('crossover_seqs')} sequences on; the cut here is {sweep.get('cut')} "
            f"query heads; suggested `VLLM_ROCM_ASM_DECODE_CUT={sweep.get('suggested_cut')}`.",
            "",
        ]

    runs = gsm8k_runs(run)
    out += [
        "## GSM8K",
        "",
        "1319 questions, 5-shot chat, greedy, 64 in flight; flexible match, mean "
        "(min\u2013max) over runs:",
        "",
    ]
    out += gsm8k_table(runs, s.model, s.tp)
    per_run = gsm8k_per_run(run)
    out += ["", *(["Per run:", "", *per_run, ""] if per_run else [])]
    tallies = passkey_tallies(run)
    out += [
        "## Passkey retrieval",
        "",
        f"Original: {src['passkey']['found']}/{src['passkey']['of']} at every length in "
        "every run. This run:",
        "",
    ]
    if tallies:
        lengths = list(next(iter(tallies.values())))
        out += [
            "| arm | " + " | ".join(f"{n} tokens" for n in lengths) + " |",
            "|---|" + "---|" * len(lengths),
        ]
        out += [
            f"| {arm} | " + " | ".join(f"{t[n][0]}/{t[n][1]}" for n in lengths) + " |"
            for arm, t in tallies.items()
        ]
    else:
        out.append(_why_missing(run, f"accuracy-{BASELINE}"))
    out += ["", "## Sync check", "", f"Original: {src['sync_check']}.", ""]
    rec = run.records.get("sync-check")
    out.append(
        _why_missing(run, "sync-check")
        if rec is None
        else (
            "This run: no synchronization reported."
            if rec.ok
            else f"This run: **failed**: {rec.error}"
        )
    )
    if run.plots:
        out += ["", "## Plots", ""]
        out += [f"![{title}]({path})" for title, path in run.plots.items()]
    out += ["", "## Not run, and why", ""]
    out += [f"- {line}" for line in not_run(run)]
    out += ["", "## Steps", "", *step_lines(run), ""]
    out += [
        "No AMD GPU has run this command while it was written: its first run on "
        "MI300X/MI355X is the first measurement of this project.",
        "",
    ]
    return "\n".join(out)


def gpu_name(run: Run) -> str:
    """The GPU as rocminfo names it, else its architecture as doctor read it."""
    env = run.environments[-1] if run.environments else {}
    if env.get("gpus"):
        return ", ".join(sorted(set(env["gpus"])))
    gpu = (run.result("doctor") or {}).get("gpu") or {}
    return gpu.get("arch") or "an unknown GPU"


def _why_missing(run: Run, name: str) -> str:
    rec = run.records.get(name)
    if rec is None:
        return f"Not run: {run.stopped or 'not reached'}."
    return f"**Failed**: {rec.error}" if not rec.ok else "No figures."


def _serve_detail(serve: dict[str, Any], rec: StepRecord | None) -> list[str]:
    lines = []
    if rec is not None and not rec.ok:
        lines += [f"**Failed**: {rec.error}", ""]
    summary = serve.get("summary") or []
    if summary:
        lines += [
            "| concurrency | output tok/s | change | median TPOT ms | p99 ITL ms | runs |",
            "|---|---|---|---|---|---|",
        ]
        for r in summary:
            change = "—" if r["change_pct"] is None else f"{r['change_pct']:+.1f}%"
            lines.append(
                row(
                    r["concurrency"],
                    f"{_n(r['baseline_tok_s'])} -> {_n(r['candidate_tok_s'])}",
                    change,
                    _arrow(r, "tpot_ms", "{:.2f}"),
                    _arrow(r, "p99_itl_ms", "{:.1f}"),
                    f"{r['runs'].get(BASELINE, 0)} / {r['runs'].get(CANDIDATE, 0)}",
                )
            )
        lines.append("")
    ranges = repeat_ranges(serve.get("results") or [])
    if ranges:
        lines += [
            "Repeats, output tok/s min\u2013max:",
            "",
            "| concurrency | baseline | asm decode |",
            "|---|---|---|",
            *ranges,
            "",
        ]
    for r in serve.get("results") or []:
        if r.get("outlier"):
            lines.append(
                f"Left out as an outlier (host stall): {r['arm']} repeat {r['repeat']} at "
                f"concurrency {r['concurrency']}, p99 ITL {r['p99_itl_ms']:.1f} ms."
            )
    for a in serve.get("arms") or []:
        lines.append(
            f"- {a['arm']} repeat {a['repeat']}: "
            f"{'confirmed' if a['confirmed'] else 'UNCONFIRMED'}: {a['detail']}"
        )
    return lines


def repeat_ranges(results: Sequence[dict[str, Any]]) -> list[str]:
    """``| 64 | 4852–4899 | 5105–5115 |`` where an arm ran more than once."""
    by: dict[tuple[int, str], list[float]] = {}
    for r in results:
        by.setdefault((r["concurrency"], r["arm"]), []).append(r["output_throughput"])
    if not any(len(v) > 1 for v in by.values()):
        return []
    lines = []
    for c in sorted({c for c, _ in by}):
        cells = []
        for arm in (BASELINE, CANDIDATE):
            v = by.get((c, arm), [])
            cells.append(f"{min(v):.0f}{DASH}{max(v):.0f} ({len(v)} runs)" if v else "—")
        lines.append(f"| {c} | {cells[0]} | {cells[1]} |")
    return lines


def _arrow(r: dict[str, Any], what: str, fmt: str) -> str:
    return f"{_n(r['baseline_' + what], fmt)} -> {_n(r['candidate_' + what], fmt)}"


def _n(value: float | None, fmt: str = "{:.0f}") -> str:
    return "—" if value is None else fmt.format(value)


def _kernel_change(timings: Sequence[dict[str, Any]]) -> list[str]:
    rows = [r for r in compare.kernel_rows(timings) if r["this_run"]]
    if not rows:
        return []
    lines = [
        "Beside the original, row by row (change: this run's asm/HIP against the original's):",
        "",
        "| heads | ctx | seqs | original asm / HIP | this run asm / HIP | change |",
        "|---|---|---|---|---|---|",
    ]
    for r in rows:
        o, t = r["original"], r["this_run"]
        ro, rt = o["asm_us"] / o["hip_us"], t["asm_us"] / t["hip_us"]
        lines.append(
            row(
                f"{o['heads']}/{o['kv_heads']}",
                o["context"],
                o["seqs"],
                f"{ro:.2f}",
                f"{rt:.2f}",
                f"{compare.pct(ro, rt):+.1f}%",
            )
        )
    return lines


def to_json(run: Run) -> dict[str, Any]:
    return {
        "settings": run.settings.to_json(),
        "original_source": original.load()["source"],
        "environments": run.environments,
        "steps": [
            {
                "name": st.name,
                "title": st.title,
                **(
                    {"status": "not run", "why": run.stopped or "not reached"}
                    if run.records.get(st.name) is None
                    else vars(run.records[st.name])
                ),
            }  # type: ignore[arg-type]
            for st in run.steps
        ],
        "claims": [c.to_json() for c in claims(run)],
        "spread": {
            "serving_pts": {str(c): compare.spread_pts(c) for c in (1, 8, 16, 64, 128)},
            "gsm8k": compare.gsm8k_spread(),
        },
        "not_run": not_run(run),
        "plots": run.plots,
    }


def write(run: Run, root: Path) -> Path:
    import json

    from .state import write_text

    path = root / "report.md"
    write_text(path, render_markdown(run))
    write_text(root / "report.json", json.dumps(to_json(run), indent=2) + "\n")
    return path
