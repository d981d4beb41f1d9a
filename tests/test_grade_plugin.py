"""The pytest plugin, as a user's suite sees it (pytester): the server checks as tests, one id per
check, the card's evidence as the failure message; and the fixtures in a user's own test file."""

from __future__ import annotations

import contextlib
import socket

import pytest
import trio

from faults.child_processes import free_port
from finishline import Dialect
from finishline import pytest_plugin as finishline_plugin
from labs.dialects import LAB_DIALECTS
from labs.grade.gateway_plan import card_check_ids
from labs.grade.server_checks import SERVER_CHECKS
from labs.grade.server_suites import SERVER_SUITES

pytest_plugins = ["pytester"]

CHECK_IDS = [c.check for c in SERVER_CHECKS]


@pytest.fixture(autouse=True, scope="module")
def _graders_imported_out_here():
    """Grade an unreachable server once in this process, before any in-process `pytester` run.

    pytester drops every module an inner run imported when that run ends. What the graders import
    lazily (httpx's connection backend, on the first connection) would then be imported inside the
    first inner run and afresh by the next, and an error raised by one copy is not caught as the
    other's class: the one-line "cannot connect" turned into a raw httpcore.ConnectError, in
    whichever test connected first. Grading once out here loads them where every run shares them.
    """
    from labs.grade.card import GradeError
    from labs.grade.server_grader import read_server

    with pytest.raises(GradeError, match="cannot connect"):
        trio.run(read_server, "http://127.0.0.1:9/v1")


@pytest.mark.timeout(600)
def test_server_checks_are_one_test_per_check(pytester, finishline_worker):
    result = pytester.runpytest(f"--finishline-server-url={finishline_worker()}", "-v", "-p", "no:cacheprovider")
    result.assert_outcomes(passed=len(CHECK_IDS))
    result.stdout.fnmatch_lines([f"finishline/server::{check} PASSED*" for check in CHECK_IDS])


@pytest.mark.timeout(600)
def test_a_failing_check_fails_with_the_evidence_line(pytester, finishline_worker):
    result = pytester.runpytest(
        f"--finishline-server-url={finishline_worker('finish=omitted')}", "-rfs", "-p", "no:cacheprovider"
    )
    # finish=omitted: the two reason-presence checks fail, the three reason-value checks skip.
    result.assert_outcomes(passed=len(CHECK_IDS) - 5, failed=2, skipped=3)
    result.stdout.fnmatch_lines(
        [
            "_* finishline/server::stream-finish-reason _*",
            "stream a natural stop: choice 0 got no non-empty finish_reason before [DONE]; the core: injected finish_reason 'stop' for choice 0 before [DONE]",
            "_* finishline/server::json-finish-reason _*",
            "JSON a natural stop: choice 0 finish_reason is null or missing; the core: repaired: set finish_reason 'stop' for choice 0",
            "SKIPPED*not tested: a natural stop: no finish_reason given to judge (see stream-finish-reason, json-finish-reason)",
        ]
    )
    # The failure section is the evidence line, not a traceback into the plugin.
    assert "CheckFailed" not in result.stdout.str() and "Traceback" not in result.stdout.str()


@pytest.mark.timeout(600)
def test_an_unreachable_server_fails_every_check_with_one_line(pytester):
    result = pytester.runpytest("--finishline-server-url=http://127.0.0.1:9/v1", "-p", "no:cacheprovider")
    result.assert_outcomes(failed=len(CHECK_IDS))
    result.stdout.fnmatch_lines(
        [
            "_* finishline/server::stream-no-error _*",
            "the grader could not run: cannot connect to the server at http://127.0.0.1:9/v1 (Connection refused); is it running? check --url",
        ]
    )


@pytest.mark.timeout(600)
def test_server_checks_in_another_dialect(pytester, finishline_worker):
    # The Messages suite's ids; a defect fails its check with the card's evidence line.
    messages = [c.check for c in SERVER_SUITES[Dialect.MESSAGES].checks]
    result = pytester.runpytest(
        f"--finishline-server-url={finishline_worker('done=0')}",
        "--finishline-server-dialect=messages",
        "-v",
        "-p",
        "no:cacheprovider",
    )
    result.assert_outcomes(passed=len(messages) - 1, failed=1)
    result.stdout.fnmatch_lines([f"finishline/server::{check} *" for check in messages])
    result.stdout.fnmatch_lines(["stream a natural stop ended without message_stop (end, last event: message_delta)*"])


def test_the_plugins_dialect_words_are_the_cores(pytester):
    # The plugin offers exactly the core's words of the dialects the graders speak (the lab's,
    # each with a server suite, Gemini's too), and an unknown one is pytest's usage error that
    # lists them.
    assert tuple(SERVER_SUITES) == LAB_DIALECTS
    assert finishline_plugin._DIALECTS == LAB_DIALECTS
    result = pytester.runpytest(
        "--finishline-server-url=http://127.0.0.1:9/v1", "--finishline-server-dialect=anthropic", "-p", "no:cacheprovider"
    )
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    offered = "*, *".join(SERVER_SUITES)
    result.stderr.fnmatch_lines([f"*--finishline-server-dialect: invalid choice: 'anthropic' (choose from *{offered}*)*"])
    result = pytester.runpytest(
        "--finishline-gateway-url=http://127.0.0.1:9/v1", "--finishline-gateway-dialect=anthropic", "-p", "no:cacheprovider"
    )
    offered = "*, *".join(LAB_DIALECTS)
    result.stderr.fnmatch_lines([f"*--finishline-gateway-dialect: invalid choice: 'anthropic' (choose from *{offered}*)*"])


@pytest.mark.timeout(600)
def test_server_checks_in_gemini(pytester, finishline_worker):
    # The Gemini suite's ids; a worker without finishReason fails its two presence checks with the
    # card's evidence, the reason checks (nothing to judge) and the error frame (none came) skip.
    gemini = [c.check for c in SERVER_SUITES[Dialect.GEMINI].checks]
    result = pytester.runpytest(
        f"--finishline-server-url={finishline_worker('tokens=3; finish=omitted')}",
        "--finishline-server-dialect=gemini",
        "-v",
        "-p",
        "no:cacheprovider",
    )
    result.assert_outcomes(passed=len(gemini) - 6, failed=2, skipped=4)
    result.stdout.fnmatch_lines([f"finishline/server::{check} *" for check in gemini])
    result.stdout.fnmatch_lines(["*stream a natural stop: its last candidate chunk (3 of 3) carries no finishReason*"])


def test_without_the_options_the_plugin_adds_no_test(pytester):
    pytester.makepyfile("def test_mine(): pass")
    result = pytester.runpytest("-p", "no:cacheprovider")
    result.assert_outcomes(passed=1)


def test_the_gateway_checks_need_the_upstream_port(pytester):
    result = pytester.runpytest("--finishline-gateway-url=http://127.0.0.1:9/v1", "-p", "no:cacheprovider")
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    result.stderr.fnmatch_lines(["*--finishline-gateway-url needs --finishline-upstream-port P*"])


@pytest.mark.e2e
@pytest.mark.timeout(600)
def test_the_fixtures_in_a_users_own_tests(pytester):
    pytester.makepyfile(
        """
        import httpx
        import pytest

        BODY = {"model": "m", "stream": True, "messages": [{"role": "user", "content": "hi"}]}

        def test_worker_with_a_defect(finishline_worker):
            url = finishline_worker("tokens=3; finish=omitted")
            body = httpx.post(url + "/chat/completions", json=BODY, timeout=10).text
            assert body.count('"content":') == 4 and '"finish_reason":"stop"' not in body
            assert body.endswith("data: [DONE]\\n\\n")

        @pytest.mark.finishline_worker("tokens=4")
        def test_tunnel_cuts_after_two_tokens(finishline_tunnel):
            with finishline_tunnel.fault("cut_after_tokens", n=2, request=BODY):
                with pytest.raises(httpx.RemoteProtocolError):
                    with httpx.stream("POST", finishline_tunnel.url + "/chat/completions", json=BODY, timeout=10) as response:
                        for _ in response.iter_raw():
                            pass
            # Outside the block the fault is gone: the whole answer arrives.
            body = httpx.post(finishline_tunnel.url + "/chat/completions", json=BODY, timeout=10).text
            assert '"finish_reason":"stop"' in body

        @pytest.mark.finishline_worker("tokens=4")
        def test_hub_policies(finishline_tunnel, finishline_hub):
            url = finishline_hub.url + "/v1/chat/completions"
            with finishline_tunnel.fault("cut_after_tokens", n=2, request=BODY):
                # close: the post-mortem's hub ends the response cleanly; nothing says it was cut.
                body = httpx.post(url, json=BODY, timeout=10).text
                assert body.count('"content":') == 3 and "[DONE]" not in body and "error" not in body
                finishline_hub.on_tunnel_drop = "error_event"
                body = httpx.post(url, json=BODY, timeout=10).text
                assert body.endswith('"code":"worker_disconnected"}}\\n\\n')
        """
    )
    result = pytester.runpytest("-p", "no:cacheprovider", "-v")
    result.assert_outcomes(passed=3)


@pytest.mark.timeout(600)
def test_k_selects_among_the_checks(pytester, finishline_worker):
    result = pytester.runpytest(
        f"--finishline-server-url={finishline_worker('done=0')}", "-k", "stream-done-last", "-p", "no:cacheprovider"
    )
    result.assert_outcomes(failed=1, deselected=len(CHECK_IDS) - 1)


@pytest.mark.e2e
@pytest.mark.timeout(600)
def test_gateway_checks_as_tests_with_k_running_only_the_selected(pytester, start_mitmdump, tmp_path):
    from tests.mitmdump_process import FINISH_FIX_SCRIPT

    upstream_port = free_port()
    mitmdump = start_mitmdump(
        mode=f"reverse:http://127.0.0.1:{upstream_port}",
        scripts=[FINISH_FIX_SCRIPT],
        options={"finish_fix_ledger": str(tmp_path / "ledger.jsonl")},
    )
    result = pytester.runpytest(
        f"--finishline-gateway-url={mitmdump.url}/v1",
        f"--finishline-upstream-port={upstream_port}",
        "--finishline-client=openai-python",
        "-k",
        "cut-after-tokens-fin or prefill-cut-fin",
        "-v",
        "-rs",
        "-p",
        "no:cacheprovider",
    )
    result.assert_outcomes(passed=1, skipped=1, deselected=len(card_check_ids(Dialect.CHAT)) - 2)
    result.stdout.fnmatch_lines(
        [
            "finishline/gateway::prefill-cut-fin SKIPPED*",
            "finishline/gateway::cut-after-tokens-fin PASSED*",
            "SKIPPED*not tested: no --finishline-spare-port: nowhere to retry*",  # the plugin's own option
        ]
    )


@pytest.mark.e2e
@pytest.mark.timeout(600)
def test_a_grader_that_cannot_start_runs_once_and_every_check_says_why(pytester, monkeypatch):
    # Not a GradeError: a toxiproxy server that does not start. The gateway grader is tried once
    # (one connection to check the gateway is there), and every selected check fails with that line.
    monkeypatch.setenv("FINISHLINE_TOXIPROXY_SERVER", "/bin/false")
    with socket.create_server(("127.0.0.1", 0)) as gateway:
        result = pytester.runpytest(
            f"--finishline-gateway-url=http://127.0.0.1:{gateway.getsockname()[1]}/v1",
            f"--finishline-upstream-port={free_port()}",
            "--finishline-client=openai-python",
            "-k",
            "healthy or cut-after-tokens-fin",
            "-p",
            "no:cacheprovider",
        )
        gateway.setblocking(False)
        connections = 0
        with contextlib.suppress(BlockingIOError):
            while True:
                gateway.accept()[0].close()
                connections += 1
    result.assert_outcomes(failed=2, deselected=len(card_check_ids(Dialect.CHAT)) - 2)
    assert connections == 1
    lines = [line for line in result.stdout.lines if line.startswith("the grader could not run: ")]
    assert len(lines) == 2 and lines[0] == lines[1] and "toxiproxy" in lines[0], result.stdout.str()
