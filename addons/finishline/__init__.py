"""finishline's sans-IO repair core: standard library only, no clock, no sockets.

It lives next to `addons/finish_fix.py` so that `mitmdump -s addons/finish_fix.py` finds it with a
stock mitmproxy install (mitmproxy puts the script's folder on sys.path); the tests and the lab import
the same module under the same name.
"""

from ._completion import repair_completion
from ._errors import LocalProtocolError
from ._inference import infer_finish_reason
from ._repair import MAX_HELD_BYTES, FailureOutput, StreamRepair
from ._request import RequestFacts
from ._sse import Event, EventFramer
from ._transcript import looks_like_chat_stream, transcribe_chat_stream
from ._verdict import CutCause, Interruption, OnCut, RepairPolicy, StreamReport, Verdict

__all__ = [
    "CutCause",
    "Event",
    "FailureOutput",
    "MAX_HELD_BYTES",
    "EventFramer",
    "Interruption",
    "LocalProtocolError",
    "OnCut",
    "RepairPolicy",
    "RequestFacts",
    "StreamRepair",
    "StreamReport",
    "Verdict",
    "infer_finish_reason",
    "looks_like_chat_stream",
    "transcribe_chat_stream",
    "repair_completion",
]
