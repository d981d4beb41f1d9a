"""`python -m labs.grade gateway|server ...`: grade a gateway or a server, print the card, exit 0/1/2.

Exit status: 0 when every check that ran passed, 1 when one failed, 2 when the grader could not run
(a bad argument, the target unreachable), with one line `error: ...` saying what to fix.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Callable
from functools import partial
from pathlib import Path

from faults.cli_parser import OneLineParser, number_type
from finishline import Dialect
from labs.clients import LIBRARY_CLIENTS_BY_DIALECT
from labs.dialects import LAB_DIALECTS
from labs.entry import run_command
from labs.gateways import GATEWAYS
from labs.gateways.registry import lookup, unserved_reason
from labs.grade.card import EXIT_CANNOT_RUN, EXIT_FAILED, EXIT_PASSED, Card, GradeError
from labs.grade.gateway_checks import DEFAULT_GATEWAY_CLIENTS_BY_DIALECT
from labs.grade.gateway_grader import grade_gateway
from labs.grade.gateway_plan import GatewayTarget
from labs.grade.lab_gateways import grade_lab_gateways
from labs.grade.render import render_cards_markdown, render_terminal, write_html, write_json
from labs.grade.server_grader import grade_server
from labs.grade.server_suites import SERVER_SUITES

__all__ = ["build_parser", "main"]


def _port(text: str) -> int:
    try:
        port = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a port number (1-65535)") from None
    if not 1 <= port <= 65535:
        raise argparse.ArgumentTypeError(f"{port} is not a port number (1-65535)")
    return port


_seconds = number_type(
    above=0,
    not_a_number=lambda text: f"{text!r} is not a number of seconds",
    out_of_range=lambda text, value: f"{text} must be above 0 seconds",
)


def _url(text: str) -> str:
    if not text.startswith(("http://", "https://")):
        raise argparse.ArgumentTypeError(f"{text!r} is not an http:// or https:// base URL (e.g. http://127.0.0.1:4000/v1)")
    return text.rstrip("/")


_DIALECTS = [d.value for d in LAB_DIALECTS]
#: The clients the graders drive: every dialect's client libraries (no coding agent).
_GRADING_CLIENTS = tuple(dict.fromkeys(c for clients in LIBRARY_CLIENTS_BY_DIALECT.values() for c in clients))


def _dialects(parser: argparse.ArgumentParser) -> None:
    """`--dialect` and `--upstream-dialect`, for the gateway graders."""
    parser.add_argument(
        "--dialect",
        choices=_DIALECTS,
        default=Dialect.CHAT.value,
        metavar="DIALECT",
        help="the API the clients speak to the gateway: chat (the default), messages (Anthropic Messages), "
        "responses (OpenAI Responses) or gemini (Google Gemini; --url ends with its version, e.g. .../v1beta)",
    )
    parser.add_argument(
        "--upstream-dialect",
        choices=_DIALECTS,
        metavar="DIALECT",
        help="the API the lab's worker speaks behind the gateway, for a route that translates "
        "(e.g. --dialect messages --upstream-dialect chat); default: the same as --dialect",
    )


def _clients(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--client",
        action="append",
        choices=_GRADING_CLIENTS,
        metavar="CLIENT",
        help="a client to grade with (repeatable; one that speaks --dialect; default: "
        + "; ".join(f"{d.value}: {', '.join(c)}" for d, c in DEFAULT_GATEWAY_CLIENTS_BY_DIALECT.items())
        + f"; known: {', '.join(_GRADING_CLIENTS)})",
    )


def _chosen_clients(arguments: argparse.Namespace) -> tuple[str, ...]:
    return tuple(dict.fromkeys(arguments.client or DEFAULT_GATEWAY_CLIENTS_BY_DIALECT[Dialect(arguments.dialect)]))


def _outputs(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--json", type=Path, metavar="PATH", help="also write the card as JSON to PATH (missing folders are made)"
    )
    parser.add_argument(
        "--html", type=Path, metavar="PATH", help="also write the card as one HTML page to PATH (missing folders are made)"
    )


def build_parser() -> argparse.ArgumentParser:
    parser = OneLineParser(
        prog="python -m labs.grade",
        description="Grade a gateway or an OpenAI-compatible server: a report card, exit 0 (all passed), 1 (one failed), 2 (could not run).",
    )
    commands = parser.add_subparsers(
        dest="command", required=True, parser_class=OneLineParser, metavar="{gateway,server,lab-gateways}"
    )
    gateway = commands.add_parser("gateway", help="grade a gateway: the lab serves its upstream(s) and breaks them on purpose")
    gateway.add_argument("--url", type=_url, required=True, help="the gateway's OpenAI base URL, e.g. http://127.0.0.1:4000/v1")
    gateway.add_argument(
        "--upstream-port",
        type=_port,
        required=True,
        metavar="P",
        help="the 127.0.0.1 port your gateway uses as its upstream: the lab's hub listens there",
    )
    gateway.add_argument(
        "--spare-port",
        type=_port,
        metavar="Q",
        help="a second upstream port your gateway can retry on: a healthy spare worker listens there (rule 1)",
    )
    _clients(gateway)
    _dialects(gateway)
    gateway.add_argument(
        "--books",
        type=Path,
        metavar="FILE",
        help="the gateway's books as JSON lines (request_id or model, status, verdict; see docs/grading.md: the books file); rule 3 is not checked without it",
    )
    gateway.add_argument(
        "--stall-deadline",
        type=_seconds,
        metavar="SECONDS",
        help="how long the gateway has to end a stalled stream with an error (default 30)",
    )
    gateway.add_argument(
        "--results", type=Path, default=Path("lab-results"), metavar="DIR", help="where the run's logs go (default lab-results/)"
    )
    gateway.add_argument(
        "--model",
        metavar="PREFIX",
        help="a prefix for the model name, for a gateway that routes on one (e.g. lab/); "
        "the rest must reach its upstream unchanged",
    )
    gateway.add_argument(
        "--api-key", metavar="KEY", help="the API key the gateway expects, sent as a bearer token (default: a dummy key)"
    )
    _outputs(gateway)
    shipped = commands.add_parser(
        "lab-gateways", help="grade every gateway the lab ships (docs/grading.md: the lab's gateways, graded)"
    )
    shipped.add_argument(
        "--gateway", action="append", metavar="NAME", help="a lab gateway to grade (repeatable; default: all of them)"
    )
    _clients(shipped)
    _dialects(shipped)
    shipped.add_argument(
        "--stall-deadline",
        type=_seconds,
        default=30.0,
        metavar="SECONDS",
        help="the stall deadline for every gateway (default 30)",
    )
    shipped.add_argument("--markdown", type=Path, metavar="PATH", help="also write the table of cards as Markdown to PATH")
    shipped.add_argument("--json", type=Path, metavar="DIR", help="also write each card as DIR/<gateway>.json")
    shipped.add_argument(
        "--results", type=Path, default=Path("lab-results"), metavar="DIR", help="where the run's logs go (default lab-results/)"
    )
    server = commands.add_parser("server", help="grade an OpenAI-compatible server (no faults)")
    server.add_argument(
        "--url",
        type=_url,
        required=True,
        help="the server's base URL, e.g. http://127.0.0.1:8000/v1 (gemini: up to the API version, e.g. .../v1beta)",
    )
    server.add_argument(
        "--dialect",
        choices=[d.value for d in SERVER_SUITES],
        default=Dialect.CHAT.value,
        metavar="DIALECT",
        help="the API to grade it in: chat (POST /chat/completions, the default), messages (Anthropic "
        "Messages, POST /messages), responses (OpenAI Responses, POST /responses) or gemini (Google Gemini, "
        "POST /models/MODEL:streamGenerateContent?alt=sse and :generateContent; --url ends with the "
        "version, e.g. http://127.0.0.1:8000/v1beta)",
    )
    server.add_argument("--model", help="the model to ask for (default: the first model GET /models lists)")
    server.add_argument("--api-key", metavar="KEY", help="the API key the server expects, sent as a bearer token (default: none)")
    _outputs(server)
    return parser


def _refuse_folders(parser: argparse.ArgumentParser, arguments: argparse.Namespace, options: tuple[str, ...]) -> None:
    """Before a run of minutes: an output path that is a folder can never be written."""
    for option in options:
        path = getattr(arguments, option.removeprefix("--").replace("-", "_"))
        if path is not None and path.is_dir():
            parser.error(f"{option} {path}: is a folder; give a file path")


def _write(option: str, path: Path, write: Callable[[Path], None]) -> bool:
    """Write one output; False (after one line `error: ...`) when it cannot be written."""
    try:
        write(path)
    except OSError as error:
        # The OS's words and the path they are about (a parent that is a file, a read-only folder).
        where = f": {error.filename}" if error.filename and str(error.filename) != str(path) else ""
        print(f"error: {option} {path}: cannot write it ({error.strerror or error}{where})", file=sys.stderr)
        return False
    return True


def _emit(card: Card, arguments: argparse.Namespace) -> int:
    print(render_terminal(card, colour=sys.stdout.isatty()))
    if arguments.json and not _write("--json", arguments.json, partial(write_json, card)):
        return EXIT_CANNOT_RUN
    if arguments.html and not _write("--html", arguments.html, partial(write_html, card)):
        return EXIT_CANNOT_RUN
    return card.exit_status


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    arguments = parser.parse_args(argv)
    if arguments.command != "lab-gateways":
        _refuse_folders(parser, arguments, ("--json", "--html"))
    if arguments.command == "server":
        try:
            card = grade_server(
                arguments.url, model=arguments.model, api_key=arguments.api_key, dialect=Dialect(arguments.dialect)
            )
        except GradeError as error:
            print(f"error: {error}", file=sys.stderr)
            return EXIT_CANNOT_RUN
        return _emit(card, arguments)
    if arguments.command == "lab-gateways":
        return _lab_gateways(parser, arguments)
    if arguments.spare_port is not None and arguments.spare_port == arguments.upstream_port:
        parser.error(f"--spare-port {arguments.spare_port} is the --upstream-port; give the spare worker another port")
    if arguments.books is not None and not arguments.books.parent.is_dir():
        parser.error(f"--books {arguments.books}: no directory {arguments.books.parent}")
    target = GatewayTarget(
        url=arguments.url,
        upstream_port=arguments.upstream_port,
        spare_port=arguments.spare_port,
        clients=_chosen_clients(arguments),
        dialect=Dialect(arguments.dialect),
        upstream_dialect=Dialect(arguments.upstream_dialect) if arguments.upstream_dialect else None,
        books_path=arguments.books,
        stall_deadline_s=arguments.stall_deadline,
        model=arguments.model,
        api_key=arguments.api_key,
        results_dir=arguments.results,
        progress=lambda line: print(f"grading {line}", file=sys.stderr, flush=True),
    )
    status, card = run_command(grade_gateway, target)
    if card is None:
        return status  # run_command printed the one line (GradeError, a helper that did not start, a signal)
    return _emit(card, arguments)


def _lab_gateways(parser: argparse.ArgumentParser, arguments: argparse.Namespace) -> int:
    _refuse_folders(parser, arguments, ("--markdown",))
    if arguments.json is not None and arguments.json.exists() and not arguments.json.is_dir():
        parser.error(f"--json {arguments.json}: is a file; give a folder for one card per gateway")
    known = GATEWAYS
    unknown = [name for name in arguments.gateway or () if name not in known]
    if unknown:
        parser.error(f"--gateway {unknown[0]!r} is not a lab gateway; lab gateways: {', '.join(known)}")
    dialect = Dialect(arguments.dialect)
    upstream = Dialect(arguments.upstream_dialect) if arguments.upstream_dialect else dialect
    # The gateways whose route brings the upstream dialect to the clients' (a translating one when
    # the two differ): asked by name, a gateway without that route is refused, saying why.
    routed = [name for name in known if lookup(name).routes.get(dialect) == upstream]
    for name in arguments.gateway or ():
        if name not in routed:
            found = lookup(name).routes.get(dialect)
            why = unserved_reason(name, dialect) or f"{name}: its {dialect.value} route speaks {found} to the worker"
            parser.error(
                f"--gateway {name}: no route from a {upstream.value} worker to {dialect.value} clients ({why}); "
                f"such routes: {', '.join(routed) or 'none'}"
            )
    if not routed:
        parser.error(f"no lab gateway brings a {upstream.value} worker to {dialect.value} clients")
    names = tuple(dict.fromkeys(arguments.gateway or routed))
    status, cards = run_command(
        partial(
            grade_lab_gateways,
            names,
            clients=_chosen_clients(arguments),
            dialect=dialect,
            upstream_dialect=upstream,
            stall_deadline_s=arguments.stall_deadline,
            results_dir=arguments.results,
            progress=lambda line: print(f"grading {line}", file=sys.stderr, flush=True),
        )
    )
    if cards is None:
        return status
    cards, failures = cards
    for card in cards.values():
        print(render_terminal(card, colour=sys.stdout.isatty()), end="\n\n")
    for name, why in failures.items():
        print(f"{name}: could not be graded: {why}", file=sys.stderr)
    table = render_cards_markdown(cards)
    print(table)
    if arguments.markdown and not _write("--markdown", arguments.markdown, partial(_write_text, table + "\n")):
        return EXIT_CANNOT_RUN
    if arguments.json:
        for name, card in cards.items():
            if not _write("--json", arguments.json / f"{name.replace('+', '-')}.json", partial(write_json, card)):
                return EXIT_CANNOT_RUN
    if failures:
        return EXIT_CANNOT_RUN
    return EXIT_FAILED if any(c.exit_status for c in cards.values()) else EXIT_PASSED


def _write_text(text: str, path: Path) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text, encoding="utf-8")
