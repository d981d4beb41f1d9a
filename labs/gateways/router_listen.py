"""The listen arguments SMG and vllm-router share: the same four flags for where the router
serves and where its Prometheus listener does, both on 127.0.0.1.

Neither router takes port 0 for either listener, so both ports come from
`labs.gateways.services.open_service_on_free_ports` (which tries others if one was taken).
"""

from __future__ import annotations

__all__ = ["router_listen_args"]


def router_listen_args(port: int, metrics_port: int) -> list[str]:
    """`--host`, `--port`, `--prometheus-host`, `--prometheus-port`, on 127.0.0.1 (nothing leaves
    the machine)."""
    return [
        "--host",
        "127.0.0.1",
        "--port",
        str(port),
        "--prometheus-host",
        "127.0.0.1",
        "--prometheus-port",
        str(metrics_port),
    ]
