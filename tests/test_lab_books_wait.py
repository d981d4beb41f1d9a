"""How the lab waits for the gateways' books and attaches each cell's entry: the wait counted from
each cell's end (a cell whose time is up adds none), ended as soon as every entry is written, and a
cell the books never mention reported as such.

No gateway processes: each test writes the books file itself. Every test has a deadline; none
asserts on timing. The waits run on trio's MockClock, which jumps to the next deadline whenever every
task sleeps: the wait's polls, its 600 s deadlines and the late writer take no real time, and the
files are read on trio's own thread, so no wait is cut short by a jump.
"""

from __future__ import annotations

import trio
from trio.testing import MockClock

from labs.cell_books import attach_books, wait_for_books
from labs.cell_result import CellResult
from labs.gateways.services import Gateway
from labs.outcome import BOOKS_NO_ENTRY, Outcome
from tests.fixtures_lab import run_trio


def _cell(cell_id: str, gateway: str) -> CellResult:
    return CellResult(
        scenario="s",
        client="httpx-sse",
        gateway=gateway,
        cell_id=cell_id,
        outcome=Outcome.OK,
        why="",
        report={},
        request_model=f"{cell_id};tokens=3",
    )


def test_a_cell_its_gateways_books_never_mention_is_reported_as_no_entry(tmp_path):
    books = tmp_path / "books.jsonl"
    books.write_text('{"model": "c0001;tokens=3", "status": "success"}\n')
    gateways = {
        "litellm": Gateway(name="litellm", base_url="http://x", books_path=books, books_kind="litellm"),
        "direct": Gateway(name="direct", base_url="http://y"),
    }
    results = [_cell("c0001", "litellm"), _cell("c0002", "litellm"), _cell("c0003", "direct")]

    async def wait():
        await wait_for_books(results, gateways, deadline_s=0.5)

    run_trio(wait, deadline=10, clock=MockClock(autojump_threshold=0))
    attach_books(results, gateways)
    assert (results[0].books, results[0].books_mismatch) == ("ok", False)
    assert (results[1].books, results[1].books_entry, results[1].books_mismatch) == (BOOKS_NO_ENTRY, None, True)
    assert (results[2].books, results[2].books_mismatch) == (None, False)


def test_the_books_wait_ends_as_soon_as_every_entry_is_written(tmp_path):
    books = tmp_path / "books.jsonl"
    books.touch()
    gateways = {"litellm": Gateway(name="litellm", base_url="http://x", books_path=books, books_kind="litellm")}
    results = [_cell("c0001", "litellm")]

    async def write_then_wait():
        async with trio.open_nursery() as nursery:

            async def write_late():
                await trio.sleep(0.3)
                books.write_text('{"model": "c0001;tokens=3", "status": "failure"}\n')

            nursery.start_soon(write_late)
            # A deadline far beyond the test's own: only the entry appearing can end the wait.
            await wait_for_books(results, gateways, deadline_s=600)

    run_trio(write_then_wait, deadline=20, clock=MockClock(autojump_threshold=0))
    attach_books(results, gateways)
    assert (results[0].books, results[0].books_mismatch) == ("error", True)


def test_a_cell_that_ended_long_ago_adds_no_wait_for_books_it_will_never_get(tmp_path):
    books = tmp_path / "books.jsonl"
    books.touch()
    gateways = {"litellm": Gateway(name="litellm", base_url="http://x", books_path=books, books_kind="litellm")}
    results = [_cell("c0001", "litellm")]

    async def wait():
        # The cell ended 600 s ago (trio's clock) with a deadline of 600 s: its time is up, so the
        # wait ends at once, far within the test's deadline.
        await wait_for_books(results, gateways, {"c0001": trio.current_time() - 600}, deadline_s=600)

    run_trio(wait, deadline=10, clock=MockClock(autojump_threshold=0))
    attach_books(results, gateways)
    assert (results[0].books, results[0].books_mismatch) == (BOOKS_NO_ENTRY, True)


def test_a_cell_that_just_ended_is_still_waited_for(tmp_path):
    books = tmp_path / "books.jsonl"
    books.touch()
    gateways = {"litellm": Gateway(name="litellm", base_url="http://x", books_path=books, books_kind="litellm")}
    results = [_cell("c0001", "litellm"), _cell("c0002", "litellm")]

    async def write_then_wait():
        async with trio.open_nursery() as nursery:

            async def write_late():
                await trio.sleep(0.3)
                books.write_text('{"model": "c0002;tokens=3", "status": "success"}\n')

            nursery.start_soon(write_late)
            now = trio.current_time()
            # c0001's time is up; c0002 just ended, so its entry is waited for.
            await wait_for_books(results, gateways, {"c0001": now - 600, "c0002": now}, deadline_s=600)

    run_trio(write_then_wait, deadline=20, clock=MockClock(autojump_threshold=0))
    attach_books(results, gateways)
    assert [r.books for r in results] == [BOOKS_NO_ENTRY, "ok"]
