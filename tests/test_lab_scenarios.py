"""Scenario files (labs/scenario.py) and their faults (labs/fault_plan.py)."""

from __future__ import annotations

import dataclasses
import json

import pytest
import trio

from finishline import Dialect
from labs.__main__ import select_scenarios
from labs.dialects import LAB_DIALECTS, UNLISTED_DIALECTS
from labs.fault_plan import FaultPlanError, build_fault
from labs.gateways import GATEWAYS
from labs.gateways.registry import lookup, translates, upstream_dialect
from labs.hub import TunnelDropPolicy
from labs.plan import LabConfig, NotApplicable, plan_cells, plan_not_applicable, scenario_runs
from labs.runner import LabError, run_lab
from labs.scenario import (
    CELL_ID_TEMPLATE,
    MAX_CELLS,
    PINNED_MAX_TOKENS,
    ScenarioError,
    Topology,
    cell_id_of,
    load_scenario,
    load_scenarios,
)
from labs.topology import topology_groups
from labs.worker.request_reading import REQUEST_READINGS
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
    "http-429-before-stream",
    "cut-during-prefill",
    "cut-after-tokens-fin",
    "cut-after-tokens-conn-close",
    "cut-after-tokens-reset",
    "stall-after-tokens",
    "sliced",
    "latency-jitter",
    # The hub and the spare worker (issue 7).
    "incident-prefill-cut-hub-close",
    "cut-during-prefill-hub-error-event",
    "cut-after-tokens-hub-close",
    "cut-after-tokens-hub-error-event",
    "rule1-prefill-cut-hub-close-spare",
    "rule1-prefill-cut-hub-abort-spare",
    # The other dialects' own defects (issue 13).
    "stop-reason-null",
    "close-after-reasoning",
    "bare-error-frame",
    # The conduct scenarios (issue 14); `no-response` and `slow-first-token` are `default = false`.
    "http-429-retry-after",
    "http-500-once",
    "reset-before-head",
    "no-response",
    "slow-first-token",
    "malformed-chunk",
    "http-400-context-length",
    # The failover scenarios (issue 28), all `default = false`.
    "http-429-persistent",
    "http-503-persistent",
    "http-400-content-policy",
    "cut-then-prefill-rejected",
    "flapping-primary",
    "fallback-model-usage",
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


def test_a_finish_fix_table_gives_finish_fixs_options_while_the_scenario_runs(tmp_path):
    path = scenario_file(tmp_path, "[finish_fix]\nfirst_token_timeout = 1\nidle_timeout = 2.5\n")
    assert load_scenario(path).finish_fix_options == {"finish_fix_first_token_timeout": "1", "finish_fix_idle_timeout": "2.5"}
    assert load_scenario(scenario_file(tmp_path, "")).finish_fix_options == {}


def test_no_response_ends_each_attempt_through_finish_fix_within_a_second():
    assert load_scenario_named("no-response").finish_fix_options == {"finish_fix_first_token_timeout": "0.5"}


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
    cells = [(c.scenario.name, c.client, c.gateway) for c in plan_cells(config)]
    assert cells == [
        ("healthy", "pi-ai", "direct"),
        ("healthy", "httpx-sse", "direct"),
        ("healthy", "pi-ai", "finish_fix"),
        ("healthy", "httpx-sse", "finish_fix"),
        ("only", "pi-ai", "finish_fix"),
    ]


def scenario_file(tmp_path, text, name="s"):
    path = tmp_path / f"{name}.toml"
    path.write_text('title = "x"\n' + text)
    return path


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ('deadline_s = "abc"\n', r"`deadline_s` must be a number of seconds above 0, not 'abc'"),
        ("deadline_s = 0\n", r"`deadline_s` must be a number of seconds above 0, not 0"),
        ('order = "first"\n', r"`order` must be an integer, not 'first'"),
        ("prompt = 3\n", r"`prompt` must be a string, not 3"),
        ('clients = "pi-ai"\n', r"`clients` must be a list of names, e.g. \['openai-python'\], not 'pi-ai'"),
        ('gateways = "direct"\n', r"`gateways` must be a list of names"),
        ('[request]\nmax_tokens = "6"\n', r"\[request\]: `max_tokens` must be a positive integer, not '6'"),
        ('[request]\ntools = "yes"\n', r"`\[request\] tools` must be true or false, not 'yes'"),
        ("worker = 3\n", r"`\[worker\]` must be a table, not 3"),
        ("[fault]\nkind = 5\n", r"\[fault\] needs a `kind`"),
        ('[hub]\non_tunnel_drop = "drop"\n', r"\[hub\]: on_tunnel_drop 'drop' is not one of close, error_event, abort"),
        ("[hub]\n", r"\[hub\] needs `on_tunnel_drop` \(close, error_event or abort\)"),
        ('[hub]\non_tunnel_drop = "close"\npolicy = 1\n', r"\[hub\]: unknown keys \['policy'\]; known: on_tunnel_drop"),
        ("hub = 3\n", r"`\[hub\]` must be a table, not 3"),
        ("[pool]\nworkers = 3\n", r"\[pool\]: `workers` must be 1 or 2, not 3"),
        ("[pool]\nworkers = true\n", r"\[pool\]: `workers` must be 1 or 2, not True"),
        ("[pool]\nspares = 1\n", r"\[pool\]: unknown keys \['spares'\]; known: workers"),
        (
            "[finish_fix]\non_cut = 1\n",
            r"\[finish_fix\]: unknown keys \['on_cut'\]; known: first_token_timeout, idle_timeout",
        ),
        (
            '[finish_fix]\nfirst_token_timeout = "1"\n',
            r"\[finish_fix\]: `first_token_timeout` must be a number of seconds >= 0 \(0 = no limit\), not '1'",
        ),
        ("[finish_fix]\nidle_timeout = -2\n", r"\[finish_fix\]: `idle_timeout` must be a number of seconds >= 0"),
        ("finish_fix = 1\n", r"`\[finish_fix\]` must be a table, not 1"),
    ],
)
def test_a_value_of_the_wrong_type_is_refused_naming_the_key(tmp_path, text, message):
    with pytest.raises(ScenarioError, match=message):
        load_scenario(scenario_file(tmp_path, text))


def test_unknown_clients_are_refused_naming_the_valid_ones(tmp_path):
    path = scenario_file(tmp_path, 'clients = ["pi-ai", "curl"]\n')
    with pytest.raises(ScenarioError, match=r"`clients`: unknown 'curl'; valid: openai-python, .*, pi-ai"):
        load_scenario(path)


def test_unknown_gateways_are_refused_naming_the_valid_ones(tmp_path):
    path = scenario_file(tmp_path, 'gateways = ["nginx"]\n')
    with pytest.raises(
        ScenarioError, match=r"`gateways`: unknown 'nginx'; valid: direct, finish_fix, litellm, litellm\+finish_fix"
    ):
        load_scenario(path)


def test_more_than_one_choice_is_refused(tmp_path):
    # The drivers read choice 0 only; a scenario about n=2 would judge half the answer.
    with pytest.raises(ScenarioError, match=r"n = 2: the lab judges one choice"):
        load_scenario(scenario_file(tmp_path, "[worker]\nn = 2\n"))


def test_a_cut_beyond_the_stream_is_a_fault_plan_error(tmp_path):
    path = scenario_file(tmp_path, '[worker]\ntokens = 12\n[fault]\nkind = "cut_after_tokens"\nn = 500\n', name="far")
    with pytest.raises(FaultPlanError, match="far: fault cut_after_tokens: "):
        build_fault(load_scenario(path))


def test_an_http_error_before_streaming_expects_an_error():
    expected = load_scenario_named("http-429-before-stream").expected()
    assert (expected.text, expected.finish_reason, expected.http_error) == ("", None, 429)


def test_expected_tool_calls_carry_name_and_full_arguments():
    expected = load_scenario_named("tool-calls-omitted").expected()
    assert expected.tool_calls
    for call in expected.tool_calls:
        assert call["name"] == "get_weather"
        assert call["arguments"].startswith("{") and call["arguments"].endswith("}")


def test_more_cells_than_the_fixed_width_ids_hold_are_refused_before_anything_starts(tmp_path):
    healthy = load_scenario_named("healthy")
    per_scenario = 9 * 4
    copies = MAX_CELLS // per_scenario + 1
    scenarios = tuple(dataclasses.replace(healthy, name=f"h{i}") for i in range(copies))
    config = LabConfig(scenarios=scenarios, results_dir=tmp_path)
    assert len(plan_cells(config)) > MAX_CELLS

    async def run():
        with trio.fail_after(10):
            await run_lab(config)

    with pytest.raises(LabError, match=f"at most {MAX_CELLS} fit in one run"):
        trio.run(run)


# -- the hub and the pool (issue 7) ----------------------------------------------------------------


def test_no_hub_table_is_todays_topology():
    healthy = load_scenario_named("healthy")
    assert (healthy.hub_policy, healthy.pool_workers, healthy.topology) == (None, 1, Topology(hub=False, workers=1))
    assert healthy.topology.label == "tunnel"


@pytest.mark.parametrize(
    ("name", "policy", "workers", "label"),
    [
        ("incident-prefill-cut-hub-close", "close", 1, "hub"),
        ("cut-during-prefill-hub-error-event", "error_event", 1, "hub"),
        ("cut-after-tokens-hub-close", "close", 1, "hub"),
        ("cut-after-tokens-hub-error-event", "error_event", 1, "hub"),
        ("rule1-prefill-cut-hub-close-spare", "close", 2, "hub+spare"),
        ("rule1-prefill-cut-hub-abort-spare", "abort", 2, "hub+spare"),
    ],
)
def test_the_hub_scenarios_say_their_policy_and_pool(name, policy, workers, label):
    scenario = load_scenario_named(name)
    assert (scenario.hub_policy, scenario.pool_workers, scenario.topology.label) == (TunnelDropPolicy(policy), workers, label)


def test_the_incident_drops_the_tunnel_137_seconds_into_a_longer_prefill():
    # The post-mortem's numbers: the head goes out, then 13.7 s of prefill, then the tunnel drops;
    # the worker is still in prefill then (its prefill is longer), so no event ever comes.
    scenario = load_scenario_named("incident-prefill-cut-hub-close")
    fault = build_fault(scenario)
    toxics = [(t.type, t.attributes) for t in fault.toxics]
    assert toxics == [("limit_data", {"bytes": response_plan(scenario.resolved).head_length}), ("slow_close", {"delay": 13700})]
    assert scenario.resolved.prefill_delay > 13.7 + 5
    assert scenario.deadline_s > 13.7 + 20
    assert fault.summary.endswith("then a FIN 13.7 s later")


def test_scenarios_are_grouped_by_topology_default_first_in_the_given_order():
    names = [
        "rule1-prefill-cut-hub-abort-spare",
        "cut-after-tokens-hub-close",
        "healthy",
        "rule1-prefill-cut-hub-close-spare",
        "reason-omitted",
    ]
    scenarios = tuple(load_scenario_named(name) for name in names)
    config = LabConfig(scenarios=scenarios, clients=("pi-ai",), gateways=("direct",))
    groups = topology_groups(config.scenarios, plan_cells(config))
    assert [(t.label, [s.name for s in group]) for t, group in groups.items()] == [
        ("tunnel", ["healthy", "reason-omitted"]),
        ("hub", ["cut-after-tokens-hub-close"]),
        ("hub+spare", ["rule1-prefill-cut-hub-abort-spare", "rule1-prefill-cut-hub-close-spare"]),
    ]


def test_a_scenario_without_cells_starts_no_topology(tmp_path):
    only_finish_fix = dataclasses.replace(load_scenario_named("cut-after-tokens-hub-close"), gateways=("finish_fix",))
    config = LabConfig(scenarios=(load_scenario_named("healthy"), only_finish_fix), clients=("pi-ai",), gateways=("direct",))
    assert [t.label for t in topology_groups(config.scenarios, plan_cells(config))] == ["tunnel"]


@pytest.mark.parametrize(
    ("model", "cell"),
    [
        ("c0007;tokens=3", "c0007"),
        ("via-finish-fix/c0007;tokens=3", "c0007"),
        ("openai/c0042", "c0042"),
        (None, None),
        ("", None),
    ],
)
def test_the_cell_id_is_read_back_from_a_model_name_as_gateways_and_workers_see_it(model, cell):
    assert cell_id_of(model) == cell


def test_the_external_gateway_runs_only_todays_topology():
    # Its upstream is the tunnel's fixed port: a hub or spare scenario would not reach it.
    scenarios = tuple(
        load_scenario_named(n) for n in ("healthy", "cut-after-tokens-hub-close", "rule1-prefill-cut-hub-abort-spare")
    )
    config = LabConfig(scenarios=scenarios, clients=("pi-ai",), gateways=("direct", "external"))
    assert [(c.scenario.name, c.gateway) for c in plan_cells(config)] == [
        ("healthy", "direct"),
        ("healthy", "external"),
        ("cut-after-tokens-hub-close", "direct"),
        ("rule1-prefill-cut-hub-abort-spare", "direct"),
    ]


# -- dialects (issue 13) ---------------------------------------------------------------------------


def dialect_runs():
    return [(s, d) for s in load_scenarios() for d in s.dialects]


@pytest.mark.parametrize(("scenario", "dialect"), dialect_runs(), ids=lambda x: getattr(x, "name", str(x)))
def test_every_scenario_builds_its_fault_and_answer_in_each_of_its_dialects(scenario, dialect):
    fault = build_fault(scenario, dialect)
    assert (fault is None) == (scenario.fault is None)
    words = {
        Dialect.CHAT: {"stop", "length", "tool_calls"},
        Dialect.MESSAGES: {"end_turn", "max_tokens", "tool_use"},
        Dialect.RESPONSES: {"completed", "incomplete"},
        Dialect.GEMINI: {"STOP", "MAX_TOKENS"},
    }[dialect]
    expected = scenario.expected(dialect)
    assert expected.dialect is dialect
    assert expected.finish_reason in words | {None}


@pytest.mark.parametrize(("scenario", "dialect"), dialect_runs(), ids=lambda x: getattr(x, "name", str(x)))
def test_every_cell_of_a_scenario_gets_the_same_response_length_in_each_dialect(scenario, dialect):
    lengths = set()
    for number in (1, 42, 9999):
        settings = scenario.worker.for_request({"model": scenario.model_name(CELL_ID_TEMPLATE.format(number))}, dialect)
        lengths.add(len(response_plan(settings, dialect=dialect).to_bytes()))
    assert len(lengths) == 1


@pytest.mark.parametrize("dialect", [Dialect.MESSAGES, Dialect.RESPONSES, Dialect.GEMINI])
def test_a_cut_after_n_tokens_is_exact_in_each_dialect(dialect):
    scenario = load_scenario_named("cut-after-tokens-hub-close")
    fault = build_fault(scenario, dialect)
    limits = [t.attributes["bytes"] for t in fault.toxics if t.type == "limit_data"]
    assert limits == [response_plan(scenario.resolved, dialect=dialect).offset_after_tokens(5)]
    # Not Chat's offset: the same settings are other bytes in another dialect.
    assert limits != [response_plan(scenario.resolved).offset_after_tokens(5)]


@pytest.mark.parametrize(
    ("name", "dialect", "reason"),
    [
        ("healthy", Dialect.MESSAGES, "end_turn"),
        ("healthy", Dialect.RESPONSES, "completed"),
        ("length-omitted", Dialect.MESSAGES, "max_tokens"),
        ("tool-calls-omitted", Dialect.MESSAGES, "tool_use"),
        ("tool-calls-omitted", Dialect.CHAT, "tool_calls"),
        ("stop-reason-null", Dialect.MESSAGES, "end_turn"),
        # The worker's answer ends before any finish: success is a silent truncation.
        ("bare-error-frame", Dialect.RESPONSES, None),
        ("close-after-reasoning", Dialect.RESPONSES, None),
    ],
)
def test_the_true_reason_is_in_the_dialects_words(name, dialect, reason):
    assert load_scenario_named(name).expected(dialect).finish_reason == reason


def test_a_scenario_without_dialects_runs_in_all_three(tmp_path):
    scenario = load_scenario(scenario_file(tmp_path, ""))
    assert scenario.dialects == scenario.default_dialects == (Dialect.CHAT, Dialect.MESSAGES, Dialect.RESPONSES)


def test_dialects_come_in_their_fixed_order_whatever_order_the_file_lists(tmp_path):
    scenario = load_scenario(scenario_file(tmp_path, 'dialects = ["responses", "chat"]\ndefault_dialects = ["responses"]\n'))
    assert (scenario.dialects, scenario.default_dialects) == ((Dialect.CHAT, Dialect.RESPONSES), (Dialect.RESPONSES,))


def test_default_false_takes_a_scenario_out_of_the_default_run_in_every_dialect(tmp_path):
    scenario = load_scenario(scenario_file(tmp_path, 'default = false\ndialects = ["messages"]\n'))
    assert (scenario.dialects, scenario.default_dialects, scenario.default) == ((Dialect.MESSAGES,), (), False)


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ('dialects = ["chat", "anthropic"]\n', r"`dialects`: unknown 'anthropic'; valid: chat, messages, responses"),
        ('dialects = "chat"\n', r"`dialects` must be a list of names, e.g. \['chat'\], not 'chat'"),
        ("dialects = []\n", r"`dialects` is empty: list at least one of chat, messages, responses"),
        ('dialects = ["chat"]\ndefault_dialects = ["messages"]\n', r"`default_dialects`: 'messages' not in `dialects` \(chat\)"),
        ('default_dialects = ["soap"]\n', r"`default_dialects`: unknown 'soap'; valid: chat, messages, responses"),
        ('default = false\ndefault_dialects = ["chat"]\n', r"`default = false` and `default_dialects` \['chat'\] contradict"),
    ],
)
def test_a_bad_dialects_key_is_refused_naming_it_and_the_valid_words(tmp_path, text, message):
    with pytest.raises(ScenarioError, match=message):
        load_scenario(scenario_file(tmp_path, text))


def test_a_scenario_may_name_a_client_of_any_dialect(tmp_path):
    scenario = load_scenario(scenario_file(tmp_path, 'clients = ["anthropic-python", "pi-ai"]\n'))
    assert scenario.clients == ("anthropic-python", "pi-ai")


BRIDGES = (
    "litellm-chat-bridge",
    "litellm-chat-bridge+finish_fix",
    "litellm-responses-bridge",
    "litellm-responses-bridge+finish_fix",
)


def test_every_lab_gateway_serves_each_dialect_its_routes_name_and_only_the_bridges_translate():
    gemini_only = ("litellm-gemini-passthrough", "litellm-gemini-passthrough+finish_fix")
    chat_only = ("litellm-gemini-bridge", "litellm-gemini-bridge+finish_fix")
    assert [g for g in GATEWAYS if Dialect.CHAT in lookup(g).dialects] == [
        g for g in GATEWAYS if g not in BRIDGES and g not in gemini_only
    ]
    assert [g for g in GATEWAYS if Dialect.MESSAGES in lookup(g).dialects] == [
        g for g in GATEWAYS if g not in gemini_only + chat_only
    ]
    assert [g for g in GATEWAYS if Dialect.RESPONSES in lookup(g).dialects] == [
        g for g in GATEWAYS if not g.startswith("litellm-responses-bridge") and g not in gemini_only + chat_only
    ]
    translating = {(g, d.value, upstream_dialect(g, d).value) for g in GATEWAYS for d in lookup(g).routes if translates(g, d)}
    assert translating == {
        ("litellm-chat-bridge", "messages", "chat"),
        ("litellm-chat-bridge", "responses", "chat"),
        ("litellm-chat-bridge+finish_fix", "messages", "chat"),
        ("litellm-chat-bridge+finish_fix", "responses", "chat"),
        ("litellm-responses-bridge", "messages", "responses"),
        ("litellm-responses-bridge+finish_fix", "messages", "responses"),
        ("litellm-chat-bridge", "gemini", "chat"),
        ("litellm-chat-bridge+finish_fix", "gemini", "chat"),
        ("litellm-gemini-bridge", "chat", "gemini"),
        ("litellm-gemini-bridge+finish_fix", "chat", "gemini"),
    }


def test_a_bridge_runs_a_scenario_from_its_upstream_dialect_when_the_scenario_lists_both():
    scenarios = (load_scenario_named("healthy"), load_scenario_named("stop-reason-null"), load_scenario_named("bare-error-frame"))
    config = LabConfig(
        scenarios=scenarios,
        clients=("pi-ai",),
        gateways=("direct", "litellm-chat-bridge", "litellm-responses-bridge"),
        # The three dialects a scenario runs in when it lists none (Gemini's bridge rows: the Gemini gateways' tests).
        dialects=UNLISTED_DIALECTS,
    )
    assert [(c.scenario.name, c.dialect.value, c.gateway, c.upstream.value) for c in plan_cells(config)] == [
        ("healthy", "chat", "direct", "chat"),
        ("healthy", "messages", "direct", "messages"),
        ("healthy", "messages", "litellm-chat-bridge", "chat"),
        ("healthy", "messages", "litellm-responses-bridge", "responses"),
        # Messages only: the worker's settings mean nothing in Chat or Responses.
        ("stop-reason-null", "messages", "direct", "messages"),
        # Messages and Responses: bridged from Responses, not from Chat.
        ("bare-error-frame", "messages", "direct", "messages"),
        ("bare-error-frame", "messages", "litellm-responses-bridge", "responses"),
        ("healthy", "responses", "direct", "responses"),
        ("healthy", "responses", "litellm-chat-bridge", "chat"),
        ("bare-error-frame", "responses", "direct", "responses"),
    ]
    # A translated cell runs with the untranslated cells whose worker speaks its upstream dialect.
    planned = plan_cells(config)
    assert scenario_runs(planned, scenarios[0]) == list(UNLISTED_DIALECTS)
    assert scenario_runs(planned, scenarios[2]) == [Dialect.MESSAGES, Dialect.RESPONSES]
    assert plan_not_applicable(config) == [
        NotApplicable(
            dialect=Dialect.CHAT,
            gateway="litellm-chat-bridge",
            why="litellm-chat-bridge: a Chat client needs no bridge to a Chat worker: its native route is the `litellm` column",
        ),
        NotApplicable(
            dialect=Dialect.CHAT,
            gateway="litellm-responses-bridge",
            why="litellm-responses-bridge: LiteLLM 1.108.7 bridges no Chat Completions request to /v1/responses",
        ),
        NotApplicable(
            dialect=Dialect.RESPONSES,
            gateway="litellm-responses-bridge",
            why=(
                "litellm-responses-bridge: a Responses client needs no bridge to a Responses worker: "
                "its native route is the `litellm` column"
            ),
        ),
    ]


def test_a_scenarios_upstream_dialect_pins_the_worker_and_keeps_only_the_routes_that_bring_it(tmp_path):
    scenario = load_scenario(scenario_file(tmp_path, 'upstream_dialect = "chat"\ndialects = ["messages", "responses"]\n'))
    assert scenario.upstream_dialect is Dialect.CHAT
    config = LabConfig(
        scenarios=(scenario,),
        clients=("pi-ai",),
        gateways=("direct", "litellm", "litellm-chat-bridge", "litellm-responses-bridge", "external"),
        dialects=LAB_DIALECTS,
    )
    assert [(c.dialect.value, c.gateway, c.upstream.value) for c in plan_cells(config)] == [
        ("messages", "litellm-chat-bridge", "chat"),
        # Your own gateway is taken to translate as the scenario says.
        ("messages", "external", "chat"),
        ("responses", "litellm-chat-bridge", "chat"),
        ("responses", "external", "chat"),
    ]


@pytest.mark.parametrize("value", ["anthropic", 3, ["chat"]])
def test_a_bad_upstream_dialect_is_refused_naming_it_and_the_valid_words(tmp_path, value):
    text = f"upstream_dialect = {json.dumps(value)}\n"
    with pytest.raises(ScenarioError, match="`upstream_dialect` must be one of chat, messages, responses"):
        load_scenario(scenario_file(tmp_path, text))


def test_no_n_a_for_a_dialect_whose_cells_the_run_would_not_have_anyway():
    # Chat only: the other dialects are not asked for; httpx-sse speaks only Chat.
    healthy = load_scenario_named("healthy")
    assert plan_not_applicable(LabConfig(scenarios=(healthy,), gateways=("litellm",))) == []
    only_chat_client = LabConfig(scenarios=(healthy,), clients=("httpx-sse",), gateways=("litellm",), dialects=LAB_DIALECTS)
    assert plan_not_applicable(only_chat_client) == []


def test_the_default_run_takes_each_scenario_in_its_default_dialects_and_all_in_every_one():
    default = {s.name: s.dialects for s in select_scenarios(None, everything=False)}
    everything = {s.name: s.dialects for s in select_scenarios(None, everything=True)}
    assert default["tool-calls-omitted"] == (Dialect.CHAT, Dialect.MESSAGES)
    assert default["reason-empty"] == (Dialect.CHAT,)
    assert everything["reason-empty"] == (Dialect.CHAT, Dialect.MESSAGES, Dialect.GEMINI)
    # In all four: in Messages and Responses it is also the translation row of a Chat worker.
    assert default["reason-omitted"] == LAB_DIALECTS
    assert "sliced" not in default and everything["sliced"] == LAB_DIALECTS
    # The Chat part of the default run is the scenarios it had before there were dialects.
    assert {name for name, dialects in default.items() if Dialect.CHAT in dialects} == DEFAULT_SET - {
        "cut-after-tokens-reset",
        "sliced",
        "latency-jitter",
        "stop-reason-null",
        "close-after-reasoning",
        "bare-error-frame",
        # The slow conduct scenarios (issue 14) are `default = false`.
        "no-response",
        "slow-first-token",
        # The failover scenarios (issue 28) are `default = false` (their own topology).
        "http-429-persistent",
        "http-503-persistent",
        "http-400-content-policy",
        "cut-then-prefill-rejected",
        "flapping-primary",
        "fallback-model-usage",
    }


def test_asking_for_dialects_narrows_every_scenario_to_them():
    chosen = select_scenarios(None, everything=False, dialects=(Dialect.MESSAGES,))
    assert all(s.dialects == (Dialect.MESSAGES,) for s in chosen)
    assert {s.name for s in chosen} == {
        "healthy",
        "reason-omitted",
        "stop-reason-null",
        "tool-calls-omitted",
        "cut-after-tokens-fin",
        "cut-after-tokens-hub-close",
        "stall-after-tokens",
        # The fixed hub speaks each client's dialect (issue 25, item 3): its rows run in Chat, Messages and Responses.
        "cut-during-prefill-hub-error-event",
        "cut-after-tokens-hub-error-event",
    }
    # By name: in the dialects it lists, default or not.
    assert [s.dialects for s in select_scenarios(["reason-empty"], everything=False)] == [
        (Dialect.CHAT, Dialect.MESSAGES, Dialect.GEMINI)
    ]


CONDUCT = (
    "no-response",
    "slow-first-token",
    "http-429-retry-after",
    "http-500-once",
    "reset-before-head",
    "malformed-chunk",
    "http-400-context-length",
)


@pytest.mark.parametrize("name", CONDUCT)
def test_the_conduct_scenarios_run_in_every_dialect_and_the_default_run_takes_chat(name):
    # Issue 25, item 6: the same faults meet Messages and Responses clients and their gateways.
    (by_name,) = select_scenarios([name], everything=False)
    assert by_name.dialects == LAB_DIALECTS
    everything = {s.name: s.dialects for s in select_scenarios(None, everything=True)}
    assert everything[name] == LAB_DIALECTS
    default = {s.name: s.dialects for s in select_scenarios(None, everything=False)}
    assert default.get(name, ()) in ((Dialect.CHAT,), ())  # `no-response`, `slow-first-token`: not in it


@pytest.mark.parametrize("name", ["cut-during-prefill-hub-error-event", "cut-after-tokens-hub-error-event"])
def test_the_hub_error_event_rows_run_in_every_dialect_by_default(name):
    default = {s.name: s.dialects for s in select_scenarios(None, everything=False)}
    # Gemini's default rows are fewer (the run's time): the hub's Gemini error frame runs by name.
    assert default[name] == UNLISTED_DIALECTS
    everything = {s.name: s.dialects for s in select_scenarios(None, everything=True)}
    assert everything[name] == LAB_DIALECTS


#: The output limits clients ask for on their own: none (most libraries), another than the lab's
#: (1024), the lab's (4096: its Anthropic SDK drivers' and, in Pi's models.json, Pi's), Claude Code's 32000.
ASKED_LIMITS = (None, 1024, 4096, 32000)


@pytest.mark.parametrize("dialect", list(LAB_DIALECTS))
@pytest.mark.parametrize("asked", ASKED_LIMITS)
def test_a_clients_own_output_limit_does_not_change_the_workers_bytes(dialect, asked):
    # The cut is laid out from `scenario.resolved`; the worker answers each request with the
    # scenario's settings resolved against the request's body, and echoes them in the head (and, in
    # Responses, `max_output_tokens`). With the limit pinned, every body gives the layout's bytes.
    scenario = load_scenario_named("cut-after-tokens-hub-close")
    # (Cell ids all have one length; the layout is made with the first's.)
    body = {"model": scenario.model_name(CELL_ID_TEMPLATE.format(0)), "stream": True}
    if asked is not None:
        body[REQUEST_READINGS[dialect].max_tokens_keys[0]] = asked
    served = scenario.worker.for_request(body, dialect)
    assert served.max_tokens == PINNED_MAX_TOKENS
    assert response_plan(served, dialect=dialect).to_bytes() == response_plan(scenario.resolved, dialect=dialect).to_bytes()


def test_a_scenarios_own_limit_still_wins(tmp_path):
    scenario = load_scenario(scenario_file(tmp_path, "[request]\nmax_tokens = 6\n"))
    assert scenario.resolved.max_tokens == 6


def test_every_other_gateway_is_na_in_gemini_with_a_reason():
    config = LabConfig(scenarios=(load_scenario_named("healthy"),), clients=("google-genai",), dialects=(Dialect.GEMINI,))
    not_applicable = {entry.gateway: entry.why for entry in plan_not_applicable(config) if entry.dialect is Dialect.GEMINI}
    assert "direct" not in not_applicable and "finish_fix" not in not_applicable
    assert not_applicable and all(why.startswith(f"{gateway}: ") for gateway, why in not_applicable.items())


def test_the_default_run_has_the_worker_speak_only_what_it_takes_of_each_scenario():
    # A translating gateway's cells have the worker speak another dialect than their client's: in the
    # default run only one the scenario's `default_dialects` names (LiteLLM's Gemini bridge would
    # otherwise run every Chat scenario again with a Gemini worker). `--all` keeps every listed one.
    config = LabConfig(scenarios=tuple(select_scenarios([], False)), gateways=GATEWAYS, dialects=LAB_DIALECTS)
    planned = plan_cells(config)
    assert planned
    for cell in planned:
        assert cell.upstream in cell.scenario.default_dialects, (cell.scenario.name, cell.gateway, cell.upstream)
    assert {cell.upstream for cell in planned if cell.gateway == "litellm-gemini-bridge"} == {Dialect.GEMINI}
    every = plan_cells(LabConfig(scenarios=tuple(select_scenarios([], True)), gateways=GATEWAYS, dialects=LAB_DIALECTS))
    assert any(cell.upstream not in cell.scenario.default_dialects for cell in every)
