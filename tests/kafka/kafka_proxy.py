"""A TCP proxy that loses the answer to a client's first Produce request.

It forwards bytes both ways between a Kafka client and the broker, and
watches the requests go by: when the answer to the first Produce arrives,
it is dropped and both sockets are closed, so the client sees a lost
connection after the broker stored the batch, and retries it. That is the
retry an idempotent producer must not turn into a duplicate. Metadata
answers are rewritten (with kio) to name the proxy as the broker, so that
the client keeps talking through it.
"""

from __future__ import annotations

import dataclasses
import socket
import struct
import threading

from kio.serial import entity_reader

from trio_coord.kafka.codec import encode_response, response_schema

PRODUCE = 0
METADATA = 3


class LosingProxy:
    """Listens on 127.0.0.1 (a free port); every connection goes to ``target``."""

    def __init__(self, target: str) -> None:
        host, port = target.rsplit(":", 1)
        self._target = (host, int(port))
        self._server = socket.create_server(("127.0.0.1", 0))
        self.address = f"127.0.0.1:{self._server.getsockname()[1]}"
        self.dropped = 0
        self._lock = threading.Lock()
        self._closed = False
        threading.Thread(target=self._accept, daemon=True).start()

    def close(self) -> None:
        """Stop accepting (open connections end with their peers)."""
        self._closed = True
        self._server.close()

    def _accept(self) -> None:
        while not self._closed:
            try:
                client, _ = self._server.accept()
            except OSError:
                return
            upstream = socket.create_connection(self._target)
            produce_ids: dict[int, tuple[int, int]] = {}
            threading.Thread(
                target=self._requests, args=(client, upstream, produce_ids), daemon=True
            ).start()
            threading.Thread(
                target=self._responses, args=(upstream, client, produce_ids), daemon=True
            ).start()

    def _requests(
        self, src: socket.socket, dst: socket.socket, ids: dict[int, tuple[int, int]]
    ) -> None:
        try:
            while True:
                frame = _read_frame(src)
                if frame is None:
                    break
                key, version, corr = struct.unpack_from(">hhi", frame, 4)
                ids[corr] = (key, version)
                dst.sendall(frame)
        except OSError:
            pass
        _close(src, dst)

    def _responses(
        self, src: socket.socket, dst: socket.socket, ids: dict[int, tuple[int, int]]
    ) -> None:
        try:
            while True:
                frame = _read_frame(src)
                if frame is None:
                    break
                (corr,) = struct.unpack_from(">i", frame, 4)
                key, version = ids.pop(corr, (-1, -1))
                if key == METADATA:
                    frame = self._rewrite_metadata(frame, version, corr)
                with self._lock:
                    lose = key == PRODUCE and self.dropped == 0
                    if lose:
                        self.dropped += 1
                if lose:
                    break  # the broker stored the batch; the client never hears of it
                dst.sendall(frame)
        except OSError:
            pass
        _close(src, dst)

    def _rewrite_metadata(self, frame: bytes, version: int, corr: int) -> bytes:
        schema = response_schema(METADATA, version)
        _, used = entity_reader(schema.__header_schema__)(frame, 4)
        response, _ = entity_reader(schema)(frame, 4 + used)
        host, port = self.address.rsplit(":", 1)
        brokers = tuple(dataclasses.replace(b, host=host, port=int(port)) for b in response.brokers)
        return encode_response(corr, dataclasses.replace(response, brokers=brokers))


def _read_frame(sock: socket.socket) -> bytes | None:
    head = _read(sock, 4)
    if head is None:
        return None
    (size,) = struct.unpack(">i", head)
    body = _read(sock, size)
    return None if body is None else head + body


def _read(sock: socket.socket, size: int) -> bytes | None:
    data = bytearray()
    while len(data) < size:
        chunk = sock.recv(size - len(data))
        if not chunk:
            return None
        data += chunk
    return bytes(data)


def _close(*socks: socket.socket) -> None:
    for sock in socks:
        try:
            sock.shutdown(socket.SHUT_RDWR)
        except OSError:
            pass
        sock.close()
