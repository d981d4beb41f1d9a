"""The open-source Portkey gateway (npm `@portkey-ai/gateway` 1.15.2) as a lab gateway.

Theory of operation
-------------------
Installed from `labs/gateways/portkey/package-lock.json` (`npm ci`, by `make setup`), with
`@hono/node-server` pinned to 1.13.5 by an `overrides` entry: the gateway declares `^1.3.3`, and
with the newest 1.x every call fails with a 500 `TypeError: immutable`. Started by our launcher
(`labs/gateways/portkey/launch.mjs`) because the gateway's own entry point has no host option
and its package exports no app: a module resolution hook (Node's `module.register`) gives the
gateway's bundle our `serve` for `@hono/node-server`'s, which serves the gateway's own `fetch` on
127.0.0.1 on a free port, gives every request the lab's gateway config (a new `Request` with the
header), and appends the gateway's request log to a file.

The config (Portkey's `x-portkey-config`; see its docs "Configs", "Fallbacks", "Automatic Retries"):
- one worker: `{"provider": "openai", "custom_host": <worker>/v1, "api_key": ...}`: no retry,
  the gateway's default (`retry.attempts` 0).
- with the spare: `"strategy": {"mode": "fallback"}` over two targets, the worker first, and
  `"retry": {"attempts": 2}` inherited by both, as the docs show an operator. What that does, from
  the source (v1.15.2): `retryRequest` (src/handlers/retryHandler.ts) retries a fetch that threw
  or answered 429/500/502/503/504; the fallback loop (`tryTargetsRecursively`,
  src/handlers/handlerUtils.ts) moves to the next target when a target's final answer is not
  `ok`. Both look only at the response head: once a 200 head arrived, the body is streamed and
  nothing retries or falls back. So a variant with the shipped default (no retry, one target)
  would show the same cells in every lab scenario, whose failures all come after the head: there
  is one `portkey`.

Gemini: a Gemini SDK's `POST /v1/models/{model}:streamGenerateContent` matches no route of
Portkey's own but its `/v1/*` proxy route (`pu` in the 1.15.2 bundle), which relays the path after
`/v1` to the provider's base URL, here the `google` provider's custom host (so the worker sees
`/v1/models/...`), and passes the body on as the other providers' streams. The launcher gives such
a path the `google` config (`FINISHLINE_PORTKEY_GEMINI_CONFIG`). Its log entry names no model (the
body has none): the cell is read from the attempt's URL (`portkey_cells`). Not run: Portkey's
*translation* of a Chat request to the `google` provider (`/v1/chat/completions` with provider
`google`), which asks `:streamGenerateContent` without `alt=sse` and splits Google's JSON-array
stream at `\r\n` (`xa` in the bundle): against the worker's array it dropped the last element, the
one with the `finishReason`, and sent no `[DONE]`, and whether Google's own bytes end the same way
is not known here.

`portkey+finish_fix` puts finish_fix behind Portkey (Portkey's upstream is finish_fix in front of
the worker). That placement is the one that says something new: Portkey hides a cut, but it passes
finish_fix's error event on like any event, so the clients see the error while Portkey's own books
still say 200. finish_fix in front of Portkey would catch the hidden cut too (a clean end without
`[DONE]` is rule C6), but that is the `finish_fix` column's placement again.

What it does with a stream (src/handlers/streamHandler.ts, `handleStreamingMode` and
`readStream`): an OpenAI-compatible provider's events are passed on unchanged, split at blank
lines (after a 25 ms pause before the first); a partial event left at the end is passed on as is.
When reading the upstream throws (a cut, a reset), the error is logged and caught and the writer
is closed normally: **the client gets a clean end of the body**, no error event, no `[DONE]`.

Books: the gateway's request log (src/middlewares/log/index.ts: what its UI's Logs page shows),
one entry per request with the HTTP status, written when the handler returned its Response: for a
stream, when the upstream's head arrived, before any of the body. A cut stream is therefore
recorded as a 200 like any other. The launcher keeps only the model (which carries the lab's cell
id), the status, the duration and each attempt's URL (which worker answered); never keys or
message content.
"""

from __future__ import annotations

import json
import re
import shutil
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass
from pathlib import Path
from types import MappingProxyType
from typing import Any
from urllib.parse import urlsplit

from faults.child_processes import ChildStartError
from finishline import Dialect
from labs.cell_ids import cell_id_of
from labs.clients import LAB_API_KEY
from labs.gateways.finish_fix_proxy import shared_finish_fix
from labs.gateways.registry import NATIVE_ROUTES, GatewayContext, GatewayEntry
from labs.gateways.services import Gateway, books_reader_from
from labs.outcome import BOOKS_ERROR, BOOKS_OK
from labs.processes import open_service
from labs.worker.request_reading import gemini_request_body

__all__ = [
    "ENTRIES",
    "PORTKEY_PACKAGE",
    "PortkeyGateway",
    "open_portkey",
    "portkey_books",
    "portkey_cells",
    "portkey_config",
    "portkey_missing",
    "read_portkey_books",
]

PORTKEY_PACKAGE = Path(__file__).resolve().parent / "portkey"
LAUNCHER = PORTKEY_PACKAGE / "launch.mjs"
#: Written by `make setup` after `npm ci` in PORTKEY_PACKAGE.
INSTALLED_STAMP = PORTKEY_PACKAGE / "node_modules" / ".installed"
#: What the launcher prints once the gateway listens and its log is subscribed.
PORTKEY_LISTENING = re.compile(r"portkey listening on http://127\.0\.0\.1:(\d+)")
#: Retries per target with the spare, as Portkey's docs show them ("Automatic Retries").
RETRY_ATTEMPTS = 2
#: The provider a `/v1/messages` request is configured with: Portkey serves that route only for
#: providers with a Messages function (an `openai` config answers 500 "messages is not supported
#: by openai"); `anthropic` with the worker as its custom host posts to the worker's /v1/messages.
MESSAGES_PROVIDER = "anthropic"
#: The provider a Gemini request (`...:streamGenerateContent`) is configured with: `google`, whose
#: custom host Portkey's `/v1/*` proxy route relays the request's path to (after its `/v1`).
GEMINI_PROVIDER = "google"


def portkey_missing() -> str | None:
    """Why the Portkey gateway cannot start here (one line), or None when it can."""
    if shutil.which("node") is None:
        return "node is not on PATH: install Node.js 20 or newer"
    if not (PORTKEY_PACKAGE / "node_modules" / "@portkey-ai" / "gateway").is_dir():
        return f"the Portkey gateway is not installed: run `make setup` (npm ci in {PORTKEY_PACKAGE})"
    return None


def _target(upstream_url: str, provider: str) -> dict[str, Any]:
    return {"provider": provider, "custom_host": f"{upstream_url}/v1", "api_key": LAB_API_KEY}


def portkey_config(*, primary_url: str, spare_url: str | None, provider: str = "openai") -> dict[str, Any]:
    """The gateway config a lab request gets (`x-portkey-config`); see the module docstring.
    `provider`: `openai` for Chat Completions and Responses, `anthropic` for Messages, `google`
    for Gemini."""
    if spare_url is None:
        return _target(primary_url, provider)
    return {
        "strategy": {"mode": "fallback"},
        "retry": {"attempts": RETRY_ATTEMPTS},
        "targets": [_target(primary_url, provider), _target(spare_url, provider)],
    }


@dataclass(frozen=True, slots=True, kw_only=True)
class PortkeyGateway:
    port: int
    #: The OpenAI base URL clients are given (`http://127.0.0.1:PORT/v1`).
    base_url: str
    #: The gateway's request log as JSON lines (the books).
    request_log: Path


@asynccontextmanager
async def open_portkey(
    *, primary_url: str, spare_url: str | None = None, run_dir: Path, name: str = "portkey"
) -> AsyncIterator[PortkeyGateway]:
    """Run the Portkey gateway in front of `primary_url` (and `spare_url`), both
    `http://127.0.0.1:PORT`, until the block ends; its files go to `run_dir` named after `name`.

    Raises:
        ChildStartError: the gateway is not installed or did not start.
    """
    missing = portkey_missing()
    if missing:
        raise ChildStartError(missing)
    run_dir.mkdir(parents=True, exist_ok=True)
    request_log = run_dir / f"{name}-requests.jsonl"
    request_log.touch()
    env = {
        "FINISHLINE_PORTKEY_CONFIG": json.dumps(portkey_config(primary_url=primary_url, spare_url=spare_url)),
        "FINISHLINE_PORTKEY_MESSAGES_CONFIG": json.dumps(
            portkey_config(primary_url=primary_url, spare_url=spare_url, provider=MESSAGES_PROVIDER)
        ),
        "FINISHLINE_PORTKEY_GEMINI_CONFIG": json.dumps(
            portkey_config(primary_url=primary_url, spare_url=spare_url, provider=GEMINI_PROVIDER)
        ),
        "FINISHLINE_PORTKEY_LOG": str(request_log),
        # The request log's /log/stream exists only outside "production" (src/start-server.ts).
        "NODE_ENV": "",
        "ENVIRONMENT": "",
    }
    async with open_service(
        name,
        ["node", str(LAUNCHER)],
        port=0,
        port_in_log=PORTKEY_LISTENING,
        log_path=run_dir / f"{name}.log",
        env=env,
    ) as (_, port):
        yield PortkeyGateway(port=port, base_url=f"http://127.0.0.1:{port}/v1", request_log=request_log)


def portkey_books(entry: dict[str, Any]) -> str:
    """The books' word for one request-log entry: `ok` for a 2xx status, else `error`. That is
    all the log knows: a stream's entry is written when its head arrived."""
    status = entry.get("status")
    return BOOKS_OK if isinstance(status, int) and 200 <= status < 300 else BOOKS_ERROR


def portkey_cells(entry: dict[str, Any]) -> tuple[str | None, ...]:
    """The cell a request-log entry is about: its request's `model`, else (a Gemini request, whose
    body names none) the model in the path of its first attempt's URL."""
    model = entry.get("model")
    if not isinstance(model, str) or not model:
        attempts = entry.get("attempts") or [{}]
        url = attempts[0].get("url") if isinstance(attempts[0], dict) else None
        model = gemini_request_body(urlsplit(url).path, {}).get("model") if isinstance(url, str) else None
    return (cell_id_of(model),)


read_portkey_books = books_reader_from(portkey_books, cells_of=portkey_cells)


async def _start(ctx: GatewayContext) -> Gateway:
    running = await ctx.enter(open_portkey(primary_url=ctx.upstream(), spare_url=ctx.spare_url, run_dir=ctx.run_dir))
    return Gateway(name="portkey", base_url=running.base_url, books_path=running.request_log)


async def _start_behind_finish_fix(ctx: GatewayContext) -> Gateway:
    # finish_fix between Portkey and the worker (the gateway-side placement, like
    # `litellm+finish_fix`): Portkey passes an OpenAI provider's events on unchanged, so finish_fix's
    # error event for a cut reaches the client where Portkey alone ends the body cleanly. Portkey's
    # books are the gateway's, as for LiteLLM's variant.
    finish_fix = await shared_finish_fix(ctx)
    running = await ctx.enter(
        open_portkey(
            primary_url=finish_fix.base_url.removesuffix("/v1"),
            spare_url=ctx.spare_url,
            run_dir=ctx.run_dir,
            name="portkey+finish_fix",
        )
    )
    return Gateway(
        name="portkey+finish_fix",
        base_url=running.base_url,
        books_path=running.request_log,
        capture_path=finish_fix.capture,
        configure=finish_fix.options.apply,
    )


#: What config each dialect's requests get (the launcher picks it by path).
_ROUTE_TEXTS = MappingProxyType(
    {
        Dialect.CHAT: "Portkey: /v1/chat/completions with provider openai, custom_host the worker",
        Dialect.MESSAGES: "Portkey: /v1/messages with provider anthropic, custom_host the worker (openai has no Messages route)",
        Dialect.RESPONSES: "Portkey: /v1/responses with provider openai, custom_host the worker",
        Dialect.GEMINI: "Portkey: /v1/models/{model}:streamGenerateContent with provider google, custom_host the worker: "
        "its /v1/* proxy route relays the path",
    }
)
#: Every dialect the lab sends through it, each as it is.
_ROUTES = MappingProxyType({**NATIVE_ROUTES, Dialect.GEMINI: Dialect.GEMINI})

ENTRIES = (
    GatewayEntry(
        name="portkey",
        summary=(
            "the open-source Portkey gateway 1.15.2 (provider openai, custom_host the worker; with the spare: "
            "fallback over both, retry.attempts 2); books: its request log"
        ),
        start=_start,
        missing=portkey_missing,
        books_kind="portkey",
        read_books=read_portkey_books,
        uses_spare=True,
        routes=_ROUTES,
        route_texts=_ROUTE_TEXTS,
    ),
    GatewayEntry(
        name="portkey+finish_fix",
        summary="Portkey whose upstream goes through finish_fix to the worker (the gateway-side placement); books: Portkey's",
        start=_start_behind_finish_fix,
        missing=portkey_missing,
        books_kind="portkey",
        uses_spare=True,
        routes=_ROUTES,
        route_texts=_ROUTE_TEXTS,
    ),
)
