"""The data source's options: parsed and checked once, with a clear message for each mistake.

Spark hands a data source its ``.option(...)`` values as strings (keys are
case-insensitive). :func:`read_options` and :func:`write_options` turn them
into frozen settings, or raise :class:`OptionError` naming the option, what
is wrong with it and what to write instead. Nothing here touches the network:
whether a topic exists is checked when the read is planned.

Offsets are given as ``earliest``, ``latest``, ``group`` (the ``group``
option's committed offsets) or JSON per partition, Kafka's shape:
``{"events": {"0": 42, "1": -2}}``, where ``-2`` means the partition's
earliest offset and ``-1`` its latest.
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Final

from ..client._bootstrap import parse_bootstrap
from ..core.validation import validate_group_id, validate_topic_name
from ..protocol.errors import CoordError
from ..protocol.messages import EARLIEST, TopicPartition

__all__ = [
    "OffsetSpec",
    "OptionError",
    "ReadOptions",
    "WriteOptions",
    "parse_offsets",
    "read_options",
    "write_options",
]


class OptionError(ValueError):
    """An option of the ``trio_coord`` data source is missing, unknown or malformed."""

    def __init__(self, message: str) -> None:
        super().__init__(f"trio_coord data source: {message}")


_OFFSETS_EXAMPLE: Final = '{"events": {"0": 42, "1": -2}}'

_READ_OPTIONS: Final = {
    "bootstrap",
    "topic",
    "topics",
    "pattern",
    "group",
    "startingoffsets",
    "endingoffsets",
    "maxrecordsperbatch",
    "maxrecordspertask",
    "minpartitions",
    "failondataloss",
    "fetchmaxbytes",
    "timeout",
}
_WRITE_OPTIONS: Final = {"bootstrap", "topic", "batchsize", "compression", "timeout"}
_SPARKS_OWN: Final = {"path", "paths", "checkpointlocation"}
"""Options Spark itself passes on to a data source along with the user's."""


@dataclass(frozen=True, slots=True)
class OffsetSpec:
    """Where to start or end: ``kind`` is earliest, latest, group or json.

    For json, ``offsets`` maps partitions to an offset, EARLIEST (-2) or
    LATEST (-1); partitions it leaves out take ``default`` (earliest or latest).
    """

    kind: str
    offsets: Mapping[TopicPartition, int] = field(default_factory=dict)
    default: str = "earliest"


@dataclass(frozen=True, slots=True)
class ReadOptions:
    """A read's settings (batch or stream)."""

    bootstrap: str
    topics: tuple[str, ...] = ()
    pattern: str | None = None
    group: str | None = None
    starting: OffsetSpec = OffsetSpec("earliest")
    ending: OffsetSpec = OffsetSpec("latest")
    max_records_per_batch: int | None = None
    max_records_per_task: int = 1_000_000
    min_partitions: int | None = None
    fail_on_data_loss: bool = True
    fetch_max_bytes: int = 4 * 1024 * 1024
    timeout: float = 30.0
    parallelism: int | None = None
    """The session's cores (``defaultParallelism``), when ``register`` could tell: a read
    then makes one task per core, each with an equal share of the records."""

    def wanted(self, existing: list[str]) -> list[str]:
        """The topics this read covers, among ``existing`` ones for a pattern."""
        if self.pattern is None:
            return list(self.topics)
        regex = re.compile(self.pattern)
        return sorted(t for t in existing if regex.fullmatch(t))


@dataclass(frozen=True, slots=True)
class WriteOptions:
    """A write's settings: where to, and how records are batched."""

    bootstrap: str
    topic: str | None = None
    batch_size: int = 64 * 1024
    compression: str | None = None
    timeout: float = 30.0


def _lower(options: Mapping[str, str]) -> dict[str, str]:
    return {str(k).lower(): str(v) for k, v in options.items()}


def _check_known(options: dict[str, str], known: set[str], what: str) -> None:
    unknown = sorted(set(options) - known - _SPARKS_OWN)
    if unknown:
        raise OptionError(
            f"unknown option(s) {', '.join(unknown)} for a {what}; "
            f"known: {', '.join(sorted(known))}"
        )


def _bootstrap(options: dict[str, str]) -> str:
    value = options.get("bootstrap", "").strip()
    if not value:
        raise OptionError(
            'the "bootstrap" option is required: the brokers as host:port[,host:port...], '
            'for example .option("bootstrap", "127.0.0.1:9092")'
        )
    try:
        parse_bootstrap(value)
    except ValueError as exc:
        raise OptionError(f'option "bootstrap": {exc}') from None
    return value


def _topic(name: str, option: str) -> str:
    try:
        return validate_topic_name(name.strip())
    except CoordError as exc:
        raise OptionError(f'option "{option}": {exc}') from None


def _positive_int(options: dict[str, str], key: str, name: str) -> int | None:
    raw = options.get(key)
    if raw is None:
        return None
    try:
        value = int(raw)
    except ValueError:
        value = 0
    if value <= 0:
        raise OptionError(f'option "{name}" must be a positive whole number, got {raw!r}')
    return value


def _timeout(options: dict[str, str]) -> float:
    raw = options.get("timeout", "30")
    try:
        value = float(raw)
    except ValueError:
        value = 0.0
    if not value > 0:
        raise OptionError(f'option "timeout" must be a positive number of seconds, got {raw!r}')
    return value


def _boolean(options: dict[str, str], key: str, name: str, default: bool) -> bool:
    raw = options.get(key)
    if raw is None:
        return default
    if raw.strip().lower() in ("true", "false"):
        return raw.strip().lower() == "true"
    raise OptionError(f'option "{name}" must be true or false, got {raw!r}')


def parse_offsets(raw: str, name: str, *, allowed: tuple[str, ...], default: str) -> OffsetSpec:
    """Parse one offsets option: one of ``allowed`` words, or per-partition JSON."""
    text = raw.strip()
    if text.lower() in allowed:
        return OffsetSpec(text.lower())
    if not text.startswith(("{", "[")):
        words = ", ".join(allowed)
        raise OptionError(
            f'option "{name}" is {raw!r}; give one of {words}, or JSON per partition '
            f"such as {_OFFSETS_EXAMPLE} (-2: earliest, -1: latest)"
        )
    try:
        parsed = json.loads(text)
    except json.JSONDecodeError as exc:
        raise OptionError(
            f'option "{name}" is not valid JSON ({exc}); write it like {_OFFSETS_EXAMPLE}'
        ) from None
    if not isinstance(parsed, dict):
        raise OptionError(f'option "{name}" must be a JSON object like {_OFFSETS_EXAMPLE}')
    offsets: dict[TopicPartition, int] = {}
    for topic, partitions in parsed.items():
        _topic(topic, name)
        if not isinstance(partitions, dict):
            raise OptionError(
                f'option "{name}": topic {topic!r} must map partition numbers to offsets, '
                f"like {_OFFSETS_EXAMPLE}"
            )
        for partition, offset in partitions.items():
            if not (isinstance(partition, str) and partition.isdigit()):
                raise OptionError(
                    f'option "{name}": {partition!r} in topic {topic!r} is not a partition number'
                )
            if isinstance(offset, bool) or not isinstance(offset, int) or offset < EARLIEST:
                raise OptionError(
                    f'option "{name}": the offset of {topic}-{partition} must be a whole '
                    f"number >= 0, or -2 (earliest) or -1 (latest); got {offset!r}"
                )
            offsets[TopicPartition(topic, int(partition))] = offset
    return OffsetSpec("json", offsets, default)


def read_options(options: Mapping[str, str], *, streaming: bool | None) -> ReadOptions:
    """Check a read's options; raise :class:`OptionError` for the first mistake.

    ``streaming`` None checks only what applies to batch and stream reads alike
    (for :meth:`~._source.TrioCoordDataSource.schema`, which does not know
    which of the two the options are for).
    """
    opts = _lower(options)
    what = {True: "stream read", False: "batch read", None: "read"}[streaming]
    _check_known(opts, _READ_OPTIONS, what)
    given = [key for key in ("topic", "topics", "pattern") if opts.get(key, "").strip()]
    if len(given) != 1:
        raise OptionError(
            'say what to read with exactly one of the options "topic" (one topic), '
            '"topics" (comma-separated) or "pattern" (a regular expression over topic names)'
            + (f"; got {', '.join(given)}" if given else "")
        )
    topics: tuple[str, ...] = ()
    pattern = None
    if given[0] == "pattern":
        pattern = opts["pattern"].strip()
        try:
            re.compile(pattern)
        except re.error as exc:
            raise OptionError(
                f'option "pattern" is not a valid regular expression: {exc}'
            ) from None
    else:
        names = [n for n in opts[given[0]].split(",") if n.strip()]
        topics = tuple(dict.fromkeys(_topic(n, given[0]) for n in names))
        if not topics:
            raise OptionError(f'option "{given[0]}" names no topic')
    group = opts.get("group")
    if group is not None:
        try:
            group = validate_group_id(group.strip())
        except CoordError as exc:
            raise OptionError(f'option "group": {exc}') from None
    start_words = ("earliest", "latest", "group")
    default_start = ("group" if group else "latest") if streaming else "earliest"
    starting = parse_offsets(
        opts.get("startingoffsets", default_start),
        "startingOffsets",
        allowed=start_words,
        default="earliest",
    )
    if starting.kind == "group" and group is None:
        raise OptionError(
            'startingOffsets "group" needs the "group" option: the group whose committed '
            "offsets to start from"
        )
    if streaming is True and "endingoffsets" in opts:
        raise OptionError(
            'option "endingOffsets" applies to batch reads only; a stream reads on '
            "(use Trigger.AvailableNow to stop at the offsets of its start)"
        )
    ending = parse_offsets(
        opts.get("endingoffsets", "latest"),
        "endingOffsets",
        allowed=("earliest", "latest"),
        default="latest",
    )
    per_batch = _positive_int(opts, "maxrecordsperbatch", "maxRecordsPerBatch")
    if per_batch is not None and streaming is False:
        raise OptionError('option "maxRecordsPerBatch" applies to stream reads only')
    if group is not None and streaming is False:
        if starting.kind != "group":
            raise OptionError(
                'option "group" in a batch read only chooses where to start '
                '(startingOffsets "group"); a batch read commits nothing'
            )
    fetch_max = _positive_int(opts, "fetchmaxbytes", "fetchMaxBytes")
    return ReadOptions(
        bootstrap=_bootstrap(opts),
        topics=topics,
        pattern=pattern,
        group=group,
        starting=starting,
        ending=ending,
        max_records_per_batch=per_batch,
        max_records_per_task=_positive_int(opts, "maxrecordspertask", "maxRecordsPerTask")
        or 1_000_000,
        min_partitions=_positive_int(opts, "minpartitions", "minPartitions"),
        fail_on_data_loss=_boolean(opts, "failondataloss", "failOnDataLoss", True),
        fetch_max_bytes=fetch_max or 4 * 1024 * 1024,
        timeout=_timeout(opts),
    )


def write_options(options: Mapping[str, str]) -> WriteOptions:
    """Check a write's options; raise :class:`OptionError` for the first mistake."""
    opts = _lower(options)
    _check_known(opts, _WRITE_OPTIONS, "write")
    topic = opts.get("topic")
    compression = opts.get("compression", "").strip().lower() or None
    if compression not in (None, "zlib", "lzma"):
        raise OptionError(f'option "compression" is {compression!r}; choose zlib or lzma')
    return WriteOptions(
        bootstrap=_bootstrap(opts),
        topic=None if topic is None else _topic(topic, "topic"),
        batch_size=_positive_int(opts, "batchsize", "batchSize") or 64 * 1024,
        compression=compression,
        timeout=_timeout(opts),
    )
