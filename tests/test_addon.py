"""finish_fix's mitmproxy adapter, in process with mitmproxy's own test helpers: options, hooks, books."""

from __future__ import annotations

import gzip
import json
import re

import pytest
from mitmproxy import exceptions
from mitmproxy import flow as mitm_flow
from mitmproxy.test import taddons, tflow, tutils

import finishline
from finishline.addon import cut_hook
from finishline.addon.hooks import FinishFix
from finishline.addon.stream import HeadWait, stream_of
from tests.feeding import chunk, data_events, sse

HEALTHY = sse(chunk("Hel"), chunk("lo"), chunk(finish_reason="stop"), b"[DONE]")


@pytest.fixture
def addon():
    fix = FinishFix()
    with taddons.context(fix) as tctx:
        tctx.configure(fix)
        fix.tctx = tctx
        yield fix
    cut_hook.uninstall()


def make_flow(
    path="/v1/chat/completions",
    *,
    body=b'{"model": "m1", "stream": true}',
    content_type="text/event-stream",
    status=200,
    headers=(),
):
    flow = tflow.tflow(req=tutils.treq(method=b"POST", path=path.encode(), content=body))
    flow.response = tutils.tresp(status_code=status, content=None)
    flow.response.headers["content-type"] = content_type
    for name, value in headers:
        flow.response.headers[name] = value
    return flow


def stream_through(addon, flow, pieces, *, end="clean"):
    """Runs a flow the way mitmproxy does: hooks, then each body piece through the stream callable."""
    addon.requestheaders(flow)
    addon.responseheaders(flow)
    sent = []
    for piece in pieces:
        for out in _as_list(flow.response.stream(piece)):
            assert out, "the stream callable must never return b'' mid-stream"
            sent.append(out)
    if end == "clean":
        sent.extend(_as_list(flow.response.stream(b"")))
        addon.response(flow)
    return b"".join(sent)


def _as_list(result):
    return [result] if isinstance(result, bytes) else list(result)


# -- options --------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("option", "value", "message"),
    [
        ("finish_fix_on_cut", "bogus", "finish_fix_on_cut: 'bogus' is not one of error, stop, pass"),
        ("finish_fix_paths", "(", "finish_fix_paths: '(' is not a valid regex"),
        ("finish_fix_empty_to_null", "maybe", "finish_fix_empty_to_null: 'maybe' is not one of true, false"),
        ("finish_fix_limit_reasons", "maybe", "finish_fix_limit_reasons: 'maybe' is not one of true, false"),
        ("finish_fix_responses_indexes", "2", "finish_fix_responses_indexes: '2' is not one of true, false"),
        ("finish_fix_responses_fields", "maybe", "finish_fix_responses_fields: 'maybe' is not one of true, false"),
        ("finish_fix_body_copy", "lots", "finish_fix_body_copy: 'lots' is not a size; use a number of bytes or e.g. 512KB"),
        ("finish_fix_ledger", "/nonexistent-dir/ledger.jsonl", "finish_fix_ledger: cannot append to"),
        ("finish_fix_idle_timeout", "soon", "finish_fix_idle_timeout: 'soon' is not a number of seconds >= 0 (0 = no limit)"),
        ("finish_fix_first_token_timeout", "-1", "finish_fix_first_token_timeout: '-1' is not a number of seconds >= 0"),
        ("finish_fix_idle_timeout", "inf", "finish_fix_idle_timeout: 'inf' is not a number of seconds >= 0"),
        (
            "finish_fix_metrics",
            "9464",
            "finish_fix_metrics: '9464' is not HOST:PORT, e.g. 127.0.0.1:9464 or [::1]:9464 (empty = off)",
        ),
        ("finish_fix_metrics", "127.0.0.1:99999", "finish_fix_metrics: '127.0.0.1:99999' is not HOST:PORT"),
        ("finish_fix_metrics", "localhost:http", "finish_fix_metrics: 'localhost:http' is not HOST:PORT"),
        (
            "finish_fix_otlp",
            "127.0.0.1:4318",
            "finish_fix_otlp: '127.0.0.1:4318' is not an http(s) URL, e.g. http://127.0.0.1:4318/v1/traces (empty = off)",
        ),
        ("finish_fix_otlp", "grpc://127.0.0.1:4317", "finish_fix_otlp: 'grpc://127.0.0.1:4317' is not an http(s) URL"),
        (
            "finish_fix_otlp",
            "http://127.0.0.1:port/v1/traces",
            "finish_fix_otlp: 'http://127.0.0.1:port/v1/traces' is not an http(s) URL",
        ),
    ],
)
def test_bad_option_is_refused_naming_the_option(addon, option, value, message):
    with pytest.raises(exceptions.OptionsError, match="^" + re.escape(message)):
        addon.tctx.configure(addon, **{option: value})


def test_every_option_has_help_and_the_prefix(addon):
    ours = [name for name in addon.tctx.options.keys() if name.startswith("finish_fix")]
    assert sorted(ours) == sorted(
        [
            "finish_fix_paths",
            "finish_fix_gemini_paths",
            "finish_fix_limit_reasons",
            "finish_fix_responses_indexes",
            "finish_fix_responses_fields",
            "finish_fix_messages_paths",
            "finish_fix_responses_paths",
            "finish_fix_on_cut",
            "finish_fix_empty_to_null",
            "finish_fix_ledger",
            "finish_fix_body_copy",
            "finish_fix_idle_timeout",
            "finish_fix_first_token_timeout",
            "finish_fix_metrics",
            "finish_fix_otlp",
        ]
    )
    for name in ours:
        assert len(dict(addon.tctx.options.items())[name].help) > 40


# -- scope ------------------------------------------------------------------------------------


@pytest.mark.parametrize("path", ["/v1/chat/completions", "/ai-gateway/mlflow/v1/chat/completions", "/v1/chat/completions?x=1"])
def test_in_scope_asks_upstream_for_identity_and_repairs(addon, path):
    flow = make_flow(path)
    flow.request.headers["accept-encoding"] = "gzip, br"
    out = stream_through(addon, flow, [sse(chunk("x"), b"[DONE]")])
    assert flow.request.headers["accept-encoding"] == "identity"
    assert [c["finish_reason"] for e in data_events(out) if isinstance(e, dict) for c in e["choices"]] == [None, "stop"]


def test_other_event_streams_are_streamed_untouched(addon):
    flow = make_flow("/v1/completions")
    flow.request.headers["accept-encoding"] = "gzip"
    addon.requestheaders(flow)
    addon.responseheaders(flow)
    assert flow.request.headers["accept-encoding"] == "gzip"
    assert flow.response.stream is True
    addon.response(flow)
    assert "finish_fix" not in flow.metadata


def test_a_path_option_changed_while_running_applies_to_a_path_already_seen(addon):
    # `_dialect_of` remembers each path's dialect; a new path option must not be hidden by that.
    flow = make_flow("/v1/completions")
    addon.requestheaders(flow)
    addon.responseheaders(flow)
    assert flow.response.stream is True  # out of scope: streamed untouched
    addon.tctx.configure(addon, finish_fix_paths=r"/v1/(chat/)?completions$")
    flow = make_flow("/v1/completions")
    addon.requestheaders(flow)
    assert flow.request.headers["accept-encoding"] == "identity"
    addon.tctx.configure(addon, finish_fix_paths=r"/v1/chat/completions$")
    flow = make_flow("/v1/completions")
    flow.request.headers["accept-encoding"] = "gzip"
    addon.requestheaders(flow)
    assert flow.request.headers["accept-encoding"] == "gzip"


def test_many_paths_keep_their_dialects(addon):
    # Past the bound of remembered paths the memory starts over, and every answer stays right.
    for index in range(2_100):
        path = f"/p{index}/v1/chat/completions" if index % 2 else f"/other/{index}"
        flow = make_flow(path)
        flow.request.headers["accept-encoding"] = "gzip"
        addon.requestheaders(flow)
        assert flow.request.headers["accept-encoding"] == ("identity" if index % 2 else "gzip"), path


def test_non_sse_is_not_streamed(addon):
    flow = make_flow(content_type="application/json")
    addon.responseheaders(flow)
    assert not flow.response.stream


# -- books ------------------------------------------------------------------------------------


def test_clean_stream_books(addon):
    flow = make_flow()
    assert stream_through(addon, flow, [HEALTHY[:50], HEALTHY[50:]]) == HEALTHY
    record = flow.metadata["finish_fix"]
    assert record["verdict"] == "clean"
    assert not flow.marked and not flow.comment
    assert flow.response.raw_content == HEALTHY  # the copy mitmweb shows
    json.dumps(record)


def test_repaired_stream_is_marked_and_commented(addon):
    flow = make_flow()
    stream_through(addon, flow, [sse(chunk("x"), b"[DONE]")])
    assert flow.metadata["finish_fix"]["verdict"] == "repaired"
    assert flow.marked == ":wrench:"
    assert flow.comment == "finish_fix: repaired: injected finish_reason 'stop' for choice 0 before [DONE]"


def test_malformed_stream_passes_byte_for_byte_and_is_marked_and_commented(addon):
    upstream = sse(chunk("Hel"), b"not json", chunk(finish_reason="stop"), b"[DONE]")
    flow = make_flow()
    assert stream_through(addon, flow, [upstream[:30], upstream[30:]]) == upstream
    record = flow.metadata["finish_fix"]
    assert record["verdict"] == "malformed"
    assert record["first_malformed_event"] == 2
    assert flow.marked == ":x:"
    assert flow.comment == "finish_fix: malformed: event 2's data is not JSON; passed on as it came"


def test_cut_through_the_hook_sends_an_error_event_and_books_it(addon):
    flow = make_flow()
    sent = stream_through(addon, flow, [sse(chunk("x")) + b'data: {"par'], end="cut")
    action = stream_of(flow).on_upstream_failure("peer closed connection without sending complete message body")
    assert action.end_response is True
    assert data_events(action.client_bytes)[0]["error"]["code"] == "stream_interrupted"
    flow.error = flow.error or mitm_flow.Error("peer closed connection")
    addon.error(flow)
    record = flow.metadata["finish_fix"]
    assert record["verdict"] == "interrupted"
    assert record["interruption"] == {
        "before_first_token": False,
        "cause": "transport_error",
        "reason": "peer closed connection without sending complete message body",
        "how": "transport error: peer closed connection without sending complete message body",
    }
    assert flow.marked == ":warning:"
    assert flow.response.raw_content == sent + action.client_bytes


def test_cut_with_pass_lets_mitmproxy_close_as_usual(addon):
    addon.tctx.configure(addon, finish_fix_on_cut="pass")
    flow = make_flow()
    stream_through(addon, flow, [sse(chunk("x")) + b"data: {"], end="cut")
    action = stream_of(flow).on_upstream_failure("reset")
    assert action == finishline.ClientEnding(b"data: {", end_response=False)


def test_a_stall_found_by_the_timer_sends_an_error_event_and_books_it(addon):
    addon.tctx.configure(addon, finish_fix_idle_timeout="2", finish_fix_first_token_timeout="0")
    flow = make_flow()
    sent = stream_through(addon, flow, [sse(chunk("x"), chunk("y"))], end="cut")
    stream = stream_of(flow)
    last_event = stream.repair._last_event_at
    assert stream.next_stall_check(last_event) == last_event + 2
    assert stream.on_timer(last_event + 1.9) is None
    ending = stream.on_timer(last_event + 2)
    assert ending.end_response is True
    assert "no event for 2 s after 2 events" in data_events(ending.client_bytes)[0]["error"]["message"]
    assert stream.on_timer(last_event + 3) is None  # the stream is over: nothing more
    flow.error = mitm_flow.Error(cut_hook.STALL_MESSAGE)
    addon.error(flow)
    record = flow.metadata["finish_fix"]
    assert record["verdict"] == "interrupted" and record["interruption"]["cause"] == "stalled"
    assert flow.response.raw_content == sent + ending.client_bytes


def test_the_head_timer_looks_again_within_one_idle_timeout_so_that_it_can_be_the_first_stall_check(addon):
    # The cut hook lets a pending head timer that is due no later than the stream's first stall
    # check be that check (one mitmproxy timer per short stream): so the head watch asks to be
    # looked at within one idle timeout, while its deadline stays the first-token timeout's.
    addon.tctx.configure(addon, finish_fix_first_token_timeout="10", finish_fix_idle_timeout="3")
    flow = make_flow("/v1/responses", body=b'{"model": "m1", "stream": true}')
    addon.requestheaders(flow)
    addon.request(flow)
    watch = cut_hook.head_watch_of(flow)
    watch.sent_at = 100.0
    assert watch.next_head_check(100.0) == 103.0
    assert watch.on_head_timer(103.0) is None  # looked, not due: the hook asks again
    assert watch.next_head_check(103.0) == 106.0
    assert watch.next_head_check(108.5) == 110.0  # never past the deadline
    assert watch.on_head_timer(110.0).status_code == 504
    # Another request whose head came at 101: its stream's first stall check is at 104 (one idle
    # timeout), after its head timer's 103, which the hook then takes as that check.
    flow = make_flow("/v1/responses", body=b'{"model": "m1", "stream": true}')
    addon.requestheaders(flow)
    addon.request(flow)
    watch = cut_hook.head_watch_of(flow)
    watch.sent_at = 100.0
    flow.response = tutils.tresp(headers=[(b"content-type", b"text/event-stream")], content=b"")
    addon.responseheaders(flow)
    assert stream_of(flow).next_stall_check(101.0) == 104.0 >= watch.next_head_check(100.0)


def test_a_streaming_request_in_scope_waits_for_its_head_under_the_first_token_deadline(addon):
    addon.tctx.configure(addon, finish_fix_first_token_timeout="2")
    flow = make_flow("/v1/messages", body=b'{"model": "m1", "stream": true}')
    addon.requestheaders(flow)
    addon.request(flow)
    watch = cut_hook.head_watch_of(flow)
    assert isinstance(watch, HeadWait) and watch.dialect is finishline.Dialect.MESSAGES
    assert watch.next_head_check(0.0) is None  # not sent yet: the hook sets `sent_at` when it is
    watch.sent_at = 10.0
    assert watch.next_head_check(10.0) == 12.0
    assert watch.on_head_timer(11.9) is None
    answer = watch.on_head_timer(12.0)
    assert answer.status_code == 504 and answer.headers["content-type"] == "application/json"
    assert json.loads(answer.content)["error"]["type"] == "timeout_error"
    # What the cut hook does next: the flow carries the answer and its error, and the books close.
    flow.response, flow.error = answer, mitm_flow.Error(cut_hook.NO_HEAD_MESSAGE)
    addon.error(flow)
    record = flow.metadata["finish_fix"]
    assert record["verdict"] == "interrupted" and record["dialect"] == "messages"
    assert (
        record["detail"] == "interrupted before the response head (no response head within 2 s of the request); answered HTTP 504"
    )
    assert flow.marked == ":warning:" and flow.comment == "finish_fix: " + record["detail"]


@pytest.mark.parametrize(
    ("path", "body", "options"),
    [
        ("/v1/chat/completions", b'{"model": "m1", "stream": false}', {}),
        ("/v1/chat/completions", b'{"model": "m1"}', {}),
        ("/v1/embeddings", b'{"model": "m1", "stream": true}', {}),
        ("/v1/chat/completions", b'{"model": "m1", "stream": true}', {"finish_fix_first_token_timeout": "0"}),
    ],
    ids=["stream-false", "no-stream-key", "out-of-scope", "deadline-off"],
)
def test_requests_the_first_token_deadline_does_not_govern_get_no_head_watch(addon, path, body, options):
    addon.tctx.configure(addon, **options)
    flow = make_flow(path, body=body)
    addon.requestheaders(flow)
    addon.request(flow)
    assert cut_hook.head_watch_of(flow) is None


def test_a_head_that_came_keeps_the_first_token_deadline_counting_from_the_request(addon):
    addon.tctx.configure(addon, finish_fix_first_token_timeout="5", finish_fix_idle_timeout="0")
    flow = make_flow()
    addon.requestheaders(flow)
    addon.request(flow)
    cut_hook.head_watch_of(flow).sent_at = sent_at = flow.request.timestamp_start + 1
    addon.responseheaders(flow)
    stream = stream_of(flow)
    assert stream.next_stall_check(sent_at + 3) == sent_at + 5
    assert stream.repair.request.model == "m1"


def test_the_stall_deadlines_default_to_what_a_careful_operator_accepts(addon):
    assert (addon.policy.idle_timeout, addon.policy.first_token_timeout) == (120, 600)
    addon.tctx.configure(addon, finish_fix_idle_timeout="0", finish_fix_first_token_timeout="2.5")
    assert (addon.policy.idle_timeout, addon.policy.first_token_timeout) == (0, 2.5)


def test_client_going_away_is_booked_without_sending_anything(addon):
    flow = make_flow()
    stream_through(addon, flow, [sse(chunk("x"))], end="cut")
    flow.error = mitm_flow.Error("Client disconnected.")
    addon.error(flow)
    record = flow.metadata["finish_fix"]
    assert record["verdict"] == "interrupted"
    assert record["interruption"]["how"] == "client gone: Client disconnected."
    assert record["injected"] == []


def test_http_error_is_booked_and_passed(addon):
    flow = make_flow(status=429)
    body = sse({"error": {"message": "slow down"}})
    assert stream_through(addon, flow, [body]) == body
    assert flow.metadata["finish_fix"]["verdict"] == "http_error"


def test_compressed_stream_is_skipped_untouched(addon):
    flow = make_flow(headers=[("content-encoding", "gzip")])
    body = gzip.compress(sse(chunk("x"), b"[DONE]"))
    assert stream_through(addon, flow, [body]) == body
    record = flow.metadata["finish_fix"]
    assert record["verdict"] == "skipped" and "compressed body (gzip)" in record["detail"]


def test_internal_error_passes_the_rest_through_exactly_and_logs_once(addon, monkeypatch, caplog):
    flow = make_flow()
    addon.requestheaders(flow)
    addon.responseheaders(flow)
    first = flow.response.stream(b'data: {"choices": [{"index": 0, "delta": {"content": "a"}}]}\n\ndata: {"ha')
    repair = flow.response.stream.repair

    def broken(event, now):
        raise RuntimeError("bug")

    monkeypatch.setattr(repair, "_on_event", broken)
    second = flow.response.stream(b'lf": 1}\n\n')
    third = flow.response.stream(b"data: [DONE]\n\n")
    assert b"".join(first + second + third) == (
        b'data: {"choices": [{"index": 0, "delta": {"content": "a"}}]}\n\ndata: {"half": 1}\n\ndata: [DONE]\n\n'
    )
    flow.response.stream(b"")
    addon.response(flow)
    record = flow.metadata["finish_fix"]
    assert record["verdict"] == "skipped" and "internal error (RuntimeError: bug)" in record["detail"]
    assert sum("internal error" in r.message for r in caplog.records) == 1


def test_a_misuse_the_adapter_catches_drops_no_held_byte(addon, monkeypatch):
    # Rule C11 holds Chat's finish for the usage chunk after it; if the adapter then catches a misuse
    # of the machine, the held finish goes out before the piece, as it came.
    flow = make_flow(body=b'{"model": "m1", "stream": true, "max_tokens": 4, "stream_options": {"include_usage": true}}')
    addon.requestheaders(flow)
    addon.responseheaders(flow)
    head = sse(chunk("a"), chunk(finish_reason="stop"))
    sent = _as_list(flow.response.stream(head))
    assert b"".join(sent) == sse(chunk("a")), "the finish waits for its usage chunk"

    def misused(data, now):
        raise RuntimeError("misuse")

    monkeypatch.setattr(flow.response.stream.repair, "receive_data", misused)
    rest = sse(b"[DONE]")
    sent += _as_list(flow.response.stream(rest))
    assert b"".join(sent) == head + rest
    # The books count the piece that met the misuse too, as received and as sent.
    flow.response.stream(b"")
    addon.response(flow)
    record = flow.metadata["finish_fix"]
    assert (record["upstream_bytes"], record["client_bytes"]) == (len(head + rest), len(head + rest))


def test_a_flow_streaming_across_a_hot_reload_is_still_repaired_and_booked(tmp_path):
    old, new = FinishFix(), FinishFix()
    ledger = tmp_path / "ledger.jsonl"
    with taddons.context(new) as tctx:
        tctx.configure(new, finish_fix_ledger=str(ledger))
        flow = make_flow()
        old.requestheaders(flow)
        old.responseheaders(flow)
        sent = flow.response.stream(sse(chunk("x")))
        old.done()  # the reload: the old instance goes, the new one installs the hook
        new.running()
        action = stream_of(flow).on_upstream_failure("reset")
        flow.error = mitm_flow.Error("reset")
        new.error(flow)
    cut_hook.uninstall()
    assert sent and data_events(action.client_bytes)[0]["error"]["code"] == "stream_interrupted"
    assert json.loads(ledger.read_text())["verdict"] == "interrupted"


def test_an_empty_event_stream_body_is_a_cut_before_the_first_token(addon):
    flow = make_flow(headers=[("content-length", "0")])
    addon.requestheaders(flow)
    addon.responseheaders(flow)
    flow.response.content = b""
    addon.response(flow)  # mitmproxy does not stream an empty body: only this hook runs
    assert data_events(flow.response.content)[0]["error"]["code"] == "stream_interrupted"
    assert flow.metadata["finish_fix"]["interruption"]["before_first_token"] is True


def test_non_chat_json_is_skipped_not_clean(addon):
    flow = make_flow(content_type="application/json")
    flow.request.method = "GET"
    flow.response.content = b'{"object": "list", "data": []}'
    addon.responseheaders(flow)
    addon.response(flow)
    assert flow.metadata["finish_fix"]["verdict"] == "skipped"


def test_compressed_json_is_passed_through(addon):
    flow = make_flow(content_type="application/json", headers=[("content-encoding", "gzip")])
    body = gzip.compress(b'{"object": "chat.completion", "choices": [{"index": 0, "message": {}}]}')
    flow.response.raw_content = body
    addon.responseheaders(flow)
    addon.response(flow)
    assert flow.response.raw_content == body
    assert flow.metadata["finish_fix"]["verdict"] == "skipped"


def test_a_failing_ledger_disk_does_not_break_flows(addon, tmp_path, caplog):
    addon.tctx.configure(addon, finish_fix_ledger=str(tmp_path / "ledger.jsonl"))
    addon.ledger._file.close()  # writes now fail as on a full or vanished disk
    for _ in range(2):
        flow = make_flow()
        stream_through(addon, flow, [HEALTHY])
        assert flow.metadata["finish_fix"]["verdict"] == "clean"
    assert sum("cannot write the ledger" in r.message for r in caplog.records) == 1


def test_ledger_lines_have_no_headers_keys_or_content(addon, tmp_path):
    ledger = tmp_path / "ledger.jsonl"
    addon.tctx.configure(addon, finish_fix_ledger=str(ledger))
    flow = make_flow("/v1/chat/completions?api_key=secret")
    flow.request.headers["authorization"] = "Bearer sk-secret"
    stream_through(addon, flow, [sse(chunk("very private words"), b"[DONE]")])
    addon.done()
    (line,) = ledger.read_text().splitlines()
    record = json.loads(line)
    assert record["verdict"] == "repaired" and record["method"] == "POST" and record["status"] == 200
    assert record["url"].endswith("/v1/chat/completions") and record["model"] == "m1"
    assert record["events"] == 2 and record["injected"] == [{"kind": "finish", "choice": 0, "finish_reason": "stop"}]
    assert {"time", "client_bytes", "upstream_bytes", "time_to_first_event", "duration"} <= set(record)
    for secret in ("secret", "private", "Bearer", "authorization"):
        assert secret not in line


def test_shutdown_logs_a_summary(addon, caplog):
    for body in (HEALTHY, sse(chunk("x"), b"[DONE]")):
        stream_through(addon, make_flow(), [body])
    caplog.set_level("INFO")
    addon.done()
    assert "finish_fix: 2 flows in scope: 1 clean, 1 repaired" in caplog.text


def test_body_copy_keeps_start_and_end(addon):
    addon.tctx.configure(addon, finish_fix_body_copy="1KB")
    events = [chunk(f"token {i}") for i in range(100)]
    flow = make_flow()
    stream_through(addon, flow, [sse(*events, chunk(finish_reason="stop"), b"[DONE]")])
    copy = flow.response.raw_content
    assert len(copy) < 1200 and b"token 0" in copy and copy.endswith(b"data: [DONE]\n\n")
    assert b"bytes of this stream are not kept here" in copy


# -- rule C9: non-streaming --------------------------------------------------------------------


def test_rule_9_non_streaming_completion_gets_a_reason(addon):
    body = json.dumps(
        {
            "object": "chat.completion",
            "choices": [{"index": 0, "message": {"role": "assistant", "content": "hi"}}],
            "usage": {"completion_tokens": 4},
        }
    ).encode()
    flow = make_flow(body=b'{"max_tokens": 4}', content_type="application/json")
    flow.response.content = body
    addon.requestheaders(flow)
    addon.responseheaders(flow)
    addon.response(flow)
    assert json.loads(flow.response.content)["choices"][0]["finish_reason"] == "length"
    assert flow.metadata["finish_fix"]["verdict"] == "repaired"


def test_limit_reasons_book_the_rule_in_the_comment_and_the_mark(addon):
    body = b'{"object":"response","status":"completed","incomplete_details":null,"usage":{"output_tokens":8}}'
    flow = make_flow("/v1/responses", body=b'{"max_output_tokens": 8}', content_type="application/json")
    flow.response.content = body
    addon.requestheaders(flow)
    addon.responseheaders(flow)
    addon.response(flow)
    assert json.loads(flow.response.content)["status"] == "incomplete"
    assert flow.comment == (
        "finish_fix: repaired: limit reason (R6): 'completed' at 8 output tokens of the request's 8 sent as 'incomplete'"
    )
    assert flow.marked == ":wrench:"
    assert addon.policy.limit_reasons is True
    addon.tctx.configure(addon, finish_fix_limit_reasons="off")
    assert addon.policy.limit_reasons is False and addon.policy.responses_indexes is True
    flow = make_flow("/v1/responses", body=b'{"max_output_tokens": 8}', content_type="application/json")
    flow.response.content = body
    addon.requestheaders(flow)
    addon.responseheaders(flow)
    addon.response(flow)
    assert flow.response.content == body and flow.metadata["finish_fix"]["verdict"] == "clean"


def test_rule_9_finished_completion_is_left_as_sent(addon):
    body = b'{"object": "chat.completion", "choices": [{"index": 0, "message": {"content": "hi"}, "finish_reason": "stop"}]}'
    flow = make_flow(content_type="application/json")
    flow.response.content = body
    addon.responseheaders(flow)
    addon.response(flow)
    assert flow.response.content == body
    assert flow.metadata["finish_fix"]["verdict"] == "clean"


@pytest.mark.parametrize("content_type", ["text/event-stream", "application/json"])
def test_the_request_body_is_parsed_once_per_flow(addon, monkeypatch, content_type):
    # The body of a long prompt is large: the facts are read once and travel with the flow's
    # state (the stream's repair, or rule C9's record) into the books.
    parsed = []
    from_body = finishline.RequestFacts.from_body.__func__

    def counting_from_body(cls, body, **facts):
        parsed.append(body)
        return from_body(cls, body, **facts)

    monkeypatch.setattr(finishline.RequestFacts, "from_body", classmethod(counting_from_body))
    flow = make_flow(body=b'{"model": "asked-for", "stream": true}', content_type=content_type)
    if content_type == "application/json":
        flow.response.content = b'{"object": "chat.completion", "choices": [{"index": 0, "message": {"content": "hi"}}]}'
        addon.requestheaders(flow)
        addon.responseheaders(flow)
        addon.response(flow)
    else:
        stream_through(addon, flow, [sse(chunk("x", model=None), b"[DONE]")])
    assert len(parsed) == 1, parsed
    assert flow.metadata["finish_fix"]["model"] == "asked-for"


def test_content_length_is_dropped_so_the_repair_fits(addon):
    flow = make_flow(headers=[("content-length", "123")])
    addon.responseheaders(flow)
    assert "content-length" not in flow.response.headers
    assert flow.response.headers["transfer-encoding"] == "chunked"


def test_passthrough_keeps_content_length(addon):
    flow = make_flow(status=500, headers=[("content-length", "123")])
    addon.responseheaders(flow)
    assert flow.response.headers["content-length"] == "123"


@pytest.mark.parametrize(
    ("message", "verdict"),
    [("Client disconnected.", "skipped"), ("Server connection to example.com failed: Connection refused", "http_error")],
)
def test_no_response_at_all(addon, message, verdict):
    flow = make_flow()
    flow.response = None
    flow.error = mitm_flow.Error(message)
    addon.error(flow)
    assert flow.metadata["finish_fix"]["verdict"] == verdict
