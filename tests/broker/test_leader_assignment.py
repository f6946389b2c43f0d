"""Leader-side assignment: an assignor the broker lacks runs on the group's leader.

Members name an assignor only they have (``client_assignors`` in JoinGroup);
the coordinator picks the first member that can compute it as the leader,
pushes it every member's subscription, ownership and opaque user data
(ComputeAssignment), checks the answer and distributes it. A leader that
dies while computing restarts the rebalance at that very moment with the
next leader. The assignor here is the test's own: it deals partitions in
proportion to a weight each member puts in its user data.
"""

from __future__ import annotations

import contextlib
import logging
from contextlib import AsyncExitStack

import pytest
import trio

from trio_coord import (
    InconsistentAssignorError,
    TopicPartition,
    open_admin,
    open_broker,
    open_consumer,
)
from trio_coord.broker.events import GroupEvent, Removed
from trio_coord.core.assignors import Assignment, GroupSpec
from trio_coord.protocol.errors import CoordError

from .harness import FakeMember, Recorder, Timeline, connected, ephemeral_broker, join_one_by_one

S = 10.0


class Weighted:
    """Each member gets a share of every topic proportional to ``int(user_data or 1)``."""

    name = "weighted"

    def assign(self, spec: GroupSpec) -> Assignment:
        result: Assignment = {m: [] for m in sorted(spec.members)}
        for topic in spec.topics():
            members = spec.subscribers(topic)
            slots = [m for m in members for _ in range(int(spec.members[m].user_data or b"1"))]
            for p in range(spec.partitions[topic]):
                result[slots[p % len(slots)]].append(TopicPartition(topic, p))
        return result


def leaders(broker, timeline, *names):
    return [
        FakeMember(
            broker,
            "g",
            ["t"],
            session_timeout=S,
            rebalance_timeout=5.0,
            timeline=timeline,
            name=name,
            assignors=["weighted"],
            compute=Weighted(),
        )
        for name in names
    ]


async def test_the_leader_computes_with_the_applications_assignor(autojump_clock):
    rec, timeline = Recorder(), Timeline()
    async with ephemeral_broker(on_event=rec) as broker:
        await broker.topics.create_topic("t", 6)
        a, b = leaders(broker, timeline, "a", "b")
        async with connected(a), connected(b):
            await a.join()
            await rec.wait_for("stable", generation=1)
            await b.join()
            await rec.wait_for("stable", generation=2)
            asked = rec.all("compute_requested")
            assert [(e["leader"], e["assignor"]) for e in asked] == [
                (a.member_id, "weighted"),
                (a.member_id, "weighted"),
            ]
            assert [p for _, p in a.pushes].count("compute") == 2 and "compute" not in [
                p for _, p in b.pushes
            ]
            assert a.owned == [TopicPartition("t", p) for p in (0, 2, 4)]
            assert b.owned == [TopicPartition("t", p) for p in (1, 3, 5)]
            runner = broker.coordinator.runner("g")
            assert runner is not None and runner.group.assignor == "weighted"
        assert timeline.overlaps() == []


async def test_a_leader_dying_mid_computation_restarts_with_the_next_leader_at_once(
    autojump_clock,
):
    rec, timeline = Recorder(), Timeline()
    async with ephemeral_broker(on_event=rec) as broker:
        await broker.topics.create_topic("t", 6)
        a, b = leaders(broker, timeline, "a", "b")
        async with connected(a), connected(b):
            await a.join()  # at t=0, its last word: its lease ends at S
            await rec.wait_for("stable", generation=1)
            await trio.sleep_until(1.0)
            a.hold_compute = True  # a will never finish the next computation
            mark = rec.mark()
            await b.join()
            await rec.wait_for("compute_requested", since=mark, leader=a.member_id)
            await trio.sleep_until(2.0)
            await a.crash()
            timeline.stop_at(a.member_id, S)  # type: ignore[attr-defined]
            again = await rec.wait_for("compute_requested", since=mark, leader=b.member_id)
            assert again["time"] == 2.0  # not at a's rebalance timeout (1 + 5)
            started = rec.all("rebalance_started", since=mark)
            assert [e["time"] for e in started] == [1.0, 2.0]
            stable = await rec.wait_for("stable", since=mark)
            # a had acknowledged its stop before computing: nothing to wait for.
            assert stable["time"] == 2.0
            assert b.owned == [TopicPartition("t", p) for p in range(6)]
        assert timeline.overlaps() == []


async def test_consumers_with_an_assignor_of_their_own(tmp_path):
    async with open_broker(tmp_path, min_session_timeout=0.05) as broker:
        async with open_admin(broker.bootstrap) as admin:
            await admin.create_topic("t", 6)
        options = dict(session_timeout=1.0, assignors=[Weighted()])
        async with (
            open_consumer(broker.bootstrap, "g", ["t"], user_data=b"2", **options) as heavy,
            open_consumer(broker.bootstrap, "g", ["t"], user_data=b"1", **options) as light,
        ):
            with trio.fail_after(10):
                while sorted([len(heavy.assignment), len(light.assignment)]) != [2, 4]:
                    await trio.sleep(0.01)
            assert len(heavy.assignment) == 4
            # A member naming an assignor nobody in the group can compute is refused.
            with pytest.raises(InconsistentAssignorError, match="who all accept: weighted"):
                async with open_consumer(
                    broker.bootstrap, "g", ["t"], session_timeout=1.0, assignors=["unknown"]
                ):
                    pass
            async with open_admin(broker.bootstrap) as admin:
                assert (await admin.describe_group("g")).assignor == "weighted"


def test_a_consumer_refuses_an_assignor_object_with_a_builtin_name():
    class Impostor(Weighted):
        name = "range"

    with pytest.raises(ValueError, match="built-in"):
        open_consumer("127.0.0.1:1", "g", ["t"], assignors=[Impostor()])


class Forgetful(Weighted):
    """Forgets the last partition: an incomplete assignment."""

    def assign(self, spec: GroupSpec) -> Assignment:
        result = super().assign(spec)
        for partitions in result.values():
            if partitions:
                partitions.pop()
        return result


async def test_a_broken_assignment_from_the_leader_fails_the_rebalance_and_says_whose(
    autojump_clock,
):
    rec, timeline = Recorder(), Timeline()
    async with ephemeral_broker(on_event=rec) as broker:
        await broker.topics.create_topic("t", 3)
        (a,) = leaders(broker, timeline, "a")
        a.compute = Forgetful()
        async with connected(a):
            await a.join()
            failed = await rec.wait_for("rebalance_failed")
            assert f"assignor 'weighted' (computed by leader {a.member_id})" in failed["error"]
            assert "assigned to no member: t-2" in failed["error"]
            assert rec.all("started") == []  # nobody was started with it
            a.compute = Weighted()  # fixed (say, a new release): the retry succeeds
            stable = await rec.wait_for("stable")
            assert a.owned == [TopicPartition("t", p) for p in range(3)]
            assert stable["generation"] == 1


async def test_a_cooperative_group_asks_its_leader_first_and_stops_only_what_moves(
    autojump_clock,
):
    rec, timeline = Recorder(), Timeline()
    async with ephemeral_broker(on_event=rec) as broker:
        await broker.topics.create_topic("t", 6)
        a, b = leaders(broker, timeline, "a", "b")
        for m in (a, b):
            m.protocol = "cooperative"
        async with connected(a), connected(b):
            await a.join()
            await rec.wait_for("stable", generation=1)
            mark = rec.mark()
            await b.join()
            await rec.wait_for("stable", since=mark)
            kinds = [w for w, _ in rec.events[mark:]]
            # The leader computes before anything stops; then only a gives partitions up.
            assert kinds.index("compute_requested") < kinds.index("revoking")
            assert [tps for _, tps in a.stops] == [[TopicPartition("t", p) for p in (1, 3, 5)]]
            assert b.stops == []
            assert a.owned == [TopicPartition("t", p) for p in (0, 2, 4)]
        assert timeline.overlaps() == []


class Failing(Weighted):
    """Raises once the group has two members: an application's bug."""

    def assign(self, spec: GroupSpec) -> Assignment:
        if len(spec.members) >= 2:
            raise ValueError("boom")
        return super().assign(spec)


async def test_a_leader_whose_assignor_raises_fails_the_rebalance_and_is_not_expelled(
    autojump_clock,
):
    """The error fails the rebalance, naming the leader and the exception; the leader
    stays a member (no expel-and-rejoin loop); the retry comes after the backoff, or
    at once when the membership changes (a real consumer leaves: see below)."""
    rec, timeline = Recorder(), Timeline()
    async with ephemeral_broker(on_event=rec) as broker:
        await broker.topics.create_topic("t", 4)
        a, b = leaders(broker, timeline, "a", "b")
        a.compute = b.compute = Failing()
        async with connected(a), connected(b):
            await a.join()
            await rec.wait_for("stable", generation=1)
            await trio.sleep_until(1.0)
            mark = rec.mark()
            await b.join()
            leader = min(a, b, key=lambda m: m.member_id)
            failed = await rec.wait_for("rebalance_failed", since=mark)
            assert failed["time"] == 1.0
            assert f"leader {leader.member_id} of group g" in failed["error"]
            assert "'weighted'" in failed["error"] and "ValueError: boom" in failed["error"]
            again = await rec.wait_for("rebalance_failed", since=mark, time=2.0)
            assert again["error"] == failed["error"]
            assert rec.all("removed", since=mark) == []  # nobody expelled, no rejoins
            assert rec.all("joined", since=mark) == [
                {"group": "g", "time": 1.0, "member_id": b.member_id}
            ]
            await trio.sleep_until(2.5)
            await leader.leave()  # what a consumer does when its assignor raised
            stable = await rec.wait_for("stable", since=mark)
            assert stable["time"] == 2.5
            other = b if leader is a else a
            assert other.owned == [TopicPartition("t", p) for p in range(4)]
        assert timeline.overlaps() == []


async def test_a_consumer_whose_assignor_raises_leaves_and_raises_it(tmp_path):
    """Real consumers: the leader's assignor raises; that consumer leaves the group and
    raises the assignor's exception from its ``async with``; the other carries on."""
    events: list[GroupEvent] = []
    async with open_broker(tmp_path, min_session_timeout=0.05, on_event=events.append) as broker:
        async with open_admin(broker.bootstrap) as admin:
            await admin.create_topic("t", 4)
        # Only the second consumer can compute "weighted"; alone, the first uses range.
        async with open_consumer(
            broker.bootstrap, "g", ["t"], session_timeout=1.0, assignors=["weighted", "range"]
        ) as first:
            with trio.fail_after(10):
                await first.wait_assigned()
            with trio.fail_after(10), pytest.raises(ValueError, match="boom") as raised:
                async with open_consumer(
                    broker.bootstrap, "g", ["t"], session_timeout=1.0, assignors=[Failing()]
                ) as second:
                    await trio.sleep_forever()
            assert "raised by assignor 'weighted'" in "".join(raised.value.__notes__)
            with trio.fail_after(10):
                while len(first.assignment) != 4:
                    await trio.sleep(0.01)
            async with open_admin(broker.bootstrap) as admin:
                described = await admin.describe_group("g")
            assert [m.member_id for m in described.members] == [first.member_id]
            assert described.assignor == "range"
        # It left (no expulsion), once: whether its LeaveGroup overtook its error answer
        # or not, the group went on without it.
        removed = [(e.member_id, e.reason) for e in events if isinstance(e, Removed)]
        assert removed[0] == (second.member_id, "left the group: its assignor failed")
        assert [m for m, _ in removed].count(second.member_id) == 1


@pytest.mark.parametrize(
    ("frame", "names", "said"),
    [
        # Five members with ~14 KB subscriptions each overflow the broker's 64 KiB frame.
        (64 * 1024, 58, "do not fit one frame to its leader"),
        # Five with 250 KB each make 1.2 MB: within the broker's 4 MiB frame, not within
        # the 1 MiB its leader reads (pushed, the leader refused it and closed its
        # connection, and was expelled; then the next leader).
        (4 << 20, 999, "do not fit the 1048576-byte frame its leader reads"),
    ],
)
async def test_a_group_too_large_for_one_frame_to_its_leader_says_so_and_stays_alive(
    autojump_clock, caplog, frame, names, said
):
    # The rebalance fails with an error that says what to do, nobody is expelled for
    # it, and the broker keeps serving (and retrying: a smaller group would form).
    rec = Recorder()
    long = ["t", *(f"{i:03d}-" + "x" * 236 for i in range(names))]
    async with ephemeral_broker(on_event=rec, max_frame_size=frame) as broker:
        await broker.topics.create_topic("t", 4)
        members = [
            FakeMember(broker, "g", long, session_timeout=S, name=f"m{i}", assignors=["weighted"])
            for i in range(5)
        ]
        members[0].compute = Weighted()
        async with AsyncExitStack() as stack:
            for member in members:
                await stack.enter_async_context(connected(member))
                await member.join()
            await rec.wait_for("rebalance_failed")
            assert said in caplog.text
            assert "assignor that runs on the broker" in caplog.text
            assert not [e for e in rec.typed if isinstance(e, Removed)]
            described = broker.coordinator.describe_group("g")
            assert len(described.members) == 5 and described.state != "STABLE"


async def test_members_left_without_one_that_computes_their_assignor_wait_and_say_why(
    tmp_path, caplog
):
    # The only member that could compute "weighted" left: the others, which accept it
    # but cannot compute it, got no partitions and the broker logged "rebalance failed
    # (a bug)", with a traceback, at each retry. They wait, the log says why, and a
    # member that can compute it, joining, makes the group assign again.
    async with open_broker(tmp_path, min_session_timeout=0.05) as broker:
        async with open_admin(broker.bootstrap) as admin:
            await admin.create_topic("t", 4)
        options = dict(session_timeout=1.0)

        def computing():
            return open_consumer(broker.bootstrap, "g", ["t"], assignors=[Weighted()], **options)

        leave = trio.Event()

        async def first_computer(task_status=trio.TASK_STATUS_IGNORED):
            async with computing() as computer:
                task_status.started(computer)
                await leave.wait()

        async with trio.open_nursery() as nursery:
            computer = await nursery.start(first_computer)
            async with open_consumer(
                broker.bootstrap, "g", ["t"], assignors=["weighted"], **options
            ) as follower:
                with trio.fail_after(10):
                    while len(follower.assignment) + len(computer.assignment) < 4:
                        await trio.sleep(0.01)
                leave.set()  # the only member that computes "weighted" leaves
                with trio.fail_after(10):
                    while "no member of group g can compute" not in caplog.text:
                        await trio.sleep(0.01)
                assert follower.assignment == {}
                assert "(a bug)" not in caplog.text
                assert "assignor (weighted), and the broker has none of them" in caplog.text
                async with computing() as computer:
                    with trio.fail_after(10):
                        while len(follower.assignment) + len(computer.assignment) < 4:
                            await trio.sleep(0.01)


async def test_members_waiting_for_one_that_computes_their_assignor_are_logged_once_not_per_retry(
    autojump_clock, caplog
):
    # Left without a member that computes "weighted", the group retries its rebalance
    # after each backoff (up to 30 s), for as long as nobody that can joins: hours, in a
    # deployment whose computing service is down. Each retry logged the same ERROR, 120
    # an hour. The first says why; the same cause again is not repeated at each retry.
    rec, timeline = Recorder(), Timeline()
    async with ephemeral_broker(on_event=rec) as broker:
        await broker.topics.create_topic("t", 4)
        (computer,) = leaders(broker, timeline, "a")
        waiter = FakeMember(
            broker, "g", ["t"], session_timeout=S, timeline=timeline, name="b",
            assignors=["weighted"],
        )  # fmt: skip

        async def alive(member: FakeMember) -> None:
            while True:
                with contextlib.suppress(CoordError):
                    await member.heartbeat()
                await trio.sleep(1.0)

        async with connected(computer), connected(waiter), trio.open_nursery() as nursery:
            await join_one_by_one(rec, computer, waiter)
            nursery.start_soon(alive, waiter)
            caplog.clear()
            mark = rec.mark()
            await computer.leave()
            await trio.sleep(3 * 3600)
            failures = rec.all("rebalance_failed", since=mark)
            assert len(failures) > 300  # (it keeps retrying, every 30 s at most)
            said = [
                r for r in caplog.records if "no member of group g can compute" in r.getMessage()
            ]
            assert [r.levelname for r in said if r.levelno >= logging.ERROR] == ["ERROR"]
            reminders = [r for r in said if r.levelno == logging.WARNING]
            assert 3 <= len(reminders) <= 3 * 6  # (once per 10 minutes at most)
            assert "still: " in reminders[-1].getMessage()
            assert [r for r in said if logging.INFO <= r.levelno < logging.WARNING] == []
            assert waiter.owned == []
            # A member that can compute it joins: the group assigns at once, not after
            # the rest of the backoff, and the next failure of that cause is said again.
            (back,) = leaders(broker, timeline, "c")
            async with connected(back):
                joined = trio.current_time()
                mark = rec.mark()
                await back.join()
                await rec.wait_for("stable", since=mark)
                assert trio.current_time() - joined < 1.0  # (on the virtual clock)
                assert len(waiter.owned) + len(back.owned) == 4
                caplog.clear()
                await back.leave()
                await rec.wait_for("rebalance_failed", since=rec.mark())
                assert any(
                    r.levelno >= logging.ERROR and "can compute" in r.getMessage()
                    for r in caplog.records
                )
            nursery.cancel_scope.cancel()
