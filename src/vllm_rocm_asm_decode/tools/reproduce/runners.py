"""What each kind of step runs: this package's own commands (``doctor``, ``bench
kernel``) as subprocesses, the serving A/B through ``bench serve``'s harness, and per
arm one fresh server for GSM8K (``lm_eval``), passkey retrieval and the sync check."""

from __future__ import annotations

import contextlib
import json
import os
import re
import subprocess
import sys
from collections.abc import Iterator
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from ..validation import passkey
from ..validation import serve_bench as sb
from ..validation.check import NO_VLLM
from . import gsm8k
from .steps import BASELINE, PASSKEY_IN_FLIGHT, PASSKEY_PROMPTS, SWEEP_CONTEXT, SWEEP_HEADS, Step

#: vLLM reads this and arms torch's sync debug mode in every worker.
SYNC_CHECK_ENV = "VLLM_GPU_SYNC_CHECK"
#: What a worker's log shows when the check catches a synchronization: vLLM 0.33's error
#: (vllm/utils/gpu_sync_debug.py) or torch's own sync-debug warning.
SYNC_REPORTED = re.compile(r"GPU<->CPU sync detected|called a synchronizing (CUDA|HIP) operation")


class StepError(RuntimeError):
    """A step that ran and failed; ``result`` keeps what it measured before, and
    ``cannot_run`` says the machine, not the step, is at fault (no AMD GPU or AITER)."""

    def __init__(
        self, message: str, result: dict[str, Any] | None = None, *, cannot_run: bool = False
    ) -> None:
        super().__init__(message)
        self.result = result or {}
        self.cannot_run = cannot_run


@dataclass
class Tools:
    """The executables a reproduction runs."""

    vllm: str = "vllm"
    lm_eval: str = "lm_eval"
    #: The command that runs this package's ``doctor`` and ``bench kernel``.
    gpu_tools: list[str] = field(
        default_factory=lambda: [sys.executable, "-m", "vllm_rocm_asm_decode.tools.cli"]
    )
    host: str = "127.0.0.1"
    port: int = 8000
    health_timeout: float = 1800.0


@dataclass
class Context:
    model: str
    tp: int
    dataset: str | None
    tools: Tools
    #: The step's files directory (emptied before the step runs).
    files: Path = Path()
    passkey_lengths: tuple[int, ...] = ()


def run(step: Step, ctx: Context) -> dict[str, Any]:
    """The step's figures; raises :class:`StepError` (or KeyboardInterrupt)."""
    kind = {
        "doctor": doctor,
        "kernel": kernel,
        "serve": serve,
        "accuracy": accuracy,
        "sync": sync_check,
    }[step.kind]
    return kind(step, ctx)


def _last_line(text: str) -> str:
    lines = [line.strip() for line in text.strip().splitlines() if line.strip()]
    return lines[-1] if lines else ""


def _tool(ctx: Context, args: list[str], name: str) -> tuple[int, str, str]:
    """Run one of this package's commands; its stdout and stderr are kept in files."""
    cmd = [*ctx.tools.gpu_tools, *args]
    try:
        proc = subprocess.run(cmd, capture_output=True, text=True, check=False)
    except OSError as exc:
        raise StepError(f"cannot run {cmd[0]}: {exc.strerror or exc}") from None
    (ctx.files / f"{name}.stdout").write_text(proc.stdout)
    (ctx.files / f"{name}.stderr").write_text(proc.stderr)
    return proc.returncode, proc.stdout, proc.stderr


def doctor(step: Step, ctx: Context) -> dict[str, Any]:
    code, out, err = _tool(ctx, ["doctor", "--json"], "doctor")
    try:
        report = json.loads(out)
    except ValueError:
        report = None
    if not isinstance(report, dict):
        said = _last_line(err) or (
            f"its output is not a JSON object ({_last_line(out)[:80]!r})" if out.strip() else ""
        )
        raise StepError(f"doctor exited with {code} without its JSON: {said or 'no output'}")
    failed = [f"{c['name']}: {c['detail']}" for c in report.get("checks", []) if not c.get("ok")]
    result = {
        "exit_code": code,
        "vllm_version": report.get("vllm_version"),
        "aiter_version": report.get("aiter_version"),
        "gpu": report.get("gpu"),
        "scale_tables": report.get("scale_tables"),
        "self_test": report.get("self_test"),
        "checks": len(report.get("checks", [])),
        "failed_checks": failed,
    }
    vllm_failed = [f for f in failed if f.startswith("vllm: ")]
    if code == 2 and vllm_failed and report.get("self_test") == NO_VLLM:
        raise StepError(f"doctor exited with 2: FAIL {vllm_failed[0]}", result, cannot_run=True)
    if code == 2:  # doctor's GPU self-test cannot run on this machine
        raise StepError(
            f"doctor exited with 2: self-test {report.get('self_test')}; reproduce needs a "
            "gfx942/gfx950 GPU with AITER",
            result,
            cannot_run=True,
        )
    if code != 0:
        why = failed[0] if failed else f"self-test {report.get('self_test')}"
        raise StepError(f"doctor exited with {code}: FAIL {why}", result)
    return result


def kernel(step: Step, ctx: Context) -> dict[str, Any]:
    path = ctx.files / "kernel.json"
    args = ["bench", "kernel", "--precision", "default", "--json", str(path)]
    mode = step.options["mode"]
    if mode == "skew":
        args.append("--skew")
    elif mode == "sweep":
        args += ["--sweep", "--heads", SWEEP_HEADS, "--contexts", str(SWEEP_CONTEXT)]
    code, _, err = _tool(ctx, args, "bench-kernel")
    if code != 0:
        raise StepError(f"bench kernel exited with {code}: {_last_line(err) or 'no output'}")
    try:
        return json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError) as exc:
        raise StepError(f"bench kernel wrote no readable {path}: {exc}") from None


class _StepLog:
    """A step's progress lines, into its log file (the terminal shows the progress)."""

    def __init__(self, path: Path) -> None:
        self.path = path

    def __call__(self, line: str) -> None:
        with self.path.open("a", encoding="utf-8") as f:
            f.write(line + "\n")


def _config(ctx: Context, **kw: Any) -> sb.ServeConfig:
    base: dict[str, Any] = dict(
        model=ctx.model,
        baseline=BASELINE,
        tensor_parallel_size=ctx.tp,
        host=ctx.tools.host,
        port=ctx.tools.port,
        result_dir=ctx.files,
        vllm=ctx.tools.vllm,
        health_timeout=ctx.tools.health_timeout,
    )
    return sb.ServeConfig(**(base | kw))


def _bench_client(log: Path):
    def bench(cmd: list[str]) -> int:
        with log.open("ab") as f:
            f.write(("$ " + " ".join(cmd) + "\n").encode())
            f.flush()
            return subprocess.run(cmd, stdout=f, stderr=subprocess.STDOUT, check=False).returncode

    return bench


def serve(step: Step, ctx: Context) -> dict[str, Any]:
    opts = step.options
    sharegpt = opts["dataset"] == "sharegpt"
    cfg = _config(
        ctx,
        concurrencies=tuple(opts["concurrencies"]),
        num_prompts=tuple(opts["prompts"]),
        repeats=opts["repeats"],
        dataset=opts["dataset"],
        dataset_path=Path(ctx.dataset) if sharegpt and ctx.dataset else None,
    )
    outcome = sb.run_ab(
        cfg, bench=_bench_client(ctx.files / "bench.log"), log=_StepLog(ctx.files / "step.log")
    )
    sb.flag_outliers(outcome.results)
    rows = sb.summarize(outcome.results, BASELINE)
    result = outcome.to_json() | {
        "summary": [vars(r) for r in rows],
        "concurrencies": list(cfg.concurrencies),
        "prompts": list(cfg.num_prompts),
        "repeats": cfg.repeats,
    }
    if outcome.interrupted:
        raise KeyboardInterrupt
    if outcome.error:
        raise StepError(outcome.error, result)
    unconfirmed = [
        f"{a.arm} repeat {a.repeat}: {a.detail}" for a in outcome.arms if not a.confirmed
    ]
    if unconfirmed:
        raise StepError("arm not confirmed from its server log: " + "; ".join(unconfirmed), result)
    return result


@contextlib.contextmanager
def _environment(extra: dict[str, str]) -> Iterator[None]:
    """``extra`` in os.environ while a server starts (its arm's environment is made from
    this process's)."""
    saved = {k: os.environ.get(k) for k in extra}
    os.environ.update(extra)
    try:
        yield
    finally:
        for k, v in saved.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v


def _thinking_off(model: str) -> list[str]:
    """Qwen3's chat template thinks unless told not to; the original turned it off."""
    if "qwen3" in model.lower():
        return ["--default-chat-template-kwargs", '{"enable_thinking": false}']
    return []


def _server_log(ctx: Context) -> Path:
    """Where a step's server writes its log (the sync check scans it, also after the
    server is gone)."""
    return ctx.files / "server.log"


@contextlib.contextmanager
def _server(
    ctx: Context, arm: str, eager: bool = False, env: dict[str, str] | None = None
) -> Iterator[sb.Server]:
    """A fresh server of ``arm``, healthy and confirmed, stopped on every way out (a
    Ctrl-C while it stops kills its process group and is raised after)."""
    serve_args = _thinking_off(ctx.model) + (["--enforce-eager"] if eager else [])
    cfg = _config(ctx, serve_args=serve_args)
    server = sb.Server(cfg, arm, _server_log(ctx))
    log = _StepLog(ctx.files / "step.log")
    interrupted = False
    try:
        log(f"== {arm}: starting {' '.join(sb.serve_command(cfg))}")
        with _environment(env or {}):
            server.start()
        server.wait_healthy()
        confirmed, detail = sb.confirm_arm(arm, server.log_text())
        log(f"== {arm}: {detail}")
        if not confirmed:
            raise StepError(f"{arm} server: arm not confirmed from its log: {detail}")
        yield server
    except sb.ServeError as exc:
        raise StepError(str(exc)) from None
    except KeyboardInterrupt:
        interrupted = True
        raise
    finally:
        if server.stop(log) and not interrupted:
            raise KeyboardInterrupt


def _base_url(ctx: Context) -> str:
    return f"http://{sb.url_host(ctx.tools.host)}:{ctx.tools.port}"


def _gsm8k(ctx: Context, server: sb.Server, result: dict[str, Any], name: str) -> None:
    try:
        result[name] = gsm8k.run(
            ctx.tools.lm_eval,
            ctx.model,
            _base_url(ctx),
            ctx.files / name,
            ctx.files / f"{name}.log",
        )
    except gsm8k.Gsm8kError as exc:
        raise StepError(f"GSM8K: {exc}", result) from None
    if not server.alive():
        raise StepError(f"the server died during GSM8K (log: {server.log_path})", result)


def accuracy(step: Step, ctx: Context) -> dict[str, Any]:
    opts = step.options
    result: dict[str, Any] = {"arm": opts["arm"], "eager": opts["eager"]}
    with _server(ctx, opts["arm"], eager=opts["eager"]) as server:
        if opts["gsm8k"]:
            _gsm8k(ctx, server, result, "gsm8k")
        if opts["passkey"]:
            prompts = passkey.make_prompts(ctx.passkey_lengths, PASSKEY_PROMPTS, 0)
            try:
                tally = passkey.score(
                    prompts,
                    lambda p: passkey.ask(_base_url(ctx), ctx.model, p, 600.0),
                    PASSKEY_IN_FLIGHT,
                )
            except passkey.ServerError as exc:
                raise StepError(f"passkey: {exc}", result) from None
            result["passkey"] = {str(n): tally.get(n, [0, 0]) for n in ctx.passkey_lengths}
            missed = [
                f"{n}: {ok}/{sent}" for n, (ok, sent) in result["passkey"].items() if ok < sent
            ]
            if missed:
                raise StepError("passkey missed at " + ", ".join(missed), result)
    return result


def sync_check(step: Step, ctx: Context) -> dict[str, Any]:
    """The asm arm's GSM8K (and serving) with the sync check armed. A synchronization in
    the server's log fails the step as one, also where it stopped the server (the check
    raises) or its start; a step that failed without one measured nothing of the claim."""
    result: dict[str, Any] = {"arm": step.options["arm"], "env": f"{SYNC_CHECK_ENV}=error"}
    try:
        _armed_work(step, ctx, result)
    except StepError as exc:
        _raise_if_a_sync_was_reported(ctx, result, exc)
        raise
    _raise_if_a_sync_was_reported(ctx, result)
    return result


def _raise_if_a_sync_was_reported(
    ctx: Context, result: dict[str, Any], failed: StepError | None = None
) -> None:
    try:
        log = _server_log(ctx).read_text(errors="replace")
    except OSError:
        return
    found = [line for line in log.splitlines() if SYNC_REPORTED.search(line)]
    if found:
        result |= (failed.result if failed else {}) | {"reported": found[:5]}
        why = f"a synchronization was reported: {found[0].strip()[:200]}"
        raise StepError(why + (f" ({failed})" if failed else ""), result)


def _armed_work(step: Step, ctx: Context, result: dict[str, Any]) -> None:
    arm, result["serve"] = step.options["arm"], []
    with _server(ctx, arm, env={SYNC_CHECK_ENV: "error"}) as server:
        _gsm8k(ctx, server, result, "gsm8k")
        if step.options["serve"]:
            cfg = _config(ctx)
            bench = _bench_client(ctx.files / "bench.log")
            for c, n in zip(cfg.concurrencies, cfg.num_prompts, strict=True):
                name = sb.result_name(arm, 0, c)
                code = bench(sb.bench_command(cfg, c, n, name))
                if code != 0 or not server.alive():
                    raise StepError(
                        f"vllm bench serve at concurrency {c}: exit {code}"
                        + ("" if server.alive() else f"; the server died (log: {server.log_path})"),
                        result,
                    )
                result["serve"].append(asdict(sb.parse_result(ctx.files / name, arm, 0)))
