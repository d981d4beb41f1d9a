"""What keeps the default lab run short without changing a cell: one LiteLLM for every topology
(routes told apart by the topology's model-name prefix), gateways of a topology started at once,
and services shared by the entries that ask for them started once (the books' wait, counted from
each cell's end, is in tests/test_lab_books_wait.py).

No gateway processes here (the real ones run in tests/test_lab_runner.py and
tests/test_gateway_litellm_spare.py); every test has a deadline, none asserts on timing.
"""

from __future__ import annotations

from pathlib import Path

import pytest
import trio
from trio.testing import MockClock

from finishline import Dialect
from labs.gateways.litellm_proxy import VIA_FINISH_FIX, LiteLLMRoutes, litellm_config
from labs.gateways.registry import GatewayContext, GatewayEntry, RunServices
from labs.gateways.services import Gateway, _start_at_once
from labs.scenario import Topology
from labs.topology import route_prefix
from tests.fixtures_lab import run_trio


def _routes_by_model_name(config: dict) -> dict[str, list[dict]]:
    routes: dict[str, list[dict]] = {}
    for deployment in config["model_list"]:
        routes.setdefault(deployment["model_name"], []).append(deployment["litellm_params"])
    return routes


def test_each_topology_gets_its_own_route_prefix_and_the_default_none():
    prefixes = {route_prefix(t) for t in (Topology(), Topology(hub=True), Topology(hub=True, workers=2), Topology(workers=2))}
    assert prefixes == {"", "hub/", "hub+spare/", "tunnel+spare/"}


def test_one_litellm_config_routes_each_topology_to_its_own_upstreams():
    config = litellm_config(
        [
            LiteLLMRoutes(prefix="", primary_base="http://127.0.0.1:1/v1", finish_fix_base="http://127.0.0.1:2/v1"),
            LiteLLMRoutes(
                prefix="hub+spare/",
                primary_base="http://127.0.0.1:3/v1",
                spare_base="http://127.0.0.1:4/v1",
                finish_fix_base="http://127.0.0.1:5/v1",
            ),
            LiteLLMRoutes(prefix="hub/", primary_base="http://127.0.0.1:3/v1"),
        ],
        master_key="sk-test",
    )
    routes = _routes_by_model_name(config)
    bases = {name: [(d["api_base"], d.get("order")) for d in deployments] for name, deployments in routes.items()}
    # The Chat routes (the Messages and Gemini routes beside them are the next test's).
    assert {name: value for name, value in bases.items() if "messages/" not in name and "gemini/" not in name} == {
        f"{VIA_FINISH_FIX}*": [("http://127.0.0.1:2/v1", None)],
        "*": [("http://127.0.0.1:1/v1", None)],
        # The spare topology's routes: its primary at order 1, the spare at order 2 (LiteLLM's
        # priority failover), the finish_fix route included.
        f"hub+spare/{VIA_FINISH_FIX}*": [("http://127.0.0.1:5/v1", 1), ("http://127.0.0.1:4/v1", 2)],
        "hub+spare/*": [("http://127.0.0.1:3/v1", 1), ("http://127.0.0.1:4/v1", 2)],
        # No finish_fix route where the topology does not run `litellm+finish_fix`.
        "hub/*": [("http://127.0.0.1:3/v1", None)],
    }
    # Every Chat route keeps the model name the worker sees: the pattern's `*` fills `openai/*`.
    assert {
        d["model"]
        for name, deployments in routes.items()
        if "messages/" not in name and "gemini/" not in name
        for d in deployments
    } == {"openai/*"}


def test_each_route_of_each_variant_gets_the_deployment_that_makes_litellm_take_it():
    models = {
        ("litellm", Dialect.RESPONSES): ("c0001;tokens=3", "c0002;tokens=3"),
        ("litellm-responses-bridge+finish_fix", Dialect.MESSAGES): ("c0003;tokens=3",),
    }
    config = litellm_config(
        [
            LiteLLMRoutes(
                prefix="hub/",
                primary_base="http://127.0.0.1:1/v1",
                spare_base="http://127.0.0.1:3/v1",
                finish_fix_base="http://127.0.0.1:2/v1",
                variants=("litellm", "litellm-chat-bridge", "litellm-responses-bridge+finish_fix", "litellm-gemini-bridge"),
                models=models,
            )
        ],
        master_key="sk-test",
    )
    primaries = {
        name: (d[0]["model"], d[0]["api_base"]) for name, d in _routes_by_model_name(config).items() if d[0].get("order") == 1
    }
    assert primaries == {
        "hub/*": ("openai/*", "http://127.0.0.1:1/v1"),
        # Messages natively: LiteLLM's anthropic/ appends /v1/messages to the server's root.
        "hub/messages/*": ("anthropic/*", "http://127.0.0.1:1"),
        # Responses natively: one deployment per model, or LiteLLM would not stream from the worker.
        "hub/responses/c0001;tokens=3": ("openai/c0001;tokens=3", "http://127.0.0.1:1/v1"),
        "hub/responses/c0002;tokens=3": ("openai/c0002;tokens=3", "http://127.0.0.1:1/v1"),
        "hub/messages-from-chat/*": ("hosted_vllm/*", "http://127.0.0.1:1/v1"),
        "hub/responses-from-chat/*": ("custom_openai/*", "http://127.0.0.1:1/v1"),
        # Gemini natively, and Chat from a Gemini worker: LiteLLM's gemini/ appends
        # /models/{model}:streamGenerateContent to its api_base, the server's root.
        "hub/gemini/*": ("gemini/*", "http://127.0.0.1:1"),
        "hub/chat-from-gemini/*": ("gemini/*", "http://127.0.0.1:1"),
        # A Gemini client of a Chat deployment: LiteLLM's Gemini adapter in front of its Chat route.
        "hub/gemini-from-chat/*": ("hosted_vllm/*", "http://127.0.0.1:1/v1"),
        # Behind finish_fix: the topology's finish_fix is the deployment's upstream.
        f"hub/{VIA_FINISH_FIX}messages-from-responses/c0003;tokens=3": ("openai/c0003;tokens=3", "http://127.0.0.1:2/v1"),
    }
    spares = {name: d[1]["api_base"] for name, d in _routes_by_model_name(config).items()}
    assert spares["hub/messages/*"] == "http://127.0.0.1:3" and spares["hub/*"] == "http://127.0.0.1:3/v1"


def test_a_finish_fix_variant_without_the_topologys_finish_fix_is_a_lab_bug():
    with pytest.raises(ValueError, match="litellm-chat-bridge\\+finish_fix needs the topology's finish_fix"):
        litellm_config(
            [LiteLLMRoutes(prefix="", primary_base="http://127.0.0.1:1/v1", variants=("litellm-chat-bridge+finish_fix",))],
            master_key="sk-test",
        )


def _context(tmp_path: Path) -> GatewayContext:
    return GatewayContext(primary_url="http://127.0.0.1:9", spare_url=None, run_dir=tmp_path, run=RunServices(run_dir=tmp_path))


def test_entries_asking_for_one_run_service_at_once_start_it_once(tmp_path):
    ctx = _context(tmp_path)
    starts = []

    async def slow_start():
        starts.append(1)
        await trio.sleep(0.2)
        return len(starts)

    async def entry_start(ctx: GatewayContext) -> Gateway:
        number = await ctx.run.shared_async("service", slow_start)
        return Gateway(name=f"g{number}", base_url="http://127.0.0.1:9/v1")

    entries = [GatewayEntry(name=name, summary="", start=entry_start) for name in ("a", "b", "c")]
    # On the MockClock: the slow start's 0.2 s is trio's own sleep, so it takes no real time.
    gateways = run_trio(_start_at_once, entries, ctx, deadline=10, clock=MockClock(autojump_threshold=0))
    assert starts == [1]
    assert {g.name for g in gateways.values()} == {"g1"}


def test_a_gateway_that_fails_to_start_stops_the_others_and_is_raised_alone(tmp_path):
    ctx = _context(tmp_path)
    cancelled = []

    async def never_ready(ctx: GatewayContext) -> Gateway:
        try:
            await trio.sleep_forever()
        finally:
            cancelled.append(True)

    async def broken(ctx: GatewayContext) -> Gateway:
        raise ValueError("broken gateway did not start")

    entries = [GatewayEntry(name="slow", summary="", start=never_ready), GatewayEntry(name="bad", summary="", start=broken)]
    with pytest.raises(ValueError, match="broken gateway did not start"):
        run_trio(_start_at_once, entries, ctx, deadline=10)
    assert cancelled == [True]
