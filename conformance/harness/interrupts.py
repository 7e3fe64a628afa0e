"""Signals that end a run as Ctrl-C does, and an interrupt that is never lost.

SIGINT, SIGTERM and SIGHUP raise KeyboardInterrupt in the main thread, so a run
unwinds through every `with` (scratch databases dropped, workers stopped, an
embedded server shut down); the first signal counts and later ones are ignored,
so they cannot cut the clean-up short. Python drops an exception raised in a
garbage-collector callback or a finalizer ("Exception ignored in ..."), and an
interrupt raised there would be lost; so while `interruptible()` is active a
dropped KeyboardInterrupt is delivered again (by SIGALRM, a millisecond later)
until it is raised where it propagates.
"""

from __future__ import annotations

import contextlib
import signal
import sys
import threading
from collections.abc import Iterator
from types import FrameType
from typing import Any

INTERRUPTING = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)
_AGAIN = 0.001  # seconds until a dropped interrupt is raised again (SIGALRM)


class _State:
    active = False
    previous_hook: Any = sys.__unraisablehook__
    redelivered = 0  # interrupts dropped by Python and delivered again (for the tests)


_state = _State()


def _interrupted(signum: int, frame: object) -> None:
    # Once: a second signal must not cut short the cleanup that the first started.
    for each in INTERRUPTING:
        if signal.getsignal(each) is _interrupted:
            signal.signal(each, signal.SIG_IGN)
    raise KeyboardInterrupt


def _inside_the_hook(frame: FrameType | None) -> bool:
    while frame is not None:
        if frame.f_code is _hook.__code__:
            return True
        frame = frame.f_back
    return False


def _redeliver(signum: int, frame: FrameType | None) -> None:
    if _inside_the_hook(frame):  # whose exceptions Python drops too: again in a moment
        signal.setitimer(signal.ITIMER_REAL, _AGAIN)
        return
    signal.signal(signal.SIGALRM, signal.SIG_IGN)
    raise KeyboardInterrupt


def _hook(unraisable: Any) -> None:
    if _state.active and isinstance(unraisable.exc_value, KeyboardInterrupt):
        # Dropped where Python ignores exceptions. A timer raises it again, once the
        # main thread has left this hook (a signal sent now would be handled in it).
        _state.redelivered += 1
        signal.signal(signal.SIGALRM, _redeliver)
        signal.setitimer(signal.ITIMER_REAL, _AGAIN)
        return
    _state.previous_hook(unraisable)


@contextlib.contextmanager
def interruptible() -> Iterator[None]:
    """Within: SIGINT, SIGTERM and SIGHUP raise KeyboardInterrupt (once), and an
    interrupt that Python drops is raised again. A signal ignored on entry (as
    nohup ignores SIGHUP) stays ignored. Outside the main thread, where Python
    allows no handlers, nothing changes."""
    if threading.current_thread() is not threading.main_thread() or _state.active:
        yield
        return
    previous = {}
    for signum in INTERRUPTING:
        handler = signal.getsignal(signum)
        if handler is not signal.SIG_IGN:
            previous[signum] = signal.signal(signum, _interrupted)
    _state.previous_hook = sys.unraisablehook
    sys.unraisablehook = _hook
    _state.active = True
    try:
        yield
    finally:
        _state.active = False
        sys.unraisablehook = _state.previous_hook
        for signum, handler in previous.items():
            signal.signal(signum, handler)
        if signal.getsignal(signal.SIGALRM) is _redeliver:
            signal.setitimer(signal.ITIMER_REAL, 0)
            signal.signal(signal.SIGALRM, signal.SIG_DFL)
