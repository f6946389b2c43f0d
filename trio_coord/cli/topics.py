"""The ``topics`` commands: create, add partitions, delete, list and describe.

Each is one admin call through ``_ask_admin`` and one printed result.
"""

from __future__ import annotations

import argparse
import sys
from typing import Any

import trio

from ..client import Admin
from ..protocol.messages import TopicInfo, TopicPartition
from ._common import UsageError, _ask_admin
from .render import _say, _topic_id_json, _topic_json, format_table, kafka_topic_id


async def cmd_topics_create(args: argparse.Namespace) -> None:
    """Create a topic."""
    info = await _ask_admin(args, lambda admin: admin.create_topic(args.name, args.partitions))
    _say(
        args,
        _topic_json([info])[0],
        f"created topic {info.name} with {info.partitions} partition(s)",
    )


async def cmd_topics_add_partitions(args: argparse.Namespace) -> None:
    """Grow a topic."""
    info = await _ask_admin(args, lambda admin: admin.add_partitions(args.name, args.total))
    _say(args, _topic_json([info])[0], f"topic {info.name} now has {info.partitions} partition(s)")


async def cmd_topics_delete(args: argparse.Namespace) -> None:
    """Delete topics, after asking (unless --yes)."""
    names = sorted(set(args.names))

    async def delete(admin: Admin) -> list[TopicInfo]:
        topics = await admin.describe_topics(names)  # (UNKNOWN_TOPIC before deleting any)
        if not args.yes:
            what = ", ".join(f"{t.name} ({t.partitions} partitions)" for t in topics)
            if not sys.stdin.isatty():
                raise UsageError(
                    f"deleting {what} drops their records and every group's offsets of them; "
                    "add --yes to delete without being asked"
                )
            answer = await trio.to_thread.run_sync(
                input, f"delete {what}, their records and every group's offsets of them? [y/N] "
            )
            if answer.strip().lower() not in ("y", "yes"):
                raise UsageError("nothing deleted")
        for topic in topics:
            await admin.delete_topic(topic.name)
        return topics

    deleted = await _ask_admin(args, delete)
    _say(
        args,
        _topic_json(deleted),
        "\n".join(f"deleted topic {t.name} ({t.partitions} partitions)" for t in deleted),
    )


async def cmd_topics_list(args: argparse.Namespace) -> None:
    """List topics (all, or the ones named)."""
    topics = await _ask_admin(
        args,
        lambda admin: admin.describe_topics(args.names) if args.names else admin.list_topics(),
    )
    text = (
        format_table(["TOPIC", "PARTITIONS"], [[t.name, t.partitions] for t in topics])
        if topics
        else "no topics (create one with: trio-coord topics create NAME --partitions N)"
    )
    _say(args, _topic_json(topics), text)


async def cmd_topics_describe(args: argparse.Namespace) -> None:
    """Describe topics partition by partition, with their log offsets."""

    async def ask(admin: Admin) -> tuple[list[TopicInfo], dict[TopicPartition, Any]]:
        topics = await (
            admin.describe_topics(args.names, configs=True)
            if args.names
            else admin.list_topics(configs=True)
        )
        partitions = [TopicPartition(t.name, p) for t in topics for p in range(t.partitions)]
        return topics, await admin.list_offsets(partitions) if partitions else {}

    topics, offsets = await _ask_admin(args, ask)
    leaders = {
        TopicPartition(t.name, p): leader for t in topics for p, leader in enumerate(t.leaders)
    }
    rows = [
        [tp.topic, tp.partition, o.log_start, o.log_end, o.log_end - o.log_start]
        for tp, o in sorted(offsets.items())
    ]
    ids = format_table(
        ["TOPIC", "TOPIC-ID", "PARTITIONS"],
        [[t.name, kafka_topic_id(t) or "-", str(t.partitions)] for t in topics],
    )
    configs = [
        [t.name, name, value]
        for t in topics
        for name, value in [("partitions", str(t.partitions)), *sorted(t.configs.items())]
    ]
    _say(
        args,
        [
            {
                **_topic_json([t])[0],
                **_topic_id_json(t),
                "configs": dict(sorted(t.configs.items())),
                "offsets": [
                    {
                        "partition": r[1],
                        "log_start": r[2],
                        "log_end": r[3],
                        "leader": leaders.get(TopicPartition(t.name, r[1])),
                    }
                    for r in rows
                    if r[0] == t.name
                ],
            }
            for t in topics
        ],
        format_table(["TOPIC", "PARTITION", "LOG-START", "LOG-END", "RECORDS"], rows)
        + "\n\n"
        + ids
        + "\n\n"
        + format_table(["TOPIC", "CONFIG", "VALUE"], configs)
        if rows
        else "no topics (create one with: trio-coord topics create NAME --partitions N)",
    )
