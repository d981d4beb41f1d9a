"""Our toxiproxy layer: the server process, the client wrapper's fixes, and scoped faults."""

from __future__ import annotations

import socket
import threading
from pathlib import Path

import pytest
import trio

from faults import catalog
from faults.fault import ScopedFault
from faults.toxiproxy_client import InvalidToxic, Toxic, ToxiproxyClient, ToxiproxyUnavailable
from faults.toxiproxy_server import open_toxiproxy_server, run_toxiproxy_server
from tests.fixtures_lab import run_trio

LIMIT = Toxic(name="limit", type="limit_data", attributes={"bytes": 10})


@pytest.mark.e2e
def test_server_reports_version_2_12_0(toxiproxy_server):
    assert toxiproxy_server.client.version() == "2.12.0"
    assert toxiproxy_server.host == "127.0.0.1"


@pytest.mark.e2e
def test_two_servers_at_once_each_client_talks_to_its_own(toxiproxy):
    # toxiproxy-python alone keeps one address per process (class attributes of APIConsumer).
    with run_toxiproxy_server() as other:
        toxiproxy.create_proxy("only_on_first", upstream="127.0.0.1:9")
        other.client.create_proxy("only_on_second", upstream="127.0.0.1:9")
        assert set(toxiproxy.proxies()) == {"only_on_first"}
        assert set(other.client.proxies()) == {"only_on_second"}


@pytest.mark.e2e
def test_server_is_stopped_on_exit():
    with run_toxiproxy_server() as server:
        client = server.client
        client.version()
    with pytest.raises(ToxiproxyUnavailable, match="is the server running"):
        client.version()


@pytest.mark.e2e
def test_open_toxiproxy_server_from_trio():
    async def scenario():
        async with open_toxiproxy_server() as server:
            return await trio.to_thread.run_sync(server.client.version)

    assert run_trio(scenario) == "2.12.0"


def test_a_hung_api_times_out_instead_of_hanging():
    # A real socket that accepts and never answers: requests without a timeout would wait forever.
    with socket.socket() as hung:
        hung.bind(("127.0.0.1", 0))
        hung.listen()
        client = ToxiproxyClient(port=hung.getsockname()[1], timeout=0.3)
        with pytest.raises(ToxiproxyUnavailable, match="Timeout"):
            client.version()


@pytest.mark.e2e
def test_reset_removes_every_toxic_and_enables_every_proxy(toxiproxy):
    toxiproxy.create_proxy("p", upstream="127.0.0.1:9")
    toxiproxy.add_toxic("p", LIMIT)
    toxiproxy.set_enabled("p", False)

    toxiproxy.reset()

    assert toxiproxy.toxics("p") == []
    assert toxiproxy.proxies()["p"].enabled


@pytest.mark.e2e
def test_scoped_fault_removes_its_toxics_when_the_block_raises(toxiproxy):
    toxiproxy.create_proxy("p", upstream="127.0.0.1:9")
    fault = catalog.Fault(name="two", summary="", toxics=(LIMIT, Toxic(name="lag", type="latency", attributes={"latency": 5})))

    with pytest.raises(KeyError), fault.applied(toxiproxy, "p"):
        assert [t.name for t in toxiproxy.toxics("p")] == ["limit", "lag"]
        raise KeyError("boom")

    assert toxiproxy.toxics("p") == []


@pytest.mark.e2e
def test_scoped_fault_undoes_a_half_applied_fault(toxiproxy):
    toxiproxy.create_proxy("p", upstream="127.0.0.1:9")
    fault = catalog.Fault(name="bad", summary="", toxics=(LIMIT, Toxic(name="nonsense", type="no_such_toxic")))

    with pytest.raises(InvalidToxic), fault.applied(toxiproxy, "p"):
        pytest.fail("entered a half-applied fault")

    assert toxiproxy.toxics("p") == []


@pytest.mark.e2e
def test_scoped_fault_leaves_other_toxics_alone(toxiproxy):
    toxiproxy.create_proxy("p", upstream="127.0.0.1:9")
    toxiproxy.add_toxic("p", Toxic(name="someone_elses", type="latency", attributes={"latency": 1}))

    with catalog.latency(milliseconds=5, jitter=1).applied(toxiproxy, "p"):
        assert len(toxiproxy.toxics("p")) == 2

    assert [t.name for t in toxiproxy.toxics("p")] == ["someone_elses"]


@pytest.mark.e2e
def test_down_re_enables_the_proxy_after_an_error(toxiproxy):
    toxiproxy.create_proxy("p", upstream="127.0.0.1:9")

    with pytest.raises(RuntimeError), catalog.down().applied(toxiproxy, "p"):
        assert not toxiproxy.proxies()["p"].enabled
        raise RuntimeError

    assert toxiproxy.proxies()["p"].enabled


@pytest.mark.e2e
def test_async_scoped_fault_is_removed_when_cancelled(toxiproxy):
    toxiproxy.create_proxy("p", upstream="127.0.0.1:9")

    async def scenario():
        with trio.move_on_after(0.2):
            async with catalog.latency().applied(toxiproxy, "p") as applied:
                assert isinstance(applied, ScopedFault)
                await trio.sleep_forever()
        return await trio.to_thread.run_sync(toxiproxy.toxics, "p")

    assert run_trio(scenario) == []


@pytest.mark.e2e
def test_a_scoped_fault_cannot_be_entered_twice(toxiproxy):
    toxiproxy.create_proxy("p", upstream="127.0.0.1:9")
    scoped = catalog.latency().applied(toxiproxy, "p")
    with scoped, pytest.raises(RuntimeError, match="already applied"):
        scoped.__enter__()


@pytest.mark.e2e
def test_open_toxiproxy_server_forks_on_the_trio_thread():
    # The parent-death signal follows the thread that started the server, and trio's worker
    # threads exit when idle: the kernel's per-thread list of children says which thread forked it.
    async def scenario():
        async with open_toxiproxy_server() as server:
            forked_here = Path(f"/proc/self/task/{threading.get_native_id()}/children").read_text().split()
            return server.pid, forked_here, await trio.to_thread.run_sync(server.client.version)

    pid, forked_here, version = run_trio(scenario)
    assert str(pid) in forked_here
    assert version == "2.12.0"
