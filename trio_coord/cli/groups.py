"""The ``groups`` commands: list, describe, create, delete, reset-offsets, delete-offsets.

This module turns the command line's partition choice (``--topic T[:P,...]``,
``--all-topics``, ``--from-file``) into partitions and a target; planning the new
offsets is the admin client's job (:meth:`~trio_coord.Admin.plan_offset_reset`).
"""

from __future__ import annotations

import argparse
import datetime
from typing import Any

from ..client import Admin, PartitionLag
from ..protocol.messages import GroupDescription, TopicPartition
from ._common import UsageError, _ask_admin
from .render import _say, _tp, describe_text, format_table, group_to_json


async def cmd_groups_list(args: argparse.Namespace) -> None:
    """List groups."""
    groups = await _ask_admin(args, lambda admin: admin.list_groups())
    rows = [[g.group_id, g.state, g.generation, g.members] for g in groups]
    _say(
        args,
        [dict(zip(("group", "state", "generation", "members"), row, strict=True)) for row in rows],
        format_table(["GROUP", "STATE", "GENERATION", "MEMBERS"], rows) if rows else "no groups",
    )


async def cmd_groups_describe(args: argparse.Namespace) -> None:
    """Describe one group, or every group (--all-groups: a JSON list, or texts one by one)."""
    if (args.group is None) == (not args.all_groups):
        raise UsageError("name one GROUP, or give --all-groups")

    async def ask(admin: Admin) -> list[tuple[GroupDescription, list[PartitionLag]]]:
        names = [args.group] if args.group else [g.group_id for g in await admin.list_groups()]
        return [(await admin.describe_group(n), await admin.group_lag(n)) for n in names]

    described = await _ask_admin(args, ask)
    if not args.all_groups:
        (desc, lag), *_ = described
        _say(args, group_to_json(desc, lag), describe_text(desc, lag))
        return
    _say(
        args,
        [group_to_json(desc, lag) for desc, lag in described],
        "\n\n".join(describe_text(desc, lag) for desc, lag in described) or "no groups",
    )


async def cmd_groups_create(args: argparse.Namespace) -> None:
    """Create an empty group."""
    await _ask_admin(args, lambda admin: admin.create_group(args.group))
    _say(args, {"group": args.group, "created": True}, f"created group {args.group}")


async def cmd_groups_delete(args: argparse.Namespace) -> None:
    """Delete an empty group."""
    await _ask_admin(args, lambda admin: admin.delete_group(args.group))
    _say(args, {"group": args.group, "deleted": True}, f"deleted group {args.group}")


def _parse_datetime(text: str) -> int:
    """An ISO 8601 time (local time if it names no zone) as milliseconds since the epoch."""
    try:
        when = datetime.datetime.fromisoformat(text)
    except ValueError:
        raise UsageError(
            f"--to-datetime {text!r} is not an ISO 8601 time (e.g. 2026-11-22T10:00:00+00:00)"
        ) from None
    if when.tzinfo is None:
        when = when.astimezone()
    return round(when.timestamp() * 1000)


def _topic_specs(args: argparse.Namespace) -> dict[str, set[int] | None]:
    """``--topic T`` / ``--topic T:0,1`` (Kafka's form, repeatable) as topic -> partitions
    (None: all of them); the older ``--partitions 0,1`` still narrows a single --topic."""
    specs: dict[str, set[int] | None] = {}
    for text in args.topic or ():
        name, colon, listed = text.partition(":")
        if not colon:
            specs[name] = None
            continue
        try:
            chosen = {int(p) for p in listed.split(",") if p.strip()}
        except ValueError:
            raise UsageError(
                f"--topic {text!r}: write TOPIC or TOPIC:P,P,... with partition numbers"
            ) from None
        specs[name] = (specs.get(name) or set()) | chosen
    if getattr(args, "partitions", None) is not None:
        if len(specs) != 1:
            raise UsageError("--partitions narrows one --topic; write --topic TOPIC:P,P instead")
        try:
            chosen = {int(p) for p in args.partitions.split(",") if p.strip()}
        except ValueError:
            raise UsageError(
                f"--partitions {args.partitions!r} is not a comma-separated list of numbers"
            ) from None
        (name,) = specs
        specs[name] = chosen
    return specs


async def _chosen_partitions(admin: Admin, args: argparse.Namespace) -> list[TopicPartition]:
    """The partitions --topic / --all-topics name (all-topics: every topic the group has
    offsets for); UsageError if that is none."""
    if getattr(args, "all_topics", False):
        committed = await admin.committed_offsets(args.group)
        specs: dict[str, set[int] | None] = {tp.topic: None for tp in committed}
        if not specs:
            raise UsageError(f"group {args.group} has no committed offsets (--all-topics)")
    else:
        specs = _topic_specs(args)
        if not specs:
            raise UsageError("say which partitions: --topic TOPIC[:P,P] or --all-topics")
    tps = [
        tp
        for tp in await admin.topic_partitions(specs)
        if specs[tp.topic] is None or tp.partition in specs[tp.topic]  # type: ignore[operator]
    ]
    if not tps:
        asked = "; ".join(
            f"topic {t} has none of the partitions {','.join(map(str, sorted(chosen or ())))}"
            for t, chosen in sorted(specs.items())
        )
        raise UsageError(asked)
    return tps


def _offsets_file(path: str) -> dict[TopicPartition, int]:
    """Kafka's reset CSV: ``topic,partition,offset`` per line (what --export prints there)."""
    targets: dict[TopicPartition, int] = {}
    try:
        with open(path, encoding="utf-8") as file:
            lines = file.read().splitlines()
    except OSError as exc:
        raise UsageError(f"--from-file {path}: {exc.strerror}") from None
    for number, line in enumerate(lines, 1):
        if not line.strip() or line.lstrip().startswith("#"):
            continue
        fields = [f.strip() for f in line.split(",")]
        try:
            topic, partition, offset = fields
            targets[TopicPartition(topic, int(partition))] = int(offset)
        except ValueError:
            raise UsageError(
                f"--from-file {path}, line {number}: {line!r} is not topic,partition,offset"
            ) from None
    if not targets:
        raise UsageError(f"--from-file {path} holds no topic,partition,offset line")
    return targets


async def cmd_groups_reset_offsets(args: argparse.Namespace) -> None:
    """Plan (and with --execute apply) new committed offsets for a group."""
    target = (
        args.to_earliest
        or args.to_latest
        or args.to_offset is not None
        or args.to_datetime is not None
        or args.shift_by is not None
    )
    if args.from_file and (target or args.topic or args.all_topics):
        raise UsageError(
            "--from-file gives the partitions and offsets itself: drop --topic, --all-topics "
            "and the --to-.../--shift-by target"
        )
    if not args.from_file and not target:
        raise UsageError(
            "say where to: --to-earliest, --to-latest, --to-offset N, --to-datetime ISO or "
            "--shift-by N (or give the offsets with --from-file)"
        )
    from_file = _offsets_file(args.from_file) if args.from_file else None
    when = None if args.to_datetime is None else _parse_datetime(args.to_datetime)

    async def ask(admin: Admin) -> list[dict[str, Any]]:
        tps = [] if from_file is not None else await _chosen_partitions(admin, args)
        try:
            planned = await admin.plan_offset_reset(
                args.group,
                tps,
                offsets=from_file,
                to_earliest=args.to_earliest,
                to_latest=args.to_latest,
                to_offset=args.to_offset,
                to_timestamp_ms=when,
                shift_by=args.shift_by,
                execute=args.execute,
            )
        except ValueError as exc:  # (the target was checked above: partitions that do not exist)
            if from_file is None:
                raise
            raise UsageError(f"--from-file {args.from_file}: {exc}") from None
        return [
            {"topic": p.topic, "partition": p.partition, "current": p.current, "new": p.new}
            for p in planned
        ]

    plan = await _ask_admin(args, ask)
    rows = [
        [r["topic"], r["partition"], "-" if r["current"] is None else r["current"], r["new"]]
        for r in plan
    ]
    verdict = (
        f"offsets of group {args.group} reset; running members restart from them"
        if args.execute
        else "dry run: nothing changed (add --execute to apply)"
    )
    _say(
        args,
        {"group": args.group, "executed": args.execute, "partitions": plan},
        format_table(["TOPIC", "PARTITION", "CURRENT", "NEW"], rows) + "\n" + verdict,
    )


async def cmd_groups_delete_offsets(args: argparse.Namespace) -> None:
    """Delete a group's committed offsets for a topic's partitions."""

    async def ask(admin: Admin) -> list[TopicPartition]:
        tps = await _chosen_partitions(admin, args)
        await admin.delete_offsets(args.group, tps)
        return tps

    tps = await _ask_admin(args, ask)
    _say(
        args,
        {"group": args.group, "deleted": [_tp(tp) for tp in tps]},
        f"deleted the offsets of group {args.group} for {len(tps)} partition(s) of "
        + ", ".join(sorted({tp.topic for tp in tps})),
    )
