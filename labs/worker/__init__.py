"""A simulated OpenAI-compatible chat-completions worker with deterministic bytes and defects on demand.

- `labs.worker.settings`: `WorkerSettings` (every knob), its header / model-name encoding, and the
  expected answer for given settings.
- `labs.worker.wire`: the exact response bytes for given settings (head length, framed events,
  the byte offset after n token events).
- `labs.worker.server`: the trio server, `serve_worker` (for `nursery.start`) and `open_worker`.
- `python -m labs.worker --help`: run it standalone.
"""

from labs.worker.server import HandledRequest, RunningWorker, open_worker, serve_worker, settings_for_request
from labs.worker.settings import (
    DEFAULT_MODEL_NAME,
    SETTINGS_HEADER,
    ExpectedAnswer,
    ExpectedChoice,
    ExpectedToolCall,
    Finish,
    Framing,
    SettingsError,
    WorkerSettings,
    expected_answer,
    parse_settings,
)
from labs.worker.wire import ResponsePlan, Segment, response_plan

__all__ = [
    "DEFAULT_MODEL_NAME",
    "SETTINGS_HEADER",
    "ExpectedAnswer",
    "ExpectedChoice",
    "ExpectedToolCall",
    "Finish",
    "Framing",
    "HandledRequest",
    "ResponsePlan",
    "RunningWorker",
    "Segment",
    "SettingsError",
    "WorkerSettings",
    "expected_answer",
    "open_worker",
    "parse_settings",
    "response_plan",
    "serve_worker",
    "settings_for_request",
]
