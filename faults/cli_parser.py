"""The command-line parser every finishline CLI uses: bad input is one line, exit status 2.

argparse's own `error` prints the whole usage block before the message; a user who typed one wrong
word needs the one line that names it (argparse's "invalid choice" message already lists the valid
ones) and where the rest is. It lives in `faults/`, the lowest layer: `labs/` imports `faults/`,
never the other way round, so the fault CLI and the lab's CLIs can all share it.
"""

from __future__ import annotations

import argparse
from collections.abc import Callable
from typing import NoReturn

from finishline import NumberRefused, read_number

__all__ = ["EXIT_USAGE", "OneLineParser", "number_type"]

#: The exit status of a command refused for its arguments (argparse's, and every finishline CLI's).
EXIT_USAGE = 2


class OneLineParser(argparse.ArgumentParser):
    """An `argparse.ArgumentParser` that refuses bad input with one line on stderr and exit status 2:
    `error: <what is wrong> (see `<prog> --help`)`. Subparsers made with `parser_class=OneLineParser`
    refuse the same way, naming their own `--help`."""

    def explain(self, message: str) -> str:
        """The line to print for argparse's `message`; a CLI may reword its own cases."""
        return message

    def error(self, message: str) -> NoReturn:
        self.exit(EXIT_USAGE, f"error: {self.explain(message)} (see `{self.prog} --help`)\n")


def number_type(
    *,
    whole: bool = False,
    at_least: float | None = None,
    above: float | None = None,
    not_a_number: Callable[[str], str],
    out_of_range: Callable[[str, float], str],
) -> Callable[[str], float]:
    """An argparse `type=` for a number (`finishline.read_number`, the one reader of a typed
    number), refusing with the command's own words: `not_a_number(text)` for a text that is no
    number of the kind, `out_of_range(text, value)` for one outside the bounds. A whole number comes
    back as an `int`."""

    def parse(text: str) -> float:
        try:
            value = read_number(text, whole=whole, at_least=at_least, above=above)
        except NumberRefused as refused:
            words = not_a_number(text) if refused.value is None else out_of_range(text, refused.value)
            raise argparse.ArgumentTypeError(words) from None
        return int(value) if whole else value

    return parse
