"""TLS on a socket for Trio, with OpenSSL doing the I/O: a faster ``trio.SSLStream``.

Its one job is a TLS :class:`trio.abc.Stream`. ``trio.SSLStream`` runs the
record layer through memory BIOs, with Python code around every read and
write: tens of microseconds per small frame, which doubled what a heartbeat
costs the broker. :class:`TLSSocketStream` wraps the connected socket itself
in a non-blocking ``ssl.SSLSocket`` and waits for readiness with Trio
(``wait_readable``/``wait_writable``), so a receive or a send is one C call
when the socket is ready. One task may receive while another sends (each
waits on its own direction); a read that OpenSSL needs during a send (a TLS
1.3 key update) is waited for by polling, never by a second reader. Errors
of TLS or of the socket are ``trio.BrokenResourceError``, as with any stream.
"""

from __future__ import annotations

import socket as stdlib_socket
import ssl
from typing import Any

import trio

__all__ = ["TLSSocketStream", "wrap_tls"]

_RECEIVE_SIZE = 256 * 1024
_WANT_READ_POLL = 0.001


class TLSSocketStream(trio.abc.Stream):
    """A TLS stream on a non-blocking ``ssl.SSLSocket`` (see the module docstring)."""

    def __init__(self, sock: ssl.SSLSocket) -> None:
        self.socket = sock
        """The SSL socket (``getpeername``, ``getpeercert``)."""
        self._closed = False
        self._receiving = False
        self._sending = False

    def getpeercert(self) -> dict[str, Any] | None:
        """The peer's certificate, as ``ssl.SSLSocket.getpeercert`` returns it."""
        return self.socket.getpeercert()

    async def do_handshake(self) -> None:
        """Run the TLS handshake (BrokenResourceError if it fails)."""
        while True:
            self._check_open()
            try:
                self.socket.do_handshake()
                break
            except ssl.SSLWantReadError:
                await trio.lowlevel.wait_readable(self.socket)
            except ssl.SSLWantWriteError:
                await trio.lowlevel.wait_writable(self.socket)
            except (ssl.SSLError, OSError) as exc:
                raise trio.BrokenResourceError(f"TLS handshake failed: {exc}") from exc
        await trio.lowlevel.checkpoint()

    async def receive_some(self, max_bytes: int | None = None) -> bytes:
        """Up to ``max_bytes`` decrypted bytes; b"" once the peer closed."""
        if self._receiving:
            raise trio.BusyResourceError("another task is receiving on this stream")
        self._receiving = True
        try:
            await trio.lowlevel.checkpoint_if_cancelled()
            size = max_bytes or _RECEIVE_SIZE
            while True:
                self._check_open()
                try:
                    data = self.socket.recv(size)
                except ssl.SSLWantReadError:
                    await trio.lowlevel.wait_readable(self.socket)
                    continue
                except ssl.SSLWantWriteError:
                    await trio.lowlevel.wait_writable(self.socket)
                    continue
                except (ssl.SSLZeroReturnError, ssl.SSLEOFError):
                    data = b""
                except (ssl.SSLError, OSError) as exc:
                    raise trio.BrokenResourceError(f"TLS receive failed: {exc}") from exc
                await trio.lowlevel.cancel_shielded_checkpoint()
                return data
        finally:
            self._receiving = False

    async def send_all(self, data: bytes | bytearray | memoryview) -> None:
        """Send all of ``data`` (encrypted)."""
        if self._sending:
            raise trio.BusyResourceError("another task is sending on this stream")
        self._sending = True
        try:
            await trio.lowlevel.checkpoint_if_cancelled()
            view = memoryview(data)
            while view:
                self._check_open()
                try:
                    sent = self.socket.send(view)
                except ssl.SSLWantWriteError:
                    await trio.lowlevel.wait_writable(self.socket)
                    continue
                except ssl.SSLWantReadError:
                    await trio.sleep(_WANT_READ_POLL)  # (the receiving task reads for us)
                    continue
                except (ssl.SSLError, OSError) as exc:
                    raise trio.BrokenResourceError(f"TLS send failed: {exc}") from exc
                view = view[sent:]
            await trio.lowlevel.cancel_shielded_checkpoint()
        finally:
            self._sending = False

    async def wait_send_all_might_not_block(self) -> None:
        """Wait until the socket takes more data."""
        self._check_open()
        await trio.lowlevel.wait_writable(self.socket)

    async def aclose(self) -> None:
        """Close the socket (no TLS close_notify: the peer sees the connection end)."""
        if not self._closed:
            self._closed = True
            trio.lowlevel.notify_closing(self.socket)
            self.socket.close()
        await trio.lowlevel.checkpoint()

    def _check_open(self) -> None:
        if self._closed:
            raise trio.ClosedResourceError("the TLS stream is closed")


def wrap_tls(
    stream: trio.SocketStream,
    context: ssl.SSLContext,
    *,
    server_side: bool,
    server_hostname: str | None = None,
) -> TLSSocketStream:
    """Take the socket out of ``stream`` and wrap it in TLS (the handshake is still to do).

    ``stream`` must not be used afterwards (closing it is harmless).
    """
    trio_socket = stream.socket
    family, kind, proto = trio_socket.family, trio_socket.type, trio_socket.proto
    fd = trio_socket.detach()
    raw = stdlib_socket.socket(family, kind, proto, fileno=fd)
    raw.setblocking(False)
    sock = context.wrap_socket(
        raw,
        server_side=server_side,
        server_hostname=server_hostname,
        do_handshake_on_connect=False,
        suppress_ragged_eofs=True,
    )
    return TLSSocketStream(sock)
