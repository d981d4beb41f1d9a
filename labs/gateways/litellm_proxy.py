"""LiteLLM's proxy as lab gateways: its native routes in every dialect (`litellm`), its three
translating bridges (`litellm-chat-bridge`, `litellm-responses-bridge`, `litellm-gemini-bridge`), and
each with finish_fix behind it (`...+finish_fix`: their deployments go through finish_fix to the worker, the
gateway-side placement).

Routes (LiteLLM 1.108.7, read in its source and checked against the worker's request log). Which
path LiteLLM takes for a request is decided by the provider of the deployment it routes to:

- Chat Completions: an `openai/` deployment calls the worker's `/v1/chat/completions`.
- Anthropic Messages, natively: an `anthropic/` deployment relays the worker's `/v1/messages` byte
  for byte (`llms/anthropic/pass_through/messages/handler.py`: providers with a Messages config
  pass through; its `api_base` is the server's root, LiteLLM appends `/v1/messages`).
- Messages through the **Chat bridge**: a provider with no Messages config (`hosted_vllm/`)
  calls the worker's Chat endpoint and translates each chunk (`pass_through/adapters/`); at the
  upstream's end it always sends `message_stop`, and a missing or unknown finish reason becomes
  `end_turn`.
- Messages through the **Responses bridge**: an `openai/` deployment (`_RESPONSES_API_PROVIDERS`)
  calls the worker's `/v1/responses` and translates its events (`pass_through/responses_adapters/`).
- OpenAI Responses, natively: an `openai/` deployment calls the worker's `/v1/responses` and
  re-serialises each event (data-only frames, its own response id, `[DONE]` at the end).
- Responses through the **Chat bridge**: a provider with no Responses config (`custom_openai/`)
  calls the worker's Chat endpoint (`responses/litellm_completion_transformation/`); at the
  upstream's end it sends `response.completed` (`response.incomplete` for `length`).

- Google Gemini, natively: a `gemini/` deployment whose `api_base` is the worker's root. The
  proxy's `/v1beta/models/{model}:streamGenerateContent` (`proxy/google_endpoints/endpoints.py`;
  also `/models/...`, never `/v1/models/...`, so Gemini clients are given `/v1beta`) calls the
  provider's own generate-content handler, which asks `{api_base}/models/{model}:
  streamGenerateContent?alt=sse` (`llms/vertex_ai/vertex_llm_base.py`) and passes each SSE event on
  as it came (`google_genai/streaming_iterator.py`).
- Gemini through the **Chat bridge**: a provider with no generate-content config (`hosted_vllm/`)
  calls the worker's Chat endpoint through LiteLLM's Gemini adapter (`google_genai/adapters/`),
  which maps `stop`, `tool_calls` and any other or no finish reason to `STOP`.
- Chat Completions from a Gemini worker (`litellm-gemini-bridge`): a `gemini/` deployment on the
  Chat route: LiteLLM's Gemini provider (`llms/vertex_ai/gemini/`) translates each chunk; a stream
  that ends without a `finishReason` gets a made-up `stop` (the wrapper's default finish).

One catch decides how the Responses upstreams are configured: LiteLLM streams from a `/v1/responses`
upstream only for a model its model map knows (`OpenAIResponsesAPIConfig.should_fake_stream`, from
`supports_native_streaming`); for any other it asks the worker without `stream` and makes the events
up from the JSON answer, so no stream fault could reach it. The router puts each deployment's own
model in that map, and an operator names its models; a wildcard deployment's model is the literal
`openai/*`. So the routes to `/v1/responses` are one deployment per model the run's cells name
(`TopologyPlan.models`), and the others one wildcard each.

One proxy serves every route of every variant, in every topology of the run. The model name says
which: the topology's route prefix (`TopologyPlan.route_prefix`: none for the default topology,
`hub/`, `hub+spare/` ...), `via-finish-fix/` for a finish_fix variant, then the route's own segment
(`ROUTES`: none for Chat, `messages/`, `messages-from-chat/` ...), then the cell's model. LiteLLM
matches the longest pattern first (`PatternMatchRouter`, patterns sorted by length) and an exact
name before any pattern, and fills the deployment's `*` with what the pattern's matched, so the
worker sees the cell's model name through every route. LiteLLM takes 25-90 s to start on a busy
2-core machine (the slowest gateway by far), so starting it once per run, not once per topology or
route, matters.

The spare worker (litellm 1.108.7, read in `litellm/router.py`): with a pool of two, each route
gets a second deployment to the spare worker at `order: 2`, the first at `order: 1`: LiteLLM's
documented priority failover ("Deployment Ordering (Priority)" in its load-balancing docs; the
spare is reached directly, also from the `via-finish-fix/` routes: it is healthy). The
router sends a request to the lowest order only; when that fails after its retries, it tries the
next order with the same model name (`Router.async_function_with_fallbacks_common_utils`,
"ORDER-BASED FALLBACKS", wildcard routes included). Retries are the shipped default,
`num_retries` = `openai.DEFAULT_MAX_RETRIES` = 2 (`Router.__init__`), the value its router
configuration docs use too. One variant, not two: without `order` the shipped routing
(`simple-shuffle`) takes the two deployments as peers and picks one at random per attempt, which
is no primary-and-spare and gives a different cell from run to run. What makes a Chat stream
retryable at all: `Router._acompletion` reads the stream's *first chunk* before it returns
(`_aread_first_chunk`), so a stream that dies before its first chunk raises inside the retry and
fallback machinery; after the first chunk, `_acompletion_streaming_iterator` re-raises the
provider's error to the client (a mid-stream fallback only happens before any content was
generated). A stream that ends cleanly with no chunk at all (the hub's `close` during prefill)
is no error to it: nothing is retried.

Books: LiteLLM's success/failure callbacks (labs.gateways.litellm_books), one JSON line each, for
every route.
"""

from __future__ import annotations

import json
import secrets
from collections.abc import AsyncIterator, Awaitable, Callable, Mapping
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from pathlib import Path
from types import MappingProxyType
from typing import Any

from finishline import Dialect
from labs.clients import LAB_API_KEY
from labs.gateways.finish_fix_proxy import shared_finish_fix
from labs.gateways.registry import REQUEST_PATHS, GatewayContext, GatewayEntry
from labs.gateways.services import BIN, Gateway, books_reader_from, open_service_on_free_ports
from labs.outcome import BOOKS_ERROR, BOOKS_OK

#: Environment variable naming the file LiteLLM's books callback (labs.gateways.litellm_books)
#: appends to: set here for the LiteLLM process, read there.
LITELLM_BOOKS_ENV = "FINISHLINE_LITELLM_BOOKS"
#: LiteLLM routes model names with this prefix through finish_fix.
VIA_FINISH_FIX = "via-finish-fix/"
SERVICE = "litellm"
NAME = "litellm"
CHAT_BRIDGE = "litellm-chat-bridge"
RESPONSES_BRIDGE = "litellm-responses-bridge"
GEMINI_BRIDGE = "litellm-gemini-bridge"
#: A variant's name with finish_fix behind it.
FINISH_FIX_SUFFIX = "+finish_fix"
FINISH_FIX_NAME = NAME + FINISH_FIX_SUFFIX


@dataclass(frozen=True, slots=True, kw_only=True)
class Route:
    """One path through LiteLLM: what a client speaks to it, what it speaks to the worker, and the
    deployment that makes it take that path."""

    #: The model-name segment that selects it (after the topology's and finish_fix's prefixes).
    segment: str
    #: The dialect LiteLLM speaks to the worker on this route.
    upstream: Dialect
    #: The LiteLLM provider of its deployments (`openai`, `anthropic`, `hosted_vllm`, ...).
    provider: str
    #: One deployment per model the run's cells name, rather than one wildcard (a `/v1/responses`
    #: upstream: see the module docstring).
    per_model: bool = False
    #: Whether the deployment's `api_base` is the server's root (LiteLLM's `anthropic/` appends
    #: `/v1/messages` itself) rather than its `/v1`.
    root_base: bool = False
    #: How the report names the route.
    text: str


#: Each LiteLLM gateway family's routes, by the dialect the client speaks.
ROUTES: Mapping[str, Mapping[Dialect, Route]] = MappingProxyType(
    {
        NAME: {
            Dialect.CHAT: Route(segment="", upstream=Dialect.CHAT, provider="openai", text="an openai/ deployment"),
            Dialect.MESSAGES: Route(
                segment="messages/",
                upstream=Dialect.MESSAGES,
                provider="anthropic",
                root_base=True,
                text="an anthropic/ deployment: the worker's /v1/messages relayed byte for byte",
            ),
            Dialect.RESPONSES: Route(
                segment="responses/",
                upstream=Dialect.RESPONSES,
                provider="openai",
                per_model=True,
                text="an openai/ deployment per model: the worker's /v1/responses, its events re-serialised",
            ),
            Dialect.GEMINI: Route(
                segment="gemini/",
                upstream=Dialect.GEMINI,
                provider="gemini",
                root_base=True,
                text="a gemini/ deployment (its own generate-content handler): the worker's stream relayed event by event",
            ),
        },
        CHAT_BRIDGE: {
            Dialect.MESSAGES: Route(
                segment="messages-from-chat/",
                upstream=Dialect.CHAT,
                provider="hosted_vllm",
                text="its Chat bridge (a hosted_vllm/ deployment): the worker's /v1/chat/completions, translated",
            ),
            Dialect.RESPONSES: Route(
                segment="responses-from-chat/",
                upstream=Dialect.CHAT,
                provider="custom_openai",
                text="its Chat bridge (a custom_openai/ deployment): the worker's /v1/chat/completions, translated",
            ),
            Dialect.GEMINI: Route(
                segment="gemini-from-chat/",
                upstream=Dialect.CHAT,
                provider="hosted_vllm",
                text="its Gemini adapter (a hosted_vllm/ deployment): the worker's /v1/chat/completions, translated",
            ),
        },
        RESPONSES_BRIDGE: {
            Dialect.MESSAGES: Route(
                segment="messages-from-responses/",
                upstream=Dialect.RESPONSES,
                provider="openai",
                per_model=True,
                text="its Responses bridge (an openai/ deployment per model): the worker's /v1/responses, translated",
            ),
        },
        GEMINI_BRIDGE: {
            Dialect.CHAT: Route(
                segment="chat-from-gemini/",
                upstream=Dialect.GEMINI,
                provider="gemini",
                root_base=True,
                text="its Gemini provider (a gemini/ deployment, api_base the worker): the worker's :streamGenerateContent, translated",
            ),
        },
    }
)


def family_of(name: str) -> str:
    """The LiteLLM gateway family of a variant name (`litellm-chat-bridge+finish_fix` ->
    `litellm-chat-bridge`)."""
    return name.removesuffix(FINISH_FIX_SUFFIX)


#: Every LiteLLM gateway name: each family alone and with finish_fix behind it.
VARIANTS = tuple(name for family in ROUTES for name in (family, family + FINISH_FIX_SUFFIX))


@dataclass(frozen=True, slots=True, kw_only=True)
class RunningLiteLLM:
    base_url: str
    books: Path
    master_key: str


def _deployment(model_name: str, model: str, base: str, spare_base: str | None) -> list[dict[str, Any]]:
    """One route's deployments: the primary, and the spare at the next order when there is one."""
    primary = {"model": model, "api_base": base, "api_key": LAB_API_KEY}
    if spare_base is None:
        return [{"model_name": model_name, "litellm_params": primary}]
    spare = {"model": model, "api_base": spare_base, "api_key": LAB_API_KEY, "order": 2}
    return [
        {"model_name": model_name, "litellm_params": {**primary, "order": 1}},
        {"model_name": model_name, "litellm_params": spare},
    ]


def _base(url: str, route: Route) -> str:
    """An OpenAI base URL (`.../v1`) as the route's deployments take it."""
    return url.removesuffix("/v1") if route.root_base else url


@dataclass(frozen=True, slots=True, kw_only=True)
class LiteLLMRoutes:
    """One topology's routes: its model-name prefix, its upstreams (OpenAI base URLs, `.../v1`), and
    which variants it runs."""

    prefix: str
    primary_base: str
    spare_base: str | None = None
    #: The topology's finish_fix, for the `via-finish-fix/` routes; None: no such routes.
    finish_fix_base: str | None = None
    #: The LiteLLM variants the topology runs (`VARIANTS`); by default `litellm` alone, and with it
    #: `litellm+finish_fix` when there is a finish_fix.
    variants: tuple[str, ...] = ()
    #: Per (variant, client dialect), the models its cells name (without any prefix), for the
    #: routes that need one deployment per model (`Route.per_model`).
    models: Mapping[tuple[str, Dialect], tuple[str, ...]] = field(default_factory=dict)

    def chosen(self) -> tuple[str, ...]:
        if self.variants:
            return self.variants
        return (NAME, FINISH_FIX_NAME) if self.finish_fix_base is not None else (NAME,)


def litellm_config(routes: list[LiteLLMRoutes], *, master_key: str) -> dict[str, Any]:
    """The proxy's config: per topology, per variant it runs, one wildcard or one deployment per
    model for each of the variant's routes (LiteLLM matches exact names, then the longest pattern,
    whatever their order here)."""
    model_list = []
    for topology in routes:
        for variant in topology.chosen():
            behind_finish_fix = variant.endswith(FINISH_FIX_SUFFIX)
            if behind_finish_fix and topology.finish_fix_base is None:
                raise ValueError(f"{variant} needs the topology's finish_fix")
            primary = topology.finish_fix_base if behind_finish_fix else topology.primary_base
            assert primary is not None
            prefix = topology.prefix + (VIA_FINISH_FIX if behind_finish_fix else "")
            for dialect, route in ROUTES[family_of(variant)].items():
                spare = _base(topology.spare_base, route) if topology.spare_base else None
                if route.per_model:
                    for model in dict.fromkeys(topology.models.get((variant, dialect), ())):
                        model_list += _deployment(
                            f"{prefix}{route.segment}{model}", f"{route.provider}/{model}", _base(primary, route), spare
                        )
                else:
                    model_list += _deployment(f"{prefix}{route.segment}*", f"{route.provider}/*", _base(primary, route), spare)
    return {
        "model_list": model_list,
        "litellm_settings": {"callbacks": ["labs.gateways.litellm_books.books"], "telemetry": False},
        "general_settings": {"master_key": master_key},
    }


@asynccontextmanager
async def open_litellm(
    routes: list[LiteLLMRoutes], run_dir: Path, *, name: str = SERVICE, env: Mapping[str, str] = MappingProxyType({})
) -> AsyncIterator[RunningLiteLLM]:
    """Run LiteLLM's proxy with `routes` until the block ends; its files go to `run_dir` named after
    `name`, and `env` is added to its environment (a provider's settings that only the environment
    holds: labs.gateways.litellm_passthrough)."""
    books = run_dir / f"{name}-books.jsonl"
    books.touch()
    config = run_dir / f"{name}-config.yaml"
    master_key = "sk-lab-" + secrets.token_hex(16)
    # JSON is valid YAML, and needs no YAML writer here.
    config.write_text(json.dumps(litellm_config(routes, master_key=master_key), indent=2))
    # LITELLM_LOCAL_MODEL_COST_MAP: the model map from the wheel, not fetched from GitHub at start.
    env = {LITELLM_BOOKS_ENV: str(books), "LITELLM_LOCAL_MODEL_COST_MAP": "True", "LITELLM_LOG": "ERROR", **env}

    def argv(port: int, _: int) -> list[str]:
        return [str(BIN / "litellm"), "--config", str(config), "--host", "127.0.0.1", "--port", str(port), "--num_workers", "1"]

    async with open_service_on_free_ports(
        f"{name} proxy",
        argv,
        log_path=run_dir / f"{name}.log",
        env=env,
        health_path="/health/liveliness",
    ) as port:
        yield RunningLiteLLM(base_url=f"http://127.0.0.1:{port}/v1", books=books, master_key=master_key)


async def _shared_litellm(ctx: GatewayContext) -> RunningLiteLLM:
    # One proxy per run, with the routes of every topology that runs a LiteLLM variant; a
    # topology's finish_fix routes need that topology's finish_fix running, so it is started
    # first when a `+finish_fix` variant is among the topology's gateways.
    async def start() -> RunningLiteLLM:
        routes = []
        for label, plan in ctx.topologies.items():
            variants = tuple(name for name in VARIANTS if name in plan.names)
            if not variants:
                continue
            if not plan.primary_url:
                raise ValueError("LiteLLM needs the worker's tunnel (primary_url)")
            wants_finish_fix = any(name.endswith(FINISH_FIX_SUFFIX) for name in variants)
            finish_fix = await shared_finish_fix(ctx, label) if wants_finish_fix else None
            routes.append(
                LiteLLMRoutes(
                    prefix=plan.route_prefix,
                    primary_base=f"{plan.primary_url}/v1",
                    spare_base=f"{plan.spare_url}/v1" if plan.spare_url else None,
                    finish_fix_base=finish_fix.base_url if finish_fix else None,
                    variants=variants,
                    models=plan.models,
                )
            )
        return await ctx.run.enter(open_litellm(routes, ctx.run.run_dir))

    return await ctx.run.shared_async(SERVICE, start)


def litellm_books(entry: dict[str, Any]) -> str:
    """The books' word for one callback line: `ok` for LiteLLM's `success`, else `error`."""
    return BOOKS_OK if entry.get("status") == "success" else BOOKS_ERROR


# The last line about a request is its entry: the router's retries and fallbacks book each failed
# attempt, then the attempt that answered. One catch, seen through the Responses bridge: a stream
# that ends without a terminal event is booked as a failure and then, sometimes (it depends on when
# the client lets go), as a success with what LiteLLM had, under the same `call_id` (one per
# request at the proxy, shared by its retries): LiteLLM's spend logs then hold both rows, and the
# books' word for such a cell varies from run to run (`--repeat` marks it unstable).
read_litellm_books = books_reader_from(litellm_books)


def _starter(variant: str) -> Callable[[GatewayContext], Awaitable[Gateway]]:
    behind_finish_fix = variant.endswith(FINISH_FIX_SUFFIX)
    family = ROUTES[family_of(variant)]

    async def start(ctx: GatewayContext) -> Gateway:
        running = await _shared_litellm(ctx)
        finish_fix = await shared_finish_fix(ctx) if behind_finish_fix else None
        return Gateway(
            name=variant,
            base_url=running.base_url,
            books_path=running.books,
            model_prefix=ctx.plan.route_prefix + (VIA_FINISH_FIX if behind_finish_fix else ""),
            route_prefixes={dialect: route.segment for dialect, route in family.items()},
            # LiteLLM's native Gemini routes are `/v1beta/models/...` and `/models/...`
            # (proxy/google_endpoints/endpoints.py): a Gemini SDK given `/v1` would ask
            # `/v1/models/...`, which the proxy does not serve.
            dialect_base_urls={Dialect.GEMINI: running.base_url.removesuffix("/v1") + "/v1beta"}
            if Dialect.GEMINI in family
            else {},
            api_key=running.master_key,
            capture_path=finish_fix.capture if finish_fix else None,
            configure=finish_fix.options.apply if finish_fix else None,
        )

    return start


_SUMMARIES = {
    NAME: "LiteLLM proxy 1.108.7, its native route in each dialect to the worker (the spare at order 2, retries as shipped)",
    CHAT_BRIDGE: "the same LiteLLM proxy: Messages, Responses and Gemini clients answered from the worker's Chat endpoint (its Chat bridge)",
    RESPONSES_BRIDGE: "the same LiteLLM proxy: Messages clients answered from the worker's Responses endpoint (its Responses bridge)",
    GEMINI_BRIDGE: "the same LiteLLM proxy: Chat clients answered from the worker's Gemini endpoint (its gemini/ provider)",
}
#: The path a dialect's client asks LiteLLM for, where it is not the lab's (`REQUEST_PATHS`).
CLIENT_PATHS = {Dialect.GEMINI: "/v1beta/models/{model}:streamGenerateContent"}
#: Why a family has no route for a dialect (the matrix's `n/a` line).
_UNROUTED: dict[str, dict[Dialect, str]] = {
    NAME: {},
    CHAT_BRIDGE: {Dialect.CHAT: "a Chat client needs no bridge to a Chat worker: its native route is the `litellm` column"},
    RESPONSES_BRIDGE: {
        Dialect.CHAT: "LiteLLM 1.108.7 bridges no Chat Completions request to /v1/responses",
        Dialect.GEMINI: "LiteLLM 1.108.7's Gemini adapter calls a deployment's Chat Completions, never /v1/responses",
        Dialect.RESPONSES: "a Responses client needs no bridge to a Responses worker: its native route is the `litellm` column",
    },
    GEMINI_BRIDGE: {
        # LiteLLM has no Messages or Responses config for `gemini/`: it would answer these with its
        # Chat bridge in front of the same provider, two translations whose Gemini side the Chat
        # cells show.
        Dialect.MESSAGES: "not run: LiteLLM answers /v1/messages from gemini/ through its Chat bridge, whose Gemini side the Chat cells show",
        Dialect.RESPONSES: "not run: LiteLLM answers /v1/responses from gemini/ through its Chat bridge, whose Gemini side the Chat cells show",
        Dialect.GEMINI: "a Gemini client needs no bridge to a Gemini worker: its relay is the `litellm-gemini-passthrough` column",
    },
}


def _entry(variant: str) -> GatewayEntry:
    family = family_of(variant)
    routes = ROUTES[family]
    behind_finish_fix = variant != family
    summary = _SUMMARIES[family]
    if behind_finish_fix:
        summary = f"{variant[: -len(FINISH_FIX_SUFFIX)]}, its deployments going through finish_fix to the worker (the gateway-side placement)"
    return GatewayEntry(
        name=variant,
        summary=summary,
        start=_starter(variant),
        books_kind="litellm",
        # One reader per kind: the family `litellm` declares it.
        read_books=read_litellm_books if variant == NAME else None,
        uses_spare=True,
        routes=MappingProxyType({d: r.upstream for d, r in routes.items()}),
        unrouted=MappingProxyType(_UNROUTED[family]),
        route_texts=MappingProxyType(
            {
                d: f"LiteLLM: {CLIENT_PATHS.get(d) or REQUEST_PATHS[d]} through {r.text}"
                + (", with finish_fix in front of the worker" if behind_finish_fix else "")
                for d, r in routes.items()
            }
        ),
    )


ENTRIES = tuple(_entry(variant) for variant in VARIANTS)
