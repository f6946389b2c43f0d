"""Kafka request and response encoding, through kio's generated schemas.

Its one job is to turn frames into kio request objects and response
objects into frames. Every message schema comes from kio (generated from
Apache Kafka's own JSON message definitions; ``docs/architecture.md`` says
why), for every version: the request header (v1, or v2 with tagged fields
for flexible versions), the response header (v0, or v1 for flexible
versions; ApiVersions always v0) and the bodies. Helpers build a response of
whatever version a client asked for from one set of values (:func:`make`
drops the fields a version lacks) and a well-formed error response for any
API kio knows (:func:`error_response`), so that an API this broker does not
serve is answered, not dropped.
"""

from __future__ import annotations

import dataclasses
import datetime
import functools
import io
import struct
import sys
import typing
import uuid
from types import ModuleType
from typing import Any, Final, NamedTuple

from kio.index import load_request_schema, load_response_schema
from kio.schema.errors import ErrorCode as KafkaCode
from kio.schema.index import api_key_map, schema_name_map
from kio.serial import entity_reader, entity_writer

__all__ = [
    "KafkaCode",
    "RequestHead",
    "decode_request",
    "encode_response",
    "error_response",
    "known_versions",
    "make",
    "ms",
    "nested",
    "peek_head",
]

API_VERSIONS: Final = 18
_HEAD: Final = struct.Struct(">hhi")
_ZERO_UUID: Final = uuid.UUID(int=0)


class RequestHead(NamedTuple):
    """The fixed start of every request header: API key, version, correlation id."""

    api_key: int
    api_version: int
    correlation_id: int


def peek_head(frame: bytes) -> RequestHead:
    """The API key, version and correlation id of a frame (ValueError if too short)."""
    if len(frame) < _HEAD.size:
        raise ValueError(f"a request of {len(frame)} bytes is shorter than a request header")
    return RequestHead(*_HEAD.unpack_from(frame))


@functools.cache
def known_versions(api_key: int) -> tuple[int, int] | None:
    """The (lowest, highest) version of ``api_key`` kio has schemas for, or None."""
    name = api_key_map.get(api_key)
    if name is None:
        return None
    versions = sorted(schema_name_map[name])
    return versions[0], versions[-1]


@functools.cache
def request_schema(api_key: int, version: int) -> type[Any] | None:
    """kio's request class for ``api_key`` at ``version`` (None if kio has none)."""
    known = known_versions(api_key)
    if known is None or not known[0] <= version <= known[1]:
        return None
    try:
        return load_request_schema(api_key, version)
    except Exception:  # (kio raises its own index errors for gaps)
        return None


@functools.cache
def response_schema(api_key: int, version: int) -> type[Any]:
    """kio's response class for ``api_key`` at ``version``."""
    return load_response_schema(api_key, version)


def decode_request(frame: bytes, schema: type[Any]) -> tuple[Any, Any]:
    """(header, body) of a request frame whose schema is known; ValueError if malformed."""
    header_type = schema.__header_schema__
    try:
        header, used = entity_reader(header_type)(frame, 0)
        body, size = entity_reader(schema)(frame, used)
    except Exception as exc:  # kio raises assorted errors for truncated or bad input
        raise ValueError(f"cannot decode {schema.__name__}: {exc!r}") from None
    if used + size > len(frame):
        raise ValueError(f"{schema.__name__} v{schema.__version__} is cut short")
    # Bytes after the body are ignored, as Kafka does (librdkafka's Metadata v12 for all
    # topics carries three).
    return header, body


def encode_response(correlation_id: int, response: Any) -> bytes:
    """A whole response frame (4-byte size, header, body) for ``response``."""
    out = io.BytesIO()
    out.write(b"\0\0\0\0")
    header_type = type(response).__header_schema__
    entity_writer(header_type)(out, header_type(correlation_id=correlation_id))
    entity_writer(type(response))(out, response)
    data = out.getbuffer()
    struct.pack_into(">i", data, 0, len(data) - 4)
    return bytes(data)


_FIELD_NAMES: dict[type[Any], frozenset[str]] = {}
_HINTS: dict[type[Any], dict[str, Any]] = {}


def _field_names(cls: type[Any]) -> frozenset[str]:
    names = _FIELD_NAMES.get(cls)
    if names is None:
        names = _FIELD_NAMES[cls] = frozenset(f.name for f in dataclasses.fields(cls))
    return names


def make(cls: type[Any], **values: Any) -> Any:
    """An instance of ``cls`` from ``values``, ignoring those the version lacks."""
    names = _field_names(cls)
    return cls(**{k: v for k, v in values.items() if k in names})


def nested(schema: type[Any], name: str) -> type[Any]:
    """The class ``name`` defined beside ``schema`` (the same API, version and direction)."""
    module: ModuleType = sys.modules[schema.__module__]
    return typing.cast(type[Any], getattr(module, name))


def ms(value: datetime.timedelta | int) -> int:
    """Milliseconds from a kio duration field (a timedelta) or a plain int."""
    if isinstance(value, datetime.timedelta):
        return int(value / datetime.timedelta(milliseconds=1))
    return int(value)


def error_response(api_key: int, version: int, code: int) -> Any:
    """A response of ``api_key`` at ``version`` with every error code set to ``code``.

    Lists are empty, numbers 0 (or their schema default), strings empty:
    the shape every client can parse, saying only "this failed".
    """
    return _zero(response_schema(api_key, version), KafkaCode(code))


def _zero(cls: type[Any], code: KafkaCode) -> Any:
    hints = _hints(cls)
    values: dict[str, Any] = {}
    for f in dataclasses.fields(cls):
        kafka_type = f.metadata.get("kafka_type")
        if kafka_type == "error_code":
            values[f.name] = code
        elif f.default is not dataclasses.MISSING:
            continue
        elif f.default_factory is not dataclasses.MISSING:
            continue
        else:
            values[f.name] = _zero_value(hints[f.name], kafka_type, code)
    return cls(**values)


def _zero_value(hint: Any, kafka_type: str | None, code: KafkaCode) -> Any:
    origin = typing.get_origin(hint)
    if origin is tuple:
        return ()
    if origin is typing.Union or str(origin) == "<class 'types.UnionType'>":
        return None
    if dataclasses.is_dataclass(hint):
        return _zero(typing.cast(type[Any], hint), code)
    if kafka_type in ("timedelta_i32", "timedelta_i64"):
        return datetime.timedelta(0)
    if kafka_type == "datetime_i64":
        return datetime.datetime.fromtimestamp(0, datetime.UTC)
    if kafka_type == "uuid":
        return _ZERO_UUID
    if kafka_type == "bool":
        return False
    if kafka_type in ("string",):
        return ""
    if kafka_type in ("bytes", "records"):
        return b""
    if kafka_type == "float64":
        return 0.0
    return 0


def _hints(cls: type[Any]) -> dict[str, Any]:
    hints = _HINTS.get(cls)
    if hints is None:
        hints = _HINTS[cls] = typing.get_type_hints(cls)
    return hints
