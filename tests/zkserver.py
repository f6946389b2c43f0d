"""A private ZooKeeper server for tests, and a TCP proxy that can cut clients off it.

Integration tests that need ZooKeeper start Debian's ZooKeeper (package
``zookeeper``, which ``scripts/test`` installs) as a standalone server on a
free port on 127.0.0.1, with its data in a directory the test owns. Nothing
here skips: if Java or the ZooKeeper jar is missing, :class:`ZooKeeperServer`
raises :class:`ZooKeeperUnavailable`, whose message says to run
``scripts/test``; fixtures turn that into a test failure.

API (synchronous, so session-scoped fixtures and Trio tests can share it; from
Trio call the blocking methods through ``trio.to_thread.run_sync``)::

    server = ZooKeeperServer(tmp_dir)          # nothing runs yet
    server.start()                             # free port, waits until it answers
    server.hosts                               # "127.0.0.1:PORT"
    server.url("/my/chroot")                   # "zk://127.0.0.1:PORT/my/chroot"
    server.stop()                              # SIGTERM (SIGKILL after a grace period)
    server.start()                             # again: SAME port, SAME data dir
    server.restart()                           # stop + start
    server.kill()                              # SIGKILL, as a crash
    server.four_letter("srvr")                 # any four-letter word (all are whitelisted)
    with ZooKeeperServer(tmp_dir) as server:   # start ... stop
        ...

The server is tuned for tests: ``tickTime`` 200 ms, so sessions may be as short
as 400 ms (``min_session_timeout``) and expire promptly; ``maxSessionTimeout``
60 s; ``forceSync=no`` (no fsync per write: a crashed *machine* could lose
data, a killed server cannot, since the OS has the bytes); no admin server;
unlimited connections per client IP. A server that does not answer ``ruok``
within ``start_timeout`` seconds fails with the tail of its log (which is in
``base_dir/zookeeper.log``).

A restart keeps the sessions (ZooKeeper restores them with a fresh timeout),
but beware a ZooKeeper 3.8.0 startup race: a client connection that arrives
while the server is still loading its data can be left open without an answer
(a NullPointerException in the server's log), and the client's handshake then
waits for its whole session timeout, long enough for the restored session to
expire. A test that needs sessions to survive a restart gates its clients
with a :class:`TcpProxy`: ``stop()``, ``proxy.block()``, ``start()``,
``proxy.unblock()``.

:class:`TcpProxy` is a Trio TCP proxy to put between clients and the server:
``cut()`` drops every proxied connection (the clients see a connection loss
and reconnect) and ``block()`` / ``unblock()`` refuse new connections in
between (a network partition: the server expires the sessions of clients that
stay cut off for longer than their session timeout).
"""

from __future__ import annotations

import contextlib
import functools
import os
import shutil
import signal
import socket
import subprocess
import time
import zipfile
from collections.abc import AsyncIterator
from pathlib import Path
from types import TracebackType

import trio

JAVA_DIR = Path("/usr/share/java")
ZOOKEEPER_JAR = JAVA_DIR / "zookeeper.jar"
MAIN_CLASS = "org.apache.zookeeper.server.ZooKeeperServerMain"
INSTALL_HINT = (
    "run scripts/test, which installs Java and ZooKeeper (Debian package 'zookeeper'); "
    "ZooKeeper tests never skip"
)


class ZooKeeperUnavailable(RuntimeError):
    """Java or the ZooKeeper jars are not installed, or the server would not start."""


def zookeeper_classpath() -> list[str]:
    """The jars the standalone server needs, from Debian's layout.

    ``zookeeper.jar``'s manifest already names its dependencies (jute, slf4j-api,
    commons-cli/io, jackson, jetty, netty, metrics, snappy); they are listed here
    as well so that a missing one fails loudly, plus the slf4j-simple binding
    so that the server's log goes to ``zookeeper.log``. jline (the CLI's) is
    not needed by the server.
    """
    if not ZOOKEEPER_JAR.is_file():
        raise ZooKeeperUnavailable(f"{ZOOKEEPER_JAR} is missing: {INSTALL_HINT}")
    jars = [ZOOKEEPER_JAR]
    with zipfile.ZipFile(ZOOKEEPER_JAR) as jar:
        manifest = jar.read("META-INF/MANIFEST.MF").decode()
    # Manifest lines are folded at 72 bytes: a continuation line starts with a space.
    unfolded = manifest.replace("\r\n", "\n").replace("\n ", "")
    for line in unfolded.splitlines():
        if line.startswith("Class-Path:"):
            jars += [Path(entry) for entry in line.partition(":")[2].split()]
    required = {"zookeeper-jute.jar", "slf4j-api.jar", "commons-cli.jar"}
    optional = {"jline.jar"}  # only the command-line client uses it
    cp = []
    for jar_path in jars:
        if jar_path.is_file():
            cp.append(str(jar_path))
        elif jar_path.name in required:
            raise ZooKeeperUnavailable(f"{jar_path} is missing: {INSTALL_HINT}")
        elif jar_path.name not in optional:
            cp.append(str(jar_path))  # let Java report it, should it matter
    binding = JAVA_DIR / "slf4j-simple.jar"
    if binding.is_file():
        cp.append(str(binding))
    return cp


def java_binary() -> str:
    """The ``java`` to run the server with (``$JAVA_HOME/bin/java`` or the PATH's)."""
    home = os.environ.get("JAVA_HOME")
    if home and (Path(home) / "bin" / "java").is_file():
        return str(Path(home) / "bin" / "java")
    found = shutil.which("java")
    if found is None:
        raise ZooKeeperUnavailable(f"no 'java' on PATH: {INSTALL_HINT}")
    return found


def free_port() -> int:
    """A TCP port on 127.0.0.1 that nothing listens on right now."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


class ZooKeeperServer:
    """One standalone ZooKeeper server process for tests (see the module docstring)."""

    def __init__(
        self,
        base_dir: str | os.PathLike[str],
        *,
        tick_time: float = 0.2,
        port: int | None = None,
        start_timeout: float = 30.0,
        heap: str = "256m",
        fixed_heap: bool = False,
    ) -> None:
        """Prepare a server whose data and log live in ``base_dir``; nothing starts yet.

        ``port=None`` picks a free port on the first :meth:`start`; every later
        start reuses it, so clients can reconnect to the same address.
        ``heap`` is the JVM's ``-Xmx`` (a benchmark that stores a million
        nodes needs more than the tests' default); ``fixed_heap`` takes it
        all at start (``-Xms``), so that the young generation is large from
        the start and a server holding a million nodes is not paused by a
        young collection every second (with a growing heap those took 100 ms
        each on two shared cores).
        """
        self.base_dir = Path(base_dir)
        self.data_dir = self.base_dir / "data"
        self.config_path = self.base_dir / "zoo.cfg"
        self.log_path = self.base_dir / "zookeeper.log"
        self.tick_time = tick_time
        self.port = port
        self.start_timeout = start_timeout
        self.heap = heap
        self.fixed_heap = fixed_heap
        self._fixed_port = port is not None
        self._process: subprocess.Popen[bytes] | None = None
        self._classpath = zookeeper_classpath()
        self._java = java_binary()

    # -- addresses -------------------------------------------------------------

    @property
    def hosts(self) -> str:
        """The client connection string, ``127.0.0.1:PORT``."""
        if self.port is None:
            raise RuntimeError("the server has not been started yet")
        return f"127.0.0.1:{self.port}"

    def url(self, chroot: str = "") -> str:
        """A ``zk://`` URL for this server, with an optional chroot (``/a/b``)."""
        return f"zk://{self.hosts}{chroot}"

    @property
    def min_session_timeout(self) -> float:
        """The shortest session timeout (seconds) the server grants: two ticks."""
        return 2 * self.tick_time

    @property
    def running(self) -> bool:
        """Whether the server process is alive."""
        return self._process is not None and self._process.poll() is None

    # -- life cycle ------------------------------------------------------------

    def start(self) -> None:
        """Start the server and return once it answers ``ruok`` (idempotent).

        The first start without a fixed port retries on other free ports if
        the one it picked was taken meanwhile.
        """
        if self.running:
            return
        attempts = 1 if (self._fixed_port or self.port is not None) else 5
        for attempt in range(attempts):
            if self.port is None or (attempt and not self._fixed_port):
                self.port = free_port()
            try:
                self._start_once()
                return
            except ZooKeeperUnavailable:
                if attempt + 1 == attempts or "Address already in use" not in self._log_tail():
                    raise
        raise AssertionError("unreachable")  # pragma: no cover

    def _start_once(self) -> None:
        assert self.port is not None
        self.data_dir.mkdir(parents=True, exist_ok=True)
        tick_ms = max(1, round(self.tick_time * 1000))
        self.config_path.write_text(
            "\n".join(
                [
                    f"tickTime={tick_ms}",
                    f"minSessionTimeout={2 * tick_ms}",
                    "maxSessionTimeout=60000",
                    f"dataDir={self.data_dir}",
                    f"clientPort={self.port}",
                    "clientPortAddress=127.0.0.1",
                    "maxClientCnxns=0",
                    "forceSync=no",
                    "admin.enableServer=false",
                    "4lw.commands.whitelist=*",
                    "",
                ]
            )
        )
        command = [
            self._java,
            f"-Xmx{self.heap}",
            "-XX:+UseSerialGC",
            *([f"-Xms{self.heap}"] if self.fixed_heap else []),
            "-XX:TieredStopAtLevel=1",  # start fast; tests do not run long enough for C2
            "-Djava.net.preferIPv4Stack=true",
            "-Dorg.slf4j.simpleLogger.defaultLogLevel=warn",
            "-Dorg.slf4j.simpleLogger.showDateTime=true",
            "-Dzookeeper.admin.enableServer=false",
            "-cp",
            ":".join(self._classpath),
            MAIN_CLASS,
            str(self.config_path),
        ]
        with self.log_path.open("ab") as log:
            log.write(f"\n=== starting on port {self.port}: {' '.join(command)}\n".encode())
            log.flush()
            self._process = subprocess.Popen(
                command,
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=subprocess.STDOUT,
                cwd=self.base_dir,
                start_new_session=True,  # a Ctrl-C in the terminal is pytest's, not the server's
            )
        deadline = time.monotonic() + self.start_timeout
        while True:
            if self._process.poll() is not None:
                code = self._process.returncode
                self._process = None
                raise ZooKeeperUnavailable(
                    f"ZooKeeper exited with status {code} while starting on port {self.port}; "
                    f"its log ({self.log_path}) ends with:\n{self._log_tail()}"
                )
            try:
                if self.four_letter("ruok", timeout=1.0) == "imok":
                    return
            except OSError:
                pass
            if time.monotonic() > deadline:
                self.kill()
                raise ZooKeeperUnavailable(
                    f"ZooKeeper did not answer on port {self.port} within "
                    f"{self.start_timeout} s; its log ({self.log_path}) ends with:\n"
                    f"{self._log_tail()}"
                )
            time.sleep(0.05)

    def stop(self, grace: float = 10.0) -> None:
        """Stop the server (SIGTERM, then SIGKILL after ``grace`` seconds); idempotent."""
        self._signal_and_wait(signal.SIGTERM, grace)

    def kill(self) -> None:
        """Kill the server with SIGKILL, as a crash would (data written so far survives)."""
        self._signal_and_wait(signal.SIGKILL, 10.0)

    def restart(self) -> None:
        """Stop and start again on the same port with the same data."""
        self.stop()
        self.start()

    def _signal_and_wait(self, sig: signal.Signals, grace: float) -> None:
        process, self._process = self._process, None
        if process is None or process.poll() is not None:
            return
        process.send_signal(sig)
        try:
            process.wait(grace)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()

    def four_letter(self, word: str, *, timeout: float = 5.0) -> str:
        """Send one four-letter command (``ruok``, ``srvr``, ``cons``, ``dump`` ...)."""
        with socket.create_connection(("127.0.0.1", self.port or 0), timeout=timeout) as sock:
            sock.sendall(word.encode())
            chunks = []
            while chunk := sock.recv(65536):
                chunks.append(chunk)
        return b"".join(chunks).decode(errors="replace")

    def _log_tail(self, lines: int = 30) -> str:
        try:
            text = self.log_path.read_text(errors="replace")
        except OSError:
            return "(no log)"
        return "\n".join(text.splitlines()[-lines:])

    def __enter__(self) -> ZooKeeperServer:
        self.start()
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.stop()


class TcpProxy:
    """A Trio TCP proxy from ``127.0.0.1:port`` to a target port, with faults on demand.

    Run it with :func:`open_tcp_proxy`. ``cut()`` closes every connection
    proxied so far; while ``blocked`` new connections are accepted and closed
    at once (a client sees the server as unreachable).
    """

    def __init__(self, target_port: int) -> None:
        """A proxy to ``127.0.0.1:target_port``; :func:`open_tcp_proxy` runs it."""
        self.target_port = target_port
        self.port = 0
        self.blocked = False
        self.connections_accepted = 0
        self._scopes: set[trio.CancelScope] = set()

    @property
    def hosts(self) -> str:
        """The connection string clients should use, ``127.0.0.1:PORT``."""
        return f"127.0.0.1:{self.port}"

    def url(self, chroot: str = "") -> str:
        """A ``zk://`` URL through the proxy, with an optional chroot."""
        return f"zk://{self.hosts}{chroot}"

    def cut(self) -> None:
        """Drop every connection proxied so far (new ones are still let through)."""
        for scope in list(self._scopes):
            scope.cancel()

    def block(self) -> None:
        """Cut every connection and refuse new ones until :meth:`unblock`."""
        self.blocked = True
        self.cut()

    def unblock(self) -> None:
        """Let new connections through again."""
        self.blocked = False

    async def _handle(self, client: trio.SocketStream) -> None:
        self.connections_accepted += 1
        async with client:
            if self.blocked:
                return
            try:
                upstream = await trio.open_tcp_stream("127.0.0.1", self.target_port)
            except OSError:
                return
            async with upstream:
                with trio.CancelScope() as scope:
                    self._scopes.add(scope)
                    try:
                        async with trio.open_nursery() as nursery:
                            nursery.start_soon(self._pump, client, upstream, scope)
                            nursery.start_soon(self._pump, upstream, client, scope)
                    finally:
                        self._scopes.discard(scope)

    @staticmethod
    async def _pump(
        src: trio.SocketStream, dst: trio.SocketStream, scope: trio.CancelScope
    ) -> None:
        try:
            while data := await src.receive_some(65536):
                await dst.send_all(data)
        except (trio.BrokenResourceError, trio.ClosedResourceError):
            pass
        scope.cancel()  # one direction ended: end the connection


@contextlib.asynccontextmanager
async def open_tcp_proxy(target_port: int) -> AsyncIterator[TcpProxy]:
    """Run a :class:`TcpProxy` to ``127.0.0.1:target_port`` for the duration of the block."""
    proxy = TcpProxy(target_port)
    async with trio.open_nursery() as nursery:
        listeners = await nursery.start(
            functools.partial(trio.serve_tcp, proxy._handle, 0, host="127.0.0.1")
        )
        proxy.port = listeners[0].socket.getsockname()[1]
        try:
            yield proxy
        finally:
            nursery.cancel_scope.cancel()
