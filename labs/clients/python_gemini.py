"""The Python driver of the Google Gemini dialect (`POST <root>/<version>/models/{model}:
streamGenerateContent?alt=sse`): google-genai's `client.aio.models.generate_content_stream`. Same
contract as the Chat drivers (labs/clients/python_drivers.py): feed the sink what the application
saw, return the library's `finishReason` as it surfaced it, let the library's exception out.

The request line is the lab's (Chat-shaped `messages` and `tools`, the same `base_url` as for
Chat: `http://host:port/prefix/v1`); what Gemini wants differently is adapted here: the SDK's
`base_url` is the root without the version, which goes in `api_version` (google-genai builds
`{base_url}/{api_version}/models/{model}:streamGenerateContent`, `_api_client.py`), so the request
reaches the same `/prefix/v1/...` the lab gave; messages become `contents` (the assistant's role is
`model`), system text `system_instruction`, tools `function_declarations`, `max_tokens`
`max_output_tokens`.

What google-genai 3.3.0 does at the end of a stream (shared/notes/gemini.md section 4): it hands on
every chunk and raises only on an HTTP error status or a chunk that re-dumps as `{"error": …}`
(`ServerError`/`ClientError`); a stream that ends without a `finishReason` ends the iteration with
no error. It retries nothing unless told (`HttpOptions.retry_options`): library defaults kept.
"""

from __future__ import annotations

import json
from typing import Any

from labs.clients import LAB_API_KEY
from labs.clients.python_sink import Driver, Sink

__all__ = ["GEMINI_DRIVERS", "gemini_config", "gemini_contents", "gemini_root"]


def gemini_root(base_url: str) -> tuple[str, str]:
    """The lab's API root (`http://host:port/prefix/v1`) as google-genai wants it: (the URL
    without its version segment, the version).

    Raises:
        ValueError: the URL's last segment is no API version (`v1`, `v1beta`, ...): the SDK puts one
            after its base URL itself.
    """
    root, _, version = base_url.rstrip("/").rpartition("/")
    if not version.startswith("v1") or not root:
        raise ValueError(f"google-genai appends /<version>/models/... to its base URL; {base_url!r} does not end in a version")
    return root, version


def gemini_contents(messages: list[dict]) -> tuple[list[dict[str, Any]], str | None]:
    """The Chat-shaped messages as Gemini `contents` (role `user` or `model`, one text part each)
    and the system text (None without a system message)."""
    system = [m["content"] for m in messages if m.get("role") == "system"]
    contents = [
        {"role": "model" if m.get("role") == "assistant" else "user", "parts": [{"text": m.get("content") or ""}]}
        for m in messages
        if m.get("role") != "system"
    ]
    return contents, "\n".join(system) if system else None


def gemini_config(request: dict) -> dict[str, Any]:
    """The `GenerateContentConfig` fields the request line asks for."""
    _, system = gemini_contents(request["messages"])
    config: dict[str, Any] = {}
    if system is not None:
        config["system_instruction"] = system
    if request.get("max_tokens"):
        config["max_output_tokens"] = request["max_tokens"]
    if request.get("tools"):
        declarations = [
            {
                "name": tool["function"]["name"],
                "description": tool["function"].get("description", ""),
                "parameters_json_schema": tool["function"].get("parameters") or {"type": "object"},
            }
            for tool in request["tools"]
        ]
        config["tools"] = [{"function_declarations": declarations}]
        # The lab's tools are the worker's; the application runs them itself.
        config["automatic_function_calling"] = {"disable": True}
    return config


async def google_genai(request: dict, sink: Sink) -> str | None:
    """google-genai's `client.aio.models.generate_content_stream`: an async iterator of
    `GenerateContentResponse`s (google/genai/models.py). Candidate 0's parts go to the sink: a
    `thought` part is reasoning, a `text` part text, a `function_call` one whole call (its `args`
    as JSON). The reason is candidate 0's last truthy `finish_reason`, as the enum's value
    (`STOP`, `MAX_TOKENS`; `FinishReason('')` is none); usage and model from each chunk."""
    from google import genai
    from google.genai import types

    root, version = gemini_root(request["base_url"])
    client = genai.Client(
        api_key=request.get("api_key") or LAB_API_KEY, http_options=types.HttpOptions(base_url=root, api_version=version)
    )
    contents, _ = gemini_contents(request["messages"])
    finish_reason = None
    calls = 0
    try:
        stream = await client.aio.models.generate_content_stream(
            model=request["model"], contents=contents, config=types.GenerateContentConfig(**gemini_config(request))
        )
        async for chunk in stream:
            sink.note_response(chunk.model_version, chunk.usage_metadata)
            candidate = next((c for c in chunk.candidates or () if (c.index or 0) == 0), None)
            if candidate is None:
                continue
            for part in (candidate.content.parts if candidate.content else None) or ():
                if part.function_call is not None:
                    arguments = json.dumps(part.function_call.args or {})
                    sink.add_tool_call(calls, part.function_call.name, arguments)
                    calls += 1
                elif part.thought:
                    sink.add_reasoning(part.text)
                else:
                    sink.add_text(part.text)
            reason = candidate.finish_reason
            if reason:
                finish_reason = reason.value if isinstance(reason, types.FinishReason) else str(reason)
    finally:
        await client.aio.aclose()
    return finish_reason


GEMINI_DRIVERS: dict[str, Driver] = {"google-genai": google_genai}
