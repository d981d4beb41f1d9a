"""What `python -m labs` shows while it runs and what it runs by default (labs/progress.py,
labs/__main__.py): the status line, the time each part took, the default run and `--all`."""

from __future__ import annotations

import io
from pathlib import Path

import pytest

from finishline import Dialect
from labs.__main__ import select_clients, select_scenarios
from labs.clients import AGENT_CLIENTS, ALL_CLIENTS, CLIENTS_BY_DIALECT, DEFAULT_CLIENTS, EVERY_CLIENT, LIBRARY_CLIENTS_BY_DIALECT
from labs.dialects import LAB_DIALECTS
from labs.progress import Progress, format_elapsed
from labs.scenario import ScenarioError, load_scenario

SCENARIOS = ["cut-after-tokens", "cut-after-tokens-fin"]


class FakeClock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def _run(progress: Progress, clock: FakeClock) -> None:
    """Two scenarios of two cells each, the way labs.runner.run_lab reports them."""
    clock.now += 20  # start-up: worker, toxiproxy, gateways, hosts
    progress("worker on 127.0.0.1:1; starting gateways", 0, 4)
    progress("cut-after-tokens: starting, 2 cells", 0, 4)
    clock.now += 1
    progress("cut-after-tokens: pi-ai via direct: error", 1, 4)
    clock.now += 2
    progress("cut-after-tokens: openai-python via direct: ok", 2, 4)
    clock.now += 1
    progress("cut-after-tokens-fin: starting, 2 cells", 2, 4)
    clock.now += 6
    progress("cut-after-tokens-fin: pi-ai via direct: hang", 3, 4)
    progress("cut-after-tokens-fin: openai-python via direct: hang", 4, 4)
    clock.now += 5  # books and shutdown
    progress.finish()


def test_elapsed_time_reads_as_minutes_and_seconds():
    assert [format_elapsed(s) for s in (0, 9.9, 65, 3725)] == ["0:00", "0:09", "1:05", "1:02:05"]


def test_the_status_line_says_cells_done_of_total_elapsed_and_which_scenario():
    clock, out = FakeClock(), io.StringIO()
    progress = Progress(SCENARIOS, out, interactive=True, clock=clock)
    clock.now += 72
    progress("cut-after-tokens-fin: starting, 2 cells", 57, 340)
    progress("cut-after-tokens-fin: pi-ai via litellm: error", 58, 340)
    # Rewritten in place; scenarios are counted as they start (the runner groups them by topology);
    # the longest matching name wins (`cut-after-tokens` is a prefix).
    assert out.getvalue().split("\r\033[K")[1:] == [
        "[ 57/340] 1:12  scenario 1/2 cut-after-tokens-fin  starting, 2 cells",
        "[ 58/340] 1:12  scenario 1/2 cut-after-tokens-fin  pi-ai via litellm: error",
    ]


def test_without_a_terminal_there_is_one_line_per_scenario_and_one_at_the_end():
    clock, out = FakeClock(), io.StringIO()
    progress = Progress(SCENARIOS, out, interactive=False, clock=clock)
    _run(progress, clock)
    assert out.getvalue().splitlines() == [
        "[0/4] 0:20  worker on 127.0.0.1:1; starting gateways",
        "[0/4] 0:20  scenario 1/2 cut-after-tokens  starting, 2 cells",
        "[2/4] 0:24  scenario 2/2 cut-after-tokens-fin  starting, 2 cells",
        "[4/4] 0:30  scenario 2/2 cut-after-tokens-fin  openai-python via direct: hang",
    ]
    assert "\r" not in out.getvalue()


def test_timings_split_start_up_scenarios_and_books():
    clock = FakeClock()
    progress = Progress(SCENARIOS, io.StringIO(), interactive=False, clock=clock)
    _run(progress, clock)
    assert progress.timings() == {
        "startup_s": 20.0,
        "scenarios": [
            {"name": "cut-after-tokens", "seconds": 3.0, "cells": 2, "seconds_per_cell": 1.5},
            {"name": "cut-after-tokens-fin", "seconds": 6.0, "cells": 2, "seconds_per_cell": 3.0},
        ],
        "between_s": 1.0,
        "books_s": 5.0,
        "total_s": 35.0,
    }
    assert progress.summary() == (
        "time: 0:35 in all: 20 s to start, 9 s in 2 scenarios "
        "(slowest: cut-after-tokens-fin 6 s, cut-after-tokens 3 s), 1 s between scenarios (gateways of the next topology), "
        "5 s for books and shutdown"
    )


def _scenario_file(directory: Path, name: str, extra: str = "") -> None:
    (directory / f"{name}.toml").write_text(f'title = "{name}"\n{extra}', encoding="utf-8")


def test_the_default_run_leaves_out_scenarios_marked_default_false(tmp_path):
    _scenario_file(tmp_path, "in-the-default-run")
    _scenario_file(tmp_path, "only-with-all", "default = false\n")
    assert [s.name for s in select_scenarios(None, everything=False, directory=tmp_path)] == ["in-the-default-run"]
    assert [s.name for s in select_scenarios(None, everything=True, directory=tmp_path)] == [
        "in-the-default-run",
        "only-with-all",
    ]
    # Asked for by name, a scenario runs whatever its file says.
    assert [s.name for s in select_scenarios(["only-with-all"], everything=False, directory=tmp_path)] == ["only-with-all"]


def test_default_must_be_true_or_false(tmp_path):
    _scenario_file(tmp_path, "bad", 'default = "no"\n')
    with pytest.raises(ScenarioError, match=r"`default` must be true or false, not 'no'"):
        load_scenario(tmp_path / "bad.toml")


def test_the_default_run_has_the_default_clients_and_all_lifts_it():
    assert select_clients(None, everything=False) == DEFAULT_CLIENTS
    # `--all`: every Chat library, then Pi's coding agent (the one agent that speaks Chat).
    assert select_clients(None, everything=True) == (*ALL_CLIENTS, "pi-coding-agent")
    assert set(DEFAULT_CLIENTS) < set(ALL_CLIENTS)
    # Asked for by name (in any order), clients come in the matrix's order, default or not.
    assert select_clients(["pi-ai", "httpx-sse"], everything=False) == ("httpx-sse", "pi-ai")


def test_the_default_run_has_every_client_of_the_new_dialects_and_chats_default_ones():
    every = LAB_DIALECTS
    chosen = select_clients(None, everything=False, dialects=every)
    assert set(chosen) == set(DEFAULT_CLIENTS) | {
        client
        for dialect in (Dialect.MESSAGES, Dialect.RESPONSES, Dialect.GEMINI)
        for client in LIBRARY_CLIENTS_BY_DIALECT[dialect]
    }
    assert "httpx-sse" not in chosen and "anthropic-python-helper" in chosen
    # No coding agent in the default run: they add a minute or more (docs/lab.md, "The coding agents").
    assert not set(AGENT_CLIENTS) & set(chosen)
    assert select_clients(None, everything=True, dialects=(Dialect.MESSAGES,)) == tuple(
        c for c in EVERY_CLIENT if c in CLIENTS_BY_DIALECT[Dialect.MESSAGES]
    )
