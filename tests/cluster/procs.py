"""Brokers of a test cluster as real processes (``trio-coord broker --store zk://...``).

A :class:`BrokerProcess` runs ``python -m trio_coord broker`` with a ZooKeeper
store, a free port and its own data dir, and reads the JSON line the broker
prints once it listens (its address). Tests SIGKILL, SIGSTOP and SIGCONT it
like an operator's (or the kernel's) signals would; its log goes to a file
the test can read (``log_text``).
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from pathlib import Path

import trio

# Short enough for fast tests, long enough for a loaded 2-core machine.
ZK_SESSION = 2.0
SLOTS = 6


class BrokerProcess:
    """One broker process of the cluster on ``url``."""

    def __init__(self, url: str, broker_id: int, base: Path) -> None:
        self.url = url
        self.broker_id = broker_id
        self.dir = base / f"broker{broker_id}"
        self.dir.mkdir(parents=True, exist_ok=True)
        self.log_path = self.dir / "broker.log"
        self.process: trio.Process | None = None
        self.address: tuple[str, int] | None = None

    @property
    def bootstrap(self) -> str:
        """``host:port`` of the broker."""
        assert self.address is not None
        return f"{self.address[0]}:{self.address[1]}"

    async def start(self) -> None:
        """Start the broker and wait until it listens and is registered."""
        command = [
            sys.executable,
            "-m",
            "trio_coord",
            "broker",
            "--store",
            self.url,
            "--broker-id",
            str(self.broker_id),
            "--port",
            "0",
            "--data-dir",
            str(self.dir / "data"),
            "--coordinator-slots",
            str(SLOTS),
            "--zk-session-timeout",
            str(ZK_SESSION),
            "--min-session-timeout",
            "0.2",
            "--json",
        ]
        log = open(self.log_path, "ab")  # noqa: ASYNC230 (handed to the child)
        try:
            self.process = await trio.lowlevel.open_process(
                command,
                stdout=subprocess.PIPE,
                stderr=log,
                env={**os.environ, "PYTHONUNBUFFERED": "1"},
            )
        finally:
            log.close()
        assert self.process.stdout is not None
        line = b""
        with trio.fail_after(30):
            while not line.endswith(b"\n"):
                chunk = await self.process.stdout.receive_some(1)
                if not chunk:
                    raise RuntimeError(f"broker {self.broker_id} exited:\n{self.log_text()}")
                line += chunk
        event = json.loads(line)
        host, _, port = event["address"].rpartition(":")
        self.address = (host, int(port))

    def signal(self, sig: signal.Signals) -> None:
        """Send ``sig`` to the broker process."""
        assert self.process is not None
        self.process.send_signal(sig)

    async def stop(self) -> None:
        """SIGTERM (after SIGCONT, in case it is stopped), then wait; SIGKILL if it lingers."""
        if self.process is None or self.process.returncode is not None:
            return
        self.process.send_signal(signal.SIGCONT)
        self.process.send_signal(signal.SIGTERM)
        with trio.move_on_after(15):
            await self.process.wait()
            return
        self.process.kill()
        await self.process.wait()

    async def kill(self) -> None:
        """SIGKILL, as a crash, and reap it."""
        assert self.process is not None
        self.process.kill()
        await self.process.wait()

    def log_text(self) -> str:
        """What the broker logged so far."""
        return self.log_path.read_text(errors="replace")
