"""The lab's hub: an HTTP reverse proxy between the gateways and the worker's tunnel.

The post-mortem's topology, `client -> gateway -> hub -> tunnel (toxiproxy) -> worker`: when the
tunnel fails mid-response the hub does what the scenario's `[hub] on_tunnel_drop` says (`close`,
`error_event` or `abort`, see `labs.hub.policy`).

- `labs.hub.policy`: the policies and what each sends, as data (no sockets).
- `labs.hub.relay`: the trio server, `serve_hub` (for `nursery.start`) and `open_hub`.
- `python -m labs.hub --help`: run it standalone.

    async with open_hub(upstream_port=tunnel_port, on_tunnel_drop="close") as hub:
        ...  # gateways' upstream: hub.url
        hub.on_tunnel_drop = "error_event"  # from the next request on
"""

from labs.hub.policy import (
    BAD_GATEWAY_BODY,
    ERROR_CODE,
    ERROR_EVENT,
    ERROR_MESSAGE,
    AfterDrop,
    ConnectionEnd,
    TunnelDropPolicy,
    TunnelFailure,
    after_tunnel_drop,
    bad_gateway_body,
    error_writer,
    parse_policy,
)
from labs.hub.relay import Hub, HubExchange, open_hub, serve_hub

__all__ = [
    "BAD_GATEWAY_BODY",
    "ERROR_CODE",
    "ERROR_EVENT",
    "ERROR_MESSAGE",
    "AfterDrop",
    "ConnectionEnd",
    "Hub",
    "HubExchange",
    "TunnelDropPolicy",
    "TunnelFailure",
    "after_tunnel_drop",
    "bad_gateway_body",
    "error_writer",
    "open_hub",
    "parse_policy",
    "serve_hub",
]
