"""What a coding agent's user read at the end of one headless run: the answer it printed, and the
failure it told of, if it told of one.

Each agent is read the way its user reads it (`labs.clients.agent_clis.Agent.read_output`):

- Pi's agent and Codex print the answer on stdout and, when the run fails, exit non-zero with their
  words on stderr; Claude Code prints its `API Error: ...` on stdout (`read_text_output`). A run
  that exits 0 told of no failure.
- gemini-cli is run with `--output-format json` (`read_gemini_json`): it exits 0 after a turn it gave
  up on (`Model stream ended without a finish reason.` after four attempts; in text mode only an
  `[ERROR] ...` line on stderr says so, among lines its own logger writes with the same prefix), so
  the lab reads the one JSON document it prints on stdout, whose `error` names the failure
  (`{"type": "INVALID_STREAM", "message": ...}`) and whose `response` is the answer. A fatal error
  exits non-zero with a JSON document at the end of stderr (`{"session_id", "error": {"type",
  "message", "code"}}`), after the error's stack: its `error` is the words.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

__all__ = ["AgentOutput", "last_line", "read_gemini_json", "read_text_output"]


@dataclass(frozen=True, slots=True, kw_only=True)
class AgentOutput:
    """One run as its user read it."""

    #: The answer as printed (surrounding blank space dropped).
    text: str
    #: The agent's own words for a failure it told of (one line), or None: none told (a run that
    #: did not exit 0 failed all the same, in no words).
    error: str | None


def last_line(text: str) -> str | None:
    """The last line with something on it, as the user saw it (trailing spaces dropped)."""
    lines = [line.rstrip() for line in text.splitlines() if line.strip()]
    return lines[-1] if lines else None


def read_text_output(stdout: str, stderr: str, exit_code: int | None, *, errors_on_stdout: bool) -> AgentOutput:
    """An agent in text mode: the answer is stdout; a run that did not exit 0 failed, in the last
    line of the stream its user reads errors on (stdout for Claude Code, else stderr)."""
    if exit_code == 0:
        return AgentOutput(text=stdout.strip(), error=None)
    return AgentOutput(text=stdout.strip(), error=last_line(stdout if errors_on_stdout else stderr))


def read_gemini_json(stdout: str, stderr: str, exit_code: int | None) -> AgentOutput:
    """gemini-cli with `--output-format json` (the module docstring): the answer is the document's
    `response`; its `error`, or a non-zero exit with the error document on stderr, is a failure."""
    document = _last_document(stdout)
    if document is None:
        # No document on stdout: a fatal error wrote its own to stderr (or the run was stopped
        # before its end); whatever stdout holds is what was printed.
        failure = _last_document(stderr)
        words = _error_words(failure) if failure is not None else None
        return AgentOutput(text=stdout.strip(), error=words or (last_line(stderr) if exit_code != 0 else None))
    response = document.get("response")
    text = response.strip() if isinstance(response, str) else ""
    words = _error_words(document)
    if words is None and exit_code != 0:
        words = last_line(stderr)
    return AgentOutput(text=text, error=words)


def _error_words(document: dict[str, Any]) -> str | None:
    """`TYPE: message` from a document's `error` object, on one line; None when it has none."""
    error = document.get("error")
    if not isinstance(error, dict):
        return None
    kind, message = error.get("type"), error.get("message")
    words = " ".join(str(message).split()) if message is not None else "(no message)"
    return f"{kind}: {words}" if kind else words


def _last_document(text: str) -> dict[str, Any] | None:
    """The last JSON object in `text` that starts a line (gemini-cli pretty-prints its documents,
    `{` alone on the first line), read to its end; None when there is none."""
    decoder = json.JSONDecoder()
    starts = [index for index in range(len(text)) if text[index] == "{" and (index == 0 or text[index - 1] == "\n")]
    for start in reversed(starts):
        try:
            value, _ = decoder.raw_decode(text, start)
        except ValueError:
            continue
        if isinstance(value, dict):
            return value
    return None
