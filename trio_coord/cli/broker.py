"""The commands that run or inspect brokers: ``broker``, ``cluster status`` and ``demo``.

``cmd_broker`` turns the parsed settings into a ``BrokerConfig`` and runs ``open_broker``
until SIGINT/SIGTERM; ``cmd_cluster_status`` reads a cluster's registrations and
coordinator slots from ZooKeeper.
"""

from __future__ import annotations

import argparse
import os

import trio

from ..broker import BrokerConfig, open_broker
from ..broker.cluster import read_status
from ..log import LogConfig
from ..store import open_zookeeper_store
from ..store.base import StoreConnectionError
from ..store.zookeeper import require_zk_url
from ._common import UsageError, _names, _until_signalled
from .render import _say


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
        park_idle_connections=not args.no_park_idle_connections,
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


async def cmd_demo(args: argparse.Namespace) -> None:
    """Run the guided demo."""
    from ..demo import run_demo

    await run_demo(partitions=args.partitions, session_timeout=args.session_timeout)


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
