"""Progress lines on stderr for the waits a user sits through: building the native kernels, measuring the
cost profile, loading a model.

A wait is a ``with waiting("building quant_forward.cpp (once)"):`` block. On a terminal it shows one line,
``building quant_forward.cpp (once) ...``, whose seconds count up in place, and ends it with
``done in 41.2 s``; a wait that starts inside another ends the outer's line first, and the outer then
reports its end on a line of its own. Nothing is written when stderr is not a terminal (logs, pipes and
test runs stay clean) or when progress is turned off (:func:`set_quiet`: the ``-q`` option of the command
line and the examples; or ``HVD_AGENTS_QUIET=1``). What waits also goes to the log as before.

These lines are terminal output for a person watching, like a progress bar, not log records: they are
written to ``sys.stderr`` directly.
"""

from __future__ import annotations

import os
import sys
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from typing import TextIO

QUIET_ENV = "HVD_AGENTS_QUIET"
TICK_S = 1.0  # how often a waiting line's seconds are updated

_lock = threading.Lock()
_quiet = False
_open: _Line | None = None  # the wait whose line is open (last on the terminal, no newline yet)


def set_quiet(quiet: bool = True) -> None:
    """Turn progress lines off (True) or back on (False) for this process."""
    global _quiet
    _quiet = quiet


def enabled(stream: TextIO | None = None) -> bool:
    """Whether progress lines are written: not quiet, and ``stream`` (default stderr) is a terminal."""
    if _quiet or os.environ.get(QUIET_ENV, "").strip() not in ("", "0"):
        return False
    stream = sys.stderr if stream is None else stream
    isatty = getattr(stream, "isatty", None)
    return bool(isatty and isatty())


class _Line:
    """One wait's line on ``stream`` (under the module lock)."""

    def __init__(self, what: str, stream: TextIO) -> None:
        self.what = what
        self.stream = stream
        self.started = time.perf_counter()
        self.stopped = threading.Event()
        self.width = 0

    def _write(self, text: str) -> None:
        self.stream.write(text)
        self.stream.flush()

    def open(self) -> None:
        global _open
        with _lock:
            if _open is not None:  # an outer wait: end its line, it reports on a line of its own
                _open._write("\n")
            _open = self
            self._show("...")

    def _show(self, status: str) -> None:
        text = f"{self.what} {status}"
        self._write("\r" + text.ljust(self.width))
        self.width = len(text)

    def tick(self) -> None:
        while not self.stopped.wait(TICK_S):
            with _lock:
                if _open is self:
                    self._show(f"... {time.perf_counter() - self.started:.0f} s")

    def close(self, status: str) -> None:
        global _open
        self.stopped.set()
        text = f"{status} in {time.perf_counter() - self.started:.1f} s"
        with _lock:
            if _open is self:
                self._show(f"... {text}")
                self._write("\n")
                _open = None
            else:
                self._write(f"{self.what}: {text}\n")


def end_line() -> None:
    """End the open progress line, if any: other output (a library's own progress bar) is about to take the
    terminal. The wait whose line it was reports its end on a line of its own."""
    global _open
    with _lock:
        if _open is not None:
            _open._write("\n")
            _open = None


@contextmanager
def waiting(what: str, *, stream: TextIO | None = None) -> Iterator[None]:
    """Show ``what`` as a progress line on ``stream`` (default stderr) while the block runs (see the module
    docstring); nothing when :func:`enabled` is False.

    Args:
        what: what the wait is, e.g. ``"measuring the cost profile (once per model and machine)"``.
        stream: where to write (a terminal); None: ``sys.stderr`` at the time of the call.
    """
    stream = sys.stderr if stream is None else stream
    if not enabled(stream):
        yield
        return
    line = _Line(what, stream)
    line.open()
    ticker = threading.Thread(target=line.tick, name="hvd-progress", daemon=True)
    ticker.start()
    try:
        yield
    except BaseException:
        line.close("failed")
        raise
    finally:
        line.stopped.set()
        ticker.join()
    line.close("done")
