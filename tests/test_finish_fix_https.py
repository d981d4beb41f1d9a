"""finish_fix in regular mode with HTTPS interception: the openai client uses mitmdump as its HTTPS
proxy and trusts the mitmproxy CA from the temporary confdir; the upstream is HTTPS on 127.0.0.1 with
a self-signed certificate (hence `ssl_insecure=true` on mitmdump's side).

The upstream also speaks HTTP/2 when offered: mitmproxy offers it upstream only when the client
offered it, so an HTTP/2 client gives HTTP/2 on both sides, and rule C6's HTTP/2 cuts (RST_STREAM,
connection loss, a short content-length) are checked end to end."""

from __future__ import annotations

import datetime
import ipaddress
import ssl
import threading
from collections.abc import Iterator
from pathlib import Path

import openai
import pytest
from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import NameOID

from tests.chat_streams import chat_stream
from tests.e2e_support import (
    ANSWER,
    CUTS,
    PARTIAL,
    assert_interrupted_error,
    finish_reasons,
    openai_client,
    text_of,
)
from tests.mitmdump_process import FINISH_FIX_SCRIPT, Mitmdump, running_mitmdump
from tests.upstream_server import Ending, Script, UpstreamServer

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(600)]


def write_self_signed_certificate(folder: Path) -> tuple[Path, Path]:
    """A certificate for IP 127.0.0.1 signed by its own key; returns (cert.pem, key.pem)."""
    key = ec.generate_private_key(ec.SECP256R1())
    name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "finishline e2e upstream")])
    now = datetime.datetime.now(datetime.UTC)
    certificate = (
        x509.CertificateBuilder()
        .subject_name(name)
        .issuer_name(name)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - datetime.timedelta(minutes=5))
        .not_valid_after(now + datetime.timedelta(days=1))
        .add_extension(
            x509.SubjectAlternativeName([x509.IPAddress(ipaddress.ip_address("127.0.0.1"))]),
            critical=False,
        )
        .sign(key, hashes.SHA256())
    )
    cert_path, key_path = folder / "upstream-cert.pem", folder / "upstream-key.pem"
    cert_path.write_bytes(certificate.public_bytes(serialization.Encoding.PEM))
    key_path.write_bytes(
        key.private_bytes(
            serialization.Encoding.PEM,
            serialization.PrivateFormat.PKCS8,
            serialization.NoEncryption(),
        )
    )
    return cert_path, key_path


@pytest.fixture(scope="module")
def https_upstream(tmp_path_factory: pytest.TempPathFactory) -> Iterator[UpstreamServer]:
    cert, key = write_self_signed_certificate(tmp_path_factory.mktemp("upstream-tls"))
    context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    context.load_cert_chain(cert, key)
    # HTTP/2 when mitmdump offers it (it mirrors what the client offered), else HTTP/1.1.
    context.set_alpn_protocols(["h2", "http/1.1"])
    with UpstreamServer(tls=context) as server:
        yield server


@pytest.fixture(scope="module")
def regular_mode_finish_fix(mitmproxy_confdir: Path) -> Iterator[Mitmdump]:
    with running_mitmdump(
        confdir=mitmproxy_confdir,
        mode="regular",
        scripts=[FINISH_FIX_SCRIPT],
        options={"ssl_insecure": "true"},
    ) as mitmdump:
        yield mitmdump


def stream_checking_http_version(client: openai.OpenAI, http2: bool) -> list:
    """Stream a completion after checking which HTTP version the client spoke to mitmdump."""
    stream = client.chat.completions.create(model="e2e-model", messages=[{"role": "user", "content": "hi"}], stream=True)
    assert stream.response.http_version == ("HTTP/2" if http2 else "HTTP/1.1")
    return list(stream)


def client_through(proxy: Mitmdump, upstream: UpstreamServer, prefix: str, confdir: Path, *, http2: bool):
    """An openai client for `upstream` that uses mitmdump as its HTTPS proxy and trusts its CA."""
    return openai_client(f"{upstream.origin}{prefix}/v1", proxy=proxy.url, verify=trusting_mitmproxy_ca(confdir), http2=http2)


def trusting_mitmproxy_ca(confdir: Path) -> ssl.SSLContext:
    ca = confdir / "mitmproxy-ca-cert.pem"
    assert ca.exists(), f"mitmdump made no CA in {confdir}"
    return ssl.create_default_context(cafile=str(ca))


@pytest.mark.parametrize("http2", [False, True], ids=["client-http1", "client-http2"])
def test_regular_mode_https_missing_finish_reason_comes_out_as_stop(
    regular_mode_finish_fix: Mitmdump,
    https_upstream: UpstreamServer,
    mitmproxy_confdir: Path,
    http2: bool,
) -> None:
    prefix = https_upstream.route(Script(pieces=chat_stream(ANSWER, finish_reason=None)))

    with client_through(regular_mode_finish_fix, https_upstream, prefix, mitmproxy_confdir, http2=http2) as client:
        chunks = stream_checking_http_version(client, http2)

    assert text_of(chunks) == "".join(ANSWER)
    assert finish_reasons(chunks)[-1] == "stop"
    [request] = https_upstream.requests_under(prefix)
    assert request.http_version == ("2" if http2 else "1.1")
    assert request.header("accept-encoding") == "identity"


def test_regular_mode_https_empty_http2_data_frames_are_not_the_end(
    regular_mode_finish_fix: Mitmdump, https_upstream: UpstreamServer, mitmproxy_confdir: Path
) -> None:
    # mitmproxy passes an empty DATA frame to the stream callable as b"", which is also its end-of-
    # body call; the cut hook drops such frames so a healthy stream is not reported as cut.
    pieces = chat_stream(ANSWER, finish_reason="stop")
    pieces = [pieces[0], b"", *pieces[1:-1], b"", pieces[-1]]
    prefix = https_upstream.route(Script(pieces=pieces, empty_data_frames=True, pause_between_s=0.05))

    with client_through(regular_mode_finish_fix, https_upstream, prefix, mitmproxy_confdir, http2=True) as client:
        chunks = stream_checking_http_version(client, True)

    assert text_of(chunks) == "".join(ANSWER)
    assert finish_reasons(chunks)[-1] == "stop"


HTTP2_CUTS = {
    "stream-reset": Script(pieces=PARTIAL, ending=Ending.STREAM_RESET, pause_before_end_s=0.3),
    "connection-dropped": Script(pieces=PARTIAL, ending=Ending.FIN_MID_CHUNK, pause_before_end_s=0.3),
    "tcp-reset": Script(pieces=PARTIAL, ending=Ending.RST, pause_before_end_s=0.3),
    # The pause keeps END_STREAM out of the TCP read that carries HEADERS: h2 rejects a short body
    # for the whole read, and mitmproxy then answers 502 before any header reached the client.
    "short-content-length": Script(pieces=PARTIAL, ending=Ending.SHORT_CONTENT_LENGTH, pause_before_end_s=0.3),
    "clean-end-without-done": Script(pieces=PARTIAL),
    "headers-then-stream-reset": Script(pieces=[], ending=Ending.STREAM_RESET, pause_before_end_s=0.3),
}
CASES = [
    *[pytest.param(False, CUTS[name], id=f"http1-{name}") for name in ("fin-mid-chunk", "tcp-reset")],
    *[pytest.param(True, script, id=f"http2-{name}") for name, script in HTTP2_CUTS.items()],
]


@pytest.mark.parametrize("http2,script", CASES)
def test_regular_mode_https_cut_raises_api_error_saying_it_was_interrupted(
    regular_mode_finish_fix: Mitmdump,
    https_upstream: UpstreamServer,
    mitmproxy_confdir: Path,
    http2: bool,
    script: Script,
) -> None:
    prefix = https_upstream.route(script)

    with client_through(regular_mode_finish_fix, https_upstream, prefix, mitmproxy_confdir, http2=http2) as client:
        with pytest.raises(openai.APIError) as raised:
            stream_checking_http_version(client, http2)

    assert_interrupted_error(raised.value)
    [request] = https_upstream.requests_under(prefix)
    assert request.http_version == ("2" if http2 else "1.1")


@pytest.fixture
def regular_mode_with_deadlines(mitmproxy_confdir: Path) -> Iterator[Mitmdump]:
    with running_mitmdump(
        confdir=mitmproxy_confdir,
        mode="regular",
        scripts=[FINISH_FIX_SCRIPT],
        options={"ssl_insecure": "true", "finish_fix_idle_timeout": "2", "finish_fix_first_token_timeout": "2"},
    ) as mitmdump:
        yield mitmdump


@pytest.mark.parametrize("http2", [False, True], ids=["http1", "http2"])
def test_regular_mode_https_stall_raises_api_error_saying_the_upstream_stalled(
    regular_mode_with_deadlines: Mitmdump, https_upstream: UpstreamServer, mitmproxy_confdir: Path, http2: bool
) -> None:
    # Over HTTP/2 on both sides finish_fix resets only the stalled stream upstream (RST_STREAM).
    keep_alive = [b": keep-alive\n\n"] * 30
    prefix = https_upstream.route(Script(pieces=PARTIAL + keep_alive, pause_between_s=0.5))
    received: list = []
    with client_through(regular_mode_with_deadlines, https_upstream, prefix, mitmproxy_confdir, http2=http2) as client:
        with pytest.raises(openai.APIError) as raised:
            stream = client.chat.completions.create(model="e2e-model", messages=[{"role": "user", "content": "hi"}], stream=True)
            assert stream.response.http_version == ("HTTP/2" if http2 else "HTTP/1.1")
            for chunk in stream:
                received.append(chunk)
    assert_interrupted_error(raised.value)
    assert "no event for 2 s after 2 events; the upstream stalled" in raised.value.message
    assert text_of(received) == "".join(ANSWER[:2])
    [request] = https_upstream.requests_under(prefix)
    assert request.http_version == ("2" if http2 else "1.1")


@pytest.mark.parametrize("http2", [False, True], ids=["http1", "http2"])
def test_regular_mode_https_no_response_head_is_a_504_the_client_raises(
    regular_mode_with_deadlines: Mitmdump, https_upstream: UpstreamServer, mitmproxy_confdir: Path, http2: bool
) -> None:
    # Over HTTP/2 on both sides finish_fix resets only the waiting stream upstream and answers on its
    # own stream to the client.
    prefix = https_upstream.route(Script(pieces=chat_stream(ANSWER), head_gate=threading.Event()))
    with client_through(regular_mode_with_deadlines, https_upstream, prefix, mitmproxy_confdir, http2=http2) as client:
        with pytest.raises(openai.InternalServerError) as raised:
            client.chat.completions.create(model="e2e-model", messages=[{"role": "user", "content": "hi"}], stream=True)
    assert raised.value.status_code == 504 and raised.value.code == "no_response_head"
    assert raised.value.response.http_version == ("HTTP/2" if http2 else "HTTP/1.1")
    [request] = https_upstream.requests_under(prefix)
    assert request.http_version == ("2" if http2 else "1.1")
