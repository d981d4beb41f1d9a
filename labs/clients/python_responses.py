"""The Python drivers of the OpenAI Responses dialect (`POST <base>/responses`): openai-python raw
and with its `responses.stream()` helper, and LangChain's `ChatOpenAI(use_responses_api=True)`.
Same contract as the Chat drivers (labs/clients/python_drivers.py): feed the sink what the
application saw, return the reason as the library surfaced it, let the library's exception out.

The reason word of a Responses stream is its response's `status` (`completed`, `failed`, ...),
or the `incomplete_details.reason` of an `incomplete` one (`max_output_tokens`, ...): the
`finish_reason` a Responses application acts on. The raw drivers take it from the terminal
events only (`response.completed`, `response.incomplete`, `response.failed`): a stream without one
surfaces None, as a raw reader that waits for one sees it.

The lab's request line is Chat-shaped; here its `messages` become `input` (the same role/content
items are valid Responses input), `max_tokens` becomes `max_output_tokens`, and tools lose their
`function` wrapper.
"""

from __future__ import annotations

from typing import Any

from labs.clients import LAB_API_KEY
from labs.clients.python_sink import Driver, Sink, read_langchain_stream

__all__ = ["RESPONSES_DRIVERS", "responses_reason"]

#: The events that end a Responses stream with a response object.
_TERMINAL_RESPONSE_EVENTS = frozenset({"response.completed", "response.incomplete", "response.failed"})
#: Reasoning text: the summary (OpenAI's reasoning models) and the raw text (open-weight servers).
_REASONING_DELTAS = frozenset({"response.reasoning_summary_text.delta", "response.reasoning_text.delta"})


def responses_reason(status: str | None, incomplete_details: Any) -> str | None:
    """The reason word for a response with this `status` and `incomplete_details` (object or dict)."""
    if status == "incomplete" and incomplete_details is not None:
        reason = incomplete_details.get("reason") if isinstance(incomplete_details, dict) else incomplete_details.reason
        if reason:
            return reason
    return status


def responses_body(request: dict) -> dict[str, Any]:
    """The Responses request body for the lab's request line (without `stream`)."""
    body: dict[str, Any] = {"model": request["model"], "input": request["messages"]}
    if request.get("max_tokens"):
        body["max_output_tokens"] = request["max_tokens"]
    if request.get("tools"):
        body["tools"] = [
            {
                "type": "function",
                "name": tool["function"]["name"],
                "description": tool["function"].get("description", ""),
                "parameters": tool["function"].get("parameters") or {"type": "object"},
            }
            for tool in request["tools"]
        ]
    return body


def _read_text(event: Any, sink: Sink) -> None:
    """One Responses event's text or reasoning piece into the sink (both openai-python drivers)."""
    if event.type == "response.output_text.delta":
        sink.add_text(event.delta)
    elif event.type in _REASONING_DELTAS:
        sink.add_reasoning(event.delta)


def _read_tool_call(event: Any, sink: Sink) -> None:
    """One Responses event's tool-call piece into the sink: a `function_call` item's opening
    names it, `function_call_arguments.delta` events add pieces, by output index."""
    if event.type == "response.output_item.added" and event.item.type == "function_call":
        sink.add_tool_call(event.output_index, event.item.name, event.item.arguments)
    elif event.type == "response.function_call_arguments.delta":
        sink.add_tool_call(event.output_index, None, event.delta)


def _client(request: dict) -> Any:
    import openai

    return openai.AsyncOpenAI(base_url=request["base_url"], api_key=request.get("api_key") or LAB_API_KEY)


async def openai_python_responses(request: dict, sink: Sink) -> str | None:
    """openai-python's raw `responses.create(stream=True)` (openai/_streaming.py: a data event with
    a top-level `error` key raises `APIError`; the flat `error` event and `response.failed` are
    yielded like any event; the end of the body ends the iteration)."""
    finish_reason = None
    async with _client(request) as client:
        stream = await client.responses.create(**responses_body(request), stream=True)
        async for event in stream:
            _read_text(event, sink)
            _read_tool_call(event, sink)
            if event.type in _TERMINAL_RESPONSE_EVENTS:
                finish_reason = responses_reason(event.response.status, event.response.incomplete_details)
                sink.note_response(event.response.model, event.response.usage)
    return finish_reason


async def openai_python_responses_helper(request: dict, sink: Sink) -> str | None:
    """openai-python's `responses.stream()` and `get_final_response()`
    (openai/lib/streaming/responses/_responses.py: the final response is set by
    `response.completed` only; without one `get_final_response()` raises `RuntimeError`). Tool
    calls come from the final response's `function_call` items."""
    async with _client(request) as client:
        async with client.responses.stream(**responses_body(request)) as stream:
            async for event in stream:
                _read_text(event, sink)
            response = await stream.get_final_response()
    for index, item in enumerate(response.output):
        if item.type == "function_call":
            sink.add_tool_call(index, item.name, item.arguments)
    return responses_reason(response.status, response.incomplete_details)


async def langchain_openai_responses(request: dict, sink: Sink) -> str | None:
    """LangChain's `ChatOpenAI(use_responses_api=True).astream`
    (langchain_openai/chat_models/base.py `_convert_responses_chunk_to_generation_chunk`: the last
    chunk, from `response.completed`/`.incomplete`, carries the response's `status` and
    `incomplete_details` in `response_metadata`; `response.failed` and `error` raise `ValueError`)."""
    from langchain_openai import ChatOpenAI

    model = ChatOpenAI(
        model=request["model"],
        base_url=request["base_url"],
        # pydantic turns the string into the field's SecretStr; the annotation is the validated type.
        api_key=request.get("api_key") or LAB_API_KEY,  # type: ignore[arg-type]
        streaming=True,
        use_responses_api=True,
        **({"max_tokens": request["max_tokens"]} if request.get("max_tokens") else {}),
    )
    return await read_langchain_stream(model, request, sink, _langchain_reason)


def _langchain_reason(metadata: dict) -> str | None:
    status = metadata.get("status")
    return None if status is None else responses_reason(status, metadata.get("incomplete_details"))


RESPONSES_DRIVERS: dict[str, Driver] = {
    "openai-python": openai_python_responses,
    "openai-python-helper": openai_python_responses_helper,
    "langchain": langchain_openai_responses,
}
