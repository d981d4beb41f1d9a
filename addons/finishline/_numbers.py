"""Reading a number a person typed: one parser for every option and argument that takes one.

finish_fix's seconds options, the lab's `--jobs` and `--repeat`, `python -m faults`' token counts and
the graders' deadlines all read a number from text and check its range. The words of each refusal
differ (each names what it counts), so this says only *why* a text was refused and leaves the line
to its caller: `NumberRefused.value` is None when the text is no number of that kind at all, else
the number that is out of range. It lives in the core because the addon can import nothing else
(a stock mitmproxy puts only the addon's folder on sys.path).
"""

from __future__ import annotations

import math

__all__ = ["NumberRefused", "read_number"]


class NumberRefused(ValueError):
    """`text` is not a number of the kind asked for (`value` None), or `value` is out of range."""

    def __init__(self, text: str, value: float | None) -> None:
        super().__init__(f"{text!r} is not a number" if value is None else f"{value} is out of range")
        self.text = text
        self.value = value


def read_number(text: str, *, whole: bool = False, at_least: float | None = None, above: float | None = None) -> float:
    """The number `text` spells: a whole number (an `int`) when `whole`, else any finite one;
    `at_least` and `above` bound it from below. Raises `NumberRefused`."""
    try:
        value: float = int(text) if whole else float(text)
    except ValueError:
        raise NumberRefused(text, None) from None
    # inf and nan are floats but no number of seconds (nan passes every comparison as False).
    if not math.isfinite(value):
        raise NumberRefused(text, None)
    if (at_least is not None and value < at_least) or (above is not None and not value > above):
        raise NumberRefused(text, value)
    return value
