"""The data commands: ``produce`` (stdin lines as records) and ``consume`` (a group member
that prints what it reads, with ``--events`` its group events as JSON lines).
"""

from __future__ import annotations

import argparse
import os
import sys
from typing import Any

import trio

from ..client import Consumer, Delivery, open_admin, open_producer
from ..protocol.messages import TopicPartition
from ._common import UsageError, _security, _timeouts, _until_signalled
from .render import _print_json, _print_record, _tp


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
