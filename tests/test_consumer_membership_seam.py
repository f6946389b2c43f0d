"""A consumer's group membership on its own: no Consumer, no broker, no sockets.

``GroupMembership`` is driven through its narrow interface: the coordinator's
pushes on one side; on the other a fake fetcher (:class:`FetchControl`) and
the application's callbacks (:class:`RebalanceListener`). What an application
relies on: a start owns exactly its partitions and says so to ``on_assigned``;
a stop freezes them before ``on_revoked`` and hands back what was consumed,
and says it again to a restarted rebalance without revoking twice; a
cooperative stop gives up only what it names; and an application that stops
asking for records loses its partitions (``on_lost``) and its commits are
refused, saying why, until it asks again.
"""

from __future__ import annotations

from collections.abc import Iterable

import pytest
import trio

from trio_coord.client._bootstrap import Bootstrap
from trio_coord.client._membership import (
    ConsumerState,
    GroupMembership,
    MembershipSettings,
    RebalanceListener,
    _Reconnect,
)
from trio_coord.protocol import StopFetchersRequest
from trio_coord.protocol.errors import IllegalGenerationError, UnknownMemberError
from trio_coord.protocol.messages import (
    HeartbeatRequest,
    HeartbeatResponse,
    JoinGroupRequest,
    JoinGroupResponse,
    LeaveGroupRequest,
    LeaveGroupResponse,
    OffsetCommitRequest,
    OffsetCommitResponse,
    PartitionOffset,
    StartFetchersRequest,
    StopFetchersResponse,
    TopicPartition,
)

S = 3.0  # session timeout
POLL = 20.0  # max_poll_interval


def tp(p: int) -> TopicPartition:
    return TopicPartition("t", p)


class FakeFetcher:
    """The fetcher's side of ownership, recorded: each partition is consumed up to its
    start offset + 5 (what a stop hands back)."""

    def __init__(self) -> None:
        self.owned: dict[TopicPartition, int] = {}
        self.frozen: set[TopicPartition] = set()
        self.calls: list[str] = []

    @property
    def cluster(self):
        raise AssertionError("no broker lists were pushed, so none is learnt")

    def add(self, offsets: dict[TopicPartition, int]) -> None:
        self.calls.append("add")
        self.owned.update(offsets)

    def remove(self, tps: Iterable[TopicPartition]) -> None:
        self.calls.append("remove")
        for each in tps:
            self.owned.pop(each, None)

    def freeze(self, tps: Iterable[TopicPartition] | None = None) -> None:
        self.calls.append("freeze")
        self.frozen |= set(self.owned if tps is None else tps)

    def drop(self) -> list[TopicPartition]:
        self.calls.append("drop")
        owned = sorted(self.owned)
        self.owned, self.frozen = {}, set()
        return owned

    def consumed(self, tps: Iterable[TopicPartition] | None = None) -> list[PartitionOffset]:
        wanted = self.owned if tps is None else tps
        return [PartitionOffset(t.topic, t.partition, self.owned[t] + 5) for t in sorted(wanted)]

    def take_dirty(self) -> list[PartitionOffset]:
        return []

    def return_dirty(self, positions: Iterable[PartitionOffset]) -> None:
        pass

    def wake(self) -> None:
        pass


def make(*, protocol: str = "eager") -> tuple[GroupMembership, FakeFetcher, list[tuple]]:
    heard: list[tuple] = []
    fetcher = FakeFetcher()

    async def revoked(partitions):
        # What the application sees while it revokes: nothing more is handed out.
        heard.append(("revoked", partitions, sorted(fetcher.frozen)))

    membership = GroupMembership(
        MembershipSettings(
            group_id="g",
            client_id="c",
            instance_id="",
            session_timeout=S,
            rebalance_timeout=S,
            max_poll_interval=POLL,
            request_timeout=S,
            api_timeout=S,
            auto_commit=True,
            offset_reset="earliest",
            rebalance_protocol=protocol,  # type: ignore[arg-type]
            assignors=["range"],
        ),
        ["t"],
        listener=RebalanceListener(
            on_assigned=lambda ps: heard.append(("assigned", ps)),
            on_revoked=revoked,
            on_lost=lambda ps: heard.append(("lost", ps)),
        ),
        bootstrap=Bootstrap("127.0.0.1:1", request_timeout=S),
        fetcher=fetcher,
    )
    # As if joined as member "m" with a heartbeat just accepted.
    membership.member_id = "m"
    membership._member_ready.set()
    membership._renew_lease(trio.current_time())
    return membership, fetcher, heard


def start(generation: int, *offsets: tuple[int, int], incremental: bool = False):
    partitions = [PartitionOffset("t", p, off) for p, off in offsets]
    return StartFetchersRequest("g", "m", generation, partitions, incremental=incremental)


async def test_a_start_owns_its_partitions_and_a_stop_hands_back_what_was_consumed():
    membership, fetcher, heard = make()
    push = membership._handler.handle
    await push(start(2, (1, 40), (0, 10)))
    assert fetcher.owned == {tp(0): 10, tp(1): 40}
    assert membership.state is ConsumerState.STABLE and membership.generation == 2
    assert dict(membership.assignment) == {tp(0): 10, tp(1): 40}
    assert heard == [("assigned", [tp(0), tp(1)])]

    answer = await push(StopFetchersRequest("g", "m", 2))
    assert isinstance(answer, StopFetchersResponse)
    assert answer.positions == [PartitionOffset("t", 0, 15), PartitionOffset("t", 1, 45)]
    # Frozen before on_revoked ran, and forgotten after it.
    assert heard[1] == ("revoked", [tp(0), tp(1)], [tp(0), tp(1)])
    assert fetcher.owned == {} and dict(membership.assignment) == {}
    assert membership.state is ConsumerState.REBALANCING

    # A restarted rebalance asks again: the same positions, and no second on_revoked.
    again = await push(StopFetchersRequest("g", "m", 3))
    assert isinstance(again, StopFetchersResponse)
    assert again.positions == answer.positions
    assert len(heard) == 2


async def test_a_cooperative_stop_gives_up_only_what_it_names_and_a_start_only_adds():
    membership, fetcher, heard = make(protocol="cooperative")
    push = membership._handler.handle
    await push(start(2, (0, 10), (1, 40)))
    answer = await push(StopFetchersRequest("g", "m", 2, [tp(1)]))
    assert isinstance(answer, StopFetchersResponse)
    assert answer.positions == [PartitionOffset("t", 1, 45)]
    assert fetcher.owned == {tp(0): 10}  # t-0 kept flowing
    await push(start(3, (0, 10), (2, 70), incremental=True))
    assert fetcher.owned == {tp(0): 10, tp(2): 70}
    assert heard == [
        ("assigned", [tp(0), tp(1)]),
        ("revoked", [tp(1)], [tp(1)]),
        ("assigned", [tp(2)]),  # only what is new
    ]
    assert fetcher.calls == ["add", "freeze", "remove", "add"]


async def test_an_application_that_stops_asking_loses_its_partitions_until_it_asks_again(
    autojump_clock,
):
    membership, fetcher, heard = make()
    async with trio.open_nursery() as nursery:
        nursery.start_soon(membership._poll_watchdog)
        await membership._handler.handle(start(2, (0, 10)))
        membership.start_poll_clock()
        with membership.asking():  # waiting for records: the clock stands still
            await trio.sleep(POLL * 2)
            membership._renew_lease(trio.current_time())  # (the heartbeats go on)
        assert membership.state is ConsumerState.STABLE
        await trio.sleep(POLL + 1)  # then it asks for nothing for longer than POLL
        assert heard[-1] == ("lost", [tp(0)])  # not connected: nobody took a clean revoke
        assert membership.left and fetcher.owned == {}
        with pytest.raises(UnknownMemberError, match="max_poll_interval"):
            membership.coordinator()
        with membership.asking():  # asking again rejoins (once the session runs)
            assert membership._asked_again.is_set()
        nursery.cancel_scope.cancel()


@pytest.mark.parametrize("protocol", ["eager", "cooperative"])
async def test_a_stop_that_finds_the_lease_run_out_says_lost_not_revoked(autojump_clock, protocol):
    # A process stalled past its session: the coordinator may have given its
    # partitions to another member before this stop (or close) is answered, so the
    # application must not be told it still owned them until now.
    membership, fetcher, heard = make(protocol=protocol)
    push = membership._handler.handle
    await push(start(2, (0, 10), (1, 40)))
    await trio.sleep(S + 0.1)  # no heartbeat accepted for a session timeout
    assert not membership.holds_lease()
    stop = StopFetchersRequest("g", "m", 2, [tp(1)] if protocol == "cooperative" else None)
    answer = await push(stop)
    assert isinstance(answer, StopFetchersResponse)
    gone = [tp(1)] if protocol == "cooperative" else [tp(0), tp(1)]
    assert heard == [("assigned", [tp(0), tp(1)]), ("lost", gone)]
    assert not any(event[0] == "revoked" for event in heard)
    assert set(fetcher.owned).isdisjoint(gone)  # given up all the same


class AcceptingCoordinator:
    """A coordinator connection that accepts every JoinGroup of member "m"."""

    name = "coordinator"
    max_frame_size = 1024 * 1024

    def __init__(self) -> None:
        self.joins: list[JoinGroupRequest] = []

    async def request(self, body):
        self.joins.append(body)
        return JoinGroupResponse("m", 7, round(S * 1000))


async def test_a_rejoin_accepted_after_the_lease_ran_out_loses_what_was_owned(autojump_clock):
    # The watchdog had not run yet (a stalled process), and a rejoin is accepted: the
    # coordinator may have expelled the member and handed its partitions to another
    # meanwhile. Renewing the lease must not carry them into the new session (which the
    # next start would then hand it again, "assigned" while already owned).
    membership, fetcher, heard = make()
    await membership._handler.handle(start(2, (0, 10)))
    await trio.sleep(S + 0.1)
    coordinator = AcceptingCoordinator()
    await membership._join(coordinator)  # type: ignore[arg-type]
    assert coordinator.joins[0].owned == []  # said to the coordinator too
    assert heard == [("assigned", [tp(0)]), ("lost", [tp(0)])]
    assert fetcher.owned == {} and dict(membership.assignment) == {}
    assert membership.holds_lease() and membership.state is ConsumerState.REBALANCING
    await membership._handler.handle(start(8, (0, 12)))
    assert heard[-1] == ("assigned", [tp(0)])  # owned once again, after it was lost


async def test_a_rejoin_within_the_lease_keeps_fetching(autojump_clock):
    membership, fetcher, heard = make(protocol="cooperative")
    await membership._handler.handle(start(2, (0, 10)))
    await trio.sleep(S / 2)
    coordinator = AcceptingCoordinator()
    await membership._join(coordinator)  # type: ignore[arg-type]
    assert coordinator.joins[0].owned == [tp(0)]
    assert heard == [("assigned", [tp(0)])]
    assert fetcher.owned == {tp(0): 10} and membership.state is ConsumerState.STABLE


async def test_an_eager_start_over_what_is_owned_says_only_what_changed():
    # A start with no stop before it: the coordinator that would have stopped the member
    # died, and the member kept its partitions through the rejoin within its lease. Kept
    # partitions go on fetching from where they are, and on_assigned hears only of the new
    # ones (twice "assigned" for one partition is two owners to an application); one
    # owned and not in the start was taken without a revoke: lost.
    membership, fetcher, heard = make()
    push = membership._handler.handle
    await push(start(2, (0, 10), (2, 30)))
    await push(start(5, (0, 99), (1, 40)))
    assert heard == [("assigned", [tp(0), tp(2)]), ("lost", [tp(2)]), ("assigned", [tp(1)])]
    assert fetcher.owned == {tp(0): 10, tp(1): 40}  # t-0 where it was, not back at 99
    assert dict(membership.assignment) == {tp(0): 10, tp(1): 40}
    assert membership.generation == 5 and membership.state is ConsumerState.STABLE


class CommittingCoordinator:
    """A coordinator connection of a small frame (a list of about 120 positions fits one
    message) that records the commits and leaves it is sent; with ``stall``, a commit is
    never answered (a store that stopped writing)."""

    name = "coordinator"
    max_frame_size = 4096
    closed = False

    def __init__(self, *, stall: bool = False) -> None:
        self.stall = stall
        self.commits: list[OffsetCommitRequest] = []
        self.leaves: list[LeaveGroupRequest] = []

    async def request(self, body):
        if isinstance(body, OffsetCommitRequest):
            self.commits.append(body)
            if self.stall:
                await trio.sleep_forever()
            return OffsetCommitResponse()
        assert isinstance(body, LeaveGroupRequest)
        self.leaves.append(body)
        return LeaveGroupResponse()

    def committed(self) -> list[PartitionOffset]:
        return [p for commit in self.commits for p in commit.offsets]


MANY = [(p, 10) for p in range(500)]  # (handed back at 15: about 4 KB of positions)
HANDED_BACK = [PartitionOffset("t", p, 15) for p, _ in MANY]


def by_tp(position: PartitionOffset) -> TopicPartition:
    return position.tp


async def test_a_restarted_stop_says_again_only_what_was_not_committed_yet():
    membership, _, _ = make()
    push = membership._handler.handle
    await push(start(2, *MANY))
    coordinator = CommittingCoordinator()
    membership._conn = coordinator  # type: ignore[assignment]
    answer = await push(StopFetchersRequest("g", "m", 2))
    assert isinstance(answer, StopFetchersResponse)
    assert coordinator.commits  # the rest went ahead of the answer, durably
    assert sorted(answer.positions + coordinator.committed(), key=by_tp) == HANDED_BACK
    commits = len(coordinator.commits)
    # A restarted rebalance asks again: what is durable is not committed (nor refused,
    # and logged as lost) a second time.
    again = await push(StopFetchersRequest("g", "m", 3))
    assert isinstance(again, StopFetchersResponse)
    assert again.positions == answer.positions
    assert len(coordinator.commits) == commits


async def test_a_leave_whose_commits_stall_is_still_sent_in_time(autojump_clock):
    membership, _, _ = make()
    await membership._handler.handle(start(2, *MANY))
    coordinator = CommittingCoordinator(stall=True)
    membership._conn = coordinator  # type: ignore[assignment]
    with trio.move_on_after(5) as scope:  # (as a consumer's close leaves)
        await membership.leave()
    # One commit after another, each waited for request_timeout (3 s), the leave never
    # went: its positions were lost and the group waited a session for the member.
    assert not scope.cancelled_caught
    (leave,) = coordinator.leaves
    assert sorted(leave.positions + coordinator.committed(), key=by_tp) == HANDED_BACK


class RefusingSecondHeartbeat:
    """A coordinator connection of a small frame that accepts one heartbeat, then says
    the group moved to a new generation."""

    name = "coordinator"
    max_frame_size = 4096

    def __init__(self) -> None:
        self.heartbeats: list[HeartbeatRequest] = []

    async def request(self, body):
        assert isinstance(body, HeartbeatRequest)
        self.heartbeats.append(body)
        if len(self.heartbeats) > 1:
            raise IllegalGenerationError("the group is at generation 3")
        return HeartbeatResponse()


async def test_positions_a_refused_heartbeat_did_not_deliver_are_said_again():
    membership, fetcher, _ = make()
    await membership._handler.handle(start(2, *MANY))
    returned: list[PartitionOffset] = []
    fetcher.take_dirty = lambda: list(HANDED_BACK)  # type: ignore[method-assign]
    fetcher.return_dirty = returned.extend  # type: ignore[method-assign]
    coordinator = RefusingSecondHeartbeat()
    membership._conn = coordinator  # type: ignore[assignment]
    with pytest.raises(_Reconnect):
        await membership._heartbeat(coordinator)  # type: ignore[arg-type]
    # The first part was accepted; the rest go again on the next session's heartbeats
    # (they were dropped: a consumer that had read everything never said them again).
    first = coordinator.heartbeats[0].positions
    assert sorted(first + returned, key=by_tp) == HANDED_BACK
    assert returned
