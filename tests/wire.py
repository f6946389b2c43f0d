"""Reading what a broker sends on a raw socket, for tests that speak the protocol by hand."""

from __future__ import annotations

import trio

from trio_coord.protocol.framing import FrameCodec
from trio_coord.protocol.messages import Goodbye

_CODEC = FrameCodec()


async def read_goodbye(stream: trio.SocketStream, timeout: float) -> Goodbye | None:
    """The Goodbye the broker sent before closing ``stream``, or None if it just closed."""
    data = b""
    with trio.fail_after(timeout):
        try:
            while chunk := await stream.receive_some():
                data += chunk
        except trio.BrokenResourceError:
            pass
    if len(data) < 4:
        return None
    frame = _CODEC.decode(data[4 : 4 + int.from_bytes(data[:4], "big")])
    assert isinstance(frame, Goodbye)
    return frame
