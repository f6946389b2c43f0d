"""The coordinator service: the groups this broker coordinates, one task tree each.

It creates a :class:`~.group.GroupRunner` per group in its own nursery (the
"coordinator service nursery" of the design), routes group requests to it,
keeps track of which members live on which connection (so that a lost
connection removes exactly its members), rebalances the groups subscribed to
a topic that appears or grows, replays durable records into group state, and
sweeps away groups that stayed empty, with no offsets, for the retention
period. A subscription entry ``re:PATTERN`` is a regular expression over
topic names: the member is subscribed to every matching topic, including
topics created later. A broker of a cluster runs one service per coordinator slot it
holds; :class:`Coordinators` routes each group's requests to its slot's
service (a single broker has one slot).
"""

from __future__ import annotations

import contextlib
import logging
import math
import time
import zlib
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field

import msgspec
import trio

from ..core.assignors import ASSIGNORS, Assignor
from ..core.group import Group, GroupLimits, GroupState
from ..core.records import GroupRecord, GroupTombstone, OffsetRecord, OffsetTombstone, Record
from ..core.validation import validate_group_id
from ..protocol.errors import (
    CoordinatorNotAvailableError,
    GroupAlreadyExistsError,
    GroupNotFoundError,
    NonEmptyGroupError,
    NotCoordinatorError,
    ResourcesExhaustedError,
)
from ..protocol.messages import (
    DeleteOffsetsRequest,
    GroupDescription,
    GroupSummary,
    HeartbeatRequest,
    JoinGroupRequest,
    JoinGroupResponse,
    LeaveGroupRequest,
    MemberDescription,
    OffsetCommitRequest,
    PartitionOffset,
    ResetOffsetsRequest,
    TopicPartition,
)
from ..security.acl import ANONYMOUS
from ..store.base import BadVersionError, StoreError
from .events import EventCallback
from .group import GroupRunner, Locate, LogOffsets, MemberLink
from .persistence import RecordWriter
from .topics import PATTERN_PREFIX, TopicManager, subscription_patterns

__all__ = [
    "PATTERN_PREFIX",
    "CoordinatorConfig",
    "CoordinatorService",
    "Coordinators",
    "slot_of",
]

log = logging.getLogger(__name__)


@dataclass(frozen=True, slots=True)
class CoordinatorConfig:
    """Settings of the coordinator service (see ``BrokerConfig`` for their meaning)."""

    limits: GroupLimits = field(default_factory=GroupLimits)
    group_retention: float = 600.0
    position_flush_interval: float = 1.0
    offsets_retention: float | None = 7 * 24 * 3600.0
    rebalance_retry_backoff: float = 1.0
    rebalance_retry_backoff_max: float = 30.0


class CoordinatorService:
    """All groups of this broker; see the module docstring."""

    def __init__(
        self,
        writer: RecordWriter,
        topics: TopicManager,
        config: CoordinatorConfig,
        *,
        log_offsets: LogOffsets = lambda tp: (0, 0),
        assignors: dict[str, Assignor] | None = None,
        on_event: EventCallback | None = None,
        event_detail: bool = True,
        locate: Locate | None = None,
    ) -> None:
        self._writer = writer
        self._topics = topics
        self._log_offsets = log_offsets
        self._config = config
        self._assignors = dict(assignors or ASSIGNORS)
        self._on_event = on_event
        self._event_detail = event_detail
        self._locate = locate
        self.heartbeats = 0
        """Heartbeats accepted (for metrics; a plain count: this is the hottest path)."""
        self.on_commit: Callable[[int, float], None] | None = None
        """Told of each acknowledged offset commit: (offsets, seconds to durable) (metrics)."""
        self._runners: dict[str, GroupRunner] = {}
        self._by_conn: dict[MemberLink, dict[str, str]] = {}  # conn → {member id: group id}
        self._nursery: trio.Nursery | None = None
        topics.add_listener(self._topic_changed)

    # -- lifetime ----------------------------------------------------------------

    async def run(self, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        """Host the group tasks and the retention sweeper until cancelled."""
        async with trio.open_nursery() as nursery:
            self._nursery = nursery
            for runner in self._runners.values():  # groups loaded before start
                await nursery.start(runner.run)
            nursery.start_soon(self._sweep_empty_groups)
            task_status.started()

    def detach(self) -> None:
        """Stop following topic changes (the broker gave up this service's slot)."""
        self._topics.remove_listener(self._topic_changed)

    def _new_runner(self, group: Group) -> GroupRunner:
        runner = GroupRunner(
            group,
            writer=self._writer,
            topics=self._topics,
            log_offsets=self._log_offsets,
            assignors=self._assignors,
            limits=self._config.limits,
            position_flush_interval=self._config.position_flush_interval,
            store_retry_backoff=self._config.rebalance_retry_backoff,
            store_retry_backoff_max=self._config.rebalance_retry_backoff_max,
            on_event=self._on_event,
            event_detail=self._event_detail,
            locate=self._locate,
            bind_connection=self._bind_connection,
        )
        self._runners[group.group_id] = runner
        if self._nursery is not None:
            self._nursery.start_soon(runner.run)
        return runner

    async def _runner_ready(self, group_id: str, *, create: bool) -> GroupRunner:
        while True:
            runner = self._runners.get(group_id)
            if runner is None:
                if not create:
                    raise GroupNotFoundError(
                        f"group {group_id!r} does not exist on this coordinator"
                    )
                validate_group_id(group_id)
                runner = self._new_runner(Group(group_id, now=trio.current_time()))
            await runner.ready.wait()
            # Waiting is a checkpoint: the group may have been deleted meanwhile.
            if self._runners.get(group_id) is runner:
                return runner

    # -- replay (called by the record writer once a record is durable) -----------------

    def replay(self, record: Record, *, loading: bool = False) -> None:
        """Apply one durable group or offset record to the group it belongs to."""
        assert isinstance(record, GroupRecord | OffsetRecord | OffsetTombstone | GroupTombstone)
        runner = self._runners.get(record.group_id)
        if runner is None:
            if isinstance(record, GroupTombstone):
                return
            runner = self._new_runner(Group(record.group_id, now=trio.current_time()))
        runner.group.replay(record, now=trio.current_time(), loading=loading)
        if isinstance(record, GroupTombstone):
            del self._runners[record.group_id]
            runner.close()

    def committed_offset(self, group_id: str, tp: TopicPartition) -> int | None:
        """The durable committed offset of ``group_id`` on ``tp`` (None if none)."""
        runner = self._runners.get(group_id)
        record = runner.group.offsets.get(tp) if runner is not None else None
        return None if record is None else record.offset

    def current(self, record: Record) -> Record | None:
        """The durable group or offset record in the same place as ``record``."""
        if not isinstance(record, OffsetRecord | GroupRecord):
            return None  # tombstones always apply
        runner = self._runners.get(record.group_id)
        if runner is None:
            return None
        if isinstance(record, OffsetRecord):
            return runner.group.offsets.get(record.tp)
        return runner.group.record

    # -- connections -------------------------------------------------------------------

    def _bind_connection(self, conn: MemberLink, member_id: str, group_id: str | None) -> None:
        members = self._by_conn.setdefault(conn, {})
        if group_id is None:
            members.pop(member_id, None)
            if not members:
                del self._by_conn[conn]
            released = getattr(conn, "released", None)
            if released is not None:  # (a front end's link: it may forget the member)
                released(member_id)
        else:
            members[member_id] = group_id

    def connection_lost(self, conn: MemberLink) -> None:
        """Remove every member that lived on ``conn`` (each as a failure, not a leave)."""
        for member_id, group_id in list(self._by_conn.pop(conn, {}).items()):
            runner = self._runners.get(group_id)
            if runner is not None:
                runner.connection_lost(member_id)

    # -- requests ----------------------------------------------------------------------

    async def join(self, request: JoinGroupRequest, conn: MemberLink) -> JoinGroupResponse:
        """Admit a member to a group, creating the group on first join.

        A subscription entry ``re:PATTERN`` subscribes to every topic whose
        whole name matches the regular expression, now and as topics appear
        (``:`` never occurs in topic names): the member's topics are its
        entries plus the existing topics they match. The group matches the
        patterns again each time it plans an assignment, so that a topic made
        while the member waits for its first generation is not missed.
        """
        matched = self._topics.matching(request.topics)  # (also checks the patterns)
        if matched:
            request = msgspec.structs.replace(request, topics=sorted(set(request.topics) | matched))
        runner = await self._runner_ready(request.group, create=True)
        return runner.join(request, conn)

    def join_now(self, request: JoinGroupRequest, conn: MemberLink) -> JoinGroupResponse | None:
        """:meth:`join` without waiting, or None if it must wait (the group's task is not up).

        A join is O(1) once the group runs, so a front end answers it inline
        (no task per JoinGroup): forming a group of thousands is mostly joins.
        """
        runner = self._runners.get(request.group)
        if runner is None or not runner.ready.is_set():
            return None
        matched = self._topics.matching(request.topics)  # (also checks the patterns)
        if matched:
            request = msgspec.structs.replace(request, topics=sorted(set(request.topics) | matched))
        return runner.join(request, conn)

    def runners(self) -> list[GroupRunner]:
        """The groups this service runs (for metrics and tools)."""
        return list(self._runners.values())

    def heartbeat(self, request: HeartbeatRequest) -> None:
        """Accept a heartbeat or raise the fencing error (synchronous and O(1))."""
        runner = self._runners.get(request.group)
        if runner is None:
            raise GroupNotFoundError(
                f"group {request.group!r} does not exist on this coordinator; rejoin"
            )
        runner.heartbeat(request)
        self.heartbeats += 1

    async def leave(self, request: LeaveGroupRequest) -> None:
        """A member leaves its group cleanly."""
        runner = await self._runner_ready(request.group, create=False)
        await runner.leave(request)

    async def commit(self, request: OffsetCommitRequest) -> None:
        """Durably commit offsets for a member or a standalone committer."""
        began = time.perf_counter()
        runner = await self._runner_ready(request.group, create=True)
        await runner.commit(request)
        if self.on_commit is not None:
            self.on_commit(len(request.offsets), time.perf_counter() - began)

    async def reset_offsets(self, request: ResetOffsetsRequest) -> None:
        """Move a group's committed offsets; a running group restarts from them."""
        runner = await self._runner_ready(request.group, create=True)
        await runner.reset_offsets(request.offsets)

    async def delete_offsets(self, request: DeleteOffsetsRequest) -> None:
        """Forget a group's offsets for partitions none of its members consume."""
        runner = await self._runner_ready(request.group, create=False)
        await runner.delete_offsets(request.partitions)

    def fetch_offsets(
        self, group_id: str, partitions: list[TopicPartition] | None
    ) -> list[PartitionOffset]:
        """A group's committed offsets (all, or those of ``partitions``)."""
        if partitions is None:
            return list(self.offsets_after(group_id, None))
        runner = self._runners.get(group_id)
        if runner is None:
            return []
        offsets = runner.group.offsets
        return [
            PartitionOffset(tp.topic, tp.partition, offsets[tp].offset, offsets[tp].metadata)
            for tp in partitions
            if tp in offsets
        ]

    def offsets_after(
        self, group_id: str, after: TopicPartition | None
    ) -> Iterator[PartitionOffset]:
        """A group's committed offsets after ``after`` (None: all), in order, each built as
        it is iterated (:meth:`Group.offsets_after`); none for a group not known here."""
        runner = self._runners.get(group_id)
        return iter(()) if runner is None else runner.group.offsets_after(after)

    def list_groups(self) -> list[GroupSummary]:
        """Every group this broker coordinates, sorted by id."""
        return [self._runners[g].group.summary() for g in sorted(self._runners)]

    def describe_group(self, group_id: str) -> GroupDescription:
        """One group's state, members, assignment and offsets."""
        runner = self._runners.get(group_id)
        if runner is None:
            raise GroupNotFoundError(f"group {group_id!r} does not exist")
        return runner.describe()

    def describe_group_page(
        self, group_id: str, start: str | None, after: TopicPartition | None = None
    ) -> tuple[GroupDescription, Iterator[MemberDescription], Iterator[PartitionOffset]]:
        """One group without its members or offsets, its members from id ``start`` on
        (None: none) and its offsets after ``after`` (None: all), each described as it is
        iterated (:meth:`GroupRunner.describe_page`)."""
        runner = self._runners.get(group_id)
        if runner is None:
            raise GroupNotFoundError(f"group {group_id!r} does not exist")
        return runner.describe_page(start, after)

    async def create_group(self, group_id: str) -> None:
        """Create an empty group (removed after the retention period if it stays unused)."""
        validate_group_id(group_id)
        if group_id in self._runners:
            raise GroupAlreadyExistsError(f"group {group_id!r} exists already")
        await self._writer.write([GroupRecord(group_id, 0, "", [])])

    async def delete_group(self, group_id: str) -> None:
        """Delete an empty group and its offsets."""
        runner = self._runners.get(group_id)
        if runner is None:
            raise GroupNotFoundError(f"group {group_id!r} does not exist")
        if runner.deleting:
            # A second tombstone would be written after the first, and by then a member
            # may have joined a new group of this name.
            raise GroupNotFoundError(f"group {group_id!r} is being deleted")
        if runner.group.members:
            raise NonEmptyGroupError(
                f"group {group_id!r} has {len(runner.group.members)} active member(s); "
                "stop its consumers before deleting it"
            )
        await self._delete(runner)

    async def _delete(self, runner: GroupRunner) -> None:
        """Make a group's tombstone durable; no member may join while it is written."""
        runner.deleting = True
        try:
            await self._writer.write([GroupTombstone(runner.group_id)])
        finally:
            runner.deleting = False  # (only matters if the write failed: it is gone otherwise)

    def runner(self, group_id: str) -> GroupRunner | None:
        """The runner of a group, if this broker has one (for tests and tools)."""
        return self._runners.get(group_id)

    # -- reactions ---------------------------------------------------------------------

    def _topic_changed(self, topic: str) -> None:
        count = self._topics.partitions.get(topic)
        change = (
            f"topic {topic} was deleted"
            if count is None
            else f"topic {topic} now has {count} partitions"
        )
        for runner in self._runners.values():
            group = runner.group
            if count is None and self._nursery is not None:
                if any(tp.topic == topic for tp in group.offsets):
                    self._nursery.start_soon(runner.forget_topic, topic)
            if group.state is GroupState.EMPTY:
                # No generation yet to redo. Members waiting for the first one (the
                # initial delay) get the topic when it plans: it matches the patterns.
                continue
            interested = False
            for member in group.members.values():
                if topic in member.topics:
                    interested = True
                elif any(p.fullmatch(topic) for p in subscription_patterns(member.topics)):
                    # A new topic matching the member's pattern: it is subscribed now (the
                    # next generation's record persists it; a rejoin matches it again).
                    member.topics = member.topics | {topic}
                    interested = True
            if interested:
                runner.request_rebalance(change)

    async def _sweep_empty_groups(self) -> None:
        retention = self._config.group_retention
        offsets_retention = self._config.offsets_retention
        period = min(retention, math.inf if offsets_retention is None else offsets_retention)
        while True:
            await trio.sleep(max(period / 4, 0.01))
            if offsets_retention is not None:
                await self._expire_offsets(offsets_retention)
            now = trio.current_time()
            for group_id in [g for g, r in self._runners.items() if r.is_removable(now, retention)]:
                # Deleting the previous group awaited the store: look at this one again.
                runner = self._runners.get(group_id)
                if (
                    runner is None
                    or runner.deleting
                    or not runner.is_removable(trio.current_time(), retention)
                ):
                    continue
                log.info("removing group %s: empty with no offsets for %gs", group_id, retention)
                try:
                    await self._delete(runner)
                except StoreError as exc:
                    log.warning("could not remove empty group %s: %s", group_id, exc)

    async def _expire_offsets(self, retention: float) -> None:
        """Delete the offsets of groups empty for ``retention`` (Kafka's offsets.retention)."""
        for runner in list(self._runners.values()):
            if runner.deleting or not runner.group.offsets:
                continue
            try:
                expired = await runner.expire_offsets(retention)
            except StoreError as exc:
                log.warning("could not expire offsets of group %s: %s", runner.group_id, exc)
                continue
            if expired:
                log.info(
                    "group %s: %d committed offset(s) expired (empty for %gs; offsets_retention)",
                    runner.group_id,
                    expired,
                    retention,
                )


def slot_of(group_id: str, slots: int) -> int:
    """The coordinator slot a group hashes onto (stable across processes and versions)."""
    return zlib.crc32(group_id.encode()) % slots


class Coordinators:
    """Routes group requests to the coordinator service of the group's slot.

    A single broker has one slot, always held. A broker of a cluster holds
    the slots it won; a request about a group of a slot it does not hold is
    answered NOT_COORDINATOR (the client asks Metadata again), and one about
    a slot it is still loading COORDINATOR_NOT_AVAILABLE (retry shortly).
    """

    def __init__(self, slots: int = 1, *, elected: bool = False) -> None:
        self.slots = slots
        self.elected = elected
        """Whether slots are won by election (a cluster): store failures then mean "moved"."""
        self.services: dict[int, CoordinatorService] = {}
        self.loading: set[int] = set()
        self.suspended = False
        """A cluster broker cut off from ZooKeeper: it may have lost its slots already."""
        self.max_groups_per_principal: int | None = None
        """Groups one principal may have members in, on this broker (None: no limit)."""

    @contextlib.contextmanager
    def _writing(self, group_id: str) -> Iterator[None]:
        """In a cluster, say what a failed store write means to the client: the group moves.

        A fenced write (BadVersionError from the slot's epoch check) is
        NOT_COORDINATOR: another broker holds the slot now. Any other store
        failure (a lost connection, an expired session) is
        COORDINATOR_NOT_AVAILABLE: this broker is about to lose the slot or
        get it back. Both are retriable; the client finds the coordinator again.
        """
        try:
            yield
        except BadVersionError as exc:
            if not self.elected:
                raise
            raise NotCoordinatorError(
                f"this broker was deposed as coordinator of group {group_id!r}; its write "
                f"was fenced ({exc}); ask Metadata for the new coordinator"
            ) from None
        except StoreError as exc:
            if not self.elected:
                raise
            raise CoordinatorNotAvailableError(
                f"the coordinator of group {group_id!r} could not write to ZooKeeper ({exc}); "
                "retry shortly"
            ) from None

    def slot_of(self, group_id: str) -> int:
        """The slot ``group_id`` belongs to."""
        return slot_of(group_id, self.slots)

    def service(self, group_id: str) -> CoordinatorService:
        """The service coordinating ``group_id`` here; NOT_COORDINATOR if none."""
        slot = self.slot_of(group_id)
        service = self.services.get(slot)
        if self.suspended and service is not None:
            raise CoordinatorNotAvailableError(
                f"the coordinator of group {group_id!r} lost its connection to ZooKeeper and "
                "may no longer hold the group; retry shortly"
            )
        if service is None:
            if slot in self.loading:
                raise CoordinatorNotAvailableError(
                    f"this broker is loading the groups of slot {slot} (group {group_id!r}); "
                    "retry shortly"
                )
            raise NotCoordinatorError(
                f"this broker does not coordinate group {group_id!r} (slot {slot}); "
                "ask Metadata for its coordinator"
            )
        return service

    # -- routed requests (see CoordinatorService for each) --------------------------------

    async def join(self, request: JoinGroupRequest, conn: MemberLink) -> JoinGroupResponse:
        """Admit a member (see :meth:`CoordinatorService.join`)."""
        if self.max_groups_per_principal is not None:
            self._check_group_limit(request.group, getattr(conn, "principal", ANONYMOUS))
        with self._writing(request.group):
            return await self.service(request.group).join(request, conn)

    def join_now(self, request: JoinGroupRequest, conn: MemberLink) -> JoinGroupResponse | None:
        """Admit a member at once, or None to wait (:meth:`CoordinatorService.join_now`)."""
        if self.max_groups_per_principal is not None:
            self._check_group_limit(request.group, getattr(conn, "principal", ANONYMOUS))
        with self._writing(request.group):
            return self.service(request.group).join_now(request, conn)

    def heartbeat(self, request: HeartbeatRequest) -> None:
        """Accept a heartbeat (see :meth:`CoordinatorService.heartbeat`)."""
        self.service(request.group).heartbeat(request)

    async def leave(self, request: LeaveGroupRequest) -> None:
        """A member leaves (see :meth:`CoordinatorService.leave`)."""
        with self._writing(request.group):
            await self.service(request.group).leave(request)

    async def commit(self, request: OffsetCommitRequest) -> None:
        """Commit offsets (see :meth:`CoordinatorService.commit`)."""
        with self._writing(request.group):
            await self.service(request.group).commit(request)

    async def reset_offsets(self, request: ResetOffsetsRequest) -> None:
        """Move offsets (see :meth:`CoordinatorService.reset_offsets`)."""
        with self._writing(request.group):
            await self.service(request.group).reset_offsets(request)

    async def delete_offsets(self, request: DeleteOffsetsRequest) -> None:
        """Forget offsets (see :meth:`CoordinatorService.delete_offsets`)."""
        with self._writing(request.group):
            await self.service(request.group).delete_offsets(request)

    def fetch_offsets(
        self, group_id: str, partitions: list[TopicPartition] | None
    ) -> list[PartitionOffset]:
        """Committed offsets (see :meth:`CoordinatorService.fetch_offsets`)."""
        return self.service(group_id).fetch_offsets(group_id, partitions)

    def offsets_after(
        self, group_id: str, after: TopicPartition | None
    ) -> Iterator[PartitionOffset]:
        """A page's worth of offsets (see :meth:`CoordinatorService.offsets_after`)."""
        return self.service(group_id).offsets_after(group_id, after)

    def describe_group(self, group_id: str) -> GroupDescription:
        """One group (see :meth:`CoordinatorService.describe_group`)."""
        return self.service(group_id).describe_group(group_id)

    def describe_group_page(
        self, group_id: str, start: str | None, after: TopicPartition | None = None
    ) -> tuple[GroupDescription, Iterator[MemberDescription], Iterator[PartitionOffset]]:
        """One page's worth of a group (see :meth:`CoordinatorService.describe_group_page`)."""
        return self.service(group_id).describe_group_page(group_id, start, after)

    async def create_group(self, group_id: str) -> None:
        """Create an empty group (see :meth:`CoordinatorService.create_group`)."""
        validate_group_id(group_id)
        with self._writing(group_id):
            await self.service(group_id).create_group(group_id)

    async def delete_group(self, group_id: str) -> None:
        """Delete an empty group (see :meth:`CoordinatorService.delete_group`)."""
        with self._writing(group_id):
            await self.service(group_id).delete_group(group_id)

    def list_groups(self) -> list[GroupSummary]:
        """Every group this broker coordinates, sorted by id."""
        groups = [g for service in self.services.values() for g in service.list_groups()]
        return sorted(groups, key=lambda g: g.group_id)

    def groups_by_slot(self) -> dict[int, list[str]]:
        """The ids of the groups this broker coordinates, per slot it holds."""
        return {
            slot: [g.group_id for g in service.list_groups()]
            for slot, service in sorted(self.services.items())
        }

    def runner(self, group_id: str) -> GroupRunner | None:
        """The runner of a group, if this broker coordinates it (for tests and tools)."""
        service = self.services.get(self.slot_of(group_id))
        return None if service is None else service.runner(group_id)

    def _check_group_limit(self, group_id: str, principal: str) -> None:
        """ResourcesExhaustedError if joining ``group_id`` takes ``principal`` over its limit.

        O(members of this broker): joins only, and only with the limit set.
        """
        limit = self.max_groups_per_principal
        assert limit is not None
        runner = self.runner(group_id)
        if runner is not None and runner.has_owner(principal):
            return  # (a group it is in already)
        count = sum(
            1
            for service in self.services.values()
            for other in service.runners()
            if other.has_owner(principal)
        )
        if count >= limit:
            raise ResourcesExhaustedError(
                f"{principal} has members in {count} groups on this broker "
                f"(max_groups_per_principal {limit}); leave one, or raise the limit"
            )

    def check_owner(self, group_id: str, member_id: str, principal: str) -> None:
        """AuthorizationError unless ``principal`` joined as ``member_id`` (see GroupRunner)."""
        runner = self.runner(group_id)
        if runner is not None and member_id:
            runner.check_owner(member_id, principal)

    def committed_offset(self, group_id: str, tp: TopicPartition) -> int | None:
        """The durable committed offset of ``group_id`` on ``tp`` (None if none here)."""
        service = self.services.get(self.slot_of(group_id))
        return None if service is None else service.committed_offset(group_id, tp)

    def connection_lost(self, conn: MemberLink) -> None:
        """Remove the members that lived on ``conn``, in every slot."""
        for service in list(self.services.values()):
            service.connection_lost(conn)
