"""Reading what a broker sends on a raw socket, for tests that speak the protocol by hand."""

from __future__ import annotations

import trio

from trio_coord.protocol.framing import FrameCodec
from trio_coord.protocol.messages import Goodbye

_CODEC = FrameCodec()


async def read_until_closed(stream: trio.SocketStream, timeout: float) -> list[object]:
    """Every frame (decoded) the broker sends on ``stream`` until it closes it."""
    data = b""
    with trio.fail_after(timeout):
        try:
            while chunk := await stream.receive_some():
                data += chunk
        except trio.BrokenResourceError:
            pass
    frames = []
    while len(data) >= 4:
        size = int.from_bytes(data[:4], "big")
        frames.append(_CODEC.decode(data[4 : 4 + size]))
        data = data[4 + size :]
    return frames


async def read_goodbye(stream: trio.SocketStream, timeout: float) -> Goodbye | None:
    """The Goodbye the broker sent before closing ``stream``, or None if it just closed."""
    frames = await read_until_closed(stream, timeout)
    if not frames:
        return None
    assert isinstance(frames[0], Goodbye), frames
    return frames[0]
