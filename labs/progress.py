"""What the lab shows while it runs, and how long each part took.

The runner calls `progress(message, done, total)` when a scenario starts (`"<scenario>: starting, N
cells"`) and when a cell finishes (`"<scenario>: <client> via <gateway>: <outcome>"`), the scenario's
name first either way (labs/runner.py `run_lab`). `Progress` turns those calls into one status line:

    [ 57/340] 1:12  scenario 4/20 cut-after-tokens-fin  pi-ai via litellm: error

rewritten in place on a terminal, or one line per scenario when the output is a file or a pipe (a
CI log must not fill with carriage returns). It also keeps the time each scenario took (from its
start to its last cell), the start-up before the first scenario (worker, toxiproxy, gateways, driver
hosts) and the wait for the books after the last, which `timings()` returns for result.json: that
is what choosing the default run's scope is measured with.

The clock is an argument, so the tests drive it.
"""

from __future__ import annotations

import shutil
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, TextIO

__all__ = ["Progress", "format_elapsed"]


def format_elapsed(seconds: float) -> str:
    """`m:ss` (`1:05`), or `h:mm:ss` past an hour."""
    whole = int(seconds)
    hours, rest = divmod(whole, 3600)
    minutes, seconds_part = divmod(rest, 60)
    return f"{hours}:{minutes:02d}:{seconds_part:02d}" if hours else f"{minutes}:{seconds_part:02d}"


@dataclass(slots=True)
class _ScenarioTime:
    name: str
    started: float
    cells: int = 0
    last_cell: float | None = None


class Progress:
    """A `progress(message, done, total)` callback for `labs.runner.run_lab` that writes a status line.

    Args:
        scenario_names: the run's scenarios (to count them and to know which one a message is
            about).
        stream: where the status goes (stderr for `python -m labs`).
        interactive: rewrite one line in place (a terminal) rather than append lines.
        clock: seconds, monotonic.
    """

    def __init__(
        self,
        scenario_names: Sequence[str],
        stream: TextIO,
        *,
        interactive: bool,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self._names = list(scenario_names)
        self._stream = stream
        self._interactive = interactive
        self._clock = clock
        self._started = clock()
        self._scenarios: list[_ScenarioTime] = []
        self._finished: float | None = None

    def _scenario_of(self, message: str) -> str | None:
        # The longest name that prefixes the message: `cut-after-tokens-fin` must not be taken for
        # a scenario called `cut-after-tokens`.
        candidates = [name for name in self._names if message.startswith(name + ": ")]
        return max(candidates, key=len) if candidates else None

    def __call__(self, message: str, done: int, total: int) -> None:
        now = self._clock()
        name = self._scenario_of(message)
        starting = name is not None and message[len(name) + 2 :].startswith("starting, ")
        if starting and name is not None:
            self._scenarios.append(_ScenarioTime(name=name, started=now))
        elif name is not None and self._scenarios and self._scenarios[-1].name == name:
            self._scenarios[-1].cells += 1
            self._scenarios[-1].last_cell = now
        line = self._line(message, name, done, total, now)
        if self._interactive:
            width = shutil.get_terminal_size((120, 24)).columns
            self._stream.write("\r\033[K" + line[: max(20, width - 1)])
        elif name is None or starting or done == total:
            self._stream.write(line + "\n")
        self._stream.flush()

    def _line(self, message: str, name: str | None, done: int, total: int, now: float) -> str:
        head = f"[{done:>{len(str(total))}}/{total}] {format_elapsed(now - self._started)}"
        if name is None:
            return f"{head}  {message}"
        # How many have started: the runner may run them out of file order (grouped by topology).
        number = len(self._scenarios)
        detail = message[len(name) + 2 :]
        return f"{head}  scenario {number}/{len(self._names)} {name}  {detail}"

    def finish(self) -> None:
        """The run ended: end the status line (on a terminal) and stop the clock for `timings`."""
        self._finished = self._clock()
        if self._interactive:
            self._stream.write("\n")
            self._stream.flush()

    def timings(self) -> dict[str, Any]:
        """Seconds spent: `startup_s` (before the first scenario), per scenario (start to last cell,
        with its cell count and seconds per cell), `between_s` (between scenarios: the next
        topology's gateways), and `books_s` (after the last cell: the wait for the gateways' books
        and the shutdown of everything the lab started)."""
        end = self._finished if self._finished is not None else self._clock()
        scenarios = []
        for scenario in self._scenarios:
            seconds = (scenario.last_cell or scenario.started) - scenario.started
            scenarios.append(
                {
                    "name": scenario.name,
                    "seconds": round(seconds, 2),
                    "cells": scenario.cells,
                    "seconds_per_cell": round(seconds / scenario.cells, 3) if scenario.cells else None,
                }
            )
        first = self._scenarios[0].started if self._scenarios else end
        last = max((s.last_cell or s.started for s in self._scenarios), default=end)
        # From one scenario's last cell to the next one's start: dropping pooled connections, and
        # for a scenario of another topology, waiting for that topology's gateways to be up.
        between = sum(
            max(0.0, after.started - (before.last_cell or before.started))
            for before, after in zip(self._scenarios, self._scenarios[1:])
        )
        return {
            "startup_s": round(first - self._started, 2),
            "scenarios": scenarios,
            "between_s": round(between, 2),
            "books_s": round(end - last, 2),
            "total_s": round(end - self._started, 2),
        }

    def summary(self) -> str:
        """One line for the end of the run: where the time went."""
        timings = self.timings()
        slowest = sorted(timings["scenarios"], key=lambda s: s["seconds"], reverse=True)[:3]
        in_scenarios = sum(s["seconds"] for s in timings["scenarios"])
        return (
            f"time: {format_elapsed(timings['total_s'])} in all: {timings['startup_s']:.0f} s to start, "
            f"{in_scenarios:.0f} s in {len(timings['scenarios'])} scenario{'' if len(timings['scenarios']) == 1 else 's'}"
            + (" (slowest: " + ", ".join(f"{s['name']} {s['seconds']:.0f} s" for s in slowest) + ")" if slowest else "")
            + (
                f", {timings['between_s']:.0f} s between scenarios (gateways of the next topology)"
                if timings["between_s"] >= 1
                else ""
            )
            + f", {timings['books_s']:.0f} s for books and shutdown"
        )
