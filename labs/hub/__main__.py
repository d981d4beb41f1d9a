"""`python -m labs.hub`: run the hub standalone in front of a tunnel (or any HTTP/1.1 upstream).

python -m labs.hub --upstream 127.0.0.1:8401 --port 8402 --on-tunnel-drop close
"""

from __future__ import annotations

import argparse
import sys
from functools import partial

import trio

from faults.cli_parser import OneLineParser
from labs.hub.policy import TunnelDropPolicy, parse_policy
from labs.hub.relay import serve_hub
from labs.worker.server import run_server_cli

DEFAULT_PORT = 8402
PROG = "python -m labs.hub"


def _upstream(text: str) -> tuple[str, int]:
    host, sep, port = text.rpartition(":")
    if not sep or not host or not port.isdigit() or not 0 < int(port) < 65536:
        raise argparse.ArgumentTypeError(f"{text!r} is not HOST:PORT, e.g. 127.0.0.1:8401")
    return host, int(port)


def _policy(text: str) -> TunnelDropPolicy:
    try:
        return parse_policy(text)
    except ValueError as error:
        raise argparse.ArgumentTypeError(str(error)) from None


def _port(text: str) -> int:
    if not text.isdigit() or not 0 <= int(text) < 65536:
        raise argparse.ArgumentTypeError(f"{text!r} is not a port (0 to 65535, 0 for any free one)")
    return int(text)


def build_parser() -> argparse.ArgumentParser:
    parser = OneLineParser(
        prog=PROG,
        description="The lab's hub: an HTTP/1.1 reverse proxy in front of the worker's tunnel. When the "
        "tunnel fails mid-response it ends the response cleanly (close), sends an SSE error event and "
        "ends cleanly (error_event), or passes the failure on (abort).",
    )
    parser.add_argument(
        "--upstream",
        type=_upstream,
        required=True,
        metavar="HOST:PORT",
        help="the tunnel (or worker) to relay to, e.g. 127.0.0.1:8401",
    )
    parser.add_argument("--host", default="127.0.0.1", help="address to listen on (default 127.0.0.1)")
    parser.add_argument(
        "--port", type=_port, default=DEFAULT_PORT, help=f"port to listen on, 0 for any free one (default {DEFAULT_PORT})"
    )
    parser.add_argument(
        "--on-tunnel-drop",
        type=_policy,
        default=TunnelDropPolicy.CLOSE,
        metavar="POLICY",
        help="close, error_event or abort (default close)",
    )
    return parser


async def _run(arguments: argparse.Namespace) -> None:
    host, port = arguments.upstream
    async with trio.open_nursery() as nursery:
        hub = await nursery.start(
            partial(
                serve_hub,
                upstream_host=host,
                upstream_port=port,
                on_tunnel_drop=arguments.on_tunnel_drop,
                host=arguments.host,
                port=arguments.port,
            )
        )
        print(f"hub listening on {hub.url}/v1 -> {host}:{port} (on_tunnel_drop={hub.on_tunnel_drop})", flush=True)


def main(argv: list[str] | None = None) -> int:
    arguments = build_parser().parse_args(argv)
    return run_server_cli(_run, arguments, host=arguments.host, port=arguments.port)


if __name__ == "__main__":
    sys.exit(main())
