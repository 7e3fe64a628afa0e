"""One line of live progress on a stream, for the long-running commands."""

from __future__ import annotations

from typing import TextIO


class ProgressLine:
    """Rewritten in place on a terminal; elsewhere (a CI log) printed whenever
    the measure of progress (seconds, examples) has moved `every` past the
    last line printed, starting at `first`."""

    def __init__(self, stream: TextIO, every: float, first: float | None = None, width: int = 78) -> None:
        self.stream, self.every, self.width = stream, every, width
        self.live = stream.isatty()
        self.next_report = every if first is None else first

    def show(self, line: str, at: float) -> None:
        if self.live:
            self.stream.write("\r" + line.ljust(self.width))
            self.stream.flush()
        elif at >= self.next_report:
            self.stream.write(line + "\n")
            self.next_report = at + self.every

    def close(self) -> None:
        if self.live:
            self.stream.write("\r" + " " * self.width + "\r")
            self.stream.flush()
