"""``check passkey``: long-context retrieval against a running OpenAI-compatible server.

Each prompt hides a random five-digit passkey at a random depth of filler text of about
the target length and asks for it back (greedy, 16 tokens). A prompt passes when the
reply contains the passkey. The original change ran 24 prompts at 3K / 8K / 16K / 32K
tokens with 30 in flight, all passing in both arms. Prompts are made as they are sent,
so only those in flight are held. ``--timeout`` is each request's whole time (connect,
send, the reply read whole); a redirect is an error that names its target; what the
server or the URL says is quoted with its control characters escaped. Proxies are urllib's
own (``http_proxy``, ``https_proxy``, ``no_proxy``): an error of a request sent through
one names the proxy and the variable it came from.

Exit status: 0 every prompt passed; 1 a prompt missed, or the server failed after it had
answered (the table so far is printed, then the error); 2 an input error, or a server
that answered no request (a wrong ``--base-url`` or ``--model``, a server not up).
"""

from __future__ import annotations

import argparse
import functools
import http.client
import json
import os
import random
import re
import socket
import ssl
import sys
import threading
import time
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Callable, Iterable, Iterator
from concurrent.futures import FIRST_COMPLETED, Future, wait
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


def printable(text: str) -> str:
    """``text`` as an error line may quote it: control and other unprintable characters
    (``\\r``, ESC, NUL, C1, bidi overrides) escaped as ``\\x1b``, ``\\u202e``; the rest of
    Unicode as it is."""
    return "".join(c if c.isprintable() else c.encode("unicode_escape").decode() for c in text)


class _Deadline:
    """The wall-clock end of one request: every connect, send and read of it may take only
    the time left, so a server that trickles a byte at a time still runs out of it."""

    def __init__(self, seconds: float):
        self.end = time.monotonic() + seconds

    def left(self) -> float:
        left = self.end - time.monotonic()
        if left <= 0:
            raise TimeoutError("timed out")
        return left


class _Bounded:
    """A socket whose every send and receive is bounded by its request's deadline (set
    once it is connected; TLS's handshake is bounded by the timeout it starts with)."""

    deadline: _Deadline | None = None

    def _arm(self) -> None:
        if self.deadline is not None:
            self.settimeout(self.deadline.left())  # type: ignore[attr-defined]

    def recv_into(self, *args, **kwargs):
        self._arm()
        return super().recv_into(*args, **kwargs)  # type: ignore[misc]

    def recv(self, *args, **kwargs):
        self._arm()
        return super().recv(*args, **kwargs)  # type: ignore[misc]

    def send(self, *args, **kwargs):
        self._arm()
        return super().send(*args, **kwargs)  # type: ignore[misc]

    def sendall(self, *args, **kwargs):  # a plain socket's sendall: one deadline for all
        self._arm()
        return super().sendall(*args, **kwargs)  # type: ignore[misc]


class _Socket(_Bounded, socket.socket):
    pass


class _TLSSocket(_Bounded, ssl.SSLSocket):
    pass


class _ConnectTimeoutError(TimeoutError):
    """The request's time ran out before a connection was made."""


def _connect(address: tuple[str, int], deadline: _Deadline, source=None) -> _Socket:
    """``socket.create_connection`` with each address tried in the time left."""
    error: OSError = OSError(f"{address[0]} has no address")
    for family, kind, proto, _, where in socket.getaddrinfo(*address, 0, socket.SOCK_STREAM):
        sock = _Socket(family, kind, proto)
        try:
            sock.settimeout(deadline.left())
            if source:
                sock.bind(source)
            sock.connect(where)
            sock.settimeout(deadline.left())  # what TLS's handshake starts with
        except TimeoutError:
            sock.close()
            raise _ConnectTimeoutError("timed out") from None
        except OSError as exc:
            sock.close()
            error = exc
            continue
        sock.deadline = deadline
        return sock
    raise error


class _Connection(http.client.HTTPConnection):
    def __init__(self, *args, deadline: _Deadline, **kwargs):
        super().__init__(*args, **kwargs)
        self._deadline = deadline
        self._create_connection = lambda address, _timeout, source=None: _connect(
            address, deadline, source
        )

    def connect(self) -> None:
        super().connect()
        if isinstance(self.sock, _TLSSocket):  # the handshake is done
            self.sock.deadline = self._deadline


class _TLSConnection(_Connection, http.client.HTTPSConnection):
    pass


@functools.cache
def _tls_context() -> ssl.SSLContext:
    context = ssl.create_default_context()
    context.set_alpn_protocols(["http/1.1"])
    context.sslsocket_class = _TLSSocket
    return context


class _HTTPHandler(urllib.request.HTTPHandler):
    def __init__(self, deadline: _Deadline):
        super().__init__()
        self._deadline = deadline

    def http_open(self, req):
        return self.do_open(functools.partial(_Connection, deadline=self._deadline), req)


class _HTTPSHandler(urllib.request.HTTPSHandler):
    def __init__(self, deadline: _Deadline):
        super().__init__()
        self._deadline = deadline

    def https_open(self, req):  # the CA certificates load on the first https request
        connection = functools.partial(_TLSConnection, deadline=self._deadline)
        return self.do_open(connection, req, context=_tls_context())


def _proxy_source(scheme: str, proxy: str) -> str:
    """Where urllib found ``proxy`` for ``scheme`` requests: the variable it read (a
    ``http_proxy`` wins over a ``HTTP_PROXY``), else the system's settings."""
    names = [n for n, v in os.environ.items() if n.lower() == f"{scheme}_proxy" and v == proxy]
    names.sort(key=lambda name: not name.endswith("_proxy"))
    return names[0] if names else "the system's proxy settings"


def _shown_proxy(proxy: str) -> str:
    """``proxy`` as an error line quotes it: a user:password@ in it as ``***@``."""
    return printable(re.sub(r"^((?:[^:/@]*:)?//)?[^/@]*@", r"\1***@", proxy))


class _Proxies(urllib.request.ProxyHandler):
    """urllib's proxies (``<scheme>_proxy``, ``no_proxy``; what ``build_opener`` adds when
    it is not given one), each request told which it is offered and where that is from."""

    def proxy_open(self, req, proxy, type):
        req.proxy = f"the proxy {_shown_proxy(proxy)} (from {_proxy_source(type, proxy)})"
        try:
            return super().proxy_open(req, proxy, type)
        except ValueError:  # urllib's "proxy URL with no authority" (http:/x)
            raise ServerError(
                f"{req.proxy} cannot be used: it is not a URL with a host (http://host:port)"
            ) from None


class _Request(urllib.request.Request):
    """A request that keeps the proxy it is sent through (``via``, for its error lines);
    a proxy it cannot be sent through is an error that names where it came from."""

    proxy = ""  # what _Proxies offers
    via = ""  # " through the proxy ... (from ...)" once urllib takes it

    def set_proxy(self, host, type):
        try:
            if type not in ("http", "https"):
                raise ValueError("urllib sends requests only through http:// and https:// ones")
            where = urllib.parse.urlsplit(f"//{host}")
            if not where.hostname:
                raise ValueError("it names no host")
            _ = where.port  # one not a number of 0-65535 raises
        except ValueError as exc:
            raise ServerError(f"{self.proxy} cannot be used: {printable(str(exc))}") from None
        super().set_proxy(host, type)
        self.via = f" through {self.proxy}"


class _NoRedirects(urllib.request.HTTPRedirectHandler):
    """A 3xx is an error that names where it points: the prompt is not sent elsewhere
    (urllib would resend a POST as a GET for 301-303)."""

    def http_error_302(self, req, fp, code, msg, headers):
        return None

    http_error_301 = http_error_303 = http_error_307 = http_error_308 = http_error_302


def _bad_chunk_size(exc: BaseException) -> str | None:
    """The chunk-size line of a chunked body that ``exc`` comes from, as Python shows it
    (``b''`` where the body ended there): http.client raises int(line, 16)'s ValueError, or
    an IncompleteRead that has it as its context."""
    seen: set[int] = set()
    cause: BaseException | None = exc
    while cause is not None and id(cause) not in seen:
        seen.add(id(cause))
        said, _, line = str(cause).partition(": ")
        if isinstance(cause, ValueError) and said == "invalid literal for int() with base 16":
            return line[:40]
        cause = cause.__cause__ or cause.__context__
    return None


def _why_unread(exc: BaseException, timeout: float) -> str:
    """Why a reply's body could not be read, as a line says it."""
    if isinstance(exc, TimeoutError):
        return f"the --timeout of {timeout:g} s ran out"
    size = _bad_chunk_size(exc)
    if size is not None and size != "b''":
        return f"its chunked encoding is malformed: {printable(size)} is not a hex chunk size"
    if isinstance(exc, http.client.IncompleteRead) or size is not None:
        return "it was cut short"
    if isinstance(exc, ConnectionResetError):
        return "connection reset"
    if isinstance(exc, OSError) and exc.strerror:
        return printable(exc.strerror)
    return printable(str(exc)[:200]) or type(exc).__name__


def _http_error(exc: urllib.error.HTTPError, url: str, via: str, timeout: float) -> str:
    location = exc.headers.get("Location") if exc.headers is not None else None
    if 300 <= exc.code < 400 and location:
        try:
            target = urllib.parse.urljoin(url, location.strip())
        except ValueError:  # not a URL (an unclosed [IPv6 address)
            target = location
        return (
            f"HTTP {exc.code}{via}: the server redirects to {printable(target[:300])} "
            "(requests are not redirected: give the server's own URL)"
        )
    try:
        detail = exc.read(2000).decode(errors="replace")
    except (OSError, http.client.HTTPException, ValueError) as error:  # out of time, cut
        return f"HTTP {exc.code}{via} (its body could not be read: {_why_unread(error, timeout)})"
    detail = " ".join(detail.split())[:300] or str(exc.reason)
    hint = ""
    kind = exc.headers.get_content_type() if exc.headers is not None else ""
    if kind == "text/html":  # a web page, not vLLM's JSON error: its status line says it
        detail = f"{exc.reason} (an HTML page)"
        hint = (
            f" (no vLLM completions endpoint at {printable(url)}: is --base-url the vLLM server's?)"
        )
    elif exc.code == 404 and "does not exist" in detail:  # vLLM's word for another model
        hint = " (the server serves another model: is --model the name it was started with?)"
    elif exc.code == 404:
        hint = f" (no completions endpoint at {printable(url)}: is --base-url the vLLM server's?)"
    return f"HTTP {exc.code}{via}: {printable(detail)}{hint}"


def _not_http(exc: http.client.HTTPException, via: str) -> str:
    """A reply http.client does not take, as a line says it."""
    message = str(exc)
    headers = re.fullmatch(r"got more than (\d+) headers", message)
    if headers:
        return f"the reply{via} has more than {headers[1]} header lines"
    if isinstance(exc, http.client.BadStatusLine) or not message:
        return f"the reply{via} is not an HTTP answer ({type(exc).__name__})"
    return (
        f"the reply{via} is not an HTTP answer ({type(exc).__name__}: {printable(message[:200])})"
    )


def _json_kind(value: object) -> str:
    if isinstance(value, bool):
        return json.dumps(value)
    if isinstance(value, (int, float)):
        return "a number"
    return {list: "a list", dict: "an object"}.get(type(value), type(value).__name__)


def _shown(reply: object) -> str:
    try:
        return printable(json.dumps(reply, ensure_ascii=False)[:300])
    except (RecursionError, ValueError):
        return type(reply).__name__


def ask(base_url: str, model: str, prompt: Prompt, timeout: float) -> str:
    """The completion of ``prompt``; ``timeout`` bounds the whole request (connect, send,
    the reply read whole), not each read of it."""
    body = json.dumps(
        {"model": model, "prompt": prompt.text, "max_tokens": 16, "temperature": 0}
    ).encode()
    url = f"{base_url}/v1/completions"
    request = _Request(url, data=body, headers={"Content-Type": "application/json"})
    deadline = _Deadline(timeout)
    opener = urllib.request.build_opener(
        _Proxies(), _HTTPHandler(deadline), _HTTPSHandler(deadline), _NoRedirects
    )

    def late() -> str:
        return f"no answer from {printable(url)}{request.via} within {timeout:g} s (--timeout)"

    try:
        response = opener.open(request, timeout=timeout)
    except urllib.error.HTTPError as exc:  # keep the server's reason (e.g. a 400's message)
        with exc:
            raise ServerError(_http_error(exc, url, request.via, timeout)) from None
    except urllib.error.URLError as exc:  # the request never got an answer
        reason = exc.reason
        if isinstance(reason, _ConnectTimeoutError):
            raise ServerError(
                f"no connection to {printable(url)}{request.via} within {timeout:g} s (--timeout)"
            ) from None
        if isinstance(reason, TimeoutError):
            raise ServerError(late()) from None
        why = printable(getattr(reason, "strerror", None) or str(reason))
        raise ServerError(f"cannot reach {printable(url)}{request.via}: {why}") from None
    except (http.client.InvalidURL, UnicodeError) as exc:  # a bad host:port or host name
        raise ServerError(
            f"the URL {printable(url)} cannot be used: {printable(str(exc))}"
        ) from None
    except http.client.RemoteDisconnected:  # closed where the reply's status line was due
        raise ServerError(
            f"no answer from {printable(url)}{request.via}: "
            "the connection was closed before a reply"
        ) from None
    except http.client.HTTPException as exc:  # not HTTP
        raise ServerError(_not_http(exc, request.via)) from None
    except TimeoutError:
        raise ServerError(late()) from None
    except OSError as exc:  # reading the reply's head: the request went out (URLError if not)
        why = printable(exc.strerror or str(exc))
        raise ServerError(f"no answer from {printable(url)}{request.via}: {why}") from None
    with response:
        declared = response.length  # Content-Length, None when not given or chunked
        try:
            raw = response.read(MAX_REPLY_BYTES + 1)
        except TimeoutError:
            raise ServerError(late()) from None
        except http.client.IncompleteRead as exc:  # a chunked body that stops mid-chunk
            if _bad_chunk_size(exc) not in (None, "b''"):
                raise ServerError(
                    f"the reply{request.via} could not be read: {_why_unread(exc, timeout)}"
                ) from None
            inner = exc.__cause__  # http.client's IncompleteRead of the chunk it was reading
            got = len(exc.partial)
            got += len(inner.partial) if isinstance(inner, http.client.IncompleteRead) else 0
            raise ServerError(
                f"the reply{request.via} was cut short: its chunked body ended after {got} bytes"
            ) from None
        except http.client.HTTPException as exc:  # a chunk-size line over 64 KiB
            raise ServerError(_not_http(exc, request.via)) from None
        except (OSError, ValueError) as exc:  # reset, or a chunk size that is not a number
            raise ServerError(
                f"the reply{request.via} could not be read: {_why_unread(exc, timeout)}"
            ) from None
    if len(raw) > MAX_REPLY_BYTES:
        raise ServerError(f"the reply is over {MAX_REPLY_BYTES} bytes: not a completion")
    if declared is not None and len(raw) < declared:
        raise ServerError(f"the reply was cut short: it ended after {len(raw)} of {declared} bytes")
    try:
        reply = json.loads(raw)
    except RecursionError:
        raise ServerError("the reply is not a completion (JSON nested too deeply)") from None
    except ValueError as exc:
        raise ServerError(f"the reply is not JSON ({printable(str(exc))})") from None
    choices = reply.get("choices") if isinstance(reply, dict) else None
    text = (
        choices[0].get("text")
        if isinstance(choices, list) and choices and isinstance(choices[0], dict)
        else None
    )
    if text is None:  # no choice, or no text in it, or a null one
        raise ServerError(f"the reply has no completion text: {_shown(reply)}")
    if not isinstance(text, str):
        raise ServerError(
            f'the reply is not a completion (its "text" is {_json_kind(text)}, not a string): '
            f"{_shown(reply)}"
        )
    return text


def make_prompts(lengths: Iterable[int], count: int, seed: int) -> Iterator[Prompt]:
    """``count`` prompts per length, in order, each made when it is asked for."""
    rng = random.Random(seed)
    for n in lengths:
        for _ in range(count):
            yield make_prompt(n, rng)


def _start(work: Callable[[Prompt], tuple[int, bool]], prompt: Prompt) -> Future:
    """``work(prompt)`` in a daemon thread of its own: a Ctrl-C or the first error ends
    the run at once, and the interpreter's exit does not wait for requests still out
    (``ThreadPoolExecutor``'s workers are joined at exit, whatever ``shutdown`` said)."""
    future: Future[tuple[int, bool]] = Future()
    future.set_running_or_notify_cancel()

    def run() -> None:
        try:
            result = work(prompt)
        except BaseException as exc:  # kept for the waiting thread, which raises it
            future.set_exception(exc)
        else:
            future.set_result(result)

    threading.Thread(target=run, name="passkey-request", daemon=True).start()
    return future


def score(
    prompts: Iterable[Prompt], answer: Callable[[Prompt], str], in_flight: int
) -> dict[int, list[int]]:
    """``[passed, sent]`` per target length, with at most ``in_flight`` requests out at
    once and only their prompts held. The first error stops the run and is raised, as is
    a Ctrl-C, at once: the requests still out are left to end in their threads (each
    within its own timeout), no new one is sent."""
    tally: dict[int, list[int]] = {}

    def judge(prompt: Prompt) -> tuple[int, bool]:
        return prompt.length, passed(prompt, answer(prompt))

    def count(done: Iterable[Future[tuple[int, bool]]]) -> None:
        for future in done:
            length, ok = future.result()
            tally[length][0] += ok
            tally[length][1] += 1

    pending: set[Future[tuple[int, bool]]] = set()
    try:
        for prompt in prompts:
            tally.setdefault(prompt.length, [0, 0])
            if len(pending) >= in_flight:
                done, pending = wait(pending, return_when=FIRST_COMPLETED)
                count(done)
            pending.add(_start(judge, prompt))
        while pending:
            done, pending = wait(pending, return_when=FIRST_COMPLETED)
            count(done)
    except ServerError as exc:
        exc.tally = tally  # what was judged before it (the requests still out are not)
        raise
    return tally


def main(args: argparse.Namespace) -> int:
    prompts = make_prompts(args.lengths, args.prompts, args.seed)
    try:
        tally = score(
            prompts, lambda p: ask(args.base_url, args.model, p, args.timeout), args.in_flight
        )
    except ServerError as exc:
        answered = getattr(exc, "tally", {})
        served = any(sent for _, sent in answered.values())  # then failed
        if served:  # rows cut short say how many were asked for
            _table(args.lengths, answered, asked=args.prompts)
        print(f"{PROG}: error: {printable(args.base_url)}: {exc}", file=sys.stderr)
        return 1 if served else 2
    return 1 if _table(args.lengths, tally) else 0


def _table(lengths: Iterable[int], tally: dict[int, list[int]], asked: int = 0) -> int:
    """Prints passed/judged per target length, and of how many ``asked`` where fewer were
    judged (a run an error ended); returns the misses."""
    failures = 0
    print("| target tokens | passed |")
    print("|---|---|")
    for n in lengths:
        ok, sent = tally.get(n, [0, 0])
        failures += sent - ok
        short = f" ({asked - sent} of {asked} not judged)" if sent < asked else ""
        print(f"| {n} | {ok}/{sent}{short} |")
    return failures
