"""Ctrl-C and `kill` while training: a step is all or nothing.

A DP step draws a batch and noise from the run's secret streams and updates the model. If an
interrupt raised an exception in the middle of it and the loop then saved a checkpoint, the
checkpoint would hold the streams after the draw but the step counter before it, and
`--resume` would run that step again with fresh noise: a mechanism run more often than the
ledger counts. So while the loop runs, the first SIGINT or SIGTERM only records a request;
the loop honours it at the next step boundary (checkpoint, then `TrainingInterrupted`, exit
130). A second signal stops at once by raising `KeyboardInterrupt` wherever the process is,
and the loop writes no checkpoint for a step it did not finish: `--resume` continues from
the last boundary checkpoint and replays the lost steps from the same saved streams, so
they draw the same batches and noise and release nothing new.

A step may take minutes (an AIM round), so whoever runs the loop can be told at once that
a request arrived (`on_request`): the CLI says it will stop after the step in progress.
"""

from __future__ import annotations

import signal
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager, suppress
from dataclasses import dataclass
from types import FrameType

_SIGNALS = (signal.SIGINT, signal.SIGTERM)


class TrainingInterrupted(KeyboardInterrupt):
    """The loop stopped at a step boundary on request, after writing its checkpoint."""


@dataclass
class InterruptRequest:
    """What the handlers saw: the first signal's number, or None while nothing arrived."""

    signum: int | None = None

    @property
    def requested(self) -> bool:
        """True once a stop was asked for."""
        return self.signum is not None


@contextmanager
def deferred_interrupts(
    on_request: Callable[[int], None] | None = None,
) -> Iterator[InterruptRequest]:
    """While active, SIGINT and SIGTERM set a flag the loop checks between steps; a second
    one raises `KeyboardInterrupt` at once. The previous handlers come back on exit.

    `on_request(signum)` is called once, from the handler, when the first signal arrives (to
    say that the stop waits for the step boundary); anything it raises is dropped, so that
    telling the user can never break the step in progress.

    Python runs signal handlers only in the main thread, so elsewhere (a test calling the
    loop from a worker thread) nothing is installed and the request never fires.
    """
    request = InterruptRequest()
    if threading.current_thread() is not threading.main_thread():
        yield request
        return

    def handle(signum: int, frame: FrameType | None) -> None:
        if request.requested:
            raise KeyboardInterrupt(
                "a second signal: stopped inside a step without writing a checkpoint; "
                "the spend stays counted and --resume continues from the last checkpoint"
            )
        request.signum = signum
        if on_request is not None:
            # The handler runs between two bytecodes of whatever the main thread was doing:
            # an error here (a write re-entering a stream) must not escape into the step.
            with suppress(Exception):
                on_request(signum)

    previous = {sig: signal.getsignal(sig) for sig in _SIGNALS}
    for sig in _SIGNALS:
        signal.signal(sig, handle)
    try:
        yield request
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)
