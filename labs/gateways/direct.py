"""No gateway of the lab's own: `direct` (the client talks to the worker's tunnel itself) and
`external` (a gateway the engineer runs and points at the tunnel; the lab neither starts it nor
reads its books)."""

from __future__ import annotations

from labs.gateways.registry import EVERY_DIALECT_ROUTES, EXTERNAL, Gateway, GatewayContext, GatewayEntry


async def _start_direct(ctx: GatewayContext) -> Gateway:
    # `direct` and single-upstream gateways use the first worker only (issue 7, item 2).
    return Gateway(name="direct", base_url=f"{ctx.upstream()}/v1")


async def _start_external(ctx: GatewayContext) -> Gateway:
    if not ctx.external_url:
        raise ValueError("the external gateway needs --gateway-url")
    return Gateway(name=EXTERNAL, base_url=ctx.external_url.rstrip("/"), api_key=ctx.external_api_key)


ENTRIES = (
    GatewayEntry(
        name="direct",
        summary="no gateway: the client talks to the worker's tunnel",
        start=_start_direct,
        routes=EVERY_DIALECT_ROUTES,
    ),
    GatewayEntry(
        name=EXTERNAL,
        summary="your own gateway at --gateway-url, pointed at the tunnel (not started, no books read)",
        start=_start_external,
        # Whatever dialects you ask for; a scenario's `upstream_dialect` says when it translates.
        routes=EVERY_DIALECT_ROUTES,
    ),
)
