"""The one interface between the repair machine and a dialect's rules, both ways.

Theory of operation
-------------------
The machine (`_repair.StreamRepair`) frames a stream into events, counts them, runs the deadlines
and decides how the stream ends; what an event *means* is the dialect's rules' business
(`_chat.ChatRules`, `_messages.MessagesRules`, `_responses.ResponsesRules`, `_gemini.GeminiRules`,
chosen by the registry `_rules.DIALECT_RULES`). The two meet here and nowhere else:

* `StreamServices` is everything a rules object may use of its stream, handed to its constructor:

    what it may read     `request`, `policy`, `report` (the counts so far), `line_ending()`
    what it may tell     `token_seen()`, `terminated()`, `upstream_error()`, `malformed()`,
                         `cut_here()` (the machine acts on it: the phase, the deadlines, a cut)
    what it may book     `repaired()`, `corrected()`, `repaired_verdict()`, `injected()`,
                         `note_model()`, and the whole stream's facts in `report` at its end
                         (`usage`, `finish_reasons`)

  The machine keeps the same books through it (`book_verdict`, `close`), so a stream has one
  account and one set of words for it.
* `DialectRules` is everything the machine asks of a rules object. A rules class of this shape is
  all a new dialect needs besides its routine shape (`_routine_chunks.SPECS`), a line in
  `_rules.DIALECT_RULES`, and, when its stream is not SSE, a framer in `_rules.DIALECT_FRAMERS`
  (Gemini's JSON array).

Neither side reads the other's private attributes; `tests/test_core_structure.py` holds them to it.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, Protocol

from ._dialect import Dialect
from ._request import RequestFacts
from ._routine_chunks import RoutineMatch
from ._sse import Event, EventFramer
from ._verdict import MALFORMED_OUTRANKS, Correction, Injection, RepairPolicy, StreamReport, Verdict
from ._wording import (
    compressed_body,
    http_error_detail,
    internal_error,
    malformed_detail,
    one_line,
    repaired_detail,
    skipped_detail,
    upstream_error_detail,
    wrong_dialect,
)

__all__ = ["DialectRules", "StreamServices"]


class StreamServices:
    """What a dialect's rules may use of the stream they read, and the stream's books.

    Args:
        request, policy, report: the stream's request facts, repair options and running account.
        started_at: the caller's clock when the request started, if it has one (for the times in
            the books).
        framer: the stream's SSE framer (its `line_ending` is the one every injected frame uses).
        token_seen: the machine's note that the event being read carried a token (rules C7, M6, R5).
        terminated: the machine's move past the end: the dialect's terminator came (`[DONE]`,
            `message_stop`, a terminal Responses event); nothing is injected after it.
        error_event: the machine's move past the end for an upstream error event (rules C5, M5, R4).
        cut_here: the machine's cut at the event being read, for an upstream that ended a stream
            without its terminator while the client still reads (Responses' `[DONE]`, R3); returns
            the frames of the cut.
    """

    # The machine's callables are kept as they were given (a rule calls the bound method itself,
    # no second call in between: `token_seen` runs once per token event on the full path).
    __slots__ = (
        "request",
        "policy",
        "report",
        "keepalives",
        "token_seen",
        "terminated",
        "cut_here",
        "_started_at",
        "_framer",
        "_error_event",
    )

    def __init__(
        self,
        *,
        request: RequestFacts,
        policy: RepairPolicy,
        report: StreamReport,
        started_at: float | None,
        framer: EventFramer,
        token_seen: Callable[[], None],
        terminated: Callable[[], None],
        error_event: Callable[[], None],
        cut_here: Callable[[], bytes],
    ) -> None:
        self.request = request
        self.policy = policy
        self.report = report
        # Keep-alive events (`ping`) so far: not in `report.events`, but a client and mitmweb's view
        # number them, so the number of a malformed event counts them (`malformed`).
        self.keepalives = 0
        self.token_seen = token_seen
        self.terminated = terminated
        self.cut_here = cut_here
        self._started_at = started_at
        self._framer = framer
        self._error_event = error_event

    # -- what the rules may read --------------------------------------------------------------

    def line_ending(self) -> bytes:
        """The stream's own line ending for what finish_fix writes (LF until it showed another)."""
        return self._framer.line_ending or b"\n"

    # -- what the rules may tell --------------------------------------------------------------

    def upstream_error(self, *, label: object, message: object) -> None:
        """The upstream said it failed (an error event, `response.failed`): passed on, nothing is
        injected after it (rules C5, M5, R4)."""
        self._error_event()
        if isinstance(message, bytes):
            message = message.decode("utf-8", "replace")
        self.report.upstream_error_message = one_line(str(message)) if message else None
        self.book_verdict(Verdict.UPSTREAM_ERROR, upstream_error_detail(str(label) if label else None))

    def malformed(self) -> None:
        """The event the rules are reading has data that is not JSON (or not UTF-8): it passes as it
        came (rule C8), and the stream is booked `malformed` when it ends (`close`), naming the
        first such event by its place among the stream's events (keep-alives included, as a client
        dispatches them). Called only for such an event: one that parsed costs nothing here."""
        report = self.report
        report.malformed_events += 1
        if report.first_malformed_event is None:
            report.first_malformed_event = report.events + self.keepalives

    # -- what the rules may book --------------------------------------------------------------

    def note_model(self, model: object) -> None:
        """The model the upstream named, if the request named none."""
        if self.report.model is None and isinstance(model, str):
            self.report.model = model

    def injected(self, injection: Injection) -> None:
        """An event finish_fix wrote into the stream."""
        self.report.injected.append(injection)

    def corrected(self, rule: Correction, what: str | None) -> None:
        """A rule changed an upstream event (C11, M8, R6, R7): counted per rule, and booked as a
        repair in `what`'s words (None: the rule books its words once at the end, R7)."""
        corrections = self.report.corrections
        corrections[rule] = corrections.get(rule, 0) + 1
        if what is None:
            self.repaired_verdict()
        else:
            self.repaired(what)

    def repaired(self, what: str) -> None:
        """A repair, in the words the verdict's detail lists."""
        self.report.repairs.append(what)
        self.repaired_verdict()

    def repaired_verdict(self) -> None:
        """The stream was repaired (unless it is booked as something that outranks it)."""
        if self.report.verdict is Verdict.CLEAN:
            self.report.verdict = Verdict.REPAIRED

    # -- the machine's books ------------------------------------------------------------------

    def elapsed(self, now: float | None) -> float | None:
        """Seconds since the request started, by the caller's clock, if it has one."""
        return now - self._started_at if now is not None and self._started_at is not None else None

    def book_verdict(self, verdict: Verdict, detail: str) -> None:
        """The verdict and its detail, decided (`interrupted`, ...)."""
        self.report.verdict = verdict
        self.report.detail = detail

    def book_not_repaired(self, *, status: int, content_encoding: str) -> bool:
        """Whether a response is passed through from its head on, its verdict decided here: an error
        status (`http_error`), a compressed body (`skipped`: it cannot be read in flight)."""
        encoding = content_encoding.strip().lower()
        if status >= 400:
            self.book_verdict(Verdict.HTTP_ERROR, http_error_detail(status))
        elif encoding not in ("", "identity"):
            self.book_verdict(Verdict.SKIPPED, skipped_detail(compressed_body(encoding)))
        else:
            return False
        return True

    def book_wrong_dialect(self, seen: Dialect) -> None:
        """The first event is `seen`'s, not the path's: passed through untouched, `skipped`."""
        path = self.report.dialect
        self.book_verdict(Verdict.SKIPPED, skipped_detail(wrong_dialect(path_dialect=path, event_dialect=seen)))

    def book_given_up(self, cause: Exception | str) -> None:
        """The machine passes the rest of the stream through (`skipped`, and why: a bug of ours, as
        `internal_error`, or `cause`'s words)."""
        why = cause if isinstance(cause, str) else internal_error(cause)
        if not isinstance(cause, str):
            self.report.internal_error = why
        self.book_verdict(Verdict.SKIPPED, skipped_detail(why, from_event=self.report.events + 1))

    def close(self, now: float | None) -> None:
        """The books at the stream's end (after the rules' `closing_books`): a repaired stream's
        detail lists its repairs; a stream that sent garbage is `malformed` first."""
        report = self.report
        if report.verdict is Verdict.REPAIRED:
            report.detail = repaired_detail(report.repairs)
        if report.first_malformed_event is not None and report.verdict in MALFORMED_OUTRANKS:
            # The client read garbage: that is what the books say first, and what else the stream
            # ended as follows in the detail (its repairs, injections and cut stay as they are).
            report.detail = malformed_detail(
                event=report.first_malformed_event,
                count=report.malformed_events,
                other=None if report.verdict is Verdict.CLEAN else report.detail,
            )
            report.verdict = Verdict.MALFORMED
        if now is not None and self._started_at is not None:
            report.duration = now - self._started_at


class DialectRules(Protocol):
    """What the machine asks of one stream's rules (`_rules.DIALECT_RULES` makes them, one object
    per stream, from its `StreamServices`). Each point is where the machine hands the dialect a
    decision:

    * `read(event)` -> (type, parsed data); `keepalives`: the types that are no event (M6);
    * `on_event(event, type, data)` -> the bytes to send for it (noting tokens, the terminator, an
      upstream error through `StreamServices`);
    * `on_routine(match)` -> what a fast-path piece did (`_routine_chunks.DECLINE`, `NOT_STEADY`,
      `MAY_STEADY`); the machine notes its token itself (a routine piece with text is one);
      `note_sequence_number(n)`: the last number of a numbered shape the steady path took unread
      (a shape with counts, Gemini's: its last piece is matched again and handed to `on_routine`);
    * `finished()`, `terminator(how)`: a clean end that only lacks its terminator (rules C4, M3);
    * `cut_frames(message)`, `stop_frames()`, `may_stop`: what a cut sends (rules C6, M4, R3);
    * `release_held()`: an event held back for a later one (Chat's finish before its usage chunk,
      rule C11), sent as it came when the stream ends or is given up before that;
    * `closing_books()`: what the report says about the whole stream at its end.
    """

    keepalives: frozenset[str]
    may_stop: bool

    def read(self, event: Event) -> tuple[str | None, Any]: ...

    def on_event(self, event: Event, kind: str | None, message: Any) -> bytes: ...

    def on_routine(self, match: RoutineMatch) -> int: ...

    def note_sequence_number(self, number: int) -> None: ...

    def finished(self) -> bool: ...

    def terminator(self, how: str) -> bytes: ...

    def cut_frames(self, message: str) -> bytes: ...

    def stop_frames(self) -> bytes: ...

    def release_held(self) -> bytes: ...

    def closing_books(self) -> None: ...
