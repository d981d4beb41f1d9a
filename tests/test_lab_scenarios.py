"""Scenario files (labs/scenario.py) and their faults (labs/fault_plan.py)."""

from __future__ import annotations

import pytest

from labs.fault_plan import FaultPlanError, build_fault
from labs.runner import LabConfig, plan_cells
from labs.scenario import CELL_ID_TEMPLATE, ScenarioError, load_scenario, load_scenarios
from labs.worker.server import settings_for_request
from labs.worker.settings import Finish, WorkerSettings
from labs.worker.wire import response_plan

DEFAULT_SET = {
    "healthy",
    "reason-omitted",
    "reason-empty",
    "length-omitted",
    "tool-calls-omitted",
    "error-event-429",
    "cut-during-prefill",
    "cut-after-tokens-fin",
    "cut-after-tokens-conn-close",
    "cut-after-tokens-reset",
    "stall-after-tokens",
    "sliced",
    "latency-jitter",
}


def test_the_default_set_covers_the_issue_list():
    assert {s.name for s in load_scenarios()} == DEFAULT_SET


@pytest.mark.parametrize("scenario", load_scenarios(), ids=lambda s: s.name)
def test_every_default_scenario_builds_its_fault_and_answer(scenario):
    fault = build_fault(scenario)
    assert (fault is None) == (scenario.fault is None)
    assert scenario.expected().finish_reason in {"stop", "length", "tool_calls", None}


@pytest.mark.parametrize("scenario", load_scenarios(), ids=lambda s: s.name)
def test_every_cell_of_a_scenario_gets_the_same_response_length(scenario):
    # Byte-exact cuts need it: the worker echoes the model name, which carries the cell id.
    lengths = set()
    for number in (1, 42, 9999):
        model = scenario.model_name(CELL_ID_TEMPLATE.format(number))
        settings = settings_for_request(WorkerSettings(), {}, {"model": model, "stream": True})
        lengths.add(len(response_plan(settings).to_bytes()))
    assert len(lengths) == 1


def test_the_worker_reads_the_scenario_from_the_model_name():
    scenario = load_scenario_named("reason-omitted")
    settings = settings_for_request(WorkerSettings(), {}, {"model": scenario.model_name("c0007"), "stream": True})
    assert settings.finish is Finish.OMITTED
    assert settings.reasoning_tokens == 4
    assert settings.model == scenario.model_name("c0007")


def test_request_fields_the_worker_would_take_from_the_request_are_pinned():
    scenario = load_scenario_named("length-omitted")
    assert (scenario.worker.n, scenario.worker.include_usage, scenario.worker.max_tokens) == (1, True, 6)
    assert scenario.request()["max_tokens"] == 6


def load_scenario_named(name):
    return next(s for s in load_scenarios() if s.name == name)


def test_unknown_top_level_key_is_refused(tmp_path):
    path = tmp_path / "bad.toml"
    path.write_text('title = "x"\ncolour = "red"\n')
    with pytest.raises(ScenarioError, match=r"bad.toml: unknown keys \['colour'\]"):
        load_scenario(path)


def test_missing_title_is_refused(tmp_path):
    path = tmp_path / "untitled.toml"
    path.write_text("[worker]\ntokens = 3\n")
    with pytest.raises(ScenarioError, match="missing `title`"):
        load_scenario(path)


def test_bad_worker_setting_is_refused_in_the_workers_words(tmp_path):
    path = tmp_path / "w.toml"
    path.write_text('title = "x"\n[worker]\nfinish = "sometimes"\n')
    with pytest.raises(ScenarioError, match=r"w.toml: \[worker\]: finish must be one of sent, omitted, empty"):
        load_scenario(path)


def test_unknown_fault_is_refused(tmp_path):
    path = tmp_path / "f.toml"
    path.write_text('title = "x"\n[fault]\nkind = "meteor"\n')
    with pytest.raises(FaultPlanError, match="f: unknown fault 'meteor'; known: cut_during_prefill"):
        build_fault(load_scenario(path))


def test_fault_arguments_that_do_not_fit_are_refused(tmp_path):
    path = tmp_path / "g.toml"
    path.write_text('title = "x"\n[fault]\nkind = "latency"\nspeed = 3\n')
    with pytest.raises(FaultPlanError, match="g: fault latency: .*speed"):
        build_fault(load_scenario(path))


def test_a_cut_after_n_tokens_is_exact_for_the_scenario():
    scenario = load_scenario_named("cut-after-tokens-fin")
    plan = response_plan(scenario.resolved)
    fault = build_fault(scenario)
    limits = [t.attributes["bytes"] for t in fault.toxics if t.type == "limit_data"]
    assert limits == [plan.offset_after_tokens(5)]


def test_plan_cells_honours_scenario_restrictions(tmp_path):
    path = tmp_path / "only.toml"
    path.write_text('title = "x"\nclients = ["pi-ai"]\ngateways = ["finish_fix"]\n')
    restricted = load_scenario(path)
    healthy = load_scenario_named("healthy")
    config = LabConfig(scenarios=(healthy, restricted), clients=("pi-ai", "httpx-sse"), gateways=("direct", "finish_fix"))
    cells = [(s.name, c, g) for s, c, g in plan_cells(config)]
    assert cells == [
        ("healthy", "pi-ai", "direct"),
        ("healthy", "httpx-sse", "direct"),
        ("healthy", "pi-ai", "finish_fix"),
        ("healthy", "httpx-sse", "finish_fix"),
        ("only", "pi-ai", "finish_fix"),
    ]
