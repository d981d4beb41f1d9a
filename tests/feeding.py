"""Feeding the repair core the way the network would: whole, a byte at a time, at random splits."""

from __future__ import annotations

import json
import random

from finishline import Dialect, EventFramer, RepairPolicy, RequestFacts, StreamRepair, sse_event

CHUNKINGS = ("whole", "bytewise", "random")


def split(data: bytes, chunking: str, seed: int = 0) -> list[bytes]:
    if chunking == "whole":
        return [data] if data else []
    if chunking == "bytewise":
        return [data[i : i + 1] for i in range(len(data))]
    rng = random.Random(seed)
    pieces, position = [], 0
    while position < len(data):
        size = rng.randint(1, 40)
        pieces.append(data[position : position + size])
        position += size
    return pieces


def run(
    upstream: bytes,
    chunking: str = "whole",
    *,
    end: str = "clean",
    request: RequestFacts = RequestFacts(),
    policy: RepairPolicy = RepairPolicy(),
    dialect: Dialect = Dialect.CHAT,
) -> tuple[bytes, StreamRepair]:
    """Feeds `upstream` and ends it (`end`: "clean", "failure" or "open"); returns what the client
    was sent and the machine (for its report)."""
    repair = StreamRepair(request=request, policy=policy, dialect=dialect)
    out = b"".join(repair.receive_data(piece) for piece in split(upstream, chunking))
    if end == "clean":
        out += repair.receive_end()
    elif end == "failure":
        out += repair.receive_failure("peer reset").client_bytes
    return out, repair


#: `chunk(finish_reason=OMITTED)`: the choice has no `finish_reason` key at all (servers that leave it out).
OMITTED = object()


def chunk(content=None, *, index=0, finish_reason=None, delta=None, usage=None, choices=None, **extra) -> dict:
    """A chat.completion.chunk like OpenAI's (`extra` sets or overrides top-level keys: `id`, `model`, ...)."""
    body = {"id": "chatcmpl-1", "object": "chat.completion.chunk", "created": 1700000000, "model": "m1", **extra}
    if choices is None:
        if delta is None:
            delta = {} if content is None else {"content": content}
        choices = [{"index": index, "delta": delta}]
        if finish_reason is not OMITTED:
            choices[0]["finish_reason"] = finish_reason
    body["choices"] = choices
    if usage is not None:
        body["usage"] = usage
    return body


def sse(*events, ending: bytes = b"\n", space: bool = True) -> bytes:
    """Frames dicts (as JSON) and bytes (as is) as `data:` events."""
    # The core's one writer; JSON as `json.dumps` spaces it (not compact: an upstream's own style),
    # and `data:` without the space when asked (legal SSE that some servers send).
    out = [sse_event(event if isinstance(event, bytes) else json.dumps(event).encode(), ending) for event in events]
    return b"".join(out if space else [frame.replace(b"data: ", b"data:", 1) for frame in out])


def complete_events(body: bytes) -> list[str]:
    """The `data` of each complete SSE event in `body`, as an SSE client dispatches them: framed by
    the core's `EventFramer` (any line ending, `data:` with or without the space, several `data:`
    lines joined with LF); an event without data (a comment, a keep-alive) is none, and an event
    with no blank line after it is incomplete and left out."""
    return [event.data.decode() for event in EventFramer().receive_data(body) if event.data is not None]


def data_events(stream: bytes) -> list:
    """The data of each event the way openai-python reads it: JSON decoded, [DONE] as the string."""
    return ["[DONE]" if data.startswith("[DONE]") else json.loads(data) for data in complete_events(stream)]
