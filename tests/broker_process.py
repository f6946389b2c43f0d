"""A broker in a process of its own, as ``trio-coord broker`` runs it, for the tests that need one.

The CLI, CLI data, Spark and data-plane chaos tests start a broker this way
(``--port 0 --json``: the first line it prints names its address). Its stderr
goes to ``broker.log`` beside its data directory, which a failure to start
quotes.
"""

from __future__ import annotations

import json
import os
import select
import signal
import subprocess
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

START_TIMEOUT = 30.0  # seconds for the broker to print its address
STOP_TIMEOUT = 15.0  # seconds for it to exit after SIGTERM


@contextmanager
def running_broker(data_dir: Path, *options: str) -> Iterator[str]:
    """``trio-coord broker --data-dir DATA_DIR --port 0 --json OPTIONS``; yields its address.

    On the way out: SIGTERM, then SIGKILL and an error if it has not exited
    within ``STOP_TIMEOUT`` (a hung broker is a bug).
    """
    log_path = data_dir.with_name("broker.log")
    log_path.parent.mkdir(parents=True, exist_ok=True)
    with log_path.open("w") as log:
        process = subprocess.Popen(
            [sys.executable, "-m", "trio_coord", "broker", "--data-dir", str(data_dir),
             "--port", "0", "--json", *options],
            stdout=subprocess.PIPE,
            stderr=log,
            text=True,
            env={**os.environ, "PYTHONUNBUFFERED": "1"},
        )  # fmt: skip
    try:
        assert process.stdout is not None
        ready, _, _ = select.select([process.stdout], [], [], START_TIMEOUT)
        line = process.stdout.readline() if ready else ""
        assert line, f"the broker did not start: {log_path.read_text()}"
        yield json.loads(line)["address"]
    finally:
        process.send_signal(signal.SIGTERM)
        try:
            process.wait(timeout=STOP_TIMEOUT)
        except subprocess.TimeoutExpired:  # pragma: no cover - a hung broker is a bug
            process.kill()
            process.wait()
            raise
