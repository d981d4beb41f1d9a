"""The server checks of every dialect, by dialect: what `python -m labs.grade server --dialect D` runs.

- Chat Completions: `labs.grade.server_checks` (`/chat/completions`, the checks as they always were);
- Anthropic Messages: `labs.grade.server_checks_messages` (`/messages`);
- OpenAI Responses: `labs.grade.server_checks_responses` (`/responses`).
"""

from __future__ import annotations

from finishline import Dialect
from labs.grade.server_check import ServerSuite
from labs.grade.server_checks import CHAT_SUITE
from labs.grade.server_checks_messages import MESSAGES_SUITE
from labs.grade.server_checks_responses import RESPONSES_SUITE

__all__ = ["SERVER_SUITES", "ungraded_reason"]

SERVER_SUITES: dict[Dialect, ServerSuite] = {
    Dialect.CHAT: CHAT_SUITE,
    Dialect.MESSAGES: MESSAGES_SUITE,
    Dialect.RESPONSES: RESPONSES_SUITE,
}


def ungraded_reason(*dialects: Dialect | None) -> str | None:
    """Why the graders refuse to run in one of `dialects` (None is no dialect), None when they
    speak them all: a lab dialect without a server suite yet (Gemini, issue 29).

    (For ggrade: Gemini's suite and gateway card replace this refusal; the lab, the worker and
    `--dialect gemini` of `python -m labs` already speak it.)
    """
    missing = [dialect for dialect in dialects if dialect is not None and dialect not in SERVER_SUITES]
    if not missing:
        return None
    return (
        f"the graders do not grade {missing[0].value} yet (issue 29): grade it with {', '.join(d.value for d in SERVER_SUITES)}"
    )
