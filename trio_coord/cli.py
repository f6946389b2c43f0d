"""The ``trio-coord`` command line: parse, call the public API, print.

Every subcommand is a thin shell over ``open_broker``, ``open_admin`` or
``open_consumer``: it prints tables for people and, with ``--json``, one JSON
document (or one JSON object per line for event streams) for scripts. Errors
a user can cause are printed as one ``error:`` line saying what to do, with
exit status 1 (2 for bad usage). SIGINT and SIGTERM stop a broker or a
consumer gracefully: the consumer leaves its group, the broker finishes its
writes.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import signal
import sys
from collections.abc import Awaitable, Callable, Sequence
from typing import Any, TextIO, TypeVar

import trio

from . import __version__
from .broker import BrokerConfig, open_broker
from .client import Admin, Consumer, open_admin
from .protocol.errors import CoordError
from .protocol.messages import GroupDescription, TopicInfo, TopicPartition
from .store.base import StoreError

__all__ = ["main"]

DEFAULT_PORT = 9192
DEFAULT_BOOTSTRAP = f"127.0.0.1:{DEFAULT_PORT}"

_T = TypeVar("_T")


class UsageError(Exception):
    """A mistake in the command line that argparse could not catch."""


# -- output helpers ---------------------------------------------------------------------


def _print_json(value: Any, out: TextIO = sys.stdout) -> None:
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


def group_to_json(desc: GroupDescription) -> dict[str, Any]:
    """A group description as plain JSON (what ``groups describe --json`` prints)."""
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
    }


# -- commands ------------------------------------------------------------------------------


async def _ask_admin(args: argparse.Namespace, call: Callable[[Admin], Awaitable[_T]]) -> _T:
    """Run one admin call against ``--bootstrap``; give up after ``--timeout`` seconds."""
    with trio.move_on_after(args.timeout):
        async with open_admin(args.bootstrap) as admin:
            return await call(admin)
    raise UsageError(
        f"no broker answered at {args.bootstrap} within {args.timeout:g}s; "
        "is one running? (start one with: trio-coord broker)"
    )


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
        group_retention=args.group_retention,
    )
    async with open_broker(args.data_dir, args.host, args.port, config=config) as broker:
        data_dir = os.path.abspath(args.data_dir)  # noqa: ASYNC240 (once, at start-up)
        _say(
            args,
            {"event": "listening", "address": broker.bootstrap, "data_dir": data_dir},
            f"trio-coord broker {args.broker_id} listening on {broker.bootstrap}\n"
            f"data dir: {data_dir}  (Ctrl-C to stop)",
        )
        await _until_signalled()


def _topic_json(topics: Sequence[TopicInfo]) -> list[dict[str, Any]]:
    return [{"topic": t.name, "partitions": t.partitions} for t in topics]


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
    """Describe one group."""
    desc = await _ask_admin(args, lambda admin: admin.describe_group(args.group))
    _say(args, group_to_json(desc), describe_text(desc))


def describe_text(desc: GroupDescription) -> str:
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
    owner = {tp: m.member_id for m in desc.members for tp in m.partitions}
    committed = {o.tp: o.offset for o in desc.offsets}
    partitions = sorted(set(committed) | set(owner))
    if partitions:
        table = [[str(tp), committed.get(tp, "-"), owner.get(tp, "-")] for tp in partitions]
        lines += ["", format_table(["PARTITION", "COMMITTED", "OWNER"], table)]
    return "\n".join(lines)


async def cmd_groups_create(args: argparse.Namespace) -> None:
    """Create an empty group."""
    await _ask_admin(args, lambda admin: admin.create_group(args.group))
    _say(args, {"group": args.group, "created": True}, f"created group {args.group}")


async def cmd_groups_delete(args: argparse.Namespace) -> None:
    """Delete an empty group."""
    await _ask_admin(args, lambda admin: admin.delete_group(args.group))
    _say(args, {"group": args.group, "deleted": True}, f"deleted group {args.group}")


async def cmd_consume(args: argparse.Namespace) -> None:
    """Join a group and print membership events until SIGINT/SIGTERM."""
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
                flush=True,
            )

    consumer = Consumer(
        args.bootstrap,
        args.group,
        args.topics,
        session_timeout=args.session_timeout,
        rebalance_timeout=args.rebalance_timeout,
        offset_reset=args.offset_reset,
        assignors=args.assignor or ("range", "roundrobin"),
        auto_commit=not args.no_auto_commit,
        client_id=args.client_id,
        on_assigned=lambda ps: emit("assigned", ps),
        on_revoked=lambda ps: emit("revoked", ps),
        on_lost=lambda ps: emit("lost", ps),
    )
    async with consumer:
        emit("joined", pid=os.getpid())
        async with open_admin(args.bootstrap) as admin:
            existing = {t.name for t in await admin.list_topics()}
        for topic in sorted(set(args.topics) - existing):
            print(
                f"warning: topic {topic!r} does not exist yet; its partitions will be "
                f"assigned once it is created (trio-coord topics create {topic} --partitions N)",
                file=sys.stderr,
                flush=True,
            )
        await _until_signalled()
    emit("left")


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
    if timeout:
        p.add_argument(
            "--timeout",
            type=float,
            default=10.0,
            help="give up if no broker answers within this many seconds (default: %(default)s)",
        )


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
        default=os.environ.get("TRIO_COORD_LOG_LEVEL", "WARNING"),
        choices=["DEBUG", "INFO", "WARNING", "ERROR"],
        help="logging level on stderr (default: %(default)s; 'broker' defaults to INFO)",
    )
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")

    p = sub.add_parser(
        "broker",
        help="run a broker on the embedded store",
        description="Run a broker that keeps its metadata (topics, groups, offsets) in an "
        "embedded, crash-safe store in --data-dir. Stop it with Ctrl-C or SIGTERM.",
    )
    p.add_argument(
        "--data-dir",
        default="./trio-coord-data",
        help="where metadata is kept (default: %(default)s)",
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
        "--min-session-timeout",
        type=float,
        default=1.0,
        metavar="SECONDS",
        help="smallest session timeout consumers may ask for (default: %(default)s)",
    )
    p.add_argument(
        "--max-session-timeout",
        type=float,
        default=1800.0,
        metavar="SECONDS",
        help="largest session timeout consumers may ask for (default: %(default)s)",
    )
    p.add_argument(
        "--group-retention",
        type=float,
        default=600.0,
        metavar="SECONDS",
        help="remove groups empty and without offsets for this long (default: %(default)s)",
    )
    p.add_argument("--json", action="store_true", help="announce the listening address as JSON")
    p.set_defaults(func=cmd_broker, log_default="INFO")

    topics = sub.add_parser("topics", help="create, list and describe topics").add_subparsers(
        dest="action", required=True, metavar="ACTION"
    )
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
    for action, text in (("list", "list topics"), ("describe", "describe topics")):
        p = topics.add_parser(
            action, help=text, description=text.capitalize() + " (all, or the ones named)."
        )
        p.add_argument("names", nargs="*", metavar="NAME")
        _add_client_options(p)
        p.set_defaults(func=cmd_topics_list)

    groups = sub.add_parser(
        "groups", help="list, describe, create and delete consumer groups"
    ).add_subparsers(dest="action", required=True, metavar="ACTION")
    p = groups.add_parser(
        "list", help="list groups", description="List every group of every live broker."
    )
    _add_client_options(p)
    p.set_defaults(func=cmd_groups_list)
    for action, func, text in (
        ("describe", cmd_groups_describe, "show state, members, partitions and committed offsets"),
        ("create", cmd_groups_create, "create an empty group"),
        ("delete", cmd_groups_delete, "delete an empty group and its offsets"),
    ):
        p = groups.add_parser(action, help=text, description=text[0].upper() + text[1:] + ".")
        p.add_argument("group")
        _add_client_options(p)
        p.set_defaults(func=func)

    p = sub.add_parser(
        "consume",
        help="join a group and print its membership events",
        description="Join GROUP as a consumer of TOPIC(s) and print every membership event "
        "(joined, assigned, revoked, lost, left). With --events json, one JSON object per line, "
        'e.g. {"event": "assigned", "generation": 3, "member_id": "...", '
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
        help="preferred assignor; repeat for a preference list (default: range, roundrobin)",
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
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    """Run the command line; return the exit status."""
    parser = build_parser()
    args = parser.parse_args(argv)
    level = args.log_level
    if "--log-level" not in (argv if argv is not None else sys.argv) and hasattr(
        args, "log_default"
    ):
        level = args.log_default
    logging.basicConfig(
        level=level, format="%(asctime)s %(levelname)s %(name)s: %(message)s", stream=sys.stderr
    )
    try:
        trio.run(args.func, args)
    except (CoordError, StoreError, UsageError, ValueError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1
    except OSError as exc:
        print(f"error: {exc.strerror or exc}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        return 130
    return 0


if __name__ == "__main__":
    sys.exit(main())
