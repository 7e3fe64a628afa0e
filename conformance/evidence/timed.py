"""Worker processes timed together, for the throughput benchmark (`throughput.py`) and its peers.

Each process is spawned (it imports what it needs itself), gets its share of the
jobs and a `Clock`, and says when it is ready (imported, connected) and when it is
done. A round's time runs from the moment every process was ready to the last one's
end: the start-up of processes is nobody's throughput. CLOCK_MONOTONIC is one clock
for every process of the host, so the instants of different processes compare.
"""

from __future__ import annotations

import asyncio
import multiprocessing
import multiprocessing.synchronize
import time
from collections.abc import Callable, Sequence
from typing import Any

STOP_TIMEOUT = 5.0  # seconds a terminated child gets before it is killed


def shares(workers: int, jobs: int) -> list[int]:
    """How many jobs each process runs: `jobs // workers`, the remainder one each to the first processes."""
    if workers < 1 or jobs < 1:
        raise ValueError(f"workers and jobs must be positive, not {workers} and {jobs}")
    return [jobs // workers + (1 if index < jobs % workers else 0) for index in range(workers)]


class Clock:
    """What a worker process shares with the round: a barrier, and its slot for two instants."""

    def __init__(self, barrier: multiprocessing.synchronize.Barrier, times: Any, index: int, timeout: float) -> None:
        self.barrier, self.times, self.index, self.timeout = barrier, times, index, timeout

    def wait(self) -> None:
        """Until every process is here (e.g. every share enqueued, so that no claim finds the
        queue empty while a producer is still behind)."""
        self.barrier.wait(self.timeout)

    def ready(self) -> None:
        """Every process is ready: the round's time starts."""
        self.wait()
        self.times[2 * self.index] = time.monotonic()

    def done(self) -> None:
        self.times[2 * self.index + 1] = time.monotonic()

    async def await_ready(self) -> None:
        await asyncio.to_thread(self.ready)

    async def await_wait(self) -> None:
        await asyncio.to_thread(self.wait)


def run_timed(
    body: Callable[..., None], args: Sequence[tuple[Any, ...]], *, timeout: float, state: Callable[[], object]
) -> float:
    """Run `body(*a, clock)` for each `a` of `args` in a process of its own, and return the
    seconds from the moment every process was ready until the last was done.

    A process that fails, or is still running `timeout` seconds after the start, fails the
    round (`RuntimeError`, with `state()`: what the database holds); every child is gone when
    this returns or raises."""
    context = multiprocessing.get_context("spawn")
    barrier = context.Barrier(len(args))
    times = context.Array("d", 2 * len(args), lock=False)
    processes = [
        context.Process(
            target=body, args=(*a, Clock(barrier, times, index, timeout)), name=f"worker-{index}", daemon=True
        )
        for index, a in enumerate(args)
    ]
    try:
        start = time.perf_counter()
        for process in processes:
            process.start()
        deadline = start + timeout
        for process in processes:
            process.join(max(0.0, deadline - time.perf_counter()))
        late = [process.name for process in processes if process.is_alive()]
        if late:
            raise RuntimeError(
                f"{body.__name__}: {len(late)} worker process(es) still running after {timeout:g} s: "
                f"{', '.join(late)}; the database has {state()}"
            )
        failed = {process.name: process.exitcode for process in processes if process.exitcode != 0}
        if failed:
            raise RuntimeError(
                f"{body.__name__}: worker process(es) failed (exit codes {failed}); the database has {state()}"
            )
        return float(max(times[1::2]) - min(times[0::2]))
    finally:
        _stop(processes)


def _stop(processes: Sequence[multiprocessing.process.BaseProcess]) -> None:
    """Terminate the children still running, then kill those that outlive `STOP_TIMEOUT`."""
    started = [process for process in processes if process.pid is not None]
    for process in started:
        if process.is_alive():
            process.terminate()
    deadline = time.perf_counter() + STOP_TIMEOUT
    for process in started:
        process.join(max(0.0, deadline - time.perf_counter()))
    for process in started:
        if process.is_alive():
            process.kill()
            process.join(STOP_TIMEOUT)
