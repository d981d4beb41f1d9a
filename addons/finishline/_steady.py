"""The repair machine's steady path for a routine shape with more gaps than the text (`SteadyShape`,
`counted_steady`), and the plain-text check every steady path makes (`match_plain_text`).

The fast path (`_routine_chunks`) learns a shape: literal segments around gaps, one of which is the
text. For a run of pieces of one shape, the machine's steady path (`StreamRepair.receive_data`)
checks each piece against it in its own body: for a one-gap shape, prefix, plain text, suffix. This
module gives a shape with more gaps (a Responses `sequence_number`, OpenAI's `obfuscation` padding)
the same kind of check, and a shape whose numbers cannot be predicted (Gemini's `usageMetadata`
counts) one pattern for all that lies between its head and its tail (`counted_steady`).
"""

from __future__ import annotations

import re
from collections.abc import Callable

__all__ = [
    "ASCII_CHARS",
    "GAP_COUNT",
    "GAP_NUMBER",
    "GAP_STRING",
    "GAP_TEXT",
    "NumberedSteady",
    "Steady",
    "SteadyShape",
    "counted_steady",
    "match_plain_text",
]

# JSON string characters that need no escape and are plain ASCII (no `"`, no `\\`, no control).
ASCII_CHARS = rb"[\x20\x21\x23-\x5b\x5d-\x7f]++"
# The usual token alone: `match_plain_text(piece, start, end)` is not None when piece[start:end] is one
# non-empty JSON string of plain ASCII text. The hottest line of finish_fix in a profiled mitmdump is
# this check (here and on the repair machine's steady path, `RoutineMatch.steady`), and a pattern
# without alternation or group runs it in less time and needs no `lastindex`; anything else is left
# to the fast path's own text gap (`_routine_chunks._TEXT_GAP`).
match_plain_text = re.compile(rb'"' + ASCII_CHARS + rb'"').fullmatch
# Plain ASCII text as a JSON string at a position, not to the end (where the text gap is first).
_match_plain_text_at = re.compile(rb'"' + ASCII_CHARS + rb'"').match
# The kinds of gap in a shape (`_routine_chunks._Shape._gaps`), compared by identity on the path of
# every piece. A number is a sequence number, one more on every event (predicted); a count is a
# number the rules read but that changes by any amount (Gemini's `usageMetadata` token counts).
GAP_TEXT, GAP_NUMBER, GAP_STRING, GAP_COUNT = "text", "number", "string", "count"


NumberedSteady = tuple[bytes | bytearray, bytes | bytearray, int, int, bytearray, int]
# The steady path the machine checks a piece against in its own body (`StreamRepair.receive_data`):
# (head, tail, the head's length, the tail's length, the fullmatch of what lies between them). A
# one-gap shape's middle is its text (`match_plain_text`); a shape with counts has one pattern for
# its text, its counts and the literals between them (`counted_steady`).
Steady = tuple[bytes, bytes, int, int, Callable[[bytes, int, int], re.Match[bytes] | None]]


class SteadyShape:
    """The repair machine's steady path for a shape with more gaps than the text: Responses' deltas
    (the text and a `sequence_number`) and OpenAI's padded chunks and deltas (the text and an
    `obfuscation` string, with or without a number).

    A stream numbers its events one by one, so the next piece's number is the last one plus one:
    `start` folds that predicted number into the literal segment around it, and the piece is then
    literals and plain-text strings only: `head`, a string, (`middle`, a string,) `tail`. Checking
    it is two `startswith`/`endswith` and one pattern per string, as for a one-gap shape, rather
    than a pattern per gap and the number parsed; after a match `take` changes the predicted
    number's last digit in place (a carry one time in ten). A piece whose number is not the one
    predicted (a gap in the numbering) is not taken: it leaves the steady path and the fast path
    reads it, which starts the steady path again from its number. The machine hands the last
    number taken (`last_number`) to the rules when it leaves the steady path.

    The string gaps take only plain ASCII text here (`match_plain_text`), like the one-gap steady
    path; anything else leaves it. A matched piece is the learned shape with other JSON strings in
    its string gaps and the next JSON integer in its number gap: what the fast path's own match
    (`_Shape.maybe_has_text`) accepts, minus non-empty text's being a token, which the steady path
    only runs once the first token came (`StreamRepair._on_routine_piece`).
    """

    __slots__ = (
        "head",
        "middle",
        "tail",
        "head_length",
        "middle_length",
        "tail_length",
        "numbered",
        "_segments",
        "_kinds",
        "digits",
        "_first_digit",
        "last_digit",
    )

    def __init__(self, segments: list[bytes], kinds: list[str]) -> None:
        self._segments = segments
        self._kinds = kinds
        self.head: bytes | bytearray = b""
        self.middle: bytes | bytearray = b""
        self.tail: bytes | bytearray = b""
        self.head_length = self.middle_length = self.tail_length = 0
        # The literal holding the predicted number (a bytearray that `head`, `middle` or `tail`
        # is, so that the next number is most often one byte changed in place), and where in it
        # the number's first and last digits are. None for a shape without a number.
        # For a shape whose gaps are the text and a number (a Responses delta without padding), what
        # the machine checks a piece against in its own body (`StreamRepair.receive_data`): (head,
        # tail, the head's length, the tail's length, the digits, where the last digit is). A piece
        # that starts with the head, ends with the tail and has plain text between them is taken;
        # the machine then adds one to the last digit in place, or calls `carry` on a 9.
        self.numbered: NumberedSteady | None = None
        self.digits: bytearray | None = None
        self._first_digit = self.last_digit = 0

    @classmethod
    def of(cls, segments: list[bytes], kinds: list[str]) -> SteadyShape | None:
        """The steady path of a shape (its literal `segments` around gaps of `kinds`, in order), if
        it has one: the text gap, at most one number and at most one other string."""
        strings = sum(kind is not GAP_NUMBER for kind in kinds)
        if kinds.count(GAP_TEXT) != 1 or kinds.count(GAP_NUMBER) > 1 or strings > 2:
            return None
        return cls(segments, kinds)

    def start(self, number: int | None) -> SteadyShape:
        """Ready for the pieces after one of this shape numbered `number` (None when the shape has
        no number gap): the next is predicted to be `number + 1`."""
        literals: list[bytes | bytearray] = [self._segments[0]]
        self.digits = None
        for gap, kind in enumerate(self._kinds):
            after = self._segments[gap + 1]
            if kind is GAP_NUMBER and number is not None:
                digits = b"%d" % (number + 1)
                literal = bytearray(literals[-1])
                self.digits, self._first_digit = literal, len(literal)
                self.last_digit = len(literal) + len(digits) - 1
                literal += digits + after
                literals[-1] = literal
            else:
                literals.append(after)
        self.head, self.tail = literals[0], literals[-1]
        self.middle = literals[1] if len(literals) == 3 else b""
        self.head_length, self.middle_length, self.tail_length = len(self.head), len(self.middle), len(self.tail)
        self.numbered = (
            None
            if self.digits is None or self.middle_length
            else (self.head, self.tail, self.head_length, self.tail_length, self.digits, self.last_digit)
        )
        return self

    @property
    def last_number(self) -> int | None:
        """The number of the last piece taken (or of the one `start` was given)."""
        if self.digits is None:
            return None
        return int(self.digits[self._first_digit : self.last_digit + 1]) - 1

    def take(self, piece: bytes) -> bool:
        """Whether `piece` is this shape with plain text and the predicted number; if so, the
        number after it is predicted next."""
        if not (piece.startswith(self.head) and piece.endswith(self.tail)):
            return False
        end = len(piece) - self.tail_length
        if self.middle_length:
            first = _match_plain_text_at(piece, self.head_length)
            if first is None:
                return False
            at = first.end()
            if not piece.startswith(self.middle, at) or match_plain_text(piece, at + self.middle_length, end) is None:
                return False
        elif match_plain_text(piece, self.head_length, end) is None:
            return False
        digits = self.digits
        if digits is not None:
            at = self.last_digit
            digit = digits[at]
            if digit != 0x39:  # not "9": the next number differs in its last digit only
                digits[at] = digit + 1
            else:
                self.carry()
        return True

    def carry(self) -> NumberedSteady | None:
        """The predicted number ends in 9 and was taken: the next one is written in place, or, when
        it has one digit more (after 9, 99, ...), the literals are folded again. Returns the
        `numbered` tuple, new in the second case."""
        digits = self.digits
        assert digits is not None
        at = self.last_digit
        while at >= self._first_digit and digits[at] == 0x39:  # 9s roll over to 0s
            digits[at] = 0x30
            at -= 1
        if at >= self._first_digit:
            digits[at] += 1
            return self.numbered
        # Every digit was a 9: the number taken was 10**n - 1, and the next has n + 1 digits.
        return self.start(10 ** (self.last_digit + 1 - self._first_digit) - 1).numbered


# -- a shape with counts: one pattern between its head and its tail ------------------------------

# A JSON escape (as `_routine_chunks` reads them), and the gaps of a counted shape's steady path:
# non-empty text of plain ASCII and escapes (a Gemini chunk's text often holds `\\n`; other
# UTF-8 is left to the fast path's own match), any such string, a count: a non-negative JSON
# integer of at most 18 digits, as `_routine_chunks._JSON_INT`, written without its alternation
# (a lookahead for the leading zero JSON forbids: 10 % less time for three counts).
_JSON_ESCAPE = rb'\\["\\/bfnrt]|\\u[0-9a-fA-F]{4}'
_GAP_PATTERNS = {
    GAP_TEXT: rb'"(?:' + ASCII_CHARS + rb"|" + _JSON_ESCAPE + rb')++"',
    GAP_STRING: rb'"(?:' + ASCII_CHARS + rb"|" + _JSON_ESCAPE + rb')*+"',
    GAP_COUNT: rb"(?!0[0-9])[0-9]{1,18}+",
}
# The middles' patterns compiled so far, by the gaps' kinds and the literals between them. A
# pattern costs about 250 us to compile, and a stream lives for a few hundred pieces: compiled per
# stream it would cost more than it saves. But what lies between a chunk's text and its last count
# is the server's layout, the same in every stream (the stream's own `responseId` comes after the
# counts, in the tail), so a process compiles one per layout it meets. Bounded: a server whose
# middles differ in every stream only makes this compile per stream, and the cache starts over.
_MIDDLES: dict[tuple[tuple[str, ...], tuple[bytes, ...]], Callable[[bytes, int, int], re.Match[bytes] | None]] = {}
_MAX_MIDDLES = 64


def counted_steady(segments: list[bytes], kinds: list[str]) -> Steady | None:
    """The steady path of a shape with counts (its literal `segments` around gaps of `kinds`, in
    order): a piece is taken when it starts with the head, ends with the tail, and what lies between
    is the middle literals with a non-empty text, any strings and any counts in the gaps, checked by
    one pattern (three calls into C per piece, as for a one-gap shape). Nothing is predicted, so
    nothing is written per piece; the machine reads the last piece's counts when it leaves the
    steady path. None for a shape without counts, or with a sequence number."""
    if kinds.count(GAP_TEXT) != 1 or GAP_COUNT not in kinds or GAP_NUMBER in kinds:
        return None
    key = (tuple(kinds), tuple(segments[1:-1]))
    middle = _MIDDLES.get(key)
    if middle is None:
        pattern = _GAP_PATTERNS[kinds[0]] + b"".join(
            re.escape(literal) + _GAP_PATTERNS[kind] for literal, kind in zip(segments[1:-1], kinds[1:])
        )
        if len(_MIDDLES) >= _MAX_MIDDLES:
            _MIDDLES.clear()
        middle = _MIDDLES[key] = re.compile(pattern).fullmatch
    return segments[0], segments[-1], len(segments[0]), len(segments[-1]), middle
