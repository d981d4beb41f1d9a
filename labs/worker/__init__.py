"""A simulated worker with deterministic bytes and defects on demand, in four dialects: OpenAI Chat
Completions, Anthropic Messages, OpenAI Responses and Google Gemini, all from the same settings.

- `labs.worker.settings`: `WorkerSettings` (every knob) and its header / model-name encoding.
- `labs.worker.answer`: the expected answer for given settings (the same in every dialect) and the
  per-dialect words for it.
- `labs.worker.wire`: the exact response bytes for given settings and dialect (head length, framed
  events, the byte offset after n token events).
- `labs.worker.messages_events`, `labs.worker.responses_events`, `labs.worker.gemini_events`: the
  Messages, Responses and Gemini event builders (the tests' scripted upstream uses them too);
  `labs.worker.dialect_wire`: what each knob does in those dialects.
- `labs.worker.server`: the trio server, `serve_worker` (for `nursery.start`) and `open_worker`.
- `labs.worker.attempts`: `Attempt`, the record of every completion request a worker, the spare or
  the hub saw, by cell id, and `attempts_of`.
- `python -m labs.worker --help`: run it standalone.
"""

from labs.worker.answer import ExpectedAnswer, ExpectedChoice, ExpectedToolCall, expected_answer
from labs.worker.attempts import Attempt, attempts_of
from labs.worker.server import HandledRequest, RunningWorker, open_worker, serve_worker, settings_for_request
from labs.worker.settings import (
    DEFAULT_MODEL_NAME,
    SETTINGS_HEADER,
    Finish,
    Framing,
    SettingsError,
    WorkerSettings,
    parse_settings,
)
from labs.worker.wire import ResponsePlan, Segment, response_plan

__all__ = [
    "Attempt",
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
    "attempts_of",
    "expected_answer",
    "open_worker",
    "parse_settings",
    "response_plan",
    "serve_worker",
    "settings_for_request",
]
