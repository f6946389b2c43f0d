"""How the command line prints: aligned tables for people, JSON for scripts.

Every result a command shows passes through here: ``format_table``, the JSON shapes
(``group_to_json``, topics, records), ``describe_text`` for ``groups describe`` and
``_say`` (JSON with ``--json``, else the text). JSON goes to the ``sys.stdout`` of the
moment, so a caller that redirects stdout gets both forms.
"""

from __future__ import annotations

import argparse
import base64
import json
import sys
import uuid
from collections.abc import Sequence
from typing import Any, TextIO

from ..client import PartitionLag
from ..protocol.messages import GroupDescription, TopicInfo, TopicPartition
from ..protocol.records import ConsumerRecord


def _print_json(value: Any, out: TextIO | None = None) -> None:
    out = out or sys.stdout  # (looked up per call: callers may redirect stdout)
    out.write(json.dumps(value, sort_keys=False) + "\n")
    out.flush()


def format_table(headers: Sequence[str], rows: Sequence[Sequence[Any]]) -> str:
    """Align ``rows`` under ``headers`` in columns two spaces apart."""
    cells = [[str(h) for h in headers], *[[str(c) for c in row] for row in rows]]
    widths = [max(len(r[i]) for r in cells) for i in range(len(headers))]
    lines = ["  ".join(c.ljust(w) for c, w in zip(r, widths, strict=True)).rstrip() for r in cells]
    return "\n".join(lines)


def _tp(tp: TopicPartition) -> list[Any]:
    return [tp.topic, tp.partition]


def group_to_json(desc: GroupDescription, lag: Sequence[PartitionLag] = ()) -> dict[str, Any]:
    """A group description as plain JSON (what ``groups describe --json`` prints).

    ``partitions`` has one object per partition the group consumes or has an
    offset for: committed offset, log end, lag (both null where nothing is
    committed: there is no position to count from, as in Kafka's tool) and
    owner.
    """
    owner = {tp: m.member_id for m in desc.members for tp in m.partitions}
    return {
        "group": desc.group_id,
        "state": desc.state,
        "generation": desc.generation,
        "assignor": desc.assignor,
        "members": [
            {
                "member_id": m.member_id,
                "client_id": m.client_id,
                "host": m.host,
                "topics": m.topics,
                "session_timeout_ms": m.session_timeout_ms,
                "partitions": [_tp(tp) for tp in m.partitions],
                "instance_id": m.instance_id or None,
                "rebalance_protocol": m.rebalance_protocol,
                "generation": m.generation,
                "member_epoch": None if m.member_epoch < 0 else m.member_epoch,
                # The target is "partitions"; the current assignment differs from it only
                # while a rebalance moves partitions (what the member may still fetch).
                "current": [_tp(tp) for tp in (m.owned or m.partitions)],
                "current_not_shown": m.owned_more,
            }
            for m in desc.members
        ],
        "offsets": [
            {
                "topic": o.topic,
                "partition": o.partition,
                "committed": o.offset,
                "owner": owner.get(o.tp),
            }
            for o in desc.offsets
        ],
        "partitions": [
            {
                "topic": row.topic,
                "partition": row.partition,
                "committed": row.committed,
                "log_start": row.log_start,
                "log_end": row.log_end,
                "lag": None if row.committed is None else row.lag,
                "owner": row.owner or None,
            }
            for row in lag
        ],
    }


def _say(args: argparse.Namespace, as_json: Any, text: str) -> None:
    """Print ``as_json`` as JSON with ``--json``, else ``text``."""
    if args.json:
        _print_json(as_json)
    else:
        print(text, flush=True)


def kafka_topic_id(info: TopicInfo) -> str | None:
    """A topic's id as Kafka's tools print it (URL-safe base64 of the UUID, unpadded)."""
    if not info.topic_id:
        return None
    return base64.urlsafe_b64encode(bytes.fromhex(info.topic_id)).decode().rstrip("=")


def _topic_json(topics: Sequence[TopicInfo]) -> list[dict[str, Any]]:
    return [{"topic": t.name, "partitions": t.partitions} for t in topics]


def _topic_id_json(info: TopicInfo) -> dict[str, Any]:
    """A topic's id as ``topics describe --json`` gives it: Kafka's form, and as a UUID."""
    return {
        "topic_id": kafka_topic_id(info),
        "topic_uuid": str(uuid.UUID(hex=info.topic_id)) if info.topic_id else None,
    }


def describe_text(desc: GroupDescription, lag: Sequence[PartitionLag] = ()) -> str:
    """A group description as ``groups describe`` prints it for people."""
    lines = [
        f"group {desc.group_id}: {desc.state}, generation {desc.generation}, "
        f"assignor {desc.assignor or '-'}, {len(desc.members)} member(s)"
    ]
    if desc.members:
        rows = [
            [m.member_id, m.host, ",".join(m.topics), " ".join(map(str, m.partitions)) or "-"]
            for m in desc.members
        ]
        lines += ["", format_table(["MEMBER", "HOST", "TOPICS", "PARTITIONS"], rows)]
        kip848 = [m for m in desc.members if m.member_epoch >= 0]
        if kip848:
            # Kafka consumer-protocol (KIP-848) members: epoch, and target vs current.
            rows = [
                [
                    m.member_id,
                    str(m.member_epoch),
                    " ".join(map(str, m.partitions)) or "-",
                    (" ".join(map(str, m.owned)) + (f" (+{m.owned_more})" if m.owned_more else ""))
                    if m.owned
                    else "(= target)",
                ]
                for m in kip848
            ]
            lines += [
                "",
                format_table(["MEMBER", "EPOCH", "TARGET ASSIGNMENT", "CURRENT ASSIGNMENT"], rows),
            ]
    if lag:
        table = [
            [
                row.topic,
                row.partition,
                "-" if row.committed is None else row.committed,
                row.log_end,
                "-" if row.committed is None else row.lag,
                row.owner or "-",
            ]
            for row in lag
        ]
        counted = [row.lag for row in lag if row.committed is not None]
        total = f"total lag: {sum(counted)}"
        if len(counted) < len(lag):
            total += f" ({len(lag) - len(counted)} partition(s) with nothing committed: '-')"
        lines += [
            "",
            format_table(["TOPIC", "PARTITION", "COMMITTED", "LOG-END", "LAG", "OWNER"], table),
            total,
        ]
    return "\n".join(lines)


def _text(data: bytes | None) -> str | None:
    return None if data is None else data.decode("utf-8", errors="backslashreplace")


def _print_record(record: ConsumerRecord, as_json: bool) -> None:
    if as_json:
        _print_json(
            {
                "event": "record",
                "topic": record.topic,
                "partition": record.partition,
                "offset": record.offset,
                "timestamp": record.timestamp,
                "key": _text(record.key),
                "value": _text(record.value),
            }
        )
    else:
        key = "" if record.key is None else f"{_text(record.key)}: "
        print(
            f"{record.topic}-{record.partition}@{record.offset}  {key}{_text(record.value)}",
            flush=True,
        )
