"""The worker's answer for given settings: the text, reasoning and tool calls each choice carries.

Pure: no clock, no randomness, no I/O. Token events (see `WorkerSettings`) per choice are reasoning
pieces, then content pieces, then tool calls (an opening event with id and name, then argument
pieces), cut at `max_tokens`; in a stream they interleave step by step across choices.

The answer is the same in every dialect; what differs is said here once: the finish reason's word
(`dialect_reason`), the error object (`error_object` for OpenAI's dialects, `anthropic_error` for
Messages), and how pieces group into Messages content blocks / Responses output items
(`blocks_of`).
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any

from finishline import Dialect
from labs.worker.settings import WorkerSettings

__all__ = [
    "CONTEXT_LENGTH_MESSAGE",
    "CONTENT_WORDS",
    "REASONING_WORDS",
    "TOOL_ARGUMENT_PIECES",
    "TOOL_NAME",
    "Block",
    "ExpectedAnswer",
    "ExpectedChoice",
    "ExpectedToolCall",
    "Piece",
    "anthropic_error",
    "blocks_of",
    "choice_pieces",
    "bad_request_body",
    "bad_request_object",
    "context_length_body",
    "context_length_object",
    "dialect_reason",
    "error_object",
    "expected_answer",
    "interleaved_pieces",
    "sent_reason",
    "tool_call_id",
]

#: Content pieces cycle through this text, one word (with its leading space) per token.
CONTENT_WORDS = tuple(" The quick brown fox jumps over the lazy dog.".split(" ")[1:])
#: Reasoning pieces cycle through this text.
REASONING_WORDS = tuple(" Let me think about this step by step.".split(" ")[1:])
#: Tool-call arguments, streamed in these pieces (joined they are valid JSON).
TOOL_ARGUMENT_PIECES = ('{"city', '": "', "Paris", '", "unit": "', 'celsius"}')
TOOL_NAME = "get_weather"


@dataclass(frozen=True, slots=True, kw_only=True)
class Piece:
    """One token event's payload for one choice.

    kind: `reasoning`, `content`, `tool_call` (opens tool call `tool_index` with its id and name)
    or `tool_arguments` (a piece of that call's arguments).
    """

    kind: str
    text: str
    tool_index: int = 0


@dataclass(frozen=True, slots=True, kw_only=True)
class ExpectedToolCall:
    id: str
    name: str
    arguments: str


@dataclass(frozen=True, slots=True, kw_only=True)
class ExpectedChoice:
    """What one choice carries in total; `finish_reason` is the true reason, whatever `finish` says."""

    index: int
    reasoning_content: str
    content: str
    tool_calls: tuple[ExpectedToolCall, ...]
    #: `stop`, `length` or `tool_calls`; `None` when an error event or `close_after_reasoning`
    #: ended the stream first. `dialect_reason` gives the Messages and Responses words.
    finish_reason: str | None
    #: Token events this choice carries.
    completion_tokens: int


@dataclass(frozen=True, slots=True, kw_only=True)
class ExpectedAnswer:
    """The full answer of a response for given settings.

    For an error event after N tokens, the choices hold what was sent before it and `error` holds
    the event's `error` object; for `http_error`, choices are empty and `error` is the body's.
    """

    choices: tuple[ExpectedChoice, ...]
    error: dict[str, Any] | None
    #: Token events in the whole stream (all choices), before any error event.
    token_events: int


def _word(words: tuple[str, ...], i: int) -> str:
    # The first word has no leading space so the joined text reads like a sentence.
    word = words[i % len(words)]
    return word if i == 0 else " " + word


def tool_call_id(choice: int, tool_index: int) -> str:
    """The deterministic id of a tool call."""
    return f"call_{choice}_{tool_index}"


def choice_pieces(settings: WorkerSettings, choice: int) -> tuple[tuple[Piece, ...], bool]:
    """The token events of one choice, after `max_tokens`, and whether `max_tokens` cut them.

    Every choice gets the same text (only `index` and tool-call ids differ), so choices are
    told apart by index only.
    """
    pieces: list[Piece] = []
    pieces += [Piece(kind="reasoning", text=_word(REASONING_WORDS, i)) for i in range(settings.reasoning_tokens)]
    pieces += [Piece(kind="content", text=_word(CONTENT_WORDS, i)) for i in range(settings.tokens)]
    for t in range(settings.tool_calls):
        pieces.append(Piece(kind="tool_call", text=tool_call_id(choice, t), tool_index=t))
        pieces += [Piece(kind="tool_arguments", text=p, tool_index=t) for p in TOOL_ARGUMENT_PIECES]
    limit = settings.max_tokens
    if limit is not None and len(pieces) > limit:
        return tuple(pieces[:limit]), True
    return tuple(pieces), False


def error_object(status: int, model: str) -> dict[str, Any]:
    """The OpenAI-style `error` object for an HTTP status (429 is `rate_limit_exceeded`)."""
    if status == 429:
        return {
            "message": f"Rate limit reached for {model} (simulated by finishline).",
            "type": "requests",
            "param": None,
            "code": "rate_limit_exceeded",
        }
    if status >= 500:
        return {
            "message": f"The server had an error while processing your request (simulated {status}).",
            "type": "server_error",
            "param": None,
            "code": "server_error",
        }
    return {
        "message": f"Simulated client error {status}.",
        "type": "invalid_request_error",
        "param": None,
        "code": None,
    }


#: `http_400_context_length`'s message: what OpenAI says (its code `context_length_exceeded` is the
#: word clients and gateways match on, e.g. LiteLLM's `ContextWindowExceededError`).
CONTEXT_LENGTH_MESSAGE = (
    "This model's maximum context length is 128 tokens. However, your messages resulted in more tokens (simulated by finishline)."
)


def context_length_object() -> dict[str, Any]:
    """OpenAI's `error` object for a prompt over the context window (a 400 not to retry)."""
    return {
        "message": CONTEXT_LENGTH_MESSAGE,
        "type": "invalid_request_error",
        "param": "messages",
        "code": "context_length_exceeded",
    }


def context_length_body(dialect: Dialect) -> dict[str, Any]:
    """The 400 body of `http_400_context_length` in `dialect`'s error shape. Anthropic's errors have
    no code: its type is `invalid_request_error` and the message says the prompt is too long (as the
    real API's `prompt is too long: N tokens > M maximum`)."""
    if dialect is Dialect.MESSAGES:
        message = "prompt is too long: 129 tokens > 128 maximum (simulated by finishline)."
        return {"type": "error", "error": {"type": "invalid_request_error", "message": message}}
    return {"error": context_length_object()}


#: `http_400_content_policy`'s messages: OpenAI's safety-system refusal (its code
#: `content_policy_violation` is what clients and gateways match on, e.g. LiteLLM's
#: `ContentPolicyViolationError`) and Anthropic's, which has no code.
CONTENT_POLICY_MESSAGE = "Your request was rejected as a result of our safety system (simulated by finishline)."
CONTENT_POLICY_MESSAGE_ANTHROPIC = "Output blocked by content filtering policy (simulated by finishline)."
#: `http_400_prefill`'s message: what a server without assistant prefill says to a request whose
#: last message is the assistant's (failoverbench S14's fallback).
PREFILL_MESSAGE = "assistant message prefill is not supported"
#: `http_400_context_length` in Gemini: Google's words for a prompt over the window.
GEMINI_CONTEXT_LENGTH_MESSAGE = (
    "The input token count (129) exceeds the maximum number of tokens allowed (128) (simulated by finishline)."
)


def bad_request_object(settings: WorkerSettings) -> dict[str, Any] | None:
    """OpenAI's `error` object for the 400 knobs (`http_400_context_length`,
    `http_400_content_policy`, `http_400_prefill`), None when none is set."""
    if settings.http_400_context_length:
        return context_length_object()
    if settings.http_400_content_policy:
        return {
            "message": CONTENT_POLICY_MESSAGE,
            "type": "invalid_request_error",
            "param": None,
            "code": "content_policy_violation",
        }
    if settings.http_400_prefill:
        return {"message": PREFILL_MESSAGE, "type": "invalid_request_error", "param": "messages", "code": None}
    return None


def bad_request_body(settings: WorkerSettings, dialect: Dialect) -> dict[str, Any] | None:
    """The 400 body of the 400 knobs in `dialect`'s error shape, None when none is set. Anthropic's
    errors have no code: each is an `invalid_request_error` whose message says why."""
    error = bad_request_object(settings)
    if error is None:
        return None
    if dialect is Dialect.GEMINI:
        # Google's error shape: no codes beyond the status; the message says why, in Google's words
        # for a prompt over the window ("The input token count (N) exceeds the maximum ...").
        if settings.http_400_context_length:
            message = GEMINI_CONTEXT_LENGTH_MESSAGE
        elif settings.http_400_content_policy:
            message = CONTENT_POLICY_MESSAGE
        else:
            message = PREFILL_MESSAGE
        return {"error": {"code": 400, "message": message, "status": "INVALID_ARGUMENT"}}
    if dialect is not Dialect.MESSAGES:
        return {"error": error}
    if settings.http_400_context_length:
        return context_length_body(dialect)
    message = CONTENT_POLICY_MESSAGE_ANTHROPIC if settings.http_400_content_policy else PREFILL_MESSAGE
    return {"type": "error", "error": {"type": "invalid_request_error", "message": message}}


#: Anthropic's error `type` per HTTP status (anthropic-sdk-python `types/shared/error_type.py`, and
#: the status each is documented with); other 5xx are `api_error`, other 4xx `invalid_request_error`.
_ANTHROPIC_ERROR_TYPES = {
    400: "invalid_request_error",
    401: "authentication_error",
    402: "billing_error",
    403: "permission_error",
    404: "not_found_error",
    413: "request_too_large",
    429: "rate_limit_error",
    500: "api_error",
    504: "timeout_error",
    529: "overloaded_error",
}


def anthropic_error(status: int, model: str) -> dict[str, Any]:
    """The Anthropic `error` object for an HTTP status, e.g. `{"type": "rate_limit_error", ...}`.

    The Messages error event and error body wrap it: `{"type": "error", "error": <this>}`.
    """
    kind = _ANTHROPIC_ERROR_TYPES.get(status, "api_error" if status >= 500 else "invalid_request_error")
    if kind == "rate_limit_error":
        message = f"Rate limit reached for {model} (simulated by finishline)."
    elif kind == "overloaded_error":
        message = "Overloaded (simulated by finishline)."
    elif status >= 500:
        message = f"Internal server error (simulated {status})."
    else:
        message = f"Simulated client error {status}."
    return {"type": kind, "message": message}


#: A Chat finish reason in each dialect's words: Messages `stop_reason`, Responses the terminal
#: response's `status` (`incomplete` comes with `incomplete_details.reason: "max_output_tokens"`).
_DIALECT_REASONS = {
    Dialect.CHAT: {"stop": "stop", "length": "length", "tool_calls": "tool_calls"},
    Dialect.MESSAGES: {"stop": "end_turn", "length": "max_tokens", "tool_calls": "tool_use"},
    Dialect.RESPONSES: {"stop": "completed", "length": "incomplete", "tool_calls": "completed"},
    # Gemini's `finishReason`: a function call finishes `STOP` (there is no tool-calls reason); a
    # content filter is `SAFETY` (LiteLLM's OpenAI->Gemini mapping, shared/notes/gemini.md section 6).
    Dialect.GEMINI: {"stop": "STOP", "length": "MAX_TOKENS", "tool_calls": "STOP", "content_filter": "SAFETY"},
}


def dialect_reason(reason: str | None, dialect: Dialect) -> str | None:
    """`stop`/`length`/`tool_calls` (an `ExpectedChoice.finish_reason`) in `dialect`'s words.

    None stays None (an error event or a close ended the answer first).

    Raises:
        KeyError: `reason` is not one of the three.
    """
    return None if reason is None else _DIALECT_REASONS[dialect][reason]


def sent_reason(reason: str | None, *, hide_limit: bool) -> str | None:
    """The reason the worker sends for a choice's true `reason`: `stop` for `length` when
    `hide_limit` (the knob: a server that reports its token limit as a natural end)."""
    return "stop" if hide_limit and reason == "length" else reason


@dataclass(frozen=True, slots=True)
class Block:
    """Consecutive pieces that form one Messages content block or one Responses output item.

    kind: `reasoning` (a thinking block / reasoning item), `content` (text / message item) or
    `tool_call` (a tool_use block / function_call item: its opening piece, then its arguments).
    """

    kind: str
    pieces: tuple[Piece, ...]

    @property
    def text(self) -> str:
        """The block's text: reasoning or content, or a tool call's arguments."""
        pieces = self.pieces[1:] if self.kind == "tool_call" else self.pieces
        return "".join(p.text for p in pieces)

    @property
    def tool_id(self) -> str:
        """A tool call's id (its opening piece's text)."""
        return self.pieces[0].text


def blocks_of(pieces: tuple[Piece, ...] | list[Piece]) -> list[Block]:
    """Group one choice's pieces (in order) into blocks: a run of reasoning, a run of content, and
    each tool call from its opening piece through its arguments.

    Raises:
        ValueError: a `tool_arguments` piece comes before any tool call was opened.
    """
    # Each block's pieces are collected in a list and frozen at the end: a 100k-piece answer (the
    # bench's) would be quadratic if each piece rebuilt its block's tuple.
    runs: list[tuple[str, list[Piece]]] = []
    for piece in pieces:
        if piece.kind == "tool_arguments":
            if not runs or runs[-1][0] != "tool_call":
                raise ValueError(f"tool arguments {piece.text!r} before any tool call was opened")
            runs[-1][1].append(piece)
        elif runs and piece.kind != "tool_call" and runs[-1][0] == piece.kind:
            runs[-1][1].append(piece)
        else:
            runs.append((piece.kind, [piece]))
    return [Block(kind=kind, pieces=tuple(run)) for kind, run in runs]


def interleaved_pieces(settings: WorkerSettings) -> list[tuple[int, Piece]]:
    """All token events of a stream in wire order: step by step, choice 0 first at each step."""
    per_choice = [choice_pieces(settings, c)[0] for c in range(settings.choices)]
    order: list[tuple[int, Piece]] = []
    for step in range(max((len(p) for p in per_choice), default=0)):
        for choice, pieces in enumerate(per_choice):
            if step < len(pieces):
                order.append((choice, pieces[step]))
    return order


def expected_answer(settings: WorkerSettings) -> ExpectedAnswer:
    """The full answer the worker gives for (resolved) settings: text, reasoning, tool calls, reason.

    Pure: no clock, no randomness. Streaming and non-streaming responses carry the same answer.
    """
    if settings.http_error is not None:
        error: dict[str, Any] | None = bad_request_object(settings) or error_object(settings.http_error, settings.model_name)
        return ExpectedAnswer(choices=(), error=error, token_events=0)
    order = interleaved_pieces(settings)
    if settings.close_after_reasoning:
        # Ollama's defect: the stream closes after the last reasoning piece (every choice's reasoning
        # comes first, so that is a prefix of the wire order).
        order = order[: max((i + 1 for i, (_, p) in enumerate(order) if p.kind == "reasoning"), default=0)]
    error = None
    if settings.error_after is not None and settings.error_after < len(order):
        order = order[: settings.error_after]
        error = error_object(settings.error_status, settings.model_name)
    choices = []
    for c in range(settings.choices):
        mine = [p for choice, p in order if choice == c]
        truncated = choice_pieces(settings, c)[1]
        calls = []
        for p in mine:
            if p.kind == "tool_call":
                calls.append(ExpectedToolCall(id=p.text, name=TOOL_NAME, arguments=""))
            elif p.kind == "tool_arguments":
                last = calls[p.tool_index]
                calls[p.tool_index] = dataclasses.replace(last, arguments=last.arguments + p.text)
        if error is not None or settings.close_after_reasoning:
            reason = None
        elif truncated:
            reason = "length"
        elif settings.tool_calls:
            reason = "tool_calls"
        else:
            reason = "stop"
        choices.append(
            ExpectedChoice(
                index=c,
                reasoning_content="".join(p.text for p in mine if p.kind == "reasoning"),
                content="".join(p.text for p in mine if p.kind == "content"),
                tool_calls=tuple(calls),
                finish_reason=reason,
                completion_tokens=len(mine),
            )
        )
    return ExpectedAnswer(choices=tuple(choices), error=error, token_events=len(order))
