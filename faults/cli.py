"""`python -m faults`: run toxiproxy and apply the faults by hand, against a running lab.

    python -m faults server --proxy worker --listen 127.0.0.1:8401 --upstream 127.0.0.1:8400
    python -m faults cut_after_tokens 7 --for 30      # probe the stream, then cut after 7 tokens
    python -m faults down                             # until Ctrl-C

A fault stays applied while the command runs (`--for SECONDS`, or until Ctrl-C, SIGTERM or SIGHUP)
and is removed when it ends, like the context managers; `server` stops toxiproxy the same way (and
toxiproxy dies with it even on SIGKILL). Each ends with one line saying what stopped it. Bad input is
one line on stderr and exit status 2.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import signal
import sys
import threading
from collections.abc import Sequence
from typing import Any
from urllib.parse import urlsplit

from faults import catalog
from faults.cli_parser import EXIT_USAGE, OneLineParser, number_type
from faults.layout import LayoutError, ResponseLayout
from faults.probe import UnstableUpstream, probe_layout
from faults.toxiproxy_client import (
    NotFound,
    ProxyExists,
    ProxyInfo,
    ToxiproxyClient,
    ToxiproxyError,
    ToxiproxyUnavailable,
)
from faults.toxiproxy_server import ToxiproxyServerError, run_toxiproxy_server
from finishline import Dialect

# A CLI is the top layer: `--worker-settings` computes the byte counts of the lab's simulated worker
# with the worker's own code (its settings and wire), the one part of `faults` that knows the lab.
from labs.worker.server import completion_dialect
from labs.worker.settings import SettingsError, parse_settings
from labs.worker.wire import response_plan

__all__ = ["main"]

DEFAULT_TOXIPROXY_URL = "http://127.0.0.1:8474"
DEFAULT_REQUEST = {
    "model": "finishline-worker",
    "stream": True,
    "messages": [{"role": "user", "content": "Hello"}],
}


class UsageError(Exception):
    """Bad input: printed as one line, exit status 2."""


class _Parser(OneLineParser):
    def explain(self, message: str) -> str:
        # A mistyped command is almost always a mistyped fault: name the faults apart from the rest.
        unknown = re.match(r"argument COMMAND: invalid choice: '([^']*)'", message)
        if unknown:
            return (
                f"unknown fault {unknown.group(1)!r}; faults: {', '.join(catalog.FAULT_NAMES)}; "
                "other commands: server, proxy, list, reset"
            )
        return message


_count = number_type(
    whole=True,
    at_least=0,
    not_a_number=lambda text: f"n must be a whole number of token events, got {text!r}",
    out_of_range=lambda text, value: f"n must be >= 0 token events, got {value}",
)


def _address(text: str) -> str:
    host, _, port = text.rpartition(":")
    if not host or not port.isdigit():
        raise argparse.ArgumentTypeError(f"expected HOST:PORT, got {text!r}")
    return text


def build_parser() -> argparse.ArgumentParser:
    parser = _Parser(
        prog="python -m faults",
        description="Apply finishline's faults through a running toxiproxy server, or run one.",
    )
    parser.add_argument(
        "--toxiproxy",
        default=os.environ.get("TOXIPROXY_URL", DEFAULT_TOXIPROXY_URL),
        help=f"toxiproxy API URL (default $TOXIPROXY_URL or {DEFAULT_TOXIPROXY_URL})",
    )
    commands = parser.add_subparsers(dest="command", metavar="COMMAND", parser_class=_Parser)
    commands.required = True

    server = commands.add_parser(
        "server", help="run toxiproxy-server here until Ctrl-C or SIGTERM (API on --toxiproxy's port; 0: any free port)"
    )
    _add_proxy_arguments(server, required=False)

    proxy = commands.add_parser("proxy", help="create a proxy on the running server")
    _add_proxy_arguments(proxy, required=True)

    commands.add_parser("list", help="show the proxies and their toxics")
    commands.add_parser("reset", help="remove every toxic and re-enable every proxy")

    for name in ("cut_during_prefill", "cut_after_tokens", "stall_after_tokens"):
        sub = commands.add_parser(name, help=_first_line(getattr(catalog, name)))
        if name != "cut_during_prefill":
            sub.add_argument("n", type=_count, help="token events the client receives before the fault")
        if name != "stall_after_tokens":
            sub.add_argument("--reset", action="store_true", help="end with a TCP reset instead of a FIN")
        layout = sub.add_argument_group(
            "byte counts",
            "By default the stream is probed: the request is sent twice through the proxy before the "
            "fault, and the byte count is read from the captures (any upstream that answers with a "
            "stable layout). --worker-settings computes it instead (the simulated worker only).",
        )
        layout.add_argument("--request", default=json.dumps(DEFAULT_REQUEST), help="request body JSON (default: %(default)s)")
        layout.add_argument("--path", default="/v1/chat/completions", help="request path (default: %(default)s)")
        layout.add_argument("--header", action="append", default=[], metavar="NAME:VALUE", help="request header, repeatable")
        layout.add_argument(
            "--worker-settings",
            metavar="SETTINGS",
            help="compute the count for the worker with these effective settings, e.g. 'tokens=16' "
            "(what it echoes in x-finishline-worker) instead of probing",
        )
        _add_common(sub)

    sub = commands.add_parser("slice", help=_first_line(catalog.slice))
    sub.add_argument("--average-size", type=int, default=3, help="bytes per segment on average (default 3)")
    sub.add_argument("--size-variation", type=int, default=2, help="± bytes (default 2)")
    sub.add_argument("--delay-us", type=int, default=100, help="microseconds between segments (default 100)")
    _add_common(sub)
    sub = commands.add_parser("latency", help=_first_line(catalog.latency))
    sub.add_argument("--ms", type=int, default=100, help="added latency in ms (default 100)")
    sub.add_argument("--jitter", type=int, default=50, help="± ms (default 50)")
    _add_common(sub)
    sub = commands.add_parser("bandwidth", help=_first_line(catalog.bandwidth))
    sub.add_argument("--rate", type=int, default=1, help="KB/s (default 1)")
    _add_common(sub)
    _add_common(commands.add_parser("down", help=_first_line(catalog.down)))
    return parser


def _add_proxy_arguments(parser: argparse.ArgumentParser, *, required: bool) -> None:
    parser.add_argument("--proxy", default="worker", help="proxy name (default worker)")
    parser.add_argument("--listen", type=_address, required=required, help="HOST:PORT clients connect to")
    parser.add_argument("--upstream", type=_address, required=required, help="HOST:PORT of the worker or gateway")


def _add_common(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--proxy", default="worker", help="proxy to apply the fault to (default worker)")
    parser.add_argument("--for", dest="seconds", type=float, help="remove the fault after this many seconds (default: Ctrl-C)")


def _first_line(function: Any) -> str:
    return (function.__doc__ or "").strip().splitlines()[0]


def main(argv: Sequence[str] | None = None) -> int:
    for number in (signal.SIGTERM, signal.SIGHUP):
        signal.signal(number, _on_stop_signal)
    try:
        arguments = build_parser().parse_args(argv)
        return _run(arguments)
    except UsageError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return EXIT_USAGE
    except KeyboardInterrupt:
        return 130


def _client(arguments: argparse.Namespace) -> ToxiproxyClient:
    url = urlsplit(arguments.toxiproxy if "//" in arguments.toxiproxy else "http://" + arguments.toxiproxy)
    if not url.hostname or url.port is None:
        raise UsageError(f"--toxiproxy must be a URL with a port like {DEFAULT_TOXIPROXY_URL}, got {arguments.toxiproxy!r}")
    return ToxiproxyClient(host=url.hostname, port=url.port)


def _run(arguments: argparse.Namespace) -> int:
    client = _client(arguments)
    if arguments.command == "server":
        return _serve(client, arguments)
    try:
        if arguments.command == "proxy":
            info = client.create_proxy(arguments.proxy, upstream=arguments.upstream, listen=arguments.listen)
            print(f"proxy {info.name}: {info.listen} -> {info.upstream}")
        elif arguments.command == "list":
            for name, info in sorted(client.proxies().items()):
                toxics = ", ".join(f"{t.name} ({t.type} {dict(t.attributes)})" for t in client.toxics(name)) or "no toxics"
                print(f"{name}: {info.listen} -> {info.upstream}, {'enabled' if info.enabled else 'disabled'}, {toxics}")
        elif arguments.command == "reset":
            client.reset()
            print("every toxic removed, every proxy enabled")
        else:
            _apply(client, arguments)
    except ToxiproxyUnavailable:
        raise UsageError(
            f"toxiproxy is not running at {client.url}: start it with `python -m faults server` or pass --toxiproxy URL"
        ) from None
    except ProxyExists:
        raise UsageError(
            f"a proxy named {arguments.proxy!r} exists already: pick another --proxy or run `python -m faults reset`"
        ) from None
    except NotFound:
        raise UsageError(
            f"no proxy named {arguments.proxy!r} at {client.url}: create it with `python -m faults proxy --proxy "
            f"{arguments.proxy} --listen HOST:PORT --upstream HOST:PORT`"
        ) from None
    except ToxiproxyError as exc:
        raise UsageError(str(exc)) from None
    return 0


def _apply(client: ToxiproxyClient, arguments: argparse.Namespace) -> None:
    try:
        fault = _fault(client, arguments)
    except UsageError:
        if _stopped_by:  # stopped while probing: the probe's own failure is not the news
            print(f"{arguments.command} not applied ({_stopped_by[0]})", flush=True)
            return
        raise
    if _stopped_by:
        # Stopped while probing: do not apply a fault only to remove it.
        print(f"{fault.name} not applied ({_stopped_by[0]})", flush=True)
        return
    with fault.applied(client, arguments.proxy):
        lasting = f"for {arguments.seconds:g} s" if arguments.seconds is not None else "until Ctrl-C"
        print(f"{fault.name} on proxy {arguments.proxy}: {fault.summary} ({lasting})", flush=True)
        stopped_by = _wait(arguments.seconds)
    print(f"{fault.name} removed" + (f" ({stopped_by})" if stopped_by else ""), flush=True)


def _fault(client: ToxiproxyClient, arguments: argparse.Namespace) -> catalog.Fault:
    name = arguments.command
    try:
        if name == "slice":
            return catalog.slice(
                average_size=arguments.average_size,
                size_variation=arguments.size_variation,
                delay_microseconds=arguments.delay_us,
            )
        if name == "latency":
            return catalog.latency(milliseconds=arguments.ms, jitter=arguments.jitter)
        if name == "bandwidth":
            return catalog.bandwidth(kilobytes_per_second=arguments.rate)
        if name == "down":
            client.proxies()[arguments.proxy]  # refuse an unknown proxy before "applying" anything
            return catalog.down()
        layout = _layout(client, arguments)
        if name == "cut_during_prefill":
            return catalog.cut_during_prefill(layout, reset=arguments.reset)
        if name == "cut_after_tokens":
            return catalog.cut_after_tokens(arguments.n, layout, reset=arguments.reset)
        return catalog.stall_after_tokens(arguments.n, layout)
    except KeyError:
        raise NotFound(arguments.proxy) from None
    except (ValueError, LayoutError, UnstableUpstream) as exc:
        raise UsageError(str(exc)) from None


def _layout(client: ToxiproxyClient, arguments: argparse.Namespace) -> ResponseLayout:
    try:
        body = json.loads(arguments.request)
    except ValueError as exc:
        raise UsageError(f"--request is not JSON: {exc}") from None
    if not isinstance(body, dict):
        raise UsageError("--request must be a JSON object")
    if arguments.worker_settings is not None:
        try:
            settings = parse_settings(arguments.worker_settings).for_request(body)
        except SettingsError as exc:
            raise UsageError(str(exc)) from None
        return response_plan(settings, stream=body.get("stream") is True)
    headers = {}
    for item in arguments.header:
        name, sep, value = item.partition(":")
        if not sep:
            raise UsageError(f"--header must be NAME:VALUE, got {item!r}")
        headers[name.strip()] = value.strip()
    info = client.proxies()[arguments.proxy]
    _refuse_a_faulty_proxy(client, info)
    try:
        return probe_layout(
            info.listen_host,
            info.listen_port,
            body=body,
            path=arguments.path,
            headers=headers,
            timeout=30,
            dialect=_dialect_of_path(arguments.path),
        )
    except OSError as exc:
        # Through toxiproxy a stopped upstream looks like a reset, not a refusal; a response cut
        # short (a fault applied after the check above) arrives as a ConnectionError from the probe.
        raise UsageError(
            f"cannot probe the stream through proxy {info.name} ({info.listen} -> {info.upstream}): {exc}; "
            "is the upstream running? (and no other fault applied: `python -m faults list`)"
        ) from None


def _dialect_of_path(path: str) -> Dialect:
    """The dialect whose token events a probe of `path` counts: the worker's completion route of
    that path (`.../messages`, `.../responses`, Gemini's `...:streamGenerateContent?alt=sse`), else
    Chat Completions."""
    return completion_dialect(path.split("?", 1)[0]) or Dialect.CHAT


def _refuse_a_faulty_proxy(client: ToxiproxyClient, info: ProxyInfo) -> None:
    """Probing measures the clean stream: a proxy that is down or has toxics would give wrong counts."""
    toxics = client.toxics(info.name)
    if info.enabled and not toxics:
        return
    held = ", ".join(f"{t.name} ({t.type})" for t in toxics) if toxics else "it is down (disabled)"
    raise UsageError(
        f"proxy {info.name} has a fault applied already: {held}; stop the command holding it "
        "(Ctrl-C, or kill its PID) or run `python -m faults reset`, then try again"
    )


#: Set by SIGTERM and SIGHUP, so `kill`, `timeout` and a closed terminal end a command cleanly, like
#: Ctrl-C does (Ctrl-C does not reach a job started with `&`). Installed at the start of `main`: a
#: signal that arrives while a fault is being applied must not kill the process before it removes
#: the fault, so the handler only records it.
_terminated = threading.Event()
_stopped_by: list[str] = []


def _on_stop_signal(number: int, frame: Any) -> None:
    _stopped_by.append(signal.Signals(number).name)
    _terminated.set()


def _wait(seconds: float | None) -> str | None:
    """Wait `seconds` (None: forever) or until stopped; returns what stopped it, None for time."""
    try:
        _terminated.wait(seconds)
    except KeyboardInterrupt:
        return "Ctrl-C"
    return _stopped_by[0] if _stopped_by else None


def _serve(client: ToxiproxyClient, arguments: argparse.Namespace) -> int:
    try:
        with run_toxiproxy_server(host=client.host, port=client.port) as server:
            line = f"toxiproxy {server.client.version()} API on {server.url}"
            if arguments.listen and arguments.upstream:
                info = server.client.create_proxy(arguments.proxy, upstream=arguments.upstream, listen=arguments.listen)
                line += f"; proxy {info.name}: {info.listen} -> {info.upstream}"
            print(line + " (Ctrl-C to stop)", flush=True)
            stopped_by = _wait(None)
        print(f"toxiproxy on {server.url} stopped ({stopped_by})", flush=True)
    except ToxiproxyServerError as exc:
        raise UsageError(str(exc)) from None
    except ToxiproxyError as exc:
        raise UsageError(f"toxiproxy refused the proxy: {exc}") from None
    return 0
