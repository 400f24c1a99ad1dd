"""``check passkey``: long-context retrieval against a running OpenAI-compatible server.

Each prompt hides a random five-digit passkey at a random depth of filler text of about
the target length and asks for it back (greedy, 16 tokens). A prompt passes when the
reply contains the passkey. The original change ran 24 prompts at 3K / 8K / 16K / 32K
tokens with 30 in flight, all passing in both arms. Prompts are made as they are sent,
so only those in flight are held.
"""

from __future__ import annotations

import argparse
import http.client
import json
import random
import sys
import urllib.error
import urllib.request
from collections.abc import Callable, Iterable, Iterator
from concurrent.futures import FIRST_COMPLETED, Future, ThreadPoolExecutor, wait
from dataclasses import dataclass

PROG = "vllm-rocm-asm-decode check passkey"
FILLER = (
    "The grass is green. The sky is blue. The sun is yellow. Here we go. There and back again. "
)
#: Tokens per filler sentence block for Llama/Qwen tokenizers, roughly; lengths are
#: targets, not exact counts.
TOKENS_PER_FILLER = 24
#: The largest reply read: a completion of 16 tokens is a few hundred bytes.
MAX_REPLY_BYTES = 1 << 20


@dataclass
class Prompt:
    length: int
    passkey: str
    text: str


def make_prompt(length: int, rng: random.Random) -> Prompt:
    passkey = f"{rng.randrange(10000, 100000)}"
    blocks = max(1, length // TOKENS_PER_FILLER)
    depth = rng.randrange(blocks + 1)
    needle = f"The pass key is {passkey}. Remember it. {passkey} is the pass key. "
    body = FILLER * depth + needle + FILLER * (blocks - depth)
    text = (
        "There is an important piece of information hidden inside a lot of irrelevant "
        f"text. Find it and memorize it.\n\n{body}\n\nWhat is the pass key? The pass key is"
    )
    return Prompt(length, passkey, text)


def passed(prompt: Prompt, reply: str) -> bool:
    return prompt.passkey in reply


class ServerError(RuntimeError):
    """The server's answer is not a completion; the message says what it said."""


def ask(base_url: str, model: str, prompt: Prompt, timeout: float) -> str:
    body = json.dumps(
        {"model": model, "prompt": prompt.text, "max_tokens": 16, "temperature": 0}
    ).encode()
    url = f"{base_url}/v1/completions"
    request = urllib.request.Request(url, data=body, headers={"Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(request, timeout=timeout) as response:
            raw = response.read(MAX_REPLY_BYTES + 1)
    except urllib.error.HTTPError as exc:  # keep the server's reason (e.g. a 400's message)
        detail = exc.read(2000).decode(errors="replace").strip().replace("\n", " ")
        hint = (
            f" (no completions endpoint at {url}: is --base-url the vLLM server's?)"
            if exc.code == 404
            else ""
        )
        raise ServerError(f"HTTP {exc.code}: {detail[:300] or exc.reason}{hint}") from None
    except urllib.error.URLError as exc:  # the request never got an answer
        reason = exc.reason
        why = getattr(reason, "strerror", None) or str(reason)
        raise ServerError(f"cannot reach {url}: {why}") from None
    except http.client.HTTPException as exc:  # not HTTP, or cut short
        raise ServerError(f"the reply is not an HTTP answer ({type(exc).__name__})") from None
    except TimeoutError:
        raise ServerError(f"no answer from {url} within {timeout:g} s (--timeout)") from None
    except UnicodeError as exc:  # the URL's host cannot be encoded
        raise ServerError(f"the URL {url} cannot be used: {exc}") from None
    except OSError as exc:
        raise ServerError(f"cannot reach {url}: {exc.strerror or exc}") from None
    if len(raw) > MAX_REPLY_BYTES:
        raise ServerError(f"the reply is over {MAX_REPLY_BYTES} bytes: not a completion")
    try:
        reply = json.loads(raw)
    except RecursionError:
        raise ServerError("the reply is not a completion (JSON nested too deeply)") from None
    except ValueError as exc:
        raise ServerError(f"the reply is not JSON ({exc})") from None
    choices = reply.get("choices") if isinstance(reply, dict) else None
    if (
        not isinstance(choices, list)
        or not choices
        or not isinstance(choices[0], dict)
        or "text" not in choices[0]
    ):
        try:
            shown = json.dumps(reply)[:300]
        except (RecursionError, ValueError):
            shown = type(reply).__name__
        raise ServerError(f"the reply has no completion text: {shown}")
    return str(choices[0]["text"])


def make_prompts(lengths: Iterable[int], count: int, seed: int) -> Iterator[Prompt]:
    """``count`` prompts per length, in order, each made when it is asked for."""
    rng = random.Random(seed)
    for n in lengths:
        for _ in range(count):
            yield make_prompt(n, rng)


def score(
    prompts: Iterable[Prompt], answer: Callable[[Prompt], str], in_flight: int
) -> dict[int, list[int]]:
    """``[passed, sent]`` per target length, with at most ``in_flight`` requests out at
    once and only their prompts held. The first error stops the run and is raised."""
    tally: dict[int, list[int]] = {}

    def judge(prompt: Prompt) -> tuple[int, bool]:
        return prompt.length, passed(prompt, answer(prompt))

    def count(done: Iterable[Future[tuple[int, bool]]]) -> None:
        for future in done:
            length, ok = future.result()
            tally[length][0] += ok
            tally[length][1] += 1

    pending: set[Future[tuple[int, bool]]] = set()
    with ThreadPoolExecutor(max_workers=in_flight) as pool:
        try:
            for prompt in prompts:
                tally.setdefault(prompt.length, [0, 0])
                if len(pending) >= in_flight:
                    done, pending = wait(pending, return_when=FIRST_COMPLETED)
                    count(done)
                pending.add(pool.submit(judge, prompt))
            while pending:
                done, pending = wait(pending, return_when=FIRST_COMPLETED)
                count(done)
        except BaseException:
            for future in pending:
                future.cancel()
            raise
    return tally


def main(args: argparse.Namespace) -> int:
    prompts = make_prompts(args.lengths, args.prompts, args.seed)
    try:
        tally = score(
            prompts, lambda p: ask(args.base_url, args.model, p, args.timeout), args.in_flight
        )
    except ServerError as exc:
        print(f"{PROG}: error: {args.base_url}: {exc}", file=sys.stderr)
        return 2
    failures = 0
    print("| target tokens | passed |")
    print("|---|---|")
    for n in args.lengths:
        ok, sent = tally.get(n, [0, 0])
        failures += sent - ok
        print(f"| {n} | {ok}/{sent} |")
    return 1 if failures else 0
