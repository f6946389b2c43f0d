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

The names of Spark's Kafka source work too (:data:`KAFKA_ALIASES`:
``kafka.bootstrap.servers``, ``subscribe``, ``subscribePattern``,
``maxOffsetsPerTrigger``, ``maxRecordsPerPartition``), as do ``assign``
(``{"events": [0, 2]}``) and ``includeHeaders``, so that a job written for
``format("kafka")`` ports by changing the format name; a Kafka option that
has no meaning here (``kafka.security.protocol``, ``startingTimestamp``,
...) is refused with what to do instead, never silently ignored.
"""

from __future__ import annotations

import json
import os
import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Final

from .._routing import parse_bootstrap
from ..core.validation import validate_group_id, validate_topic_name
from ..protocol.errors import CoordError
from ..protocol.messages import EARLIEST, TopicPartition
from ..protocol.records import COMPRESSION

__all__ = [
    "KAFKA_ALIASES",
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
    "assign",
    "includeheaders",
    "group",
    "startingoffsets",
    "endingoffsets",
    "maxrecordsperbatch",
    "maxrecordspertask",
    "minpartitions",
    "failondataloss",
    "fetchmaxbytes",
    "timeout",
    "tlsca",
    "user",
    "password",
    "passwordfile",
    "saslmechanism",
}
_SECURITY_OPTIONS: Final = {"tlsca", "user", "password", "passwordfile", "saslmechanism"}
_WRITE_OPTIONS: Final = {"bootstrap", "topic", "batchsize", "compression", "timeout"} | (
    _SECURITY_OPTIONS
)
KAFKA_ALIASES: Final = {
    "kafka.bootstrap.servers": "bootstrap",
    "subscribe": "topics",
    "subscribepattern": "pattern",
    "maxoffsetspertrigger": "maxrecordsperbatch",
    "maxrecordsperpartition": "maxrecordspertask",
}
"""Spark Kafka source option (lower case) → the name it has here."""
_KAFKA_ONLY: Final = {
    "startingtimestamp": "give startingOffsets as offsets per partition",
    "startingoffsetsbytimestamp": "give startingOffsets as offsets per partition",
    "startingoffsetsbytimestampstrategy": "give startingOffsets as offsets per partition",
    "endingtimestamp": "give endingOffsets as offsets per partition",
    "endingoffsetsbytimestamp": "give endingOffsets as offsets per partition",
    "groupidprefix": 'name the group to commit a stream\'s progress to with the "group" option',
    "kafka.group.id": 'name the group to commit a stream\'s progress to with the "group" option',
    "minoffsetspertrigger": "remove it (a micro-batch takes what there is, up to "
    "maxOffsetsPerTrigger)",
    "maxtriggerdelay": "remove it (a micro-batch takes what there is, up to maxOffsetsPerTrigger)",
    "fetchoffset.numretries": "set timeout: requests are retried until it runs out",
    "fetchoffset.retryintervalms": "set timeout: requests are retried until it runs out",
    "kafkaconsumer.polltimeoutms": "set timeout (seconds) instead",
}
"""Spark Kafka source options with no counterpart here → what to do instead."""
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
class SparkSecurity:
    """TLS and the SASL login of the data source's connections (docs/security.md).

    Options ``tlsCa`` (a CA file on every executor), ``user``, and the
    password as ``password``, ``passwordFile`` or ``$TRIO_COORD_PASSWORD`` on
    the executors; ``saslMechanism`` (default SCRAM-SHA-256).
    """

    tls_ca: str | None = None
    user: str | None = None
    password: str | None = field(default=None, repr=False)
    mechanism: str = "SCRAM-SHA-256"

    @classmethod
    def from_env(cls) -> SparkSecurity:
        """From ``$TRIO_COORD_TLS_CA``, ``$TRIO_COORD_USER``, ``$TRIO_COORD_PASSWORD`` (for
        the commit listener, which has no options)."""
        return cls(
            os.environ.get("TRIO_COORD_TLS_CA") or None,
            os.environ.get("TRIO_COORD_USER") or None,
            os.environ.get("TRIO_COORD_PASSWORD") or None,
        )


def _security(options: _Options) -> SparkSecurity:
    user = options.get("user") or None
    password = options.get("password") or None
    if user and password is None:
        path = options.get("passwordfile")
        if path:
            try:
                with open(path, encoding="utf-8") as file:
                    password = file.read().rstrip("\r\n")
            except OSError as exc:
                raise OptionError(f'option "passwordFile": cannot read {path!r}: {exc}') from None
        else:
            password = os.environ.get("TRIO_COORD_PASSWORD") or None
        if not password:
            raise OptionError(
                'option "user" needs a password: option "password", "passwordFile", or '
                "$TRIO_COORD_PASSWORD on the driver and executors"
            )
    mechanism = options.get("saslmechanism", "SCRAM-SHA-256").upper()
    if mechanism not in ("SCRAM-SHA-256", "SCRAM-SHA-512", "PLAIN"):
        raise OptionError(
            f'option "saslMechanism" is {mechanism!r}; choose SCRAM-SHA-256, SCRAM-SHA-512 or PLAIN'
        )
    return SparkSecurity(options.get("tlsca") or None, user, password, mechanism)


@dataclass(frozen=True, slots=True)
class ReadOptions:
    """A read's settings (batch or stream)."""

    bootstrap: str
    topics: tuple[str, ...] = ()
    pattern: str | None = None
    assign: tuple[TopicPartition, ...] = ()
    include_headers: bool = False
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
    security: SparkSecurity = SparkSecurity()
    """The session's cores (``defaultParallelism``), when ``register`` could tell: a read
    then makes one task per core, each with an equal share of the records."""

    def wanted(self, existing: list[str]) -> list[str]:
        """The topics this read covers, among ``existing`` ones for a pattern."""
        if self.assign:
            return sorted({tp.topic for tp in self.assign})
        if self.pattern is None:
            return list(self.topics)
        regex = re.compile(self.pattern)
        return sorted(t for t in existing if regex.fullmatch(t))


@dataclass(frozen=True, slots=True)
class WriteOptions:
    """A write's settings: where to, and how records are batched."""

    bootstrap: str
    topic: str | None = None
    batch_size: int = 256 * 1024
    compression: str | None = None
    timeout: float = 30.0
    security: SparkSecurity = SparkSecurity()


class _Options(dict[str, str]):
    """Options by our lower-case name; ``aliased`` keeps the Kafka name a user gave instead,
    so that a message names the option as it was written."""

    aliased: dict[str, str]

    def shown(self, key: str, name: str) -> str:
        """How to name option ``key`` (canonically ``name``) in a message."""
        return self.aliased.get(key, name)


def _lower(options: Mapping[str, str]) -> _Options:
    """The options with lower-case keys, Kafka's names turned into ours (both given with
    different values is a mistake)."""
    result = _Options()
    result.aliased = {}
    spelled: dict[str, str] = {}
    for raw_key, raw_value in options.items():
        key, value = str(raw_key).lower(), str(raw_value)
        ours = KAFKA_ALIASES.get(key, key)
        if ours in result and result[ours] != value:
            raise OptionError(
                f'options "{spelled[ours]}" and "{raw_key}" mean the same and disagree '
                f"({result[ours]!r} and {value!r}); give one of them"
            )
        result[ours] = value
        spelled[ours] = str(raw_key)
        if ours != key:
            result.aliased[ours] = str(raw_key)
    return result


def _check_known(options: _Options, known: set[str], what: str) -> None:
    for key in sorted(options):
        advice = _KAFKA_ONLY.get(key)
        if advice is None and key.startswith("kafka."):
            advice = (
                "trio_coord brokers take no Kafka client settings; remove it "
                '(the brokers are the "bootstrap" option, alias kafka.bootstrap.servers)'
            )
        if advice is not None:
            raise OptionError(f'option "{key}" of the Kafka source has no counterpart: {advice}')
    unknown = sorted(options.shown(k, k) for k in set(options) - known - _SPARKS_OWN)
    if unknown:
        aliases = sorted(k for k, v in KAFKA_ALIASES.items() if v in known)
        raise OptionError(
            f"unknown option(s) {', '.join(unknown)} for a {what}; "
            f"known: {', '.join(sorted(known))} (and Kafka's {', '.join(aliases)})"
        )


def _bootstrap(options: _Options) -> str:
    value = options.get("bootstrap", "").strip()
    if not value:
        raise OptionError(
            'the "bootstrap" option (alias "kafka.bootstrap.servers") is required: the '
            'brokers as host:port[,host:port...], for example .option("bootstrap", '
            '"127.0.0.1:9092")'
        )
    try:
        parse_bootstrap(value)
    except ValueError as exc:
        raise OptionError(f'option "{options.shown("bootstrap", "bootstrap")}": {exc}') from None
    return value


def _topic(name: str, option: str) -> str:
    try:
        return validate_topic_name(name.strip())
    except CoordError as exc:
        raise OptionError(f'option "{option}": {exc}') from None


def _positive_int(options: _Options, key: str, name: str) -> int | None:
    raw = options.get(key)
    if raw is None:
        return None
    name = options.shown(key, name)
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


_ASSIGN_EXAMPLE: Final = '{"events": [0, 2], "clicks": [1]}'


def parse_assign(raw: str) -> tuple[TopicPartition, ...]:
    """The ``assign`` option: JSON mapping each topic to a list of its partitions."""
    try:
        parsed = json.loads(raw)
    except json.JSONDecodeError as exc:
        raise OptionError(
            f'option "assign" is not valid JSON ({exc}); write it like {_ASSIGN_EXAMPLE}'
        ) from None
    if not isinstance(parsed, dict) or not parsed:
        raise OptionError(
            f'option "assign" must be a JSON object of topics and their partitions, '
            f"like {_ASSIGN_EXAMPLE}"
        )
    chosen: set[TopicPartition] = set()
    for topic, partitions in parsed.items():
        _topic(topic, "assign")
        if not isinstance(partitions, list) or not partitions:
            raise OptionError(
                f'option "assign": topic {topic!r} must have a non-empty list of partition '
                f"numbers, like {_ASSIGN_EXAMPLE}"
            )
        for partition in partitions:
            if isinstance(partition, bool) or not isinstance(partition, int) or partition < 0:
                raise OptionError(
                    f'option "assign": {partition!r} in topic {topic!r} is not a partition '
                    "number (a whole number >= 0)"
                )
            chosen.add(TopicPartition(topic, partition))
    return tuple(sorted(chosen))


def read_options(options: Mapping[str, str], *, streaming: bool | None) -> ReadOptions:
    """Check a read's options; raise :class:`OptionError` for the first mistake.

    ``streaming`` None checks only what applies to batch and stream reads alike
    (for :meth:`~._source.TrioCoordDataSource.schema`, which does not know
    which of the two the options are for).
    """
    opts = _lower(options)
    what = {True: "stream read", False: "batch read", None: "read"}[streaming]
    _check_known(opts, _READ_OPTIONS, what)
    given = [key for key in ("topic", "topics", "pattern", "assign") if opts.get(key, "").strip()]
    if len(given) != 1:
        raise OptionError(
            'say what to read with exactly one of the options "topic" (one topic), '
            '"topics" or "subscribe" (comma-separated), "pattern" or "subscribePattern" (a '
            'regular expression over topic names), or "assign" (JSON: topics and partitions)'
            + (f"; got {', '.join(opts.shown(g, g) for g in given)}" if given else "")
        )
    shown = opts.shown(given[0], given[0])
    topics: tuple[str, ...] = ()
    pattern = None
    assign: tuple[TopicPartition, ...] = ()
    if given[0] == "assign":
        assign = parse_assign(opts["assign"])
    elif given[0] == "pattern":
        pattern = opts["pattern"].strip()
        try:
            re.compile(pattern)
        except re.error as exc:
            raise OptionError(
                f'option "{shown}" is not a valid regular expression: {exc}'
            ) from None
    else:
        names = [n for n in opts[given[0]].split(",") if n.strip()]
        topics = tuple(dict.fromkeys(_topic(n, shown) for n in names))
        if not topics:
            raise OptionError(f'option "{shown}" names no topic')
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
        shown = opts.shown("maxrecordsperbatch", "maxRecordsPerBatch")
        raise OptionError(f'option "{shown}" applies to stream reads only')
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
        assign=assign,
        include_headers=_boolean(opts, "includeheaders", "includeHeaders", False),
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
        security=_security(opts),
    )


def write_options(options: Mapping[str, str]) -> WriteOptions:
    """Check a write's options; raise :class:`OptionError` for the first mistake."""
    opts = _lower(options)
    _check_known(opts, _WRITE_OPTIONS, "write")
    topic = opts.get("topic")
    compression = opts.get("compression", "").strip().lower() or None
    if compression not in COMPRESSION:
        known = ", ".join(c for c in COMPRESSION if c)
        raise OptionError(f'option "compression" is {compression!r}; choose one of {known}')
    return WriteOptions(
        bootstrap=_bootstrap(opts),
        topic=None if topic is None else _topic(topic, "topic"),
        batch_size=_positive_int(opts, "batchsize", "batchSize") or 256 * 1024,
        compression=compression,
        timeout=_timeout(opts),
        security=_security(opts),
    )
