"""The wire protocol: messages, error codes, framing and the multiplexed connection.

This is the bottom layer: of trio_coord it imports only the leaf helper
``_aio``. Brokers, clients and the Spark reader all speak through it.
"""

from .connection import Connection, RequestHandler, open_connection
from .errors import CoordError, ErrorCode, error_for
from .framing import DEFAULT_MAX_FRAME_SIZE, FrameCodec, FrameReader
from .messages import *  # noqa: F403  (the message catalogue is the public API)
from .messages import __all__ as _messages_all

__all__ = [
    "DEFAULT_MAX_FRAME_SIZE",
    "Connection",
    "CoordError",
    "ErrorCode",
    "FrameCodec",
    "FrameReader",
    "RequestHandler",
    "error_for",
    "open_connection",
    *_messages_all,
]
