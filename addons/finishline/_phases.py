"""The phases of one stream's repair and what moves it between them, as data the machine reads.

Theory of operation
-------------------
A stream starts `STREAMING`: its events are read and repaired. Three things end that, and nothing
brings it back:

* `data: [DONE]` (`Signal.DONE`): the client stops reading there, so later bytes pass as sent;
* an upstream error event (`Signal.ERROR_EVENT`): the upstream said it failed, so nothing is ever
  injected after it (rule C5);
* giving up (`Signal.GIVE_UP`): a bug of finish_fix's own, an event too big to hold, or a response the
  core is told not to repair (an HTTP error status, a compressed body); every byte from there on
  passes unchanged and the verdict says why.

The end of the upstream body (clean, failed, stalled, or the client gone) is not a phase: it is the
`StreamRepair.ended` flag, checked before any input, and what it does depends on the phase it finds.
`TRANSITIONS` lists every (phase, signal) pair; `StreamRepair._move` looks the next phase up there, so
a pair missing from the table is a bug that fails loudly (KeyError) rather than a silent new path.
`DEADLINES_RUN` says in which phases a stall deadline runs (only while finish_fix could still tell
the client how the stream ended).
"""

from __future__ import annotations

import enum

__all__ = ["Phase", "Signal", "TRANSITIONS", "DEADLINES_RUN"]


class Phase(enum.Enum):
    # Events are being repaired.
    STREAMING = enum.auto()
    # `data: [DONE]` went by: the client stops reading here; later bytes pass as sent.
    AFTER_DONE = enum.auto()
    # The upstream sent an error event: nothing is ever injected after it (rule C5).
    AFTER_ERROR_EVENT = enum.auto()
    # finish_fix gave up on this stream, or was told not to repair it: everything passes unchanged.
    PASSTHROUGH = enum.auto()


class Signal(enum.Enum):
    # An event whose data is `[DONE]`.
    DONE = enum.auto()
    # An `event: error` or a chunk with a top-level `error`.
    ERROR_EVENT = enum.auto()
    # Stop repairing: a bug of ours, an event past MAX_HELD_BYTES, or a response not to repair.
    GIVE_UP = enum.auto()


TRANSITIONS: dict[Phase, dict[Signal, Phase]] = {
    Phase.STREAMING: {
        Signal.DONE: Phase.AFTER_DONE,
        Signal.ERROR_EVENT: Phase.AFTER_ERROR_EVENT,
        Signal.GIVE_UP: Phase.PASSTHROUGH,
    },
    # After [DONE] or an error event the stream is told; later [DONE]s and errors are only data.
    Phase.AFTER_DONE: {
        Signal.DONE: Phase.AFTER_DONE,
        Signal.ERROR_EVENT: Phase.AFTER_DONE,
        Signal.GIVE_UP: Phase.PASSTHROUGH,
    },
    Phase.AFTER_ERROR_EVENT: {
        Signal.DONE: Phase.AFTER_ERROR_EVENT,
        Signal.ERROR_EVENT: Phase.AFTER_ERROR_EVENT,
        Signal.GIVE_UP: Phase.PASSTHROUGH,
    },
    # Passthrough is for good: nothing is read any more.
    Phase.PASSTHROUGH: {
        Signal.DONE: Phase.PASSTHROUGH,
        Signal.ERROR_EVENT: Phase.PASSTHROUGH,
        Signal.GIVE_UP: Phase.PASSTHROUGH,
    },
}

# Phases in which a stall deadline runs: after [DONE] or an error event the client has its answer,
# and in passthrough finish_fix promised to change nothing.
DEADLINES_RUN = frozenset({Phase.STREAMING})
