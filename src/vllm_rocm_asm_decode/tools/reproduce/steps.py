"""The steps of a reproduction, in run order, for the full protocol and for ``--quick``."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from ..validation import serve_bench as sb

BASELINE = "plugin-off"
CANDIDATE = sb.CANDIDATE
ARMS = (BASELINE, CANDIDATE)
QUICK_CONCURRENCIES = (1, 64, 128)
QUICK_PROMPTS = (8, 256, 256)
SHAREGPT_CONCURRENCIES = (64, 128)
SHAREGPT_PROMPTS = (256, 256)
#: The original's passkey lengths and load (from its data would be the same numbers;
#: these are the protocol, the data holds the result).
PASSKEY_PROMPTS = 24
PASSKEY_IN_FLIGHT = 30
#: The sweep's layout and context: where the original timed asm forced below the cut.
SWEEP_HEADS, SWEEP_CONTEXT = "40/8", 4096


@dataclass(frozen=True)
class Settings:
    """What a reproduction is of: a rerun into the same ``--out`` must match it."""

    model: str
    tp: int = 1
    quick: bool = False
    dataset: str | None = None

    def to_json(self) -> dict[str, Any]:
        return {"model": self.model, "tp": self.tp, "quick": self.quick, "dataset": self.dataset}

    def describe(self) -> str:
        words = [f"--model {self.model}", f"--tp {self.tp}"]
        if self.quick:
            words.append("--quick")
        if self.dataset:
            words.append(f"--dataset {self.dataset}")
        return " ".join(words)


@dataclass
class Step:
    name: str
    title: str
    kind: str
    #: Seconds on an MI355X with an 8B-14B model, a guess for the ETA only.
    estimate_s: float
    options: dict[str, Any] = field(default_factory=dict)
    #: A failure stops the run (doctor).
    gate: bool = False


def plan(settings: Settings) -> list[Step]:
    """Every step of this reproduction, in order."""
    quick = settings.quick
    steps = [
        Step("doctor", "doctor: environment and GPU self-test", "doctor", 90, gate=True),
        Step(
            "kernel-table", "kernel time at the original shapes", "kernel", 120, {"mode": "table"}
        ),
        Step(
            "kernel-skew",
            "kernel time, one long sequence among short",
            "kernel",
            120,
            {"mode": "skew"},
        ),
        Step(
            "kernel-sweep",
            "kernel time by batch size: the crossover",
            "kernel",
            90,
            {"mode": "sweep"},
        ),
    ]
    concurrencies = QUICK_CONCURRENCIES if quick else sb.DEFAULT_CONCURRENCIES
    prompts = QUICK_PROMPTS if quick else sb.DEFAULT_NUM_PROMPTS
    repeats = 1 if quick else 2
    steps.append(
        Step(
            "serve-random",
            f"serving A/B, random 1024/1024 at concurrency {'/'.join(map(str, concurrencies))}",
            "serve",
            repeats * 2 * (200 + 60 * len(concurrencies)),
            {
                "dataset": "random",
                "concurrencies": concurrencies,
                "prompts": prompts,
                "repeats": repeats,
            },
        )
    )
    if settings.dataset:
        steps.append(
            Step(
                "serve-sharegpt",
                "serving A/B, ShareGPT lengths at concurrency 64/128",
                "serve",
                2 * (200 + 120),
                {
                    "dataset": "sharegpt",
                    "concurrencies": SHAREGPT_CONCURRENCIES,
                    "prompts": SHAREGPT_PROMPTS,
                    "repeats": 1,
                },
            )
        )
    for arm in ARMS:
        steps.append(
            Step(
                f"accuracy-{arm}",
                f"GSM8K and passkey, {arm} server",
                "accuracy",
                200 + 360 + 90,
                {"arm": arm, "gsm8k": True, "passkey": True, "eager": False},
            )
        )
    if not quick:
        for suffix, eager in (("2", False), ("eager", True)):
            for arm in ARMS:
                steps.append(
                    Step(
                        f"gsm8k-{arm}-{suffix}",
                        f"GSM8K, {arm} server" + (" (--enforce-eager)" if eager else ", again"),
                        "accuracy",
                        200 + (900 if eager else 360),
                        {"arm": arm, "gsm8k": True, "passkey": False, "eager": eager},
                    )
                )
    steps.append(
        Step(
            "sync-check",
            "asm arm under VLLM_GPU_SYNC_CHECK=error"
            + (": GSM8K" if quick else ": GSM8K and five concurrencies"),
            "sync",
            200 + 360 + (0 if quick else 300),
            {"arm": CANDIDATE, "serve": not quick},
        )
    )
    return steps


def names(settings: Settings) -> list[str]:
    return [s.name for s in plan(settings)]
