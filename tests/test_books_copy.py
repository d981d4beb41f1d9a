"""finish_fix's bounded body copy (`finishline.addon.books.BodyCopy`) against its definition: the whole
stream when it fits, else its first half-limit and last half-limit of bytes with a comment saying
how many were left out; for a compressed body only its start. Any pieces, any limit, read any time."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from finishline.addon.books import BodyCopy


def _defined_copy(whole: bytes, limit: int, plain: bool) -> bytes:
    if not limit:
        return b""
    if not plain:
        return whole[:limit]
    if len(whole) <= limit:
        return whole
    half = limit // 2
    note = f"\n\n: finish_fix: {len(whole) - limit} bytes of this stream are not kept here\n\n".encode()
    return whole[:half] + note + whole[len(whole) - (limit - half) :]


@settings(max_examples=400, deadline=None)
@given(
    pieces=st.lists(st.binary(max_size=80), max_size=60),
    limit=st.sampled_from([0, 1, 2, 3, 7, 64, 100, 1000]),
    plain=st.booleans(),
    reads=st.sets(st.integers(0, 60), max_size=4),
    block=st.sampled_from([1, 2, 5, 64, 300, BodyCopy.BLOCK]),
    inline=st.booleans(),
)
def test_the_copy_is_the_whole_stream_or_its_two_ends(pieces, limit, plain, reads, block, inline):
    copy = BodyCopy(limit, plain=plain, block=block)
    pending = copy.pending  # taken once, as the stream callable does when it adds inline
    for number, piece in enumerate(pieces):
        if inline:
            pending.append(piece)
            copy.held += len(piece)
            if copy.held >= copy.block:
                copy.seal()
        else:
            copy.add(piece)
        if number in reads:  # mitmweb may read the copy while the stream goes on
            assert copy.value() == _defined_copy(b"".join(pieces[: number + 1]), limit, plain)
    assert copy.value() == _defined_copy(b"".join(pieces), limit, plain)


def test_a_long_stream_is_held_near_the_limit():
    copy = BodyCopy(4096)
    for _ in range(10_000):
        copy.add(b"x" * 100)
        assert copy._head_bytes + copy._tail_bytes + copy.held <= 4096 + 2 * BodyCopy.BLOCK + 100
