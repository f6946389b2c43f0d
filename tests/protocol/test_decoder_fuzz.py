"""The frame decoder against hostile bytes: a message, or the project's own decode error.

Both sides of every connection decode what the other sends with one
:class:`~trio_coord.protocol.framing.FrameCodec`, so a broker must survive
any client and a client any broker. Whatever the bytes (random; a valid
frame of every message type with bytes flipped, cut or inserted; arrays
nested far deeper than any message; strings that are not UTF-8; counts that
claim more elements than there are bytes), ``decode`` returns a frame or
raises :class:`CorruptMessageError` / :class:`UnsupportedMessageError`:
nothing else may ever leave it, because anything else would escape the
connection's reader task.
"""

from __future__ import annotations

import msgspec
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from test_messages import REQUEST_SAMPLES, RESPONSE_SAMPLES

from trio_coord.protocol.errors import CorruptMessageError, ErrorCode, UnsupportedMessageError
from trio_coord.protocol.framing import HEADER_SIZE, FrameCodec
from trio_coord.protocol.messages import Frame, Goodbye, Request, Response

CODEC = FrameCodec()
VALID = [
    *(CODEC.encode(Request(7, body))[HEADER_SIZE:] for body in REQUEST_SAMPLES),
    *(
        CODEC.encode(Response(7, ErrorCode.NONE, "", body))[HEADER_SIZE:]
        for body in RESPONSE_SAMPLES
    ),
    CODEC.encode(Goodbye(ErrorCode.CORRUPT_MESSAGE, "bye"))[HEADER_SIZE:],
]
FUZZ = settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])


def decodes_or_refuses(body: bytes) -> Frame | None:
    """Decode ``body``; None if it was refused with the project's own error."""
    try:
        frame = CODEC.decode(body)
    except (CorruptMessageError, UnsupportedMessageError):
        return None
    assert isinstance(frame, Request | Response | Goodbye)
    return frame


@FUZZ
@given(st.binary(max_size=512))
def test_random_bytes(body: bytes) -> None:
    decodes_or_refuses(body)


@st.composite
def mutated(draw: st.DrawFn) -> bytes:
    """A valid frame of some message type, with a few bytes flipped, cut or inserted."""
    body = bytearray(draw(st.sampled_from(VALID)))
    for _ in range(draw(st.integers(1, 4))):
        where = draw(st.integers(0, len(body)))
        match draw(st.sampled_from(["flip", "set", "cut", "insert"])):
            case "flip" if where < len(body):
                body[where] ^= 1 << draw(st.integers(0, 7))
            case "set" if where < len(body):
                body[where] = draw(st.sampled_from([0xC1, 0xDC, 0xDD, 0xDE, 0xDF, 0xFF, 0x91]))
            case "cut":
                del body[where:]
            case _:
                body[where:where] = draw(st.binary(min_size=1, max_size=8))
    return bytes(body)


@FUZZ
@given(mutated())
def test_mutated_valid_frames_of_every_type(body: bytes) -> None:
    decodes_or_refuses(body)


@pytest.mark.parametrize("depth", [64, 1_000, 100_000])
@pytest.mark.parametrize("container", [b"\x91", b"\x81\xa1k"], ids=["array", "map"])
def test_nesting_deeper_than_any_message_is_refused(depth: int, container: bytes) -> None:
    nested = container * depth + b"\xc0"
    for body in VALID:
        # As a trailing element of the frame (msgspec skips unknown trailing fields, and
        # skipping recurses), and in place of the whole frame.
        assert body[0] & 0xF0 == 0x90, "frames are fixarrays"
        longer = bytes([body[0] + 1]) + body[1:] + nested
        if decodes_or_refuses(longer) is not None:
            assert depth < 1_000  # a shallow trailing field is an unknown field, skipped
    assert decodes_or_refuses(nested) is None


def test_a_string_that_is_not_utf8_is_refused_wherever_it_is() -> None:
    refused = 0
    for body in VALID:
        # Every fixstr of the frame, in turn, made invalid UTF-8 (its first byte 0xFF).
        for i, byte in enumerate(body):
            if 0xA1 <= byte <= 0xBF and i + 1 < len(body):
                broken = body[: i + 1] + b"\xff" + body[i + 2 :]
                refused += decodes_or_refuses(broken) is None
    assert refused > len(VALID)


@pytest.mark.parametrize(
    "prefix",
    [b"\xdd", b"\xdf", b"\xdb", b"\xc6", b"\xdc"],
    ids=["array32", "map32", "str32", "bin32", "array16"],
)
def test_counts_that_claim_more_than_the_frame_holds_are_refused(prefix: bytes) -> None:
    huge = prefix + b"\xff\xff\xff\xff"[: 2 if prefix == b"\xdc" else 4]
    assert decodes_or_refuses(huge) is None
    for body in VALID:
        # Cut anywhere and end with a container claiming billions of elements (inside a
        # binary payload the bytes are payload; anywhere else the count must be refused
        # before anything is allocated for it).
        for i in range(1, len(body)):
            decodes_or_refuses(body[:i] + huge)
        assert decodes_or_refuses(bytes([body[0] + 1]) + body[1:] + huge) is None


@FUZZ
@given(
    st.recursive(
        st.none() | st.integers(-(2**63), 2**64 - 1) | st.text() | st.binary(),
        st.lists,
        max_leaves=40,
    )
)
def test_any_msgpack_value_as_a_request_body(value: object) -> None:
    decodes_or_refuses(msgspec.msgpack.encode([1, 1, value]))
    decodes_or_refuses(msgspec.msgpack.encode([1, 1, [4, value, value, value]]))
