"""``bench serve``: an A/B serving benchmark around vLLM's own ``vllm serve`` and
``vllm bench serve``, with the original change's methodology.

Each arm gets a fresh server (``VLLM_ROCM_USE_AITER=1 vllm serve <model> --kv-cache-dtype
fp8 --max-model-len 40960 --gpu-memory-utilization 0.85``), waits for ``/health``, runs
``vllm bench serve`` (random dataset, 1024 in / 1024 out, ``--ignore-eos``; or, with
``--dataset sharegpt --dataset-path FILE``, vLLM's ShareGPT run: chat-like lengths, whose
mixed prefill+decode steps the plugin splits) at each concurrency with
``--save-result``, and stops the server. Arms alternate across repeats. The server is
stopped on every path out (failure, crash, Ctrl-C) and the results saved so far are kept
and reported; a second Ctrl-C while a server stops kills its process group at once.

Each server's log is read once it is healthy to confirm the arm: the asm-decode arm must
log the plugin's registration and its "N of M layers eligible" line with N > 0, the
baseline the plugin's "inactive" line with its switch. A run whose arm cannot be
confirmed (the lines are missing, e.g. under a logging configuration of the user's own)
is reported as unconfirmed; logging settings that would hide them are refused first.
"""

from __future__ import annotations

import contextlib
import json
import math
import os
import re
import signal
import socket
import stat
import statistics
import subprocess
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Iterator, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from ..stopping import stopped_by

#: Environment of each arm on top of ``VLLM_ROCM_USE_AITER=1``.
ARM_ENV = {
    "plugin-off": {"VLLM_ROCM_ASM_DECODE": "0"},
    "mha-off": {"VLLM_ROCM_USE_AITER_MHA": "0"},
    "asm-decode": {},
}
CANDIDATE = "asm-decode"
DEFAULT_CONCURRENCIES = (1, 8, 16, 64, 128)
DEFAULT_NUM_PROMPTS = (8, 32, 64, 256, 256)
#: A run whose p99 ITL exceeds this multiple of the median of the other runs at the same
#: concurrency is flagged (host stalls) and left out of the means.
OUTLIER_FACTOR = 3.0
DATASETS = ("random", "sharegpt")
#: What each baseline's server logs when the plugin stays out of the way.
BASELINE_SWITCH = {"plugin-off": "VLLM_ROCM_ASM_DECODE=0", "mha-off": "VLLM_ROCM_USE_AITER_MHA=0"}
#: The baseline arms: the plugin switched off, or vLLM's AITER MHA off (the original's).
BASELINES = tuple(BASELINE_SWITCH)
_ELIGIBLE = re.compile(r"ROCM_ATTN asm decode: (\d+) of (\d+) layers eligible")


#: How often a starting server's /health is asked.
HEALTH_POLL_SECONDS = 0.5


class ServeError(RuntimeError):
    """A run that could not complete; the message says what happened."""


#: ``vllm serve`` options the harness sets itself, each with the ``bench serve`` option
#: that sets it (None: fixed by the harness).
OWNED_SERVE_OPTIONS = {
    "--model": "--model",  # given to vllm serve as its positional model
    "--kv-cache-dtype": None,
    "--host": "--host",
    "--port": "--port",
    "--max-model-len": "--max-model-len",
    "--gpu-memory-utilization": "--gpu-memory-utilization",
    "--tensor-parallel-size": "--tensor-parallel-size",
    "-tp": "--tensor-parallel-size",
    "--served-model-name": None,  # the client asks for the model by --model's name
}
#: Why the harness fixes an option no ``bench serve`` option sets (default: both arms).
_FIXED_BECAUSE = {"--served-model-name": "its client asks for the model by --model's name"}


def _option_name(arg: str) -> str:
    """The option ``arg`` names as vLLM reads it (``--a_b=v`` and ``--a_b v`` as
    ``--a-b``); its first word when it is no option."""
    head = arg.strip().split("=", 1)[0].split()[0] if arg.strip() else ""
    return head if not head.startswith("--") else "--" + head[2:].replace("_", "-")


#: ``vllm serve``'s logging options (0.33): the arms are confirmed from their servers'
#: INFO lines, which these could hide (``--logging-config.log_level`` included).
LOGGING_SERVE_OPTIONS = ("--log-level", "--logging-config", "--log-config-file")


def logging_serve_option(arg: str) -> str | None:
    """The ``vllm serve`` logging option ``arg`` sets or may set (a prefix of one, as
    vLLM's parser reads it, or a dotted field of ``--logging-config``); None otherwise."""
    name = _option_name(arg)
    if name.startswith("--logging-config."):
        return "--logging-config"
    if not name.startswith("--log"):
        return None
    return next((o for o in LOGGING_SERVE_OPTIONS if o.startswith(name)), None)


def owned_serve_option(arg: str) -> str | None:
    """The harness-owned ``vllm serve`` option ``arg`` sets, if it may set one. vLLM
    reads ``--a_b`` as ``--a-b`` and ``--a=v`` as ``--a v``, and its parser (argparse,
    abbreviations allowed) takes a prefix of an option for the option: ``--po`` or
    ``--max-model`` may set ``--port`` or ``--max-model-len``, ``-t`` sets ``-tp``. No
    ``vllm serve`` option of 0.33 is itself a prefix of one of these."""
    name = _option_name(arg)
    if name in OWNED_SERVE_OPTIONS:
        return name
    if not re.fullmatch(r"--[^-].*|-[^-]", name):
        return None
    return next((o for o in OWNED_SERVE_OPTIONS if o.startswith(name)), None)


def sharegpt_problem(path: Path) -> str | None:
    """Why ``path`` is not a ShareGPT JSON file (a JSON list whose entries hold a
    ``conversations`` list), as a phrase after the path, judged on its first entry
    (ShareGPT files run to hundreds of MB); None when it looks like one."""
    decoder = json.JSONDecoder()
    try:
        with open(path, encoding="utf-8") as f:
            text = f.read(1 << 20)
            if text.startswith("\ufeff"):  # vLLM's loader (json.load) refuses it too
                return "starts with a byte-order mark (U+FEFF), which vLLM's JSON reading refuses"
            start = len(text) - len(text.lstrip())
            if text[start : start + 1] != "[":
                if not text.strip():
                    return "is empty, not a JSON list"
                try:  # JSON of another kind, or none (judged where it was read whole)
                    decoder.raw_decode(text, start)
                except json.JSONDecodeError as exc:
                    if len(text) < 1 << 20:
                        why, at = exc.msg.removesuffix(" at"), _byte_offset(text, exc.pos)
                        return f"is not JSON ({why} at byte offset {at})"
                return "is not a JSON list"
            rest = text[start + 1 :].lstrip()
            skipped = len(text) - len(rest)  # characters before the first entry
            if rest.startswith("]"):
                return "is an empty JSON list"
            while True:
                try:
                    first, _ = decoder.raw_decode(rest)
                    break
                except json.JSONDecodeError as exc:
                    more = f.read(1 << 22)
                    if not more or len(rest) > 1 << 26:
                        read = text[:skipped] + rest
                        nul = read.find("\0", 0, skipped + exc.pos + 1)
                        if nul >= 0:  # say what the decoder stumbled on
                            return f"has a NUL byte at byte offset {_byte_offset(read, nul)}"
                        at = _byte_offset(read, skipped + exc.pos)
                        why = exc.msg.removesuffix(" at")
                        return f"is not JSON ({why} at byte offset {at}, in its first entry)"
                    rest += more
    except (OSError, UnicodeDecodeError) as exc:
        return f"cannot be read ({exc})"
    if not isinstance(first, dict) or not isinstance(first.get("conversations"), list):
        return "has no 'conversations' list in its first entry"
    return None


def _byte_offset(text: str, index: int) -> int:
    """The byte offset in the UTF-8 file of character ``index`` of its ``text``."""
    return len(text[:index].encode("utf-8", "surrogatepass"))


def file_problem(path: Path) -> str | None:
    """Why ``path`` is not a regular file to read, as a phrase after it; None when it
    is one (a FIFO, a device or /dev/null is not)."""
    try:
        info = path.stat()
    except FileNotFoundError:
        return "does not exist"
    except OSError as exc:
        return f"cannot be read ({exc.strerror or exc})"
    if stat.S_ISDIR(info.st_mode):
        return "is a directory"
    if not stat.S_ISREG(info.st_mode):
        return "is not a regular file (a FIFO, a device or /dev/null); give the JSON file"
    return None


def dataset_problem(dataset: str, dataset_path: str | Path | None) -> str | None:
    """Why ``--dataset`` and ``--dataset-path`` cannot make a run, in one line, judged on
    what the path is (a ShareGPT file's text is :func:`sharegpt_problem`'s); None when
    they can. ``bench serve`` says it before judging its result paths: a result directory
    inside a --dataset-path that is a directory is not the mistake to name."""
    if dataset not in DATASETS:
        return f"--dataset {dataset!r}: use random or sharegpt"
    if dataset == "sharegpt" and dataset_path is None:
        return "--dataset sharegpt needs --dataset-path FILE, a ShareGPT JSON file"
    if dataset != "sharegpt" and dataset_path is not None:
        return (
            f"--dataset-path {dataset_path} is read only with --dataset sharegpt "
            f"(the {dataset} dataset has no file)"
        )
    if dataset_path is not None and (what := file_problem(Path(dataset_path))):
        return f"--dataset-path {dataset_path} {what}"
    return None


#: The random dataset's prompt and output tokens unless --input-len/--output-len say.
RANDOM_LEN = 1024


@dataclass
class ServeConfig:
    model: str
    baseline: str = "plugin-off"
    tensor_parallel_size: int = 1
    concurrencies: Sequence[int] = DEFAULT_CONCURRENCIES
    num_prompts: Sequence[int] = DEFAULT_NUM_PROMPTS
    repeats: int = 1
    host: str = "127.0.0.1"
    port: int = 8000
    input_len: int = RANDOM_LEN
    output_len: int = RANDOM_LEN
    max_model_len: int = 40960
    gpu_memory_utilization: float = 0.85
    result_dir: Path = Path("asm-decode-serve-results")
    vllm: str = "vllm"
    serve_args: Sequence[str] = ()
    health_timeout: float = 1800.0
    stop_timeout: float = 60.0
    dataset: str = "random"
    dataset_path: Path | None = None

    def __post_init__(self) -> None:
        if self.baseline not in BASELINES:
            raise ValueError(f"--baseline {self.baseline!r}: use plugin-off or mha-off")
        if why := dataset_problem(self.dataset, self.dataset_path):
            raise ValueError(why)
        if self.dataset == "sharegpt" and self.dataset_path is not None:
            why = sharegpt_problem(Path(self.dataset_path))
            if why:
                raise ValueError(f"--dataset-path {self.dataset_path} {why}")
        for arg in self.serve_args:
            owned = owned_serve_option(arg)
            if owned is not None:
                ours = OWNED_SERVE_OPTIONS[owned]
                read = "" if _option_name(arg) == owned else f"vLLM may read it as {owned}; "
                raise ValueError(
                    f"--serve-arg {arg}: {read}bench serve sets {owned} itself"
                    + (
                        f"; use bench serve's {ours}"
                        if ours
                        else f" ({_FIXED_BECAUSE.get(owned, 'both arms need it')})"
                    )
                )
            if logging_option := logging_serve_option(arg):
                raise ValueError(
                    f"--serve-arg {arg}: {logging_option} could hide the INFO lines of the "
                    "servers' logs that confirm each arm; for more, set VLLM_LOGGING_LEVEL=DEBUG"
                )
        if len(self.concurrencies) != len(self.num_prompts):
            raise ValueError(
                f"{len(self.concurrencies)} concurrencies but --num-prompts gives "
                f"{len(self.num_prompts)}; give one --num-prompts value per concurrency"
            )
        if self.repeats < 1:
            raise ValueError("--repeats must be at least 1")
        if self.dataset == "random" and self.input_len + self.output_len > self.max_model_len:
            raise ValueError(
                f"--max-model-len {self.max_model_len} is below a request's --input-len "
                f"{self.input_len} + --output-len {self.output_len} tokens: vLLM would "
                "refuse every request; raise it or shorten the requests"
            )


def arm_order(baseline: str, repeats: int) -> Iterator[tuple[int, str]]:
    """(repeat, arm) in run order, as the run reaches them: baseline first, then
    alternating."""
    for r in range(repeats):
        for arm in (baseline, CANDIDATE) if r % 2 == 0 else (CANDIDATE, baseline):
            yield r, arm


def arm_env(arm: str, base: dict[str, str] | None = None) -> dict[str, str]:
    env = dict(os.environ if base is None else base)
    for overrides in ARM_ENV.values():  # an arm's switches never leak into another
        for key in overrides:
            env.pop(key, None)
    env["VLLM_ROCM_USE_AITER"] = "1"
    env.update(ARM_ENV[arm])
    return env


def serve_command(cfg: ServeConfig) -> list[str]:
    cmd = [
        cfg.vllm, "serve", cfg.model,
        "--kv-cache-dtype", "fp8",
        "--max-model-len", str(cfg.max_model_len),
        "--gpu-memory-utilization", str(cfg.gpu_memory_utilization),
        "--host", cfg.host, "--port", str(cfg.port),
    ]  # fmt: skip
    if cfg.tensor_parallel_size != 1:
        cmd += ["--tensor-parallel-size", str(cfg.tensor_parallel_size)]
    return cmd + list(cfg.serve_args)


def result_name(arm: str, repeat: int, concurrency: int) -> str:
    return f"{arm}-r{repeat}-c{concurrency}.json"


#: The names of the files a run writes in its --result-dir: vLLM's result of each arm,
#: repeat and concurrency (:func:`result_name`), and each server's log.
OWN_FILE = re.compile(r"[^/]+-r\d+-c\d+\.json|server-[^/]+-r\d+\.log")


def earlier_run_files(result_dir: str | Path) -> list[str]:
    """The names in ``result_dir`` that a run gives its own files (:data:`OWN_FILE`),
    sorted: an earlier run's, which a new run would partly replace and partly leave
    beside its own. Empty where the directory is not there or cannot be listed."""
    try:
        names = os.listdir(result_dir)
    except OSError:
        return []
    return sorted(name for name in names if OWN_FILE.fullmatch(name))


def bench_command(cfg: ServeConfig, concurrency: int, num_prompts: int, name: str) -> list[str]:
    if cfg.dataset == "sharegpt":
        dataset = ["--dataset-name", "sharegpt", "--dataset-path", str(cfg.dataset_path)]
    else:
        dataset = [
            "--dataset-name", "random",
            "--random-input-len", str(cfg.input_len),
            "--random-output-len", str(cfg.output_len),
            "--ignore-eos",
        ]  # fmt: skip
    return [
        cfg.vllm, "bench", "serve",
        "--backend", "vllm", "--model", cfg.model,
        "--host", cfg.host, "--port", str(cfg.port),
        *dataset,
        "--max-concurrency", str(concurrency),
        "--num-prompts", str(num_prompts),
        "--save-result", "--result-dir", str(cfg.result_dir), "--result-filename", name,
    ]  # fmt: skip


@dataclass
class ArmCheck:
    """What one server's log says about its arm."""

    arm: str
    repeat: int
    confirmed: bool
    detail: str


def confirm_arm(arm: str, log_text: str) -> tuple[bool, str]:
    """Whether a server's log shows its arm: the asm decode on (registered, some layer
    eligible) for the candidate, the plugin inactive by its switch for a baseline."""
    if arm == CANDIDATE:
        if "ROCM_ATTN asm decode plugin registered" not in log_text:
            return False, "no 'ROCM_ATTN asm decode plugin registered' line in the log"
        counts = _ELIGIBLE.findall(log_text)
        if not counts:
            return False, "no 'layers eligible' line in the log"
        eligible, total = (int(x) for x in counts[-1])  # the last: the real KV cache
        if not eligible:
            return False, f"0 of {total} layers eligible: the asm decode never ran"
        return True, f"asm decode on: {eligible} of {total} layers eligible"
    switch = BASELINE_SWITCH[arm]
    if f"ROCM_ATTN asm decode plugin inactive: {switch}" in log_text:
        return True, f"asm decode off ({switch})"
    if "ROCM_ATTN asm decode plugin registered" in log_text:
        return False, f"the plugin registered although {switch} was set"
    return False, "no 'ROCM_ATTN asm decode plugin inactive' line in the log"


def host_problem(host: str, port: int) -> str | None:
    """Why ``--host`` names no address for the servers (it does not resolve), in one
    line; None when it resolves."""
    try:
        socket.getaddrinfo(host, port)
    except (OSError, UnicodeError) as exc:  # UnicodeError: a name label over 63 bytes
        return f"--host {host!r} does not resolve ({getattr(exc, 'strerror', None) or exc})"
    return None


def listen_problem(host: str, port: int) -> str | None:
    """Why a server could not listen on ``host:port`` (something holds it, or the host
    is not this machine's), in the address family of the host (IPv6 for ``::1``); None
    when it can."""
    try:
        family, kind, proto, _, address = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)[0]
        with socket.socket(family, kind, proto) as probe:
            probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            probe.bind(address)
    except (OSError, UnicodeError) as exc:  # UnicodeError: a name label over 63 bytes
        return getattr(exc, "strerror", None) or str(exc)
    return None


def port_in_use(host: str, port: int) -> bool:
    return listen_problem(host, port) is not None


def url_host(host: str) -> str:
    """``host`` as a URL writes it (an IPv6 address in brackets)."""
    return f"[{host}]" if ":" in host and not host.startswith("[") else host


#: A Python exception's last line in a server log, after whatever prefix the logger put
#: before it ("(EngineCore pid=7) RuntimeError: Failed to infer device type").
_EXCEPTION_LINE = re.compile(r"\b([A-Z]\w*(?:Error|Exception)): (\S.*)$")
#: A terminal's colour and cursor codes, which vLLM's logger may write.
_TERMINAL_CODES = re.compile(r"\x1b\[[0-9;?]*[A-Za-z]")


#: What vLLM raises where it finds no platform to run on (``DeviceConfig``).
_NO_DEVICE = "Failed to infer device type"


def last_error(log: str, limit: int = 240) -> str | None:
    """What the last exception a server logged says ("RuntimeError: ..."): the line that
    tells why it exited, shortened to ``limit`` characters; None when it logged none."""
    for line in reversed(log.splitlines()):
        if found := _EXCEPTION_LINE.search(_TERMINAL_CODES.sub("", line)):
            said = f"{found.group(1)}: {found.group(2).strip()}"
            return said if len(said) <= limit else said[: limit - 3] + "..."
    return None


class Server:
    """One ``vllm serve`` process group; always stopped by :meth:`stop`."""

    def __init__(self, cfg: ServeConfig, arm: str, log_path: Path) -> None:
        self.cfg, self.arm, self.log_path = cfg, arm, log_path
        self.proc: subprocess.Popen[bytes] | None = None

    def start(self) -> None:
        if why := listen_problem(self.cfg.host, self.cfg.port):
            raise ServeError(f"cannot listen on {self.cfg.host} port {self.cfg.port}: {why}")
        try:
            self.log_path.parent.mkdir(parents=True, exist_ok=True)
            with self.log_path.open("wb") as log:
                self.proc = subprocess.Popen(
                    serve_command(self.cfg),
                    env=arm_env(self.arm),
                    stdout=log,
                    stderr=subprocess.STDOUT,
                    start_new_session=True,
                )
        except OSError as exc:
            raise ServeError(
                f"cannot start {self.cfg.vllm} serve (log {self.log_path}): {exc.strerror or exc}"
            ) from None

    def alive(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def log_text(self) -> str:
        try:
            return self.log_path.read_text(errors="replace")
        except OSError:
            return ""

    def wait_healthy(self) -> None:
        url = f"http://{url_host(self.cfg.host)}:{self.cfg.port}/health"
        deadline = time.monotonic() + self.cfg.health_timeout
        while time.monotonic() < deadline:
            if not self.alive():
                code = self.proc.returncode if self.proc else None
                why = last_error(self.log_text())
                if why and _NO_DEVICE in why:  # vLLM's words for a machine without a GPU
                    why = f"vLLM found no GPU on this machine ({_NO_DEVICE}), where it serves"
                raise ServeError(
                    f"{self.arm} server exited with code {code} before /health answered"
                    + (f": {why}" if why else "")
                    + f" (log: {self.log_path})"
                )
            try:
                with urllib.request.urlopen(url, timeout=2) as response:
                    if response.status == 200:
                        return
            except (urllib.error.URLError, OSError):
                pass
            time.sleep(HEALTH_POLL_SECONDS)
        raise ServeError(
            f"{self.arm} server did not answer /health within {self.cfg.health_timeout:g} s "
            f"(log: {self.log_path})"
        )

    def stop(self, note: Callable[[str], None] | None = None) -> bool:
        """Stop the server's process group: SIGINT, then SIGTERM, then SIGKILL, each
        given its time (:func:`stop_process_group`). Returns whether a Ctrl-C came
        meanwhile; never raises one."""
        if self.proc is None:
            return False
        wait = self.cfg.stop_timeout

        def announce() -> None:
            if note is not None:
                note(
                    f"== stopping the {self.arm} server (a second Ctrl-C or SIGTERM kills "
                    f"it at once; else this command sends SIGTERM after {wait:g} s)"
                )

        steps = ((signal.SIGINT, wait), (signal.SIGTERM, 10.0))
        return stop_process_group(self.proc, steps, announce)


def stop_process_group(
    proc: subprocess.Popen,
    steps: Sequence[tuple[int, float]],
    announce: Callable[[], None] = lambda: None,
) -> bool:
    """Stop ``proc``'s process group: each signal of ``steps`` given its seconds, then
    SIGKILL; ``announce`` first, if it is still running. A Ctrl-C while it waits skips
    to SIGKILL (the user wants out). Whatever is left of the group once ``proc`` is gone
    (workers it started) is killed too. Returns whether a Ctrl-C came meanwhile; never
    raises one."""
    interrupted = False
    steps = (*steps, (signal.SIGKILL, 10.0))
    step = 0
    while step < len(steps) and proc.poll() is None:
        sig, wait = steps[step]
        try:
            if step == 0:
                announce()
            os.killpg(proc.pid, sig)
            proc.wait(timeout=wait)
        except (ProcessLookupError, PermissionError):
            break
        except subprocess.TimeoutExpired:
            step += 1
        except KeyboardInterrupt:
            interrupted = True
            step = len(steps) - 1
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(proc.pid, signal.SIGKILL)
    return interrupted


@dataclass
class RunResult:
    arm: str
    repeat: int
    concurrency: int
    num_prompts: int
    output_throughput: float
    median_tpot_ms: float
    p99_itl_ms: float
    completed: int
    failed: int
    path: str
    outlier: bool = False


def parse_result(path: Path, arm: str, repeat: int) -> RunResult:
    """One ``vllm bench serve --save-result`` file (vLLM 0.33's format)."""
    try:
        data = json.loads(path.read_text())
    except FileNotFoundError:
        raise ServeError(f"vllm bench serve wrote no result file {path}") from None
    except (OSError, UnicodeDecodeError, ValueError) as exc:
        raise ServeError(f"{path} is not a vllm bench serve result: {exc}") from None
    try:
        result = RunResult(
            arm=arm,
            repeat=repeat,
            concurrency=int(data["max_concurrency"]),
            num_prompts=int(data["num_prompts"]),
            output_throughput=float(data["output_throughput"]),
            median_tpot_ms=float(data["median_tpot_ms"]),
            p99_itl_ms=float(data["p99_itl_ms"]),
            completed=int(data["completed"]),
            failed=int(data.get("failed") or 0),
            path=str(path),
        )
    except KeyError as exc:
        raise ServeError(f"{path} is not a vllm bench serve result: no {exc}") from None
    except (TypeError, ValueError) as exc:
        raise ServeError(f"{path} is not a vllm bench serve result: {exc}") from None
    figures = {n: getattr(result, n) for n in ("output_throughput", "median_tpot_ms", "p99_itl_ms")}
    if bad := [f"{name} {value}" for name, value in figures.items() if not math.isfinite(value)]:
        raise ServeError(f"{path} is not a vllm bench serve result: {', '.join(bad)}")
    if result.failed:  # the throughput of a run that lost requests measures nothing
        raise ServeError(
            f"{result.failed} of {result.failed + result.completed} requests failed in the "
            f"{arm} arm at concurrency {result.concurrency} ({path}; the server's log says "
            "why): a run with failed requests is no measurement"
        )
    return result


def flag_outliers(results: list[RunResult], factor: float = OUTLIER_FACTOR) -> list[RunResult]:
    """Mark runs whose p99 ITL is over ``factor`` x the median of the other runs at the
    same concurrency (both arms); returns the flagged runs."""
    flagged = []
    for r in results:
        others = [o.p99_itl_ms for o in results if o.concurrency == r.concurrency and o is not r]
        if others and r.p99_itl_ms > factor * statistics.median(others):
            r.outlier = True
            flagged.append(r)
    return flagged


@dataclass
class Row:
    concurrency: int
    baseline_tok_s: float | None
    candidate_tok_s: float | None
    change_pct: float | None
    baseline_tpot_ms: float | None
    candidate_tpot_ms: float | None
    baseline_p99_itl_ms: float | None
    candidate_p99_itl_ms: float | None
    runs: dict[str, int] = field(default_factory=dict)


def summarize(results: list[RunResult], baseline: str) -> list[Row]:
    """Means over the non-outlier runs of each arm, per concurrency."""
    rows = []
    for c in sorted({r.concurrency for r in results}):

        def mean(arm: str, attr: str, c: int = c) -> float | None:
            vals = [
                getattr(r, attr)
                for r in results
                if r.concurrency == c and r.arm == arm and not r.outlier
            ]
            return statistics.fmean(vals) if vals else None

        base, cand = mean(baseline, "output_throughput"), mean(CANDIDATE, "output_throughput")
        rows.append(
            Row(
                concurrency=c,
                baseline_tok_s=base,
                candidate_tok_s=cand,
                change_pct=(cand / base - 1) * 100 if base and cand else None,
                baseline_tpot_ms=mean(baseline, "median_tpot_ms"),
                candidate_tpot_ms=mean(CANDIDATE, "median_tpot_ms"),
                baseline_p99_itl_ms=mean(baseline, "p99_itl_ms"),
                candidate_p99_itl_ms=mean(CANDIDATE, "p99_itl_ms"),
                runs={
                    arm: sum(
                        1 for r in results if r.concurrency == c and r.arm == arm and not r.outlier
                    )
                    for arm in (baseline, CANDIDATE)
                },
            )
        )
    return rows


def _f(value: float | None, fmt: str = "{:.0f}") -> str:
    return "—" if value is None else fmt.format(value)


def render(
    rows: list[Row],
    results: list[RunResult],
    baseline: str,
    model: str,
    arms: Sequence[ArmCheck] = (),
) -> str:
    lines = [
        f"{model}: output tok/s, {baseline} -> {CANDIDATE} (mean over runs; outliers left out)",
        "",
        "| concurrency | output tok/s | change | median TPOT ms | p99 ITL ms | runs |",
        "|---|---|---|---|---|---|",
    ]
    for r in rows:
        change = "—" if r.change_pct is None else f"{r.change_pct:+.1f}%"
        lines.append(
            f"| {r.concurrency} | {_f(r.baseline_tok_s)} -> {_f(r.candidate_tok_s)} | {change} "
            f"| {_f(r.baseline_tpot_ms, '{:.2f}')} -> {_f(r.candidate_tpot_ms, '{:.2f}')} "
            f"| {_f(r.baseline_p99_itl_ms, '{:.1f}')} -> {_f(r.candidate_p99_itl_ms, '{:.1f}')} "
            f"| {r.runs.get(baseline, 0)} / {r.runs.get(CANDIDATE, 0)} |"
        )
    for r in results:
        if r.outlier:
            lines.append(
                f"outlier left out: {r.arm} repeat {r.repeat} concurrency {r.concurrency}: "
                f"p99 ITL {r.p99_itl_ms:.1f} ms ({r.path})"
            )
    for a in arms:
        state = "confirmed" if a.confirmed else "UNCONFIRMED"
        lines.append(f"{a.arm} repeat {a.repeat}: {state}: {a.detail}")
    return "\n".join(lines)


@dataclass
class Outcome:
    results: list[RunResult]
    error: str | None = None
    interrupted: bool = False
    arms: list[ArmCheck] = field(default_factory=list)

    def to_json(self) -> dict[str, Any]:
        return {
            "results": [asdict(r) for r in self.results],
            "arms": [asdict(a) for a in self.arms],
            "error": self.error,
            "interrupted": self.interrupted,
        }


def run_bench_client(cmd: list[str]) -> int:
    """``vllm bench serve`` in a session of its own, so that a Ctrl-C at the terminal
    reaches this command alone: interrupted, it stops the client first, quietly
    (SIGTERM, then SIGKILL after 10 s or at a second Ctrl-C), where the terminal's
    SIGINT would have the client print its own traceback of it."""
    proc = subprocess.Popen(cmd, start_new_session=True)
    try:
        return proc.wait()
    finally:
        if proc.returncode is None:
            stop_process_group(proc, ((signal.SIGTERM, 10.0),))
            proc.wait()


def run_ab(
    cfg: ServeConfig,
    bench: Callable[[list[str]], int] = run_bench_client,
    log: Callable[[str], None] = print,
) -> Outcome:
    """Every arm and concurrency; stops at the first failure, keeping what was saved.
    The server of each arm is stopped on every path out, a Ctrl-C (even one while it
    stops) included; it returns, never raising the Ctrl-C."""
    outcome = Outcome(results=[])
    try:
        cfg.result_dir.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        outcome.error = f"cannot make --result-dir {cfg.result_dir}: {exc.strerror or exc}"
        return outcome
    for repeat, arm in arm_order(cfg.baseline, cfg.repeats):
        server = Server(cfg, arm, cfg.result_dir / f"server-{arm}-r{repeat}.log")
        try:
            log(f"== {arm} (repeat {repeat}): starting {' '.join(serve_command(cfg))}")
            server.start()
            server.wait_healthy()
            confirmed, detail = confirm_arm(arm, server.log_text())
            outcome.arms.append(ArmCheck(arm, repeat, confirmed, detail))
            log(f"== {arm} (repeat {repeat}): {'' if confirmed else 'UNCONFIRMED: '}{detail}")
            for c, n in zip(cfg.concurrencies, cfg.num_prompts, strict=True):
                name = result_name(arm, repeat, c)
                code = bench(bench_command(cfg, c, n, name))
                if not server.alive():
                    raise ServeError(
                        f"{arm} server died during concurrency {c} (log: {server.log_path})"
                    )
                if code != 0:
                    raise ServeError(f"vllm bench serve exited with {code} at concurrency {c}")
                outcome.results.append(parse_result(cfg.result_dir / name, arm, repeat))
        except ServeError as exc:
            outcome.error = str(exc)
        except KeyboardInterrupt:  # Ctrl-C, or SIGTERM (stopping.Terminated)
            outcome.interrupted = True
            outcome.error = stopped_by()
        finally:
            # said where the stop may take its while: a failure or a Ctrl-C cut it short
            if server.stop(log if outcome.interrupted or outcome.error else None):
                outcome.interrupted = True
                outcome.error = outcome.error or stopped_by()
        if outcome.error is not None:
            return outcome
    return outcome
