"""The Python driver host's classification of an ending (labs/clients/python_host.py `run`).

The drivers here are fakes of a library (a function with the driver signature): what is tested is
the host's rule, "only the lab's own deadline is a hang", not a client library.
"""

from __future__ import annotations

import asyncio

import pytest

from finishline import Dialect
from labs.clients.python_drivers import DRIVERS
from labs.clients.python_host import run


def _request(client: str, deadline_s: float) -> dict:
    return {"id": "c0001", "client": client, "deadline_s": deadline_s}


def test_a_librarys_own_builtin_timeout_error_is_an_error_not_a_hang(monkeypatch):
    async def library_that_times_out(request, sink):
        sink.add_text("The quick")
        raise TimeoutError("read timed out after 5 s")

    monkeypatch.setitem(DRIVERS, ("times-out", Dialect.CHAT), library_that_times_out)
    record = asyncio.run(run(_request("times-out", deadline_s=60)))
    assert (record["timed_out"], record["completed"]) == (False, False)
    assert (record["error_class"], record["error_message"]) == ("TimeoutError", "read timed out after 5 s")
    assert record["text"] == "The quick"


@pytest.mark.timeout(600)
def test_the_labs_own_deadline_is_a_hang(monkeypatch):
    async def library_that_never_ends(request, sink):
        sink.add_text("The quick")
        await asyncio.sleep(3600)

    monkeypatch.setitem(DRIVERS, ("never-ends", Dialect.CHAT), library_that_never_ends)
    record = asyncio.run(run(_request("never-ends", deadline_s=0.2)))
    assert record["timed_out"] is True
    assert record["error_message"] == "lab deadline of 0.2s passed"
    assert record["text"] == "The quick"


def test_tool_call_deltas_accumulate_per_index(monkeypatch):
    # The OpenAI stream's shape: the first delta of a call names it, later ones carry pieces of
    # its arguments, two calls interleaved by index.
    async def library_with_two_calls(request, sink):
        sink.add_tool_call(0, "get_weather", "")
        sink.add_tool_call(1, "get_weather", '{"ci')
        sink.add_tool_call(0, None, '{"city": ')
        sink.add_tool_call(0, None, '"Paris"}')
        sink.add_tool_call(1, None, 'ty": "Oslo"}')
        return "tool_calls"

    monkeypatch.setitem(DRIVERS, ("two-calls", Dialect.CHAT), library_with_two_calls)
    record = asyncio.run(run(_request("two-calls", deadline_s=10)))
    assert record["tool_calls"] == [
        {"name": "get_weather", "arguments": '{"city": "Paris"}'},
        {"name": "get_weather", "arguments": '{"city": "Oslo"}'},
    ]
