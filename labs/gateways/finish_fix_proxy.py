"""finish_fix as a lab gateway: `mitmdump --mode reverse:<upstream> -s addons/finish_fix.py`.

`finish_fix` is the client-side placement (in front of the worker's tunnel). The same mitmdump is
LiteLLM's upstream for `litellm+finish_fix` (labs.gateways.litellm_proxy), so it is a shared
service of the run, one per topology (its upstream is the topology's tunnel or hub). The run's one
LiteLLM routes to every topology's finish_fix, so each is a run-wide service
(`RunServices.shared_async`), whichever topology asks first. It has one upstream (mitmproxy's
reverse mode takes one), so it uses the first worker only.

Options: the lab's own (`open_finish_fix`), and a scenario's `[finish_fix]` table while it runs
(`FinishFixOptions.apply`, through the lab-only script labs/gateways/finish_fix_options.py): every
`Gateway` with a finish_fix in its path gets `configure` for it.

Books: finish_fix's ledger (`--set finish_fix_ledger=...`), one JSON line per flow with its verdict;
its metrics' last scrape is kept next to it (labs.gateways.finish_fix_scrape).
"""

from __future__ import annotations

import json
import urllib.error
import urllib.request
from collections.abc import AsyncIterator, Mapping
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import trio

from finishline import Verdict
from labs.gateways.finish_fix_scrape import METRICS_OPTION, keep_last_scrape, metrics_url_in
from labs.gateways.registry import EVERY_DIALECT_ROUTES, GatewayContext, GatewayEntry
from labs.gateways.services import BIN, FINISH_FIX_SCRIPT, MITM_LISTENING, Gateway, books_reader_from
from labs.outcome import BOOKS_ERROR, BOOKS_OK
from labs.processes import open_service

STREAM_CAPTURE_SCRIPT = Path(__file__).resolve().parent / "stream_capture.py"
OPTIONS_SCRIPT = Path(__file__).resolve().parent / "finish_fix_options.py"
#: The path OPTIONS_SCRIPT answers (labs/gateways/finish_fix_options.py `OPTIONS_PATH`).
OPTIONS_PATH = "/.finishline-lab/options"
#: The shared-service key of the run's one finish_fix mitmdump in front of the primary upstream.
SERVICE = "finish_fix"

# finish_fix's verdicts, as the books column words (docs/grading.md "The books file": clean and
# repaired are successes; interrupted, upstream_error, malformed and http_error failures; skipped
# says nothing). A malformed stream is an error whatever else it was: its client read garbage.
VERDICT_BOOKS: dict[str, str] = {  # looked up by the ledger's word (a Verdict is its word)
    Verdict.CLEAN: BOOKS_OK,
    Verdict.REPAIRED: BOOKS_OK,
    Verdict.INTERRUPTED: BOOKS_ERROR,
    Verdict.UPSTREAM_ERROR: BOOKS_ERROR,
    Verdict.MALFORMED: BOOKS_ERROR,
    Verdict.HTTP_ERROR: BOOKS_ERROR,
}


class FinishFixOptionsError(RuntimeError):
    """finish_fix refused a scenario's options (the message is its own line)."""


@dataclass(slots=True)
class FinishFixOptions:
    """Sets a running finish_fix's options for the scenario about to run (`apply`)."""

    #: `http://127.0.0.1:PORT` of the mitmdump.
    origin: str
    # What the last `apply` set (the lab's options alone at the start).
    _applied: dict[str, str] = field(default_factory=dict)

    async def apply(self, options: Mapping[str, str]) -> dict[str, str]:
        """Run with `options` (full option names) over the lab's, from now on; nothing is sent
        when they are the ones in force.

        Returns:
            What finish_fix says is now in force for every option it set or put back to the lab's
            value (empty when nothing was sent).

        Raises:
            FinishFixOptionsError: finish_fix refused a value (its own line).
        """
        if dict(options) == self._applied:
            return {}
        in_force = await trio.to_thread.run_sync(self._put, dict(options))
        self._applied = dict(options)
        return in_force

    def _put(self, options: dict[str, str]) -> dict[str, str]:
        request = urllib.request.Request(
            self.origin + OPTIONS_PATH,
            data=json.dumps(options).encode(),
            method="PUT",
            headers={"content-type": "application/json"},
        )
        opener = urllib.request.build_opener(urllib.request.ProxyHandler({}))  # never a proxy from the environment
        try:
            with opener.open(request, timeout=30) as response:
                in_force: dict[str, str] = json.loads(response.read())["options"]
                return in_force
        except urllib.error.HTTPError as refused:
            error = json.loads(refused.read() or b"{}").get("error", f"HTTP {refused.code}")
            raise FinishFixOptionsError(f"finish_fix at {self.origin} refused {options}: {error}") from None


@dataclass(frozen=True, slots=True, kw_only=True)
class RunningFinishFix:
    #: The OpenAI base URL in front of the upstream (`http://127.0.0.1:PORT/v1`).
    base_url: str
    ledger: Path
    #: JSON lines of the streams finish_fix sent on (labs/gateways/stream_capture.py).
    capture: Path
    #: finish_fix's metrics as the run ended (written then).
    metrics: Path
    #: A scenario's options, set while it runs (`Gateway.configure` of every gateway it is behind).
    options: FinishFixOptions


@asynccontextmanager
async def open_finish_fix(
    upstream_url: str, run_dir: Path, label: str = "finish_fix", *, idle_timeout_s: float = 2.0
) -> AsyncIterator[RunningFinishFix]:
    """A mitmdump with finish_fix in reverse mode in front of `upstream_url` (no `/v1`), its files
    named after `label` in `run_dir`."""
    ledger = run_dir / f"{label}-ledger.jsonl"
    capture = run_dir / f"{label}-streams.jsonl"
    confdir = run_dir / "mitmproxy-conf"
    confdir.mkdir(parents=True, exist_ok=True)
    argv = [
        str(BIN / "mitmdump"),
        "--mode",
        f"reverse:{upstream_url}",
        "--listen-host",
        "127.0.0.1",
        "--listen-port",
        "0",
        "-s",
        str(FINISH_FIX_SCRIPT),
        "--set",
        f"confdir={confdir}",
        "--set",
        f"finish_fix_ledger={ledger}",
        "--set",
        METRICS_OPTION,
        # A short idle deadline so the stall scenario ends in finish_fix's error event within its
        # deadline; the first-token deadline stays at its default (the incident's prefill is long,
        # slow-first-token's first token comes after 20 s): a scenario that needs other deadlines
        # sets them in its `[finish_fix]` table (no-response), through OPTIONS_SCRIPT.
        "--set",
        f"finish_fix_idle_timeout={idle_timeout_s:g}",
        "-s",
        str(OPTIONS_SCRIPT),
        "-s",
        str(STREAM_CAPTURE_SCRIPT),
        "--set",
        f"finishline_capture={capture}",
        # `info`: the "listening at" line the port is read from is an info message.
        "--set",
        "termlog_verbosity=info",
        "--set",
        "flow_detail=0",
    ]
    log = run_dir / ("mitmdump.log" if label == "finish_fix" else f"mitmdump-{label}.log")
    async with open_service(f"mitmdump ({label})", argv, port=0, port_in_log=MITM_LISTENING, log_path=log) as (
        _,
        port,
    ):
        metrics = run_dir / f"{label}-metrics.prom"
        try:
            yield RunningFinishFix(
                base_url=f"http://127.0.0.1:{port}/v1",
                ledger=ledger,
                capture=capture,
                metrics=metrics,
                options=FinishFixOptions(f"http://127.0.0.1:{port}"),
            )
        finally:
            await keep_last_scrape(metrics_url_in(log.read_text(errors="replace")), metrics)


async def shared_finish_fix(ctx: GatewayContext, topology: str | None = None) -> RunningFinishFix:
    """The run's finish_fix in front of a topology's primary upstream (`ctx`'s own by default),
    started once per topology, whoever asks first."""
    label = ctx.topology if topology is None else topology
    plan = ctx.topologies[label]
    primary_url = plan.primary_url
    if not primary_url:
        raise ValueError("finish_fix needs the worker's tunnel (primary_url)")
    return await ctx.run.shared_async(
        (SERVICE, label),
        lambda: ctx.run.enter(open_finish_fix(primary_url, plan.run_dir, idle_timeout_s=ctx.run.finish_fix_idle_timeout_s)),
    )


def finish_fix_books(entry: dict[str, Any]) -> str | None:
    """The books' word for one ledger line: its verdict's (None for `skipped` or no verdict)."""
    verdict = entry.get("verdict")
    return VERDICT_BOOKS.get(verdict) if isinstance(verdict, str) else None


read_finish_fix_books = books_reader_from(finish_fix_books)


async def _start(ctx: GatewayContext) -> Gateway:
    running = await shared_finish_fix(ctx)
    return Gateway(
        name="finish_fix",
        base_url=running.base_url,
        books_path=running.ledger,
        capture_path=running.capture,
        configure=running.options.apply,
    )


ENTRIES = (
    GatewayEntry(
        name="finish_fix",
        summary="mitmdump with finish_fix in reverse mode in front of the worker's tunnel (the client-side placement)",
        start=_start,
        books_kind="finish_fix",
        read_books=read_finish_fix_books,
        # finish_fix's default path options repair /v1/messages, /v1/responses and Gemini's
        # `:streamGenerateContent` too; mitmdump's reverse mode passes every path on to the worker.
        routes=EVERY_DIALECT_ROUTES,
    ),
)
