"""GSM8K through ``lm_eval`` against a running server, with the original's settings:
1319 questions, 5-shot, the chat template with the shots as turns, greedy, 64 requests
in flight (so decode runs above the cut), ``local-chat-completions``."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path
from typing import Any

from . import environment

QUESTIONS = 1319
IN_FLIGHT = 64
TASK = "gsm8k"


class Gsm8kError(RuntimeError):
    """lm_eval did not give a GSM8K score; the message says why."""


def command(lm_eval: str, model: str, base_url: str, output: Path) -> list[str]:
    model_args = ",".join(
        (
            f"model={model}",
            f"base_url={base_url}/v1/chat/completions",
            f"num_concurrent={IN_FLIGHT}",
            "max_retries=3",
            "tokenized_requests=False",
        )
    )
    return [
        lm_eval,
        "--model",
        "local-chat-completions",
        "--model_args",
        model_args,
        "--tasks",
        TASK,
        "--num_fewshot",
        "5",
        "--apply_chat_template",
        "--fewshot_as_multiturn",
        "--gen_kwargs",
        "temperature=0",
        "--output_path",
        str(output),
    ]


def parse(output: Path) -> dict[str, Any]:
    """The GSM8K scores of the newest lm_eval results file under ``output``, and the
    version lm_eval wrote there of itself (``lm_eval_version``; None when the file names
    none, as older lm_evals', or names lm_eval's failure to look itself up)."""
    found = sorted(output.rglob("results_*.json"), key=lambda p: p.stat().st_mtime)
    if not found:
        raise Gsm8kError(f"lm_eval wrote no results_*.json under {output}")
    path = found[-1]
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
        scores = data["results"][TASK]
        flexible = float(scores["exact_match,flexible-extract"])
        strict = float(scores["exact_match,strict-match"])
    except (OSError, ValueError, KeyError, TypeError) as exc:
        raise Gsm8kError(f"{path} has no GSM8K exact_match scores ({exc!r})") from None
    samples = (data.get("n-samples") or {}).get(TASK) or {}
    questions = samples.get("effective", samples.get("original"))
    version = data.get("lm_eval_version")
    return {
        "flexible": flexible,
        "strict": strict,
        "questions": questions,
        "path": str(path),
        "lm_eval_version": version if environment.is_version(version) else None,
    }


def run(lm_eval: str, model: str, base_url: str, output: Path, log: Path) -> dict[str, Any]:
    """One GSM8K run; its output goes to ``log``."""
    output.mkdir(parents=True, exist_ok=True)
    cmd = command(lm_eval, model, base_url, output)
    with log.open("ab") as f:
        f.write(("$ " + " ".join(cmd) + "\n").encode())
        f.flush()
        try:
            code = subprocess.run(cmd, stdout=f, stderr=subprocess.STDOUT, check=False).returncode
        except OSError as exc:
            raise Gsm8kError(f"cannot run {lm_eval}: {exc.strerror or exc}") from None
    if code != 0:
        raise Gsm8kError(f"lm_eval exited with {code} (log: {log})")
    result = parse(output) | {"lm_eval": environment.executable_path(lm_eval)}
    if result["questions"] not in (None, QUESTIONS):
        raise Gsm8kError(f"lm_eval scored {result['questions']} questions, not GSM8K's {QUESTIONS}")
    return result
