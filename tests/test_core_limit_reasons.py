"""Rules C11, M8, R6 (a reason that hides the token limit, said as the limit) and R7 (the Responses
indexes llama.cpp leaves out), each fed whole, a byte at a time and at random splits.

The upstream bytes are the simulated worker's, with the knobs that make it send what llama.cpp sends
(`hide_limit`: `stop` / `end_turn` / `response.completed` where the limit cut the answer;
`responses_indexes=0`: no `sequence_number`, `output_index`, `content_index`), so these tests and
the wire tests (tests/test_finish_fix_e2e_limits.py) meet the same bytes.
"""

from __future__ import annotations

import json
from typing import Any

import pytest

from finishline import Correction, Dialect, RepairPolicy, RequestFacts, StreamRepair, Verdict, repair_completion
from labs.worker.answer import Piece
from labs.worker.responses_events import response_frames
from labs.worker.settings import WorkerSettings
from labs.worker.wire import response_plan
from tests.dialect_streams import messages_stream
from tests.feeding import CHUNKINGS, data_events, run, split, sse
from tests.feeding import chunk as chat_chunk

LIMIT = 4
MAX_KEYS = {Dialect.CHAT: "max_tokens", Dialect.MESSAGES: "max_tokens", Dialect.RESPONSES: "max_output_tokens"}
OFF = RepairPolicy(limit_reasons=False, responses_indexes=False)


def worker_body(dialect: Dialect, *, stream: bool = True, limit: int | None = LIMIT, tokens: int = 6, **knobs: Any) -> bytes:
    """What the simulated worker sends for a request with `limit` (the body, unframed)."""
    request: dict[str, Any] = {"model": "m", "stream": stream, "stream_options": {"include_usage": True}}
    if limit is not None:
        request[MAX_KEYS[dialect]] = limit
    settings = WorkerSettings(tokens=tokens, **knobs).for_request(request, dialect)
    plan = response_plan(settings, stream=stream, dialect=dialect)
    return b"".join(segment.event for segment in plan.segments)


def facts(dialect: Dialect, limit: int | None = LIMIT, **extra: Any) -> RequestFacts:
    return RequestFacts(max_tokens=limit, **extra)


def events_of(out: bytes) -> list[Any]:
    return [event for event in data_events(out) if event != "[DONE]"]


def without_item_status(events: list[Any]) -> list[Any]:
    """The events with their items' own status left out: a truthful server marks the last item
    `incomplete` too, llama.cpp marks every item `completed`, and R6 changes only the response's."""
    for event in events:
        item = event.get("item")
        if isinstance(item, dict):
            item.pop("status", None)
        response = event.get("response")
        if isinstance(response, dict):
            response["output"] = []
    return events


# -- R6: Responses `completed` at the limit ------------------------------------------------------


@pytest.mark.parametrize("chunking", CHUNKINGS)
def test_r6_a_stream_completed_at_the_limit_ends_incomplete(chunking):
    upstream = worker_body(Dialect.RESPONSES, hide_limit=True)
    assert b"event: response.completed" in upstream  # the lie llama.cpp tells
    out, repair = run(upstream, chunking, request=facts(Dialect.RESPONSES), dialect=Dialect.RESPONSES)
    terminal = events_of(out)[-1]
    assert terminal["type"] == "response.incomplete"
    assert terminal["response"]["status"] == "incomplete"
    assert terminal["response"]["incomplete_details"] == {"reason": "max_output_tokens"}
    assert terminal["sequence_number"] == events_of(upstream)[-1]["sequence_number"]  # kept
    assert b"event: response.incomplete\n" in out and b"event: response.completed" not in out
    # Every other byte is the upstream's.
    assert out.split(b"event: response.incomplete")[0] == upstream.split(b"event: response.completed")[0]
    report = repair.report
    assert report.verdict is Verdict.REPAIRED and report.finish_reasons == ["max_output_tokens"]
    assert report.corrections == {Correction.LIMIT_REASON: 1}
    assert report.repairs == [
        "limit reason (R6): 'response.completed' at 4 output tokens of the request's 4 sent as 'response.incomplete'"
    ]


def test_r6_the_stream_the_worker_sends_when_truthful_is_what_r6_makes_of_the_lie():
    truthful = events_of(worker_body(Dialect.RESPONSES))
    repaired, _ = run(
        worker_body(Dialect.RESPONSES, hide_limit=True), request=facts(Dialect.RESPONSES), dialect=Dialect.RESPONSES
    )
    assert without_item_status(events_of(repaired)) == without_item_status(truthful)


@pytest.mark.parametrize(
    ("why", "upstream", "request_facts", "policy"),
    [
        ("below the limit", worker_body(Dialect.RESPONSES, tokens=3, hide_limit=True), facts(Dialect.RESPONSES), RepairPolicy()),
        (
            "no limit in the request",
            worker_body(Dialect.RESPONSES, hide_limit=True),
            facts(Dialect.RESPONSES, None),
            RepairPolicy(),
        ),
        ("already incomplete", worker_body(Dialect.RESPONSES), facts(Dialect.RESPONSES), RepairPolicy()),
        ("the option off", worker_body(Dialect.RESPONSES, hide_limit=True), facts(Dialect.RESPONSES), OFF),
    ],
)
def test_r6_leaves_alone_what_does_not_hide_the_limit(why, upstream, request_facts, policy):
    out, repair = run(upstream, "random", request=request_facts, policy=policy, dialect=Dialect.RESPONSES)
    assert out == upstream, why
    assert repair.report.verdict is Verdict.CLEAN and not repair.report.corrections


def test_r6_leaves_a_completed_event_whose_status_says_something_else():
    # vLLM 0.29 sent `response.completed` wrapping `status: "incomplete"`: it already tells the truth.
    lie = worker_body(Dialect.RESPONSES, hide_limit=True)
    upstream = lie.replace(b'1764000000,"status":"completed"', b'1764000000,"status":"incomplete"')
    assert upstream != lie
    out, repair = run(upstream, request=facts(Dialect.RESPONSES), dialect=Dialect.RESPONSES)
    assert out == upstream and not repair.report.corrections


def test_r6_a_whole_body_completed_at_the_limit_is_incomplete():
    body = worker_body(Dialect.RESPONSES, stream=False, hide_limit=True)
    result = repair_completion(body, facts(Dialect.RESPONSES), dialect=Dialect.RESPONSES)
    response = json.loads(result.body)
    assert result.verdict is Verdict.REPAIRED and result.corrections == (Correction.LIMIT_REASON,)
    assert response["status"] == "incomplete" and response["incomplete_details"] == {"reason": "max_output_tokens"}
    assert {**response, "status": "completed", "incomplete_details": None} == json.loads(body)
    assert result.repairs == ["limit reason (R6): 'completed' at 4 output tokens of the request's 4 sent as 'incomplete'"]
    for request_facts, policy in ((facts(Dialect.RESPONSES, None), RepairPolicy()), (facts(Dialect.RESPONSES), OFF)):
        untouched = repair_completion(body, request_facts, dialect=Dialect.RESPONSES, policy=policy)
        assert untouched.verdict is Verdict.CLEAN and untouched.body == body


# -- R7: the indexes llama.cpp leaves out ---------------------------------------------------------


def _answer() -> list[Piece]:
    """A reasoning item, a message item and a function call: three output items."""
    return [
        Piece(kind="reasoning", text="Hm"),
        Piece(kind="content", text="Hel"),
        Piece(kind="content", text="lo"),
        Piece(kind="tool_call", text="call_0_0"),
        Piece(kind="tool_arguments", text='{"a":'),
        Piece(kind="tool_arguments", text="1}"),
    ]


def _responses(*, indexes: bool) -> bytes:
    return b"".join(frame.event for frame in response_frames(_answer(), model="m", indexes=indexes))


@pytest.mark.parametrize("chunking", CHUNKINGS)
def test_r7_fills_in_every_missing_index_from_the_streams_own_order(chunking):
    bare, indexed = _responses(indexes=False), _responses(indexes=True)
    assert b"sequence_number" not in bare and b"output_index" not in bare
    out, repair = run(bare, chunking, dialect=Dialect.RESPONSES)
    # What finish_fix sends reads exactly as the stream of a server that sent them all.
    assert events_of(out) == events_of(indexed)
    report = repair.report
    events = len(events_of(indexed))
    assert report.verdict is Verdict.REPAIRED and report.corrections == {Correction.RESPONSES_INDEXES: events}
    with_output_index = sum(1 for event in events_of(indexed) if "output_index" in event)
    with_content_index = sum(1 for event in events_of(indexed) if "content_index" in event)
    assert report.repairs == [
        f"responses indexes (R7): filled in sequence_number on {events} events, output_index on {with_output_index} events, "
        f"content_index on {with_content_index} events"
    ]


def test_r7_never_changes_a_value_the_server_sent():
    # Sequence numbers from 10 and no output or content indexes: the numbers stay, the others are filled.
    upstream = b"".join(
        frame.event
        for frame in response_frames(_answer()[1:3], model="m", first_sequence_number=10)
        if True  # (all of them)
    )
    stripped = upstream.replace(b',"output_index":0', b"").replace(b',"content_index":0', b"")
    out, repair = run(stripped, "bytewise", dialect=Dialect.RESPONSES)
    assert events_of(out) == events_of(upstream)
    assert "sequence_number" not in repair.report.repairs[0]
    # And a number the server got wrong is its own business: it is not renumbered.
    odd = upstream.replace(b'"sequence_number":12,', b'"sequence_number":40,')
    out, repair = run(odd, dialect=Dialect.RESPONSES)
    assert out == odd and repair.report.verdict is Verdict.CLEAN


@pytest.mark.parametrize("chunking", CHUNKINGS)
def test_r7_fills_only_absent_or_null_keys_never_a_value_of_another_type(chunking):
    # A server's `"output_index": "0"` is a value it sent (wrong or not, its own business): kept
    # as it came, with `content_index` and `sequence_number` likewise. Only `null` is filled in.
    sent = {
        b'"sequence_number":2,"output_index":0,': b'"sequence_number":2,"output_index":"0",',
        b'"sequence_number":9,"item_id":"msg_finishline_1","output_index":1,"content_index":0,': (
            b'"sequence_number":9,"item_id":"msg_finishline_1","output_index":1,"content_index":"0",'
        ),
        b'"sequence_number":10,': b'"sequence_number":"10",',
    }
    nulls = {
        b'"sequence_number":11,"item_id":"msg_finishline_1","output_index":1,"content_index":0,': (
            b'"sequence_number":11,"item_id":"msg_finishline_1","output_index":null,"content_index":null,'
        ),
        b'"sequence_number":12,': b'"sequence_number":null,',
    }
    odd = _responses(indexes=True)
    for old, new in sent.items():
        assert odd.count(old) == 1
        odd = odd.replace(old, new)
    upstream = odd
    for old, new in nulls.items():
        assert upstream.count(old) == 1
        upstream = upstream.replace(old, new)
    out, repair = run(upstream, chunking, dialect=Dialect.RESPONSES)
    assert events_of(out) == events_of(odd)
    for value in sent.values():
        assert value in out
    assert repair.report.repairs == [
        "responses indexes (R7): filled in sequence_number on 1 event, output_index on 1 event, content_index on 1 event"
    ]


def test_r7_a_stream_with_every_index_passes_byte_for_byte():
    indexed = _responses(indexes=True)
    out, repair = run(indexed, "random", dialect=Dialect.RESPONSES)
    assert out == indexed and repair.report.verdict is Verdict.CLEAN and not repair.report.repairs


def test_r7_off_leaves_the_indexes_out():
    bare = _responses(indexes=False)
    out, repair = run(bare, dialect=Dialect.RESPONSES, policy=RepairPolicy(responses_indexes=False))
    assert out == bare and repair.report.verdict is Verdict.CLEAN


def test_r7_and_r6_together_on_what_llama_cpp_sends():
    upstream = worker_body(Dialect.RESPONSES, hide_limit=True, responses_indexes=False)
    out, repair = run(upstream, "bytewise", request=facts(Dialect.RESPONSES), dialect=Dialect.RESPONSES)
    assert without_item_status(events_of(out)) == without_item_status(events_of(worker_body(Dialect.RESPONSES)))
    assert set(repair.report.corrections) == {Correction.LIMIT_REASON, Correction.RESPONSES_INDEXES}


def test_r7_a_cut_continues_the_filled_in_numbers():
    bare = _responses(indexes=False)
    cut_at = bare.index(b"event: response.output_text.done")
    out, _ = run(bare[:cut_at], dialect=Dialect.RESPONSES)
    numbers = [event["sequence_number"] for event in events_of(out)]
    assert numbers == list(range(len(numbers)))


# -- R8: the snapshot fields llama.cpp leaves out -----------------------------------------------


#: llama.cpp's `response.created` and `response.in_progress` name neither a `created_at` nor a
#: `model` (only its `response.completed` does); the worker's stream with those two removed.
def _without_snapshot_fields() -> tuple[bytes, bytes]:
    whole = _responses(indexes=True)
    snapshots, rest = whole.split(b"\n\n", 2)[:2], whole.split(b"\n\n", 2)[2]
    assert [b"event: response.created\n", b"event: response.in_progress\n"] == [s[: s.index(b"\n") + 1] for s in snapshots]
    bare = [s.replace(b',"created_at":1764000000', b"").replace(b',"model":"m"', b"") for s in snapshots]
    assert bare != snapshots
    return whole, b"\n\n".join([*bare, rest])


@pytest.mark.parametrize("chunking", CHUNKINGS)
def test_r8_fills_in_a_snapshots_created_at_and_model_from_the_request(chunking):
    whole, bare = _without_snapshot_fields()
    request = RequestFacts(model="m", created_at=1764000000)
    out, repair = run(bare, chunking, request=request, dialect=Dialect.RESPONSES)
    # What the client gets reads as the stream of a server that sent them: the same values, in the
    # snapshot objects, every other byte as it came.
    assert events_of(out) == events_of(whole)
    report = repair.report
    assert report.verdict is Verdict.REPAIRED and report.corrections == {Correction.RESPONSES_FIELDS: 2}
    assert report.repairs == ["responses fields (R8): filled in created_at on 2 events, model on 2 events from the request"]
    assert out.replace(b',"created_at":1764000000,"model":"m"}}', b"}}") == bare


def test_r8_never_changes_a_value_the_server_sent_nor_makes_up_one_the_request_lacks():
    whole, bare = _without_snapshot_fields()
    # Every field there: byte for byte, whatever the request says.
    out, repair = run(whole, "random", request=RequestFacts(model="other", created_at=1), dialect=Dialect.RESPONSES)
    assert out == whole and repair.report.verdict is Verdict.CLEAN
    # A request without a model and no clock reading: nothing to fill in, nothing made up.
    out, repair = run(bare, "bytewise", dialect=Dialect.RESPONSES)
    assert out == bare and repair.report.verdict is Verdict.CLEAN
    # Only the model known: only the model filled in; a `null` counts as missing.
    nulled = bare.replace(b'"status":"in_progress"', b'"model":null,"status":"in_progress"', 1)
    out, repair = run(nulled, request=RequestFacts(model="asked"), dialect=Dialect.RESPONSES)
    snapshots = [event["response"] for event in events_of(out)[:2]]
    assert [(r.get("model"), "created_at" in r) for r in snapshots] == [("asked", False), ("asked", False)]
    assert repair.report.corrections == {Correction.RESPONSES_FIELDS: 2}


def test_r8_off_leaves_the_snapshots_as_they_came():
    _, bare = _without_snapshot_fields()
    request = RequestFacts(model="m", created_at=1764000000)
    out, repair = run(bare, request=request, dialect=Dialect.RESPONSES, policy=RepairPolicy(responses_fields=False))
    assert out == bare and repair.report.verdict is Verdict.CLEAN


def test_r8_a_cut_stream_still_ends_in_the_error_with_the_snapshot_filled_in():
    _, bare = _without_snapshot_fields()
    cut = bare[: bare.index(b"event: response.output_text.done")]
    out, repair = run(cut, "random", request=RequestFacts(model="m", created_at=5), dialect=Dialect.RESPONSES)
    events = events_of(out)
    assert events[0]["response"]["created_at"] == 5 and events[-1]["type"] == "response.failed"
    assert repair.report.verdict is Verdict.INTERRUPTED


# -- M8: Messages `end_turn` ---------------------------------------------------------------------


@pytest.mark.parametrize("chunking", CHUNKINGS)
def test_m8_end_turn_at_the_limit_becomes_max_tokens(chunking):
    upstream = worker_body(Dialect.MESSAGES, hide_limit=True)
    assert b'"stop_reason":"end_turn"' in upstream
    out, repair = run(upstream, chunking, request=facts(Dialect.MESSAGES), dialect=Dialect.MESSAGES)
    assert out == upstream.replace(b'"stop_reason":"end_turn"', b'"stop_reason":"max_tokens"')
    report = repair.report
    assert report.finish_reasons == ["max_tokens"] and report.corrections == {Correction.LIMIT_REASON: 1}
    assert report.repairs == ["limit reason (M8): 'end_turn' at 4 output tokens of the request's 4 sent as 'max_tokens'"]


@pytest.mark.parametrize("chunking", CHUNKINGS)
def test_m8_end_turn_with_a_stop_sequence_becomes_stop_sequence(chunking):
    # llama.cpp on a matched stop string: `end_turn`, and the string in `stop_sequence`.
    upstream = b"".join(messages_stream(["Hel", "lo"], stop_reason="end_turn"))
    upstream = upstream.replace(b'"stop_sequence":null}', b'"stop_sequence":" the"}')
    out, repair = run(upstream, chunking, request=facts(Dialect.MESSAGES, 100), dialect=Dialect.MESSAGES)
    assert out == upstream.replace(b'"stop_reason":"end_turn"', b'"stop_reason":"stop_sequence"')
    assert repair.report.corrections == {Correction.STOP_SEQUENCE_REASON: 1}
    assert repair.report.repairs == ["stop sequence reason (M8): 'end_turn' with a stop_sequence sent as 'stop_sequence'"]


@pytest.mark.parametrize(
    ("why", "upstream", "request_facts", "policy"),
    [
        ("below the limit", worker_body(Dialect.MESSAGES, tokens=3, hide_limit=True), facts(Dialect.MESSAGES), RepairPolicy()),
        ("no limit", worker_body(Dialect.MESSAGES, limit=None, tokens=4), facts(Dialect.MESSAGES, None), RepairPolicy()),
        ("already max_tokens", worker_body(Dialect.MESSAGES), facts(Dialect.MESSAGES), RepairPolicy()),
        ("the option off", worker_body(Dialect.MESSAGES, hide_limit=True), facts(Dialect.MESSAGES), OFF),
    ],
)
def test_m8_leaves_alone_what_does_not_hide_anything(why, upstream, request_facts, policy):
    out, repair = run(upstream, "random", request=request_facts, policy=policy, dialect=Dialect.MESSAGES)
    assert out == upstream, why
    assert repair.report.verdict is Verdict.CLEAN


@pytest.mark.parametrize("chunking", CHUNKINGS)
def test_m2_counts_token_deltas_toward_the_limit_when_no_usage_came(chunking):
    # The lab's length-omitted in Messages: no `message_delta` at all, `message_start` counts 0.
    upstream = worker_body(Dialect.MESSAGES, finish="omitted")
    out, repair = run(upstream, chunking, request=facts(Dialect.MESSAGES), dialect=Dialect.MESSAGES)
    assert repair.report.finish_reasons == ["max_tokens"]
    assert repair.report.repairs == ["injected stop_reason 'max_tokens' before message_stop"]
    # Fewer deltas than the limit: a natural end (a lower bound never says "limit" below it).
    short = worker_body(Dialect.MESSAGES, limit=None, tokens=3, finish="omitted")
    _, repair = run(short, chunking, request=facts(Dialect.MESSAGES), dialect=Dialect.MESSAGES)
    assert repair.report.finish_reasons == ["end_turn"]
    _, repair = run(upstream, chunking, request=facts(Dialect.MESSAGES), policy=OFF, dialect=Dialect.MESSAGES)
    assert repair.report.finish_reasons == ["end_turn"]  # today's inference, with the option off


@pytest.mark.parametrize("chunking", CHUNKINGS)
def test_m2_and_m8_do_not_take_message_starts_placeholder_for_output_tokens(chunking):
    # Anthropic's `message_start` says `"output_tokens": 1` before any token: a placeholder, not a
    # count. With `max_tokens` 1 and no token sent, neither rule may say the limit was hit.
    def placeholder(events: list[bytes]) -> bytes:
        upstream = b"".join(events)
        assert upstream.count(b'"output_tokens":0') >= 1
        return upstream.replace(b'"output_tokens":0}}}', b'"output_tokens":1}}}', 1)

    request = facts(Dialect.MESSAGES, 1)
    # M8: `end_turn` in a `message_delta` that counts no usage.
    ended = placeholder(messages_stream([], stop_reason="end_turn"))
    ended = ended.replace(b',"usage":{"output_tokens":0}}', b"}")
    assert b'"output_tokens":1}}}' in ended and ended.count(b"output_tokens") == 1
    out, repair = run(ended, chunking, request=request, dialect=Dialect.MESSAGES)
    assert out == ended and repair.report.verdict is Verdict.CLEAN
    # M2: no `message_delta` at all, so the injected reason is inferred.
    unfinished = placeholder(messages_stream([], message_delta=False))
    _, repair = run(unfinished, chunking, request=request, dialect=Dialect.MESSAGES)
    assert repair.report.finish_reasons == ["end_turn"]
    assert repair.report.repairs == ["injected stop_reason 'end_turn' before message_stop"]
    _, repair = run(unfinished, chunking, request=request, policy=OFF, dialect=Dialect.MESSAGES)
    assert repair.report.finish_reasons == ["end_turn"]


def test_m8_whole_messages():
    body = worker_body(Dialect.MESSAGES, stream=False, hide_limit=True)
    result = repair_completion(body, facts(Dialect.MESSAGES), dialect=Dialect.MESSAGES)
    assert result.body == body.replace(b'"stop_reason":"end_turn"', b'"stop_reason":"max_tokens"')
    assert result.corrections == (Correction.LIMIT_REASON,)
    stopped = worker_body(Dialect.MESSAGES, stream=False, limit=None, tokens=3)
    stopped = stopped.replace(b'"stop_sequence":null', b'"stop_sequence":"."')
    result = repair_completion(stopped, facts(Dialect.MESSAGES, 100), dialect=Dialect.MESSAGES)
    assert json.loads(result.body)["stop_reason"] == "stop_sequence"
    assert result.corrections == (Correction.STOP_SEQUENCE_REASON,)
    untouched = repair_completion(body, facts(Dialect.MESSAGES), dialect=Dialect.MESSAGES, policy=OFF)
    assert untouched.verdict is Verdict.CLEAN and untouched.body == body


# -- C11: Chat `stop` at the limit ---------------------------------------------------------------


@pytest.mark.parametrize("chunking", CHUNKINGS)
def test_c11_stop_at_the_limit_becomes_length_by_the_usage_chunk_after_it(chunking):
    upstream = worker_body(Dialect.CHAT, hide_limit=True)
    assert b'"finish_reason":"stop"' in upstream and b'"completion_tokens":4' in upstream
    out, repair = run(upstream, chunking, request=facts(Dialect.CHAT, stream_usage=True))
    assert out == upstream.replace(b'"finish_reason":"stop"', b'"finish_reason":"length"')
    assert repair.report.finish_reasons == ["length"] and repair.report.corrections == {Correction.LIMIT_REASON: 1}
    assert repair.report.repairs == ["limit reason (C11): 'stop' at 4 output tokens of the request's 4 sent as 'length'"]


@pytest.mark.parametrize("chunking", CHUNKINGS)
def test_c11_usage_in_the_finish_chunk_itself(chunking):
    upstream = sse(chat_chunk("a"), chat_chunk(finish_reason="stop", usage={"completion_tokens": 5}), b"[DONE]")
    out, repair = run(upstream, chunking, request=facts(Dialect.CHAT))
    assert out == upstream.replace(b'"finish_reason": "stop"', b'"finish_reason": "length"')
    assert repair.report.corrections == {Correction.LIMIT_REASON: 1}


@pytest.mark.parametrize(
    ("why", "upstream", "request_facts"),
    [
        ("below the limit", worker_body(Dialect.CHAT, tokens=3, hide_limit=True), facts(Dialect.CHAT, stream_usage=True)),
        ("no usage asked for, none in the finish", worker_body(Dialect.CHAT, hide_limit=True), facts(Dialect.CHAT)),
        ("no limit", worker_body(Dialect.CHAT, hide_limit=True), facts(Dialect.CHAT, None, stream_usage=True)),
        ("two choices", worker_body(Dialect.CHAT, hide_limit=True, n=2), facts(Dialect.CHAT, stream_usage=True, choices=2)),
        ("already length", worker_body(Dialect.CHAT), facts(Dialect.CHAT, stream_usage=True)),
    ],
)
def test_c11_leaves_alone_what_does_not_hide_the_limit(why, upstream, request_facts):
    out, repair = run(upstream, "bytewise", request=request_facts)
    assert out == upstream, why
    assert not repair.report.corrections


def test_c11_a_held_finish_goes_out_as_it_came_when_no_usage_follows():
    finish = chat_chunk(finish_reason="stop")
    for ending, tail in (("clean", b""), ("failure", b""), ("clean", b": keep-alive\n\n"), ("clean", sse(b"[DONE]"))):
        upstream = sse(chat_chunk("a"), finish) + tail
        repair = StreamRepair(request=facts(Dialect.CHAT, stream_usage=True))
        out = repair.receive_data(upstream)
        if not tail:
            assert out == sse(chat_chunk("a")), "the finish waits for the usage chunk after it"
        out += repair.receive_end() if ending == "clean" else repair.receive_failure("reset").client_bytes
        assert out.startswith(upstream), (ending, tail)  # in order, unchanged
        assert not repair.report.corrections


@pytest.mark.parametrize("chunking", CHUNKINGS)
def test_c11_a_held_finish_and_a_half_event_go_out_when_the_caller_gives_up(chunking):
    # The caller caught a misuse and stops repairing: what the machine held is handed back, in order.
    upstream = sse(chat_chunk("a"), chat_chunk(finish_reason="stop")) + b'data: {"choi'
    repair = StreamRepair(request=facts(Dialect.CHAT, stream_usage=True))
    out = b"".join(repair.receive_data(piece) for piece in split(upstream, chunking))
    assert out == sse(chat_chunk("a")), "the finish waits for the usage chunk after it"
    out += repair.give_up(RuntimeError("misuse"))
    assert out == upstream
    assert repair.report.verdict is Verdict.SKIPPED and repair.report.client_bytes == len(upstream)
    assert repair.give_up(RuntimeError("again")) == b""


def test_c11_the_option_off_sends_the_finish_at_once():
    upstream = sse(chat_chunk("a"), chat_chunk(finish_reason="stop"))
    repair = StreamRepair(request=facts(Dialect.CHAT, stream_usage=True), policy=OFF)
    assert repair.receive_data(upstream) == upstream


def test_c11_whole_completions():
    body = worker_body(Dialect.CHAT, stream=False, hide_limit=True)
    result = repair_completion(body, facts(Dialect.CHAT))
    assert result.body == body.replace(b'"finish_reason":"stop"', b'"finish_reason":"length"')
    assert result.corrections == (Correction.LIMIT_REASON,)
    for request_facts, policy in ((facts(Dialect.CHAT, None), RepairPolicy()), (facts(Dialect.CHAT), OFF)):
        assert repair_completion(body, request_facts, policy=policy).body == body
    two = worker_body(Dialect.CHAT, stream=False, hide_limit=True, n=2)
    assert repair_completion(two, facts(Dialect.CHAT, choices=2)).body == two
