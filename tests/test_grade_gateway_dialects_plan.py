"""The gateway grader in the Messages and Responses dialects, without a gateway: which checks a card
of each (dialect, upstream dialect) runs and lists as not run, the titles in each dialect's words,
and rule 2's judge on streams of the two dialects (read by the core speaking them)."""

from __future__ import annotations

import pytest

from finishline import Dialect, sse_event
from labs.grade.card import Card, CheckResult, GradeError, Mark
from labs.grade.gateway_checks import BOOKS_CHECK, GATEWAY_CHECK_IDS, GATEWAY_CHECKS, CheckRun, RequestResult
from labs.grade.gateway_plan import card_check_ids, card_checks, require_dialect_clients
from labs.grade.reading import read_stream
from labs.grade.render import render_cards_markdown
from labs.outcome import Outcome

DIALECT_ONLY = ("stop-reason-null", "close-after-reasoning", "bare-error-frame", "no-finish-reason")


def test_the_chat_card_has_the_rows_it_had_before_there_were_dialects():
    assert card_check_ids(Dialect.CHAT) == tuple(c for c in GATEWAY_CHECK_IDS if c not in DIALECT_ONLY)
    assert card_checks(Dialect.CHAT)[1] == {}
    titles = {c.check: c.title_in(Dialect.CHAT) for c in card_checks(Dialect.CHAT)[0]}
    assert titles["cut-after-tokens-fin"] == "cut after tokens (FIN): an error event, no [DONE], no made-up reason"
    assert titles["reason-omitted"] == "upstream omits finish_reason: clients end with stop"
    assert titles["reason-empty"] == 'upstream sends "finish_reason": "": clients end with stop'
    assert titles["tool-calls-omitted"] == "tool call, reason omitted: clients end with tool_calls"


def test_the_messages_card_runs_the_finish_rules_in_its_words_and_says_what_it_does_not_run():
    runs, not_run = card_checks(Dialect.MESSAGES)
    titles = {c.check: c.title_in(Dialect.MESSAGES) for c in runs}
    assert titles["reason-omitted"] == "upstream omits stop_reason: clients end with end_turn"
    assert titles["length-omitted"] == "max_tokens truncation, reason omitted: clients end with max_tokens"
    assert titles["cut-after-tokens-fin"] == "cut after tokens (FIN): an error event, no message_stop, no made-up reason"
    assert {"stop-reason-null", "bare-error-frame"} <= set(titles) and "close-after-reasoning" not in titles
    # A check of another dialect only (close-after-reasoning, Responses') is not on the card at all;
    # the hub's error event is the client's dialect's (issue 25), so its check runs in every card.
    assert not_run == {}
    assert titles["cut-after-tokens-hub-error-event"] == "cut after tokens, hub sends an error event: it reaches the client"


def test_a_responses_card_runs_no_finish_rule_on_a_stream_without_a_terminal_event():
    runs, not_run = card_checks(Dialect.RESPONSES)
    assert [c.check for c in runs if c.rule == "finish reasons"] == []
    assert not_run["reason-omitted"] == (
        "from a responses worker its scenario (reason-omitted) is a stream without its end sign (a terminal event, "
        "a finishReason), a cut: the rule 2 checks cover it (in gemini: no-finish-reason)"
    )
    assert not_run["length-omitted"] == "its scenario (length-omitted) runs in chat, messages, gemini, not in responses"
    assert BOOKS_CHECK[1] in card_check_ids(Dialect.RESPONSES)


def test_a_translated_card_runs_what_means_something_in_both_dialects():
    # Responses clients, a Chat worker (LiteLLM's Chat bridge): an omitted finish_reason is the
    # defect it names again, since the Chat stream still ends with [DONE].
    runs, not_run = card_checks(Dialect.RESPONSES, Dialect.CHAT)
    assert "reason-omitted" in [c.check for c in runs]
    assert not_run["bare-error-frame"] == "its scenario (bare-error-frame) runs in messages, responses, gemini, not in chat"


def test_a_client_that_does_not_speak_the_dialect_is_refused_naming_those_that_do():
    with pytest.raises(GradeError) as refused:
        require_dialect_clients(("anthropic-python", "openai-python"), Dialect.MESSAGES, "--client")
    assert str(refused.value) == (
        "--client openai-python: speaks chat, responses, not messages; messages clients: "
        "anthropic-python, anthropic-python-helper, langchain, anthropic-node, anthropic-node-helper, ai-sdk-anthropic, pi-ai"
    )


def messages(*events: tuple[str, dict]) -> bytes:
    return b"".join(sse_event(data, event=name) for name, data in events)


MESSAGE_START = (
    "message_start",
    {
        "type": "message_start",
        "message": {
            "id": "m",
            "type": "message",
            "role": "assistant",
            "content": [],
            "model": "x",
            "stop_reason": None,
            "usage": {"input_tokens": 1, "output_tokens": 0},
        },
    },
)
BLOCK = ("content_block_start", {"type": "content_block_start", "index": 0, "content_block": {"type": "text", "text": ""}})
DELTA = ("content_block_delta", {"type": "content_block_delta", "index": 0, "delta": {"type": "text_delta", "text": "The"}})
MADE_UP_END = (
    ("content_block_stop", {"type": "content_block_stop", "index": 0}),
    ("message_delta", {"type": "message_delta", "delta": {"stop_reason": "end_turn"}, "usage": {"output_tokens": 1}}),
    ("message_stop", {"type": "message_stop"}),
)
ERROR = ("error", {"type": "error", "error": {"type": "api_error", "message": "stream was interrupted"}})


def rule_2_on(body: bytes, dialect: Dialect, client_outcome: Outcome) -> tuple[Mark, str]:
    reading = read_stream(body, status=200, ending="end", dialect=dialect)
    results = [
        RequestResult(
            client="bytes", request_id="c0001", outcome=Outcome.ERROR, why="w", reading=reading, workers={"primary": 1}
        ),
        RequestResult(client="anthropic-python", request_id="c0002", outcome=client_outcome, why="w: x", workers={"primary": 1}),
    ]
    judge = next(c.judge for c in GATEWAY_CHECKS if c.check == "cut-after-tokens-hub-close")
    return judge(CheckRun(results=results, spare=False, dialect=dialect))


def test_rule_2_fails_a_made_up_end_turn_in_the_dialects_words():
    mark, evidence = rule_2_on(messages(MESSAGE_START, BLOCK, DELTA, *MADE_UP_END), Dialect.MESSAGES, Outcome.SILENT_TRUNCATION)
    assert mark is Mark.FAIL
    assert evidence.startswith("the gateway made up stop_reason 'end_turn' and message_stop for a cut stream")


def test_rule_2_passes_an_anthropic_error_event_every_client_reports():
    assert rule_2_on(messages(MESSAGE_START, BLOCK, DELTA, ERROR), Dialect.MESSAGES, Outcome.ERROR) == (
        Mark.PASS,
        "error event: stream was interrupted; every client raised or flagged",
    )


def test_rule_2_fails_a_made_up_response_completed():
    created = {
        "type": "response.created",
        "sequence_number": 0,
        "response": {"id": "r", "object": "response", "status": "in_progress", "output": []},
    }
    delta = {
        "type": "response.output_text.delta",
        "sequence_number": 1,
        "item_id": "i",
        "output_index": 0,
        "content_index": 0,
        "delta": "The",
    }
    completed = {
        "type": "response.completed",
        "sequence_number": 2,
        "response": {"id": "r", "object": "response", "status": "completed", "output": []},
    }
    body = messages(("response.created", created), ("response.output_text.delta", delta), ("response.completed", completed))
    mark, evidence = rule_2_on(body, Dialect.RESPONSES, Outcome.SILENT_TRUNCATION)
    assert mark is Mark.FAIL
    assert evidence.startswith("the gateway made up status 'completed' and response.completed for a cut stream")


def test_a_table_of_cards_graded_in_another_dialect_has_a_dialect_column():
    def card(mark: Mark, setup: dict) -> Card:
        made = Card(kind="gateway", target="http://127.0.0.1:1/v1", setup=setup)
        made.results.append(CheckResult(rule="rule 2", check="cut-after-tokens-fin", title="t", mark=mark, evidence="e"))
        return made

    translated = {"dialect": "messages", "upstream_dialect": "chat"}
    assert render_cards_markdown({"litellm-chat-bridge": card(Mark.FAIL, translated), "x": card(Mark.PASS, translated)}) == (
        "| dialect | rule | check | litellm-chat-bridge | x |\n"
        "| --- | --- | --- | --- | --- |\n"
        "| messages from chat | rule 2 | `cut-after-tokens-fin` | fail | pass |"
    )
    # Chat's table is as it was before there were dialects.
    assert render_cards_markdown({"finish_fix": card(Mark.PASS, {})}).splitlines()[0] == "| rule | check | finish_fix |"


def test_a_coding_agent_is_no_client_of_the_graders():
    with pytest.raises(
        GradeError, match="^--client codex: not a client library the grader drives; responses clients: openai-python"
    ):
        require_dialect_clients(("codex",), Dialect.RESPONSES, "--client")
