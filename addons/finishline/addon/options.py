"""finish_fix's options: declared with their help texts (mitmproxy's `load`), and their values read
into what the addon uses (`configure`), each bad value refused with one line naming the option.

mitmproxy's `--set` parses a script's bool and float options silently wrong (an unparsable value is
ignored), so the booleans and the seconds are `str` options read here.
"""

from __future__ import annotations

import re
from typing import Any

from mitmproxy import exceptions
from mitmproxy.addonmanager import Loader

from finishline import Dialect, NumberRefused, OnCut, RepairPolicy, read_number

__all__ = [
    "DEFAULT_FIRST_TOKEN_TIMEOUT",
    "DEFAULT_IDLE_TIMEOUT",
    "PATH_OPTIONS",
    "POLICY_OPTIONS",
    "declare_options",
    "path_regex",
    "read_policy",
]

DEFAULT_PATHS = r"(^|/)chat/completions/?$"
DEFAULT_MESSAGES_PATHS = r"(^|/)messages/?$"
DEFAULT_RESPONSES_PATHS = r"(^|/)responses/?$"
# Every client and gateway puts its own prefix before the model (`/v1/models/…`, `/v1beta/…`,
# Vertex's `/v1beta1/projects/…`, LiteLLM's `/models/…` and `/gemini/…`, Code Assist's
# `/v1internal`): only the method suffix is common to them all.
DEFAULT_GEMINI_PATHS = r":(streamGenerateContent|generateContent)$"
# Each dialect's path option and its default, in the order a path is tried against them.
PATH_OPTIONS = {
    Dialect.CHAT: ("finish_fix_paths", DEFAULT_PATHS),
    Dialect.MESSAGES: ("finish_fix_messages_paths", DEFAULT_MESSAGES_PATHS),
    Dialect.RESPONSES: ("finish_fix_responses_paths", DEFAULT_RESPONSES_PATHS),
    Dialect.GEMINI: ("finish_fix_gemini_paths", DEFAULT_GEMINI_PATHS),
}
BOOLEANS = {"true": True, "false": False, "yes": True, "no": False, "on": True, "off": False, "1": True, "0": False}
# Stall deadlines, in seconds (docs/options.md "Why the deadlines' defaults" says why these values).
DEFAULT_IDLE_TIMEOUT = "120"
DEFAULT_FIRST_TOKEN_TIMEOUT = "600"
# The options `read_policy` reads: a change to any of them makes a new policy.
POLICY_OPTIONS = {
    "finish_fix_on_cut",
    "finish_fix_empty_to_null",
    "finish_fix_idle_timeout",
    "finish_fix_first_token_timeout",
    "finish_fix_limit_reasons",
    "finish_fix_responses_indexes",
    "finish_fix_responses_fields",
}


def declare_options(loader: Loader) -> None:
    """Every option of finish_fix, in the order docs/options.md lists them."""
    _declare_paths(loader)
    _declare_repairs(loader)
    _declare_books(loader)
    _declare_deadlines(loader)
    _declare_telemetry(loader)


def _declare_paths(loader: Loader) -> None:
    """Which requests are in scope, per dialect."""
    loader.add_option(
        "finish_fix_paths",
        str,
        DEFAULT_PATHS,
        "Regex (Python syntax, searched in the request path without the query) selecting the "
        "requests whose responses finish_fix repairs as Chat Completions. The default matches any "
        "path ending in chat/completions, e.g. /v1/chat/completions. Empty: Chat is off.",
    )
    loader.add_option(
        "finish_fix_messages_paths",
        str,
        DEFAULT_MESSAGES_PATHS,
        "Regex searched in the request path selecting the requests repaired as Anthropic "
        "Messages. The default matches any path ending in messages, e.g. /v1/messages or "
        "/anthropic/v1/messages, but not /v1/messages/count_tokens. Empty: Messages is off.",
    )
    loader.add_option(
        "finish_fix_responses_paths",
        str,
        DEFAULT_RESPONSES_PATHS,
        "Regex searched in the request path selecting the requests repaired as OpenAI "
        "Responses. The default matches any path ending in responses, e.g. /v1/responses. "
        "Empty: Responses is off.",
    )
    loader.add_option(
        "finish_fix_gemini_paths",
        str,
        DEFAULT_GEMINI_PATHS,
        "Regex searched in the request path (without the query, so ?alt=sse does not matter) "
        "selecting the requests repaired as Google Gemini: streams (SSE, or the JSON array "
        "without alt=sse) and whole :generateContent bodies. The default matches any path ending "
        "in :streamGenerateContent or :generateContent, e.g. "
        "/v1beta/models/gemini-2.5-flash:streamGenerateContent. Empty: Gemini is off.",
    )


def _declare_repairs(loader: Loader) -> None:
    """What a repair may change: a cut's ending, and the corrections each can be turned off."""
    loader.add_option(
        "finish_fix_on_cut",
        str,
        "error",
        "What the client gets when the upstream stops before the stream finished. "
        "'error': an SSE error event (code stream_interrupted), then the end of the response; "
        "the client raises. 'stop': finishing events and [DONE]; the client sees a success, "
        "which is a lie about an incomplete answer; use only for clients that cannot handle "
        "errors. 'pass': change nothing, only record it.",
        choices=[policy.value for policy in OnCut],
    )
    loader.add_option(
        # A str, not a bool: mitmproxy silently ignores a --set value that does not parse for a
        # script's bool option, so a typo would go unnoticed. Validated in `configure`.
        "finish_fix_empty_to_null",
        str,
        "true",
        'Rewrite "finish_reason": "" to null in stream chunks (true or false; clients that test '
        'the value, not its truthiness, take "" as a real finish reason).',
        choices=sorted(BOOLEANS),
    )
    loader.add_option(
        "finish_fix_limit_reasons",
        str,
        "true",
        "Correct a finish reason that hides the request's token limit (true or false): with the "
        "output tokens at or past max_tokens / max_completion_tokens / max_output_tokens, Chat "
        "'stop' becomes 'length' (when usage is in the stream or body), Messages 'end_turn' "
        "becomes 'max_tokens' (and 'end_turn' with a stop_sequence becomes 'stop_sequence'), and "
        "a Responses 'response.completed' becomes 'response.incomplete' with incomplete_details "
        "reason max_output_tokens (llama.cpp and Ollama never say incomplete). Streams and whole "
        "bodies; a request without a limit is never touched.",
        choices=sorted(BOOLEANS),
    )
    loader.add_option(
        "finish_fix_responses_indexes",
        str,
        "true",
        "Fill in the sequence_number, output_index and content_index a Responses event lacks "
        "(true or false), from the stream's own order: llama.cpp sends none, and openai-python's "
        "responses.stream() helper then fails. A value the server sent is never changed.",
        choices=sorted(BOOLEANS),
    )
    loader.add_option(
        "finish_fix_responses_fields",
        str,
        "true",
        "Fill in the created_at and model a Responses response.created or response.in_progress "
        "lacks (true or false), from the request: its model, and the time it was sent. llama.cpp "
        "sends neither there, and the AI SDK then fails the whole stream. A value the server sent "
        "is never changed.",
        choices=sorted(BOOLEANS),
    )


def _declare_books(loader: Loader) -> None:
    """The books kept on disk and in mitmweb: the ledger and the copy of what a client was sent."""
    loader.add_option(
        "finish_fix_ledger",
        str,
        "",
        "Append one JSON line per flow in scope to this file: time, method, URL without query, "
        "status, model, dialect (chat, messages or responses), verdict, events, bytes, time to "
        "first event, duration, injections. "
        "Never headers, keys or message content. Empty: no ledger.",
    )
    loader.add_option(
        "finish_fix_body_copy",
        str,
        "4MB",
        "Keep up to this much of each repaired stream, as sent to the client, so mitmweb can "
        "show it (streamed bodies are otherwise 'content missing'); longer streams keep their "
        "start and end. A size like 4MB, 512KB or 1048576; 0 keeps nothing.",
    )


def _declare_deadlines(loader: Loader) -> None:
    """The stall deadlines (seconds as a str: mitmproxy's --set cannot parse a float option)."""
    loader.add_option(
        "finish_fix_idle_timeout",
        str,
        DEFAULT_IDLE_TIMEOUT,
        "Seconds allowed between two SSE events once the first token arrived (once the first "
        "event arrived when finish_fix_first_token_timeout is 0, since until the first token "
        "that deadline governs); comments and keep-alive lines do not count, so they cannot "
        "hide a stall. Past it the client gets an "
        "error event (code stream_interrupted; finish_fix_on_cut applies), its response ends, "
        "and the upstream connection is closed. 0 = no limit. The default, 120, is above the "
        "60-100 s idle timeouts of common load balancers and far above any pause between "
        "tokens of a live stream.",
    )
    loader.add_option(
        "finish_fix_first_token_timeout",
        str,
        DEFAULT_FIRST_TOKEN_TIMEOUT,
        "Seconds allowed from the moment a streaming request went upstream to its first token "
        "(content, reasoning, a refusal or a tool call); past it the stream ends as for "
        "finish_fix_idle_timeout, and a request whose response head has not even come is "
        "answered at once with HTTP 504 and the dialect's error body (the upstream connection "
        "is closed). 0 = no limit. The default, 600, is the OpenAI SDKs' own request timeout: "
        "a reasoning model may think for minutes, or a long prompt prefill, before its first "
        "token (a role-only chunk sent at once does not start the idle deadline while this one runs).",
    )


def _declare_telemetry(loader: Loader) -> None:
    """The books where operators look: Prometheus metrics and OpenTelemetry spans."""
    loader.add_option(
        "finish_fix_metrics",
        str,
        "",
        "Serve finish_fix's Prometheus metrics at http://HOST:PORT/metrics (e.g. 127.0.0.1:9464; "
        "port 0 picks a free one, logged) from a thread of its own: flows by dialect, verdict and "
        "cause, injections, streams in flight, time to first token, durations, events per "
        "stream. Label values come from closed sets: no model, path or id. Empty: off.",
    )
    loader.add_option(
        "finish_fix_otlp",
        str,
        "",
        "Send one OpenTelemetry span per flow in scope, following the GenAI semantic conventions "
        "v1.41.0, to this OTLP/HTTP traces endpoint (e.g. http://127.0.0.1:4318/v1/traces; a URL "
        "without a path gets /v1/traces), in batches from a thread of its own; a request's "
        "traceparent makes the span its child. A collector that does not answer costs one "
        "warning in the log, never a stream. Empty: off.",
    )


# -- reading the values ------------------------------------------------------------------------


def path_regex(option: str, text: str) -> re.Pattern[str] | None:
    """A path option's compiled regex; the empty string turns its dialect off."""
    if not text:
        return None
    try:
        return re.compile(text)
    except re.error as e:
        raise exceptions.OptionsError(f"{option}: {text!r} is not a valid regex ({e})") from None


def read_policy(options: Any) -> RepairPolicy:
    """The repair policy the options (mitmproxy's `ctx.options`) say.

    Raises:
        exceptions.OptionsError: a value that is not one the option takes; the line names it.
    """
    valid = [policy.value for policy in OnCut]
    if options.finish_fix_on_cut not in valid:
        raise exceptions.OptionsError(f"finish_fix_on_cut: {options.finish_fix_on_cut!r} is not one of {', '.join(valid)}")
    return RepairPolicy(
        empty_to_null=_boolean("finish_fix_empty_to_null", options.finish_fix_empty_to_null),
        on_cut=OnCut(options.finish_fix_on_cut),
        idle_timeout=_seconds("finish_fix_idle_timeout", options.finish_fix_idle_timeout),
        first_token_timeout=_seconds("finish_fix_first_token_timeout", options.finish_fix_first_token_timeout),
        limit_reasons=_boolean("finish_fix_limit_reasons", options.finish_fix_limit_reasons),
        responses_indexes=_boolean("finish_fix_responses_indexes", options.finish_fix_responses_indexes),
        responses_fields=_boolean("finish_fix_responses_fields", options.finish_fix_responses_fields),
    )


def _boolean(option: str, text: str) -> bool:
    value = BOOLEANS.get(text.strip().lower())
    if value is None:
        raise exceptions.OptionsError(f"{option}: {text!r} is not one of true, false")
    return value


def _seconds(option: str, text: str) -> float:
    try:
        return read_number(text, at_least=0)
    except NumberRefused:
        raise exceptions.OptionsError(
            f"{option}: {text!r} is not a number of seconds >= 0 (0 = no limit), e.g. 120 or 2.5"
        ) from None
