"""Start the lab's gateways and read their books.

`open_gateways` looks each requested name up in the registry (labs.gateways.registry), refuses a
gateway that is not installed before anything starts (one line each, saying how to install it),
and starts the entries at once (most of a start is waiting for a program to listen, and LiteLLM's
25-90 s would otherwise hold up every gateway after it); their processes stop when the block ends.
The entries themselves live in one module per gateway (`labs/gateways/<name>.py`).

Books: every gateway that keeps per-request books writes them as JSON lines (finish_fix's ledger,
LiteLLM's callbacks, the routers' JSON logs, Envoy's access log ...). Each record names the
request's model, which carries the cell id (`labs.scenario.Scenario.model_name`), so a cell finds
its entry by id; the registry says, per books kind, how an entry becomes the books' word. Every
kind's reader is made by `books_reader_from` from what differs between two gateways' files: the
word a record says, and, when a record is not a line of the file or names its request elsewhere,
how records are made from the lines and which cells a record is about.
"""

from __future__ import annotations

import json
import re
import sys
from collections.abc import AsyncIterator, Callable, Iterable, Mapping
from contextlib import AsyncExitStack, asynccontextmanager
from dataclasses import replace
from pathlib import Path
from typing import Any

import trio

from faults.child_processes import ChildStartError, bind_failed, free_port
from finishline import Dialect
from finishline.install import addon_path
from labs.cell_ids import cell_id_of
from labs.gateways.registry import (
    BooksReader,
    Gateway,
    GatewayContext,
    GatewayEntry,
    RunServices,
    TopologyPlan,
    books_reader,
    lookup,
    missing_installs,
)
from labs.outcome import BOOKS_NONE
from labs.processes import open_service

__all__ = [
    "BOOKS_DEADLINE_S",
    "BOOKS_NONE",
    "Gateway",
    "GatewayNotInstalled",
    "books_entry",
    "books_reader_from",
    "captured_stream",
    "configure_gateways",
    "entries_for_cell",
    "last_entry_by_cell",
    "model_cells",
    "open_gateways",
    "prepare_gateways",
    "read_books",
]

ROOT = Path(__file__).resolve().parents[2]
#: The finish_fix addon's script, wherever finishline is (a checkout or an installed wheel).
FINISH_FIX_SCRIPT = addon_path()
BIN = Path(sys.executable).parent
#: What mitmdump and mitmweb print once their proxy listens (asked for port 0).
MITM_LISTENING = re.compile(r"listening at 127\.0\.0\.1:(\d+)")
#: Tries for a program that cannot listen on port 0 (LiteLLM): the free port may be taken between
#: `free_port` and the program's bind; a bind failure is then retried on another port.
BIND_ATTEMPTS = 3
#: LiteLLM's callbacks write their books after the response went out: a reader of the books waits
#: until every cell of a books-keeping gateway has its entry, at most this many seconds after the
#: cell ended; a cell still without one is reported as `no entry` (`labs.outcome.BOOKS_NO_ENTRY`).
BOOKS_DEADLINE_S = 15.0


class GatewayNotInstalled(ChildStartError):
    """A requested gateway is not installed; the message says, per gateway, how to install it.
    (A `ChildStartError`: the CLI prints it as its one error line, like a helper that did not start.)"""


async def prepare_gateways(gateways: dict[str, Gateway], requests: Iterable[tuple[str, str]]) -> None:
    """Tell each gateway that asks for it (`Gateway.prepare`) the models of the requests it is
    about to get: `requests` is (gateway name, request model) pairs."""
    models: dict[str, list[str]] = {}
    for name, model in requests:
        models.setdefault(name, []).append(model)
    for name, wanted in models.items():
        prepare = gateways[name].prepare
        if prepare is not None:
            await prepare(wanted)


async def configure_gateways(gateways: Iterable[Gateway], options: Mapping[str, str]) -> None:
    """Give every finish_fix behind `gateways` a scenario's `options` (each finish_fix once)."""
    for configure in dict.fromkeys(gateway.configure for gateway in gateways if gateway.configure is not None):
        assert configure is not None  # (the filter above; for the type checker)
        await configure(options)


@asynccontextmanager
async def open_gateways(
    names: tuple[str, ...],
    *,
    primary_url: str | None,
    spare_url: str | None = None,
    run_dir: Path,
    external_url: str | None = None,
    external_api_key: str | None = None,
    topology: str = "",
    topologies: dict[str, TopologyPlan] | None = None,
    run: RunServices | None = None,
    models: Mapping[tuple[str, Dialect], tuple[str, ...]] | None = None,
) -> AsyncIterator[dict[str, Gateway]]:
    """Start what `names` need and yield {name: Gateway}.

    `primary_url`: the gateways' first upstream, `http://127.0.0.1:PORT` without `/v1` (the
    worker's tunnel, or the hub in front of it; not needed when only `external` runs).
    `spare_url`: a second, healthy worker for the gateways that can have more than one upstream
    (None: a pool of one). A run of several topologies (labs.topology) opens one block per
    topology, each naming its own (`topology`) among all of the run's (`topologies`), and passes
    every block the same `run`, whose processes the caller keeps until the last block is done;
    without `run` the block has its own, stopped with its gateways. `models`: for a block that is
    its run's only topology, the models each (gateway, client dialect) will be asked for
    (`TopologyPlan.models`; a run of several topologies gives each plan its own).

    Raises:
        UnknownGateway: a name is not in the registry (the message lists the valid ones).
        GatewayNotInstalled: a requested gateway is not installed (one line each, with the fix).
        ChildStartError: a gateway did not start (the first that failed; the others are stopped).
    """
    chosen = [lookup(name) for name in names]
    missing = missing_installs(names)
    if missing:
        raise GatewayNotInstalled("; ".join(missing))
    own_run = run is None
    ctx = GatewayContext(
        primary_url=primary_url,
        spare_url=spare_url,
        run_dir=run_dir,
        names=tuple(names),
        external_url=external_url,
        external_api_key=external_api_key,
        topology=topology,
        topologies=topologies or {},
        run=run or RunServices(run_dir=run_dir),
        models=models or {},
    )
    async with AsyncExitStack() as stack:
        if own_run:
            await stack.enter_async_context(ctx.run.stack)
        await stack.enter_async_context(ctx.stack)
        gateways = await _start_at_once(chosen, ctx)
        yield {name: gateways[name] for name in names}


async def _start_at_once(chosen: list[GatewayEntry], ctx: GatewayContext) -> dict[str, Gateway]:
    """Every entry's `start`, at once, each gateway with its entry's books kind; the first failure
    cancels the rest and is raised as it is (one error for the CLI's one line, not a group)."""
    gateways: dict[str, Gateway] = {}
    failures: list[Exception] = []

    async with trio.open_nursery() as nursery:

        async def start(entry: GatewayEntry) -> None:
            try:
                gateways[entry.name] = replace(await entry.start(ctx), books_kind=entry.books_kind)
            except Exception as error:
                failures.append(error)
                nursery.cancel_scope.cancel()

        for entry in chosen:
            nursery.start_soon(start, entry)
    if failures:
        raise failures[0]
    return gateways


@asynccontextmanager
async def open_service_on_free_ports(name: str, argv_for: Callable[[int, int], list[str]], **service: Any) -> AsyncIterator[int]:
    """`open_service` for a program that cannot listen on port 0 (LiteLLM, SMG, vllm-router):
    `argv_for(port, second_port)` gets two ports that were free a moment ago (the second for a
    metrics listener, if it has one); a start that fails because a port was taken meanwhile is
    retried on others (`BIND_ATTEMPTS`). Yields the service's port."""
    async with AsyncExitStack() as stack:
        for attempt in range(1, BIND_ATTEMPTS + 1):
            port, second_port = free_port(), free_port()
            try:
                await stack.enter_async_context(open_service(name, argv_for(port, second_port), port=port, **service))
            except ChildStartError as error:
                if attempt < BIND_ATTEMPTS and bind_failed(error):
                    continue
                raise
            break
        yield port


def read_books(path: Path | None) -> list[dict[str, Any]]:
    """Every JSON line of a books file (lines that are not JSON objects are skipped)."""
    if path is None or not path.exists():
        return []
    entries = []
    for line in path.read_text(encoding="utf-8", errors="replace").splitlines():
        try:
            entry = json.loads(line)
        except json.JSONDecodeError:
            continue
        if isinstance(entry, dict):
            entries.append(entry)
    return entries


def model_cells(entry: dict[str, Any]) -> tuple[str | None, ...]:
    """The cell a books record is about, by the model name it recorded (most gateways' books)."""
    return (cell_id_of(entry.get("model")),)


def last_entry_by_cell(
    records: Iterable[dict[str, Any]], cells_of: Callable[[dict[str, Any]], Iterable[str | None]] = model_cells
) -> dict[str, dict[str, Any]]:
    """{cell id: the last record about it}, for every cell a record names (`cells_of`), in the
    order the cells first appear: when several records name one request, the last one counts."""
    found: dict[str, dict[str, Any]] = {}
    for record in records:
        for cell_id in cells_of(record):
            if cell_id:
                found[cell_id] = record
    return found


def books_reader_from(
    word: Callable[[dict[str, Any]], str | None],
    *,
    cells_of: Callable[[dict[str, Any]], Iterable[str | None]] = model_cells,
    records: Callable[[list[dict[str, Any]]], Iterable[dict[str, Any]]] | None = None,
) -> BooksReader:
    """The books reader of one kind of books: a cell's entry is the last record about it, and its
    word is what `word` says of that record (`ok`/`error`, or None for neither).

    Args:
        word: the books' word for one record (the part every gateway's file says differently).
        cells_of: the cells a record is about; by default the cell in its `model`.
        records: the records made from the file's JSON lines (a log that spreads one request over
            many lines groups them); by default each line is one record.
    """

    def read(entries: list[dict[str, Any]], cell_id: str) -> tuple[str | None, dict[str, Any] | None]:
        entry = last_entry_by_cell(entries if records is None else records(entries), cells_of).get(cell_id)
        return (None, None) if entry is None else (word(entry), entry)

    return read


def books_entry(gateway: Gateway, entries: list[dict[str, Any]], cell_id: str) -> tuple[str | None, dict[str, Any] | None]:
    """The books' word (`ok`/`error`, None when there is no entry) and the entry for one cell.

    With `litellm+finish_fix` two books see the request; the gateway's own (LiteLLM's) count.
    """
    if gateway.books_kind is None or gateway.books_kind == BOOKS_NONE:
        return None, None
    return books_reader(gateway.books_kind)(entries, cell_id)


def captured_stream(entries: list[dict[str, Any]], cell_id: str) -> str | None:
    """The stream finish_fix sent on for one cell (to the client, or to LiteLLM), if captured."""
    mine = entries_for_cell(entries, cell_id)
    return mine[-1].get("stream") if mine else None


def entries_for_cell(entries: list[dict[str, Any]], cell_id: str, key: str = "model") -> list[dict[str, Any]]:
    """The entries whose `key` (the request's model name) belongs to the cell, oldest first."""
    return [e for e in entries if cell_id_of(e.get(key)) == cell_id]
