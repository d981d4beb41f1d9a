"""vllm-router (PyPI `vllm-router` 0.1.17, the vLLM project's Rust router, a fork of the
sglang-router that SMG grew from) as the lab gateway `vllm-router`.

It routes every model to every worker (it does not match the request's model: its policy registry
files the workers under `unknown`), so it is started with the worker URLs on its command line:
the primary, then the spare when the pool has two, `--policy round_robin`. Retries and circuit
breaker are its defaults (retried: a failed send or a retryable status before the response head;
a new worker is picked per attempt), which is the failover its README describes; once a 200 head
was forwarded, a cut is passed on as a broken body, never retried.

Books: none. It keeps aggregate Prometheus counters (per route and per worker, no model or
request id) and logs no per-request line at its default level, so nothing says what became of
one request.
"""

from __future__ import annotations

from types import MappingProxyType

from finishline import Dialect
from labs.gateways.registry import NATIVE_ROUTES, GatewayContext, GatewayEntry
from labs.gateways.router_listen import router_listen_args
from labs.gateways.services import Gateway, open_service_on_free_ports
from labs.gateways.tool_envs import missing_tool_env, tool_binary
from labs.outcome import BOOKS_NONE

PIN = "vllm-router==0.1.17"


def vllm_router_missing() -> str | None:
    return missing_tool_env("vllm-router", "vllm-router", PIN)


async def _start(ctx: GatewayContext) -> Gateway:
    upstreams = [ctx.upstream(), *([ctx.spare_url] if ctx.spare_url else [])]

    def argv(port: int, metrics_port: int) -> list[str]:
        return [
            str(tool_binary("vllm-router", "vllm-router")),
            *router_listen_args(port, metrics_port),
            "--worker-urls",
            *upstreams,
            "--policy",
            "round_robin",
        ]

    # It answers /health only once every worker answered its own (it waits for them at start).
    port = await ctx.enter(
        open_service_on_free_ports(
            "vllm-router",
            argv,
            log_path=ctx.run_dir / "vllm-router.log",
            health_path="/health",
        )
    )
    return Gateway(name="vllm-router", base_url=f"http://127.0.0.1:{port}/v1")


ENTRIES = (
    GatewayEntry(
        name="vllm-router",
        summary="vllm-router 0.1.17 (round robin over the worker and the spare, retries as shipped; keeps no per-request books)",
        start=_start,
        missing=vllm_router_missing,
        books_kind=BOOKS_NONE,
        uses_spare=True,
        routes=MappingProxyType({**NATIVE_ROUTES, Dialect.GEMINI: Dialect.GEMINI}),
        route_texts=MappingProxyType(
            {
                Dialect.CHAT: "vllm-router: /v1/chat/completions, round robin",
                # 0.1.17 has no /v1/messages route: its catch-all proxy forwards any other path to
                # a worker (observed; the router's `fallback(transparent_proxy_handler)`).
                Dialect.MESSAGES: "vllm-router: /v1/messages forwarded by its catch-all proxy route (no route of its own), round robin",
                Dialect.RESPONSES: "vllm-router: /v1/responses, round robin",
                # The same catch-all for Gemini's path; it forwards the path without its query
                # (observed: the worker sees no `alt=sse`), so the worker answers a stream request
                # in Gemini's JSON-array form, whatever the client asked for.
                Dialect.GEMINI: "vllm-router: /v1/models/{model}:streamGenerateContent forwarded by its catch-all proxy route "
                "without its query (`?alt=sse` lost: the worker answers in the JSON-array form), round robin",
            }
        ),
    ),
)
