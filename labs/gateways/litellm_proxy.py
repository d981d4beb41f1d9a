"""LiteLLM's proxy as lab gateways: `litellm` (straight to the worker) and `litellm+finish_fix`
(its deployment goes through finish_fix to the worker: the gateway-side placement).

One proxy serves both, in every topology of the run: its model list routes a model name starting
with `via-finish-fix/` to the run's finish_fix (labs.gateways.finish_fix_proxy) and every other name
straight to the primary upstream, and each topology's routes start with that topology's route
prefix (`TopologyPlan.route_prefix`: none for the default topology, `hub/`, `hub+spare/` ...), whose
deployments point at that topology's upstreams (`hub/via-finish-fix/*` at the hub topology's
finish_fix). LiteLLM matches the longest pattern first (`PatternMatchRouter`, patterns sorted by
length), and replaces the `*` of `openai/*` with what the pattern's `*` matched, so the worker sees
the same model name through every route. LiteLLM takes 25-90 s to start on a busy 2-core machine
(the slowest gateway by far), so starting it once per run, not once per topology, matters.

The spare worker (litellm 1.108.7, read in `litellm/router.py`): with a pool of two, each route
gets a second deployment to the spare worker at `order: 2`, the first at `order: 1`: LiteLLM's
documented priority failover ("Deployment Ordering (Priority)" in its load-balancing docs; the
spare is reached directly, also from the `via-finish-fix/` route: it is healthy). The
router sends a request to the lowest order only; when that fails after its retries, it tries the
next order with the same model name (`Router.async_function_with_fallbacks_common_utils`,
"ORDER-BASED FALLBACKS", wildcard routes included). Retries are the shipped default,
`num_retries` = `openai.DEFAULT_MAX_RETRIES` = 2 (`Router.__init__`), the value its router
configuration docs use too. One variant, not two: without `order` the shipped routing
(`simple-shuffle`) takes the two deployments as peers and picks one at random per attempt, which
is no primary-and-spare and gives a different cell from run to run. What makes a stream retryable
at all: `Router._acompletion` reads the stream's *first chunk* before it returns
(`_aread_first_chunk`), so a stream that dies before its first chunk raises inside the retry and
fallback machinery; after the first chunk, `_acompletion_streaming_iterator` re-raises the
provider's error to the client (a mid-stream fallback only happens before any content was
generated). A stream that ends cleanly with no chunk at all (the hub's `close` during prefill)
is no error to it: nothing is retried.

Books: LiteLLM's success/failure callbacks (labs.gateways.litellm_books), one JSON line each.
"""

from __future__ import annotations

import json
import secrets
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from labs.clients import LAB_API_KEY
from labs.gateways import LITELLM_BOOKS_ENV
from labs.gateways.finish_fix_proxy import shared_finish_fix
from labs.gateways.registry import GatewayContext, GatewayEntry
from labs.gateways.services import BIN, Gateway, books_reader_from, open_service_on_free_ports
from labs.outcome import BOOKS_ERROR, BOOKS_OK

#: LiteLLM routes model names with this prefix through finish_fix.
VIA_FINISH_FIX = "via-finish-fix/"
SERVICE = "litellm"
NAME = "litellm"
FINISH_FIX_NAME = "litellm+finish_fix"


@dataclass(frozen=True, slots=True, kw_only=True)
class RunningLiteLLM:
    base_url: str
    books: Path
    master_key: str


def _deployments(model_name: str, primary_base: str, spare_base: str | None) -> list[dict[str, Any]]:
    """One route: the primary deployment, and the spare at the next order when there is one."""
    primary = {"model": "openai/*", "api_base": primary_base, "api_key": LAB_API_KEY}
    if spare_base is None:
        return [{"model_name": model_name, "litellm_params": primary}]
    spare = {"model": "openai/*", "api_base": spare_base, "api_key": LAB_API_KEY, "order": 2}
    return [
        {"model_name": model_name, "litellm_params": {**primary, "order": 1}},
        {"model_name": model_name, "litellm_params": spare},
    ]


@dataclass(frozen=True, slots=True, kw_only=True)
class LiteLLMRoutes:
    """One topology's routes: its model-name prefix and its upstreams (OpenAI base URLs)."""

    prefix: str
    primary_base: str
    spare_base: str | None = None
    #: The topology's finish_fix, for the `via-finish-fix/` route; None: no such route.
    finish_fix_base: str | None = None


def litellm_config(routes: list[LiteLLMRoutes], *, master_key: str) -> dict[str, Any]:
    """The proxy's config: per topology, its `via-finish-fix/` route and its wildcard route (LiteLLM
    matches the longer pattern first, whatever their order here)."""
    model_list = []
    for route in routes:
        if route.finish_fix_base is not None:
            model_list += _deployments(f"{route.prefix}{VIA_FINISH_FIX}*", route.finish_fix_base, route.spare_base)
        model_list += _deployments(f"{route.prefix}*", route.primary_base, route.spare_base)
    return {
        "model_list": model_list,
        "litellm_settings": {"callbacks": ["labs.gateways.litellm_books.books"], "telemetry": False},
        "general_settings": {"master_key": master_key},
    }


@asynccontextmanager
async def open_litellm(routes: list[LiteLLMRoutes], run_dir: Path) -> AsyncIterator[RunningLiteLLM]:
    books = run_dir / "litellm-books.jsonl"
    books.touch()
    config = run_dir / "litellm-config.yaml"
    master_key = "sk-lab-" + secrets.token_hex(16)
    # JSON is valid YAML, and needs no YAML writer here.
    config.write_text(json.dumps(litellm_config(routes, master_key=master_key), indent=2))
    env = {LITELLM_BOOKS_ENV: str(books), "LITELLM_LOCAL_MODEL_COST_MAP": "True", "LITELLM_LOG": "ERROR"}

    def argv(port: int, _: int) -> list[str]:
        return [str(BIN / "litellm"), "--config", str(config), "--host", "127.0.0.1", "--port", str(port), "--num_workers", "1"]

    async with open_service_on_free_ports(
        "litellm proxy",
        argv,
        log_path=run_dir / "litellm.log",
        env=env,
        health_path="/health/liveliness",
        start_timeout=120,
    ) as port:
        yield RunningLiteLLM(base_url=f"http://127.0.0.1:{port}/v1", books=books, master_key=master_key)


async def _shared_litellm(ctx: GatewayContext) -> RunningLiteLLM:
    # One proxy per run, with the routes of every topology that runs a LiteLLM variant; a
    # topology's finish_fix route needs that topology's finish_fix running, so it is started first
    # when `litellm+finish_fix` is among the topology's gateways.
    async def start() -> RunningLiteLLM:
        routes = []
        for label, plan in ctx.topologies.items():
            if not {NAME, FINISH_FIX_NAME} & set(plan.names):
                continue
            if not plan.primary_url:
                raise ValueError("LiteLLM needs the worker's tunnel (primary_url)")
            finish_fix = await shared_finish_fix(ctx, label) if FINISH_FIX_NAME in plan.names else None
            routes.append(
                LiteLLMRoutes(
                    prefix=plan.route_prefix,
                    primary_base=f"{plan.primary_url}/v1",
                    spare_base=f"{plan.spare_url}/v1" if plan.spare_url else None,
                    finish_fix_base=finish_fix.base_url if finish_fix else None,
                )
            )
        return await ctx.run.enter(open_litellm(routes, ctx.run.run_dir))

    return await ctx.run.shared_async(SERVICE, start)


def litellm_books(entry: dict[str, Any]) -> str:
    """The books' word for one callback line: `ok` for LiteLLM's `success`, else `error`."""
    return BOOKS_OK if entry.get("status") == "success" else BOOKS_ERROR


read_litellm_books = books_reader_from(litellm_books)


async def _start_litellm(ctx: GatewayContext) -> Gateway:
    running = await _shared_litellm(ctx)
    return Gateway(
        name=NAME,
        base_url=running.base_url,
        books_path=running.books,
        model_prefix=ctx.plan.route_prefix,
        api_key=running.master_key,
    )


async def _start_litellm_finish_fix(ctx: GatewayContext) -> Gateway:
    running = await _shared_litellm(ctx)
    capture = (await shared_finish_fix(ctx)).capture
    return Gateway(
        name=FINISH_FIX_NAME,
        base_url=running.base_url,
        books_path=running.books,
        model_prefix=ctx.plan.route_prefix + VIA_FINISH_FIX,
        api_key=running.master_key,
        capture_path=capture,
    )


ENTRIES = (
    GatewayEntry(
        name=NAME,
        summary="LiteLLM proxy 1.108.7, one wildcard route to the worker (the spare at order 2, retries as shipped)",
        start=_start_litellm,
        books_kind="litellm",
        read_books=read_litellm_books,
        uses_spare=True,
    ),
    GatewayEntry(
        name=FINISH_FIX_NAME,
        summary="the same LiteLLM proxy, its deployment going through finish_fix to the worker (the gateway-side placement)",
        start=_start_litellm_finish_fix,
        books_kind="litellm",
        uses_spare=True,
    ),
)
