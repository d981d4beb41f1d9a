"""A scripted HTTP/1.1 upstream on 127.0.0.1 for the end-to-end tests and the benchmark.

Each response is a `Script`: data that says what to send (status, headers, body pieces) and how the
body ends. The endings are the ones finish_fix's rule C6 must tell apart from a success:

- `Ending.CLEAN`: the body is complete by its own framing (chunked terminator, Content-Length
  reached, or FIN after a close-delimited body, which looks clean to every HTTP stack).
- `Ending.FIN_MID_CHUNK`: chunked only; a chunk header promises more bytes than follow, then FIN.
- `Ending.SHORT_CONTENT_LENGTH`: Content-Length is larger than the body sent, then FIN.
- `Ending.RST`: after the body pieces the socket is closed with SO_LINGER 0, so the peer gets a TCP
  reset instead of a FIN.

A script may also leave requests unanswered, closing the connection on them (`Script.drop`: every
one, or those on a kept-alive connection), and answer a non-streamed request with a JSON body of its
own (`Script.json_body`). "Headers then nothing" is any cut ending with no pieces. Over HTTPS with ALPN "h2" the same scripts
are served as HTTP/2, where `Ending.STREAM_RESET` (RST_STREAM) is one more way to cut. A test registers a script with
`UpstreamServer.route(script)`, which returns a path prefix; a request whose path starts with that
prefix gets that script (so `base_url=f"{proxy}{prefix}/v1"` makes the openai client's
`/v1/chat/completions` land on it). Every request is recorded (`UpstreamServer.requests`) with its
headers and body, so a test can check what reached the upstream, and every response the peer stopped
taking before its script ended (`UpstreamServer.abandoned`: the proxy closed the connection).

Threads, stdlib sockets and h11 for parsing requests; responses are written by hand because half of
them are deliberately malformed.
"""

from __future__ import annotations

import dataclasses
import enum
import json
import select
import socket
import ssl
import struct
import threading
import time
import zlib
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field

import h2.config
import h2.connection
import h2.errors
import h2.events
import h2.exceptions
import h11

from faults.child_processes import START_DEADLINE_S

__all__ = [
    "Drop",
    "Ending",
    "Framing",
    "ReceivedRequest",
    "Script",
    "UpstreamServer",
]


class Framing(enum.Enum):
    """How the response body's length is conveyed (RFC 9112 section 6)."""

    # Transfer-Encoding: chunked; each body piece is written as one chunk.
    CHUNKED = "chunked"
    # Content-Length: the sum of the pieces (or more, for SHORT_CONTENT_LENGTH).
    CONTENT_LENGTH = "content-length"
    # Neither: the body runs until the server closes the connection (`Connection: close`).
    CLOSE_DELIMITED = "close-delimited"


class Ending(enum.Enum):
    """How the upstream ends the response after its last body piece."""

    # Complete by its framing; a close-delimited body ends with a FIN.
    CLEAN = "clean"
    # Chunked: announce a chunk, send only `Script.cut_tail` of it, then FIN.
    FIN_MID_CHUNK = "fin-mid-chunk"
    # Content-Length declares `Script.missing_bytes` more than is sent, then FIN.
    SHORT_CONTENT_LENGTH = "short-content-length"
    # SO_LINGER 0 then close: the peer sees ECONNRESET.
    RST = "rst"
    # HTTP/2 only: RST_STREAM (INTERNAL_ERROR) on the response's stream; the connection stays up.
    STREAM_RESET = "stream-reset"


class Drop(enum.Enum):
    """Which requests the upstream closes the connection on (a FIN), unanswered."""

    # Answer every request.
    NEVER = "never"
    # Answer none: close as soon as a request has arrived.
    EVERY = "every"
    # Answer the first request of each connection and keep it alive (no `Connection: close`), then
    # close it when the next request arrives on it: the worst case of llama.cpp's server, which
    # closes a kept-alive connection after a stream without saying so, its FIN racing the client's
    # next request on it.
    REUSED = "reused"


@dataclass(frozen=True, kw_only=True)
class Script:
    """One scripted response.

    `pieces` is a sequence of body pieces or a zero-argument callable that yields them lazily (the
    benchmark's 100k-event stream). Empty pieces are skipped: on a chunked body they would be the
    terminator.
    """

    status: int = 200
    content_type: str | None = "text/event-stream"
    headers: Sequence[tuple[str, str]] = ()
    pieces: Sequence[bytes] | Callable[[], Iterable[bytes]] = ()
    framing: Framing = Framing.CHUNKED
    ending: Ending = Ending.CLEAN
    # Sleep between pieces, and before the ending (so a proxy has read and forwarded what was sent
    # before the cut; a reset can otherwise discard bytes still in the proxy's receive queue).
    pause_between_s: float = 0.0
    pause_before_end_s: float = 0.0
    # FIN_MID_CHUNK: the bytes of the announced-but-unfinished chunk that are actually sent; empty
    # means FIN right after the last complete chunk (a chunked body missing its terminator).
    cut_tail: bytes = b'data: {"id": "chatcmpl-cut", "choi'
    # SHORT_CONTENT_LENGTH: how many declared bytes never come.
    missing_bytes: int = 100
    # {piece index: event} (HTTP/1.1): wait for the event before sending that piece, so a test can
    # prove that what came before it reached the client while the upstream held back the rest.
    gates: Mapping[int, threading.Event] = field(default_factory=dict)
    # Wait for this event before sending the response head: a test that saw the request arrive
    # (`wait_request`) lets the head go when it chooses, or never (an upstream that accepts and never
    # answers). Over plain HTTP/1.1 a peer that closes the connection meanwhile is recorded in
    # `abandoned` (TLS cannot peek; HTTP/2 waits on its connection's thread, one request at a time).
    head_gate: threading.Event | None = None
    # Write pieces (each still its own HTTP chunk) in socket writes of at least this many bytes; 0
    # writes each piece at once. The benchmark batches so the Python upstream is not the bottleneck.
    write_batch_bytes: int = 0
    # Compress the body with gzip (Content-Encoding: gzip) whatever the request asked for, the way a
    # server that ignores `accept-encoding: identity` would (finish_fix rule C10).
    gzip: bool = False
    # HTTP/2 only: send empty pieces as empty DATA frames (without END_STREAM) instead of skipping
    # them; mitmproxy hands those to a stream callable as b"", its end-of-body signal.
    empty_data_frames: bool = False
    # HTTP/1.1: which requests get no answer, only a FIN (`Drop`).
    drop: Drop = Drop.NEVER
    # HTTP/1.1: the answer to a request whose JSON body says `"stream": false`, sent whole as
    # `application/json` with a Content-Length (None: such a request gets the pieces like any other).
    json_body: bytes | None = None

    def for_request(self, request: ReceivedRequest) -> Script:
        """The script that answers `request`: this one, or its `json_body` for a non-streamed one
        (`"stream": false`, or Gemini's `:generateContent` path, whose body does not say)."""
        if self.json_body is None or not request.body:
            return self
        if not request.target.split("?")[0].endswith(":generateContent"):
            try:
                asked = json.loads(request.body)
            except ValueError:
                return self
            if not isinstance(asked, dict) or asked.get("stream") is not False:
                return self
        return dataclasses.replace(self, pieces=[self.json_body], content_type="application/json", framing=Framing.CONTENT_LENGTH)

    def iter_pieces(self) -> Iterable[bytes]:
        pieces = self.pieces() if callable(self.pieces) else self.pieces
        if not self.gzip:
            yield from (piece for piece in pieces if piece or self.empty_data_frames)
            return
        compressor = zlib.compressobj(wbits=31)  # 31: gzip container
        for piece in pieces:
            compressed = compressor.compress(piece) + compressor.flush(zlib.Z_SYNC_FLUSH)
            if compressed:
                yield compressed
        if tail := compressor.flush(zlib.Z_FINISH):
            yield tail


@dataclass(frozen=True)
class ReceivedRequest:
    """What reached the upstream: header names lowercased, values as sent."""

    method: str
    target: str
    headers: tuple[tuple[str, str], ...]
    body: bytes
    http_version: str = "1.1"

    def header(self, name: str) -> str | None:
        values = [value for key, value in self.headers if key == name.lower()]
        return ", ".join(values) if values else None

    def json(self) -> object:
        return json.loads(self.body)


_GATE_TIMEOUT_S = 20.0

_REASONS = {
    200: "OK",
    400: "Bad Request",
    404: "Not Found",
    429: "Too Many Requests",
    500: "Internal Server Error",
    503: "Service Unavailable",
}


@dataclass
class UpstreamServer:
    """A threaded scripted upstream; use as a context manager (`with UpstreamServer() as upstream`).

    Args:
        tls: a server-side `ssl.SSLContext` to serve HTTPS instead of HTTP. If it offers "h2" by
            ALPN (`set_alpn_protocols`) and the client picks it, the connection speaks HTTP/2.
    """

    tls: ssl.SSLContext | None = None
    requests: list[ReceivedRequest] = field(default_factory=list)
    # Targets of the responses whose writing failed because the peer closed the connection.
    abandoned: list[str] = field(default_factory=list)
    _routes: dict[str, Script] = field(default_factory=dict)
    _lock: threading.Lock = field(default_factory=threading.Lock)
    _listener: socket.socket | None = None
    _threads: list[threading.Thread] = field(default_factory=list)
    _connections: set[socket.socket] = field(default_factory=set)
    _closing: threading.Event = field(default_factory=threading.Event)

    # -- lifecycle ----------------------------------------------------------------------------

    def __enter__(self) -> UpstreamServer:
        self.start()
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()

    def start(self) -> None:
        listener = socket.create_server(("127.0.0.1", 0))
        listener.settimeout(0.2)  # so the accept loop notices close()
        self._listener = listener
        thread = threading.Thread(target=self._accept_loop, name="upstream-accept", daemon=True)
        thread.start()
        self._threads.append(thread)

    def close(self) -> None:
        self._closing.set()
        with self._lock:
            connections = list(self._connections)
        for connection in connections:
            try:
                connection.close()
            except OSError:
                pass
        for thread in list(self._threads):
            thread.join(timeout=5)
        if self._listener is not None:
            self._listener.close()

    @property
    def port(self) -> int:
        assert self._listener is not None, "start() the server first"
        return self._listener.getsockname()[1]

    @property
    def origin(self) -> str:
        return f"{'https' if self.tls else 'http'}://127.0.0.1:{self.port}"

    # -- scripts ------------------------------------------------------------------------------

    def route(self, script: Script) -> str:
        """Register `script`; return the path prefix (e.g. `/r3`) whose requests get it."""
        with self._lock:
            prefix = f"/r{len(self._routes)}"
            self._routes[prefix] = script
        return prefix

    def requests_under(self, prefix: str) -> list[ReceivedRequest]:
        with self._lock:
            return [r for r in self.requests if r.target.startswith(prefix + "/")]

    def wait_request(self, prefix: str, timeout: float = 20) -> ReceivedRequest:
        """The first request under `prefix`, once it has arrived whole; fails after `timeout` s."""
        deadline = time.monotonic() + timeout
        while not (arrived := self.requests_under(prefix)):
            if time.monotonic() > deadline:
                raise AssertionError(f"no request under {prefix} reached the upstream within {timeout} s")
            time.sleep(0.02)
        return arrived[0]

    def wait_abandoned(self, prefix: str, timeout: float = START_DEADLINE_S) -> bool:
        """True once a response under `prefix` could not be written to the end because the peer had
        closed the connection; False if that did not happen within `timeout` s (a backstop with a
        loaded machine's room: the wait ends when the close is seen)."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            with self._lock:
                if any(target.startswith(prefix + "/") for target in self.abandoned):
                    return True
            time.sleep(0.05)
        return False

    def _script_for(self, target: str) -> Script | None:
        prefix = "/" + target.lstrip("/").split("/", 1)[0]
        with self._lock:
            return self._routes.get(prefix)

    # -- serving ------------------------------------------------------------------------------

    def _accept_loop(self) -> None:
        assert self._listener is not None
        while not self._closing.is_set():
            try:
                connection, _ = self._listener.accept()
            except TimeoutError:
                continue
            except OSError:
                return
            connection.settimeout(30)  # no test waits longer on an upstream read
            thread = threading.Thread(target=self._serve_connection, args=(connection,), name="upstream-conn", daemon=True)
            with self._lock:
                self._connections.add(connection)
                self._threads.append(thread)
            thread.start()

    def _serve_connection(self, connection: socket.socket) -> None:
        try:
            if self.tls is not None:
                connection = self.tls.wrap_socket(connection, server_side=True)
                with self._lock:
                    self._connections.add(connection)
                if connection.selected_alpn_protocol() == "h2":
                    self._serve_http2(connection)
                    return
            leftover = b""
            answered = 0
            while not self._closing.is_set():
                maybe_request = _maybe_read_request(connection, leftover)
                if maybe_request is None:
                    return
                request, leftover = maybe_request
                with self._lock:
                    self.requests.append(request)
                script = self._script_for(request.target) or _NOT_FOUND
                if script.drop is Drop.EVERY or (script.drop is Drop.REUSED and answered):
                    _close_with_fin(connection)
                    return
                answered += 1
                script = script.for_request(request)
                try:
                    keep_alive = _send_response(connection, script)
                except ConnectionError:  # broken pipe, reset: the peer closed on us
                    with self._lock:
                        self.abandoned.append(request.target)
                    raise
                if not keep_alive or "close" in (request.header("connection") or "").lower():
                    return
        except (OSError, ssl.SSLError, h11.RemoteProtocolError, h2.exceptions.H2Error):
            return  # the peer went away or spoke garbage: nothing to serve
        finally:
            try:
                connection.close()
            except OSError:
                pass

    def _serve_http2(self, connection: ssl.SSLSocket) -> None:
        """Serve HTTP/2 (negotiated by ALPN), one request at a time per connection."""
        h2_connection = h2.connection.H2Connection(h2.config.H2Configuration(client_side=False, header_encoding="utf-8"))
        h2_connection.initiate_connection()
        connection.sendall(h2_connection.data_to_send())
        heads: dict[int, list[tuple[str, str]]] = {}
        bodies: dict[int, bytearray] = {}
        while not self._closing.is_set():
            data = connection.recv(65536)
            if not data:
                return
            for event in h2_connection.receive_data(data):
                if isinstance(event, h2.events.RequestReceived):
                    heads[event.stream_id] = [(str(k), str(v)) for k, v in event.headers]
                    bodies[event.stream_id] = bytearray()
                elif isinstance(event, h2.events.DataReceived):
                    bodies[event.stream_id] += event.data
                    h2_connection.acknowledge_received_data(event.flow_controlled_length, event.stream_id)
                elif isinstance(event, h2.events.StreamEnded):
                    head = dict(heads[event.stream_id])
                    request = ReceivedRequest(
                        method=head[":method"],
                        target=head[":path"],
                        headers=tuple((k.lower(), v) for k, v in heads[event.stream_id] if not k.startswith(":")),
                        body=bytes(bodies.pop(event.stream_id)),
                        http_version="2",
                    )
                    with self._lock:
                        self.requests.append(request)
                    script = self._script_for(request.target) or _NOT_FOUND
                    connection.sendall(h2_connection.data_to_send())
                    if not _send_http2_response(connection, h2_connection, event.stream_id, script):
                        return
            connection.sendall(h2_connection.data_to_send())


_NOT_FOUND = Script(
    status=404,
    content_type="application/json",
    pieces=[b'{"error": {"message": "no script for this path", "type": "not_found"}}'],
    framing=Framing.CONTENT_LENGTH,
)


def _maybe_read_request(connection: socket.socket, leftover: bytes) -> tuple[ReceivedRequest, bytes] | None:
    """Read one request; return it and the bytes after it, or None if the peer closed first."""
    parser = h11.Connection(h11.SERVER)
    if leftover:  # receive_data(b"") would mean EOF
        parser.receive_data(leftover)
    head: h11.Request | None = None
    body = bytearray()
    while True:
        event = parser.next_event()
        if event is h11.NEED_DATA:
            parser.receive_data(connection.recv(65536))
        elif isinstance(event, h11.Request):
            head = event
        elif isinstance(event, h11.Data):
            body += event.data
        elif isinstance(event, h11.EndOfMessage):
            assert head is not None
            request = ReceivedRequest(
                method=head.method.decode(),
                target=head.target.decode(),
                headers=tuple((k.decode().lower(), v.decode()) for k, v in head.headers),
                body=bytes(body),
            )
            return request, parser.trailing_data[0]
        elif isinstance(event, h11.ConnectionClosed):
            return None


def _wait_for_gate(connection: socket.socket, gate: threading.Event) -> None:
    """Until `gate` is set; raises ConnectionError if the peer closes the connection first (the
    proxy gave up waiting for the head), TimeoutError after `_GATE_TIMEOUT_S`."""
    deadline = time.monotonic() + _GATE_TIMEOUT_S
    while not gate.wait(0.02):
        try:
            readable, _, _ = select.select([connection], [], [], 0)
        except ValueError:  # its descriptor is -1: UpstreamServer.close closed it
            raise OSError("the server closed the connection") from None
        if readable and not isinstance(connection, ssl.SSLSocket) and connection.recv(1, socket.MSG_PEEK) == b"":
            raise ConnectionError("the peer closed the connection while the response head was held back")
        if time.monotonic() > deadline:
            raise TimeoutError(f"head gate not opened in {_GATE_TIMEOUT_S} s")


def _send_response(connection: socket.socket, script: Script) -> bool:
    """Write `script` to `connection`; return whether the connection may serve another request."""
    if script.head_gate is not None:
        _wait_for_gate(connection, script.head_gate)
    pieces = list(script.iter_pieces()) if script.framing is Framing.CONTENT_LENGTH else None
    headers: list[tuple[str, str]] = []
    if script.content_type is not None:
        headers.append(("content-type", script.content_type))
    if script.gzip:
        headers.append(("content-encoding", "gzip"))
    headers.extend(script.headers)
    if script.framing is Framing.CHUNKED:
        headers.append(("transfer-encoding", "chunked"))
    elif script.framing is Framing.CONTENT_LENGTH:
        assert pieces is not None
        declared = sum(map(len, pieces))
        if script.ending is Ending.SHORT_CONTENT_LENGTH:
            declared += script.missing_bytes
        headers.append(("content-length", str(declared)))
    else:
        headers.append(("connection", "close"))
    reason = _REASONS.get(script.status, "Whatever")
    head = f"HTTP/1.1 {script.status} {reason}\r\n" + "".join(f"{k}: {v}\r\n" for k, v in headers)
    connection.sendall(head.encode("latin-1") + b"\r\n")

    batch = bytearray()
    for index, piece in enumerate(pieces if pieces is not None else script.iter_pieces()):
        if index and script.pause_between_s:
            time.sleep(script.pause_between_s)
        if (gate := script.gates.get(index)) is not None:
            if batch:
                connection.sendall(batch)
                batch.clear()
            if not gate.wait(_GATE_TIMEOUT_S):
                raise TimeoutError(f"gate before piece {index} not opened in {_GATE_TIMEOUT_S} s")
        batch += b"%x\r\n%s\r\n" % (len(piece), piece) if script.framing is Framing.CHUNKED else piece
        if len(batch) >= script.write_batch_bytes:
            connection.sendall(batch)
            batch.clear()
    if batch:
        connection.sendall(batch)
    if script.pause_before_end_s:
        time.sleep(script.pause_before_end_s)

    match script.ending:
        case Ending.CLEAN:
            if script.framing is Framing.CHUNKED:
                connection.sendall(b"0\r\n\r\n")
                return True
            return script.framing is Framing.CONTENT_LENGTH
        case Ending.FIN_MID_CHUNK:
            assert script.framing is Framing.CHUNKED, "FIN_MID_CHUNK needs a chunked body"
            if tail := script.cut_tail:  # empty: FIN right after the previous chunk
                connection.sendall(b"%x\r\n%s" % (len(tail) + 64, tail))
            _close_with_fin(connection)
        case Ending.SHORT_CONTENT_LENGTH:
            assert script.framing is Framing.CONTENT_LENGTH, "SHORT_CONTENT_LENGTH needs a length"
            _close_with_fin(connection)
        case Ending.RST:
            _close_with_reset(connection)
        case Ending.STREAM_RESET:
            raise ValueError("STREAM_RESET needs an HTTP/2 connection")
    return False


def _send_http2_response(
    connection: ssl.SSLSocket,
    h2_connection: h2.connection.H2Connection,
    stream_id: int,
    script: Script,
) -> bool:
    """Write `script` on an HTTP/2 stream; return whether the connection is still usable.

    Framing does not apply (DATA frames carry the pieces) except that CONTENT_LENGTH sends the
    header. Endings: CLEAN ends the stream; STREAM_RESET sends RST_STREAM; SHORT_CONTENT_LENGTH ends
    the stream short of its declared length; FIN_MID_CHUNK drops the connection without GOAWAY; RST
    resets the TCP connection. Pieces must fit the peer's flow-control window (tests are small).
    """
    pieces = list(script.iter_pieces())
    if script.head_gate is not None and not script.head_gate.wait(_GATE_TIMEOUT_S):
        raise TimeoutError(f"head gate not opened in {_GATE_TIMEOUT_S} s")
    headers = [(":status", str(script.status))]
    if script.content_type is not None:
        headers.append(("content-type", script.content_type))
    if script.gzip:
        headers.append(("content-encoding", "gzip"))
    headers.extend((k.lower(), v) for k, v in script.headers)
    if script.framing is Framing.CONTENT_LENGTH or script.ending is Ending.SHORT_CONTENT_LENGTH:
        declared = sum(map(len, pieces))
        if script.ending is Ending.SHORT_CONTENT_LENGTH:
            declared += script.missing_bytes
        headers.append(("content-length", str(declared)))
    h2_connection.send_headers(stream_id, headers)
    connection.sendall(h2_connection.data_to_send())
    for index, piece in enumerate(pieces):
        if index and script.pause_between_s:
            time.sleep(script.pause_between_s)
        h2_connection.send_data(stream_id, piece)
        connection.sendall(h2_connection.data_to_send())
    if script.pause_before_end_s:
        time.sleep(script.pause_before_end_s)
    match script.ending:
        case Ending.CLEAN | Ending.SHORT_CONTENT_LENGTH:
            h2_connection.end_stream(stream_id)
        case Ending.STREAM_RESET:
            h2_connection.reset_stream(stream_id, h2.errors.ErrorCodes.INTERNAL_ERROR)
        case Ending.FIN_MID_CHUNK:
            _close_with_fin(connection)
            return False
        case Ending.RST:
            _close_with_reset(connection)
            return False
    connection.sendall(h2_connection.data_to_send())
    return True


def _close_with_fin(connection: socket.socket) -> None:
    try:
        connection.shutdown(socket.SHUT_WR)
    except OSError:
        pass
    connection.close()


def _close_with_reset(connection: socket.socket) -> None:
    # SO_LINGER on with a zero timeout: close() sends RST and drops unsent data (tcp(7)). On a TLS
    # socket this skips close_notify too, which is what a dying worker does.
    connection.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
    connection.close()
