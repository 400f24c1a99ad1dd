"""``reproduce``'s options, and what is judged of them before the first step runs: each
problem is one line (the command prints it and exits 2)."""

from __future__ import annotations

import argparse
import os
from collections.abc import Callable
from dataclasses import replace
from pathlib import Path

from .. import choices
from .steps import Settings, names

DEFAULT_OUT = "asm-decode-reproduce"


def add_parser(sub, documented: Callable[..., argparse.ArgumentParser]) -> None:
    """Register ``reproduce`` on the CLI's subparsers (``documented``: the CLI's maker
    of a subcommand whose --help shows its module's docstring)."""
    p = documented(
        sub,
        "reproduce",
        "the original change's whole validation in one command, and one report",
        "reproduce",
    )
    p.add_argument("--model", required=True, type=choices.nonempty, help="what vllm serve serves")
    p.add_argument(
        "--tp",
        "--tensor-parallel-size",
        "-tp",
        dest="tp",
        type=choices.positive_int,
        default=1,
        metavar="N",
        help="vllm serve's --tensor-parallel-size (default 1)",
    )
    p.add_argument(
        "--quick",
        action="store_true",
        help="the one-hour subset: concurrency 1/64/128 once, one GSM8K and passkey run "
        "per arm, the sync check with GSM8K only",
    )
    p.add_argument(
        "--out",
        type=choices.nonempty,
        default=DEFAULT_OUT,
        metavar="DIR",
        help="where results, logs and the report go; a rerun resumes there "
        f"(default {DEFAULT_OUT})",
    )
    p.add_argument(
        "--redo",
        type=_step_list,
        action="append",
        default=[],
        metavar="STEP[,STEP]",
        help="run these finished steps again (repeatable)",
    )
    p.add_argument(
        "--dataset",
        type=choices.nonempty,
        default=None,
        metavar="FILE",
        help="a ShareGPT JSON file: adds the mixed-length serving A/B (serve-sharegpt)",
    )
    p.add_argument(
        "--host",
        type=choices.nonempty,
        default="127.0.0.1",
        help="where the servers listen and the clients dial (default 127.0.0.1)",
    )
    p.add_argument(
        "--port", type=choices.port, default=8000, help="the servers' port (default 8000)"
    )
    p.add_argument(
        "--vllm",
        type=choices.nonempty,
        default="vllm",
        help="the vllm executable (default: vllm on PATH)",
    )
    p.add_argument(
        "--lm-eval",
        type=choices.nonempty,
        default="lm_eval",
        metavar="EXE",
        help="the lm_eval executable, for GSM8K (default: lm_eval on PATH; pip install "
        "'lm-eval[api]')",
    )
    p.add_argument(
        "--gpu-tools",
        type=choices.nonempty,
        default=None,
        metavar="EXE",
        help="the executable that runs doctor and bench kernel (default: this package's "
        "command line, run by this Python)",
    )
    p.add_argument(
        "--health-timeout",
        type=choices.seconds,
        default=1800.0,
        metavar="SECONDS",
        help="how long a server may take to answer /health (default 1800, at most "
        f"{choices.MAX_SECONDS})",
    )


def _step_list(text: str) -> list[str]:
    """``STEP[,STEP]``: step names, none of them empty (``doctor,,kernel-skew`` is a typo
    as likely as not, so it is refused, as the other list options refuse one)."""
    found = [n.strip() for n in text.split(",")]
    if not any(found):
        raise argparse.ArgumentTypeError("give a step name")
    if "" in found:
        raise argparse.ArgumentTypeError(f"{text!r} has an empty step name; give STEP[,STEP]")
    return found


def _differences(was: Settings, now: Settings) -> str:
    """What this run's options say where the stored reproduction's differ."""
    said = []
    if now.model != was.model:
        said.append(f"--model {now.model}")
    if now.tp != was.tp:
        said.append(f"--tp {now.tp}")
    if now.quick != was.quick:
        said.append("--quick" if now.quick else "without --quick")
    if now.dataset != was.dataset:
        said.append(f"--dataset {now.dataset}" if now.dataset else "without --dataset")
    return ", ".join(said)


def settings_of(args: argparse.Namespace) -> Settings:
    dataset = None if args.dataset is None else str(Path(args.dataset).resolve())
    return Settings(model=args.model, tp=args.tp, quick=args.quick, dataset=dataset)


def _executable(option: str, value: str, hint: str) -> str | None:
    why = choices.not_executable(value, hint)
    return choices.said_of(f"{option} {value}", why) if why else None


#: The directories a reproduction keeps in ``--out``, beside ``reproduction.json``.
_OWN_DIRS = ("steps", "files", "environment")


def out_problem(out: str) -> str | None:
    """Why ``--out`` cannot hold a reproduction, before anything in it is read: a
    dangling link, a directory of other files (whose report.md this run would
    overwrite), or one whose own entries are not what this command made."""
    path = Path(out)
    try:
        if os.path.islink(path) and not path.exists():
            where = os.readlink(path)
            return f"--out {out[:80]} is a link to {where!r}, which does not exist"
    except OSError:  # a name too long, ...: said by problem()'s check of the directory
        return None
    if not os.path.isdir(path):
        return None
    try:
        entries = {entry.name: entry for entry in os.scandir(path)}
    except OSError as exc:
        return f"--out {out[:80]} cannot be listed: {exc.strerror or exc}"
    if not entries:
        return None
    if "reproduction.json" not in entries:
        return (
            f"--out {out[:80]} holds other files and no reproduction.json: give a new or "
            "empty directory (this command writes report.md and more there)"
        )
    for name in _OWN_DIRS:
        if name in entries and not entries[name].is_dir(follow_symlinks=False):
            return f"--out {out[:80]}: {name} is not a directory this command made"
    return None


def problem(args: argparse.Namespace, stored: dict | None) -> str | None:
    """The first thing wrong with these options, in one line; None when nothing is.
    ``stored``: the settings of the reproduction already in ``--out``, if any."""
    from ... import settings as plugin_settings
    from ..validation import serve_bench as sb

    settings = settings_of(args)
    known = names(settings)
    unknown = [n for group in args.redo for n in group if n not in known]
    if unknown:
        why, step = "", unknown[0]  # a step these options leave out: say which one does
        if settings.quick and step in names(replace(settings, quick=False)):
            why = " (--quick leaves it out)"
        elif not settings.dataset and step in names(replace(settings, dataset="x")):
            why = " (it needs --dataset)"
        elif step in names(replace(settings, quick=False, dataset="x")):
            why = " (it needs --dataset, without --quick)"
        return f"--redo {step}: no such step here{why}; the steps: {', '.join(known)}"
    if why := choices.uncreatable_dir(args.out):
        return f"--out {args.out} {why}"
    path = Path(os.path.expanduser(args.model))  # ~nosuchuser stays as written
    if args.model.startswith((os.sep, ".", "~")) or os.path.exists(path):
        if not os.path.isfile(path / "config.json"):
            return f"--model {args.model}: not a model directory with a config.json"
        try:  # read as plan reads it: bounded, a JSON object, named in every error
            choices.check_model_config(choices.resolve_model_dir(str(path))[0], args.tp)
        except (choices.InputError, ValueError) as exc:
            return str(exc)
    if args.dataset is not None:
        path = Path(args.dataset)
        why = sb.file_problem(path) or sb.sharegpt_problem(path)
        if why:
            return f"--dataset {args.dataset} {why}"
    for option, value, hint in (
        ("--vllm", args.vllm, "is vLLM installed and on PATH?"),
        ("--lm-eval", args.lm_eval, "pip install 'lm-eval[api]'"),
    ):
        if why := _executable(option, value, hint):
            return why
    if args.gpu_tools is not None and (
        why := _executable("--gpu-tools", args.gpu_tools, "give an executable")
    ):
        return why
    # after the paths and programs: a rerun that names a missing one hears that first
    if stored is not None and stored != settings.to_json():
        was = Settings(**stored)
        return (
            f"--out {args.out} holds a reproduction of {was.describe()} (this run: "
            f"{_differences(was, settings)}); rerun with those options to resume it, or "
            "give another --out (or remove it: its finished steps go with it)"
        )
    if bad := choices.plugin_settings_problem():
        return bad
    switch = f"{plugin_settings.SWITCH_ENV}="
    if bad := [p for p in plugin_settings.problems() if p.startswith(switch)]:
        return f"{bad[0]} (its doctor step reads it; the serving arms set their own)"
    if why := sb.host_problem(args.host, args.port):
        return why
    if why := sb.listen_problem(args.host, args.port):
        return (
            f"--host {args.host} --port {args.port}: cannot listen there ({why}); a server "
            "left by a killed run? stop it first"
        )
    return None
