"""Length-prefixed framing and the msgpack codec for :data:`~.messages.Frame`.

A frame is a 4-byte big-endian unsigned length followed by that many bytes of
msgpack. The length is checked against the connection's maximum frame size
*before* any buffer is grown for the body, so a peer cannot make us allocate
what it claims; a short read at end of stream is a truncated frame. One
:class:`FrameCodec` per connection reuses one msgspec ``Encoder`` and one
typed ``Decoder``; encoding writes the prefix and the body into one reused
buffer, so sending a heartbeat allocates only the bytes object handed to the
socket, and a large frame (a fetch answer of megabytes) is that buffer itself,
handed over rather than copied (the codec starts a new one). A codec holds
nothing between calls, so connections may share one (a broker's do). Between
frames, a :class:`FrameReader` on a TCP stream waits for the socket to
become readable before it asks for bytes: an idle
connection then suspends a short chain of coroutines, not the stream's whole
receive path (a broker holds thousands of idle connections), and no receive
is tried in vain first.
"""

from __future__ import annotations

import msgspec
import trio

from .budget import ByteBudget
from .errors import CorruptMessageError, FrameTooLargeError, UnsupportedMessageError
from .messages import DEFAULT_FRAME, Frame

__all__ = [
    "DEFAULT_MAX_FRAME_SIZE",
    "HEADER_SIZE",
    "SMALL_FRAME",
    "FrameCodec",
    "FrameReader",
    "TruncatedFrameError",
]

HEADER_SIZE = 4
DEFAULT_MAX_FRAME_SIZE = DEFAULT_FRAME
"""The largest frame a connection reads unless it is told otherwise (1 MiB)."""
SMALL_FRAME = 4096
"""Frames up to this size do not wait for a shared byte budget (heartbeats stay live)."""
_RECEIVE_CHUNK = 64 * 1024
_HAND_OVER = 64 * 1024
"""An encoded frame larger than this is returned as the codec's buffer, not a copy of it:
copying a 4 MiB fetch answer into a new bytes object cost the broker about 1.8 ms (its
fresh pages faulted in), where encoding it took 0.1 ms."""


class TruncatedFrameError(CorruptMessageError):
    """The stream ended in the middle of a frame."""


class FrameCodec:
    """Encodes frames with their length prefix and decodes frame bodies."""

    def __init__(self, max_frame_size: int = DEFAULT_MAX_FRAME_SIZE) -> None:
        self.max_frame_size = max_frame_size
        self._encoder = msgspec.msgpack.Encoder()
        self._decoder = msgspec.msgpack.Decoder(Frame)
        self._buffer = bytearray()

    def encode(self, frame: Frame) -> bytes | bytearray:
        """Return ``frame`` as wire bytes, prefix included: a bytes object, or for a frame
        over 64 KiB a bytearray the caller then owns.

        Raises :class:`FrameTooLargeError` if the body exceeds the maximum
        frame size (the peer would refuse it anyway).
        """
        buf = self._buffer
        self._encoder.encode_into(frame, buf, HEADER_SIZE)
        size = len(buf) - HEADER_SIZE
        if size > self.max_frame_size:
            raise FrameTooLargeError(
                f"frame of {size} bytes exceeds the maximum frame size of "
                f"{self.max_frame_size} bytes; send smaller batches"
            )
        buf[:HEADER_SIZE] = size.to_bytes(HEADER_SIZE, "big")
        if len(buf) > _HAND_OVER:
            self._buffer = bytearray()
            return buf
        return bytes(buf)

    def decode(self, body: bytes | bytearray | memoryview) -> Frame:
        """Decode one frame body (without its prefix).

        Raises :class:`UnsupportedMessageError` for a well-formed frame whose
        message type (tag) this version does not know, and
        :class:`CorruptMessageError` for anything else that fails to decode:
        no other exception ever leaves it, whatever the bytes.
        """
        try:
            return self._decoder.decode(body)
        except msgspec.ValidationError as exc:
            if _is_unknown_tag(exc):
                raise UnsupportedMessageError(f"unknown message type: {exc}") from None
            raise CorruptMessageError(f"invalid message: {exc}") from None
        except msgspec.DecodeError as exc:
            raise CorruptMessageError(f"undecodable frame: {exc}") from None
        except Exception as exc:
            # The body is the peer's bytes: whatever decoding them raises is the peer's
            # mistake, never ours. msgspec raises RecursionError for nesting too deep to
            # skip (an unknown trailing field nested 1,000 deep), UnicodeDecodeError for
            # a string that is not UTF-8, and may raise others (OverflowError, ...).
            raise CorruptMessageError(
                f"undecodable frame: {type(exc).__name__}: {str(exc)[:200]}"
            ) from None


def _is_unknown_tag(exc: msgspec.ValidationError) -> bool:
    # msgspec reports an unknown union tag as "Invalid value N - at `$[...][0]`".
    text = str(exc)
    return text.startswith("Invalid value") and text.rstrip("`").endswith("[0]")


class FrameReader:
    """Reads whole frames from a Trio receive stream.

    ``await reader.read_frame()`` returns the body bytes of the next frame, or
    None at a clean end of stream (between frames). It raises
    :class:`FrameTooLargeError` for a length over the limit (before reading
    the body) and :class:`TruncatedFrameError` when the stream ends mid-frame.
    With a ``budget`` (a broker's shared :class:`~.budget.ByteBudget`), a
    frame larger than :data:`SMALL_FRAME` takes its size from it once its
    header is read, before its body is buffered, waiting while it is spent.
    """

    def __init__(
        self,
        stream: trio.abc.ReceiveStream,
        max_frame_size: int,
        budget: ByteBudget | None = None,
    ) -> None:
        self._stream = stream
        self._max = max_frame_size
        self._socket = stream.socket if isinstance(stream, trio.SocketStream) else None
        self._buf = bytearray()
        self._budget = budget
        self.taken = 0
        """Bytes of ``budget`` taken for the frame last read (or being read); the caller
        gives them back (or takes them over) once it is done with the frame."""
        self.started: float | None = None
        """When the first byte of the frame being received arrived (None between frames):
        how a broker finds a peer that sends a frame too slowly (slowloris)."""

    @property
    def max_frame_size(self) -> int:
        """The largest frame body this reader accepts."""
        return self._max

    @property
    def between_frames(self) -> bool:
        """True when nothing of a frame is buffered or charged (the reader is idle)."""
        return not self._buf and not self.taken

    def feed(self, data: bytes | memoryview, now: float) -> None:
        """Buffer bytes received for this reader elsewhere (a parked connection's)."""
        if not self._buf:
            self.started = now
        self._buf += data

    async def _fill(self, needed: int) -> bool:
        """Receive until the buffer holds ``needed`` bytes; False at end of stream."""
        while len(self._buf) < needed:
            if not self._buf and self._socket is not None and self._socket.fileno() >= 0:
                # Idle between frames: wait here, where the chain of suspended
                # coroutines is short (see the module docstring). (A socket closed
                # already is left to receive_some: it raises ClosedResourceError.)
                await trio.lowlevel.wait_readable(self._socket)
            chunk = await self._stream.receive_some(max(_RECEIVE_CHUNK, needed - len(self._buf)))
            if not chunk:
                return False
            if not self._buf:
                self.started = trio.current_time()
            self._buf += chunk
        return True

    async def read_frame(self) -> bytes | None:
        """Return the next frame's body, or None at a clean end of stream."""
        if not await self._fill(HEADER_SIZE):
            if self._buf:
                raise TruncatedFrameError(
                    f"stream ended inside a frame header ({len(self._buf)} of 4 bytes)"
                )
            return None
        size = int.from_bytes(self._buf[:HEADER_SIZE], "big")
        if size > self._max:
            raise FrameTooLargeError(
                f"frame of {size} bytes exceeds the maximum frame size of {self._max} bytes"
            )
        total = HEADER_SIZE + size
        if self._budget is not None and size > SMALL_FRAME and not self.taken:
            # Before buffering the body: a peer's announced size is what it may cost.
            self.taken = await self._budget.take(size)
        if not await self._fill(total):
            raise TruncatedFrameError(
                f"stream ended inside a frame ({len(self._buf) - HEADER_SIZE} of {size} bytes)"
            )
        body = bytes(self._buf[HEADER_SIZE:total])
        del self._buf[:total]
        self.started = trio.current_time() if self._buf else None
        return body
