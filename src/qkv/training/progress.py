"""Progress, one way for every long loop of qkv (training, the studies): a tqdm bar on a terminal, plain lines
in a log.

A tqdm bar redraws itself in place with carriage returns; written to a file or a pipe, those redraws pile up
into one line that grows by a few hundred bytes a second. So when the stream is not a terminal, progress is a
plain line, ending in a newline, every ``interval`` seconds (and a last one at the end), in the same words.

Shapes: none.
"""
from __future__ import annotations

import math
import sys
import time
from typing import IO

LOG_INTERVAL_S = 10.0  # seconds between two lines of progress in a log
LINE_FORMAT = "{desc}: {percentage:3.0f}% ({n_fmt}/{total_fmt} {unit}) [{elapsed}<{remaining}{postfix}]"
PERCENT_FORMAT = "{desc}: {percentage:3.0f}% [{elapsed}<{remaining}{postfix}]"  # a total of 100 %: no counts


def percent_done(fraction: float) -> float:
    """The percentage a bar of total 100 shows for ``fraction`` of the work: whole percents, rounded down, so that
    it reads 100 % only once the work is done (the formats' ``{percentage:3.0f}`` would round 99.5 % up)."""
    return 100.0 if fraction >= 1 else float(min(99, math.floor(100 * max(0.0, fraction))))


def is_terminal(stream: IO | None) -> bool:
    """Whether ``stream`` is a terminal (a closed or odd stream is not)."""
    try:
        return bool(stream is not None and stream.isatty())
    except (AttributeError, ValueError, OSError):
        return False


class LineProgress:
    """What of tqdm's bar the loops use (``update``, ``set_postfix_str``, ``close``, ``n``, ``with``), written
    as plain lines: one at the start, then at most one every ``interval`` seconds, and one at the end."""

    def __init__(self, total: float, *, desc: str, unit: str, initial: float = 0, file: IO,
                 interval: float = LOG_INTERVAL_S) -> None:
        self.total, self.desc, self.unit, self.file, self.interval = total, desc, unit, file, interval
        self.n = self.initial = initial
        self.postfix, self.start = "", time.monotonic()
        self.written: tuple | None = None  # (n, postfix) of the last line
        self.closed = False
        self.write()  # where it starts, as tqdm's bar shows

    def __enter__(self) -> "LineProgress":
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def line(self) -> str:
        """The line for now: done, elapsed and remaining time, the postfix."""
        from tqdm import tqdm

        fmt = PERCENT_FORMAT if self.unit == "%" else LINE_FORMAT
        return tqdm.format_meter(self.n, self.total, time.monotonic() - self.start, prefix=self.desc, unit=self.unit,
                                 initial=self.initial, postfix=self.postfix or None, bar_format=fmt)

    def write(self) -> None:
        self.last, self.written = time.monotonic(), (self.n, self.postfix)
        print(self.line(), file=self.file, flush=True)

    def update(self, n: float = 1) -> None:
        self.n += n
        if time.monotonic() - self.last >= self.interval:
            self.write()

    def set_postfix_str(self, s: str = "", refresh: bool = True) -> None:
        """The text after the times; shown by the next line (``refresh`` is tqdm's, ignored)."""
        self.postfix = str(s)

    def close(self) -> None:
        """The last line, once (unless the line before says the same)."""
        if not self.closed:
            self.closed = True
            if self.written != (self.n, self.postfix):
                self.write()


def note(bar, text: str) -> None:
    """A line of text above a terminal's bar, or between a log's progress lines."""
    if isinstance(bar, LineProgress):
        print(text, file=bar.file, flush=True)
    else:
        bar.write(text, file=bar.fp)


def progress_bar(total: float, *, desc: str, unit: str, initial: float = 0, bar_format: str | None = None,
                 file: IO | None = None, interval: float = LOG_INTERVAL_S):
    """A progress bar on ``file`` (default: stderr): tqdm's on a terminal, else a ``LineProgress``.

    ``bar_format`` is the terminal bar's (tqdm's syntax); the lines have their own plain format.
    ``interval``: seconds between two lines when ``file`` is not a terminal (0: a line per update).
    """
    file = sys.stderr if file is None else file
    if not is_terminal(file):
        return LineProgress(total, desc=desc, unit=unit, initial=initial, file=file, interval=interval)
    from tqdm.auto import tqdm

    return tqdm(total=total, initial=initial, desc=desc, unit=unit, file=file, dynamic_ncols=True,
                bar_format=bar_format)
