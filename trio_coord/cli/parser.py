"""The argparse tree of ``trio-coord``: every subcommand, its options and its help.

It names which ``cmd_*`` function runs each subcommand, checks what argparse can
(positive numbers, log levels), and exposes the ``broker`` subparser so that ``main`` can
lay the settings file and ``TRIO_COORD_*`` variables under the flags.
"""

from __future__ import annotations

import argparse
import os

from .. import __version__
from ..broker import BrokerConfig
from ..log import LogConfig
from ..protocol.records import COMPRESSION
from ..security.acl import OPERATIONS
from ..security.scram import MECHANISMS
from ._common import DEFAULT_BOOTSTRAP, DEFAULT_PORT, UsageError
from .broker import cmd_broker, cmd_cluster_status, cmd_demo
from .data import cmd_consume, cmd_produce
from .groups import (
    cmd_groups_create,
    cmd_groups_delete,
    cmd_groups_delete_offsets,
    cmd_groups_describe,
    cmd_groups_list,
    cmd_groups_reset_offsets,
)
from .security import cmd_acls, cmd_users
from .topics import (
    cmd_topics_add_partitions,
    cmd_topics_create,
    cmd_topics_delete,
    cmd_topics_describe,
    cmd_topics_list,
)


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
        "--no-park-idle-connections",
        action="store_true",
        help="keep a reader task per client connection, idle or not, instead of handing "
        "idle plaintext connections to the one parking task (parking saves memory and "
        "CPU per member; this is for comparison and troubleshooting)",
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
