"""A response's stream callable, carrying finish_fix's state for that flow.

mitmproxy calls `flow.response.stream` with each piece of the body; this object runs the pieces
through the repair core and keeps the bounded copy of what the client was sent. It is also the
flow's `CutHandler`: the cut hook finds it on the flow to hand it mid-body failures and stall timers.
The state lives on the flow, not on the addon instance, and this module is in the package, which
mitmproxy does not re-import on a hot reload of the addon's script: a flow that is streaming while the script
reloads is still repaired, cut, timed and booked by the new instance.
"""

from __future__ import annotations

import logging
import time
from typing import TYPE_CHECKING

from mitmproxy import http

from finishline import (
    Booking,
    ClientEnding,
    CutCause,
    Dialect,
    GeminiBody,
    NoHeadAnswer,
    RepairPolicy,
    RequestFacts,
    StreamRepair,
    Verdict,
    answer_no_head,
    head_deadline,
    repair_gemini_body,
)
from finishline.addon.books import BodyCopy
from finishline.addon.cut_hook import CutHandler, HeadWatch, WholeBodyWatch

if TYPE_CHECKING:
    from finishline.addon.metrics import StreamMetrics

__all__ = ["ClientStream", "GeminiBodyWait", "HeadWait", "stream_of"]

logger = logging.getLogger(__name__)
_clock = time.time  # looked up once: the callable reads it for every piece


class ClientStream(CutHandler):
    """The stream callable of one flow in finish_fix's scope.

    Args:
        repair: the repair machine (it passes through, with its verdict, what it must not repair).
        copy: the bounded copy of what the client was sent.
    """

    __slots__ = ("repair", "copy", "in_flight", "_copy_pending", "_copy_block", "_logged")

    def __init__(self, repair: StreamRepair, copy: BodyCopy) -> None:
        super().__init__()
        self.repair = repair
        self.copy = copy
        # The copy's buffer, appended to inline (BodyCopy says how); None when nothing is kept.
        self._copy_pending = copy.pending if copy.limit else None
        self._copy_block = copy.block
        self._logged = False
        #: The metrics that count this stream in flight until its books close (None: none do).
        self.in_flight: StreamMetrics | None = None

    @property
    def called(self) -> bool:
        """Whether mitmproxy streamed the body through this callable: it then ends every streamed
        body with b"", and the repair has ended."""
        return self.repair.ended

    def __call__(self, data: bytes) -> list[bytes]:
        """Must never raise (mitmproxy would drop the piece and corrupt the client's body) and never
        return b"" mid-stream (on HTTP/1.1 that is written as the chunked terminator)."""
        # This runs for every piece of every stream: locals, one clock read and the books' count
        # before the call (what `give_up` books from after a bug), nothing more.
        repair = self.repair
        upstream_bytes = repair.report.upstream_bytes
        try:
            out = repair.receive_data(data, now=_clock()) if data else repair.receive_end(now=_clock())
        except Exception as error:
            # A bug of ours on the fast path, or misuse (data after the end): pass on what the
            # repair held, then the piece, both booked, and stop repairing.
            out = repair.give_up(error, data, upstream_bytes)
        if repair.report.internal_error:
            self.log_internal_error_once()
        if out:
            pending = self._copy_pending
            if pending is not None:
                pending.append(out)
                copy = self.copy
                copy.held += len(out)
                if copy.held >= self._copy_block:
                    copy.seal()
            return [out]
        return []

    def finish_unstreamed(self) -> bytes:
        """For a response mitmproxy never streamed (an empty body: Content-Length 0, or HTTP/2
        headers that end the stream): the bytes the repair adds at the end (rule C7)."""
        if self.repair.ended:
            return b""
        out = self.repair.receive_end(now=time.time())
        self.copy.add(out)
        return out

    # -- CutHandler ---------------------------------------------------------------------------

    def on_upstream_failure(self, message: str) -> ClientEnding | None:
        if self.repair.ended:
            return None
        ending = self.repair.receive_failure(message, now=time.time())
        self.log_internal_error_once()
        self.copy.add(ending.client_bytes)
        return ending

    def next_stall_check(self, now: float) -> float | None:
        return self.repair.next_stall_check(now)

    def on_timer(self, now: float) -> ClientEnding | None:
        if self.repair.ended:
            return None
        ending = self.repair.receive_timer(now)
        if ending is not None:
            self.log_internal_error_once()
            self.copy.add(ending.client_bytes)
        return ending

    def on_client_gone(self, message: str) -> None:
        if not self.repair.ended:
            self.repair.receive_client_gone(message, now=time.time())

    def log_internal_error_once(self) -> None:
        if self.repair.report.internal_error and not self._logged:
            self._logged = True
            logger.error(f"finish_fix: {self.repair.report.detail}")


class HeadWait(HeadWatch):
    """A request in finish_fix's scope, from the moment it went upstream until its response head:
    the first-token deadline's first stretch (`finishline.head_deadline`). When it passes first,
    the client gets the core's answer (`finishline.answer_no_head`: HTTP 504 and the dialect's
    error body), kept here for the books.

    Args:
        dialect: the request's, by its path.
        policy: the policy in force when the request went upstream (its first-token deadline).
        request: what the request body said.
        started_at: when the request started (the books' duration).
    """

    __slots__ = ("dialect", "policy", "request", "started_at", "answer")

    def __init__(self, dialect: Dialect, policy: RepairPolicy, request: RequestFacts, started_at: float) -> None:
        super().__init__()
        self.dialect = dialect
        self.policy = policy
        self.request = request
        self.started_at = started_at
        #: What the client was answered, once the deadline passed without a head.
        self.answer: NoHeadAnswer | None = None

    def next_head_check(self, now: float) -> float | None:
        # Not later than one idle timeout from now: then the head timer is due before the stream's
        # first stall check, and the cut hook lets it be that check once the head came, so that a
        # short stream costs mitmproxy one timer, not two (`HeadWatch.serves_stall`).
        deadline = self._deadline()
        if deadline is None or self.policy.idle_timeout <= 0:
            return deadline
        return min(deadline, now + self.policy.idle_timeout)

    def _deadline(self) -> float | None:
        return None if self.sent_at is None else head_deadline(self.policy, sent_at=self.sent_at)

    def on_head_timer(self, now: float) -> http.Response | None:
        at = self._deadline()
        if at is None or now < at or self.answer is not None:
            return None
        self.answer = answer = answer_no_head(
            dialect=self.dialect, timeout=self.policy.first_token_timeout, request=self.request, elapsed=now - self.started_at
        )
        return http.Response.make(answer.status, answer.body, {"content-type": answer.content_type})


class GeminiBodyWait(WholeBodyWatch):
    """A whole Gemini `:generateContent` body mitmproxy is buffering, judged by the core's rule G6
    when it ends (`judge`) or when the upstream dies before its end (`on_body_cut`: shorter than
    its Content-Length, a reset), where the client gets the core's answer (HTTP 503 and Gemini's
    error body) instead of mitmproxy's 502. The answer is kept for the books (`booking`).

    Args:
        request: what the request said (its path too: `finishline.gemini_request_facts`).
        policy: the policy in force when the head came (`limit_reasons`, G7).
        status: the response's status.
        content_length: the response's Content-Length, if it had one.
        content_encoding: the response's content coding ("" for none).
    """

    __slots__ = ("request", "policy", "status", "content_length", "content_encoding", "answer")

    def __init__(
        self, request: RequestFacts, policy: RepairPolicy, *, status: int, content_length: int | None, content_encoding: str
    ) -> None:
        self.request = request
        self.policy = policy
        self.status = status
        self.content_length = content_length
        self.content_encoding = content_encoding
        #: What the client was sent, once judged.
        self.answer: GeminiBody | None = None

    @classmethod
    def of(cls, response: http.Response, request: RequestFacts, policy: RepairPolicy) -> GeminiBodyWait:
        """The wait for `response`, from its head."""
        length = response.headers.get("content-length", "")
        encoding = response.headers.get("content-encoding", "").strip().lower()
        return cls(
            request,
            policy,
            status=response.status_code,
            content_length=int(length) if length.isdigit() else None,
            content_encoding="" if encoding == "identity" else encoding,
        )

    def judge(self, body: bytes, *, cut: bool) -> GeminiBody:
        """The core's answer for the body as it came (`cut`: the upstream died before its end,
        however long it said it was: a body with no length is one byte short all the same)."""
        expected = self.content_length
        if cut:
            expected = max(expected or 0, len(body) + 1)
        self.answer = repair_gemini_body(
            body,
            status=self.status,
            limit_reasons=self.policy.limit_reasons,
            max_tokens=self.request.max_tokens,
            expected_length=expected,
            content_encoding=self.content_encoding,
        )
        return self.answer

    def on_body_cut(self, body: bytes, message: str) -> http.Response | None:
        answer = self.judge(body, cut=True)
        if answer.verdict is not Verdict.INTERRUPTED:  # an error status, a compressed body: mitmproxy's way
            self.answer = None
            return None
        return http.Response.make(answer.status, answer.body, {"content-type": "application/json; charset=UTF-8"})

    def booking(self, answer: GeminiBody) -> Booking:
        cut = answer.verdict is Verdict.INTERRUPTED
        return Booking(
            verdict=answer.verdict,
            detail=answer.detail,
            model=self.request.model,
            dialect=Dialect.GEMINI,
            client_bytes=len(answer.body),
            repairs=answer.repairs,
            corrections=answer.corrections,
            cause=CutCause.TRANSPORT_ERROR if cut else None,
        )


def stream_of(flow: http.HTTPFlow) -> ClientStream | None:
    """The flow's ClientStream, if finish_fix attached one."""
    stream = flow.response.stream if flow.response is not None else None
    return stream if isinstance(stream, ClientStream) else None
