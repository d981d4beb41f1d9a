"""`python -m labs.worker`: run the simulated worker standalone, with command-line defaults.

Every `WorkerSettings` field is an option (`--token-delay 0.05`, `--finish omitted`); a request can
still override any of them with the `x-finishline-worker` header or its model name.
"""

from __future__ import annotations

import argparse
import dataclasses
import sys
from functools import partial

import trio

from faults.cli_parser import OneLineParser
from labs.worker.knob_help import KNOB_HELP
from labs.worker.server import run_server_cli, serve_worker
from labs.worker.settings import DEFAULT_MODEL_NAME, SETTINGS_HEADER, SettingsError, WorkerSettings, parse_settings

DEFAULT_PORT = 8400


def build_parser() -> argparse.ArgumentParser:
    parser = OneLineParser(
        prog="python -m labs.worker",
        description=(
            "A simulated OpenAI-compatible worker: POST /v1/chat/completions, /v1/messages (Anthropic "
            "Messages), /v1/responses (OpenAI Responses) and /v1beta/models/MODEL:streamGenerateContent "
            "or :generateContent (Google Gemini, any prefix), streaming or not, and GET /v1/models, "
            "with deterministic bytes and defects on demand. The options below are "
            f"defaults; a request overrides them with a header, e.g. '{SETTINGS_HEADER}: tokens=7; "
            f"finish=omitted', or with its model name, e.g. '{DEFAULT_MODEL_NAME};tokens=7;finish=omitted'."
        ),
    )
    parser.add_argument("--host", default="127.0.0.1", help="address to listen on (default 127.0.0.1)")
    parser.add_argument(
        "--port", type=int, default=DEFAULT_PORT, help=f"port to listen on, 0 for any free one (default {DEFAULT_PORT})"
    )
    parser.add_argument(
        "--spare",
        action="store_true",
        help=(
            "serve as the spare of a failover setup: the primary's failover faults (primary_*) do not "
            "hold here, and spare_model and spare_prompt_tokens do"
        ),
    )
    for field in dataclasses.fields(WorkerSettings):
        default = field.default
        shown = "none" if default is None else str(default).lower() if isinstance(default, bool) else str(default)
        parser.add_argument(
            "--" + field.name.replace("_", "-"),
            dest=field.name,
            metavar=field.name.upper(),
            default=None,
            help=f"{KNOB_HELP[field.name]} (default {shown})",
        )
    return parser


def settings_from_arguments(arguments: argparse.Namespace) -> WorkerSettings:
    """The defaults given on the command line, checked like a header would be."""
    items = [
        f"{field.name}={getattr(arguments, field.name)}"
        for field in dataclasses.fields(WorkerSettings)
        if getattr(arguments, field.name) is not None
    ]
    return parse_settings(";".join(items))


async def _run(settings: WorkerSettings, host: str, port: int, spare: bool = False) -> None:
    async with trio.open_nursery() as nursery:
        bound = await nursery.start(partial(serve_worker, settings, host=host, port=port, spare=spare))
        role = ", as the spare" if spare else ""
        print(f"worker listening on http://{host}:{bound}/v1 ({settings.to_header() or 'default settings'}{role})", flush=True)


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    arguments = parser.parse_args(argv)
    try:
        settings = settings_from_arguments(arguments)
    except SettingsError as exc:
        parser.error(str(exc))  # one line and exit 2, like any other bad option
    return run_server_cli(
        _run, settings, arguments.host, arguments.port, arguments.spare, host=arguments.host, port=arguments.port
    )


if __name__ == "__main__":
    sys.exit(main())
