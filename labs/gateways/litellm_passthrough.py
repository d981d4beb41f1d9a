"""LiteLLM's Google AI Studio pass-through as lab gateways: `litellm-gemini-passthrough` (a Gemini
client's requests relayed to the worker) and `litellm-gemini-passthrough+finish_fix` (the same, its
upstream finish_fix in front of the worker: the gateway-side placement, as every `+finish_fix`).

The route (LiteLLM 1.108.7, `proxy/pass_through_endpoints/llm_passthrough_endpoints.py`
`gemini_proxy_route`): `/gemini/{endpoint:path}` checks the caller's key (`?key=` or
`x-goog-api-key`) against the proxy's keys, then relays the request to `GEMINI_API_BASE` (else
`https://generativelanguage.googleapis.com`) joined with `endpoint`, with the query's `key`
replaced by `GEMINI_API_KEY` (or `GOOGLE_API_KEY`, or a `gemini/` deployment's key); a path
containing `stream` is relayed as a stream (`create_pass_through_route`), byte for byte, whatever
the body says. The base URL comes from the environment only: neither the config nor the request
can name it. So one proxy process reaches one upstream, and each variant of each topology gets a
LiteLLM of its own (the run's LiteLLM for the model routes, labs.gateways.litellm_proxy, cannot
carry it): a slow start (25-90 s on a busy machine) paid once per variant and topology.

The client is given `http://127.0.0.1:PORT/gemini/v1` as the others are given a `/v1` root: a Gemini
SDK puts its version after the root it is given (`/gemini/v1/models/{model}:streamGenerateContent`),
and the worker sees `/v1/models/{model}:streamGenerateContent?alt=sse&key=...`, which it serves
under any prefix.

Nothing leaves the machine: `GEMINI_API_BASE` is the topology's worker (or its finish_fix), the
model map is the wheel's (`LITELLM_LOCAL_MODEL_COST_MAP`), and the route calls nothing else.

Books: LiteLLM's callbacks (labs.gateways.litellm_books), the `litellm` books kind. The
pass-through's logging builds a cost for the model it read from the URL before any callback, and
fails on a model LiteLLM's map does not know ("This model isn't mapped yet", logged at ERROR by
`PassThroughStreamingHandler._route_streaming_logging_to_handler`): the lab's model names are cell
ids and settings, so its cells have no books entry (`no entry` in the matrix), which is also what an
operator's own model name gets.

No spare: one `GEMINI_API_BASE`, and the route has no fallback of its own.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from types import MappingProxyType

from finishline import Dialect
from labs.clients import LAB_API_KEY
from labs.gateways.finish_fix_proxy import shared_finish_fix
from labs.gateways.litellm_proxy import FINISH_FIX_SUFFIX, open_litellm
from labs.gateways.registry import GatewayContext, GatewayEntry
from labs.gateways.services import Gateway

__all__ = ["ENTRIES", "FINISH_FIX_NAME", "NAME", "PASSTHROUGH_PATH"]

NAME = "litellm-gemini-passthrough"
FINISH_FIX_NAME = NAME + FINISH_FIX_SUFFIX
#: The route's path under the proxy: a Gemini SDK's root.
PASSTHROUGH_PATH = "/gemini"


def _root(url: str) -> str:
    """An upstream as `GEMINI_API_BASE` takes it: the server's root (the SDK's path is relayed whole)."""
    return url.removesuffix("/v1")


def _starter(behind_finish_fix: bool) -> Callable[[GatewayContext], Awaitable[Gateway]]:
    name = FINISH_FIX_NAME if behind_finish_fix else NAME

    async def start(ctx: GatewayContext) -> Gateway:
        finish_fix = await shared_finish_fix(ctx) if behind_finish_fix else None
        upstream = finish_fix.base_url if finish_fix else ctx.upstream()
        # One process per variant and topology (module docstring), in the topology's directory.
        env = {"GEMINI_API_BASE": _root(upstream), "GEMINI_API_KEY": LAB_API_KEY}
        running = await ctx.enter(open_litellm([], ctx.run_dir, name=name, env=env))
        return Gateway(
            name=name,
            base_url=running.base_url.removesuffix("/v1") + PASSTHROUGH_PATH + "/v1",
            books_path=running.books,
            api_key=running.master_key,
            capture_path=finish_fix.capture if finish_fix else None,
            configure=finish_fix.options.apply if finish_fix else None,
        )

    return start


_ROUTE_TEXT = (
    "LiteLLM: /gemini/{path} through its Google AI Studio pass-through (GEMINI_API_BASE the worker), relayed byte for byte"
)
_UNROUTED = MappingProxyType(
    {
        dialect: "its /gemini/ pass-through relays Google AI Studio requests only (the other dialects: the `litellm` column)"
        for dialect in (Dialect.CHAT, Dialect.MESSAGES, Dialect.RESPONSES)
    }
)

ENTRIES = tuple(
    GatewayEntry(
        name=FINISH_FIX_NAME if behind_finish_fix else NAME,
        summary=(
            f"{NAME}, finish_fix between it and the worker (the gateway-side placement)"
            if behind_finish_fix
            else "LiteLLM proxy 1.108.7's Google AI Studio pass-through (/gemini/...), GEMINI_API_BASE the worker: a proxy of its own"
        ),
        start=_starter(behind_finish_fix),
        # Books of the `litellm` kind, read as every LiteLLM variant's (labs.gateways.litellm_proxy).
        books_kind="litellm",
        routes=MappingProxyType({Dialect.GEMINI: Dialect.GEMINI}),
        unrouted=_UNROUTED,
        route_texts=MappingProxyType(
            {Dialect.GEMINI: _ROUTE_TEXT + (", with finish_fix in front of the worker" if behind_finish_fix else "")}
        ),
    )
    for behind_finish_fix in (False, True)
)
