"""The server checks of every dialect, by dialect: what `python -m labs.grade server --dialect D` runs.

- Chat Completions: `labs.grade.server_checks` (`/chat/completions`, the checks as they always were);
- Anthropic Messages: `labs.grade.server_checks_messages` (`/messages`);
- OpenAI Responses: `labs.grade.server_checks_responses` (`/responses`);
- Google Gemini: `labs.grade.server_checks_gemini` (`/models/{model}:streamGenerateContent?alt=sse`,
  `:generateContent`).
"""

from __future__ import annotations

from finishline import Dialect
from labs.grade.server_check import ServerSuite
from labs.grade.server_checks import CHAT_SUITE
from labs.grade.server_checks_gemini import GEMINI_SUITE
from labs.grade.server_checks_messages import MESSAGES_SUITE
from labs.grade.server_checks_responses import RESPONSES_SUITE

__all__ = ["SERVER_SUITES"]

SERVER_SUITES: dict[Dialect, ServerSuite] = {
    Dialect.CHAT: CHAT_SUITE,
    Dialect.MESSAGES: MESSAGES_SUITE,
    Dialect.RESPONSES: RESPONSES_SUITE,
    Dialect.GEMINI: GEMINI_SUITE,
}
