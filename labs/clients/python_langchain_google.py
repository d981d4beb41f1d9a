"""The Python driver of `langchain` in the Google Gemini dialect: LangChain's
`ChatGoogleGenerativeAI` (langchain-google-genai 4.4.2), which streams
`POST <root>/<version>/models/<model>:streamGenerateContent?alt=sse` through google-genai 2.34.0
(version `v1beta` unless told; the lab gives the version its URL has, as to `google-genai`).

It runs in a host of its own: langchain-google-genai needs google-genai below 3 and the lab's
environment has 3.3.0 (for the `google-genai` client), so `make setup` installs it in
`.tools/clients/langchain-google` and the lab starts `labs.clients.python_host` from that
environment's interpreter (`OWN_ENVIRONMENTS` in labs.clients, labs.clients.hosts). That host
imports this checkout's standard-library modules and what that environment holds, nothing else:
this module imports the library inside the driver, as every driver does.

Same contract as the other dialects' drivers (labs/clients/python_drivers.py): feed the sink what
the application saw, return the reason as the library surfaced it, let the library's exception out.
The reason is the `finish_reason` the model puts in a chunk's `response_metadata`, the name of the
candidate's `finishReason` (`STOP`, `MAX_TOKENS`, ...), set only when the chunk had a truthy one
(`_response_to_result`): a stream that ends without one surfaces None, silently. A mid-stream
`{"error": ...}` frame raises google-genai's `ServerError` or `ClientError`, which LangChain re-raises
as its `GoogleAPIError` or `ChatGoogleGenerativeAIError` (`_aclassified_stream`).

Library defaults are kept, as for the other LangChain drivers: `max_retries` 6 (google-genai's
retry of a request whose response status is retryable) and no timeout of its own.
"""

from __future__ import annotations

from typing import Any

from labs.clients import LAB_API_KEY
from labs.clients.python_gemini import gemini_root
from labs.clients.python_sink import Driver, Sink, add_langchain_content

__all__ = ["LANGCHAIN_GOOGLE_DRIVERS", "langchain_google_genai"]


async def langchain_google_genai(request: dict, sink: Sink) -> str | None:
    """LangChain's `ChatGoogleGenerativeAI.astream` (langchain_google_genai/chat_models.py
    `_astream`: one chunk per Gemini chunk, its candidate's parts as content, its `finishReason`
    and, on that last chunk, `model_name` in `response_metadata`; `usage_metadata` per chunk is the
    increase over the previous chunk, Gemini's counts being cumulative). The lab's Chat-shaped
    messages and OpenAI-format tools are what LangChain takes and converts itself (a system message
    becomes the `systemInstruction`)."""
    from langchain_core.messages.ai import add_usage
    from langchain_google_genai import ChatGoogleGenerativeAI

    # google-genai appends `/<version>/models/...` to its base URL (v1beta unless told): the lab's
    # root loses its version, which goes in `api_version`, as for the google-genai driver, so the
    # request reaches the `/prefix/v1/...` the lab gave.
    root, version = gemini_root(request["base_url"])
    model: Any = ChatGoogleGenerativeAI(
        model=request["model"],
        # pydantic turns the string into the field's SecretStr.
        google_api_key=request.get("api_key") or LAB_API_KEY,
        base_url=root,
        api_version=version,
        **({"max_output_tokens": request["max_tokens"]} if request.get("max_tokens") else {}),
    )
    if request.get("tools"):
        model = model.bind_tools(request["tools"])
    finish_reason = None
    usage = None
    async for chunk in model.astream(request["messages"]):
        add_langchain_content(sink, chunk.content)
        for call in chunk.tool_call_chunks or []:
            sink.add_tool_call(call.get("index"), call.get("name"), call.get("args"))
        if chunk.usage_metadata:
            usage = add_usage(usage, chunk.usage_metadata)
        sink.note_response(chunk.response_metadata.get("model_name"), usage)
        finish_reason = chunk.response_metadata.get("finish_reason") or finish_reason
    return finish_reason


LANGCHAIN_GOOGLE_DRIVERS: dict[str, Driver] = {"langchain": langchain_google_genai}
