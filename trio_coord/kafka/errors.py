"""Error codes: the broker's own codes, and log and record errors, as Kafka's codes.

Its one job is :func:`kafka_code`: the Kafka error code (``kio``'s
``ErrorCode``) that tells a Kafka client what a
:class:`~trio_coord.protocol.errors.CoordError` or another exception the
data plane raises means, so that every handler answers the same condition
with the same code. Anything unexpected is UNKNOWN_SERVER_ERROR.
"""

from __future__ import annotations

from typing import Final

from kio.schema.errors import ErrorCode as K

from ..log import LogBusyError, LogCorruptError, LogError, LogOffsetOutOfRangeError
from ..protocol.errors import CoordError, ErrorCode
from .records import RecordBatchError

__all__ = ["KafkaError", "kafka_code"]

_BY_CODE: Final[dict[int, K]] = {
    ErrorCode.NONE: K.none,
    ErrorCode.CORRUPT_MESSAGE: K.corrupt_message,
    ErrorCode.INVALID_REQUEST: K.invalid_request,
    ErrorCode.NOT_COORDINATOR: K.not_coordinator,
    ErrorCode.COORDINATOR_NOT_AVAILABLE: K.coordinator_not_available,
    ErrorCode.UNKNOWN_TOPIC: K.unknown_topic_or_partition,
    ErrorCode.TOPIC_ALREADY_EXISTS: K.topic_already_exists,
    ErrorCode.INVALID_TOPIC: K.invalid_topic_exception,
    ErrorCode.INVALID_PARTITIONS: K.invalid_partitions,
    ErrorCode.OFFSET_OUT_OF_RANGE: K.offset_out_of_range,
    ErrorCode.REQUEST_TIMED_OUT: K.request_timed_out,
    ErrorCode.BROKER_SHUTTING_DOWN: K.leader_not_available,
    ErrorCode.NOT_LEADER_FOR_PARTITION: K.not_leader_or_follower,
    ErrorCode.RECORD_TOO_LARGE: K.message_too_large,
    ErrorCode.INVALID_RECORD: K.invalid_record,
    ErrorCode.STORAGE_ERROR: K.kafka_storage_error,
    ErrorCode.RESOURCES_EXHAUSTED: K.throttling_quota_exceeded,
    ErrorCode.SASL_AUTHENTICATION_FAILED: K.sasl_authentication_failed,
}


class KafkaError(Exception):
    """An error to answer with a given Kafka ``code`` (and ``message`` where the API has one)."""

    def __init__(self, code: K, message: str) -> None:
        super().__init__(message)
        self.code = code


def kafka_code(exc: BaseException) -> K:
    """The Kafka error code that answers ``exc``."""
    if isinstance(exc, KafkaError):
        return exc.code
    if isinstance(exc, CoordError):
        return _BY_CODE.get(exc.code, K.unknown_server_error)
    if isinstance(exc, RecordBatchError):
        return K.corrupt_message
    if isinstance(exc, LogOffsetOutOfRangeError):
        return K.offset_out_of_range
    if isinstance(exc, LogCorruptError):
        return K.kafka_storage_error
    if isinstance(exc, LogBusyError):
        return K.request_timed_out
    if isinstance(exc, LogError):
        return K.kafka_storage_error
    return K.unknown_server_error
