"""A child process that acknowledges writes on its stdout, for the SIGKILL crash tests.

The child (``python -c SCRIPT ARGS...``) prints ``ready`` once it writes, then
one line per acknowledged write; a thread drains its stdout, so that it never
blocks on the pipe. A test kills it with SIGKILL at a moment of its choosing,
then checks after recovery that every acknowledged write is there. Shared by
``log/test_crash.py`` (appended batches) and ``store/test_embedded_crash.py``
(store transactions).
"""

from __future__ import annotations

import signal
import subprocess
import sys
import threading

import pytest


class AckingChild:
    """One child process and what it has acknowledged so far."""

    def __init__(self, script: str, *args: object) -> None:
        self.proc = subprocess.Popen(
            [sys.executable, "-c", script, *map(str, args)],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        self.lines: list[str] = []
        self.ready = threading.Event()
        self._reader = threading.Thread(target=self._drain, daemon=True)
        self._reader.start()

    def _drain(self) -> None:
        assert self.proc.stdout is not None
        for line in self.proc.stdout:
            if line == "ready\n":
                self.ready.set()
            else:
                self.lines.append(line)
        self.ready.set()  # died early: let the test see why

    def wait_ready(self, timeout: float, what: str) -> None:
        """Wait until the child said ``ready``; fail the test (with its stderr) if it died."""
        assert self.ready.wait(timeout=timeout), f"{what} did not start"
        if self.proc.poll() is not None:  # pragma: no cover - a broken child
            assert self.proc.stderr is not None
            pytest.fail(f"{what} died: {self.proc.stderr.read()}")

    def kill(self) -> list[list[str]]:
        """SIGKILL the child; return the fields of each line it acknowledged (a line cut
        by the kill, with no newline, was not acknowledged)."""
        self.proc.send_signal(signal.SIGKILL)
        self.proc.wait(timeout=10)
        self._reader.join(timeout=10)
        return [line.split() for line in self.lines if line.endswith("\n")]

    def reap(self) -> None:
        """Kill the child if it still runs (after a failure), and wait for it."""
        if self.proc.poll() is None:  # pragma: no cover - only after a failure
            self.proc.kill()
            self.proc.wait()
