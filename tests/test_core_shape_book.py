"""The routine shapes learned across streams (`finishline.ShapeBook`) against the full parse.

Contract: streams of one server read one after the other with a shared book (each learning its
delta shape from a template of the streams before it, the stream's own ids as gaps) send the client
byte for byte what machines without the fast path send, after every piece, and end with the same
report, whatever the ids hold. The streams are the fast path's own generated ones
(`tests/test_core_fast_path*.py`) with other ids in each stream, and adversarial ones whose id gaps
hold arbitrary bytes (a second `id` key, a quote, a float, a negative number, an event's end),
fed one event per piece, whole, byte by byte and at random splits.
"""

from __future__ import annotations

import json

from hypothesis import given
from hypothesis import strategies as st

from finishline import Dialect, RepairPolicy, RequestFacts, ShapeBook, StreamRepair
from finishline._shape_book import MAX_TEMPLATES
from tests.bench import dialect_stream
from tests.feeding import CHUNKINGS, chunk, split
from tests.test_core_fast_path import _ENDS, _POLICIES, _REQUESTS, SETTINGS, _pieces, _run_both, _runs_of_one_shape
from tests.test_core_fast_path_dialects import _messages_pieces, _responses_pieces, _responses_runs

# What a stream's ids may be: any JSON string (as a server would escape it or not), and for
# `created` any integer, or what is not one a template takes (a float, a negative number).
_ID_TEXTS = st.one_of(
    st.text(max_size=10), st.sampled_from(['"', "\\", '", "id": "x', "chatcmpl-1", "\u00e9", "\U0001f600", '"content": "x"'])
)


@st.composite
def _id_token(draw) -> bytes:
    return json.dumps(draw(_ID_TEXTS), ensure_ascii=draw(st.booleans())).encode()


@st.composite
def _created_token(draw) -> bytes:
    return draw(st.one_of(st.integers(0, 10**12).map(lambda n: str(n).encode()), st.sampled_from([b"-5", b"1.5", b"1e3", b"0"])))


def _with_ids(pieces: list[bytes], replacements: dict[bytes, bytes]) -> list[bytes]:
    """The stream with its ids (the generators' fixed ones) replaced, as another stream has them."""
    out = []
    for piece in pieces:
        for old, new in replacements.items():
            piece = piece.replace(old, new)
        out.append(piece)
    return out


def _run_streams(streams: list[list[bytes]], ends: list[str], *, policy, request, dialect=Dialect.CHAT) -> ShapeBook:
    book = ShapeBook()
    for pieces, end in zip(streams, ends):
        _run_both(pieces, end, policy=policy, request=request, dialect=dialect, shapes=book)
    return book


@st.composite
def _chat_streams(draw, stream=_pieces()) -> list[list[bytes]]:
    """Streams each with its own `id` and `created`: mostly the first one's events again (one
    server's shapes), sometimes another stream of any style."""
    first = draw(stream)
    return [
        _with_ids(
            first if number == 0 or draw(st.integers(0, 3)) else draw(stream),
            {b'"chatcmpl-1"': draw(_id_token()), b"1700000000": draw(_created_token())},
        )
        for number in range(draw(st.integers(2, 4)))
    ]


@SETTINGS
@given(streams=_chat_streams(), ends=st.lists(_ENDS, min_size=4, max_size=4), policy=_POLICIES, request=_REQUESTS)
def test_chat_streams_sharing_a_book_agree_with_the_full_parse(streams, ends, policy, request):
    _run_streams(streams, ends, policy=policy, request=request)


@SETTINGS
@given(streams=_chat_streams(_runs_of_one_shape()), ends=st.lists(_ENDS, min_size=4, max_size=4), policy=_POLICIES)
def test_chat_runs_of_one_shape_sharing_a_book_agree_with_the_full_parse(streams, ends, policy):
    _run_streams(streams, ends, policy=policy, request=RequestFacts())


@st.composite
def _responses_streams(draw) -> list[list[bytes]]:
    generate = draw(st.sampled_from([_responses_pieces(), _responses_runs()]))
    first = draw(generate)
    streams = []
    for number in range(draw(st.integers(2, 4))):
        ids = {b'"it_%d"' % item: draw(_id_token()) for item in range(3)}
        pieces = first if number == 0 or draw(st.integers(0, 3)) else draw(generate)
        streams.append(_with_ids(pieces, {**ids, b'"resp_1"': draw(_id_token())}))
    return streams


@SETTINGS
@given(streams=_responses_streams(), ends=st.lists(_ENDS, min_size=4, max_size=4), policy=_POLICIES, request=_REQUESTS)
def test_responses_streams_sharing_a_book_agree_with_the_full_parse(streams, ends, policy, request):
    _run_streams(streams, ends, policy=policy, request=request, dialect=Dialect.RESPONSES)


@SETTINGS
@given(
    streams=st.lists(_messages_pieces(), min_size=2, max_size=4), ends=st.lists(_ENDS, min_size=4, max_size=4), policy=_POLICIES
)
def test_messages_streams_sharing_a_book_agree_with_the_full_parse(streams, ends, policy):
    _run_streams(streams, ends, policy=policy, request=RequestFacts(), dialect=Dialect.MESSAGES)


# -- adversarial: the id gaps of a learned template hold any bytes ---------------------------------

_ODD_IDS = st.one_of(
    st.binary(max_size=10).map(lambda raw: b'"' + raw + b'"'),
    st.binary(max_size=10),
    st.sampled_from(
        [
            b'"a","id":"b"',  # the key twice: the parser keeps the last
            b'"a","content":"b"',
            b'"\\"',
            b'"\\u12"',
            b'"\xed\xa0\x80"',
            b"1",
            b"-1",
            b"1.5",
            b"01",
            b"null",
            b'"x" ',
            b'"a"}\n\ndata: {"id":"b"',
            b'"\r"',
        ]
    ),
)


@SETTINGS
@given(
    ids=st.lists(st.tuples(_ODD_IDS, _ODD_IDS), min_size=1, max_size=6),
    texts=st.lists(st.sampled_from(["a", "", "b c", "\u00e9", '"']), min_size=1, max_size=4),
    ending=st.sampled_from([b"\n", b"\r\n"]),
    end=_ENDS,
)
def test_a_template_s_id_gaps_holding_any_bytes(ids, texts, ending, end):
    def stream(id_token: bytes, created: bytes) -> list[bytes]:
        def text(content: str) -> bytes:
            return (
                b'data: {"id":' + id_token + b',"object":"chat.completion.chunk","created":' + created + b',"model":"m",'
                b'"choices":[{"index":0,"delta":{"content":'
                + json.dumps(content).encode()
                + b'},"finish_reason":null}]}'
                + ending
                + ending
            )

        return [text(content) for content in texts] + [b"data: [DONE]" + ending + ending]

    book = ShapeBook()
    _run_both(stream(b'"chatcmpl-1"', b"1"), end, policy=RepairPolicy(), request=RequestFacts(), shapes=book)
    for id_token, created in ids:
        _run_both(stream(id_token, created), end, policy=RepairPolicy(), request=RequestFacts(), shapes=book)


@SETTINGS
@given(streams=_chat_streams(_runs_of_one_shape()), chunking=st.sampled_from(CHUNKINGS), seed=st.integers(0, 1000), end=_ENDS)
def test_streams_sharing_a_book_fed_whole_bytewise_and_at_random_splits(streams, chunking, seed, end):
    book = ShapeBook()
    for pieces in streams:
        _run_both(split(b"".join(pieces), chunking, seed), end, policy=RepairPolicy(), request=RequestFacts(), shapes=book)


# -- the book is used where it should be ---------------------------------------------------------


def _read(pieces: list[bytes], book: ShapeBook, dialect: Dialect = Dialect.CHAT) -> StreamRepair:
    repair = StreamRepair(dialect=dialect, shapes=book)
    out = b"".join(repair.receive_data(piece) for piece in pieces) + repair.receive_end()
    assert out == b"".join(pieces)
    return repair


def test_the_next_stream_of_a_server_learns_its_shape_from_the_book_whatever_its_ids():
    book = ShapeBook()
    for number, (stream_id, created) in enumerate([("chatcmpl-a", 1), ("chatcmpl-bb\u00e9", 1733000000), ("x", 0)]):
        texts = [chunk(f"t{n}", id=stream_id, created=created) for n in range(20)]
        finish = chunk(id=stream_id, created=created, finish_reason="stop")
        pieces = [b"data: " + json.dumps(body).encode() + b"\n\n" for body in [*texts, finish]] + [b"data: [DONE]\n\n"]
        assert _read(pieces, book).report.verdict == "clean"
        assert book.hits == number  # every stream after the first took its shape from the book


def test_each_dialect_s_bench_stream_takes_its_shape_from_the_book_with_other_ids():
    for dialect, ids in [
        (Dialect.CHAT, [b"chatcmpl-e2e"]),
        (Dialect.MESSAGES, [b"msg_finishline"]),
        (Dialect.RESPONSES, [b"msg_finishline", b"resp_finishline"]),
    ]:
        pieces = dialect_stream(dialect, 50)
        assert any(old in pieces[-1] or old in pieces[0] for old in ids)
        book = ShapeBook()
        for number in range(3):
            repair = _read([_replace_all(piece, ids, b"id%d" % number) for piece in pieces], book, dialect)
            assert repair.report.verdict == "clean"
        assert book.hits == 2, dialect


def _replace_all(piece: bytes, olds: list[bytes], new: bytes) -> bytes:
    for old in olds:
        piece = piece.replace(old, new)
    return piece


def test_a_created_that_is_not_a_plain_integer_is_learned_by_probing():
    book = ShapeBook()
    for created in (1, -1, 1.5):
        pieces = [b"data: " + json.dumps(chunk(f"t{n}", created=created)).encode() + b"\n\n" for n in range(5)]
        _run_both(pieces, "clean", policy=RepairPolicy(), request=RequestFacts(), shapes=book)
    assert book.hits == 0


def test_the_book_keeps_the_templates_used_last():
    book = ShapeBook()

    def stream(model: str, stream_id: str) -> list[bytes]:
        bodies = [chunk(f"t{n}", model=model, id=stream_id) for n in range(3)] + [chunk(finish_reason="stop")]
        return [b"data: " + json.dumps(body).encode() + b"\n\n" for body in bodies] + [b"data: [DONE]\n\n"]

    for model in range(MAX_TEMPLATES + 1):  # one model more than the book keeps: the first is forgotten
        _read(stream(f"m{model}", "a"), book)
    assert book.hits == 0
    _read(stream(f"m{MAX_TEMPLATES}", "b"), book)
    assert book.hits == 1
    _read(stream("m0", "b"), book)
    assert book.hits == 1
