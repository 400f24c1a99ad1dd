"""``check passkey``: long-context retrieval against a running OpenAI-compatible server.

Each prompt hides a random five-digit passkey at a random depth of filler text of about
the target length and asks for it back (greedy, 16 tokens). A prompt passes when the
reply contains the passkey. The original change ran 24 prompts at 3K / 8K / 16K / 32K
tokens with 30 in flight, all passing in both arms.
"""

from __future__ import annotations

import argparse
import http.client
import json
import random
import sys
import urllib.error
import urllib.request
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass

PROG = "vllm-rocm-asm-decode check passkey"
FILLER = (
    "The grass is green. The sky is blue. The sun is yellow. Here we go. There and back again. "
)
#: Tokens per filler sentence block for Llama/Qwen tokenizers, roughly; lengths are
#: targets, not exact counts.
TOKENS_PER_FILLER = 24


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
    request = urllib.request.Request(
        f"{base_url}/v1/completions", data=body, headers={"Content-Type": "application/json"}
    )
    try:
        with urllib.request.urlopen(request, timeout=timeout) as response:
            reply = json.loads(response.read())
    except urllib.error.HTTPError as exc:  # keep the server's reason (e.g. a 400's message)
        detail = exc.read().decode(errors="replace").strip().replace("\n", " ")
        hint = (
            f" (no completions endpoint at {request.full_url}: is --base-url the vLLM server's?)"
            if exc.code == 404
            else ""
        )
        raise ServerError(f"HTTP {exc.code}: {detail[:300] or exc.reason}{hint}") from None
    except http.client.HTTPException as exc:  # not HTTP, or cut short
        raise ServerError(f"the reply is not an HTTP answer ({type(exc).__name__})") from None
    except ValueError as exc:
        raise ServerError(f"the reply is not JSON ({exc})") from None
    choices = reply.get("choices") if isinstance(reply, dict) else None
    if (
        not isinstance(choices, list)
        or not choices
        or not isinstance(choices[0], dict)
        or "text" not in choices[0]
    ):
        raise ServerError(f"the reply has no completion text: {json.dumps(reply)[:300]}")
    return str(choices[0]["text"])


def main(args: argparse.Namespace) -> int:
    rng = random.Random(args.seed)
    prompts = [make_prompt(n, rng) for n in args.lengths for _ in range(args.prompts)]
    try:
        with ThreadPoolExecutor(max_workers=args.in_flight) as pool:
            replies = list(
                pool.map(lambda p: ask(args.base_url, args.model, p, args.timeout), prompts)
            )
    except (ServerError, urllib.error.URLError, OSError) as exc:
        print(f"{PROG}: error: {args.base_url}: {exc}", file=sys.stderr)
        return 2
    failures = 0
    print("| target tokens | passed |")
    print("|---|---|")
    for n in args.lengths:
        got = [passed(p, r) for p, r in zip(prompts, replies, strict=True) if p.length == n]
        failures += got.count(False)
        print(f"| {n} | {sum(got)}/{len(got)} |")
    return 1 if failures else 0
