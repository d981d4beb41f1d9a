"""LiteLLM proxy's books for the lab: a callback module the proxy loads from its config
(`litellm_settings.callbacks: ["labs.gateways.litellm_books.books"]`).

LiteLLM calls `async_log_success_event` when a request finished (for a stream: after the last chunk
went out) and `async_log_failure_event` when it failed; that pair is what a LiteLLM operator's
spend logs and dashboards are built from. Each call appends one JSON line to the file named by the
environment variable FINISHLINE_LITELLM_BOOKS: the lab reads it as the `litellm` books column.
Never headers, keys or message content: the model name (which carries the lab's request id), the
status, the finish reason, token counts and the error.
"""

from __future__ import annotations

import json
import os
import time
from typing import Any

from litellm.integrations.custom_logger import CustomLogger

from labs.gateways import LITELLM_BOOKS_ENV as BOOKS_ENV


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

    def _entry(self, kwargs: dict, start_time: Any, end_time: Any) -> dict[str, Any]:
        params = kwargs.get("litellm_params") or {}
        metadata = params.get("metadata") or {}
        return {
            "time": time.time(),
            "model": metadata.get("model_group") or kwargs.get("model"),
            "stream": bool(kwargs.get("stream")),
            "duration_s": (end_time - start_time).total_seconds() if start_time and end_time else None,
        }

    async def async_log_success_event(self, kwargs, response_obj, start_time, end_time):
        entry = self._entry(kwargs, start_time, end_time)
        entry.update(
            status="success",
            finish_reason=_finish_reason(response_obj),
            completion_tokens=_completion_tokens(response_obj),
        )
        self._write(entry)

    async def async_log_failure_event(self, kwargs, response_obj, start_time, end_time):
        entry = self._entry(kwargs, start_time, end_time)
        error = kwargs.get("exception")
        entry.update(status="failure", error=f"{type(error).__name__}: {error}" if error else None)
        self._write(entry)


books = LabBooks()
