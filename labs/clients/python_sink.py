"""What a Python driver feeds: the `Sink` that collects what the application saw (text, reasoning,
tool calls), shared by the drivers of every dialect (labs/clients/python_drivers.py for Chat,
python_messages.py, python_responses.py)."""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any

__all__ = ["Driver", "Sink", "add_langchain_content", "read_langchain_stream"]


@dataclass
class Sink:
    """What the application saw, in arrival order. `on_first` is called at the first output."""

    on_first: Callable[[], None]
    text: str = ""
    reasoning: str = ""
    tool_calls: list[dict[str, str]] = field(default_factory=list)
    #: The model the response named and the usage it reported, where the driver reads them (the
    #: raw SDK drivers): a fail-over's answer should name the model that answered (failoverbench S16).
    model: str | None = None
    usage: dict[str, Any] | None = None
    _calls_by_index: dict[int, dict[str, str]] = field(default_factory=dict)

    def note_response(self, model: object = None, usage: object = None) -> None:
        """The response's `model` and `usage` as a chunk or event carries them (an SDK object or a
        dict; None where it carries none): the last model named wins, usage fields merge (Messages
        sends input tokens in `message_start`, output tokens in `message_delta`)."""
        if isinstance(model, str) and model:
            self.model = model
        if hasattr(usage, "model_dump"):
            usage = usage.model_dump(exclude_none=True)
        if isinstance(usage, dict) and usage:
            self.usage = {**(self.usage or {}), **{k: v for k, v in usage.items() if isinstance(v, (int, float))}}

    def add_text(self, delta: object) -> None:
        if isinstance(delta, str) and delta:
            self.on_first()
            self.text += delta

    def add_reasoning(self, delta: object) -> None:
        if isinstance(delta, str) and delta:
            self.on_first()
            self.reasoning += delta

    def add_tool_call(self, index: object, name: object, arguments: object) -> None:
        """One tool-call delta (or a whole call): the call at `index` gets the name, if any, and
        the arguments piece appended. `index` None (a library that drops it) means call 0; each
        dialect's index is its own (Chat's tool-call index, a Messages content block index, a
        Responses output index): only its identity matters."""
        if not name and not arguments:
            return
        self.on_first()
        key = index if isinstance(index, int) else 0
        call = self._calls_by_index.get(key)
        if call is None:
            call = self._calls_by_index[key] = {"name": "", "arguments": ""}
            self.tool_calls.append(call)
        if name:
            call["name"] = str(name)
        if arguments:
            call["arguments"] += str(arguments)


#: A driver: runs one streaming request (a request line of the host protocol, see python_host.py),
#: feeds the sink, returns the finish reason its library surfaced or lets the library's exception out.
Driver = Callable[[dict, Sink], Awaitable[str | None]]


def add_langchain_content(sink: Sink, content: object) -> None:
    """A LangChain message chunk's `content` into the sink: a string is text; a list holds content
    blocks (langchain-anthropic's `text`/`thinking` blocks, langchain-openai's Responses `text` and
    `reasoning` blocks with `summary` parts), each block a piece of its kind."""
    if isinstance(content, str):
        sink.add_text(content)
        return
    for block in content if isinstance(content, list) else ():
        if not isinstance(block, dict):
            continue
        kind = block.get("type")
        if kind == "text":
            sink.add_text(block.get("text"))
        elif kind == "thinking":
            sink.add_reasoning(block.get("thinking"))
        elif kind == "reasoning":
            for part in block.get("summary") or ():
                if isinstance(part, dict):
                    sink.add_reasoning(part.get("text"))


async def read_langchain_stream(model: Any, request: dict, sink: Sink, reason_of: Callable[[dict], str | None]) -> str | None:
    """Streams a LangChain chat model's answer to the request's messages into the sink (with the
    request's tools bound, if any); returns the last reason `reason_of` reads in a chunk's
    `response_metadata` (LangChain's Messages and Responses models put it in different keys)."""
    if request.get("tools"):
        model = model.bind_tools(request["tools"])
    finish_reason = None
    async for chunk in model.astream(request["messages"]):
        add_langchain_content(sink, chunk.content)
        for call in chunk.tool_call_chunks or []:
            sink.add_tool_call(call.get("index"), call.get("name"), call.get("args"))
        reason = reason_of(chunk.response_metadata)
        if reason is not None:
            finish_reason = reason
    return finish_reason
