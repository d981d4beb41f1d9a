"""What the worker answers: the one home of the lab's truth, the thing the judge compares against
and the faults are laid out on.

The worker knows its answer, so the truth comes from it:

- the simulated worker's is computed from the scenario's settings (`ComputedTruth`: the
  scenario's `expected`, and the worker's `ResponsePlan` for the byte offsets), without a request;
- a real worker's is captured from it (`CapturedTruth`, made by `capture_truth`): before the
  scenarios run, the lab sends each request the cells will make (one per prompt, output limit and
  dialect), twice, through the worker's front (labs.worker.real), and checks that both answers
  agree, in layout (`faults.probe.same_layout`) and in text and reason. The capture is the
  expected text, reason and token events, and its layout places the cuts.

The runner asks the truth, never the scenario, for a cell's expected answer, a fault's layout and
the report's "worker's stream", whichever worker runs.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field
from functools import partial
from typing import Any, Protocol

import h11
import trio

from faults.layout import CapturedLayout, ResponseLayout, is_token_event
from faults.probe import UnstableUpstream
from finishline import Dialect, EventFramer
from labs.dialects import LAB_DIALECTS
from labs.grade.reading import read_stream
from labs.outcome import Expected
from labs.scenario import Scenario
from labs.worker.real import DEFAULT_REAL_MAX_TOKENS, RealWorker, capture_answers
from labs.worker.wire import response_plan

__all__ = ["CaptureError", "CapturedTruth", "ComputedTruth", "WorkerTruth", "capture_truth", "real_max_tokens"]


class CaptureError(ValueError):
    """A real worker's healthy answer could not be captured, or varied; the message says which."""


class WorkerTruth(Protocol):
    """What the worker answers a scenario's cells in a dialect, and what it is."""

    @property
    def facts(self) -> dict[str, Any]:
        """What the reports name: `worker` and, for a real one, its model and versions."""
        ...

    def expected(self, scenario: Scenario, dialect: Dialect) -> Expected: ...

    def layout(self, scenario: Scenario, dialect: Dialect) -> ResponseLayout: ...

    def stream(self, scenario: Scenario, dialect: Dialect) -> str: ...


@dataclass(frozen=True, slots=True)
class ComputedTruth:
    """The simulated worker's truth: computed from the scenario's settings."""

    facts: dict[str, Any] = field(default_factory=lambda: {"worker": "simulated"})

    def expected(self, scenario: Scenario, dialect: Dialect) -> Expected:
        return scenario.expected(dialect)

    def layout(self, scenario: Scenario, dialect: Dialect) -> ResponseLayout:
        return response_plan(scenario.resolved, dialect=dialect)

    def stream(self, scenario: Scenario, dialect: Dialect) -> str:
        return response_plan(scenario.resolved, dialect=dialect).to_bytes().decode("utf-8", errors="replace")


def real_max_tokens(scenario: Scenario) -> int:
    """The output limit a real worker's cells get: the scenario's `[request] max_tokens`, else
    `DEFAULT_REAL_MAX_TOKENS`."""
    return scenario.max_tokens or DEFAULT_REAL_MAX_TOKENS


def _request_key(scenario: Scenario, dialect: Dialect) -> tuple[str, int, Dialect]:
    # Scenarios with the same prompt and limit make the same request: one capture serves them all.
    return scenario.prompt, real_max_tokens(scenario), dialect


@dataclass(frozen=True, slots=True, kw_only=True)
class _Capture:
    layout: CapturedLayout
    raw: bytes
    expected: Expected

    @property
    def first_token_body_end(self) -> int | None:
        """Body bytes (framing excluded) through the first token event, None without one: where
        the hub, which counts body bytes, sees the first token go by."""
        _, body = _status_and_body(self.raw)
        offset = 0
        for event in EventFramer().receive_data(body):
            offset += len(event.raw)
            if is_token_event((event.data or b"").decode("utf-8", "replace"), self.expected.dialect):
                return offset
        return None


@dataclass(frozen=True, slots=True)
class CapturedTruth:
    """A real worker's truth: its captured answers, by (prompt, output limit, dialect)."""

    facts: dict[str, Any]
    captures: dict[tuple[str, int, Dialect], _Capture]

    def _capture(self, scenario: Scenario, dialect: Dialect) -> _Capture:
        return self.captures[_request_key(scenario, dialect)]

    def expected(self, scenario: Scenario, dialect: Dialect) -> Expected:
        return self._capture(scenario, dialect).expected

    def layout(self, scenario: Scenario, dialect: Dialect) -> ResponseLayout:
        return self._capture(scenario, dialect).layout

    def stream(self, scenario: Scenario, dialect: Dialect) -> str:
        return self._capture(scenario, dialect).raw.decode("utf-8", errors="replace")

    def first_token_body_ends(self, scenario: Scenario) -> dict[Dialect, int]:
        """Per dialect captured for `scenario`, the body bytes through its first token event."""
        ends = {}
        for dialect in LAB_DIALECTS:
            capture = self.captures.get(_request_key(scenario, dialect))
            if capture is not None and (end := capture.first_token_body_end) is not None:
                ends[dialect] = end
        return ends


def expected_from_capture(raw: bytes, dialect: Dialect, token_events: int) -> Expected:
    """The answer a captured healthy response carries (choice 0), read as the graders read a
    stream (`labs.grade.reading`): its text, tool calls, and reason in `dialect`'s words.

    Raises:
        CaptureError: the capture is no complete 2xx response.
    """
    status, body = _status_and_body(raw)
    if not 200 <= status < 300:
        raise CaptureError(f"the worker answered the lab's request with HTTP {status}: {body[:300].decode('utf-8', 'replace')}")
    reading = read_stream(body, dialect=dialect)
    choice = reading.choices.get(0)
    if choice is None:
        raise CaptureError(f"the worker's {dialect.value} stream carried no answer: {reading.summary()}")
    return Expected(
        text=choice.content,
        finish_reason=choice.finish_reason,
        tool_calls=tuple({"name": call["name"], "arguments": call["arguments"]} for call in choice.tool_calls),
        dialect=dialect,
        token_events=token_events,
    )


def _status_and_body(raw: bytes) -> tuple[int, bytes]:
    """A complete raw HTTP/1.1 response's status and decoded body (h11 undoes the framing)."""
    connection = h11.Connection(our_role=h11.CLIENT)
    connection.send(h11.Request(method="POST", target="/", headers=[("host", "capture")]))
    connection.receive_data(raw)
    connection.receive_data(b"")
    status, body = 0, bytearray()
    while True:
        try:
            event = connection.next_event()
        except h11.RemoteProtocolError as error:
            raise CaptureError(f"the capture is not a complete HTTP/1.1 response: {error}") from None
        if isinstance(event, h11.Response):
            status = event.status_code
        elif isinstance(event, h11.Data):
            body += event.data
        elif (
            isinstance(event, h11.EndOfMessage) or event in (h11.NEED_DATA, h11.PAUSED) or isinstance(event, h11.ConnectionClosed)
        ):
            return status, bytes(body)


async def capture_truth(worker: RealWorker, needed: Iterable[tuple[Scenario, Dialect]], *, at_once: int = 4) -> CapturedTruth:
    """Capture the real worker's answer to every request `needed` makes (module docstring), at most
    `at_once` requests at a time; each twice, one after the other, and they must agree.

    Raises:
        CaptureError: a capture failed, or two captures of one request differ.
    """
    keys = list(dict.fromkeys(_request_key(scenario, dialect) for scenario, dialect in needed))
    captures: dict[tuple[str, int, Dialect], _Capture] = {}
    failures: list[CaptureError] = []
    limiter = trio.CapacityLimiter(max(1, at_once))

    async def one(key: tuple[str, int, Dialect]) -> None:
        try:
            await capture(key)
        except CaptureError as error:  # one line for the user, not an exception group
            failures.append(error)

    async def capture(key: tuple[str, int, Dialect]) -> None:
        prompt, max_tokens, dialect = key
        async with limiter:
            try:
                layout, raws = await trio.to_thread.run_sync(
                    partial(capture_answers, worker, dialect, prompt=prompt, max_tokens=max_tokens)
                )
            except UnstableUpstream as error:
                raise CaptureError(f"{worker.facts.get('worker')} {dialect.value}: two healthy answers differ: {error}") from None
            except (OSError, ValueError) as error:
                raise CaptureError(
                    f"{worker.facts.get('worker')} {dialect.value}: cannot capture its healthy answer: {error}"
                ) from None
        answers = [expected_from_capture(raw, dialect, layout.token_events) for raw in raws]
        if any(answer != answers[0] for answer in answers[1:]):
            raise CaptureError(
                f"{worker.facts.get('worker')} {dialect.value}: two healthy answers differ "
                f"({answers[0].text!r}, {answers[0].finish_reason} vs {answers[1].text!r}, {answers[1].finish_reason}): "
                "the judge needs one truth (sampling? the lab asks for temperature 0)"
            )
        captures[key] = _Capture(layout=layout, raw=raws[0], expected=answers[0])

    async with trio.open_nursery() as nursery:
        for key in keys:
            nursery.start_soon(one, key)
    if failures:
        raise failures[0]
    return CapturedTruth(facts=dict(worker.facts), captures=captures)
