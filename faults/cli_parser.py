"""The command-line parser every finishline CLI uses: bad input is one line, exit status 2.

argparse's own `error` prints the whole usage block before the message; a user who typed one wrong
word needs the one line that names it (argparse's "invalid choice" message already lists the valid
ones) and where the rest is. It lives in `faults/`, the lowest layer: `labs/` imports `faults/`,
never the other way round, so the fault CLI and the lab's CLIs can all share it.
"""

from __future__ import annotations

import argparse
from typing import NoReturn

__all__ = ["EXIT_USAGE", "OneLineParser"]

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
