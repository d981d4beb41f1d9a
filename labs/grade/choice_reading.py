"""One choice of an answer as the graders read it (`ChoiceReading`): the graders' one shape for it.

Chat's chunks fill it in `labs.grade.reading`, Messages' and Responses' events in
`labs.grade.dialect_reading`; both import it from here.
"""

from __future__ import annotations

from dataclasses import dataclass, field

__all__ = ["ChoiceReading"]


@dataclass(slots=True, kw_only=True)
class ChoiceReading:
    """One choice as the stream (or the JSON completion) carried it."""

    index: int
    content: str = ""
    reasoning: str = ""
    #: Each tool call's name and arguments, by the call's `index`, in order of first appearance.
    tool_calls: list[dict[str, str]] = field(default_factory=list)
    #: Every `finish_reason` value that was not null, in order (`""` included: the defect).
    reasons_seen: list[str] = field(default_factory=list)

    @property
    def finish_reason(self) -> str | None:
        """The last non-empty reason the choice got, or None."""
        real = [r for r in self.reasons_seen if r]
        return real[-1] if real else None
