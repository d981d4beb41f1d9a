"""WorkerSettings: the knobs, their header / model-name encoding, resolution, and the expected answer."""

from __future__ import annotations

import dataclasses

import pytest
from hypothesis import given
from hypothesis import strategies as st

from labs.worker.answer import expected_answer
from labs.worker.knob_help import KNOB_HELP
from labs.worker.settings import (
    DEFAULT_MODEL_NAME,
    Finish,
    Framing,
    SettingsError,
    WorkerSettings,
    parse_settings,
)

settings_values = st.builds(
    WorkerSettings,
    tokens=st.integers(0, 50),
    reasoning_tokens=st.integers(0, 5),
    tool_calls=st.integers(0, 3),
    n=st.none() | st.integers(1, 4),
    max_tokens=st.none() | st.integers(0, 60),
    include_usage=st.none() | st.booleans(),
    prefill_delay=st.floats(0, 10, allow_nan=False),
    token_delay=st.floats(0, 1, allow_nan=False),
    framing=st.sampled_from(Framing),
    connection_close=st.booleans(),
    finish=st.sampled_from(Finish),
    done=st.booleans(),
    error_after=st.none() | st.integers(0, 20),
    error_status=st.sampled_from([429, 500, 503]),
    http_error=st.none() | st.sampled_from([429, 500]),
    prompt_tokens=st.integers(0, 100),
)


@given(settings_values)
def test_header_encoding_round_trips(settings):
    assert parse_settings(settings.to_header()) == settings


@given(settings_values)
def test_model_name_encoding_round_trips(settings):
    name = settings.to_model_name()
    assert name.startswith(DEFAULT_MODEL_NAME)
    assert parse_settings(name) == settings


def test_every_knob_has_its_help_and_every_help_a_knob():
    # `python -m labs.worker --help` prints the help of every field; the table keeps the fields' order.
    assert list(KNOB_HELP) == [knob.name for knob in dataclasses.fields(WorkerSettings)]
    assert all(text.strip() for text in KNOB_HELP.values())


def test_defaults_encode_to_nothing():
    assert WorkerSettings().to_header() == ""
    assert WorkerSettings().to_model_name() == DEFAULT_MODEL_NAME


def test_header_overrides_base_and_dashes_stand_for_underscores():
    base = WorkerSettings(tokens=3, token_delay=0.5)
    settings = parse_settings("tokens=7; error-after=2; include_usage=true; finish=omitted", base=base)
    assert settings == WorkerSettings(tokens=7, token_delay=0.5, error_after=2, include_usage=True, finish=Finish.OMITTED)


def test_none_clears_an_optional_setting():
    assert parse_settings("n=none", base=WorkerSettings(n=3)).n is None


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("colour=blue", "unknown worker setting 'colour'; known settings: tokens,"),
        ("tokens=many", "worker setting tokens must be int; got 'many'"),
        ("tokens=-1", "tokens must be >= 0, got -1"),
        ("n=0", "n must be >= 1, got 0"),
        ("include_usage=maybe", "worker setting include_usage must be bool or none; got 'maybe'"),
        ("framing=gzip", "framing must be one of chunked, content-length, close; got 'gzip'"),
        ("finish=sometimes", "finish must be one of sent, omitted, empty; got 'sometimes'"),
        ("http_error=200", "http_error must be an HTTP error status 400-599, got 200"),
        ("prefill_delay=-2", "prefill_delay must be >= 0 seconds, got -2.0"),
    ],
)
def test_bad_settings_are_refused_with_a_message_that_names_them(text, message):
    with pytest.raises(SettingsError) as error:
        parse_settings(text)
    assert str(error.value).startswith(message)


def test_model_base_name_cannot_hold_separators():
    with pytest.raises(SettingsError, match="cannot contain"):
        WorkerSettings().to_model_name("a;b")


def test_for_request_fills_what_the_request_asks_and_keeps_what_is_pinned():
    body = {"model": "gpt-x", "n": 2, "max_tokens": 5, "stream_options": {"include_usage": True}}
    assert WorkerSettings().for_request(body) == WorkerSettings(n=2, max_tokens=5, include_usage=True, model="gpt-x")
    pinned = WorkerSettings(n=1, max_tokens=9, include_usage=False, model="fixed")
    assert pinned.for_request(body) == pinned


def test_for_request_prefers_max_completion_tokens_and_ignores_nonsense():
    assert WorkerSettings().for_request({"max_completion_tokens": 4, "max_tokens": 8}).max_tokens == 4
    resolved = WorkerSettings().for_request({"n": "two", "max_tokens": -1, "model": ""})
    assert (resolved.n, resolved.max_tokens, resolved.include_usage, resolved.model) == (1, None, False, DEFAULT_MODEL_NAME)


@pytest.mark.parametrize(
    "tool_choice",
    ["required", {"type": "function", "function": {"name": "get_weather"}}],
)
def test_a_request_that_forces_a_tool_call_gets_one(tool_choice):
    body = {"tools": [{"type": "function", "function": {"name": "get_weather"}}], "tool_choice": tool_choice}
    resolved = WorkerSettings().for_request(body)
    assert resolved.tool_calls == 1
    assert expected_answer(resolved).choices[0].finish_reason == "tool_calls"
    assert WorkerSettings(tool_calls=2).for_request(body).tool_calls == 2


@pytest.mark.parametrize(
    "body",
    [
        {"tools": [{"type": "function", "function": {"name": "get_weather"}}]},
        {"tools": [{"type": "function", "function": {"name": "get_weather"}}], "tool_choice": "auto"},
        {"tools": [{"type": "function", "function": {"name": "get_weather"}}], "tool_choice": "none"},
        {"tools": [], "tool_choice": "required"},
        {"tool_choice": "required"},
    ],
)
def test_tools_without_a_forced_call_or_without_tools_get_text(body):
    assert WorkerSettings().for_request(body).tool_calls == 0


def test_expected_answer_content():
    answer = expected_answer(WorkerSettings(tokens=9).for_request({}))
    (choice,) = answer.choices
    assert choice.content == "The quick brown fox jumps over the lazy dog."
    assert (choice.finish_reason, choice.completion_tokens, answer.error) == ("stop", 9, None)


def test_expected_answer_reasoning_comes_first_and_counts():
    (choice,) = expected_answer(WorkerSettings(tokens=2, reasoning_tokens=4).for_request({})).choices
    assert choice.reasoning_content == "Let me think about"
    assert choice.content == "The quick"
    assert choice.completion_tokens == 6


def test_expected_answer_tool_calls():
    (choice,) = expected_answer(WorkerSettings(tokens=0, tool_calls=2).for_request({})).choices
    assert [(t.id, t.name, t.arguments) for t in choice.tool_calls] == [
        ("call_0_0", "get_weather", '{"city": "Paris", "unit": "celsius"}'),
        ("call_0_1", "get_weather", '{"city": "Paris", "unit": "celsius"}'),
    ]
    assert choice.finish_reason == "tool_calls"


def test_expected_answer_max_tokens_truncates_with_length():
    (choice,) = expected_answer(WorkerSettings(tokens=9, reasoning_tokens=2, max_tokens=4).for_request({})).choices
    assert (choice.reasoning_content, choice.content, choice.finish_reason) == ("Let me", "The quick", "length")


def test_expected_answer_max_tokens_equal_to_the_answer_is_a_natural_stop():
    (choice,) = expected_answer(WorkerSettings(tokens=4, max_tokens=4).for_request({})).choices
    assert choice.finish_reason == "stop"


def test_expected_answer_n_choices_are_alike_but_indexed():
    answer = expected_answer(WorkerSettings(tokens=3, n=3).for_request({}))
    assert [c.index for c in answer.choices] == [0, 1, 2]
    assert {c.content for c in answer.choices} == {"The quick brown"}
    assert answer.token_events == 9


def test_expected_answer_error_after_counts_token_events_across_choices():
    answer = expected_answer(WorkerSettings(tokens=5, n=2, error_after=3).for_request({"model": "m"}))
    assert [c.content for c in answer.choices] == ["The quick", "The"]
    assert all(c.finish_reason is None for c in answer.choices)
    assert answer.error["code"] == "rate_limit_exceeded"
    assert answer.token_events == 3


def test_expected_answer_error_after_the_end_is_no_error():
    answer = expected_answer(WorkerSettings(tokens=2, error_after=2).for_request({}))
    assert answer.error is None and answer.choices[0].finish_reason == "stop"


def test_expected_answer_http_error_has_no_choices():
    answer = expected_answer(WorkerSettings(http_error=500).for_request({}))
    assert answer.choices == () and answer.error["type"] == "server_error"


def test_the_defects_do_not_change_the_true_answer():
    healthy = expected_answer(WorkerSettings(tokens=5).for_request({}))
    for finish in (Finish.OMITTED, Finish.EMPTY):
        defect = WorkerSettings(tokens=5, finish=finish, done=False).for_request({})
        assert expected_answer(defect) == healthy


def test_settings_are_frozen_slotted_and_keyword_only() -> None:  # checked: the ignores below are the point
    settings = WorkerSettings()
    with pytest.raises(dataclasses.FrozenInstanceError):
        settings.tokens = 3  # type: ignore[misc]
    with pytest.raises(TypeError):
        WorkerSettings(3)  # type: ignore[call-arg]
    assert not hasattr(settings, "__dict__")
