"""Error codes of the wire protocol, and the typed exception for each.

Every response carries one :class:`ErrorCode` and a human message. A peer's
mistake is answered with a code, never with an exception escaping a handler;
the client turns a non-zero code back into the exception class registered for
it here (``raise error_for(code, message)``), so application code catches
``UnknownMemberError`` or ``NotCoordinatorError`` rather than inspecting
integers. Codes are only ever appended; a number is never reused.
"""

from __future__ import annotations

import enum

__all__ = [
    "AuthorizationError",
    "BrokerShuttingDownError",
    "ConnectionClosedError",
    "CoordError",
    "CoordinatorNotAvailableError",
    "CorruptMessageError",
    "ErrorCode",
    "FencedInstanceIdError",
    "FrameTooLargeError",
    "GroupAlreadyExistsError",
    "GroupMaxSizeReachedError",
    "GroupNotFoundError",
    "GroupSubscribedToTopicError",
    "IllegalGenerationError",
    "InconsistentAssignorError",
    "InvalidGroupIdError",
    "InvalidPartitionsError",
    "InvalidRebalanceTimeoutError",
    "InvalidRecordError",
    "InvalidRequestError",
    "InvalidSessionTimeoutError",
    "InvalidTopicError",
    "MemberIdInUseError",
    "NoOffsetForPartitionError",
    "NonEmptyGroupError",
    "NotCoordinatorError",
    "NotLeaderForPartitionError",
    "OffsetMetadataTooLargeError",
    "OffsetOutOfRangeError",
    "OffsetRegressionError",
    "PartitionNotOwnedError",
    "RebalanceInProgressError",
    "RecordTooLargeError",
    "RequestTimedOutError",
    "ResourcesExhaustedError",
    "SaslAuthenticationError",
    "StorageError",
    "TopicAlreadyExistsError",
    "UnknownMemberError",
    "UnknownServerError",
    "UnknownTopicError",
    "UnsupportedMessageError",
    "error_for",
    "hint",
]


class ErrorCode(enum.IntEnum):
    """Every error the protocol can report (0 is success)."""

    NONE = 0
    UNKNOWN_SERVER_ERROR = 1
    CORRUPT_MESSAGE = 2
    FRAME_TOO_LARGE = 3
    UNSUPPORTED_MESSAGE = 4
    INVALID_REQUEST = 5
    NOT_COORDINATOR = 6
    COORDINATOR_NOT_AVAILABLE = 7
    UNKNOWN_TOPIC = 8
    TOPIC_ALREADY_EXISTS = 9
    INVALID_TOPIC = 10
    INVALID_PARTITIONS = 11
    UNKNOWN_MEMBER_ID = 12
    ILLEGAL_GENERATION = 13
    REBALANCE_IN_PROGRESS = 14
    INVALID_SESSION_TIMEOUT = 15
    INVALID_GROUP_ID = 16
    GROUP_ID_NOT_FOUND = 17
    GROUP_ALREADY_EXISTS = 18
    NON_EMPTY_GROUP = 19
    INCONSISTENT_ASSIGNOR = 20
    PARTITION_NOT_OWNED = 21
    OFFSET_OUT_OF_RANGE = 22
    OFFSET_REGRESSION = 23
    GROUP_MAX_SIZE_REACHED = 24
    CONNECTION_CLOSED = 25
    REQUEST_TIMED_OUT = 26
    MEMBER_ID_IN_USE = 27
    BROKER_SHUTTING_DOWN = 28
    NOT_LEADER_FOR_PARTITION = 29
    RECORD_TOO_LARGE = 30
    INVALID_RECORD = 31
    GROUP_SUBSCRIBED_TO_TOPIC = 32
    NO_OFFSET_FOR_PARTITION = 33
    OFFSET_METADATA_TOO_LARGE = 34
    STORAGE_ERROR = 35
    INVALID_REBALANCE_TIMEOUT = 36
    RESOURCES_EXHAUSTED = 37
    FENCED_INSTANCE_ID = 40
    SASL_AUTHENTICATION_FAILED = 58
    AUTHORIZATION_FAILED = 59


_HINTS: dict[ErrorCode, str] = {
    ErrorCode.UNKNOWN_SERVER_ERROR: "the broker hit a bug; see its log",
    ErrorCode.CORRUPT_MESSAGE: "the frame could not be decoded; check client and broker versions",
    ErrorCode.FRAME_TOO_LARGE: "the frame exceeds the maximum frame size",
    ErrorCode.UNSUPPORTED_MESSAGE: "the peer does not know this message type; upgrade it",
    ErrorCode.INVALID_REQUEST: "the request is malformed",
    ErrorCode.NOT_COORDINATOR: "this broker does not coordinate the group; rediscover it",
    ErrorCode.COORDINATOR_NOT_AVAILABLE: "no coordinator is available yet; retry shortly",
    ErrorCode.UNKNOWN_TOPIC: "the topic does not exist; create it first",
    ErrorCode.TOPIC_ALREADY_EXISTS: "a topic with that name exists already",
    ErrorCode.INVALID_TOPIC: "the topic name is not valid",
    ErrorCode.INVALID_PARTITIONS: "the partition count is not valid",
    ErrorCode.UNKNOWN_MEMBER_ID: "the coordinator does not know this member; rejoin the group",
    ErrorCode.ILLEGAL_GENERATION: "the generation is stale; rejoin to get the current one",
    ErrorCode.REBALANCE_IN_PROGRESS: "the group is rebalancing; retry after it is stable",
    ErrorCode.INVALID_SESSION_TIMEOUT: "the session timeout is outside the broker's limits",
    ErrorCode.INVALID_GROUP_ID: "the group id is not valid",
    ErrorCode.GROUP_ID_NOT_FOUND: "no such group",
    ErrorCode.GROUP_ALREADY_EXISTS: "a group with that id exists already",
    ErrorCode.NON_EMPTY_GROUP: "the group still has members; stop them first",
    ErrorCode.INCONSISTENT_ASSIGNOR: "the members share no assignor the broker supports",
    ErrorCode.PARTITION_NOT_OWNED: "the member does not own that partition in this generation",
    ErrorCode.OFFSET_OUT_OF_RANGE: "the offset is outside the partition's range",
    ErrorCode.OFFSET_REGRESSION: "the commit would move an offset backwards",
    ErrorCode.GROUP_MAX_SIZE_REACHED: "the group has reached its maximum size",
    ErrorCode.CONNECTION_CLOSED: "the connection closed before an answer arrived",
    ErrorCode.REQUEST_TIMED_OUT: "no answer arrived in time",
    ErrorCode.MEMBER_ID_IN_USE: "another live member uses that id",
    ErrorCode.BROKER_SHUTTING_DOWN: "the broker is shutting down; use another broker",
    ErrorCode.NOT_LEADER_FOR_PARTITION: "this broker does not hold the partition; refresh metadata",
    ErrorCode.RECORD_TOO_LARGE: "the batch is larger than the broker accepts; send smaller batches",
    ErrorCode.INVALID_RECORD: "the record batch is malformed",
    ErrorCode.GROUP_SUBSCRIBED_TO_TOPIC: "members of the group still consume that partition",
    ErrorCode.NO_OFFSET_FOR_PARTITION: "no committed offset and the reset policy is 'none'",
    ErrorCode.OFFSET_METADATA_TOO_LARGE: "the offset's metadata is over the broker's limit",
    ErrorCode.STORAGE_ERROR: "the partition's files are damaged on the broker; see its log",
    ErrorCode.INVALID_REBALANCE_TIMEOUT: "the rebalance timeout is outside the broker's limits",
    ErrorCode.RESOURCES_EXHAUSTED: "the broker is out of connections, files or memory; retry",
    ErrorCode.FENCED_INSTANCE_ID: "another live member runs with that instance id",
    ErrorCode.SASL_AUTHENTICATION_FAILED: "authentication failed: check the user and password",
    ErrorCode.AUTHORIZATION_FAILED: "the principal lacks an ACL for this; ask an operator",
}


class CoordError(Exception):
    """Base class of every error that a trio_coord peer reports with a code.

    ``code`` is the :class:`ErrorCode`; ``str(err)`` is the peer's message,
    which says what went wrong and what to do about it. ``retriable`` tells a
    client whether the same request may succeed if simply retried later.
    Each subclass binds one code and registers itself for :func:`error_for`.
    """

    code: int = ErrorCode.UNKNOWN_SERVER_ERROR
    """The wire code: an :class:`ErrorCode`, or a bare number from a newer peer."""
    retriable: bool = False

    def __init_subclass__(cls, **kwargs: object) -> None:
        super().__init_subclass__(**kwargs)
        if "code" in cls.__dict__:  # a refinement that inherits its code does not take it over
            _BY_CODE[cls.code] = cls

    def __init__(self, message: str = "") -> None:
        super().__init__(message or hint(self.code))

    @property
    def message(self) -> str:
        """The human message (the same as ``str(self)``)."""
        return str(self)


_BY_CODE: dict[int, type[CoordError]] = {}


class UnknownServerError(CoordError):
    """The broker hit a bug; see its log."""

    code = ErrorCode.UNKNOWN_SERVER_ERROR


class CorruptMessageError(CoordError):
    """The frame could not be decoded; check client and broker versions."""

    code = ErrorCode.CORRUPT_MESSAGE


class FrameTooLargeError(CoordError):
    """The frame exceeds the maximum frame size."""

    code = ErrorCode.FRAME_TOO_LARGE


class UnsupportedMessageError(CoordError):
    """The peer does not know this message type; upgrade it."""

    code = ErrorCode.UNSUPPORTED_MESSAGE


class InvalidRequestError(CoordError):
    """The request is malformed."""

    code = ErrorCode.INVALID_REQUEST


class NotCoordinatorError(CoordError):
    """This broker does not coordinate the group; rediscover it."""

    code = ErrorCode.NOT_COORDINATOR
    retriable = True


class CoordinatorNotAvailableError(CoordError):
    """No coordinator is available yet; retry shortly."""

    code = ErrorCode.COORDINATOR_NOT_AVAILABLE
    retriable = True


class UnknownTopicError(CoordError):
    """The topic does not exist; create it first."""

    code = ErrorCode.UNKNOWN_TOPIC


class TopicAlreadyExistsError(CoordError):
    """A topic with that name exists already."""

    code = ErrorCode.TOPIC_ALREADY_EXISTS


class InvalidTopicError(CoordError):
    """The topic name is not valid."""

    code = ErrorCode.INVALID_TOPIC


class InvalidPartitionsError(CoordError):
    """The partition count is not valid."""

    code = ErrorCode.INVALID_PARTITIONS


class UnknownMemberError(CoordError):
    """The coordinator does not know this member; rejoin the group."""

    code = ErrorCode.UNKNOWN_MEMBER_ID


class IllegalGenerationError(CoordError):
    """The generation is stale; rejoin to get the current one."""

    code = ErrorCode.ILLEGAL_GENERATION


class RebalanceInProgressError(CoordError):
    """The group is rebalancing; retry after it is stable."""

    code = ErrorCode.REBALANCE_IN_PROGRESS
    retriable = True


class InvalidSessionTimeoutError(CoordError):
    """The session timeout is outside the broker's limits."""

    code = ErrorCode.INVALID_SESSION_TIMEOUT


class InvalidRebalanceTimeoutError(CoordError):
    """The rebalance timeout is outside the broker's limits."""

    code = ErrorCode.INVALID_REBALANCE_TIMEOUT


class InvalidGroupIdError(CoordError):
    """The group id is not valid."""

    code = ErrorCode.INVALID_GROUP_ID


class GroupNotFoundError(CoordError):
    """No such group."""

    code = ErrorCode.GROUP_ID_NOT_FOUND


class GroupAlreadyExistsError(CoordError):
    """A group with that id exists already."""

    code = ErrorCode.GROUP_ALREADY_EXISTS


class NonEmptyGroupError(CoordError):
    """The group still has members; stop them first."""

    code = ErrorCode.NON_EMPTY_GROUP


class InconsistentAssignorError(CoordError):
    """The members share no assignor the broker supports."""

    code = ErrorCode.INCONSISTENT_ASSIGNOR


class PartitionNotOwnedError(CoordError):
    """The member does not own that partition in this generation."""

    code = ErrorCode.PARTITION_NOT_OWNED


class OffsetOutOfRangeError(CoordError):
    """The offset is outside the partition's range."""

    code = ErrorCode.OFFSET_OUT_OF_RANGE


class OffsetRegressionError(CoordError):
    """The commit would move an offset backwards."""

    code = ErrorCode.OFFSET_REGRESSION


class GroupMaxSizeReachedError(CoordError):
    """The group has reached its maximum size."""

    code = ErrorCode.GROUP_MAX_SIZE_REACHED


class ConnectionClosedError(CoordError):
    """The connection closed before an answer arrived."""

    code = ErrorCode.CONNECTION_CLOSED
    retriable = True


class RequestTimedOutError(CoordError):
    """No answer arrived in time."""

    code = ErrorCode.REQUEST_TIMED_OUT
    retriable = True


class MemberIdInUseError(CoordError):
    """Another live member uses that id."""

    code = ErrorCode.MEMBER_ID_IN_USE


class BrokerShuttingDownError(CoordError):
    """The broker is shutting down; use another broker."""

    code = ErrorCode.BROKER_SHUTTING_DOWN
    retriable = True


class NotLeaderForPartitionError(CoordError):
    """This broker does not hold that partition; refresh metadata and ask its leader."""

    code = ErrorCode.NOT_LEADER_FOR_PARTITION
    retriable = True


class RecordTooLargeError(CoordError):
    """A batch (or one record) is larger than the broker or the client accepts."""

    code = ErrorCode.RECORD_TOO_LARGE


class InvalidRecordError(CoordError):
    """A record batch could not be decoded or its header does not match its records."""

    code = ErrorCode.INVALID_RECORD


class GroupSubscribedToTopicError(CoordError):
    """Offsets of a partition that live members consume cannot be deleted."""

    code = ErrorCode.GROUP_SUBSCRIBED_TO_TOPIC


class NoOffsetForPartitionError(CoordError):
    """A partition has no committed offset and the consumer's reset policy is "none"."""

    code = ErrorCode.NO_OFFSET_FOR_PARTITION


class OffsetMetadataTooLargeError(CoordError):
    """An offset's metadata is larger than the broker keeps."""

    code = ErrorCode.OFFSET_METADATA_TOO_LARGE


class StorageError(CoordError):
    """A partition's files on the broker are damaged: it cannot be read (or written) there.

    The message names the file and byte, and what the operator can do
    (``--repair``, or restore a backup). Not retriable: it stays so until then.
    """

    code = ErrorCode.STORAGE_ERROR


class ResourcesExhaustedError(CoordError):
    """The broker is out of a resource (connections, file descriptors, request memory).

    Nothing was done; retry later (or elsewhere). The message says which
    limit was reached.
    """

    code = ErrorCode.RESOURCES_EXHAUSTED
    retriable = True


class FencedInstanceIdError(CoordError):
    """Another live member of the group runs with this static ``instance_id``."""

    code = ErrorCode.FENCED_INSTANCE_ID


class SaslAuthenticationError(CoordError):
    """The broker did not accept the credentials (or the connection skipped authenticating).

    The message says why; check the user, the password and the mechanism.
    """

    code = ErrorCode.SASL_AUTHENTICATION_FAILED


class AuthorizationError(CoordError):
    """The principal may not do this: the message names the principal, operation, resource.

    Ask an operator for the ACL (``trio-coord acls add``); retrying does not help.
    """

    code = ErrorCode.AUTHORIZATION_FAILED


assert set(_BY_CODE) == set(ErrorCode) - {ErrorCode.NONE}, "every code needs an exception"


def error_for(code: int, message: str = "") -> CoordError:
    """Build the typed exception for a non-zero wire error code.

    An unknown code (from a newer peer) becomes a plain :class:`CoordError`
    with the peer's message and the number as its ``code``.
    """
    try:
        cls = _BY_CODE[ErrorCode(code)]
    except (ValueError, KeyError):
        unknown = CoordError(message or f"error code {code}, unknown to this version")
        unknown.code = code
        return unknown
    return cls(message)


def hint(code: int) -> str:
    """The default one-line explanation of a code (used when a message is empty)."""
    try:
        known = ErrorCode(code)
    except ValueError:
        return f"error code {code}"
    return _HINTS.get(known, known.name)
