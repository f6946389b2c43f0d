"""The admin client: topics and groups, as ``trio-coord topics`` and ``groups`` use them.

``open_admin(bootstrap)`` keeps one connection to a bootstrap broker for
cluster-wide requests (topics, metadata) and asks each group's coordinator
about that group, so the same calls work on one broker or a cluster. Every
method raises the typed :class:`~trio_coord.CoordError` subclass for what the
broker refused, with the broker's message.
"""

from __future__ import annotations

import functools
import ssl
from collections.abc import AsyncIterator, Iterable, Mapping, Sequence
from contextlib import asynccontextmanager
from dataclasses import dataclass
from typing import TypeVar

import msgspec
import trio

from .._aio import unwrap_lone_exception
from .._routing import Action, classify
from ..protocol.connection import Connection, serving
from ..protocol.errors import CoordError, FrameTooLargeError, RequestTimedOutError
from ..protocol.messages import (
    LATEST,
    AddPartitionsRequest,
    AddPartitionsResponse,
    BrokerInfo,
    CreateGroupRequest,
    CreateTopicRequest,
    CreateTopicResponse,
    DeleteGroupRequest,
    DeleteOffsetsRequest,
    DeleteTopicRequest,
    DeleteTopicResponse,
    DescribeGroupRequest,
    DescribeGroupResponse,
    GroupDescription,
    GroupSummary,
    ListedOffset,
    ListGroupsRequest,
    ListGroupsResponse,
    ListOffsetsRequest,
    ListOffsetsResponse,
    MemberDescription,
    MetadataRequest,
    MetadataResponse,
    OffsetFetchResponse,
    PartitionOffset,
    RequestBody,
    ResetOffsetsRequest,
    SecurityAdminRequest,
    SecurityAdminResponse,
    TopicInfo,
    TopicPartition,
)
from ..protocol.sizing import listed_offset_bytes
from ..security.acl import Acl
from ..security.client import ClientSecurity, Sasl
from ..security.scram import ScramCredential
from ..security.store import check_user_name, encode_credentials
from ._bootstrap import Backoff, Bootstrap
from ._cluster import ClusterView
from ._parts import FrameGuess, look_up_committed, send_in_parts

__all__ = ["Admin", "PartitionLag", "PlannedOffset", "open_admin"]

_R = TypeVar("_R")


@dataclass(frozen=True, slots=True)
class PartitionLag:
    """One partition of a group as ``groups describe`` shows it.

    ``committed`` is None where the group has no committed offset; ``lag``
    counts the records between the committed offset and the log end (all of
    them when nothing is committed); ``owner`` is the member id, or "".
    """

    topic: str
    partition: int
    committed: int | None
    log_start: int
    log_end: int
    lag: int
    owner: str

    @property
    def tp(self) -> TopicPartition:
        """The partition."""
        return TopicPartition(self.topic, self.partition)


@dataclass(frozen=True, slots=True)
class PlannedOffset:
    """One partition of an offset reset (:meth:`Admin.plan_offset_reset`).

    ``current`` is the group's committed offset (None where it has none); ``new``
    is where the reset puts it, already inside the log.
    """

    topic: str
    partition: int
    current: int | None
    new: int

    @property
    def tp(self) -> TopicPartition:
        """The partition."""
        return TopicPartition(self.topic, self.partition)


_SCRAM = ("SCRAM-SHA-256", "SCRAM-SHA-512")


class Admin:
    """Administrative operations on a cluster; create it with :func:`open_admin`."""

    def __init__(
        self,
        bootstrap: Bootstrap,
        conn: Connection,
        cluster: ClusterView,
        *,
        api_timeout: float = 60.0,
    ) -> None:
        self._bootstrap = bootstrap
        self._conn = conn
        self._cluster = cluster
        self._api_timeout = api_timeout
        self._frame_guess = FrameGuess(conn.max_frame_size)  # (the brokers', from refusals)

    async def _ask(
        self, request: RequestBody, expected: type[_R], conn: Connection | None = None
    ) -> _R:
        conn = conn or self._conn
        timeout = self._bootstrap.request_timeout
        with trio.move_on_after(timeout):
            response = await conn.request(request)
            assert isinstance(response, expected), f"unexpected answer {response!r}"
            return response
        raise RequestTimedOutError(
            f"{conn.name} did not answer {type(request).__name__} within request_timeout "
            f"({timeout:g}s); is the broker overloaded or stuck? (see its log)"
        )

    async def _ask_coordinator(self, group_id: str, request: RequestBody, expected: type[_R]) -> _R:
        """Ask the group's coordinator, finding it again while it moves (a cluster's failover),
        for at most ``api_timeout``."""
        backoff = Backoff()
        what = f"the coordinator of group {group_id!r} did not answer"
        with self._bootstrap.fail_after(self._api_timeout, what, "api_timeout"):
            while True:
                coordinator = await self._bootstrap.find_coordinator(group_id)
                try:
                    async with self._bootstrap.open((coordinator.host, coordinator.port)) as conn:
                        return await self._ask(request, expected, conn)
                except CoordError as exc:
                    # The coordination moved (or its broker went): find the coordinator again.
                    if classify(exc) not in (Action.MOVED, Action.RECONNECT):
                        raise
                    await backoff.sleep()
        raise AssertionError("unreachable")  # (fail_after raises when the time is up)

    # -- cluster and topics ------------------------------------------------------------

    async def metadata(
        self, topics: Sequence[str] | None = None, *, configs: bool = False
    ) -> MetadataResponse:
        """Live brokers and topics (``topics=None``: all topics, asked for page by page);
        ``configs``: with the settings each topic's log follows (``TopicInfo.configs``)."""
        if topics is not None:
            return await self._ask(MetadataRequest(list(topics), configs=configs), MetadataResponse)
        response = await self._ask(MetadataRequest(None, configs=configs), MetadataResponse)
        listed = list(response.topics)
        while response.next:
            response = await self._ask(
                MetadataRequest(None, after=response.next, configs=configs), MetadataResponse
            )
            listed.extend(response.topics)
        return msgspec.structs.replace(response, topics=listed, next="")

    async def brokers(self) -> list[BrokerInfo]:
        """The live brokers."""
        return (await self.metadata(topics=[])).brokers

    async def create_topic(self, name: str, partitions: int) -> TopicInfo:
        """Create a topic (raises TopicAlreadyExistsError, InvalidTopicError, ...)."""
        response = await self._ask(CreateTopicRequest(name, partitions), CreateTopicResponse)
        return response.topic

    async def add_partitions(self, topic: str, total: int) -> TopicInfo:
        """Grow ``topic`` to ``total`` partitions; subscribed groups rebalance."""
        response = await self._ask(AddPartitionsRequest(topic, total), AddPartitionsResponse)
        return response.topic

    async def delete_topic(self, name: str) -> None:
        """Delete a topic, its records and every group's committed offsets of it.

        Raises UnknownTopicError if there is no such topic. Groups subscribed
        to it rebalance without it; a topic created again under its name
        starts empty, at offset 0.
        """
        await self._ask(DeleteTopicRequest(name), DeleteTopicResponse)

    async def list_topics(self, *, configs: bool = False) -> list[TopicInfo]:
        """Every topic, sorted by name (``configs``: with their settings)."""
        return (await self.metadata(configs=configs)).topics

    async def describe_topics(
        self, names: Iterable[str], *, configs: bool = False
    ) -> list[TopicInfo]:
        """The named topics (raises UnknownTopicError for a missing one); ``configs``: with
        the settings each one's log follows (``TopicInfo.configs``: retention.ms, ...)."""
        return (await self.metadata(list(names), configs=configs)).topics

    async def list_offsets(
        self, partitions: Iterable[TopicPartition | tuple[str, int]], timestamp_ms: int = LATEST
    ) -> dict[TopicPartition, ListedOffset]:
        """Offsets of partitions, asked of the brokers holding them.

        ``timestamp_ms`` is ``LATEST`` (-1, the log end), ``EARLIEST`` (-2,
        the log start) or a time in milliseconds since the epoch (the first
        record at or after it; the log end if there is none). Thousands of
        partitions are asked for in parts, each answer within what the broker sends.
        """
        by_leader = await self._cluster.by_leader(TopicPartition(*tp) for tp in partitions)
        result: dict[TopicPartition, ListedOffset] = {}
        guess = self._frame_guess
        for broker, tps in by_leader.items():

            async def ask(part: list[TopicPartition], broker: BrokerInfo = broker) -> None:
                conn = await self._cluster.connection(broker)
                request = ListOffsetsRequest(part, timestamp_ms)
                response = await self._ask(request, ListOffsetsResponse, conn)
                result.update((o.tp, o) for o in response.offsets)

            await send_in_parts(tps, ask, guess.budget, guess.halve, listed_offset_bytes)
        return result

    async def topic_partitions(self, topics: Iterable[str]) -> list[TopicPartition]:
        """Every partition of the named topics, sorted."""
        return [
            TopicPartition(info.name, p)
            for info in await self.describe_topics(sorted(set(topics)))
            for p in range(info.partitions)
        ]

    # -- groups --------------------------------------------------------------------------

    async def list_groups(self) -> list[GroupSummary]:
        """Every group of every live broker, sorted by id."""
        groups: dict[str, GroupSummary] = {}
        for broker in await self.brokers():
            async with self._bootstrap.open((broker.host, broker.port)) as conn:
                after = ""
                while True:
                    response = await self._ask(ListGroupsRequest(after), ListGroupsResponse, conn)
                    groups.update((g.group_id, g) for g in response.groups)
                    if not response.next:
                        break
                    after = response.next
        return [groups[g] for g in sorted(groups)]

    async def describe_group(self, group_id: str) -> GroupDescription:
        """State, generation, members with their partitions, and committed offsets.

        A large group comes a page at a time; the pages are joined here.
        """
        request = DescribeGroupRequest(group_id)
        members: list[MemberDescription] = []
        offsets: list[PartitionOffset] = []
        while True:
            response = await self._ask_coordinator(group_id, request, DescribeGroupResponse)
            page = response.group
            if members and page.members and page.members[0].member_id == members[-1].member_id:
                # A member cut between pages: its partitions continue.
                first, *rest = page.members
                joined = [*members[-1].partitions, *first.partitions]
                members[-1] = msgspec.structs.replace(first, partitions=joined)
                members.extend(rest)
            else:
                members.extend(page.members)
            offsets.extend(page.offsets)
            if response.members_next is not None:
                request = DescribeGroupRequest(group_id, members_after=response.members_next)
            elif response.offsets_next is not None:
                request = DescribeGroupRequest(group_id, offsets_after=response.offsets_next)
            else:
                return msgspec.structs.replace(page, members=members, offsets=offsets)

    async def committed_offsets(
        self, group_id: str, partitions: Iterable[TopicPartition] | None = None
    ) -> dict[TopicPartition, int]:
        """A group's committed offsets (all, or for ``partitions``).

        Thousands of ``partitions`` are asked for in parts, each within what the
        broker reads (a refusal teaches a smaller frame); each answer comes a page
        at a time.
        """
        offsets: dict[TopicPartition, int] = {}

        async def look_up(part: list[TopicPartition] | None) -> None:
            ask = functools.partial(self._ask_coordinator, group_id, expected=OffsetFetchResponse)
            await look_up_committed(group_id, part, ask, offsets)

        if partitions is None:
            await look_up(None)
        else:
            wanted = sorted(TopicPartition(*tp) for tp in partitions)
            guess = self._frame_guess
            await send_in_parts(wanted, look_up, guess.budget, guess.halve)
        return offsets

    async def group_lag(self, group_id: str) -> list[PartitionLag]:
        """Per partition the group consumes or has offsets for: committed, log end, lag, owner."""
        group = await self.describe_group(group_id)
        owners = {tp: m.member_id for m in group.members for tp in m.partitions}
        committed = {o.tp: o.offset for o in group.offsets}
        topics = {t for m in group.members for t in m.topics} | {tp.topic for tp in committed}
        known = {t.name for t in await self.list_topics()}
        partitions = set(await self.topic_partitions(topics & known)) | set(committed)
        ends = await self.list_offsets([tp for tp in partitions if tp.topic in known])
        rows = []
        for tp in sorted(partitions):
            listed = ends.get(tp)
            start, end = (listed.log_start, listed.log_end) if listed else (0, 0)
            offset = committed.get(tp)
            lag = max(0, end - (start if offset is None else offset))
            rows.append(
                PartitionLag(tp.topic, tp.partition, offset, start, end, lag, owners.get(tp, ""))
            )
        return rows

    async def reset_offsets(
        self,
        group_id: str,
        offsets: Mapping[TopicPartition, int] | Mapping[tuple[str, int], int],
    ) -> None:
        """Move a group's committed offsets (backwards too); a running group restarts there.

        A reset is one request, so that a running group stops and restarts once:
        one of more partitions than a frame holds raises FrameTooLargeError,
        saying to reset them in several calls.
        """
        request = ResetOffsetsRequest(
            group_id,
            [PartitionOffset(tp[0], tp[1], off) for tp, off in sorted(offsets.items())],
        )
        try:
            await self._ask_coordinator(group_id, request, object)
        except FrameTooLargeError as exc:
            raise FrameTooLargeError(
                f"a reset of {len(offsets)} partitions does not fit one request ({exc}); "
                "reset them in several calls, a topic or a range of partitions at a time "
                "(each restarts a running group once)"
            ) from exc

    async def plan_offset_reset(
        self,
        group_id: str,
        partitions: Iterable[TopicPartition | tuple[str, int]] = (),
        *,
        offsets: Mapping[TopicPartition, int] | None = None,
        to_earliest: bool = False,
        to_latest: bool = False,
        to_offset: int | None = None,
        to_timestamp_ms: int | None = None,
        shift_by: int | None = None,
        execute: bool = False,
    ) -> list[PlannedOffset]:
        """Plan new committed offsets for a group's ``partitions``, and with ``execute`` apply them.

        Give exactly one target: ``offsets`` (the offsets themselves, per partition,
        instead of ``partitions``; each must exist), ``to_earliest`` (the log start),
        ``to_latest`` (the log end), ``to_offset``, ``to_timestamp_ms`` (the first record
        at or after that time, in ms since the epoch) or ``shift_by`` (from the committed
        offset, or from the log end where nothing is committed). As in
        kafka-consumer-groups, a target outside the log is clamped into it. Returns one
        :class:`PlannedOffset` per partition, sorted; without ``execute`` nothing changes
        (a dry run). Raises ValueError for no target, two targets, or partitions that do
        not exist.
        """
        targets_given = [
            offsets is not None,
            to_earliest,
            to_latest,
            to_offset is not None,
            to_timestamp_ms is not None,
            shift_by is not None,
        ]
        if sum(targets_given) != 1:
            raise ValueError(
                "give exactly one target: offsets, to_earliest, to_latest, to_offset, "
                "to_timestamp_ms or shift_by"
            )
        if offsets is not None:
            if partitions:
                raise ValueError("offsets names its partitions: give no partitions with it")
            tps = sorted(offsets)
            known = set(await self.topic_partitions({tp.topic for tp in tps}))
            missing = [str(tp) for tp in tps if tp not in known]
            if missing:
                raise ValueError(f"the offsets name partitions that do not exist: {missing}")
        else:
            tps = sorted({TopicPartition(*tp) for tp in partitions})
        committed = await self.committed_offsets(group_id, tps)
        bounds = await self.list_offsets(tps)
        if offsets is not None:
            targets = dict(offsets)
        elif to_timestamp_ms is not None:
            targets = {
                tp: o.offset for tp, o in (await self.list_offsets(tps, to_timestamp_ms)).items()
            }
        elif to_earliest:
            targets = {tp: bounds[tp].log_start for tp in tps}
        elif to_latest:
            targets = {tp: bounds[tp].log_end for tp in tps}
        elif to_offset is not None:
            targets = {tp: to_offset for tp in tps}
        else:
            assert shift_by is not None
            targets = {tp: committed.get(tp, bounds[tp].log_end) + shift_by for tp in tps}
        new = {tp: min(max(targets[tp], bounds[tp].log_start), bounds[tp].log_end) for tp in tps}
        if execute:
            await self.reset_offsets(group_id, new)
        return [PlannedOffset(tp.topic, tp.partition, committed.get(tp), new[tp]) for tp in tps]

    async def delete_offsets(
        self, group_id: str, partitions: Iterable[TopicPartition | tuple[str, int]]
    ) -> None:
        """Forget a group's offsets of partitions none of its members consumes (thousands
        in parts: if one is refused, the parts before it are forgotten)."""

        async def forget(part: list[TopicPartition]) -> None:
            await self._ask_coordinator(group_id, DeleteOffsetsRequest(group_id, part), object)

        wanted = sorted(TopicPartition(*tp) for tp in partitions)
        guess = self._frame_guess
        await send_in_parts(wanted, forget, guess.budget, guess.halve)

    async def create_group(self, group_id: str) -> None:
        """Create an empty group (raises GroupAlreadyExistsError)."""
        await self._ask_coordinator(group_id, CreateGroupRequest(group_id), object)

    async def delete_group(self, group_id: str) -> None:
        """Delete an empty group and its offsets (raises NonEmptyGroupError)."""
        await self._ask_coordinator(group_id, DeleteGroupRequest(group_id), object)

    # -- users and ACLs (a super user's, on a broker with authentication) ------------------

    async def _security(self, request: SecurityAdminRequest) -> SecurityAdminResponse:
        return await self._ask(request, SecurityAdminResponse)

    async def add_user(
        self,
        name: str,
        password: str,
        mechanisms: Sequence[str] = ("SCRAM-SHA-256", "SCRAM-SHA-512"),
    ) -> None:
        """Create a user (or give it a new password); the password never leaves this process:
        the broker is sent its SCRAM salted keys."""
        check_user_name(name)
        creds = [ScramCredential.make(m, password) for m in mechanisms]
        await self._security(
            SecurityAdminRequest("add-user", name, credentials=encode_credentials(creds))
        )

    async def delete_user(self, name: str) -> bool:
        """Remove a user (False: there was none)."""
        return bool((await self._security(SecurityAdminRequest("delete-user", name))).count)

    async def list_users(self) -> dict[str, list[str]]:
        """Every user and the SCRAM mechanisms it has credentials for."""
        data = (await self._security(SecurityAdminRequest("list-users"))).data
        return msgspec.json.decode(data, type=dict[str, list[str]])

    async def add_acl(self, acl: Acl) -> bool:
        """Grant ``acl`` (False: it was there already); in force on every broker at once."""
        body = msgspec.json.encode(acl.check())
        return bool((await self._security(SecurityAdminRequest("add-acl", acl=body))).count)

    async def remove_acl(self, acl: Acl) -> int:
        """Revoke ``acl`` (operation ``all``: every operation on that resource); how many."""
        body = msgspec.json.encode(acl)
        return (await self._security(SecurityAdminRequest("remove-acl", acl=body))).count

    async def list_acls(self) -> list[Acl]:
        """Every ACL."""
        data = (await self._security(SecurityAdminRequest("list-acls"))).data
        return msgspec.json.decode(data, type=list[Acl])


@asynccontextmanager
async def open_admin(
    bootstrap: str | Sequence[str],
    *,
    request_timeout: float = 30.0,
    api_timeout: float = 60.0,
    ssl_context: ssl.SSLContext | None = None,
    sasl: Sasl | None = None,
) -> AsyncIterator[Admin]:
    """Connect to a bootstrap broker for administrative calls, for the life of the block.

    Retries with backoff while no bootstrap broker accepts a connection, for
    at most ``api_timeout`` seconds (Kafka's ``default.api.timeout.ms``), then
    raises RequestTimedOutError naming every address it could not reach and
    why. Each request waits at most ``request_timeout`` for its answer;
    finding a group's coordinator (or topic metadata) retries for at most
    ``api_timeout``. ``ssl_context`` (see
    :func:`~trio_coord.security.client_ssl_context`) and ``sasl``
    (:class:`~trio_coord.security.Sasl`) are for a broker with TLS and logins.
    """
    if not api_timeout > 0:
        raise ValueError(f"api_timeout must be positive (seconds), not {api_timeout}")
    boot = Bootstrap(
        bootstrap, request_timeout=request_timeout, security=ClientSecurity(ssl_context, sasl)
    )
    with boot.fail_after(api_timeout, "no broker accepted a connection", "api_timeout"):
        stream, (host, port) = await boot.connect_any()
    with unwrap_lone_exception():
        async with (
            serving(Connection(stream, name=f"{host}:{port}")) as conn,
            trio.open_nursery() as nursery,
        ):
            cluster = ClusterView(
                boot, nursery, name="admin", timeout=api_timeout, timeout_setting="api_timeout"
            )
            try:
                yield Admin(boot, conn, cluster, api_timeout=api_timeout)
            finally:
                await cluster.aclose()
                nursery.cancel_scope.cancel()
