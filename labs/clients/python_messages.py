"""The Python drivers of the Anthropic Messages dialect (`POST <base>/messages`): anthropic-python
raw and with its `messages.stream()` helper, and LangChain's `ChatAnthropic`. Same contract as the
Chat drivers (labs/clients/python_drivers.py): feed the sink what the application saw, return the
library's `stop_reason` as it surfaced it, let the library's exception out.

The request line is the lab's (Chat-shaped `messages` and `tools`, the same `base_url` as for
Chat); what the Messages API wants differently is adapted here: the root without `/v1`, tools as
`{name, description, input_schema}`, system text as `system`, and a `max_tokens`, which the API
requires.
"""

from __future__ import annotations

import json
from typing import Any

from labs.clients import DEFAULT_MAX_TOKENS, LAB_API_KEY
from labs.clients.python_sink import Driver, Sink, read_langchain_stream

__all__ = ["MESSAGES_DRIVERS", "anthropic_root"]


def anthropic_root(base_url: str) -> str:
    """The lab's API root (`http://host:port/prefix/v1`) as the Anthropic SDKs want it: they append
    `/v1/messages` themselves (anthropic/resources/messages/messages.py, @anthropic-ai/sdk
    resources/messages/messages.mjs `post('/v1/messages')`), so the root loses its `/v1`.

    Raises:
        ValueError: the URL does not end in `/v1`: no root would make these SDKs hit `<base>/messages`.
    """
    root = base_url.rstrip("/")
    if not root.endswith("/v1"):
        raise ValueError(f"the Anthropic SDKs append /v1/messages to their base URL; {base_url!r} does not end in /v1")
    return root.removesuffix("/v1")


def messages_body(request: dict) -> dict[str, Any]:
    """The Messages request body for the lab's request line (without `stream`)."""
    system = [m["content"] for m in request["messages"] if m.get("role") == "system"]
    body: dict[str, Any] = {
        "model": request["model"],
        "messages": [m for m in request["messages"] if m.get("role") != "system"],
        "max_tokens": request.get("max_tokens") or DEFAULT_MAX_TOKENS,
    }
    if system:
        body["system"] = "\n".join(system)
    if request.get("tools"):
        body["tools"] = [
            {
                "name": tool["function"]["name"],
                "description": tool["function"].get("description", ""),
                "input_schema": tool["function"].get("parameters") or {"type": "object"},
            }
            for tool in request["tools"]
        ]
    return body


def _client(request: dict) -> Any:
    import anthropic

    return anthropic.AsyncAnthropic(base_url=anthropic_root(request["base_url"]), api_key=request.get("api_key") or LAB_API_KEY)


async def anthropic_python(request: dict, sink: Sink) -> str | None:
    """anthropic-python's raw `messages.create(stream=True)`: an `AsyncStream` of the wire events
    (anthropic/_streaming.py: frames without `event:` are skipped, `event: error` raises
    `APIStatusError`, the end of the body ends the iteration whatever came before). The reason is
    the last non-null `message_delta.delta.stop_reason`; tool calls are each `tool_use` block's
    name and its `input_json_delta` pieces, as received."""
    finish_reason = None
    async with _client(request) as client:
        stream = await client.messages.create(**messages_body(request), stream=True)
        async for event in stream:
            if event.type == "message_start":
                sink.note_response(event.message.model, event.message.usage)
            elif event.type == "message_delta":
                sink.note_response(None, event.usage)
            if event.type == "content_block_start":
                block = event.content_block
                if block.type == "tool_use":
                    sink.add_tool_call(event.index, block.name, None)
                elif block.type == "text":
                    sink.add_text(block.text)
                elif block.type == "thinking":
                    sink.add_reasoning(block.thinking)
            elif event.type == "content_block_delta":
                delta = event.delta
                if delta.type == "text_delta":
                    sink.add_text(delta.text)
                elif delta.type == "thinking_delta":
                    sink.add_reasoning(delta.thinking)
                elif delta.type == "input_json_delta":
                    sink.add_tool_call(event.index, None, delta.partial_json)
            elif event.type == "message_delta" and event.delta.stop_reason is not None:
                finish_reason = event.delta.stop_reason
    return finish_reason


async def anthropic_python_helper(request: dict, sink: Sink) -> str | None:
    """anthropic-python's `messages.stream()` and `get_final_message()`, the way an application
    that wants the assembled message uses it (anthropic/lib/streaming/_messages.py: only a
    `message_delta` sets the snapshot's `stop_reason`; the final message is the snapshot, whatever
    ended the stream). Text and thinking come from the helper's `text`/`thinking` events; tool
    calls from the final message's `tool_use` blocks (their `input` parsed as far as it came)."""
    async with _client(request) as client:
        async with client.messages.stream(**messages_body(request)) as stream:
            async for event in stream:
                if event.type == "text":
                    sink.add_text(event.text)
                elif event.type == "thinking":
                    sink.add_reasoning(event.thinking)
            message = await stream.get_final_message()
    for index, block in enumerate(message.content):
        if block.type == "tool_use":
            sink.add_tool_call(index, block.name, json.dumps(block.input))
    return message.stop_reason


async def langchain_anthropic(request: dict, sink: Sink) -> str | None:
    """LangChain's `ChatAnthropic.astream` (langchain_anthropic/chat_models.py
    `_make_message_chunk_from_anthropic_event`: a `message_delta` puts its `stop_reason` in the
    chunk's `response_metadata`; content is a string or a list of text/thinking blocks)."""
    from langchain_anthropic import ChatAnthropic

    # `model` and `max_tokens` are the field names (`populate_by_name=True`); a type checker only
    # knows the aliases (`model_name`, `max_tokens_to_sample`). pydantic turns the api_key string
    # into the field's SecretStr; the annotation is the validated type.
    model = ChatAnthropic(  # type: ignore[call-arg]
        model=request["model"],
        base_url=anthropic_root(request["base_url"]),
        api_key=request.get("api_key") or LAB_API_KEY,  # type: ignore[arg-type]
        max_tokens=request.get("max_tokens") or DEFAULT_MAX_TOKENS,
        streaming=True,
    )
    # LangChain converts OpenAI-format tools itself (`convert_to_anthropic_tool`).
    return await read_langchain_stream(model, request, sink, lambda metadata: metadata.get("stop_reason"))


MESSAGES_DRIVERS: dict[str, Driver] = {
    "anthropic-python": anthropic_python,
    "anthropic-python-helper": anthropic_python_helper,
    "langchain": langchain_anthropic,
}
