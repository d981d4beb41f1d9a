"""The gateway checks, as data: which lab scenario each one runs, through which hub policy, and how
the requests' results are judged.

Theory of operation
-------------------
A gateway check is a lab scenario (`labs/scenarios/*.toml`: worker settings, fault, request) run
through the user's gateway, always with the lab's hub as the gateway's upstream (a scenario
without `[hub]` runs with `abort`, which passes the tunnel's failure on as it came: the same as
no hub). Every check sends one request per client (real client libraries, `labs.clients`) and one
through a byte-level reader (`bytes`), all at once while the fault is applied; the judge then reads:

- each client's outcome, from the lab's own classification (`labs.outcome.judge`);
- the bytes the gateway sent, read with finishline's core (`labs.grade.reading`);
- which worker saw each request (the primary behind the faulty tunnel, or the spare).

The post-mortem's rules: before the first token, retry on another worker (rule 1); after it, an
explicit error event and no `[DONE]` after it (rule 2); a cut is an error in the books (rule 3,
judged over the cuts of rule 2 and the stall, see `labs.grade.gateway_grader`).

Dialects: a card grades the gateway in one dialect, the one its clients speak, from the worker
speaking that dialect or, for a translating route, another (the upstream dialect). A check runs
in (dialect, upstream) when its scenario's worker settings mean something in both
(`Scenario.speaks`) and the check says what it means there (`GatewayCheck.dialects`,
`upstreams`): `reason-omitted` is a finish-reason defect where a terminator still comes (Chat's
`[DONE]`, Messages' `message_stop`) but a cut in Responses, which has none besides its terminal
events, and in Gemini, which has no terminator at all: there a stream whose `finishReason` is
missing (or `""`, which counts as none) reads exactly as a cut, so the finish-reason checks do not
run from a Gemini worker and `no-finish-reason` judges it as rule 2 does a cut (the gateway must end
it with an error frame, never a made-up `STOP`). Its title and evidence use the dialect's words
(`WORDS`).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from finishline import Dialect, Verdict
from labs.grade.card import Finding, Mark, shortened
from labs.grade.reading import CLEAN_END, StreamReading
from labs.hub.policy import TunnelDropPolicy
from labs.outcome import Outcome
from labs.worker.attempts import PRIMARY, SPARE

__all__ = [
    "BYTES_CLIENT",
    "DEFAULT_GATEWAY_CLIENTS",
    "DEFAULT_GATEWAY_CLIENTS_BY_DIALECT",
    "WORDS",
    "Words",
    "GATEWAY_CHECKS",
    "GATEWAY_CHECK_IDS",
    "BOOKS_CHECK",
    "CheckRun",
    "GatewayCheck",
    "RequestResult",
    "judge_run",
]

#: The byte-level reader's name among the clients.
BYTES_CLIENT = "bytes"
#: The clients a gateway is graded with unless `--client` says otherwise (the CLI, the plugin).
DEFAULT_GATEWAY_CLIENTS = ("openai-python", "openai-node", "pi-ai")
#: The same per dialect: each dialect's Python and Node SDKs, and pi-ai, which speaks all four.
DEFAULT_GATEWAY_CLIENTS_BY_DIALECT: dict[Dialect, tuple[str, ...]] = {
    Dialect.CHAT: DEFAULT_GATEWAY_CLIENTS,
    Dialect.MESSAGES: ("anthropic-python", "anthropic-node", "pi-ai"),
    Dialect.RESPONSES: DEFAULT_GATEWAY_CLIENTS,
    # Google's Python and Node SDKs, which both raise on Gemini's error frame (shared/notes/gemini.md §3), and pi-ai.
    Dialect.GEMINI: ("google-genai", "google-genai-node", "pi-ai"),
}


@dataclass(frozen=True, slots=True)
class Words:
    """A dialect's words for what the checks' titles and evidence name."""

    #: The field that says why the answer ended.
    reason: str
    #: Its values for a natural stop, a token limit and a tool call.
    stop: str
    length: str
    tool: str
    #: What a well-ended stream ends with.
    terminator: str


WORDS: dict[Dialect, Words] = {
    Dialect.CHAT: Words(reason="finish_reason", stop="stop", length="length", tool="tool_calls", terminator="[DONE]"),
    Dialect.MESSAGES: Words(
        reason="stop_reason", stop="end_turn", length="max_tokens", tool="tool_use", terminator="message_stop"
    ),
    Dialect.RESPONSES: Words(
        reason="status", stop="completed", length="incomplete", tool="completed", terminator="response.completed"
    ),
    # No terminator: the chunk with the finishReason is what a well-ended stream ends with.
    Dialect.GEMINI: Words(reason="finishReason", stop="STOP", length="MAX_TOKENS", tool="STOP", terminator="finishReason chunk"),
}
#: How long a clause of evidence quoting a client's words may be.
_CLAUSE = 110
#: Outcomes with which a client tells its application that the answer is incomplete.
_TOLD = (Outcome.ERROR, Outcome.FLAGGED)


@dataclass(slots=True, kw_only=True)
class RequestResult:
    """One request of a check: who sent it, what it saw, which workers saw it."""

    client: str
    request_id: str
    outcome: Outcome
    why: str
    #: The bytes the gateway sent, read (the `bytes` client only).
    reading: StreamReading | None = None
    #: How often each worker (`primary`, `spare`) saw the request.
    workers: dict[str, int] = field(default_factory=dict)
    #: The books' word (`ok`, `error`, `no entry`) and entry, when books are read.
    books: str | None = None
    books_entry: dict[str, Any] | None = None

    @property
    def reached_primary(self) -> bool:
        return self.workers.get(PRIMARY, 0) > 0

    def line(self) -> str:
        return f"{self.client}: {self.outcome} ({shortened(self.why, _CLAUSE)})"


def _lines(results: list[RequestResult]) -> str:
    """Requests that ended alike in one clause: `bytes, openai-python: error (APIError: ...)`."""
    groups: dict[tuple[str, str], list[str]] = {}
    for r in results:
        # Clients word the same failure differently; group by outcome and the message's start.
        groups.setdefault((str(r.outcome), r.why.split(": ", 1)[-1][:60]), []).append(r.client)
    parts = []
    for (outcome, _), clients in groups.items():
        first = next(r for r in results if r.client == clients[0])
        parts.append(f"{', '.join(clients)}: {outcome} ({shortened(first.why, _CLAUSE)})")
    return "; ".join(parts)


@dataclass(slots=True, kw_only=True)
class CheckRun:
    """Everything one check's run produced."""

    results: list[RequestResult]
    spare: bool
    #: What the hub did, one line per request it relayed.
    hub: list[str] = field(default_factory=list)
    #: The dialect the clients spoke (the evidence is in its words).
    dialect: Dialect = Dialect.CHAT

    @property
    def raw(self) -> RequestResult | None:
        return next((r for r in self.results if r.client == BYTES_CLIENT), None)

    def clients(self) -> list[RequestResult]:
        return [r for r in self.results if r.client != BYTES_CLIENT]


@dataclass(frozen=True, slots=True, kw_only=True)
class GatewayCheck:
    rule: str
    check: str
    title: str
    #: The lab scenario it runs (a file name in labs/scenarios/, without `.toml`).
    scenario: str
    judge: Callable[[CheckRun], Finding]
    #: The hub's policy; None: the scenario's own, else `abort`.
    hub: TunnelDropPolicy | None = None
    #: Changes to the scenario's `[fault]` table (e.g. `reset = true`).
    fault_changes: dict[str, Any] = field(default_factory=dict)
    #: Needs the spare worker (rule 1): `not tested` without `--spare-port`.
    needs_spare: bool = False
    #: Its cuts must be booked as errors (rule 3).
    booked_as_cut: bool = False
    #: Its deadline is the grader's stall deadline, not the scenario's.
    stall: bool = False
    #: The client dialects it is a check of (None: every one its scenario runs in); a card of
    #: another dialect does not list it.
    dialects: tuple[Dialect, ...] | None = None
    #: The worker dialects in which its scenario is the defect it names (None: every one), and
    #: what it is in the others.
    upstreams: tuple[Dialect, ...] | None = None
    other_upstreams: str = ""
    #: Why a card of a dialect outside `dialects` does not run it (listed under `not run`); empty:
    #: such a card does not list it at all.
    other_dialects: str = ""

    def title_in(self, dialect: Dialect) -> str:
        """The title in the dialect's words (`WORDS`)."""
        return self.title.format_map(dataclasses.asdict(WORDS[dialect]))

    def why_not(self, dialect: Dialect, upstream: Dialect, listed: tuple[Dialect, ...]) -> str | None:
        """Why it does not run with `dialect` clients and a worker speaking `upstream` (its
        scenario lists `listed`), or None when it does."""
        if self.dialects is not None and dialect not in self.dialects:
            return self.other_dialects or f"a check of {', '.join(d.value for d in self.dialects)} only"
        if self.upstreams is not None and upstream not in self.upstreams:
            return f"from a {upstream.value} worker its scenario ({self.scenario}) is {self.other_upstreams}"
        for needed in dict.fromkeys((upstream, dialect)):
            if needed not in listed:
                return f"its scenario ({self.scenario}) runs in {', '.join(d.value for d in listed)}, not in {needed.value}"
        return None


#: The worker dialects whose streams have an end sign besides the reason (a terminator, a terminal
#: event): there a missing reason is a finish-reason defect. In Gemini it is a cut (`no-finish-reason`).
_ENDED_BY_MORE_THAN_A_REASON = (Dialect.CHAT, Dialect.MESSAGES, Dialect.RESPONSES)
_NO_REASON_IS_A_CUT = 'a stream without a finishReason ("" counts as none, rule G3), a cut: no-finish-reason judges it'


def _all_ok(run: CheckRun) -> Finding:
    bad = [r for r in run.results if r.outcome is not Outcome.OK]
    if bad:
        return Mark.FAIL, _lines(bad)
    return Mark.PASS, f"every client got the full answer and the right reason ({', '.join(r.client for r in run.results)})"


def _finish_reason(run: CheckRun) -> Finding:
    mark, evidence = _all_ok(run)
    raw = run.raw
    if raw is not None and raw.reading is not None:
        report = raw.reading.report
        if report.verdict is Verdict.CLEAN and mark is Mark.PASS:
            evidence += "; the gateway repaired the defect (its stream is well-formed)"
        elif report.verdict is Verdict.CLEAN:
            evidence += "; the gateway filled in a reason itself (its stream is well-formed, but not what the worker meant)"
        else:
            evidence += f"; the gateway passed the defect on (the core: {report.detail})"
    return mark, evidence


def _retried_on_spare(run: CheckRun) -> Finding:
    """Rule 1: every client got the full answer, and it came from the spare after the cut."""
    if not run.spare:
        return Mark.NOT_TESTED, "no spare worker: nowhere to retry (give the gateway a second upstream and pass its port)"
    judged = [r for r in run.results if r.reached_primary]
    skipped = [r.client for r in run.results if not r.reached_primary and r.workers]
    if not judged:
        return (
            Mark.NOT_TESTED,
            f"no request reached the faulty worker (the gateway sent them to the spare first: {', '.join(skipped)})",
        )
    bad = [r for r in judged if r.outcome is not Outcome.OK]
    if bad:
        retried = [r for r in bad if r.workers.get(SPARE)]
        hint = "" if retried else "; the gateway never asked the spare"
        return Mark.FAIL, _lines(bad) + hint
    not_from_spare = [r.client for r in judged if not r.workers.get(SPARE)]
    if not_from_spare:
        return Mark.FAIL, f"{', '.join(not_from_spare)}: full answer but the spare never saw the request (unexpected)"
    note = f" ({', '.join(skipped)} went to the spare first, not judged)" if skipped else ""
    return Mark.PASS, f"{len(judged)} requests cut before the first token got the full answer from the spare{note}"


def _explicit_error_after_tokens(run: CheckRun) -> Finding:
    """Rule 2: the gateway's bytes end in an error event, no [DONE] after it, no invented reason;
    every client raised or flagged."""
    raw = run.raw
    quiet = [r for r in run.clients() if r.reached_primary and r.outcome not in _TOLD]
    if raw is None or raw.reading is None:
        if quiet:  # the clients alone can fail the check; only a pass needs the bytes too
            return Mark.FAIL, _lines(quiet)
        return Mark.NOT_TESTED, "the byte-level request did not run"
    if not raw.reached_primary:
        return Mark.NOT_TESTED, "the byte-level request never reached the faulty worker"
    reading = raw.reading
    words = WORDS[run.dialect]
    invented = [c.finish_reason for c in reading.choices.values() if c.finish_reason]
    if not reading.status:
        problem = f"{reading.status_words()}, instead of streaming the tokens the worker had sent"
    elif reading.status != 200:
        problem = f"the gateway answered HTTP {reading.status} instead of streaming the tokens the worker had sent"
    elif invented:
        problem = (
            f"the gateway made up {words.reason} {invented[0]!r}"
            + (f" and {words.terminator}" if reading.done_positions else "")
            + " for a cut stream"
        )
    elif not reading.error_positions:
        how = "a clean end" if reading.ending == CLEAN_END else reading.ending
        done = f" with {words.terminator}" if reading.done_positions else ""
        problem = f"the stream just stopped: {len(reading.events)} events{done}, then {how}, no error event"
    elif reading.done_positions and reading.done_positions[-1] > reading.error_positions[0]:
        problem = (
            f"an error event, then {words.terminator} after it (clients that stop at {words.terminator} call that a success)"
        )
    else:
        problem = None
    if problem is None and not quiet:
        spared = [r.client for r in run.clients() if not r.reached_primary]
        note = f" ({', '.join(spared)} went to the spare, not judged)" if spared else ""
        return (
            Mark.PASS,
            f"error event: {shortened(reading.error_message() or '', _CLAUSE)}; every client raised or flagged{note}",
        )
    return Mark.FAIL, "; ".join(([problem] if problem else []) + ([_lines(quiet)] if quiet else []))


def _ended_with_error_in_time(run: CheckRun) -> Finding:
    """Stalls: every request ended with an error before the deadline."""
    raw = run.raw
    problems = []
    if not any(r.reached_primary for r in run.results):
        return Mark.NOT_TESTED, "no request reached the stalled worker (the gateway sent them to the spare)"
    if raw is not None and raw.reading is not None and raw.reached_primary:
        reading = raw.reading
        if reading.timed_out:
            problems.append(f"bytes: no end before the deadline ({len(reading.events)} events, then silence)")
        elif reading.done_positions or any(c.finish_reason for c in reading.choices.values()):
            problems.append("bytes: the stalled stream was finished as a success")
        elif not reading.error_positions:
            how = "a clean end" if reading.ending == CLEAN_END else reading.ending
            problems.append(f"bytes: ended by {how} without an error event")
    # A request the gateway sent to the healthy spare never met the stall: not evidence either way.
    quiet = [r for r in run.clients() if r.reached_primary and r.outcome not in _TOLD]
    if quiet:
        problems.append(_lines(quiet))
    if problems:
        return Mark.FAIL, "; ".join(problems)
    message = raw.reading.error_message() if raw is not None and raw.reading is not None and raw.reached_primary else None
    spared = [r.client for r in run.results if not r.reached_primary]
    note = f" ({', '.join(spared)} went to the spare, not judged)" if spared else ""
    return (
        Mark.PASS,
        f"ended with an error before the deadline{': ' + shortened(message, _CLAUSE) if message else ''}; every client raised or flagged{note}",
    )


GATEWAY_CHECKS = (
    GatewayCheck(rule="baseline", check="healthy", title="a healthy stream arrives whole", scenario="healthy", judge=_all_ok),
    GatewayCheck(
        rule="rule 1",
        check="prefill-cut-fin",
        title="cut before the first token (FIN): the client gets the full answer from the spare",
        scenario="rule1-prefill-cut-hub-abort-spare",
        judge=_retried_on_spare,
        needs_spare=True,
    ),
    GatewayCheck(
        rule="rule 1",
        check="prefill-cut-reset",
        title="cut before the first token (reset): the client gets the full answer from the spare",
        scenario="rule1-prefill-cut-hub-abort-spare",
        fault_changes={"reset": True},
        judge=_retried_on_spare,
        needs_spare=True,
    ),
    GatewayCheck(
        rule="rule 1",
        check="prefill-cut-hub-close",
        title="cut before the first token, hub ends cleanly: the client gets the full answer from the spare",
        scenario="rule1-prefill-cut-hub-close-spare",
        judge=_retried_on_spare,
        needs_spare=True,
    ),
    GatewayCheck(
        rule="rule 2",
        check="cut-after-tokens-fin",
        title="cut after tokens (FIN): an error event, no {terminator}, no made-up reason",
        scenario="cut-after-tokens-fin",
        judge=_explicit_error_after_tokens,
        booked_as_cut=True,
    ),
    GatewayCheck(
        rule="rule 2",
        check="cut-after-tokens-reset",
        title="cut after tokens (reset): an error event, no {terminator}, no made-up reason",
        scenario="cut-after-tokens-reset",
        judge=_explicit_error_after_tokens,
        booked_as_cut=True,
    ),
    GatewayCheck(
        rule="rule 2",
        check="cut-after-tokens-hub-close",
        title="cut after tokens, hub ends cleanly: an error event, no {terminator}, no made-up reason",
        scenario="cut-after-tokens-hub-close",
        judge=_explicit_error_after_tokens,
        booked_as_cut=True,
    ),
    GatewayCheck(
        rule="rule 2",
        check="cut-after-tokens-hub-error-event",
        title="cut after tokens, hub sends an error event: it reaches the client",
        scenario="cut-after-tokens-hub-error-event",
        judge=_explicit_error_after_tokens,
        booked_as_cut=True,
    ),
    GatewayCheck(
        rule="finish reasons",
        check="reason-omitted",
        title="upstream omits {reason}: clients end with {stop}",
        scenario="reason-omitted",
        judge=_finish_reason,
        # A Responses stream has no terminator besides its terminal events, a Gemini stream none
        # besides its finishReason: without one it is cut.
        upstreams=(Dialect.CHAT, Dialect.MESSAGES),
        other_upstreams="a stream without its end sign (a terminal event, a finishReason), a cut: the rule 2 checks cover it (in gemini: no-finish-reason)",
    ),
    GatewayCheck(
        rule="finish reasons",
        check="reason-empty",
        title='upstream sends "{reason}": "": clients end with {stop}',
        scenario="reason-empty",
        judge=_finish_reason,
        upstreams=_ENDED_BY_MORE_THAN_A_REASON,
        other_upstreams=_NO_REASON_IS_A_CUT,
    ),
    GatewayCheck(
        rule="finish reasons",
        check="length-omitted",
        title="max_tokens truncation, reason omitted: clients end with {length}",
        scenario="length-omitted",
        judge=_finish_reason,
        upstreams=_ENDED_BY_MORE_THAN_A_REASON,
        other_upstreams=_NO_REASON_IS_A_CUT,
    ),
    GatewayCheck(
        rule="finish reasons",
        check="tool-calls-omitted",
        title="tool call, reason omitted: clients end with {tool}",
        scenario="tool-calls-omitted",
        judge=_finish_reason,
        upstreams=_ENDED_BY_MORE_THAN_A_REASON,
        other_upstreams=_NO_REASON_IS_A_CUT,
    ),
    GatewayCheck(
        rule="finish reasons",
        check="stop-reason-null",
        title="upstream sends stop_reason null before message_stop: clients end with end_turn",
        scenario="stop-reason-null",
        judge=_finish_reason,
        dialects=(Dialect.MESSAGES,),
    ),
    GatewayCheck(
        rule="rule 2",
        check="close-after-reasoning",
        title="clean close after the reasoning, no terminal event: an error event, no made-up {terminator}",
        scenario="close-after-reasoning",
        judge=_explicit_error_after_tokens,
        booked_as_cut=True,
        dialects=(Dialect.RESPONSES,),
    ),
    GatewayCheck(
        rule="rule 2",
        check="bare-error-frame",
        title='a bare `data: {{"error": ...}}` frame after tokens: it reaches the client as an error',
        scenario="bare-error-frame",
        judge=_explicit_error_after_tokens,
        booked_as_cut=True,
        dialects=(Dialect.MESSAGES, Dialect.RESPONSES),
    ),
    GatewayCheck(
        rule="rule 2",
        check="no-finish-reason",
        title="the stream ends without a finishReason: an error frame, no made-up {stop}",
        scenario="reason-omitted",
        judge=_explicit_error_after_tokens,
        booked_as_cut=True,
        dialects=(Dialect.GEMINI,),
        upstreams=(Dialect.GEMINI,),
        other_upstreams="a stream with its end sign: the finish-reason checks judge it",
    ),
    GatewayCheck(
        rule="stalls",
        check="stall-after-tokens",
        title="stall after tokens: an error before the stall deadline, not a hang",
        scenario="stall-after-tokens",
        judge=_ended_with_error_in_time,
        booked_as_cut=True,
        stall=True,
    ),
)


def judge_run(check: GatewayCheck, run: CheckRun) -> Finding:
    """`check`'s judgement of `run`; when the gateway sent its bytes compressed (the grader asked for
    `accept-encoding: identity`), the clients alone are judged: they can fail the check, but a pass
    needs the bytes, so it is `not tested` and the evidence says why."""
    raw = run.raw
    note = raw.reading.compression_note() if raw is not None and raw.reading is not None else None
    if note is None:
        return check.judge(run)
    mark, evidence = check.judge(CheckRun(results=run.clients(), spare=run.spare, hub=run.hub))
    if mark is Mark.FAIL:
        return mark, f"{evidence}; bytes: {note}"
    return Mark.NOT_TESTED, f"bytes: {note}"


#: Rule 3's row: judged over the requests of every check with `booked_as_cut`.
BOOKS_CHECK = ("rule 3", "cuts-booked-as-errors", "every cut request is an error in the gateway's books")

#: Every row of a gateway card, in card order (the rule 3 row after rule 2).
GATEWAY_CHECK_IDS = tuple(
    [c.check for c in GATEWAY_CHECKS if c.rule in ("baseline", "rule 1", "rule 2")]
    + [BOOKS_CHECK[1]]
    + [c.check for c in GATEWAY_CHECKS if c.rule not in ("baseline", "rule 1", "rule 2")]
)
