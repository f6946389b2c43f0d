# PYTHON_ARGCOMPLETE_OK
"""The ``trio-coord`` command line: parse, call the public API, print.

Every subcommand is a thin shell over ``open_broker``, ``open_admin``,
``open_producer`` or ``open_consumer``: it prints tables for people and, with ``--json``, one JSON
document (or one JSON object per line for event streams) for scripts. Errors
a user can cause are printed as one ``error:`` line saying what to do, with
exit status 1 (2 for bad usage). SIGINT and SIGTERM stop a broker or a
consumer gracefully: the consumer leaves its group, the broker finishes its
writes.
"""

from __future__ import annotations

import argparse
import base64
import contextlib
import datetime
import json
import logging
import os
import signal
import sys
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable, Sequence
from typing import Any, TextIO, TypeVar

import msgspec
import trio

from . import __version__
from ._settings import SettingsError, apply_settings, effective_settings
from .broker import BrokerConfig, open_broker
from .broker.cluster import read_status
from .client import Admin, Consumer, Delivery, PartitionLag, open_admin, open_producer
from .log import LogConfig, LogError
from .protocol.errors import CoordError
from .protocol.messages import GroupDescription, TopicInfo, TopicPartition
from .protocol.records import COMPRESSION, ConsumerRecord
from .security import store as security_store
from .security.acl import CLUSTER, OPERATIONS, Acl, principal_of
from .security.client import PASSWORD_ENV, Sasl, client_ssl_context
from .security.scram import MECHANISMS
from .store import open_embedded_store, open_zookeeper_store
from .store.base import MetadataStore, StoreConnectionError, StoreError
from .store.zookeeper import require_zk_url

__all__ = ["main"]

DEFAULT_PORT = 9192
DEFAULT_BOOTSTRAP = f"127.0.0.1:{DEFAULT_PORT}"

_T = TypeVar("_T")


class UsageError(Exception):
    """A mistake in the command line that argparse could not catch."""


# -- output helpers ---------------------------------------------------------------------


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


# -- commands ------------------------------------------------------------------------------


def _timeouts(args: argparse.Namespace) -> dict[str, Any]:
    """``--timeout`` as the deadlines of an admin client (each wait at most that long), and
    ``--tls-ca``/``--user`` as its TLS and login."""
    return {
        "api_timeout": args.timeout,
        "request_timeout": min(30.0, args.timeout),
        **_security(args),
    }


def _security(args: argparse.Namespace) -> dict[str, Any]:
    """``ssl_context=`` and ``sasl=`` of a client, from ``--tls-ca``, ``--user`` and the
    password (``$TRIO_COORD_PASSWORD`` or ``--password-file``)."""
    options: dict[str, Any] = {}
    if getattr(args, "tls_ca", None):
        options["ssl_context"] = client_ssl_context(
            args.tls_ca, certfile=args.tls_cert, keyfile=args.tls_key
        )
    user = getattr(args, "user", None)
    if user:
        if args.password_file:
            try:
                with open(args.password_file, encoding="utf-8") as file:
                    password = file.read().rstrip("\r\n")
            except OSError as exc:
                raise UsageError(f"cannot read --password-file: {exc}") from None
        else:
            password = os.environ.get(PASSWORD_ENV, "")
        if not password:
            raise UsageError(
                f"--user {user} needs a password: set ${PASSWORD_ENV} or give --password-file"
            )
        options["sasl"] = Sasl(user, password, args.sasl_mechanism)
    return options


async def _ask_admin(args: argparse.Namespace, call: Callable[[Admin], Awaitable[_T]]) -> _T:
    """Run one admin call against ``--bootstrap``; no wait in it lasts over ``--timeout`` s."""
    async with open_admin(args.bootstrap, **_timeouts(args)) as admin:
        return await call(admin)


def _say(args: argparse.Namespace, as_json: Any, text: str) -> None:
    """Print ``as_json`` as JSON with ``--json``, else ``text``."""
    if args.json:
        _print_json(as_json)
    else:
        print(text, flush=True)


async def cmd_broker(args: argparse.Namespace) -> None:
    """Run a broker until SIGINT/SIGTERM."""
    config = BrokerConfig(
        broker_id=args.broker_id,
        min_session_timeout=args.min_session_timeout,
        max_session_timeout=args.max_session_timeout,
        max_rebalance_timeout=args.max_rebalance_timeout,
        offset_metadata_max_bytes=args.offset_metadata_max_bytes,
        max_connections=args.max_connections,
        max_connections_per_ip=args.max_connections_per_ip,
        connections_max_idle=args.connections_max_idle,
        request_read_timeout=args.request_read_timeout,
        queued_max_request_bytes=args.queued_max_request_bytes,
        group_retention=args.group_retention,
        offsets_retention=None if args.offsets_retention <= 0 else args.offsets_retention,
        rebalance_retry_backoff=args.rebalance_retry_backoff,
        rebalance_retry_backoff_max=args.rebalance_retry_backoff_max,
        coordinator_slots=args.coordinator_slots,
        zk_session_timeout=args.zk_session_timeout,
        initial_rebalance_delay=args.initial_rebalance_delay,
        repair=args.repair,
        tune_gc=True,  # this process runs a broker: its state is long-lived
        kafka_port=args.kafka_port,
        rack=args.rack,
        metrics_port=args.metrics_port,
        kafka_max_request_bytes=args.max_request_bytes,
        kafka_consumer_session_timeout=args.kafka_consumer_session_timeout,
        kafka_consumer_heartbeat_interval=args.kafka_consumer_heartbeat_interval,
        tls_cert=args.tls_cert,
        tls_key=args.tls_key,
        tls_client_ca=args.tls_client_ca,
        sasl_mechanisms=_names(args.sasl_mechanisms),
        super_users=_names(args.super_users),
        allow_plain_without_tls=args.allow_plain_without_tls,
        zk_auth=args.zk_auth,
        quota_produce_bytes=args.quota_produce_bytes,
        quota_fetch_bytes=args.quota_fetch_bytes,
        max_connections_per_principal=args.max_connections_per_principal,
        max_groups_per_principal=args.max_groups_per_principal,
        quota_requests=args.quota_requests,
        log=LogConfig(
            segment_bytes=args.segment_bytes,
            flush_interval=args.flush_interval,
            retention_seconds=None if args.retention_hours <= 0 else args.retention_hours * 3600,
            retention_bytes=None if args.retention_bytes <= 0 else args.retention_bytes,
        ),
    )
    async with open_broker(
        args.data_dir, args.host, args.port, config=config, store=args.store
    ) as broker:
        data_dir = os.path.abspath(args.data_dir)  # noqa: ASYNC240 (once, at start-up)
        where = f"cluster: {args.store}" if args.store else f"data dir: {data_dir}"
        kafka = metrics = None
        if broker.kafka_address is not None:
            kafka = f"{broker.kafka_address[0]}:{broker.kafka_address[1]}"
        if broker.metrics_address is not None:
            metrics = f"http://{broker.metrics_address[0]}:{broker.metrics_address[1]}/metrics"
        _say(
            args,
            {
                "event": "listening",
                "address": broker.bootstrap,
                "data_dir": data_dir,
                "broker_id": args.broker_id,
                "store": args.store,
                "kafka_address": kafka,
                "metrics_url": metrics,
            },
            f"trio-coord broker {args.broker_id} listening on {broker.bootstrap}"
            + ("" if kafka is None else f", Kafka clients on {kafka}")
            + ("" if metrics is None else f", metrics at {metrics}")
            + f"\n{where}  (Ctrl-C to stop)",
        )
        await _until_signalled()


def kafka_topic_id(info: TopicInfo) -> str | None:
    """A topic's id as Kafka's tools print it (URL-safe base64 of the UUID, unpadded)."""
    if not info.topic_id:
        return None
    return base64.urlsafe_b64encode(bytes.fromhex(info.topic_id)).decode().rstrip("=")


def _names(text: str | None) -> tuple[str, ...]:
    """``"a, b"`` → ``("a", "b")``."""
    return tuple(n.strip() for n in (text or "").split(",") if n.strip())


# -- users and ACLs ------------------------------------------------------------------------


@contextlib.asynccontextmanager
async def _offline_store(args: argparse.Namespace) -> AsyncIterator[MetadataStore | None]:
    """The store named by ``--store``/``--data-dir`` (offline), or None: through a broker."""
    if args.store:
        async with open_zookeeper_store(args.store, auth=args.zk_auth) as store:
            yield store
    elif args.data_dir:
        async with open_embedded_store(args.data_dir) as store:
            yield store
    else:
        yield None


def _read_new_password(args: argparse.Namespace) -> str:
    if not args.password_stdin:
        raise UsageError("give the new password on stdin with --password-stdin")
    password = sys.stdin.readline().rstrip("\r\n")
    if not password:
        raise UsageError("the password read from stdin is empty")
    return password


async def cmd_users(args: argparse.Namespace) -> None:
    """users add / list / delete, offline on a store or through a broker as a super user."""
    password = _read_new_password(args) if args.action == "add" else ""
    mechanisms = getattr(args, "mechanism", None) or ["SCRAM-SHA-256", "SCRAM-SHA-512"]
    async with _offline_store(args) as store:
        if store is not None:
            if args.action == "add":
                await security_store.add_user(store, args.name, password, mechanisms)
                result: Any = True
            elif args.action == "delete":
                result = await security_store.delete_user(store, args.name)
            else:
                result = await security_store.list_users(store)
        else:
            async with open_admin(args.bootstrap, **_timeouts(args)) as admin:
                if args.action == "add":
                    await admin.add_user(args.name, password, mechanisms)
                    result = True
                elif args.action == "delete":
                    result = await admin.delete_user(args.name)
                else:
                    result = await admin.list_users()
    if args.action == "list":
        lines = [f"{name}  {', '.join(m)}" for name, m in sorted(result.items())]
        _say(args, result, "\n".join(lines) or "(no users)")
    elif args.action == "add":
        _say(args, {"user": args.name, "mechanisms": mechanisms}, f"user {args.name} saved")
    else:
        if not result:
            raise UsageError(f"there is no user {args.name!r}")
        _say(args, {"user": args.name, "deleted": True}, f"user {args.name} deleted")


def _acl_of(args: argparse.Namespace) -> Acl:
    chosen = [x for x in (args.topic, args.group) if x is not None] + (
        ["c"] if args.cluster else []
    )
    if len(chosen) != 1:
        raise UsageError("give exactly one resource: --topic T, --group G or --cluster")
    if args.topic is not None:
        kind, name = "topic", args.topic
    elif args.group is not None:
        kind, name = "group", args.group
    else:
        kind, name = "cluster", CLUSTER
    try:
        return Acl(
            principal=principal_of(args.principal),
            operation=args.operation,
            resource_type=kind,
            name=name,
            prefixed=args.prefixed,
        ).check()
    except ValueError as exc:
        raise UsageError(str(exc)) from None


async def cmd_acls(args: argparse.Namespace) -> None:
    """acls add / list / remove, offline on a store or through a broker as a super user."""
    acl = _acl_of(args) if args.action != "list" else None
    async with _offline_store(args) as store:
        if store is not None:
            if args.action == "add":
                assert acl is not None
                result: Any = await security_store.add_acl(store, acl)
            elif args.action == "remove":
                assert acl is not None
                result = await security_store.remove_acls(store, acl)
            else:
                result = await security_store.list_acls(store)
        else:
            async with open_admin(args.bootstrap, **_timeouts(args)) as admin:
                if args.action == "add":
                    assert acl is not None
                    result = await admin.add_acl(acl)
                elif args.action == "remove":
                    assert acl is not None
                    result = await admin.remove_acl(acl)
                else:
                    result = await admin.list_acls()
    if args.action == "list":
        _say(
            args,
            [msgspec.to_builtins(a) for a in result],
            "\n".join(a.describe() for a in result) or "(no ACLs)",
        )
    elif args.action == "add":
        assert acl is not None
        _say(args, {"added": bool(result)}, acl.describe() + ("" if result else " (already)"))
    else:
        if not result:
            raise UsageError("no ACL matched")
        _say(args, {"removed": result}, f"{result} ACL(s) removed")


def _topic_json(topics: Sequence[TopicInfo]) -> list[dict[str, Any]]:
    return [{"topic": t.name, "partitions": t.partitions} for t in topics]


def _topic_id_json(info: TopicInfo) -> dict[str, Any]:
    """A topic's id as ``topics describe --json`` gives it: Kafka's form, and as a UUID."""
    return {
        "topic_id": kafka_topic_id(info),
        "topic_uuid": str(uuid.UUID(hex=info.topic_id)) if info.topic_id else None,
    }


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

    async def ask(admin: Admin) -> list[dict[str, Any]]:
        if from_file is not None:
            tps = sorted(from_file)
            known = set(await admin.topic_partitions({tp.topic for tp in tps}))
            missing = [str(tp) for tp in tps if tp not in known]
            if missing:
                raise UsageError(f"--from-file names partitions that do not exist: {missing}")
        else:
            tps = await _chosen_partitions(admin, args)
        committed = await admin.committed_offsets(args.group, tps)
        bounds = await admin.list_offsets(tps)
        if from_file is not None:
            targets = from_file
        elif args.to_datetime is not None:
            targets = {
                tp: o.offset
                for tp, o in (
                    await admin.list_offsets(tps, _parse_datetime(args.to_datetime))
                ).items()
            }
        elif args.to_earliest:
            targets = {tp: bounds[tp].log_start for tp in tps}
        elif args.to_latest:
            targets = {tp: bounds[tp].log_end for tp in tps}
        elif args.to_offset is not None:
            targets = {tp: args.to_offset for tp in tps}
        else:
            targets = {tp: committed.get(tp, bounds[tp].log_end) + args.shift_by for tp in tps}
        # Like kafka-consumer-groups: a target outside the log is clamped into it.
        new = {tp: min(max(targets[tp], bounds[tp].log_start), bounds[tp].log_end) for tp in tps}
        if args.execute:
            await admin.reset_offsets(args.group, new)
        return [
            {
                "topic": tp.topic,
                "partition": tp.partition,
                "current": committed.get(tp),
                "new": new[tp],
            }
            for tp in tps
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


async def cmd_produce(args: argparse.Namespace) -> None:
    """Send each line of stdin as one record."""
    sent = 0
    async with open_producer(
        args.bootstrap,
        compression=args.compression,
        delivery_timeout=args.timeout,
        max_block=args.timeout,
        request_timeout=min(30.0, args.timeout),
        close_timeout=args.timeout,
        **_security(args),
    ) as producer:
        deliveries: list[Delivery] = []
        stdin = trio.wrap_file(sys.stdin)
        async for line in stdin:
            text = line.rstrip("\n")
            key: str | None = None
            if args.key_separator:
                key, sep, value = text.partition(args.key_separator)
                if not sep:
                    await _report_deliveries(args, deliveries)  # what came before is stored
                    raise UsageError(
                        f"line {sent + 1} has no key separator {args.key_separator!r}: "
                        f"{text!r}; the {sent} line(s) before it were produced, none after"
                    )
            else:
                value = text
            deliveries.append(
                await producer.enqueue(args.topic, value, key=key, partition=args.partition)
            )
            sent += 1
            if len(deliveries) >= 1000:
                await _report_deliveries(args, deliveries)
        await _report_deliveries(args, deliveries)
    if not args.json:
        print(f"produced {sent} record(s) to {args.topic}", file=sys.stderr, flush=True)


async def _report_deliveries(args: argparse.Namespace, deliveries: list[Delivery]) -> None:
    for delivery in deliveries:
        meta = await delivery
        if args.json:
            _print_json({"topic": meta.topic, "partition": meta.partition, "offset": meta.offset})
    deliveries.clear()


def _text(data: bytes | None) -> str | None:
    return None if data is None else data.decode("utf-8", errors="backslashreplace")


async def cmd_consume(args: argparse.Namespace) -> None:
    """Join a group, print its records and membership events until SIGINT/SIGTERM.

    Text: records on stdout, events on stderr (as kcat and Kafka's console
    consumer keep them apart). JSON: one object per line on stdout, records
    and events alike (``"event"`` tells them apart).
    """
    if args.json and args.events == "text":
        raise UsageError(
            "--json prints records and events as JSON lines; drop --events text (or --json)"
        )
    as_json = args.events == "json" or args.json

    def emit(event: str, partitions: list[TopicPartition] | None = None, **extra: Any) -> None:
        record: dict[str, Any] = {
            "event": event,
            "member_id": consumer.member_id,
            "generation": consumer.generation,
        }
        if partitions is not None:
            record["partitions"] = [_tp(tp) for tp in partitions]
        record.update(extra)
        if as_json:
            _print_json(record)
        else:
            parts = " ".join(str(tp) for tp in partitions or []) or "-"
            print(
                f"{event:>8}  {record['member_id']}  generation {record['generation']}  {parts}",
                file=sys.stderr,
                flush=True,
            )

    consumer = Consumer(
        args.bootstrap,
        args.group,
        args.topics,
        session_timeout=args.session_timeout,
        rebalance_timeout=args.rebalance_timeout,
        offset_reset=args.offset_reset,
        assignors=args.assignor or None,
        auto_commit=not args.no_auto_commit,
        client_id=args.client_id,
        rebalance_protocol=args.rebalance_protocol,
        instance_id=args.instance_id,
        on_assigned=lambda ps: emit("assigned", ps),
        on_revoked=lambda ps: emit("revoked", ps),
        on_lost=lambda ps: emit("lost", ps),
        api_timeout=args.timeout,
        request_timeout=min(30.0, args.timeout),
        **_security(args),
    )
    async with consumer:
        emit("joined", pid=os.getpid())
        async with open_admin(args.bootstrap, **_timeouts(args)) as admin:
            existing = {t.name for t in await admin.list_topics()}
        for topic in sorted(t for t in set(args.topics) - existing if not t.startswith("re:")):
            print(
                f"warning: topic {topic!r} does not exist yet; its partitions will be "
                f"assigned once it is created (trio-coord topics create {topic} --partitions N)",
                file=sys.stderr,
                flush=True,
            )
        async with trio.open_nursery() as nursery:

            async def stop_on_signal() -> None:
                await _until_signalled()
                nursery.cancel_scope.cancel()

            nursery.start_soon(stop_on_signal)
            printed = 0
            async for record in consumer:
                _print_record(record, as_json)
                printed += 1
                if args.max_records is not None and printed >= args.max_records:
                    break
            nursery.cancel_scope.cancel()
    emit("left")


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


async def _until_signalled() -> None:
    with trio.open_signal_receiver(signal.SIGINT, signal.SIGTERM) as signals:
        async for _ in signals:
            return


async def cmd_demo(args: argparse.Namespace) -> None:
    """Run the guided demo."""
    from .demo import run_demo

    await run_demo(partitions=args.partitions, session_timeout=args.session_timeout)


# -- the parser -------------------------------------------------------------------------


def _add_client_options(p: argparse.ArgumentParser, *, timeout: bool = True) -> None:
    p.add_argument(
        "--bootstrap",
        "-b",
        default=os.environ.get("TRIO_COORD_BOOTSTRAP", DEFAULT_BOOTSTRAP),
        help="brokers to contact, host:port[,host:port...] "
        "(default: $TRIO_COORD_BOOTSTRAP or %(default)s)",
    )
    p.add_argument("--json", action="store_true", help="print JSON for scripts")
    p.add_argument(
        "--tls-ca",
        metavar="FILE",
        default=os.environ.get("TRIO_COORD_TLS_CA"),
        help="connect with TLS, trusting the CA in this PEM file (default: $TRIO_COORD_TLS_CA)",
    )
    p.add_argument("--tls-cert", metavar="FILE", help="client certificate (PEM), with --tls-ca")
    p.add_argument("--tls-key", metavar="FILE", help="its private key (PEM)")
    p.add_argument(
        "--user",
        default=os.environ.get("TRIO_COORD_USER"),
        help="log in as this user (SASL); the password comes from $TRIO_COORD_PASSWORD or "
        "--password-file (default: $TRIO_COORD_USER)",
    )
    p.add_argument("--password-file", metavar="FILE", help="read --user's password from FILE")
    p.add_argument(
        "--sasl-mechanism",
        default="SCRAM-SHA-256",
        choices=MECHANISMS,
        help="how --user logs in (default: %(default)s)",
    )
    if timeout:
        p.add_argument(
            "--timeout",
            type=_positive_seconds,
            default=10.0,
            metavar="SECONDS",
            help="give up if no broker answers within this many seconds (default: %(default)s)",
        )


def _add_store_options(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--data-dir",
        help="work offline on this stopped broker's embedded store (instead of --bootstrap)",
    )
    p.add_argument(
        "--store",
        metavar="zk://HOST:PORT[,...]/CHROOT",
        help="work offline on this ZooKeeper chroot (instead of --bootstrap)",
    )
    p.add_argument(
        "--zk-auth",
        metavar="USER:PASSWORD",
        default=os.environ.get("TRIO_COORD_ZK_AUTH"),
        help="ZooKeeper digest credentials of the brokers (default: $TRIO_COORD_ZK_AUTH)",
    )


def _positive_seconds(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a number of seconds") from None
    if not value > 0:
        raise argparse.ArgumentTypeError(f"must be more than 0 seconds, not {text}")
    return value


def _positive_int(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a whole number") from None
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be at least 1, not {value}")
    return value


LOG_LEVELS = ("DEBUG", "INFO", "WARNING", "ERROR")


def _subparser(parser: argparse.ArgumentParser, name: str) -> argparse.ArgumentParser:
    """The parser of command ``name``."""
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            return action.choices[name]
    raise KeyError(name)


def _log_level_everywhere(parser: argparse.ArgumentParser) -> None:
    """Let every command take ``--log-level`` too (``trio-coord broker --log-level DEBUG``),
    without a default of its own that would hide one given before the command."""
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for child in action.choices.values():
                if "--log-level" not in child._option_string_actions:
                    child.add_argument(
                        "--log-level",
                        type=str.upper,
                        choices=LOG_LEVELS,
                        default=argparse.SUPPRESS,
                        help="logging level on stderr (see trio-coord --help)",
                    )
                _log_level_everywhere(child)


def _log_level(args: argparse.Namespace) -> str:
    """--log-level, else $TRIO_COORD_LOG_LEVEL, else the command's default, else WARNING."""
    if args.log_level:
        return str(args.log_level)
    env = os.environ.get("TRIO_COORD_LOG_LEVEL", "").strip().upper()
    if env:
        if env not in LOG_LEVELS:
            raise UsageError(f"TRIO_COORD_LOG_LEVEL={env!r} is not one of {', '.join(LOG_LEVELS)}")
        return env
    return str(getattr(args, "log_default", "WARNING"))


def _add_partition_choice(p: argparse.ArgumentParser, what: str) -> None:
    """--topic T[:P,P] (repeatable, as in Kafka's tools) or --all-topics."""
    p.add_argument(
        "--topic",
        "-t",
        action="append",
        metavar="TOPIC[:P,P]",
        help=f"a topic {what}, or only the partitions listed after ':' (repeatable)",
    )
    p.add_argument(
        "--all-topics", action="store_true", help="every topic the group has offsets for"
    )
    p.add_argument("--partitions", metavar="P,P", help=argparse.SUPPRESS)  # (older form)


def build_parser() -> argparse.ArgumentParser:
    """The argument parser of ``trio-coord`` (exposed for docs and tests)."""
    parser = argparse.ArgumentParser(
        prog="trio-coord",
        description="A consumer-group coordinator for partitioned logs, built on Trio.",
        epilog="Start with 'trio-coord demo', or run a broker with 'trio-coord broker' and "
        "use the other commands against it. Each command has --help.",
    )
    parser.add_argument("--version", action="version", version=f"trio-coord {__version__}")
    parser.add_argument(
        "--log-level",
        type=str.upper,
        choices=LOG_LEVELS,
        help="logging level on stderr, before or after the command (default: "
        "$TRIO_COORD_LOG_LEVEL, else WARNING; 'broker' and 'demo' default to INFO)",
    )
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")

    p = sub.add_parser(
        "broker",
        help="run a broker on the embedded store",
        description="Run a broker that keeps its metadata (topics, groups, offsets) in an "
        "embedded, crash-safe store in --data-dir, and its partitions' records in "
        "--data-dir/partitions. Stop it with Ctrl-C or SIGTERM.",
    )
    p.add_argument(
        "--data-dir",
        default="./trio-coord-data",
        help="where metadata and records are kept (default: %(default)s)",
    )
    p.add_argument(
        "--host", default="127.0.0.1", help="address to listen on (default: %(default)s)"
    )
    p.add_argument(
        "--port",
        type=int,
        default=DEFAULT_PORT,
        help="port to listen on; 0 picks a free one (default: %(default)s)",
    )
    p.add_argument(
        "--broker-id", type=int, default=0, help="this broker's id (default: %(default)s)"
    )
    p.add_argument(
        "--store",
        default=None,
        metavar="zk://HOST:PORT[,...]/CHROOT",
        help="join the cluster of brokers on this ZooKeeper chroot (metadata lives there; "
        "records stay in --data-dir/partitions); default: the embedded store in --data-dir",
    )
    p.add_argument(
        "--coordinator-slots",
        type=int,
        default=16,
        metavar="N",
        help="cluster: coordinator slots groups hash onto, fixed per cluster "
        "(default: %(default)s)",
    )
    p.add_argument(
        "--zk-session-timeout",
        type=float,
        default=6.0,
        metavar="SECONDS",
        help="cluster: ZooKeeper session timeout; a dead broker's groups move this long "
        "after it died (default: %(default)s)",
    )
    p.add_argument(
        "--min-session-timeout",
        type=float,
        default=1.0,
        metavar="SECONDS",
        help="smallest session timeout consumers may ask for (default: %(default)s)",
    )
    p.add_argument(
        "--max-session-timeout",
        type=float,
        default=300.0,
        metavar="SECONDS",
        help="largest session timeout consumers may ask for; a member that vanishes keeps "
        "the partitions it held fenced that long (default: %(default)s)",
    )
    p.add_argument(
        "--max-rebalance-timeout",
        type=float,
        default=300.0,
        metavar="SECONDS",
        help="largest rebalance timeout consumers may ask for; a member that does not "
        "answer holds its group's rebalance that long (default: %(default)s)",
    )
    p.add_argument(
        "--offset-metadata-max-bytes",
        type=int,
        default=4096,
        metavar="BYTES",
        help="most metadata one committed offset may carry; more is refused with "
        "OFFSET_METADATA_TOO_LARGE (default: %(default)s)",
    )
    p.add_argument(
        "--group-retention",
        type=float,
        default=600.0,
        metavar="SECONDS",
        help="remove groups empty and without offsets for this long (default: %(default)s)",
    )
    p.add_argument(
        "--offsets-retention",
        type=float,
        default=7 * 24 * 3600.0,
        metavar="SECONDS",
        help="delete an empty group's committed offsets once it has been empty this long "
        "(Kafka's offsets.retention.minutes; 0: keep them; default: %(default)s = 7 days)",
    )
    p.add_argument(
        "--rebalance-retry-backoff",
        type=float,
        default=1.0,
        metavar="SECONDS",
        help="retry a failed rebalance (store outage) after this long, doubling per failure "
        "(default: %(default)s)",
    )
    p.add_argument(
        "--rebalance-retry-backoff-max",
        type=float,
        default=30.0,
        metavar="SECONDS",
        help="the longest wait between rebalance retries (default: %(default)s)",
    )
    p.add_argument(
        "--initial-rebalance-delay",
        type=float,
        default=0.1,
        metavar="SECONDS",
        help="a new group's first rebalance waits this long for more joins (default: %(default)s)",
    )
    p.add_argument(
        "--flush-interval",
        type=float,
        default=0.0,
        metavar="SECONDS",
        help="0: fsync every produced batch before acknowledging it (group commit); "
        "otherwise acknowledge at once and fsync this often (default: %(default)s)",
    )
    p.add_argument(
        "--retention-hours",
        type=float,
        default=168.0,
        metavar="HOURS",
        help="delete log segments older than this; 0 keeps them (default: %(default)s)",
    )
    p.add_argument(
        "--retention-bytes",
        type=int,
        default=0,
        metavar="BYTES",
        help="per partition, delete the oldest segments beyond this size; 0: no limit",
    )
    p.add_argument(
        "--segment-bytes",
        type=int,
        default=LogConfig().segment_bytes,
        metavar="BYTES",
        help="roll a partition's log to a new segment file past this size (default: %(default)s)",
    )
    p.add_argument(
        "--max-connections",
        type=int,
        default=None,
        metavar="N",
        help="client connections at once; more are refused (default: 10000, or fewer if "
        "ulimit -n cannot hold that many; an explicit value it cannot hold stops start-up)",
    )
    p.add_argument(
        "--max-connections-per-ip",
        type=int,
        default=BrokerConfig().max_connections_per_ip,
        metavar="N",
        help="client connections at once from one address (default: %(default)s)",
    )
    p.add_argument(
        "--connections-max-idle",
        type=float,
        default=BrokerConfig().connections_max_idle,
        metavar="SECONDS",
        help="close a connection with nothing in flight that sent nothing for this long "
        "(default: %(default)s)",
    )
    p.add_argument(
        "--request-read-timeout",
        type=float,
        default=BrokerConfig().request_read_timeout,
        metavar="SECONDS",
        help="close a connection whose frame does not arrive whole within this long of its "
        "first byte (default: %(default)s)",
    )
    p.add_argument(
        "--queued-max-request-bytes",
        type=int,
        default=BrokerConfig().queued_max_request_bytes,
        metavar="BYTES",
        help="memory all connections' requests (and fetch answers) may hold at once; "
        "readers wait beyond it (default: %(default)s)",
    )
    p.add_argument(
        "--repair",
        action="store_true",
        help="while starting, repair damaged partition segments and a damaged metadata log: "
        "move the damaged bytes aside, keep every intact batch and record, never reuse an "
        "offset (what the damaged bytes held is lost; the log says what)",
    )
    p.add_argument(
        "--metrics-port",
        type=int,
        default=None,
        metavar="PORT",
        help="serve Prometheus metrics at http://HOST:PORT/metrics; 0 picks a free port "
        "(default: none; docs/operations.md lists the metrics)",
    )
    p.add_argument(
        "--kafka-port",
        type=int,
        default=None,
        metavar="PORT",
        help="also listen for Kafka clients on this port; 0 picks a free one (default: no "
        "Kafka listener; see docs/kafka.md)",
    )
    p.add_argument(
        "--rack",
        default="",
        metavar="NAME",
        help="the rack (availability zone) this broker runs in: Kafka Metadata tells "
        "clients, and the server assignors prefer giving each member partitions held by "
        "brokers of its own rack (client.rack; default: none; docs/assignment.md)",
    )
    p.add_argument(
        "--max-request-bytes",
        type=int,
        default=BrokerConfig().kafka_max_request_bytes,
        metavar="BYTES",
        help="close a Kafka connection that announces a larger request, before reading it "
        "(default: %(default)s)",
    )
    p.add_argument(
        "--kafka-consumer-session-timeout",
        type=float,
        default=BrokerConfig().kafka_consumer_session_timeout,
        metavar="SECONDS",
        help="session timeout of Kafka group.protocol=consumer (KIP-848) members, as Kafka's "
        "group.consumer.session.timeout.ms (default: %(default)s)",
    )
    p.add_argument(
        "--kafka-consumer-heartbeat-interval",
        type=float,
        default=BrokerConfig().kafka_consumer_heartbeat_interval,
        metavar="SECONDS",
        help="heartbeat interval told to KIP-848 members (Kafka's "
        "group.consumer.heartbeat.interval.ms); they learn assignment changes at their next "
        "heartbeat (default: %(default)s)",
    )
    p.add_argument(
        "--tls-cert",
        metavar="FILE",
        help="PEM certificate (chain): both listeners then speak TLS only (docs/security.md)",
    )
    p.add_argument("--tls-key", metavar="FILE", help="PEM private key of --tls-cert")
    p.add_argument(
        "--tls-client-ca",
        metavar="FILE",
        help="require client certificates signed by this CA; their CN is the principal",
    )
    p.add_argument(
        "--sasl-mechanisms",
        metavar="LIST",
        help="require every connection to log in with one of these (SCRAM-SHA-256,"
        "SCRAM-SHA-512,PLAIN); authorization is then deny by default (trio-coord acls)",
    )
    p.add_argument(
        "--super-users",
        metavar="NAMES",
        help="users (comma-separated) that bypass ACLs",
    )
    p.add_argument(
        "--quota-produce-bytes",
        type=float,
        metavar="BYTES/S",
        help="bytes per second one principal may produce; answers beyond are delayed "
        "(default: no quota)",
    )
    p.add_argument(
        "--quota-fetch-bytes",
        type=float,
        metavar="BYTES/S",
        help="bytes per second one principal may fetch; answers beyond are delayed "
        "(default: no quota)",
    )
    p.add_argument(
        "--quota-requests",
        type=float,
        metavar="N/S",
        help="requests per second one principal may send; answers beyond are delayed "
        "(default: no quota)",
    )
    p.add_argument(
        "--max-connections-per-principal",
        type=int,
        metavar="N",
        help="connections at once of one user (or of all anonymous clients); more are "
        "refused (default: no limit)",
    )
    p.add_argument(
        "--max-groups-per-principal",
        type=int,
        metavar="N",
        help="groups one user (or all anonymous clients) may have members in on this broker; "
        "a join beyond is refused (default: no limit)",
    )
    p.add_argument(
        "--zk-auth",
        metavar="USER:PASSWORD",
        help="cluster: log in to ZooKeeper with these digest credentials; the nodes the "
        "brokers create are then readable and writable by that user only",
    )
    p.add_argument(
        "--allow-plain-without-tls",
        action="store_true",
        help="offer PLAIN (passwords in the clear) without TLS, on a trusted network",
    )
    p.add_argument("--json", action="store_true", help="announce the listening address as JSON")
    p.add_argument(
        "--config",
        metavar="FILE",
        help="read settings from this TOML file: each key is a flag above without its "
        "dashes (max-connections = 5000); TRIO_COORD_<FLAG> variables "
        "(TRIO_COORD_MAX_CONNECTIONS) override it, and flags override both",
    )
    p.add_argument(
        "--print-config",
        action="store_true",
        help="print every setting in force and where it came from, then exit",
    )
    p.set_defaults(func=cmd_broker, log_default="INFO")

    users = sub.add_parser(
        "users",
        help="add, list and delete users (SCRAM credentials)",
        description="Users that log in with SASL. Offline on a stopped broker's --data-dir or "
        "on --store zk://... (to make the first super user), or through a broker as a "
        "super user (--bootstrap, --user).",
    ).add_subparsers(dest="action", required=True, metavar="ACTION")
    for action, text in (
        ("add", "create a user, or give it a new password (read from stdin)"),
        ("list", "list users and their mechanisms"),
        ("delete", "delete a user"),
    ):
        p = users.add_parser(action, help=text, description=text[0].upper() + text[1:] + ".")
        if action != "list":
            p.add_argument("name")
        if action == "add":
            p.add_argument(
                "--password-stdin", action="store_true", help="read the password from stdin"
            )
            p.add_argument(
                "--mechanism",
                action="append",
                choices=["SCRAM-SHA-256", "SCRAM-SHA-512"],
                help="store credentials for this mechanism (repeat; default: both)",
            )
        _add_store_options(p)
        _add_client_options(p)
        p.set_defaults(func=cmd_users)

    acls = sub.add_parser(
        "acls",
        help="add, list and remove ACLs (who may do what)",
        description="ACLs grant a principal an operation on a topic, a group or the cluster; "
        "with authentication on, everything else is denied. Offline on --data-dir / --store, "
        "or through a broker as a super user.",
    ).add_subparsers(dest="action", required=True, metavar="ACTION")
    for action, text in (
        ("add", "grant an operation"),
        ("list", "list every ACL"),
        ("remove", "revoke an operation (all: every operation on the resource)"),
    ):
        p = acls.add_parser(action, help=text, description=text[0].upper() + text[1:] + ".")
        if action != "list":
            p.add_argument("--principal", required=True, help="User:NAME (or User:* for all)")
            p.add_argument("--operation", required=True, choices=OPERATIONS)
            p.add_argument("--topic", help="a topic (* for every topic)")
            p.add_argument("--group", help="a group (* for every group)")
            p.add_argument("--cluster", action="store_true", help="the cluster")
            p.add_argument("--prefixed", action="store_true", help="the name is a prefix of names")
        _add_store_options(p)
        _add_client_options(p)
        p.set_defaults(func=cmd_acls)

    topics = sub.add_parser(
        "topics", help="create, grow, delete, list and describe topics"
    ).add_subparsers(dest="action", required=True, metavar="ACTION")
    p = topics.add_parser(
        "create", help="create a topic", description="Create a topic with N partitions."
    )
    p.add_argument("name")
    p.add_argument("--partitions", "-p", type=int, required=True, help="number of partitions")
    _add_client_options(p)
    p.set_defaults(func=cmd_topics_create)
    p = topics.add_parser(
        "add-partitions",
        help="grow a topic",
        description="Grow a topic to a new, larger partition count; subscribed groups rebalance.",
    )
    p.add_argument("name")
    p.add_argument("--total", type=int, required=True, help="the new partition count")
    _add_client_options(p)
    p.set_defaults(func=cmd_topics_add_partitions)
    p = topics.add_parser(
        "delete",
        help="delete topics, their records and groups' offsets of them",
        description="Delete topics: their records on every broker, and every group's "
        "committed offsets of them; groups subscribed to them rebalance without them. A topic "
        "created again under the same name starts empty. Asks first unless --yes.",
    )
    p.add_argument("names", nargs="+", metavar="NAME")
    p.add_argument("--yes", "-y", action="store_true", help="do not ask for confirmation")
    _add_client_options(p)
    p.set_defaults(func=cmd_topics_delete)
    for action, func, text in (
        ("list", cmd_topics_list, "list topics and their partition counts"),
        (
            "describe",
            cmd_topics_describe,
            "show each partition's log start and end offsets, and the topic's configs",
        ),
    ):
        p = topics.add_parser(
            action, help=text, description=text[0].upper() + text[1:] + " (all, or the ones named)."
        )
        p.add_argument("names", nargs="*", metavar="NAME")
        _add_client_options(p)
        p.set_defaults(func=func)

    cluster = sub.add_parser(
        "cluster", help="inspect a cluster of brokers on ZooKeeper"
    ).add_subparsers(dest="action", required=True, metavar="ACTION")
    p = cluster.add_parser(
        "status",
        help="brokers, coordinator slots and their holders, groups per coordinator",
        description="Read a cluster's state from its ZooKeeper chroot: the live brokers, "
        "which broker holds each coordinator slot, and the groups each coordinates.",
    )
    p.add_argument("--store", required=True, metavar="zk://HOST:PORT[,...]/CHROOT")
    p.add_argument("--json", action="store_true", help="print JSON")
    p.add_argument(
        "--timeout",
        type=float,
        default=10.0,
        metavar="SECONDS",
        help="give up if ZooKeeper does not answer within this long (default: %(default)s)",
    )
    # (kazoo warns of each failed connection attempt: noise here, where the
    # command's own error line says what went wrong)
    p.set_defaults(func=cmd_cluster_status, log_default="ERROR")

    groups = sub.add_parser(
        "groups", help="list, describe, create and delete consumer groups"
    ).add_subparsers(dest="action", required=True, metavar="ACTION")
    p = groups.add_parser(
        "list", help="list groups", description="List every group of every live broker."
    )
    _add_client_options(p)
    p.set_defaults(func=cmd_groups_list)
    for action, func, text in (
        (
            "describe",
            cmd_groups_describe,
            "show state, members, and per partition the committed offset, log end, lag and owner",
        ),
        ("create", cmd_groups_create, "create an empty group"),
        ("delete", cmd_groups_delete, "delete an empty group and its offsets"),
    ):
        p = groups.add_parser(action, help=text, description=text[0].upper() + text[1:] + ".")
        if action == "describe":
            p.add_argument("group", nargs="?")
            p.add_argument("--all-groups", action="store_true", help="every group of every broker")
        else:
            p.add_argument("group")
        _add_client_options(p)
        p.set_defaults(func=func)

    p = groups.add_parser(
        "reset-offsets",
        help="move a group's committed offsets (dry run unless --execute)",
        description="Compute new committed offsets for GROUP on TOPIC's partitions and show "
        "them; with --execute, apply them. A running group is rewound live: its coordinator "
        "stops its members, records the offsets and restarts them there. Targets outside a "
        "partition's log are clamped into it.",
    )
    p.add_argument("group")
    _add_partition_choice(p, "whose offsets move")
    p.add_argument(
        "--from-file",
        metavar="CSV",
        help="the new offsets themselves, one topic,partition,offset per line (Kafka's "
        "reset CSV); instead of --topic and a --to-... target",
    )
    target = p.add_mutually_exclusive_group()
    target.add_argument("--to-earliest", action="store_true", help="the log start")
    target.add_argument("--to-latest", action="store_true", help="the log end (skip everything)")
    target.add_argument("--to-offset", type=int, metavar="N", help="offset N")
    target.add_argument(
        "--to-datetime",
        metavar="ISO",
        help="the first record at or after this time (ISO 8601; local time without a zone)",
    )
    target.add_argument(
        "--shift-by", type=int, metavar="N", help="the committed offset plus N (negative: back)"
    )
    mode = p.add_mutually_exclusive_group()
    mode.add_argument("--dry-run", action="store_true", help="only show the plan (the default)")
    mode.add_argument("--execute", action="store_true", help="apply the plan")
    _add_client_options(p)
    p.set_defaults(func=cmd_groups_reset_offsets)

    p = groups.add_parser(
        "delete-offsets",
        help="forget a group's committed offsets for a topic",
        description="Delete GROUP's committed offsets for TOPIC's partitions. Refused while a "
        "member of the group consumes the topic.",
    )
    p.add_argument("group")
    _add_partition_choice(p, "whose offsets go")
    _add_client_options(p)
    p.set_defaults(func=cmd_groups_delete_offsets)

    p = sub.add_parser(
        "produce",
        help="send lines of stdin as records",
        description="Read stdin line by line and send each line as one record to TOPIC. "
        "With --key-separator, the text before the first separator is the record's key. "
        "Exits once every record is stored.",
    )
    p.add_argument("topic", metavar="TOPIC")
    p.add_argument(
        "--key-separator", metavar="SEP", help="split each line into key SEP value (e.g. ':')"
    )
    p.add_argument("--partition", type=int, help="send every record to this partition")
    p.add_argument(
        "--compression",
        choices=[c for c in COMPRESSION if c],
        help="compress batches (default: none; lz4 and zstd are the fast ones)",
    )
    p.add_argument(
        "--timeout",
        type=_positive_seconds,
        default=30.0,
        metavar="SECONDS",
        help="fail if a record is not stored within this many seconds, or no broker answers "
        "within it (default: %(default)s)",
    )
    _add_client_options(p, timeout=False)
    p.set_defaults(func=cmd_produce)

    p = sub.add_parser(
        "consume",
        help="join a group, print its records and membership events",
        description="Join GROUP as a consumer of TOPIC(s) and print every record it is given "
        "and every membership event (joined, assigned, revoked, lost, left). With --events "
        "json, one JSON object per line, e.g. "
        '{"event": "record", "topic": "t", "partition": 0, "offset": 7, "key": null, '
        '"value": "hello"} or {"event": "assigned", "generation": 3, "member_id": "...", '
        '"partitions": [["t", 0]]}. '
        "Stop with Ctrl-C or SIGTERM: the consumer leaves the group cleanly.",
    )
    p.add_argument("topics", nargs="+", metavar="TOPIC")
    p.add_argument("--group", "-g", required=True, help="the consumer group to join")
    p.add_argument(
        "--session-timeout",
        type=float,
        default=10.0,
        metavar="SECONDS",
        help="declared dead after this long without heartbeats (default: %(default)s)",
    )
    p.add_argument(
        "--rebalance-timeout",
        type=float,
        default=30.0,
        metavar="SECONDS",
        help="time allowed to answer a rebalance step (default: %(default)s)",
    )
    p.add_argument(
        "--offset-reset",
        choices=["earliest", "latest", "none"],
        default="latest",
        help="where to start without a committed offset (default: %(default)s)",
    )
    p.add_argument(
        "--assignor",
        action="append",
        help="preferred assignor; repeat for a preference list (default: range, roundrobin; "
        "with --rebalance-protocol cooperative: uniform, sticky, range, roundrobin)",
    )
    p.add_argument(
        "--rebalance-protocol",
        choices=["eager", "cooperative"],
        default="eager",
        help="eager: every rebalance stops everything; cooperative: only what moves "
        "(default: %(default)s)",
    )
    p.add_argument(
        "--instance-id",
        help="a static member's stable identity: restarted within its session timeout, it "
        "gets its partitions back without a rebalance",
    )
    p.add_argument(
        "--no-auto-commit", action="store_true", help="do not hand positions to the coordinator"
    )
    p.add_argument(
        "--client-id", default="trio-coord-cli", help="client id shown in group descriptions"
    )
    p.add_argument(
        "--events",
        choices=["text", "json"],
        default="text",
        help="output format (default: %(default)s)",
    )
    p.add_argument(
        "--max-records",
        type=_positive_int,
        metavar="N",
        help="leave the group after N records (N >= 1)",
    )
    p.add_argument(
        "--timeout",
        type=_positive_seconds,
        default=30.0,
        metavar="SECONDS",
        help="fail if the group cannot be joined within this many seconds; once joined, the "
        "consumer keeps reconnecting to its coordinator until stopped (default: %(default)s)",
    )
    _add_client_options(p, timeout=False)
    p.set_defaults(func=cmd_consume)

    p = sub.add_parser(
        "demo",
        help="watch a group rebalance on a local broker, in a few seconds",
        description="Start a broker on a temporary data dir and three consumer processes, then "
        "add a consumer, kill one with SIGKILL, and show every rebalance with its timing.",
    )
    p.add_argument(
        "--partitions",
        type=int,
        default=6,
        help="partitions of the demo topic (default: %(default)s)",
    )
    p.add_argument(
        "--session-timeout",
        type=float,
        default=1.5,
        metavar="SECONDS",
        help="the consumers' session timeout (default: %(default)s)",
    )
    p.set_defaults(func=cmd_demo)
    _log_level_everywhere(parser)
    return parser


async def cmd_cluster_status(args: argparse.Namespace) -> None:
    """Show a cluster's brokers, who holds each coordinator slot, and the groups of each."""
    url = require_zk_url(args.store)
    if not args.timeout > 0:
        raise UsageError(f"--timeout must be positive, not {args.timeout:g}")
    async with open_zookeeper_store(url, connect_timeout=args.timeout) as store:
        # (Connecting has a deadline of its own, which says what to check.)
        with trio.move_on_after(args.timeout) as reading:
            status = await read_status(store)
    if reading.cancelled_caught:
        raise StoreConnectionError(
            f"ZooKeeper at {url} did not answer within {args.timeout:g} s; "
            "check that its servers are up and have a quorum"
        )
    lines = [f"{len(status.brokers)} live broker(s), {status.slots} coordinator slot(s)"]
    for broker in status.brokers:
        held = [s for s, b in status.holders.items() if b == broker.broker_id]
        groups = status.groups.get(broker.broker_id, [])
        lines.append(
            f"  broker {broker.broker_id} at {broker.address}: slots {held or '-'}, "
            f"{len(groups)} group(s) {' '.join(groups)}"
        )
    vacant = [s for s in range(status.slots) if s not in status.holders]
    if vacant:
        lines.append(
            f"  vacant slots (being elected): {vacant}; groups: {status.groups.get(None, [])}"
        )
    _say(args, status.to_json(), "\n".join(lines))


def main(argv: Sequence[str] | None = None) -> int:
    """Run the command line; return the exit status."""
    parser = build_parser()
    if "_ARGCOMPLETE" in os.environ:  # a shell asking for completions (see docs/operations.md)
        import argcomplete

        argcomplete.autocomplete(parser)
    arguments = list(sys.argv[1:] if argv is None else argv)
    args = parser.parse_args(arguments)
    if args.command == "broker":  # file, then environment, under the flags: parse again
        broker = _subparser(parser, "broker")
        try:
            origin = apply_settings(broker, args.config, os.environ)
        except SettingsError as exc:
            print(f"error: {exc}", file=sys.stderr)
            return 1
        args = parser.parse_args(arguments)
        if args.print_config:
            rows = effective_settings(broker, args, origin, arguments)
            if args.json:
                _print_json({name: value for name, value, _ in rows})
            else:
                for name, value, source in rows:
                    shown = json.dumps(value) if value is not None else "(unset)"
                    print(f"{name} = {shown}  # {source}")
            return 0
    try:
        level = _log_level(args)
    except UsageError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    logging.basicConfig(
        level=level, format="%(asctime)s %(levelname)s %(name)s: %(message)s", stream=sys.stderr
    )
    try:
        trio.run(args.func, args)
    except (CoordError, StoreError, LogError, UsageError, ValueError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1
    except BrokenPipeError:  # e.g. `trio-coord groups describe g | head`
        sys.stderr.close()  # (and say nothing more on a closed pipe)
        return 0
    except OSError as exc:
        print(f"error: {exc.strerror or exc}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        return 130
    return 0


if __name__ == "__main__":
    sys.exit(main())
