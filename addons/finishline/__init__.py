"""finishline's sans-IO repair core: standard library only, no clock, no sockets.

It lives next to `addons/finish_fix.py` so that `mitmdump -s addons/finish_fix.py` finds it with a
stock mitmproxy install (mitmproxy puts the script's folder on sys.path); the tests and the lab import
the same module under the same name. The package also holds what is installed with the core, none of
which this module imports: the mitmproxy addon (`finishline.addon`), the console commands
(`finishline.commands`) and the pytest plugin (`finishline.pytest_plugin`).

Using it (one `StreamRepair` per response; it also serves as a judge of a server's streams)::

    repair = StreamRepair(request=RequestFacts.from_body(request_body), policy=RepairPolicy())
    for piece in upstream_body_pieces:           # any split: TCP reads, HTTP chunks, single bytes
        send(repair.receive_data(piece))         # bytes to forward now (often the piece itself)
    send(repair.receive_end())                   # the body ended cleanly: anything left to append
    # or, when the transport failed mid-body:
    ending = repair.receive_failure("connection reset")   # ClientEnding(client_bytes, end_response)
    repair.report.verdict                        # Verdict.CLEAN / REPAIRED / INTERRUPTED / ...
    repair.report.detail                         # one line saying what happened and what was changed

Times are optional: pass `started_at=` and `now=` from your own clock for durations. Stall deadlines
(`RepairPolicy(idle_timeout=..., first_token_timeout=...)`) need them: call `next_stall_check(now)`
for when to look again and `receive_timer(now)` then; it returns a `ClientEnding` once the upstream
stalled. The first-token deadline counts from the request going upstream (`sent_at=`): when no
response head came by `head_deadline(policy, sent_at=...)`, `answer_no_head` is what the client gets. `receive_*` never raises on what the upstream sent; calling it after the end raises
`LocalProtocolError`. `repair_completion` does the same for a whole, non-streaming body.
`StreamErrorWriter` gives a relay that is not finish_fix (the lab's hub) the error ending finish_fix
writes for a cut, in the stream's dialect, with the relay's own message and code.
"""

from ._completion import CompletionRepair, repair_completion
from ._deadlines import head_deadline
from ._dialect import Dialect
from ._error_ending import StreamErrorWriter
from ._errors import LocalProtocolError
from ._gemini import NO_REASONS as GEMINI_NO_REASONS
from ._gemini import GeminiBody, is_stream_path, repair_gemini_body
from ._gemini import request_facts as gemini_request_facts
from ._inference import infer_finish_reason
from ._injected import sse_event
from ._json_array import ArrayPiece, GeminiFramer
from ._no_head import NO_HEAD_STATUS, NoHeadAnswer, answer_no_head
from ._numbers import NumberRefused, read_number
from ._repair import MAX_HELD_BYTES, StreamRepair
from ._request import RequestFacts
from ._shape_book import ShapeBook
from ._sse import Event, EventFramer
from ._transcript import looks_like_chat_stream, stream_dialect, transcribe_chat_stream, transcribe_stream
from ._verdict import (
    MALFORMED_OUTRANKS,
    Booking,
    ClientEnding,
    Correction,
    CutCause,
    Injection,
    InjectionKind,
    Interruption,
    OnCut,
    RepairPolicy,
    StreamReport,
    TokenUsage,
    Verdict,
    book_missing_response,
)

__all__ = [
    "ArrayPiece",
    "Booking",
    "ClientEnding",
    "CompletionRepair",
    "Correction",
    "CutCause",
    "Dialect",
    "GEMINI_NO_REASONS",
    "Event",
    "EventFramer",
    "GeminiBody",
    "GeminiFramer",
    "Injection",
    "InjectionKind",
    "Interruption",
    "LocalProtocolError",
    "MALFORMED_OUTRANKS",
    "MAX_HELD_BYTES",
    "NO_HEAD_STATUS",
    "NoHeadAnswer",
    "NumberRefused",
    "OnCut",
    "RepairPolicy",
    "RequestFacts",
    "ShapeBook",
    "StreamRepair",
    "StreamErrorWriter",
    "StreamReport",
    "TokenUsage",
    "Verdict",
    "answer_no_head",
    "book_missing_response",
    "head_deadline",
    "gemini_request_facts",
    "infer_finish_reason",
    "is_stream_path",
    "looks_like_chat_stream",
    "read_number",
    "repair_completion",
    "repair_gemini_body",
    "sse_event",
    "stream_dialect",
    "transcribe_chat_stream",
    "transcribe_stream",
]
