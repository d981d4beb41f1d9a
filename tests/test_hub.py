"""The hub (labs/hub): each tunnel-drop policy, byte for byte, for chunked and close-delimited
bodies, with the real toxiproxy cutting the tunnel (FIN or reset) between the hub and the worker."""

from __future__ import annotations

import json
import re
import sys
from functools import partial
from pathlib import Path

import h11
import pytest
import trio

from faults.catalog import Fault, cut_after_tokens, cut_during_prefill, down
from faults.child_processes import run_child
from faults.toxiproxy_client import Toxic
from finishline import Dialect, EventFramer
from labs.dialects import LAB_DIALECTS
from labs.hub import (
    BAD_GATEWAY_BODY,
    ERROR_EVENT,
    ERROR_MESSAGE,
    AfterDrop,
    ConnectionEnd,
    TunnelDropPolicy,
    TunnelFailure,
    after_tunnel_drop,
    bad_gateway_body,
    error_writer,
    open_hub,
    serve_hub,
)
from labs.processes import open_service
from labs.worker import open_worker, parse_settings
from labs.worker.settings import Framing
from labs.worker.wire import ResponsePlan, response_plan
from tests.fixtures_lab import chat_request, client_exchange, open_proxy, request_for, run_trio
from tests.test_worker_conduct import raw_request

ROOT = Path(__file__).resolve().parent.parent
EXACT_ERROR_EVENT = (
    b'data: {"error":{"message":"agent disconnected mid-request","type":"server_error","code":"worker_disconnected"}}\n\n'
)
TERMINATOR = b"0\r\n\r\n"
HUB_LISTENING = re.compile(r"hub listening on http://127\.0\.0\.1:(\d+)/v1")
#: How long a connection must stay silent to count as kept open (never a timing assertion: only
#: "nothing more came for this long" is concluded).
QUIET_S = 0.5


PATHS = {Dialect.CHAT: "/v1/chat/completions", Dialect.MESSAGES: "/v1/messages", Dialect.RESPONSES: "/v1/responses"}


def raw_exchange_for(model: str, dialect: Dialect = Dialect.CHAT, *, close: bool = False) -> tuple[bytes, bytes, ResponsePlan]:
    """The raw request, the worker's whole healthy response and its plan, for a model name
    (`tests.fixtures_lab.request_for`, as bytes on the wire), in `dialect`; `close`: the request
    says `Connection: close`, so the hub closes after the response (read to its end, no wait)."""
    headers = {"connection": "close"} if close else None
    if dialect is Dialect.GEMINI:
        # The model (and so the settings) in the path, as a Gemini client sends it.
        body = {"model": model, "stream": True, "contents": [{"role": "user", "parts": [{"text": "hi"}]}]}
        plan = response_plan(parse_settings(model).for_request(body, dialect), dialect=dialect)
        return raw_request(dialect, body, headers=headers), plan.to_bytes(), plan
    if dialect is Dialect.CHAT:
        body, plan = request_for(parse_settings(model))
    else:
        body = {"model": model, "stream": True, "max_tokens": 100}
        body["input" if dialect is Dialect.RESPONSES else "messages"] = [{"role": "user", "content": "hi"}]
        plan = response_plan(parse_settings(model).for_request(body, dialect), dialect=dialect)
    return chat_request(body, path=PATHS[dialect], headers=headers), plan.to_bytes(), plan


def through_hub(
    policy,
    model: str,
    fault_for=None,
    toxiproxy=None,
    *,
    expect_bytes: int | None = None,
    dialect: Dialect = Dialect.CHAT,
    close: bool = False,
):
    """Send one request gateway-side to a hub in front of the real toxiproxy in front of the worker,
    with `fault_for(plan)` applied to the tunnel; returns what the gateway got and the hub's record."""
    request, _, plan = raw_exchange_for(model, dialect, close=close)

    async def scenario():
        async with open_worker() as worker, open_proxy(toxiproxy, worker.port) as tunnel:
            async with open_hub(upstream_port=tunnel.listen_port, on_tunnel_drop=policy) as hub:
                fault = fault_for(plan) if fault_for else None
                if fault is None:
                    received = await client_exchange(hub.port, request, stop_after_bytes=expect_bytes, quiet_seconds=QUIET_S)
                else:
                    async with fault.applied(toxiproxy, tunnel.name):
                        received = await client_exchange(hub.port, request, stop_after_bytes=expect_bytes, quiet_seconds=QUIET_S)
                return received, list(hub.exchanges)

    return run_trio(scenario, deadline=30)


CHUNKED = "finishline-worker;tokens=6"
CLOSE_DELIMITED = "finishline-worker;tokens=6;framing=close"


def cut_after_3(plan, *, reset=False):
    return cut_after_tokens(3, plan, reset=reset)


# -- the policy table, as data -------------------------------------------------------------------


@pytest.mark.parametrize("failure", [TunnelFailure.FIN, TunnelFailure.RESET])
def test_policy_table_mid_body(failure):
    assert after_tunnel_drop(TunnelDropPolicy.CLOSE, failure, framing=Framing.CHUNKED) == AfterDrop(
        send=TERMINATOR, end=ConnectionEnd.KEEP, action="clean_end"
    )
    assert after_tunnel_drop(TunnelDropPolicy.ERROR_EVENT, failure, framing=Framing.CHUNKED) == AfterDrop(
        send=b"%x\r\n%s\r\n" % (len(EXACT_ERROR_EVENT), EXACT_ERROR_EVENT) + TERMINATOR,
        end=ConnectionEnd.KEEP,
        action="error_event",
    )
    assert after_tunnel_drop(TunnelDropPolicy.ERROR_EVENT, failure, framing=Framing.CLOSE).send == EXACT_ERROR_EVENT
    assert after_tunnel_drop(TunnelDropPolicy.CLOSE, failure, framing=Framing.CLOSE).end is ConnectionEnd.FIN
    passed_on = after_tunnel_drop(TunnelDropPolicy.ABORT, failure, framing=Framing.CHUNKED)
    assert (passed_on.send, passed_on.end.value) == (b"", failure.value)


def test_the_error_event_is_the_issues_bytes():
    assert ERROR_EVENT == EXACT_ERROR_EVENT


@pytest.mark.parametrize("framing", [Framing.CHUNKED, Framing.CLOSE])
def test_error_event_writes_the_frames_it_is_given_for_the_requests_dialect(framing):
    frames = b"event: error\ndata: {}\n\n"
    answer = after_tunnel_drop(TunnelDropPolicy.ERROR_EVENT, TunnelFailure.FIN, framing=framing, error_frames=frames)
    chunked = b"%x\r\n%s\r\n" % (len(frames), frames) + TERMINATOR
    assert answer.send == (chunked if framing is Framing.CHUNKED else frames)
    assert answer.action == "error_event"


@pytest.mark.parametrize("dialect", [None, *LAB_DIALECTS])
def test_the_502s_body_is_in_the_requests_dialects_error_shape(dialect):
    body = bad_gateway_body(dialect)
    if dialect is Dialect.MESSAGES:
        assert body == {"type": "error", "error": {"type": "api_error", "message": BAD_GATEWAY_BODY["error"]["message"]}}
    elif dialect is Dialect.GEMINI:
        assert body == {"error": {"code": 502, "message": BAD_GATEWAY_BODY["error"]["message"], "status": "UNAVAILABLE"}}
    else:
        assert body == BAD_GATEWAY_BODY and body["error"]["code"] == "worker_unreachable"


def test_a_request_on_no_completion_route_gets_chats_error_event():
    assert error_writer(None).error_frames(ERROR_MESSAGE, code="worker_disconnected") == EXACT_ERROR_EVENT


def test_before_the_head_close_and_error_event_answer_502_and_abort_passes_the_failure_on():
    for policy in (TunnelDropPolicy.CLOSE, TunnelDropPolicy.ERROR_EVENT):
        assert after_tunnel_drop(policy, TunnelFailure.FIN, framing=None).action == "bad_gateway"
    assert after_tunnel_drop(TunnelDropPolicy.ABORT, TunnelFailure.RESET, framing=None).end is ConnectionEnd.RESET


# -- healthy responses pass byte for byte --------------------------------------------------------


@pytest.mark.parametrize(
    "model",
    [
        CHUNKED,
        CLOSE_DELIMITED,
        "finishline-worker;tokens=4;framing=content-length",
        "finishline-worker;tokens=3;connection_close=1",
        "finishline-worker;http_error=429",
    ],
)
@pytest.mark.e2e
@pytest.mark.parametrize("policy", list(TunnelDropPolicy))
def test_a_healthy_response_passes_byte_for_byte(toxiproxy, policy, model):
    _, healthy, plan = raw_exchange_for(model)
    # A response that closes is read to its end; one that keeps the connection is read until the
    # whole response is in and nothing more comes (never a timing assertion on the close itself).
    received, exchanges = through_hub(policy, model, toxiproxy=toxiproxy, expect_bytes=None if plan.closes else len(healthy))
    assert received.data == healthy
    # A response that closes (close-delimited, `Connection: close`) closes; others stay open.
    assert received.ending == ("fin" if plan.closes else "open")
    assert [(e.upstream_ending, e.action) for e in exchanges] == [("complete", "passed")]


# -- a cut mid-body, chunked ---------------------------------------------------------------------


@pytest.mark.e2e
@pytest.mark.parametrize("reset", [False, True], ids=["fin", "reset"])
def test_close_ends_a_cut_chunked_body_with_the_terminator_and_keeps_the_connection(toxiproxy, reset):
    _, healthy, plan = raw_exchange_for(CHUNKED)
    expected = healthy[: plan.offset_after_tokens(3)] + TERMINATOR
    received, exchanges = through_hub("close", CHUNKED, partial(cut_after_3, reset=reset), toxiproxy, expect_bytes=len(expected))
    assert received.data == expected
    assert received.ending == "open"  # a complete response, as the post-mortem's hub made it
    assert (exchanges[0].upstream_ending, exchanges[0].action) == ("reset" if reset else "fin", "clean_end")


@pytest.mark.e2e
@pytest.mark.parametrize("reset", [False, True], ids=["fin", "reset"])
def test_error_event_sends_the_event_as_a_chunk_then_the_terminator(toxiproxy, reset):
    _, healthy, plan = raw_exchange_for(CHUNKED)
    expected = healthy[: plan.offset_after_tokens(3)] + b"%x\r\n%s\r\n" % (len(EXACT_ERROR_EVENT), EXACT_ERROR_EVENT) + TERMINATOR
    received, _ = through_hub("error_event", CHUNKED, partial(cut_after_3, reset=reset), toxiproxy, expect_bytes=len(expected))
    assert received.data == expected
    assert received.ending == "open"


def body_events(response: bytes) -> tuple[int, list[tuple[str | None, dict]]]:
    """The status and the (`event:` name, parsed data) of each event of a whole HTTP response, its
    body read as a client reads it (h11 undoes the chunked framing)."""
    parser = h11.Connection(h11.CLIENT)
    parser.send(h11.Request(method="POST", target="/", headers=[("host", "x"), ("content-length", "0")]))
    parser.send(h11.EndOfMessage())
    parser.receive_data(response)
    status, body = 0, b""
    while not isinstance(event := parser.next_event(), h11.EndOfMessage):
        if isinstance(event, h11.Response):
            status = event.status_code
        elif isinstance(event, h11.Data):
            body += event.data
    events = EventFramer().receive_data(body)
    return status, [(e.event_type.decode() if e.event_type else None, json.loads(e.data)) for e in events if e.data]


def error_event_after_3(dialect: Dialect, reset: bool, toxiproxy):
    """Through the hub with `error_event`, a `dialect` stream whose tunnel fails (a fin, or a reset)
    after 3 tokens: the gateway gets the healthy body up to there, then the dialect's error ending,
    then the terminator. Returns the response's status and events (`body_events`) and the hub's record."""
    _, healthy, plan = raw_exchange_for(CHUNKED, dialect)
    received, exchanges = through_hub(
        "error_event", CHUNKED, partial(cut_after_3, reset=reset), toxiproxy, dialect=dialect, close=True
    )
    assert received.data.startswith(healthy[: plan.offset_after_tokens(3)]) and received.data.endswith(TERMINATOR)
    status, events = body_events(received.data)
    return status, events, exchanges


@pytest.mark.e2e
@pytest.mark.parametrize("reset", [False, True], ids=["fin", "reset"])
def test_error_event_in_messages_is_anthropics_error_event_and_nothing_after_it(toxiproxy, reset):
    status, events, exchanges = error_event_after_3(Dialect.MESSAGES, reset, toxiproxy)
    assert status == 200 and events[0][0] == "message_start"
    # Both Anthropic SDKs dispatch on the `event:` name: a data-only frame would be skipped.
    assert events[-1] == ("error", {"type": "error", "error": {"type": "api_error", "message": ERROR_MESSAGE}})
    assert [name for name, _ in events].count("message_stop") == 0
    assert exchanges[0].action == "error_event"


@pytest.mark.e2e
@pytest.mark.parametrize("reset", [False, True], ids=["fin", "reset"])
def test_error_event_in_responses_is_openais_error_then_response_failed_continuing_the_stream(toxiproxy, reset):
    status, events, exchanges = error_event_after_3(Dialect.RESPONSES, reset, toxiproxy)
    relayed, (error_name, error), (failed_name, failed) = events[:-2], events[-2], events[-1]
    assert status == 200 and (error_name, failed_name) == ("error", "response.failed")
    # openai-python raises on the nested `error`, openai-node on the event's name, the AI SDK needs
    # `sequence_number`; a changed response id makes both SDKs raise "Lifecycle response identity changed".
    assert (error["code"], error["message"], error["error"]["code"]) == (
        "worker_disconnected",
        ERROR_MESSAGE,
        "worker_disconnected",
    )
    last = relayed[-1][1]["sequence_number"]
    assert (error["sequence_number"], failed["sequence_number"]) == (last + 1, last + 2)
    assert failed["response"]["id"] == relayed[0][1]["response"]["id"]
    assert failed["response"]["status"] == "failed" and failed["response"]["error"]["message"] == ERROR_MESSAGE
    assert exchanges[0].action == "error_event"


@pytest.mark.e2e
@pytest.mark.parametrize("reset", [False, True], ids=["fin", "reset"])
def test_error_event_in_gemini_is_googles_error_frame_after_the_chunks_and_the_cell_is_the_paths(toxiproxy, reset):
    # google-genai raises on a frame that re-dumps as `{"error": ...}` (error first, a numeric code).
    status, events, exchanges = error_event_after_3(Dialect.GEMINI, reset, toxiproxy)
    assert status == 200 and [name for name, _ in events] == [None] * 4
    assert [data["candidates"][0]["content"]["parts"][0]["text"] for _, data in events[:3]] == ["The", " quick", " brown"]
    assert events[-1][1] == {"error": {"code": 503, "message": ERROR_MESSAGE, "status": "UNAVAILABLE"}}
    assert exchanges[0].action == "error_event" and exchanges[0].path.endswith(":streamGenerateContent")
    # The exchange's model is the path's (the body has none): the lab finds the cell's hub lines by it.
    assert exchanges[0].model == CHUNKED


@pytest.mark.e2e
def test_error_event_during_prefill_in_responses_is_the_two_events_alone(toxiproxy):
    # The tunnel drops after the head, before any event: no response id to continue yet.
    received, _ = through_hub("error_event", CHUNKED, cut_during_prefill, toxiproxy, dialect=Dialect.RESPONSES, close=True)
    status, events = body_events(received.data)
    assert status == 200 and [(name, data["sequence_number"]) for name, data in events] == [("error", 0), ("response.failed", 1)]


@pytest.mark.e2e
def test_before_the_head_the_502_body_is_the_dialects_error_shape(toxiproxy):
    received, _ = through_hub("error_event", CHUNKED, lambda plan: down(), toxiproxy, dialect=Dialect.MESSAGES)
    head, _, body = received.data.partition(b"\r\n\r\n")
    assert head.startswith(b"HTTP/1.1 502 ")
    assert json.loads(body) == {
        "type": "error",
        "error": {"type": "api_error", "message": "the worker's tunnel failed before a response"},
    }


@pytest.mark.e2e
@pytest.mark.parametrize("reset", [False, True], ids=["fin", "reset"])
def test_abort_passes_a_fin_as_a_fin_and_a_reset_as_a_reset(toxiproxy, reset):
    _, healthy, plan = raw_exchange_for(CHUNKED)
    received, exchanges = through_hub("abort", CHUNKED, partial(cut_after_3, reset=reset), toxiproxy)
    assert received.data == healthy[: plan.offset_after_tokens(3)]
    assert received.ending == ("reset" if reset else "fin")
    assert exchanges[0].action == ("reset" if reset else "fin")


def cut_inside_the_fourth_token_event(plan):
    # limit_data 10 bytes into the chunk after token 3: the tunnel cuts a chunk in half.
    count = plan.offset_after_tokens(3) + 10
    return Fault(
        name="cut",
        summary="mid-chunk",
        toxics=(Toxic(name="mid_chunk", type="limit_data", stream="downstream", attributes={"bytes": count}),),
    )


@pytest.mark.e2e
@pytest.mark.parametrize(("policy", "ending"), [("close", "open"), ("abort", "fin")])
def test_a_chunk_the_tunnel_cut_in_half_is_never_forwarded(toxiproxy, policy, ending):
    _, healthy, plan = raw_exchange_for(CHUNKED)
    expected = healthy[: plan.offset_after_tokens(3)] + (TERMINATOR if policy == "close" else b"")
    received, exchanges = through_hub(policy, CHUNKED, cut_inside_the_fourth_token_event, toxiproxy, expect_bytes=len(expected))
    assert (received.data, received.ending) == (expected, ending)


@pytest.mark.e2e
def test_an_http_10_request_without_host_is_relayed(toxiproxy):
    _, healthy, _ = raw_exchange_for(CHUNKED)
    request = chat_request({"model": CHUNKED, "stream": True}).replace(b"HTTP/1.1\r\nhost: 127.0.0.1\r\n", b"HTTP/1.0\r\n")

    async def scenario():
        async with open_worker() as worker, open_hub(upstream_port=worker.port) as hub:
            return await client_exchange(hub.port, request)

    received = run_trio(scenario, deadline=30)
    # The worker's response as it sent it; the hub closes after it (an HTTP/1.0 client).
    assert (received.data, received.ending) == (healthy, "fin")


@pytest.mark.e2e
def test_the_incident_a_prefill_cut_through_close_is_a_complete_empty_200(toxiproxy):
    # The post-mortem: head sent, tunnel drops during prefill, the hub ends the body cleanly.
    _, healthy, plan = raw_exchange_for(CHUNKED)
    expected = healthy[: plan.head_length] + TERMINATOR
    received, exchanges = through_hub("close", CHUNKED, cut_during_prefill, toxiproxy, expect_bytes=len(expected))
    assert received.data == expected
    parser = h11.Connection(h11.CLIENT)
    parser.send(h11.Request(method="POST", target="/", headers=[("host", "x"), ("content-length", "0")]))
    parser.send(h11.EndOfMessage())
    parser.receive_data(received.data)
    events = [parser.next_event() for _ in range(2)]
    assert events[0].status_code == 200 and isinstance(events[1], h11.EndOfMessage)
    assert exchanges[0].summary() == "tunnel fin after 0 body bytes; hub close: clean_end"


# -- a cut mid-body, close-delimited -------------------------------------------------------------


@pytest.mark.e2e
@pytest.mark.parametrize("policy", list(TunnelDropPolicy))
def test_a_fin_ends_a_close_delimited_body_for_every_policy(toxiproxy, policy):
    # HTTP cannot tell this cut from the end: a close-delimited body ends with a FIN.
    _, healthy, plan = raw_exchange_for(CLOSE_DELIMITED)
    received, exchanges = through_hub(policy, CLOSE_DELIMITED, cut_after_3, toxiproxy)
    assert received.data == healthy[: plan.offset_after_tokens(3)]
    assert received.ending == "fin"
    assert exchanges[0].upstream_ending == "complete"


@pytest.mark.e2e
@pytest.mark.parametrize(
    ("policy", "appended", "ending"),
    [("close", b"", "fin"), ("error_event", EXACT_ERROR_EVENT, "fin"), ("abort", b"", "reset")],
)
def test_a_reset_on_a_close_delimited_body(toxiproxy, policy, appended, ending):
    _, healthy, plan = raw_exchange_for(CLOSE_DELIMITED)
    received, exchanges = through_hub(policy, CLOSE_DELIMITED, partial(cut_after_3, reset=True), toxiproxy)
    assert received.data == healthy[: plan.offset_after_tokens(3)] + appended
    assert received.ending == ending
    assert exchanges[0].upstream_ending == "reset"


@pytest.mark.e2e
@pytest.mark.parametrize("policy", list(TunnelDropPolicy))
def test_a_cut_content_length_body_gets_a_fin_whatever_the_policy(toxiproxy, policy):
    # A short Content-Length body has no clean end, and appended bytes would not be read.
    model = "finishline-worker;tokens=6;framing=content-length"
    _, healthy, plan = raw_exchange_for(model)
    received, exchanges = through_hub(policy, model, cut_after_3, toxiproxy)
    assert (received.data, received.ending) == (healthy[: plan.offset_after_tokens(3)], "fin")
    assert (exchanges[0].upstream_ending, exchanges[0].action) == ("fin", "fin")


# -- before the head -----------------------------------------------------------------------------


@pytest.mark.e2e
def test_an_unreachable_tunnel_is_a_502_for_close_and_a_bare_close_for_abort(toxiproxy):
    received, exchanges = through_hub("close", CHUNKED, lambda plan: down(), toxiproxy)
    assert received.data.startswith(b"HTTP/1.1 502 Bad Gateway\r\n")
    assert b'"code":"worker_unreachable"' in received.data and received.ending == "fin"
    assert exchanges[0].upstream_ending == "unreachable"
    received, _ = through_hub("abort", CHUNKED, lambda plan: down(), toxiproxy)
    assert (received.data, received.ending) == (b"", "fin")


# -- the policy is the runner's to set -----------------------------------------------------------


@pytest.mark.e2e
def test_the_policy_can_be_changed_between_requests_and_a_bad_one_is_refused(toxiproxy):
    request, healthy, plan = raw_exchange_for(CHUNKED)

    async def scenario():
        async with open_worker() as worker, open_proxy(toxiproxy, worker.port) as tunnel:
            async with trio.open_nursery() as nursery:
                hub = await nursery.start(partial(serve_hub, upstream_port=tunnel.listen_port))
                assert hub.on_tunnel_drop is TunnelDropPolicy.CLOSE
                with pytest.raises(ValueError, match="on_tunnel_drop 'drop' is not one of close, error_event, abort"):
                    hub.on_tunnel_drop = "drop"
                hub.on_tunnel_drop = "abort"
                async with cut_after_3(plan).applied(toxiproxy, tunnel.name):
                    received = await client_exchange(hub.port, request)
                nursery.cancel_scope.cancel()
                return received, hub.exchanges

    received, exchanges = run_trio(scenario, deadline=30)
    assert received.ending == "fin" and exchanges[0].policy is TunnelDropPolicy.ABORT


# -- standalone ----------------------------------------------------------------------------------


@pytest.mark.e2e
@pytest.mark.parametrize(
    ("argv", "words"),
    [
        (["--upstream", "nowhere"], "'nowhere' is not HOST:PORT"),
        (
            ["--upstream", "127.0.0.1:1", "--on-tunnel-drop", "drop"],
            "on_tunnel_drop 'drop' is not one of close, error_event, abort",
        ),
        (["--upstream", "127.0.0.1:1", "--port", "-4"], "'-4' is not a port"),
    ],
)
def test_standalone_refuses_bad_arguments_in_one_line(argv, words):
    result = run_child([sys.executable, "-m", "labs.hub", *argv], cwd=ROOT, timeout=30)
    assert result.returncode == 2
    assert words in result.stderr
    assert len(result.stderr.strip().splitlines()) == 1


@pytest.mark.e2e
def test_standalone_hub_relays_to_its_upstream(tmp_path):
    request, healthy, _ = raw_exchange_for("finishline-worker;tokens=3;connection_close=1")

    async def scenario():
        async with open_worker() as worker:
            argv = [sys.executable, "-m", "labs.hub", "--upstream", f"127.0.0.1:{worker.port}", "--port", "0"]
            async with open_service("hub", argv, port=0, log_path=tmp_path / "hub.log", port_in_log=HUB_LISTENING) as (_, port):
                return await client_exchange(port, request)

    received = run_trio(scenario, deadline=30)
    assert received.data == healthy
    assert "on_tunnel_drop=close" in (tmp_path / "hub.log").read_text()
