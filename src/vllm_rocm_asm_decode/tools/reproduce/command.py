"""``reproduce``'s run: the steps in order, each recorded as it finishes, then the
report; Ctrl-C stops cleanly and the same command resumes."""

from __future__ import annotations

import argparse
import contextlib
import os
import sys
import time
from pathlib import Path

from .. import original
from ..choices import first_line
from ..stopping import stopped_by
from . import environment, options, report, runners
from .progress import Progress, duration
from .state import FAILED, OK, StepRecord, Store
from .steps import Settings, Step, plan

PROG = "vllm-rocm-asm-decode reproduce"


def summary(step: Step, record: StepRecord) -> str:
    """One line for a finished step."""
    if not record.ok:
        return record.error or "failed"
    r = record.result
    if step.kind == "doctor":
        return f"{r.get('checks')} checks passed, self-test {r.get('self_test')}"
    if step.kind == "kernel":
        if r.get("skew"):
            return f"{len(r['skew'])} lengths, suggested skew {r.get('suggested_skew')}"
        ts = r.get("timings") or []
        faster = sum(1 for t in ts if t["asm_us"] < t["hip_us"])
        extra = (
            f", crossover at {r.get('crossover_seqs')} sequences" if r.get("crossover_seqs") else ""
        )
        return f"asm faster in {faster} of {len(ts)} cases{extra}"
    if step.kind == "serve":
        rows = [x for x in r.get("summary") or [] if x.get("change_pct") is not None]
        return (
            ", ".join(f"c{x['concurrency']} {x['change_pct']:+.1f}%" for x in rows) or "no figures"
        )
    parts = []
    if "gsm8k" in r:
        parts.append(f"GSM8K {r['gsm8k']['flexible']:.4f}")
    if "passkey" in r:
        found = sum(ok for ok, _ in r["passkey"].values())
        sent = sum(s for _, s in r["passkey"].values())
        parts.append(f"passkey {found}/{sent}")
    if step.kind == "sync":
        parts.append("no synchronization reported")
    return ", ".join(parts)


def main(args: argparse.Namespace) -> int:
    store = Store(Path(args.out))
    problem = options.out_problem(args.out)
    replaced = None  # an earlier reproduction of other options that finished no step
    try:
        fields = Settings.__dataclass_fields__
        stored = store.settings(fields) if not problem and os.path.isdir(store.root) else None
    except (OSError, ValueError, RecursionError) as exc:
        stored = None
        why = getattr(exc, "strerror", None) or first_line(exc) or "not JSON"
        problem = (
            f"--out {args.out}: cannot read its reproduction.json ({why}); it is not one "
            "this command wrote: give another --out"
        )
    else:
        if stored is not None and stored != options.settings_of(args).to_json():
            if not any(_finished(store, s.name) for s in plan(Settings(**stored))):
                replaced, stored = Settings(**stored), None
        problem = problem or options.problem(args, stored)
    if problem:
        print(f"{PROG}: error: {problem}", file=sys.stderr)
        return 2
    settings = options.settings_of(args)
    steps = plan(settings)
    tools = runners.Tools(
        vllm=args.vllm,
        lm_eval=args.lm_eval,
        host=args.host,
        port=args.port,
        health_timeout=args.health_timeout,
    )
    if args.gpu_tools is not None:
        tools.gpu_tools = [args.gpu_tools]
    ctx = runners.Context(
        model=settings.model,
        tp=settings.tp,
        dataset=settings.dataset,
        tools=tools,
        passkey_lengths=tuple(original.load()["passkey"]["lengths"]),
    )
    try:
        store.root.mkdir(parents=True, exist_ok=True)
        if replaced is not None:
            store.start_over(step.name for step in plan(replaced))
        store.save_settings(settings.to_json())
        for group in args.redo:
            for name in group:
                store.forget(name)
    except OSError as exc:
        return _out_error(args.out, exc)
    records = {s.name: _readable(settings, steps, s.name, store.record(s.name)) for s in steps}
    done = {n for n, r in records.items() if r is not None and r.ok}
    progress = Progress(steps, done)
    if replaced is not None:
        progress.note(
            f"replacing {args.out}'s reproduction of {replaced.describe()}: no step of it finished"
        )
    stopped: str | None = None
    cannot_run = False  # doctor's self-test cannot run on this machine
    interrupted = ""  # what stopped the run: Ctrl-C or SIGTERM
    try:
        # vllm --version imports vLLM first (up to VERSION_SECONDS): said, and inside
        # this Ctrl-C handling, so that an interrupt there writes the report too.
        progress.note(
            f"asking  {environment.executable_path(args.vllm)} --version (the servers' "
            f"vLLM, for the report; up to {duration(environment.VERSION_SECONDS)})"
        )
        env = environment.record(
            settings.model, settings.tp, sys.argv, vllm=args.vllm, lm_eval=args.lm_eval
        )
        try:
            invocation = store.begin(env)
        except OSError as exc:
            return _out_error(args.out, exc)
        for step in steps:
            rec = records[step.name]
            if rec is not None and rec.ok:
                progress.skip(step, rec)
                continue
            if stopped:
                continue
            progress.start(step)
            ctx.files = store.fresh_files(step.name)
            began = time.monotonic()
            machine_at_fault = False
            try:
                result, status, error = runners.run(step, ctx), OK, None
            except runners.StepError as exc:
                result, status, error = exc.result, FAILED, str(exc)
                machine_at_fault = exc.cannot_run
            rec = StepRecord(
                name=step.name,
                status=status,
                seconds=time.monotonic() - began,
                finished=environment.now(),
                invocation=invocation,
                result=result,
                error=error,
            )
            store.save(rec)
            records[step.name] = rec
            progress.finish(step, rec, summary(step, rec))
            if step.gate and not rec.ok:
                stopped = f"{step.name} failed ({error})"
                cannot_run = machine_at_fault
    except KeyboardInterrupt:  # Ctrl-C, or SIGTERM from the command line
        interrupted = stopped_by()
        stopped = f"{interrupted}: run the same command again to resume"
    finally:
        progress.close()
    return _finish(store, settings, steps, records, stopped, interrupted, cannot_run)


def _out_error(out: str, exc: OSError) -> int:
    print(f"{PROG}: error: --out {out}: {exc.strerror or exc}", file=sys.stderr)
    return 2


#: What a step record that this command did not write can raise when it is reported.
_NOT_OURS = (KeyError, TypeError, ValueError, IndexError, AttributeError)


def _finished(store: Store, name: str) -> bool:
    """Whether the step ``name`` finished in ``store`` (a failed step did not)."""
    record = store.record(name)
    return record is not None and record.ok


def _readable(settings, steps, name: str, rec: StepRecord | None) -> StepRecord | None:
    """``rec`` if the report can be made from it; else None: a record this command did
    not write (hand-edited, another version's) counts as not finished, and runs again."""
    if rec is None or not isinstance(rec.result, dict):
        return None
    try:
        report.render_markdown(report.Run(settings, steps, {name: rec}, []))
    except _NOT_OURS:
        return None
    return rec


def _finish(store, settings, steps, records, stopped, interrupted: str, cannot_run: bool) -> int:
    """The report of the steps so far; ``interrupted`` says what stopped the run ("" when
    nothing did), ``cannot_run`` that it stopped because this machine cannot run it
    (exit 2, as for an input error)."""
    run = report.Run(settings, steps, records, store.environments(), stopped=stopped)
    results = {n: (r.result if r is not None else None) for n, r in records.items()}
    try:
        from . import charts

        run.plots = charts.draw(results, settings.model, store.root)
    except SystemExit as exc:  # matplotlib missing: said in the report
        run.plot_problem = str(exc)
    except OSError as exc:
        run.plot_problem = f"could not be drawn ({exc})"
    except _NOT_OURS as exc:  # a record whose figures are not what a step writes
        run.plot_problem = f"could not be drawn from the step records ({exc!r})"
    try:
        path = report.write(run, store.root)
    except OSError as exc:
        print(
            f"{PROG}: error: cannot write the report in {store.root}: {exc.strerror or exc}",
            file=sys.stderr,
        )
        return 1
    failed = [r.name for r in records.values() if r is not None and not r.ok]
    with contextlib.suppress(OSError):
        if interrupted:
            print(
                f"{PROG}: {interrupted}; finished steps are kept in {store.root} and the same "
                f"command resumes (report so far: {path})",
                file=sys.stderr,
            )
        elif stopped:
            print(f"{PROG}: stopped: {stopped}; report: {path}", file=sys.stderr)
        elif failed:
            print(
                f"{PROG}: {len(failed)} step(s) failed ({', '.join(failed)}); the same command "
                f"retries them; report: {path}",
                file=sys.stderr,
            )
    print(path)  # a reader gone away: BrokenPipeError, exit 141 (the report is written)
    sys.stdout.flush()
    if interrupted:
        return 130
    if cannot_run:
        return 2
    return 1 if (failed or stopped) else 0
