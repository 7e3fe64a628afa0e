"""An interrupt is never lost: one that Python drops (raised by the signal handler
inside a garbage-collector callback, where exceptions are printed and ignored) is
raised again where it propagates. Each test sends itself a real signal."""

from __future__ import annotations

import gc
import os
import signal
from collections.abc import Callable, Iterator

import pytest

from leaseproof.conformance.harness import interrupts
from leaseproof.conformance.harness.interrupts import interruptible


@pytest.fixture(autouse=True)
def signals_as_in_a_terminal() -> Iterator[None]:
    """The three signals as a run started from a terminal has them (a pytest-xdist
    worker starts with SIGINT ignored, which `interruptible` would leave so)."""
    previous = {signum: signal.getsignal(signum) for signum in interrupts.INTERRUPTING}
    signal.signal(signal.SIGINT, signal.default_int_handler)
    signal.signal(signal.SIGTERM, signal.SIG_DFL)
    signal.signal(signal.SIGHUP, signal.SIG_DFL)
    try:
        yield
    finally:
        for signum, handler in previous.items():
            signal.signal(signum, handler)


def _signal_inside_a_gc_callback(signum: int) -> Callable[[str, dict[str, int]], None]:
    fired: list[int] = []

    def callback(phase: str, info: dict[str, int]) -> None:
        if phase == "start" and not fired:
            fired.append(signum)
            os.kill(os.getpid(), signum)
            # The handler runs at the next instruction, here, inside the callback.
            sum(range(100))

    return callback


@pytest.mark.parametrize("signum", [signal.SIGTERM, signal.SIGHUP, signal.SIGINT], ids=lambda s: s.name)
def test_an_interrupt_dropped_inside_a_gc_callback_is_raised_again(signum: signal.Signals) -> None:
    callback = _signal_inside_a_gc_callback(signum)
    before = interrupts._state.redelivered
    gc.callbacks.append(callback)
    reached_the_end = False
    try:
        with pytest.raises(KeyboardInterrupt), interruptible():
            gc.collect()
            gc.callbacks.remove(callback)
            for _ in range(10**7):  # the raise comes at one of these, about a millisecond on
                sum(range(10))
            reached_the_end = True
    finally:
        if callback in gc.callbacks:
            gc.callbacks.remove(callback)
    assert not reached_the_end
    assert interrupts._state.redelivered > before  # it was dropped, and raised again


def test_a_second_signal_during_the_cleanup_is_ignored() -> None:
    cleaned = False
    with pytest.raises(KeyboardInterrupt), interruptible():
        try:
            os.kill(os.getpid(), signal.SIGTERM)
            sum(range(100))
        finally:
            os.kill(os.getpid(), signal.SIGTERM)  # ignored: the cleanup below still runs
            sum(range(100))
            cleaned = True
    assert cleaned


def test_the_handlers_before_are_restored_after() -> None:
    before = {s: signal.getsignal(s) for s in interrupts.INTERRUPTING}
    with interruptible():
        assert all(signal.getsignal(s) is not before[s] for s in interrupts.INTERRUPTING)
    assert {s: signal.getsignal(s) for s in interrupts.INTERRUPTING} == before


def test_a_signal_ignored_on_entry_stays_ignored() -> None:
    previous = signal.signal(signal.SIGHUP, signal.SIG_IGN)
    try:
        with interruptible():
            assert signal.getsignal(signal.SIGHUP) is signal.SIG_IGN
            os.kill(os.getpid(), signal.SIGHUP)
            sum(range(100))  # nothing is raised
    finally:
        signal.signal(signal.SIGHUP, previous)
