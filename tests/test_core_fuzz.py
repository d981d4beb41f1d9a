"""Fuzz contracts of the repair core (hypothesis): any bytes, any split points, any way to end.

Contracts (what `StreamRepair` promises for every input; each test below checks one):

1. It never raises on what the upstream sent: `receive_data`, `receive_end`, `receive_failure`,
   `receive_timer` return normally, and it never reports an internal error (that would be a bug of
   ours falling back to passthrough).
2. Its output starts with every complete upstream event unchanged, in order. The only exceptions are
   the documented rewrites: rule C2 (`"finish_reason": ""` becomes null, nothing else in the data
   changes), rule C3 (finishing events inserted before `[DONE]` or a usage-only chunk), rule C4
   (`[DONE]` appended, the blank line of a last readable event completed), rule C6 (one error event, or
   with on_cut=stop finishing events and `[DONE]`); every inserted event is one the report lists in
   `injected`; and the corrections the report counts (`corrections`: C11's `stop` said as `length`,
   M8's `end_turn` said as `max_tokens` or `stop_sequence`, R6's `response.completed` said as
   `response.incomplete`, R7's missing indexes filled in), each changing only the values its rule
   names. An incomplete event left at a failure or a stall is dropped (no client would
   dispatch it), never changed.
3. It ends, as a client reads it (up to the first `[DONE]` or error event), either in a finish for
   every choice that carried deltas and `[DONE]`, or in exactly one error event. With on_cut=pass
   nothing is added at a cut or stall, so only (2) applies.
4. Its books say `malformed` exactly when an event a client reads (up to the first `[DONE]` or error
   event) has data that is not JSON, and name the first such event by its number (unless it gave
   up on the stream: `skipped`).

Ends are: clean (`receive_end`), failure (`receive_failure`), or stall (`receive_timer` past the
deadlines). A timer that goes off before a deadline never ends the stream.
"""

from __future__ import annotations

import copy
import json

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from finishline import ClientEnding, Dialect, EventFramer, OnCut, RepairPolicy, RequestFacts, StreamRepair, Verdict
from tests.feeding import chunk
from tests.test_core_properties import frame, splits

SETTINGS = settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
ENDS = st.sampled_from(["clean", "failure", "stall"])
TIMEOUT = 1.0  # both deadlines, in the test's clock; data arrives at t=0, the stall timer at t=1000

# Pieces that mean something to the machine, mixed with arbitrary bytes.
_MEANINGFUL = st.sampled_from(
    [
        frame(chunk("a"), b"\n"),
        frame(chunk("b", index=1), b"\r\n"),
        frame(chunk(finish_reason="stop"), b"\n"),
        frame(chunk("c", finish_reason=""), b"\n"),
        frame(chunk(delta={"tool_calls": [{"index": 0, "function": {"arguments": "{"}}]}), b"\n"),
        frame(chunk(choices=[], usage={"completion_tokens": 3}), b"\n"),
        frame(chunk(finish_reason="stop", usage={"completion_tokens": 4}), b"\n"),
        frame({"error": {"message": "boom"}}, b"\n"),
        frame(b"[DONE]", b"\n"),
        b": keep-alive\n\n",
        b"event: error\ndata: x\n\n",
        b"\n",
        b"\r",
        b"data: ",
        b"data:{",
        b"\xef\xbb\xbf",
    ]
)
UPSTREAM = st.lists(st.one_of(st.binary(max_size=40), _MEANINGFUL), max_size=12).map(b"".join)


def run(data, *, on_cut: OnCut, dialect: Dialect = Dialect.CHAT, upstream=UPSTREAM) -> tuple[bytes, StreamRepair, bytes, str]:
    """Feeds a drawn stream (from `upstream`, in `dialect`) at drawn splits, with early timers in
    between, and ends it a drawn way. Returns (upstream, machine, client output, end)."""
    upstream = data.draw(upstream)
    end = data.draw(ENDS)
    policy = RepairPolicy(on_cut=on_cut, idle_timeout=TIMEOUT, first_token_timeout=TIMEOUT)
    # A limit of 3, and usage asked for in the stream or not (rule C11 holds a finish for it).
    request = RequestFacts(max_tokens=3, stream_usage=data.draw(st.booleans()))
    repair = StreamRepair(request=request, policy=policy, started_at=0.0, sent_at=0.0, dialect=dialect)
    out = []
    for piece in data.draw(splits(upstream)):
        out.append(repair.receive_data(piece, now=0.0))
        if data.draw(st.booleans()):
            assert repair.receive_timer(TIMEOUT / 2) is None, "a timer before the deadline ends nothing"
    if end == "clean":
        out.append(repair.receive_end(now=1.0))
    elif end == "failure":
        ending: ClientEnding | None = repair.receive_failure("reset", now=1.0)
        assert isinstance(ending, ClientEnding)
        out.append(ending.client_bytes)
    else:
        check_at = repair.next_stall_check(0.0)
        ending = repair.receive_timer(1000.0)
        if ending is None:  # past [DONE] or an error event: no deadline runs, the upstream ends later
            assert check_at is None and repair.next_stall_check(1000.0) is None
            out.append(repair.receive_end(now=1000.0))
        else:
            assert check_at is not None and check_at <= 1000.0
            out.append(ending.client_bytes)
    assert repair.ended
    return upstream, repair, b"".join(out), end


def client_view(stream: bytes) -> list:
    """Events as a client reads them, up to and including the first `[DONE]` or error event (a chunk
    with a top-level `error`, or an `event: error` block with data); an error event is the dict
    {"error": ...}."""
    framer = EventFramer()
    events = framer.receive_data(stream)
    leftover = framer.receive_end()
    seen: list = []
    for event in events:
        if event.data is None:
            continue  # not dispatched
        if event.data.startswith(b"[DONE]"):
            return seen + ["[DONE]"]
        parsed = _parsed(event.data)
        if event.event_type == b"error" or (isinstance(parsed, dict) and parsed.get("error") is not None):
            return seen + [{"error": parsed}]
        if parsed is not None:
            seen.append(parsed)
    # Before [DONE] or an error event, finish_fix never leaves the client inside an event.
    assert leftover is None, f"the output ends inside an event: {leftover!r}"
    return seen


def _without_empty_reasons(value):
    """Rule C2 applied to parsed JSON: what the rewritten data must parse to."""
    if isinstance(value, dict):
        return {k: (None if k == "finish_reason" and v == "" else _without_empty_reasons(v)) for k, v in value.items()}
    if isinstance(value, list):
        return [_without_empty_reasons(v) for v in value]
    return value


def _parsed(data: bytes | None):
    try:
        return json.loads(data) if data is not None else None
    except ValueError:
        return None


def _is_rule_2_rewrite(upstream_event, client_event) -> bool:
    before = _parsed(upstream_event.data)
    return (
        before is not None
        and before != _without_empty_reasons(before)
        and _parsed(client_event.data) == _without_empty_reasons(before)
    )


_INDEXES = ("sequence_number", "output_index", "content_index")


def is_correction(upstream_event, client_event, repair: StreamRepair) -> bool:
    """`client_event` is `upstream_event` changed only by the correction rules the report counts
    (C11, M8, R6, R7), each in the values it names: undoing those gives the upstream's data back."""
    corrections = repair.report.corrections
    before, after = _parsed(upstream_event.data), _parsed(client_event.data)
    if not corrections or not isinstance(before, dict) or not isinstance(after, dict):
        return False
    undone = copy.deepcopy(after)
    event_type = client_event.event_type
    if "responses_indexes" in corrections:
        for key in _INDEXES:
            if key not in before and isinstance(undone.get(key), int):
                del undone[key]
    if (
        "limit_reason" in corrections
        and undone.get("type") == "response.incomplete"
        and before.get("type") == "response.completed"
    ):
        undone["type"] = "response.completed"
        response, original = undone.get("response"), before.get("response")
        if isinstance(response, dict) and isinstance(original, dict):
            response["status"] = original.get("status")
            response.pop("incomplete_details", None)
            if "incomplete_details" in original:
                response["incomplete_details"] = original["incomplete_details"]
        if event_type == b"response.incomplete":
            event_type = upstream_event.event_type
    delta, original_delta = undone.get("delta"), before.get("delta")
    if isinstance(delta, dict) and isinstance(original_delta, dict) and original_delta.get("stop_reason") == "end_turn":
        rules = {"max_tokens": "limit_reason", "stop_sequence": "stop_sequence_reason"}
        if rules.get(str(delta.get("stop_reason"))) in corrections:
            delta["stop_reason"] = "end_turn"
    choices, original_choices = undone.get("choices"), before.get("choices")
    if (
        "limit_reason" in corrections
        and isinstance(choices, list)
        and isinstance(original_choices, list)
        and len(choices) == len(original_choices) == 1
        and isinstance(choices[0], dict)
        and isinstance(original_choices[0], dict)
        and choices[0].get("finish_reason") == "length"
        and original_choices[0].get("finish_reason") == "stop"
    ):
        choices[0]["finish_reason"] = "stop"
    return undone == before and event_type == upstream_event.event_type


def _injected_kind(event) -> str | None:
    """Which of the report's `injected` kinds `event` looks like, if any."""
    if event.data is None:
        return None
    if event.data == b"[DONE]":
        return "done"
    parsed = _parsed(event.data)
    if not isinstance(parsed, dict):
        return None
    if isinstance(parsed.get("error"), dict) and parsed["error"].get("code") == "stream_interrupted":
        return "error_event"
    choices = parsed.get("choices")
    if isinstance(choices, list) and len(choices) == 1 and isinstance(choices[0], dict) and choices[0].get("delta") == {}:
        return "finish"
    return None


def assert_upstream_events_lead_unchanged(upstream: bytes, repair: StreamRepair, out: bytes, injected_kind=None) -> None:
    """Contract 2: the client's events are the upstream's complete events, in order, unchanged or
    rewritten by rule C2 or a correction rule (`is_correction`), with only the report's injections (and the completed last event) between.
    `injected_kind` says which injection an event looks like (Chat's `_injected_kind` by default;
    the other dialects' fuzz contracts pass their own)."""
    injected_kind = injected_kind or _injected_kind
    upstream_framer = EventFramer()
    expected = upstream_framer.receive_data(upstream)
    leftover = upstream_framer.receive_end()
    client_framer = EventFramer()
    got = client_framer.receive_data(out)
    client_leftover = client_framer.receive_end()
    budget: dict[str, int] = {}
    for injection in repair.report.injected:
        budget[injection["kind"]] = budget.get(injection["kind"], 0) + 1
    position = 0
    for event in got:
        if position < len(expected) and (
            event.raw == expected[position].raw
            or _is_rule_2_rewrite(expected[position], event)
            or is_correction(expected[position], event, repair)
        ):
            position += 1
            continue
        kind = injected_kind(event)
        if kind is not None and budget.get(kind, 0) > 0:
            budget[kind] -= 1
            continue
        if position == len(expected) and leftover is not None and event.raw.startswith(leftover.raw):
            assert "completed the framing of the last event" in repair.report.repairs
            leftover = None
            continue
        raise AssertionError(f"client event {event.raw!r} is neither upstream event {position} nor an injection {budget}")
    assert position == len(expected), f"only {position} of {len(expected)} complete upstream events reached the client"
    assert all(count == 0 for count in budget.values()), f"the report lists injections that were not sent: {budget}"
    if client_leftover is not None:  # bytes passed on as sent (after [DONE], or an error, or on_cut=pass)
        assert leftover is not None and client_leftover.raw == leftover.raw


@given(st.data())
@SETTINGS
def test_contract_1_never_raises_and_never_falls_back(data):
    _, repair, _, _ = run(data, on_cut=data.draw(st.sampled_from(list(OnCut))))
    assert repair.report.internal_error is None, repair.report.internal_error


@given(st.data())
@SETTINGS
def test_contract_2_every_complete_upstream_event_reaches_the_client_unchanged(data):
    upstream, repair, out, _ = run(data, on_cut=data.draw(st.sampled_from(list(OnCut))))
    assert_upstream_events_lead_unchanged(upstream, repair, out)


@given(st.data())
@SETTINGS
def test_contract_3_ends_in_finish_and_done_or_exactly_one_error_event(data):
    _, repair, out, _ = run(data, on_cut=data.draw(st.sampled_from([OnCut.ERROR, OnCut.STOP])))
    events = client_view(out)
    assert events, out
    assert sum(1 for injection in repair.report.injected if injection["kind"] == "error_event") <= 1
    last = events[-1]
    if isinstance(last, dict) and set(last) == {"error"}:
        return  # client_view stops at the first error event: it is the only one the client acts on
    assert last == "[DONE]", out
    seen, finished = set(), set()
    for event in events[:-1]:
        for choice in event.get("choices", []) if isinstance(event, dict) else []:
            if isinstance(choice, dict) and isinstance(choice.get("index"), int) and not isinstance(choice["index"], bool):
                seen.add(choice["index"])
                if choice.get("finish_reason"):
                    finished.add(choice["index"])
    assert seen <= finished | _choices_without_deltas(events), out


def _choices_without_deltas(events: list) -> set:
    """Choice indices that never carried a delta dict (rule C3 finishes only choices with deltas)."""
    with_deltas = set()
    indices = set()
    for event in events:
        for choice in event.get("choices", []) if isinstance(event, dict) else []:
            if isinstance(choice, dict) and isinstance(choice.get("index"), int):
                indices.add(choice["index"])
                if isinstance(choice.get("delta"), dict):
                    with_deltas.add(choice["index"])
    return indices - with_deltas


def _first_unreadable(upstream: bytes) -> int | None:
    """Contract 4's reader: the number (from 1, as a client counts dispatched events) of the first
    event a client reads whose data is not JSON, up to the first `[DONE]` or error event; None
    when every one parses."""
    number = 0
    for event in EventFramer().receive_data(upstream):
        if event.data is None:
            continue
        number += 1
        if event.data.startswith(b"[DONE]") or event.event_type == b"error":
            return None
        try:
            parsed = json.loads(event.data)
        except ValueError:  # not JSON, or not UTF-8
            return number
        if isinstance(parsed, dict) and parsed.get("error") is not None:
            return None
    return None


@given(st.data())
@SETTINGS
def test_contract_4_malformed_exactly_when_a_client_reads_an_event_that_is_not_json(data):
    upstream, repair, _, _ = run(data, on_cut=data.draw(st.sampled_from(list(OnCut))))
    report = repair.report
    if report.verdict is Verdict.SKIPPED:
        return
    first = _first_unreadable(upstream)
    assert (report.verdict is Verdict.MALFORMED) == (first is not None), (upstream, report.detail)
    assert report.first_malformed_event == first, (upstream, report.detail)
    if first is not None:
        assert report.detail.startswith(f"malformed: event {first}'s data is not JSON"), report.detail
