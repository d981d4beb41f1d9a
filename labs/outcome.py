"""What one cell of the matrix means: a client's report, judged against the worker's true answer.

The outcome words are a closed set, and these exact strings are what the terminal table, the JSON
result file and the HTML report show:

- `ok`: the client finished normally with the full answer and the right finish reason (a client that
  surfaces no reason at all passes only where the true reason is `stop`, the one an application
  assumes when none is given).
- `error`: the client raised: it told its application something went wrong (class: message), and
  an application that does nothing special stops there.
- `flagged`: the client ended normally but surfaced a finish reason that means "incomplete" (the AI
  SDK's `interrupted` or `other`, a passed-through `abort` or `error`): the failure is there to be
  seen, but only an application that checks the reason notices it.
- `hang`: no end within the scenario's deadline.
- `silent-truncation`: the client reported success, but the text (or the tool calls: their names
  and arguments) is not the worker's full answer, or the reason is wrong (a missing `length` or
  `tool_calls`), or the worker answered with an error (an error event, or an HTTP error before
  any streaming) that the client did not pass on. The worst cell: the application carries on with a
  broken answer and nothing tells it.

Dialects: each dialect has its own words for why a stream ended (Chat's `finish_reason`, Messages'
`stop_reason`, the final Responses `status` or `incomplete_details.reason`), and each client may
spell them its own way (the AI SDK's unified `tool-calls`, pi-ai's `toolUse`). `DIALECT_WORDS` says,
per dialect, which surfaced word means which of the dialect's reasons, which words mean "did not
end well", and which reason an application assumes when none is surfaced: Chat's `stop`, Messages'
`end_turn`, none for Responses, whose every finished response has a terminal status (a "success"
with none, or with `in_progress`, is a silent truncation), and none for Gemini, whose `finishReason`
is a stream's only end sign. The judgement itself is one function for
every dialect.

Coding agents (labs.clients.agent_host): their user sees an exit status and printed text, not a
finish reason, so a report that carries an exit status is judged by those (`_judge_command`): exit
0 with the worker's whole answer printed is `ok`, exit 0 with less (or after a worker that answered
with an error) a `silent-truncation`, another status an `error`, and so is exit 0 with a failure
told (gemini-cli's `INVALID_STREAM`), the deadline a `hang`; never `flagged`.

Books: a gateway that keeps books (finish_fix's ledger, LiteLLM's callbacks) says `ok` or `error`
for the request; a mismatch is flagged when the books' word differs from what the client's outcome
implies (a client-side `ok` needs books `ok`; anything else, `flagged` included, needs books
`error`: a `flagged` cell is a failure the client noticed).
"""

from __future__ import annotations

import enum
import json
from collections.abc import Mapping
from dataclasses import asdict, dataclass, field
from typing import Any

from finishline import Dialect

__all__ = [
    "BOOKS_ERROR",
    "BOOKS_NONE",
    "BOOKS_NO_ENTRY",
    "BOOKS_OK",
    "Change",
    "ClientReport",
    "DIALECT_WORDS",
    "DialectWords",
    "Expected",
    "Judgement",
    "Outcome",
    "books_mismatch",
    "canonical_reason",
    "change",
    "judge",
    "same_arguments",
]


class Outcome(enum.StrEnum):
    """The closed set of cell outcomes, in order of how loudly the report shows them."""

    #: Full answer, right reason, normal end.
    OK = "ok"
    #: The client raised.
    ERROR = "error"
    #: The client ended normally, but with a finish reason that means the answer is incomplete.
    FLAGGED = "flagged"
    #: Nothing ended the request before the scenario's deadline.
    HANG = "hang"
    #: Success reported, but the answer is short or the reason wrong: the worst cell.
    SILENT_TRUNCATION = "silent-truncation"

    @property
    def severity(self) -> int:
        """0 for ok up to 4 for silent-truncation: the order cells are coloured and sorted in."""
        return list(Outcome).index(self)


BOOKS_OK = "ok"
BOOKS_ERROR = "error"
#: The books column of a gateway that keeps no per-request record (never a blank).
BOOKS_NONE = "none"
#: The books word for a cell whose gateway keeps books but wrote nothing for it.
BOOKS_NO_ENTRY = "no entry"

# Reasons with which a client tells its application the stream did not end well, without raising,
# whichever client surfaces them: the AI SDK's unified `interrupted`/`error`/`other` (packages/openai:
# `interrupted` when no finish_reason came), Pi's stop reasons `error`/`aborted`, and what upstreams
# send as a finish_reason and a client may pass through unchanged: vLLM's `abort` (a request the
# engine aborted), OpenRouter's `error` (the provider failed mid-stream).
_FAILURE_REASONS = frozenset({"interrupted", "error", "other", "unknown", "aborted", "abort"})
# What the AI SDK (unified reasons) and pi-ai (stopReason) say in every dialect they speak.
_AI_SDK_AND_PI = {"tool-calls": "tool_calls", "toolUse": "tool_calls", "content-filter": "content_filter"}


@dataclass(frozen=True, slots=True, kw_only=True)
class DialectWords:
    """How one dialect's reasons are read from what a client surfaced."""

    #: A surfaced word -> the dialect's own word for that reason (a word not listed is itself).
    spellings: Mapping[str, str]
    #: Surfaced words that mean "the stream did not end well" (a `flagged` cell).
    failures: frozenset[str]
    #: The reason an application assumes when none is surfaced (None: no reason is never right).
    assumed_without_reason: str | None


#: Per dialect, the words of `judge`. The dialect's own reason words (`stop`, `end_turn`,
#: `completed` ...) are what `labs.worker.answer.dialect_reason` gives for the worker's true answer.
DIALECT_WORDS: dict[Dialect, DialectWords] = {
    Dialect.CHAT: DialectWords(
        spellings={**_AI_SDK_AND_PI, "function_call": "tool_calls"},
        failures=_FAILURE_REASONS,
        assumed_without_reason="stop",
    ),
    # `stop_reason` (anthropic-python and -node, LangChain's response_metadata); the AI SDK and
    # pi-ai give their unified words (`stop`, `length`, `tool-calls` / `toolUse`).
    Dialect.MESSAGES: DialectWords(
        spellings={
            "stop": "end_turn",
            "length": "max_tokens",
            "tool_calls": "tool_use",
            "tool-calls": "tool_use",
            "toolUse": "tool_use",
            "content-filter": "refusal",
        },
        failures=_FAILURE_REASONS,
        # anthropic-python's `get_final_message()` keeps `stop_reason=None` when no message_delta
        # set one; an application reads that as a normal end, as Chat's missing finish_reason.
        assumed_without_reason="end_turn",
    ),
    # The final response's `status`, or `incomplete_details.reason` when incomplete; a function
    # call ends a `completed` response. `failed` passed on without raising is a failure seen;
    # `in_progress` (openai-node's `finalResponse()` after a cut) is no reason at all.
    Dialect.RESPONSES: DialectWords(
        spellings={
            "stop": "completed",
            "length": "incomplete",
            "max_output_tokens": "incomplete",
            "tool_calls": "completed",
            "tool-calls": "completed",
            "toolUse": "completed",
        },
        failures=_FAILURE_REASONS | {"failed"},
        assumed_without_reason=None,
    ),
    # The last candidate's `finishReason` (google-genai's `FinishReason` value, LangChain's
    # response_metadata); the AI SDK and pi-ai give their unified words. A function call finishes
    # `STOP`. No reason is never right: Google's own docs say an empty reason means "the model has
    # not stopped generating", and a stream's reason is its only end sign (a cut at a chunk
    # boundary reads as a clean end), so a full text without one is a truncation nothing reported,
    # like Responses without its terminal status. `FINISH_REASON_UNSPECIFIED` passed on says the
    # same, where a client shows it (LangChain): a failure seen.
    Dialect.GEMINI: DialectWords(
        spellings={
            "stop": "STOP",
            "length": "MAX_TOKENS",
            "tool_calls": "STOP",
            "tool-calls": "STOP",
            "toolUse": "STOP",
            "content_filter": "SAFETY",
            "content-filter": "SAFETY",
        },
        failures=_FAILURE_REASONS | {"FINISH_REASON_UNSPECIFIED"},
        assumed_without_reason=None,
    ),
}


def canonical_reason(reason: str | None, dialect: Dialect = Dialect.CHAT) -> str | None:
    """The dialect's own word for a surfaced reason; `None` and `""` mean "none surfaced"."""
    if not reason:
        return None
    return DIALECT_WORDS[dialect].spellings.get(reason, reason)


@dataclass(frozen=True, slots=True, kw_only=True)
class ClientReport:
    """One driver's normalized account of one request (the JSON line a driver host writes)."""

    client: str
    completed: bool
    text: str = ""
    reasoning: str = ""
    finish_reason: str | None = None
    tool_calls: list[dict[str, str]] = field(default_factory=list)
    error_class: str | None = None
    error_message: str | None = None
    ttft_s: float | None = None
    duration_s: float | None = None
    timed_out: bool = False
    http_status: int | None = None
    connection: str | None = None
    #: A coding agent's exit status (labs.clients.agent_host): its report is a command's, judged
    #: by what its user saw (`judge`); None for a library, and for an agent stopped at the deadline.
    exit_code: int | None = None
    #: The network interfaces in the agent's namespace (`["lo"]`: nothing could leave the machine);
    #: None for a library.
    interfaces: list[str] | None = None
    #: The model the response named and the usage it reported, as the client read them (the raw
    #: SDK drivers of each dialect); None where the driver does not read them.
    model: str | None = None
    usage: dict[str, Any] | None = None

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> ClientReport:
        known = {name: data[name] for name in cls.__dataclass_fields__ if name in data}
        return cls(**known)

    def to_json(self) -> dict[str, Any]:
        return asdict(self)


@dataclass(frozen=True, slots=True, kw_only=True)
class Expected:
    """The worker's true answer for the request (choice 0), with its reason in the dialect's words:
    computed from the simulated worker's settings, captured from a real worker
    (`labs.worker.truth`)."""

    text: str
    #: The dialect's word: Chat `stop`, `length`, `tool_calls`; Messages `end_turn`, `max_tokens`,
    #: `tool_use`; Responses `completed`, `incomplete`; Gemini `STOP`, `MAX_TOKENS`. `None` when the worker itself ends with an
    #: error (an error event, or an HTTP error status before streaming).
    finish_reason: str | None
    #: Each tool call's name and full arguments (a JSON text), in order.
    tool_calls: tuple[dict[str, str], ...] = ()
    #: The HTTP error status the worker answers with before streaming anything, if it does.
    http_error: int | None = None
    #: The dialect the request spoke: whose words `finish_reason` and the client's report are in.
    dialect: Dialect = Dialect.CHAT
    #: How many token events the worker's stream has (faults/layout.py counts them), when known.
    token_events: int | None = None


@dataclass(frozen=True, slots=True, kw_only=True)
class Judgement:
    outcome: Outcome
    #: One line a person reads in the table's details: why this outcome.
    reason: str


def judge(report: ClientReport, expected: Expected) -> Judgement:
    """Classify one client report against the true answer.

    Order matters: a deadline beats everything (a hung client may also hold partial text), then
    what the client said (raised: `error`; a failure reason: `flagged`), then what it did not say
    (short text, wrong reason). Reasons are read in the expected answer's dialect (`DIALECT_WORDS`).
    A report with an exit status is a coding agent's, judged by what its user saw (`_judge_command`).
    """
    words = DIALECT_WORDS[expected.dialect]
    if report.timed_out:
        return Judgement(
            outcome=Outcome.HANG,
            reason=f"no end within the deadline; {len(report.text)} of {len(expected.text)} characters received",
        )
    if report.exit_code is not None:
        return _judge_command(report, expected)
    if not report.completed:
        return Judgement(outcome=Outcome.ERROR, reason=f"{report.error_class}: {report.error_message}")
    surfaced = canonical_reason(report.finish_reason, expected.dialect)
    if report.finish_reason in words.failures:
        return Judgement(
            outcome=Outcome.FLAGGED,
            reason=f"no exception, but the client surfaced finish reason {report.finish_reason!r}",
        )
    if expected.http_error is not None:
        return Judgement(
            outcome=Outcome.SILENT_TRUNCATION,
            reason=f"success reported (reason {surfaced!r}) although the worker answered HTTP {expected.http_error} before streaming",
        )
    if expected.finish_reason is None:
        return Judgement(
            outcome=Outcome.SILENT_TRUNCATION,
            # An error event, or a stream the worker closes early (`close_after_reasoning`).
            reason=f"success reported (reason {surfaced!r}) although the stream ended in an error or before its end",
        )
    if report.text != expected.text:
        shape = "shorter than" if expected.text.startswith(report.text) else "different from"
        return Judgement(
            outcome=Outcome.SILENT_TRUNCATION,
            reason=f"success reported with {len(report.text)} characters, {shape} the worker's {len(expected.text)}",
        )
    if len(report.tool_calls) != len(expected.tool_calls):
        return Judgement(
            outcome=Outcome.SILENT_TRUNCATION,
            reason=f"success reported with {len(report.tool_calls)} tool calls, the worker sent {len(expected.tool_calls)}",
        )
    for number, (got, want) in enumerate(zip(report.tool_calls, expected.tool_calls)):
        if got.get("name") != want["name"] or not same_arguments(got.get("arguments"), want["arguments"]):
            return Judgement(
                outcome=Outcome.SILENT_TRUNCATION,
                reason=f"success reported, but tool call {number} is {got.get('name')}({got.get('arguments')}) "
                f"where the worker sent {want['name']}({want['arguments']})",
            )
    # No reason at all reads as "stop" to an application, so it is only wrong when the truth was
    # something the application must act on (continue after `length`, run the `tool_calls`), or in
    # a dialect where every finished stream has one (Responses: no status means no terminal event).
    if surfaced is None and expected.finish_reason == words.assumed_without_reason:
        return Judgement(
            outcome=Outcome.OK, reason=f"full answer; no finish reason surfaced (true reason: {expected.finish_reason})"
        )
    if surfaced != expected.finish_reason:
        return Judgement(
            outcome=Outcome.SILENT_TRUNCATION,
            reason=f"full text, but finish reason {surfaced!r} where the worker's was {expected.finish_reason!r}",
        )
    return Judgement(outcome=Outcome.OK, reason=f"full answer, finish reason {surfaced!r}")


def _judge_command(report: ClientReport, expected: Expected) -> Judgement:
    """A coding agent run headless, as its user sees it: the exit status, and the answer it
    printed. A status other than 0 is an `error` (the user is told, in the agent's last line), and
    so is 0 with a failure told (`completed` false: gemini-cli's JSON `error`); 0 with the worker's
    whole answer printed is `ok`; 0 with less, or with anything else, or after a worker that
    answered with an error, is a `silent-truncation`. An agent prints no finish reason, so none is
    `flagged`, and none is judged by one."""
    if report.exit_code != 0 or not report.completed:
        return Judgement(outcome=Outcome.ERROR, reason=f"exit {report.exit_code}: {report.error_message or '(no error line)'}")
    if expected.http_error is not None or expected.finish_reason is None:
        return Judgement(
            outcome=Outcome.SILENT_TRUNCATION,
            reason="exit 0 although the worker answered with an error or ended its stream early",
        )
    if report.text != expected.text:
        shape = "shorter than" if expected.text.startswith(report.text) else "different from"
        return Judgement(
            outcome=Outcome.SILENT_TRUNCATION,
            reason=f"exit 0 with {len(report.text)} characters printed, {shape} the worker's {len(expected.text)}",
        )
    return Judgement(outcome=Outcome.OK, reason="exit 0, the worker's whole answer printed")


def same_arguments(got: object, want: str) -> bool:
    """Whether a client's tool-call arguments are the worker's: equal as JSON values (the AI SDK and
    Pi hand the application parsed arguments, which the drivers serialize again), else as text."""
    if not isinstance(got, str):
        return False
    try:
        return json.loads(got) == json.loads(want)
    except ValueError:
        return got == want


class Change(enum.StrEnum):
    """How one gateway's outcome for a scenario and client compares with the baseline's (`direct`)
    for the same: the words the terminal's tally and the report's classes show."""

    BETTER = "better"
    WORSE = "worse"
    SAME = "same"


def change(baseline: Outcome, outcome: Outcome) -> Change:
    """By `Outcome.severity`: `ok` beats every failure, and a louder failure beats a quieter one
    (`error` > `flagged` > `hang` > `silent-truncation`)."""
    before, after = baseline.severity, outcome.severity
    return Change.SAME if before == after else (Change.BETTER if after < before else Change.WORSE)


def books_mismatch(outcome: Outcome, books: str | None) -> bool:
    """Whether the gateway's books disagree with what the client saw.

    `books` is `BOOKS_OK`, `BOOKS_ERROR` or `None` (no books kept, or no entry yet); no books, no
    mismatch.
    """
    if books is None:
        return False
    return (outcome is Outcome.OK) != (books == BOOKS_OK)
