"""LiteLLM proxy's books for the lab: a callback module the proxy loads from its config
(`litellm_settings.callbacks: ["labs.gateways.litellm_books.books"]`).

What LiteLLM 1.108.7 hands a `CustomLogger` for a request, as read in its source
(`litellm/litellm_core_utils/litellm_logging.py`, `streaming_handler.py`):

- `async_log_success_event`: a request that finished; for a stream, once, after the last chunk,
  with the response LiteLLM assembled from the chunks (`stream_chunk_builder`): its finish reason
  and usage. This and the failure event are what LiteLLM's spend logs and dashboards are built
  from (`proxy/hooks/proxy_track_cost_callback.py`, `_ProxyDBLogger`, implements only these).
- `async_log_failure_event`: a request (or one attempt of it, under the router's retries) failed.
- `async_log_stream_event`: what LiteLLM's *success* handler calls instead of
  `async_log_success_event` when a stream ended cleanly with nothing to assemble. A body that ends
  with no event at all (the incident: the hub's clean end during prefill) gives LiteLLM no chunk;
  `CustomStreamWrapper._finalize_completed_stream` makes up a `stop` chunk for the client but
  keeps no chunk for the books, `stream_chunk_builder([])` returns None, and
  `Logging._async_success_handler_body` (with `log_event_type = "successful_api_call"`) then finds
  no `async_complete_streaming_response` and calls `async_log_stream_event(kwargs,
  response_obj=None, ...)`. That call is LiteLLM's whole record of such a request: a successful
  call, no finish reason, no usage, no cost, and the time it took; nothing reaches the failure
  handlers, and its spend tracker, which has no stream-event method, writes no row.

Each call appends one JSON line to the file named by the environment variable
FINISHLINE_LITELLM_BOOKS: the lab reads it as the `litellm` books column (the last line for a
request is its entry). Never headers, keys or message content: which hook LiteLLM called, the model
name (which carries the lab's request id), the status, the finish reason, token counts, the
duration and the error.
"""

from __future__ import annotations

import json
import os
import time
from typing import Any

from litellm.integrations.custom_logger import CustomLogger

from labs.gateways.litellm_proxy import LITELLM_BOOKS_ENV as BOOKS_ENV

#: LiteLLM's `log_event_type` for a call its success handler logged (litellm_logging.py,
#: `_prepare_success_logging`).
SUCCESSFUL_API_CALL = "successful_api_call"


def _finish_reason(response: Any) -> str | None:
    try:
        return response.choices[0].finish_reason
    except (AttributeError, IndexError, TypeError):
        return None


def _completion_tokens(response: Any) -> int | None:
    usage = getattr(response, "usage", None)
    return getattr(usage, "completion_tokens", None) if usage is not None else None


class LabBooks(CustomLogger):
    def _write(self, entry: dict[str, Any]) -> None:
        path = os.environ.get(BOOKS_ENV)
        if not path:
            return
        with open(path, "a", encoding="utf-8") as books:
            books.write(json.dumps(entry) + "\n")

    def _entry(self, hook: str, kwargs: dict, start_time: Any, end_time: Any) -> dict[str, Any]:
        params = kwargs.get("litellm_params") or {}
        metadata = params.get("metadata") or {}
        return {
            "time": time.time(),
            "hook": hook,
            "model": metadata.get("model_group") or kwargs.get("model"),
            # The proxy's id for the request (its retries and fallbacks share it): which lines are
            # about one request (labs.gateways.litellm_proxy, `read_litellm_books`).
            "call_id": kwargs.get("litellm_call_id"),
            "stream": bool(kwargs.get("stream")),
            "duration_s": (end_time - start_time).total_seconds() if start_time and end_time else None,
        }

    def _success(self, hook: str, kwargs: dict, response_obj: Any, start_time: Any, end_time: Any) -> None:
        entry = self._entry(hook, kwargs, start_time, end_time)
        entry.update(
            status="success",
            finish_reason=_finish_reason(response_obj),
            completion_tokens=_completion_tokens(response_obj),
        )
        self._write(entry)

    async def async_log_success_event(self, kwargs, response_obj, start_time, end_time):
        self._success("async_log_success_event", kwargs, response_obj, start_time, end_time)

    async def async_log_stream_event(self, kwargs, response_obj, start_time, end_time):
        # Only the success handler calls this (see the module docstring); the event type says so,
        # and anything else is written as LiteLLM named it rather than guessed into a success.
        event_type = kwargs.get("log_event_type")
        if event_type == SUCCESSFUL_API_CALL:
            self._success("async_log_stream_event", kwargs, response_obj, start_time, end_time)
            return
        entry = self._entry("async_log_stream_event", kwargs, start_time, end_time)
        entry.update(
            status=str(event_type), finish_reason=_finish_reason(response_obj), completion_tokens=_completion_tokens(response_obj)
        )
        self._write(entry)

    async def async_log_failure_event(self, kwargs, response_obj, start_time, end_time):
        entry = self._entry("async_log_failure_event", kwargs, start_time, end_time)
        error = kwargs.get("exception")
        entry.update(status="failure", error=f"{type(error).__name__}: {error}" if error else None)
        self._write(entry)


books = LabBooks()
