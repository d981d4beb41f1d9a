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
    "CountPrediction",
    "NumberedSteady",
    "Steady",
    "SteadyShape",
    "counted_steady",
    "match_plain_text",
    "match_steady_text",
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
# A counted shape's text, non-empty plain ASCII and escapes, alone (`CountPrediction`'s check when
# the text is not plain: the counted pattern's text gap, so that both take the same texts).
match_steady_text = re.compile(_GAP_PATTERNS[GAP_TEXT]).fullmatch
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


# -- a shape with counts whose next counts are predicted -----------------------------------------

# The largest count a shape's count gap takes (`_routine_chunks._JSON_INT`: at most 18 digits).
_MAX_COUNT = 10**18 - 1
# What the machine checks a piece against on the predicted path (`StreamRepair.receive_data`): (head,
# tail with the predicted counts in it, the head's length, the tail's length, the prediction, and for
# the usual step (two counts +1, the others +0: one token per chunk) the last digits of those two in
# the tail, which the machine adds one to in its own body unless one is a 9; else -1, -1: `advance`).
PredictedSteady = tuple[bytes, bytearray, int, int, "CountPrediction", int, int]


class CountPrediction:
    """The steady path of a Gemini chunk's shape whose counts follow their last step: the text, then
    only counts (`usageMetadata`'s, in gap order `keys`), then the tail.

    A stream of one token per chunk adds the same to each count on every chunk (candidates and total
    +1, prompt +0), so `start`, given the counts of the last two chunks, predicts the next chunk's
    as the last plus the same step, and folds them with the literals after the text into one tail:
    a piece is then taken when it starts with the head, ends with that tail and has a text between
    (plain ASCII first, `match_plain_text`, else the counted pattern's text, `match_steady_text`),
    as Chat's one-gap steady path. Since the text is a JSON string and the literal after it starts
    after its closing quote, such a piece holds exactly the predicted counts. After it, the next
    counts are written in place: a step of 1 changes a last digit (in the machine's body for the
    usual two counts), a 9 carries (`carry`); a count of all 9s, or any other step, writes the tail
    again (`advance`). A piece with other counts is not taken: the machine checks it against the
    counted pattern (`fallback`, `counted_steady`), as it did before there was a prediction.
    """

    __slots__ = ("head", "keys", "fallback", "_literals", "_steps", "_spans", "_ones", "_carries", "_every", "steady")

    def __init__(self, segments: list[bytes], keys: list[str], fallback: Steady) -> None:
        self.head = segments[0]
        self.keys = keys
        self.fallback = fallback
        # The literals after the text: one before each count, and the tail after the last.
        self._literals = segments[1:]
        self._steps: list[int] = []
        # Where each predicted count is in the tail; the last digit of those that grow by one, and
        # (where the count starts, that last digit) for their carries.
        self._spans: list[tuple[int, int]] = []
        self._ones: tuple[int, ...] = ()
        self._carries: tuple[tuple[int, int], ...] = ()
        self._every = False  # a step other than 0 or 1: the tail is written again for every piece
        self.steady: PredictedSteady | None = None

    @classmethod
    def of(cls, segments: list[bytes], kinds: list[str], keys: list[str], fallback: Steady | None) -> CountPrediction | None:
        """The prediction of a shape (its literal `segments` around gaps of `kinds`, the count gaps'
        `keys` in order) whose first gap is the text and every other a count; else None."""
        if fallback is None or len(kinds) < 2 or kinds[0] is not GAP_TEXT or any(kind is not GAP_COUNT for kind in kinds[1:]):
            return None
        if len(keys) != len(kinds) - 1:
            return None
        return cls(segments, keys, fallback)

    def start(self, before: dict[str, int], last: dict[str, int]) -> PredictedSteady | None:
        """The check for the piece after two chunks of counts `before` and `last`: `last` plus the
        same step. None when it cannot be predicted (other keys, or a count out of a gap's range)."""
        keys = self.keys
        if before.keys() != last.keys() or len(last) != len(keys):
            return None
        counts = [last[key] for key in keys]
        self._steps = [now - then for now, then in zip(counts, (before[key] for key in keys))]
        self._every = any(step not in (0, 1) for step in self._steps)
        return self._write(counts)

    def advance(self) -> PredictedSteady | None:
        """A piece with the predicted counts was taken: the check for the one after it."""
        steady = self.steady
        assert steady is not None
        tail = steady[1]
        if self._every:
            return self._taken_again()
        ones = self._ones
        for at in ones:
            if tail[at] == 0x39:
                return self.carry()
        for at in ones:
            tail[at] += 1
        return steady

    def carry(self) -> PredictedSteady | None:
        """`advance` when a count that grows by one ends in 9: its 9s roll over to 0s in place; a
        count of all 9s has one digit more, and the tail is written again (after 9, 99, 999)."""
        steady = self.steady
        assert steady is not None
        tail = steady[1]
        rolled = []
        for start, at in self._carries:
            while tail[at] == 0x39:
                at -= 1
            if at < start:
                return self._taken_again()
            rolled.append(at)
        for at, last in zip(rolled, self._ones):
            tail[at] += 1
            tail[at + 1 : last + 1] = b"0" * (last - at)
        return steady

    def _taken_again(self) -> PredictedSteady | None:
        """The tail written again from the counts of the piece just taken (read from the tail)."""
        steady = self.steady
        assert steady is not None
        tail = steady[1]
        return self._write([int(tail[start:end]) for start, end in self._spans])

    def _write(self, taken: list[int]) -> PredictedSteady | None:
        """The check for the piece after one with counts `taken`."""
        counts = [count + step for count, step in zip(taken, self._steps)]
        if any(count < 0 or count > _MAX_COUNT for count in counts):
            self.steady = None
            return None
        literals = self._literals
        tail = bytearray(literals[0])
        spans = []
        carries = []
        for count, step, literal in zip(counts, self._steps, literals[1:]):
            start = len(tail)
            tail += b"%d" % count
            spans.append((start, len(tail)))
            if step == 1:
                carries.append((start, len(tail) - 1))
            tail += literal
        self._spans, self._carries = spans, tuple(carries)
        self._ones = ones = tuple(last for _, last in carries)
        first, second = ones if len(ones) == 2 and not self._every else (-1, -1)
        self.steady = (self.head, tail, len(self.head), len(tail), self, first, second)
        return self.steady
