"""What a cut sends and books: `RepairPolicy.on_cut` read against what the dialect may say.

A stream that ended before it finished (a clean end too early, a transport failure, a stall) is
booked `interrupted`, with where, how and when, whatever the client is told; the client is told
what `on_cut` says:

    error   the dialect's error ending (rules C6, M4, R3: the rules' `cut_frames`), with the cut's
            message in the dialect's words
    stop    the dialect's finish and terminator (the rules' `stop_frames`): a story, the books
            still say interrupted; a dialect that may not finish what it did not see (Responses'
            `may_stop` is False: no made-up `response.completed`, R2) is told as `error`
    pass    nothing: the client sees the stream end where the upstream's did
"""

from __future__ import annotations

from ._rule_interface import DialectRules, StreamServices
from ._verdict import Interruption, OnCut, Verdict
from ._wording import cut_detail, cut_message

__all__ = ["cut_ending"]


def cut_ending(cut: Interruption, *, rules: DialectRules, stream: StreamServices, elapsed: float | None) -> bytes:
    """Books the cut `cut` (`elapsed` seconds after the request started, if known) and returns the
    frames the client is sent for it."""
    report = stream.report
    report.interruption = cut
    told = stream.policy.on_cut
    if told is OnCut.STOP and not rules.may_stop:
        told = OnCut.ERROR
    # The books stay true whatever the client is told (on_cut=stop tells it a story).
    stream.book_verdict(
        Verdict.INTERRUPTED,
        cut_detail(
            how=cut.how, before_first_token=cut.before_first_token, events=report.events, elapsed=elapsed, on_cut=str(told)
        ),
    )
    if told is OnCut.ERROR:
        message = cut_message(
            cause=str(cut.cause),
            reason=cut.reason,
            before_first_token=cut.before_first_token,
            events=report.events,
            elapsed=elapsed,
            dialect=report.dialect,
        )
        return rules.cut_frames(message)
    if told is OnCut.STOP:
        return rules.stop_frames()
    return b""
