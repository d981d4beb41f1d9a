"""OpenAI Responses stream events, byte for byte: one builder per frame, and whole streams.

The worker (`labs.worker.wire.response_plan(..., dialect=Dialect.RESPONSES)`) and the tests' scripted
upstream (`tests/dialect_streams.py`) both build their Responses streams here, so there is one set of
frames. Every frame is `event: <type>` + `data: {"type":"<type>","sequence_number":n,...}`, numbered
from 0 upward by a `ResponsesEvents` (the AI SDK requires `sequence_number`), compact JSON. The shapes
are openai-python's `types/responses/*_event.py` and the AI SDK's `openai-responses-api.ts` schemas.

Grammar of a well-formed stream (developers.openai.com "Responses streaming events")::

    response.created, response.in_progress            (the response, status in_progress, same id)
    per output item, in output_index order:
      reasoning:      output_item.added, reasoning_summary_part.added,
                      reasoning_summary_text.delta*, reasoning_summary_text.done,
                      reasoning_summary_part.done, output_item.done
      message:        output_item.added, content_part.added, output_text.delta*,
                      output_text.done, content_part.done, output_item.done
      function_call:  output_item.added (call_id, name), function_call_arguments.delta*,
                      function_call_arguments.done, output_item.done
    one terminal: response.completed (status completed, the output, usage), or
                  response.incomplete (incomplete_details.reason, e.g. max_output_tokens)

An error ends it with `event: error` (the nested shape first-party OpenAI sends, which openai-python
raises on) and `response.failed` (status failed, `error`).

`response_frames` assembles a stream from `labs.worker.answer.Piece`s; each frame carries the
`ResponsePlan` segment kind it plays: `role` for what opens the response, an item or a part without
a token, `token` for each delta and for a function call's `output_item.added` (it opens the call with
its name, as Chat's first tool-call delta does), `finish` for the `.done` events that close a part or
an item, `error`, and `done` for the terminal event (and a `[DONE]` marker, when asked).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from labs.worker.answer import TOOL_NAME, Block, Piece, blocks_of
from labs.worker.frames import DONE_MARKER, Frame, sse_frame

__all__ = [
    "AS_TERMINAL",
    "CREATED_AT",
    "RESPONSE_ID",
    "TERMINAL_STATUS",
    "ResponsesEvents",
    "function_call_item",
    "item_id",
    "message_item",
    "output_text_part",
    "reasoning_item",
    "response_body",
    "response_frames",
    "response_object",
    "summary_part",
    "usage_object",
]

# The indexes a llama.cpp stream leaves out of every event (`ResponsesEvents(indexes=False)`).
_INDEXES = ("sequence_number", "output_index", "content_index")
#: Every response has the same id and creation time: same settings, same bytes.
RESPONSE_ID = "resp_finishline"
CREATED_AT = 1764000000
#: The `status` each terminal event's response carries when nothing says otherwise.
TERMINAL_STATUS = {"response.completed": "completed", "response.incomplete": "incomplete", "response.failed": "failed"}


class _AsTerminal:
    def __repr__(self) -> str:
        return "AS_TERMINAL"


#: `response_frames(status=AS_TERMINAL)`: the terminal event's own status (`TERMINAL_STATUS`).
AS_TERMINAL: Any = _AsTerminal()

_ITEM_PREFIXES = {"reasoning": "rs", "content": "msg", "tool_call": "fc"}


def item_id(kind: str, output_index: int) -> str:
    """The id of the output item at `output_index` (kind as in `labs.worker.answer.Block`)."""
    return f"{_ITEM_PREFIXES[kind]}_finishline_{output_index}"


# -- the objects the events carry -----------------------------------------------------------------


def response_object(
    *,
    model: str,
    status: str | None,
    output: Sequence[Mapping[str, Any]] = (),
    usage: Mapping[str, Any] | None = None,
    error: Mapping[str, Any] | None = None,
    incomplete_details: Mapping[str, Any] | None = None,
    max_output_tokens: int | None = None,
    response_id: str = RESPONSE_ID,
    created_at: int = CREATED_AT,
) -> dict[str, Any]:
    """The `response` object (openai-python `types/responses/response.py`; its required fields)."""
    return {
        "id": response_id,
        "object": "response",
        "created_at": created_at,
        "status": status,
        "error": dict(error) if error is not None else None,
        "incomplete_details": dict(incomplete_details) if incomplete_details is not None else None,
        "max_output_tokens": max_output_tokens,
        "model": model,
        "output": [dict(item) for item in output],
        "parallel_tool_calls": True,
        "tool_choice": "auto",
        "tools": [],
        "usage": dict(usage) if usage is not None else None,
    }


def usage_object(input_tokens: int, output_tokens: int, reasoning_tokens: int = 0) -> dict[str, Any]:
    return {
        "input_tokens": input_tokens,
        "input_tokens_details": {"cached_tokens": 0},
        "output_tokens": output_tokens,
        "output_tokens_details": {"reasoning_tokens": reasoning_tokens},
        "total_tokens": input_tokens + output_tokens,
    }


def output_text_part(text: str = "") -> dict[str, Any]:
    return {"type": "output_text", "annotations": [], "logprobs": [], "text": text}


def summary_part(text: str = "") -> dict[str, Any]:
    return {"type": "summary_text", "text": text}


def message_item(item: str, *, status: str, text: str | None = None) -> dict[str, Any]:
    """A message item; `text` None: no content part yet (as `output_item.added` carries it)."""
    content = [] if text is None else [output_text_part(text)]
    return {"id": item, "type": "message", "status": status, "content": content, "role": "assistant"}


def reasoning_item(item: str, *, summary: str | None = None) -> dict[str, Any]:
    """A reasoning item; `summary` None: no summary part yet."""
    return {"id": item, "type": "reasoning", "summary": [] if summary is None else [summary_part(summary)]}


def function_call_item(item: str, *, call_id: str, name: str, arguments: str, status: str) -> dict[str, Any]:
    return {"id": item, "type": "function_call", "status": status, "arguments": arguments, "call_id": call_id, "name": name}


def _item(index: int, block: Block, status: str, tool_name: str, *, opened: bool = False) -> dict[str, Any]:
    # `opened`: the item as `output_item.added` announces it (empty); otherwise as it stands with
    # all of its text.
    identifier = item_id(block.kind, index)
    if block.kind == "reasoning":
        return reasoning_item(identifier, summary=None if opened else block.text)
    if block.kind == "content":
        return message_item(identifier, status=status, text=None if opened else block.text)
    return function_call_item(
        identifier, call_id=block.tool_id, name=tool_name, arguments="" if opened else block.text, status=status
    )


# -- numbered frames ------------------------------------------------------------------------------


class ResponsesEvents:
    """Frames Responses events in order, numbering them `first_sequence_number`, +1, +2, ...

    `event(type, fields)` frames any event (unknown types too); the named methods are the ones the
    grammar above uses.
    """

    def __init__(self, *, first_sequence_number: int = 0, line_ending: bytes = b"\n", indexes: bool = True) -> None:
        self.next_sequence_number = first_sequence_number
        self.line_ending = line_ending
        # False: no `sequence_number`, `output_index` or `content_index` on any event (llama.cpp's).
        self.indexes = indexes

    def event(self, event_type: str, fields: Mapping[str, Any]) -> bytes:
        data = {"type": event_type, "sequence_number": self.next_sequence_number, **fields}
        self.next_sequence_number += 1
        if not self.indexes:
            data = {key: value for key, value in data.items() if key not in _INDEXES}
        return sse_frame(data, event=event_type, line_ending=self.line_ending)

    def lifecycle(self, event_type: str, response: Mapping[str, Any]) -> bytes:
        """`response.created`, `.in_progress`, `.completed`, `.incomplete` or `.failed`."""
        return self.event(event_type, {"response": dict(response)})

    def output_item(self, event_type: str, output_index: int, item: Mapping[str, Any]) -> bytes:
        """`response.output_item.added` or `.done`."""
        return self.event(event_type, {"output_index": output_index, "item": dict(item)})

    def content_part(self, event_type: str, item: str, output_index: int, part: Mapping[str, Any]) -> bytes:
        """`response.content_part.added` or `.done` (content index 0)."""
        return self.event(event_type, {"item_id": item, "output_index": output_index, "content_index": 0, "part": dict(part)})

    def output_text_delta(self, item: str, output_index: int, delta: str) -> bytes:
        return self.event(
            "response.output_text.delta",
            {"item_id": item, "output_index": output_index, "content_index": 0, "delta": delta, "logprobs": []},
        )

    def output_text_done(self, item: str, output_index: int, text: str) -> bytes:
        return self.event(
            "response.output_text.done",
            {"item_id": item, "output_index": output_index, "content_index": 0, "text": text, "logprobs": []},
        )

    def summary_part(self, event_type: str, item: str, output_index: int, part: Mapping[str, Any]) -> bytes:
        """`response.reasoning_summary_part.added` or `.done` (summary index 0)."""
        return self.event(event_type, {"item_id": item, "output_index": output_index, "summary_index": 0, "part": dict(part)})

    def summary_text_delta(self, item: str, output_index: int, delta: str) -> bytes:
        return self.event(
            "response.reasoning_summary_text.delta",
            {"item_id": item, "output_index": output_index, "summary_index": 0, "delta": delta},
        )

    def summary_text_done(self, item: str, output_index: int, text: str) -> bytes:
        return self.event(
            "response.reasoning_summary_text.done",
            {"item_id": item, "output_index": output_index, "summary_index": 0, "text": text},
        )

    def arguments_delta(self, item: str, output_index: int, delta: str) -> bytes:
        return self.event(
            "response.function_call_arguments.delta", {"item_id": item, "output_index": output_index, "delta": delta}
        )

    def arguments_done(self, item: str, output_index: int, arguments: str) -> bytes:
        return self.event(
            "response.function_call_arguments.done", {"item_id": item, "output_index": output_index, "arguments": arguments}
        )

    def error(self, error_object: Mapping[str, Any]) -> bytes:
        """`event: error` in first-party OpenAI's nested shape: `{"type":"error","sequence_number":n,
        "error":{"type","code","message","param"}}` (openai-node `ResponseStream.ts`; openai-python
        raises `APIError` on the nested key). `error_object` is `labs.worker.answer.error_object`'s."""
        nested = {key: error_object.get(key) for key in ("type", "code", "message", "param")}
        return self.event("error", {"error": nested})


# -- whole streams --------------------------------------------------------------------------------


def response_frames(
    pieces: Sequence[Piece],
    *,
    model: str,
    input_tokens: int = 0,
    output_tokens: int | None = None,
    terminal: str | None = "response.completed",
    status: Any = AS_TERMINAL,
    incomplete_reason: str = "max_output_tokens",
    error_object: Mapping[str, Any] | None = None,
    send_failed: bool = True,
    bare: bool = False,
    closed: bool = True,
    done_marker: bool = False,
    max_output_tokens: int | None = None,
    response_id: str = RESPONSE_ID,
    created_at: int = CREATED_AT,
    tool_name: str = TOOL_NAME,
    first_sequence_number: int = 0,
    indexes: bool = True,
    line_ending: bytes = b"\n",
) -> list[Frame]:
    """A Responses stream carrying `pieces` (one choice's, in order), then its ending.

    Args:
        output_tokens: the terminal usage's `output_tokens`; default: one per piece.
        terminal: `response.completed`, `response.incomplete` (the last item is then `incomplete`
            and `incomplete_details.reason` is `incomplete_reason`), or None (no terminal event).
        status: the terminal response's `status`; `AS_TERMINAL` (default) is the event's own.
        error_object: end with `event: error` carrying it (an OpenAI error object) right after the
            pieces, then `response.failed` when `send_failed`; `bare` sends one bare
            `data: {"error":...}` frame instead (no `event:`, no sequence number, nothing after).
        closed: False ends right after the last piece: no `.done` event, no terminal.
        done_marker: end with `data: [DONE]` (after the terminal, if any).
        indexes: False leaves `sequence_number`, `output_index` and `content_index` out of every
            event, as llama.cpp does.
    """
    events = ResponsesEvents(first_sequence_number=first_sequence_number, line_ending=line_ending, indexes=indexes)

    def lifecycle(event_type: str, state: str | None, output: list[dict[str, Any]], **fields: Any) -> bytes:
        response = response_object(
            model=model,
            status=state,
            output=output,
            max_output_tokens=max_output_tokens,
            response_id=response_id,
            created_at=created_at,
            **fields,
        )
        return events.lifecycle(event_type, response)

    frames = [
        Frame("role", lifecycle("response.created", "in_progress", [])),
        Frame("role", lifecycle("response.in_progress", "in_progress", [])),
    ]
    blocks = blocks_of(list(pieces))
    finished: list[dict[str, Any]] = []
    for index, block in enumerate(blocks):
        frames += _item_frames(events, index, block, tool_name)
        if index < len(blocks) - 1:
            frames += _item_closing(events, index, block, "completed", tool_name)
            finished.append(_item(index, block, "completed", tool_name))
    if error_object is not None:
        if bare:
            frames.append(Frame("error", sse_frame({"error": dict(error_object)}, line_ending=line_ending)))
            return frames
        frames.append(Frame("error", events.error(error_object)))
        if send_failed:
            partial = [_item(len(blocks) - 1, blocks[-1], "incomplete", tool_name)] if blocks else []
            failure = {"code": error_object.get("code") or "server_error", "message": error_object.get("message")}
            frames.append(Frame("done", lifecycle("response.failed", "failed", finished + partial, error=failure)))
        return frames
    if not closed:
        return frames
    if blocks:
        last = "incomplete" if terminal == "response.incomplete" else "completed"
        frames += _item_closing(events, len(blocks) - 1, blocks[-1], last, tool_name)
        finished.append(_item(len(blocks) - 1, blocks[-1], last, tool_name))
    if terminal is not None:
        used = len(pieces) if output_tokens is None else output_tokens
        reasoning = sum(1 for p in pieces if p.kind == "reasoning")
        details = {"reason": incomplete_reason} if terminal == "response.incomplete" else None
        state = TERMINAL_STATUS[terminal] if status is AS_TERMINAL else status
        frames.append(
            Frame(
                "done",
                lifecycle(
                    terminal, state, finished, usage=usage_object(input_tokens, used, reasoning), incomplete_details=details
                ),
            )
        )
    if done_marker:
        frames.append(Frame("done", sse_frame(DONE_MARKER, line_ending=line_ending)))
    return frames


def _item_frames(events: ResponsesEvents, index: int, block: Block, tool_name: str) -> list[Frame]:
    identifier = item_id(block.kind, index)
    added = events.output_item("response.output_item.added", index, _item(index, block, "in_progress", tool_name, opened=True))
    if block.kind == "tool_call":
        return [Frame("token", added)] + [
            Frame("token", events.arguments_delta(identifier, index, p.text)) for p in block.pieces[1:]
        ]
    if block.kind == "reasoning":
        part = events.summary_part("response.reasoning_summary_part.added", identifier, index, summary_part())
        deltas = [events.summary_text_delta(identifier, index, p.text) for p in block.pieces]
    else:
        part = events.content_part("response.content_part.added", identifier, index, output_text_part())
        deltas = [events.output_text_delta(identifier, index, p.text) for p in block.pieces]
    return [Frame("role", added), Frame("role", part)] + [Frame("token", delta) for delta in deltas]


def _item_closing(events: ResponsesEvents, index: int, block: Block, status: str, tool_name: str) -> list[Frame]:
    identifier = item_id(block.kind, index)
    if block.kind == "tool_call":
        closing = [events.arguments_done(identifier, index, block.text)]
    elif block.kind == "reasoning":
        closing = [
            events.summary_text_done(identifier, index, block.text),
            events.summary_part("response.reasoning_summary_part.done", identifier, index, summary_part(block.text)),
        ]
    else:
        closing = [
            events.output_text_done(identifier, index, block.text),
            events.content_part("response.content_part.done", identifier, index, output_text_part(block.text)),
        ]
    closing.append(events.output_item("response.output_item.done", index, _item(index, block, status, tool_name)))
    return [Frame("finish", frame) for frame in closing]


# -- the non-streaming response -------------------------------------------------------------------


def response_body(
    pieces: Sequence[Piece],
    *,
    model: str,
    status: str | None,
    input_tokens: int = 0,
    output_tokens: int | None = None,
    incomplete_reason: str | None = None,
    error: Mapping[str, Any] | None = None,
    max_output_tokens: int | None = None,
    tool_name: str = TOOL_NAME,
) -> dict[str, Any]:
    """The JSON `response` (`stream` false) carrying `pieces`: the same items as the stream's
    terminal event. `incomplete_reason` marks the last item `incomplete` and fills
    `incomplete_details`; `error` (`{"code","message"}`) goes in `error` (status `failed`)."""
    blocks = blocks_of(list(pieces))
    items = []
    for index, block in enumerate(blocks):
        cut = index == len(blocks) - 1 and (incomplete_reason is not None or error is not None)
        items.append(_item(index, block, "incomplete" if cut else "completed", tool_name))
    used = len(pieces) if output_tokens is None else output_tokens
    reasoning = sum(1 for p in pieces if p.kind == "reasoning")
    return response_object(
        model=model,
        status=status,
        output=items,
        usage=usage_object(input_tokens, used, reasoning),
        error=error,
        incomplete_details={"reason": incomplete_reason} if incomplete_reason is not None else None,
        max_output_tokens=max_output_tokens,
    )
