"""The message catalogue: round trips, tags, struct shape, compatibility and error codes."""

from __future__ import annotations

import inspect
import typing

import msgspec
import pytest

from trio_coord.protocol import errors, framing, messages
from trio_coord.protocol.errors import CoordError, ErrorCode, error_for
from trio_coord.protocol.framing import HEADER_SIZE, FrameCodec
from trio_coord.protocol.messages import (
    AddPartitionsRequest,
    AddPartitionsResponse,
    BrokerInfo,
    CreateGroupRequest,
    CreateGroupResponse,
    CreateTopicRequest,
    CreateTopicResponse,
    DeleteGroupRequest,
    DeleteGroupResponse,
    DeleteOffsetsRequest,
    DeleteOffsetsResponse,
    DeleteTopicRequest,
    DeleteTopicResponse,
    DescribeGroupRequest,
    DescribeGroupResponse,
    FetchedBatch,
    FetchedPartition,
    FetchPartition,
    FetchRequest,
    FetchResponse,
    Goodbye,
    GroupDescription,
    GroupSummary,
    HeartbeatRequest,
    HeartbeatResponse,
    JoinGroupRequest,
    JoinGroupResponse,
    LeaveGroupRequest,
    LeaveGroupResponse,
    ListedOffset,
    ListGroupsRequest,
    ListGroupsResponse,
    ListOffsetsRequest,
    ListOffsetsResponse,
    MemberCursor,
    MemberDescription,
    MetadataRequest,
    MetadataResponse,
    OffsetCommitRequest,
    OffsetCommitResponse,
    OffsetFetchRequest,
    OffsetFetchResponse,
    PartitionOffset,
    ProduceRequest,
    ProduceResponse,
    Request,
    ResetOffsetsRequest,
    ResetOffsetsResponse,
    Response,
    StartFetchersRequest,
    StartFetchersResponse,
    StopFetchersRequest,
    StopFetchersResponse,
    TopicInfo,
    TopicPartition,
)

BROKER = BrokerInfo(7, "10.0.0.7", 9093, 9092, rack="eu-west-1a")
OFFSET = PartitionOffset("orders", 3, 1234, "checkpoint-9")
TOPIC = TopicInfo(
    "orders", 12, leaders=[7] * 12, topic_id="9f" * 16, configs={"retention.ms": "604800000"}
)
MEMBER = MemberDescription(
    "m-1",
    "client-a",
    "host-a",
    ["orders", "payments"],
    15_000,
    45_000,
    [TopicPartition("orders", 3)],
    instance_id="host-a-worker",
    rebalance_protocol="cooperative",
    generation=4,
    owned=[TopicPartition("orders", 3), TopicPartition("orders", 4)],
    owned_more=2,
    member_epoch=5,
)

# One instance of every body type, every defaulted field set to a non-default value.
REQUEST_SAMPLES: list[messages.RequestBody] = [
    MetadataRequest(["orders", "payments"], group="billing", after="orders", configs=True),
    CreateTopicRequest("orders", 12),
    AddPartitionsRequest("orders", 24),
    JoinGroupRequest(
        "billing",
        "m-1",
        ["orders"],
        15_000,
        45_000,
        ["range", "roundrobin"],
        auto_commit=False,
        offset_reset="earliest",
        client_id="client-a",
        rebalance_protocol="cooperative",
        instance_id="host-7",
        user_data=b"rack-1",
        client_assignors=["my-assignor"],
        rack="eu-west-1b",
        owned=[TopicPartition("orders", 3)],
        max_frame_size=4 << 20,
    ),
    HeartbeatRequest("billing", "m-1", 4, positions=[OFFSET]),
    LeaveGroupRequest("billing", "m-1", positions=[OFFSET], reason="shutting down", stay=True),
    OffsetCommitRequest("billing", "m-1", 4, [OFFSET], allow_regression=True),
    OffsetFetchRequest(
        "billing", partitions=[TopicPartition("orders", 3)], after=TopicPartition("orders", 1)
    ),
    ListGroupsRequest(after="audit"),
    DescribeGroupRequest(
        "billing",
        offsets_after=TopicPartition("orders", 2),
        members_after=MemberCursor("m-1", TopicPartition("orders", 1)),
    ),
    CreateGroupRequest("billing"),
    DeleteGroupRequest("billing"),
    DeleteTopicRequest("orders"),
    ProduceRequest("orders", 3, b"\x00\x91\x94\x01\xc0\xc4\x01x\x90", 1, 1),
    FetchRequest(
        [FetchPartition("orders", 3, 1234, max_bytes=4096)],
        max_wait_ms=100,
        min_bytes=1024,
        max_bytes=65536,
    ),
    ListOffsetsRequest([TopicPartition("orders", 3)], timestamp_ms=1_700_000_000_000),
    ResetOffsetsRequest("billing", [OFFSET]),
    DeleteOffsetsRequest("billing", [TopicPartition("orders", 3)]),
    StopFetchersRequest("billing", "m-1", 4, partitions=[TopicPartition("orders", 3)]),
    StartFetchersRequest(
        "billing",
        "m-1",
        5,
        [OFFSET],
        brokers=[BROKER],
        incremental=True,
        more=True,
        unchanged=True,
        leaders=[7],
    ),
    messages.ComputeAssignmentRequest(
        "billing",
        "m-1",
        5,
        "my-assignor",
        [messages.MemberSubscription("m-1", ["orders"], [TopicPartition("orders", 3)], b"\x01")],
        {"orders": 12},
    ),
    messages.SaslHandshakeRequest("SCRAM-SHA-256"),
    messages.SaslAuthenticateRequest(b"n,,n=alice,r=abc"),
    messages.SecurityAdminRequest("add-user", "alice", b'[{"m":1}]', b'{"a":1}'),
]

RESPONSE_SAMPLES: list[messages.ResponseBody] = [
    MetadataResponse([BROKER], [TOPIC], coordinator=BROKER, next="orders"),
    CreateTopicResponse(TOPIC),
    AddPartitionsResponse(
        TopicInfo("orders", 24, leaders=[7] * 24, topic_id="9f" * 16, configs={"a": "b"})
    ),
    JoinGroupResponse("m-1", 5, 15_000, rejoin=True, max_frame_size=8 << 20),
    HeartbeatResponse(),
    LeaveGroupResponse(),
    OffsetCommitResponse(),
    OffsetFetchResponse([OFFSET], next=TopicPartition("orders", 3)),
    ListGroupsResponse([GroupSummary("billing", "STABLE", 5, 2)], next="billing"),
    DescribeGroupResponse(
        GroupDescription("billing", "STABLE", 5, "range", [MEMBER], [OFFSET]),
        offsets_next=TopicPartition("orders", 3),
        members_next=MemberCursor("m-1", TopicPartition("orders", 0)),
    ),
    CreateGroupResponse(),
    DeleteGroupResponse(),
    DeleteTopicResponse(),
    ProduceResponse(1234),
    FetchResponse(
        [FetchedPartition("orders", 3, 0, "", 0, 1235, batches=[FetchedBatch(1234, 1, b"\x00")])]
    ),
    ListOffsetsResponse([ListedOffset("orders", 3, 1234, 0, 1235)]),
    ResetOffsetsResponse(),
    DeleteOffsetsResponse(),
    StopFetchersResponse(positions=[OFFSET]),
    StartFetchersResponse(),
    messages.ComputeAssignmentResponse(
        [messages.MemberAssignment("m-1", [TopicPartition("orders", 3)])]
    ),
    messages.SaslHandshakeResponse(["SCRAM-SHA-256", "PLAIN"]),
    messages.SaslAuthenticateResponse(b"r=abcdef,s=c2FsdA==,i=4096"),
    messages.SecurityAdminResponse(b'{"alice":["SCRAM-SHA-256"]}', 1),
]


def _wire_structs() -> list[type[msgspec.Struct]]:
    return [
        obj
        for _, obj in inspect.getmembers(messages, inspect.isclass)
        if issubclass(obj, msgspec.Struct) and obj.__module__ == messages.__name__
    ]


def _default(field: msgspec.structs.FieldInfo) -> object:
    if field.default is not msgspec.NODEFAULT:
        return field.default
    assert field.default_factory is not msgspec.NODEFAULT
    return field.default_factory()


def _assert_non_default(obj: msgspec.Struct) -> None:
    """Every defaulted field of ``obj`` (recursively) holds something else than its default."""
    for field in msgspec.structs.fields(obj):
        value = getattr(obj, field.name)
        if not field.required:
            assert value != _default(field), f"{type(obj).__name__}.{field.name} is the default"
        if isinstance(value, msgspec.Struct):
            _assert_non_default(value)


def _tag(cls: type[msgspec.Struct]) -> object:
    return cls.__struct_config__.tag


def _decode_wire(codec: FrameCodec, wire: bytes) -> messages.Frame:
    assert int.from_bytes(wire[:HEADER_SIZE], "big") == len(wire) - HEADER_SIZE
    return codec.decode(wire[HEADER_SIZE:])


# -- round trips -------------------------------------------------------------------------------


def test_samples_cover_every_body_type() -> None:
    assert [type(s) for s in REQUEST_SAMPLES] == list(typing.get_args(messages.RequestBody))
    assert [type(s) for s in RESPONSE_SAMPLES] == list(typing.get_args(messages.ResponseBody))
    for sample in [*REQUEST_SAMPLES, *RESPONSE_SAMPLES]:
        _assert_non_default(sample)


@pytest.mark.parametrize("body", REQUEST_SAMPLES, ids=lambda b: type(b).__name__)
def test_request_round_trips(body: messages.RequestBody) -> None:
    codec = FrameCodec()
    frame = Request(2**40 + 17, body)
    decoded = _decode_wire(codec, codec.encode(frame))
    assert decoded == frame
    assert type(decoded) is Request
    assert type(decoded.body) is type(body)


@pytest.mark.parametrize("body", RESPONSE_SAMPLES, ids=lambda b: type(b).__name__)
def test_response_round_trips(body: messages.ResponseBody) -> None:
    codec = FrameCodec()
    frame = Response(99, ErrorCode.NONE, "all good", body)
    decoded = _decode_wire(codec, codec.encode(frame))
    assert decoded == frame
    assert type(decoded) is Response
    assert type(decoded.body) is type(body)


def test_error_response_and_goodbye_round_trip() -> None:
    codec = FrameCodec()
    error = Response(5, ErrorCode.ILLEGAL_GENERATION, "generation 3 is stale; rejoin", None)
    goodbye = Goodbye(ErrorCode.FRAME_TOO_LARGE, "frame of 9 bytes exceeds 8")
    assert _decode_wire(codec, codec.encode(error)) == error
    assert _decode_wire(codec, codec.encode(goodbye)) == goodbye


def test_one_codec_encodes_many_frames_of_different_sizes() -> None:
    # The codec reuses one buffer: a small frame after a large one must not carry leftovers.
    codec = FrameCodec()
    big = Request(1, StartFetchersRequest("g", "m", 1, [OFFSET] * 50))
    small = Request(2, ListGroupsRequest())
    big_wire = codec.encode(big)
    small_wire = codec.encode(small)
    assert len(small_wire) < len(big_wire)
    assert _decode_wire(codec, small_wire) == small
    assert _decode_wire(codec, big_wire) == big


# -- tags and struct shape -----------------------------------------------------------------------


@pytest.mark.parametrize("union", ["RequestBody", "ResponseBody", "Frame"])
def test_tags_are_unique_integers_per_union(union: str) -> None:
    members = typing.get_args(getattr(messages, union))
    tags = [_tag(cls) for cls in members]
    assert all(isinstance(t, int) for t in tags), tags
    assert len(set(tags)) == len(tags) == len(members)


def test_each_response_has_its_requests_tag() -> None:
    requests = {cls.__name__.removesuffix("Request"): _tag(cls) for cls in _request_types()}
    responses = {cls.__name__.removesuffix("Response"): _tag(cls) for cls in _response_types()}
    assert requests == responses


def _request_types() -> tuple[type[msgspec.Struct], ...]:
    return typing.get_args(messages.RequestBody)


def _response_types() -> tuple[type[msgspec.Struct], ...]:
    return typing.get_args(messages.ResponseBody)


def test_every_wire_struct_is_frozen_and_array_like() -> None:
    structs = _wire_structs()
    # The catalogue is large; make sure introspection found it rather than nothing.
    assert len(structs) >= 35
    for cls in structs:
        config = cls.__struct_config__
        assert config.frozen, f"{cls.__name__} is not frozen"
        assert config.array_like, f"{cls.__name__} is not array_like"


def test_frozen_struct_refuses_assignment() -> None:
    body = CreateTopicRequest("orders", 3)
    with pytest.raises(AttributeError):
        body.partitions = 4  # type: ignore[misc]


def test_wire_form_is_an_array_led_by_the_tag() -> None:
    encoded = msgspec.msgpack.encode(Request(3, CreateTopicRequest("orders", 12)))
    assert msgspec.msgpack.decode(encoded) == [1, 3, [2, "orders", 12]]


def test_topic_partition_is_a_two_array() -> None:
    tp = TopicPartition("orders", 3)
    assert msgspec.msgpack.decode(msgspec.msgpack.encode(tp)) == ["orders", 3]
    assert str(tp) == "orders-3"
    assert OFFSET.tp == tp


# -- compatibility: an older peer's shorter arrays -------------------------------------------------


def test_older_peers_join_without_trailing_fields_gets_defaults() -> None:
    # Written by hand as an older peer would: JoinGroupRequest without auto_commit,
    # offset_reset and client_id.
    raw = [1, 8, [4, "billing", "", ["orders"], 10_000, 30_000, ["range"]]]
    frame = FrameCodec().decode(msgspec.msgpack.encode(raw))
    assert frame == Request(
        8,
        JoinGroupRequest(
            "billing",
            "",
            ["orders"],
            10_000,
            30_000,
            ["range"],
            auto_commit=True,
            offset_reset="latest",
            client_id="",
        ),
    )


def test_older_peers_response_without_message_and_body_gets_defaults() -> None:
    frame = FrameCodec().decode(msgspec.msgpack.encode([2, 41, 0]))
    assert frame == Response(41, ErrorCode.NONE, "", None)


def test_older_peers_start_fetchers_without_brokers_gets_empty_list() -> None:
    raw = [1, 2, [21, "g", "m-1", 3, [["orders", 0, 17, ""]]]]
    frame = FrameCodec().decode(msgspec.msgpack.encode(raw))
    assert isinstance(frame, Request)
    assert frame.body == StartFetchersRequest("g", "m-1", 3, [PartitionOffset("orders", 0, 17)])
    assert frame.body.brokers == []


@pytest.mark.parametrize(
    "body", [*REQUEST_SAMPLES, *RESPONSE_SAMPLES], ids=lambda b: type(b).__name__
)
def test_every_body_decodes_without_its_trailing_defaulted_fields(body: msgspec.Struct) -> None:
    fields = msgspec.structs.fields(body)
    required = sum(1 for f in fields if f.required)
    # Defaulted fields come last, so the first ``required`` fields are what an old peer sent.
    assert all(f.required for f in fields[:required])
    array = msgspec.to_builtins(body, builtin_types=(bytes,))
    assert array[0] == _tag(type(body))
    short = array[: 1 + required]
    expected = msgspec.structs.replace(
        body, **{f.name: _default(f) for f in fields if not f.required}
    )
    if isinstance(body, _request_types()):
        frame = FrameCodec().decode(msgspec.msgpack.encode([1, 6, short]))
        assert frame == Request(6, expected)
    else:
        frame = FrameCodec().decode(msgspec.msgpack.encode([2, 6, 0, "", short]))
        assert frame == Response(6, ErrorCode.NONE, "", expected)


def test_unknown_error_code_from_a_newer_peer_decodes() -> None:
    # Codes are only ever appended: a newer peer may answer with a number this version
    # lacks. The frame must still decode (not close the connection as corrupt), and
    # error_for turns it into a plain CoordError with the peer's message.
    codec = FrameCodec()
    frame = codec.decode(msgspec.msgpack.encode([2, 12, 4242, "quota exceeded"]))
    assert isinstance(frame, Response)
    assert (frame.corr_id, frame.error, frame.body) == (12, 4242, None)
    err = error_for(frame.error, frame.message)
    assert type(err) is CoordError
    assert str(err) == "quota exceeded"
    goodbye = codec.decode(msgspec.msgpack.encode([3, 4242, "bye"]))
    assert goodbye == Goodbye(4242, "bye")


def test_shorter_than_required_is_corrupt() -> None:
    # Only *defaulted* fields may be missing; a missing required field is an error.
    with pytest.raises(errors.CorruptMessageError, match="length"):
        FrameCodec().decode(msgspec.msgpack.encode([1, 6, [2, "orders"]]))


# -- error codes -------------------------------------------------------------------------------


@pytest.mark.parametrize("code", [c for c in ErrorCode if c is not ErrorCode.NONE], ids=str)
def test_error_for_returns_the_registered_subclass(code: ErrorCode) -> None:
    err = error_for(code, f"broker says {code.name}")
    assert isinstance(err, CoordError)
    assert type(err) is not CoordError
    # The class that *declares* the code in errors.py, not a subclass that inherits it
    # (framing.TruncatedFrameError inherits CORRUPT_MESSAGE and must not take it over).
    assert type(err).__module__ == errors.__name__
    assert type(err).__dict__["code"] is code
    assert type(err).__name__ in errors.__all__
    assert err.code is code
    assert str(err) == err.message == f"broker says {code.name}"
    # The wire carries a plain int; that works the same.
    assert type(error_for(int(code), "x")) is type(err)


def test_error_subclasses_are_one_per_code() -> None:
    classes = {error_for(c).__class__ for c in ErrorCode if c is not ErrorCode.NONE}
    assert len(classes) == len(ErrorCode) - 1


def test_corrupt_message_code_maps_to_corrupt_message_error() -> None:
    err = error_for(ErrorCode.CORRUPT_MESSAGE, "invalid opcode")
    assert type(err) is errors.CorruptMessageError
    assert not isinstance(err, framing.TruncatedFrameError)


def test_error_for_without_message_uses_the_hint() -> None:
    err = error_for(ErrorCode.NOT_COORDINATOR)
    assert isinstance(err, errors.NotCoordinatorError)
    assert str(err) == errors.hint(ErrorCode.NOT_COORDINATOR)
    assert err.retriable


def test_error_for_unknown_code_is_a_plain_coord_error() -> None:
    err = error_for(9999, "something only a newer broker knows")
    assert type(err) is CoordError
    assert str(err) == "something only a newer broker knows"
    assert err.code == 9999
    bare = error_for(9999)
    assert type(bare) is CoordError
    assert "9999" in str(bare)


def test_error_for_none_code_is_not_a_registered_error() -> None:
    # NONE means success; it has no exception class of its own.
    assert type(error_for(ErrorCode.NONE, "odd")) is CoordError


def _exception_classes() -> list[type[BaseException]]:
    found = [
        obj
        for module in (errors, framing)
        for _, obj in inspect.getmembers(module, inspect.isclass)
        if issubclass(obj, BaseException) and obj.__module__ == module.__name__
    ]
    return sorted(set(found), key=lambda c: c.__name__)


def test_every_exception_class_has_its_own_docstring() -> None:
    classes = _exception_classes()
    assert CoordError in classes
    assert framing.TruncatedFrameError in classes
    registered = {type(error_for(c)) for c in ErrorCode if c is not ErrorCode.NONE}
    assert registered <= set(classes)
    for cls in classes:
        doc = cls.__dict__.get("__doc__")
        assert doc and doc.strip(), f"{cls.__name__} has no docstring"


def test_truncated_frame_is_a_corrupt_message() -> None:
    assert issubclass(framing.TruncatedFrameError, errors.CorruptMessageError)
    assert framing.TruncatedFrameError().code is ErrorCode.CORRUPT_MESSAGE
