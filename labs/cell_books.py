"""A cell's books: the record its gateway kept of its request (LiteLLM's callbacks, SMG's log,
finish_fix's books), read after the cells ran and attached to each `CellResult`.

A gateway may write its record after the response went out (LiteLLM's callbacks do), so the
runner waits for every cell's entry (`wait_for_books`, at most `BOOKS_DEADLINE_S` after each cell,
labs.gateways.services) before it reads them (`attach_books`; a cell its gateway's books do not
know is `labs.outcome.BOOKS_NO_ENTRY`, as the graders say it).
"""

from __future__ import annotations

from typing import Any

import trio

from labs.cell_result import CellResult
from labs.gateways.services import BOOKS_DEADLINE_S, BOOKS_NONE, Gateway, books_entry, captured_stream, read_books
from labs.outcome import BOOKS_ERROR, BOOKS_NO_ENTRY, books_mismatch

__all__ = ["attach_books", "wait_for_books"]


def _missing_books(results: list[CellResult], gateways: dict[str, Gateway]) -> list[CellResult]:
    entries = {name: read_books(g.books_path) for name, g in gateways.items() if g.books_path is not None}
    return [
        r
        for r in results
        if gateways[r.gateway].books_path is not None
        and books_entry(gateways[r.gateway], entries[r.gateway], r.cell_id) == (None, None)
    ]


async def wait_for_books(
    results: list[CellResult],
    gateways: dict[str, Gateway],
    ended: dict[str, float] | None = None,
    deadline_s: float = BOOKS_DEADLINE_S,
) -> None:
    """Until every cell through a books-keeping gateway has its entry, or `deadline_s` passed since
    each cell still without one ended (`ended`: trio's clock, by cell id; a cell not in it counts
    as ending when the wait starts)."""
    ended = ended or {}
    now = trio.current_time()
    while True:
        missing = _missing_books(results, gateways)
        if not missing or trio.current_time() >= max(ended.get(r.cell_id, now) for r in missing) + deadline_s:
            return
        await trio.sleep(0.1)


def attach_books(results: list[CellResult], gateways: dict[str, Gateway]) -> None:
    entries = {name: read_books(g.books_path) for name, g in gateways.items()}
    captures = {name: read_books(g.capture_path) for name, g in gateways.items()}
    for result in results:
        gateway = gateways[result.gateway]
        result.finish_fix_stream = captured_stream(captures[result.gateway], result.cell_id)
        if gateway.books_path is None:
            # A gateway that keeps no per-request record says so (`none`), never a blank.
            result.books = BOOKS_NONE if gateway.books_kind == BOOKS_NONE else None
            continue
        word, entry = books_entry(gateway, entries[result.gateway], result.cell_id)
        if entry is None:
            # The gateway keeps books but has none for this request: say so, and flag it (a
            # request its books do not know about is exactly what an operator needs to see).
            result.books, result.books_entry, result.books_mismatch = BOOKS_NO_ENTRY, None, True
            continue
        if result.requests:
            # A cell of several requests (`requests_per_cell`) is booked as its outcome is judged:
            # `error` if the books say so for any of its requests, with that entry. A request's
            # lines are those that share its `call_id` (LiteLLM's: its retries and fallbacks), else
            # each line is one; each request is read by the gateway's own reader (its last line).
            by_request: dict[Any, list[dict[str, Any]]] = {}
            for number, line in enumerate(entries[result.gateway]):
                by_request.setdefault(line.get("call_id") or ("line", number), []).append(line)
            failed = [
                (one_word, one_entry)
                for one_word, one_entry in (books_entry(gateway, lines, result.cell_id) for lines in by_request.values())
                if one_entry is not None and one_word == BOOKS_ERROR
            ]
            word, entry = failed[0] if failed else (word, entry)
        result.books, result.books_entry = word, entry
        result.books_mismatch = books_mismatch(result.outcome, word)
