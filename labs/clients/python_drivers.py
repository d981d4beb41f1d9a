"""One driver per real Python client: each runs one streaming chat completion the way an application
using that library would, feeds what the application would see into a `Sink`, and returns the finish
reason the library surfaced, or lets the library's exception out. A driver never second-guesses its
library: if the library calls a stream complete, so does the driver.

Library defaults are kept (retries included): the lab measures what a user of the library gets.

Only choice 0 is read: a driver that reads chunks skips every choice whose `index` is not 0 (with
`n=2` the worker interleaves both choices' deltas, and the application asked about the first).
Tool calls are accumulated per tool-call `index`, the way the OpenAI stream spells them: the first
delta of a call carries its name, later ones pieces of its arguments.

This module holds the Chat drivers and `DRIVERS`, the registry of every dialect's drivers keyed by
(client name, dialect); the Messages, Responses and Gemini drivers live in python_messages.py,
python_responses.py and python_gemini.py, LangChain's Gemini driver (which runs in an environment of
its own) in python_langchain_google.py.
"""

from __future__ import annotations

import json
import os
from collections.abc import Callable
from typing import Any

from finishline import Dialect
from labs.clients import LAB_API_KEY
from labs.clients.python_gemini import GEMINI_DRIVERS
from labs.clients.python_langchain_google import LANGCHAIN_GOOGLE_DRIVERS
from labs.clients.python_messages import MESSAGES_DRIVERS
from labs.clients.python_responses import RESPONSES_DRIVERS
from labs.clients.python_sink import Driver, Sink

__all__ = ["DRIVERS", "Driver", "Sink", "versions"]

# LiteLLM fetches its model cost map from the internet at import unless told not to.
os.environ.setdefault("LITELLM_LOCAL_MODEL_COST_MAP", "True")


def _first_choice(choices: Any) -> Any:
    """Choice 0 of a chunk (object or dict), or None: choices with another `index` are skipped."""
    for choice in choices or ():
        index = choice.get("index", 0) if isinstance(choice, dict) else getattr(choice, "index", 0)
        if (index or 0) == 0:
            return choice
    return None


def _field(value: Any, name: str) -> Any:
    """`value.name` or `value[name]`: LiteLLM's deltas carry tool calls as objects or dicts."""
    if isinstance(value, dict):
        return value.get(name)
    return getattr(value, name, None)


async def _read_chunks(chunks: Any, sink: Sink, *, is_reason: Callable[[Any], bool]) -> str | None:
    """Reads OpenAI-shaped chunks (objects; LiteLLM's tool calls may be dicts) into `sink`; returns
    the last finish reason that `is_reason` accepts, the way that client surfaces it."""
    finish_reason = None
    async for chunk in chunks:
        sink.note_response(getattr(chunk, "model", None), getattr(chunk, "usage", None))
        choice = _first_choice(chunk.choices)
        if choice is None:
            continue
        sink.add_reasoning(getattr(choice.delta, "reasoning_content", None))
        sink.add_text(choice.delta.content)
        for call in getattr(choice.delta, "tool_calls", None) or []:
            function = _field(call, "function")
            if function is not None:
                sink.add_tool_call(_field(call, "index"), _field(function, "name"), _field(function, "arguments"))
        if is_reason(choice.finish_reason):
            finish_reason = choice.finish_reason
    return finish_reason


def _request_body(request: dict) -> dict:
    body: dict = {"model": request["model"], "messages": request["messages"]}
    if request.get("max_tokens"):
        body["max_tokens"] = request["max_tokens"]
    if request.get("tools"):
        body["tools"] = request["tools"]
    return body


async def openai_python(request: dict, sink: Sink) -> str | None:
    """openai-python's plain `stream=True`: an `AsyncStream` of chunks, read to `[DONE]` or EOF
    (openai/_streaming.py: `[DONE]` ends it, a data event with an `error` key raises `APIError`,
    a transport error becomes `APIConnectionError`). The finish reason is whatever chunks carried."""
    import openai

    async with openai.AsyncOpenAI(base_url=request["base_url"], api_key=request.get("api_key") or LAB_API_KEY) as client:
        stream = await client.chat.completions.create(**_request_body(request), stream=True)
        # The raw SDK surfaces "" as a value: any reason that is not None counts.
        return await _read_chunks(stream, sink, is_reason=lambda reason: reason is not None)


async def openai_python_helper(request: dict, sink: Sink) -> str | None:
    """openai-python's `client.chat.completions.stream()` helper and `get_final_completion()`
    (openai/lib/streaming/chat/_completions.py; the final parse in openai/lib/_parsing/_completions.py
    raises `LengthFinishReasonError` on any `length` finish)."""
    import openai

    async with openai.AsyncOpenAI(base_url=request["base_url"], api_key=request.get("api_key") or LAB_API_KEY) as client:
        async with client.chat.completions.stream(**_request_body(request)) as stream:
            async for event in stream:
                # The helper's `content.delta` events carry no choice index: read choice 0's
                # deltas from the raw chunk events instead (the same text for n=1).
                choice = _first_choice(event.chunk.choices) if event.type == "chunk" else None
                if choice is not None:
                    sink.add_reasoning(getattr(choice.delta, "reasoning_content", None))
                    sink.add_text(choice.delta.content)
            completion = await stream.get_final_completion()
        final = _first_choice(completion.choices)
        if final is None:
            return None
        # Tool calls from the final completion, the helper's result: its `tool_calls.*.done` events
        # fire only once a finish_reason arrived (`get_done_events`), so they miss an unfinished call.
        for index, call in enumerate(final.message.tool_calls or []):
            sink.add_tool_call(index, call.function.name, call.function.arguments)
        return final.finish_reason


async def langchain_openai(request: dict, sink: Sink) -> str | None:
    """LangChain's `ChatOpenAI.astream` (langchain_openai/chat_models/base.py: a chunk's
    `finish_reason` lands in `response_metadata` only when truthy; reasoning deltas are dropped)."""
    from langchain_openai import ChatOpenAI

    model = ChatOpenAI(
        model=request["model"],
        base_url=request["base_url"],
        # pydantic turns the string into the field's SecretStr; the annotation is the validated type.
        api_key=request.get("api_key") or LAB_API_KEY,  # type: ignore[arg-type]
        streaming=True,
        **({"max_tokens": request["max_tokens"]} if request.get("max_tokens") else {}),
    )
    # `bind_tools` is typed as a Runnable of whole AIMessages, but a bound chat model streams
    # AIMessageChunks as the model does (`read_langchain_stream` takes either as Any too).
    runnable: Any = model.bind_tools(request["tools"]) if request.get("tools") else model
    finish_reason = None
    async for chunk in runnable.astream(request["messages"]):
        sink.add_text(chunk.content if isinstance(chunk.content, str) else "")
        for call in chunk.tool_call_chunks or []:
            sink.add_tool_call(call.get("index"), call.get("name"), call.get("args"))
        finish_reason = chunk.response_metadata.get("finish_reason") or finish_reason
    return finish_reason


async def litellm_sdk(request: dict, sink: Sink) -> str | None:
    """LiteLLM's SDK, `acompletion(stream=True)` with an `openai/` model (its CustomStreamWrapper,
    litellm/litellm_core_utils/streaming_handler.py `finish_reason_handler`: 1.108 invents `stop`
    when the upstream sent none)."""
    import litellm

    response = await litellm.acompletion(
        model=f"openai/{request['model']}",
        api_base=request["base_url"],
        api_key=request.get("api_key") or LAB_API_KEY,
        stream=True,
        **{key: value for key, value in _request_body(request).items() if key != "model"},
    )
    return await _read_chunks(response, sink, is_reason=bool)


class StreamErrorEvent(Exception):
    """The raw reader met a data event with a top-level `error` key."""


async def httpx_sse_reader(request: dict, sink: Sink) -> str | None:
    """The baseline: a hand-written reader on httpx-sse, as in many applications. It stops at
    `[DONE]` or at the end of the body, raises on a data event with an `error` key, and trusts
    everything else (a cut stream that ends cleanly is, to it, a finished one)."""
    import httpx
    import httpx_sse

    url = request["base_url"].rstrip("/") + "/chat/completions"
    headers = {"authorization": f"Bearer {request.get('api_key') or LAB_API_KEY}"}
    finish_reason = None
    async with httpx.AsyncClient(timeout=httpx.Timeout(600.0)) as client:
        body = {**_request_body(request), "stream": True}
        async with httpx_sse.aconnect_sse(client, "POST", url, json=body, headers=headers) as source:
            source.response.raise_for_status()
            async for event in source.aiter_sse():
                if event.data.strip() == "[DONE]":
                    break
                data = json.loads(event.data)
                if isinstance(data, dict) and data.get("error"):
                    error = data["error"]
                    message = error.get("message") if isinstance(error, dict) else str(error)
                    raise StreamErrorEvent(message)
                for choice in data.get("choices") or []:
                    if choice.get("index", 0) != 0:
                        continue
                    delta = choice.get("delta") or {}
                    sink.add_reasoning(delta.get("reasoning_content"))
                    sink.add_text(delta.get("content"))
                    for call in delta.get("tool_calls") or []:
                        function = call.get("function") or {}
                        sink.add_tool_call(call.get("index"), function.get("name"), function.get("arguments"))
                    if choice.get("finish_reason") is not None:
                        finish_reason = choice["finish_reason"]
    return finish_reason


CHAT_DRIVERS: dict[str, Driver] = {
    "openai-python": openai_python,
    "openai-python-helper": openai_python_helper,
    "langchain": langchain_openai,
    "litellm-sdk": litellm_sdk,
    "httpx-sse": httpx_sse_reader,
}

#: Every Python driver by (client name, dialect): a client name means that library in that dialect
#: (`langchain` is `ChatOpenAI` in Chat, `ChatAnthropic` in Messages, `ChatOpenAI(use_responses_api)`
#: in Responses, `ChatGoogleGenerativeAI` in Gemini).
DRIVERS: dict[tuple[str, Dialect], Driver] = {
    (name, dialect): driver
    for dialect, drivers in (
        (Dialect.CHAT, CHAT_DRIVERS),
        (Dialect.MESSAGES, MESSAGES_DRIVERS),
        (Dialect.RESPONSES, RESPONSES_DRIVERS),
        (Dialect.GEMINI, GEMINI_DRIVERS),
        (Dialect.GEMINI, LANGCHAIN_GOOGLE_DRIVERS),
    )
    for name, driver in drivers.items()
}


#: The client packages each Python runtime reports in its hello: the lab's environment, and each
#: environment of its own (labs.clients.OWN_ENVIRONMENTS), which holds a library the lab's cannot.
PACKAGES: dict[str, tuple[str, ...]] = {
    "python": ("openai", "langchain-openai", "anthropic", "langchain-anthropic", "litellm", "httpx", "httpx-sse", "google-genai"),
    "langchain-google": ("langchain-google-genai", "langchain-core", "google-genai", "httpx"),
}


def versions(runtime: str = "python") -> dict[str, str]:
    """The interpreter's version and those of the runtime's client packages, as installed here.

    Raises:
        importlib.metadata.PackageNotFoundError: this interpreter lacks one of them.
    """
    import platform
    from importlib.metadata import version

    names = {"python": platform.python_version()}
    for package in PACKAGES[runtime]:
        names[package] = version(package)
    return names
