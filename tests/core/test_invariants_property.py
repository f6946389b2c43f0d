"""Invariants 1 and 2 under random membership churn, driven through the pure core.

A hypothesis state machine plays both sides with a fake clock: the
coordinator's group task (exactly the call sequence of
``trio_coord.broker.group``: stop everyone, commit their positions, plan,
persist and replay the generation, start each member no earlier than its
``not_before``, complete) and the consumers (which join, leave cleanly, lose
their connection, reconnect with their member id, freeze, heartbeat, and
fetch). Any membership change or a subscribed topic growing restarts the
rebalance, from whatever phase it is in. Consumers ask for eager or
cooperative rebalancing at random; while all of a group's members ask for
cooperative, the group task follows the cooperative sequence instead: plan
from what members may fetch, stop only the partitions that move (on their
owners only), start incrementally (members keep what they fetch).

The model tracks who is *actually fetching* each partition: a consumer starts
fetching when StartFetchers is sent (``member_starting``), stops when it
acknowledges a stop (``member_stopped``) or leaves, and one that is removed
without acknowledging (lost connection, session expiry) may go on fetching
until its lease ends (last accepted heartbeat + session timeout), which is
what the real client's watchdog guarantees and no more. A consumer that lost
its connection may come back with its member id while it still fetches; it
renews its lease by rejoining. A static member's process may be cut off from
the coordinator (it fetches on until its lease ends) and a new process with
the same instance id take its place: resumed without a rebalance (a start of
its own, once the old process's lease allows) in a stable group with the same
subscription, or else joining into a rebalance.

Checked after every step:

1. Exclusive ownership: no partition is fetched by two consumers at once.
2. Completeness: a STABLE group with members has every partition of every
   subscribed existing topic owned by exactly one subscriber, and every
   member fetches exactly its assignment.
3. Generations of completed rebalances strictly increase; committed offsets
   never move back.

And the bookkeeping that makes 1 hold: the coordinator's ``may_own`` covers
what each live member fetches, and its fences cover what departed ones may.
"""

from __future__ import annotations

import itertools
import math
from collections import Counter
from dataclasses import dataclass, field

from _members import join
from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, initialize, invariant, rule

from trio_coord.core.assignors import ASSIGNORS, Assignment, choose_assignor
from trio_coord.core.fencing import check_heartbeat
from trio_coord.core.group import (
    PREDECESSOR_SUFFIX,
    AssignmentInput,
    AssignmentPlan,
    Group,
    GroupLimits,
    GroupState,
    StartPlan,
)
from trio_coord.protocol.errors import IllegalGenerationError, InconsistentAssignorError
from trio_coord.protocol.messages import PartitionOffset
from trio_coord.protocol.messages import TopicPartition as TP

S = GroupState
MEMBER_IDS = ["m0", "m1", "m2", "m3", "m4"]
TOPICS = ["t0", "t1", "t2"]
LIMITS = GroupLimits(min_session_timeout=1.0, max_session_timeout=60.0, max_group_size=100)
ASSIGNOR_PREFS = [
    ("range", "roundrobin"),
    ("roundrobin", "range"),
    ("range",),
    ("roundrobin",),
    ("uniform", "range"),
]
MAX_PARTITIONS = 6
LOG_START, LOG_END = 0, 5


def log_offsets(tp: TP) -> tuple[int, int]:
    return LOG_START, LOG_END


@dataclass
class Consumer:
    """One consumer process, as the model sees it."""

    topics: frozenset[str]
    session_timeout: float
    assignors: tuple[str, ...]
    offset_reset: str
    generation: int
    fetching: dict[TP, int] = field(default_factory=dict)
    """partition → position, for every partition it is fetching."""
    frozen: bool = False
    """Stopped (SIGSTOP): answers nothing, heartbeats no more."""
    protocol: str = "eager"


@dataclass
class Departed:
    """A consumer the group removed without a stop acknowledgement."""

    consumer: Consumer
    until: float
    """Its lease end: it may fetch ``consumer.fetching`` until then."""


class GroupProtocol(RuleBasedStateMachine):
    def __init__(self) -> None:
        super().__init__()
        self.now = 0.0
        self.group = Group("g", now=0.0)
        self.topics: dict[str, int] = {"t0": 3, "t1": 1}
        self.consumers: dict[str, Consumer] = {}
        self.departed: dict[str, Departed] = {}
        # Static members' former processes, cut off but fetching: (fence key, process).
        self.ghosts: list[tuple[str, Departed]] = []
        # Static members resumed without a rebalance: their start, in which generation.
        self.resumes: dict[str, tuple[StartPlan, int]] = {}
        # The group task's progress through the current rebalance.
        self.to_stop: set[str] = set()
        self.computed: tuple[AssignmentInput, Assignment] | None = None  # cooperative plan
        self.revoke: dict[str, list[TP]] = {}
        self.unpersisted: AssignmentPlan | None = None
        self.to_start: dict[str, list[StartPlan]] = {}  # each member's stages, in order
        self.unacked: set[str] = set()
        self.restarts = 0
        # What the checks remember.
        self.stable_generations: list[int] = []
        self.max_generation = 0
        self.committed: dict[TP, int] = {}

    # -- the clock -------------------------------------------------------------------------

    def set_time(self, t: float) -> None:
        """Move the fake clock to ``t``; live consumers make progress and heartbeat."""
        assert t >= self.now
        if t > self.now:
            # A live consumer heartbeats every third of its session timeout, so it hears
            # at once if its generation is refused; then time passes.
            self.heartbeat_all()
            for consumer in self.consumers.values():
                if not consumer.frozen:
                    for tp in consumer.fetching:
                        consumer.fetching[tp] += 1
        self.now = t
        for member_id in [m for m, d in self.departed.items() if d.until <= t]:
            del self.departed[member_id]  # its lease is over: it has certainly stopped
        self.ghosts = [(key, g) for key, g in self.ghosts if g.until > t]
        self.heartbeat_all()

    def heartbeat_all(self) -> None:
        for member_id in sorted(self.consumers):
            consumer = self.consumers.get(member_id)
            if consumer is not None and not consumer.frozen:
                self.heartbeat_of(member_id)

    def advance_to(self, target: float) -> None:
        """Advance the clock, expiring frozen members' sessions on the way, in order."""
        while True:
            due = sorted(
                (self.group.members[m].lease_end, m)
                for m, c in self.consumers.items()
                if c.frozen and self.group.members[m].lease_end <= target
            )
            if not due:
                break
            lease_end, member_id = due[0]
            self.set_time(max(lease_end, self.now))
            if member_id in self.consumers:
                self.remove_unstopped(member_id)  # session expired
        self.set_time(target)

    # -- the coordinator's side ---------------------------------------------------------------

    def subscribed_partitions(self) -> dict[str, int]:
        wanted = set().union(*(m.topics for m in self.group.members.values()))
        return {t: n for t, n in self.topics.items() if t in wanted}

    def restart(self) -> None:
        """Membership changed: drop the rebalance in flight and begin the next one."""
        self.restarts += 1
        if self.unpersisted is not None:
            # The generation record was already being written (shielded): once durable,
            # it is replayed even though the rebalance that planned it is over.
            self.group.replay(self.unpersisted.record, now=self.now)
            self.unpersisted = None
        self.to_start.clear()
        self.unacked.clear()
        self.resumes.clear()  # the broker's resume task finds the group rebalancing: void
        self.computed, self.revoke = None, {}
        if self.group.members:
            self.to_stop = {m.member_id for m in self.group.begin_rebalance()}
            assert self.to_stop == set(self.group.members)
            if self.group.cooperative:
                given = self.group.planning.assignment_input(
                    partitions=self.subscribed_partitions(), available=ASSIGNORS
                )
                self.computed = (given, self.group.planning.compute_assignment(given, ASSIGNORS))
                self.revoke = self.group.planning.revocations(self.computed[1])
                self.to_stop = set(self.revoke)
        else:
            assert self.group.state is S.EMPTY
            self.to_stop = set()

    def commit_positions(self) -> None:
        for record in self.group.drain_positions(round(self.now * 1000)):
            assert record.offset >= self.committed.get(record.tp, 0)
            self.group.replay(record, now=self.now)

    def heartbeat_of(self, member_id: str) -> None:
        consumer = self.consumers[member_id]
        member = self.group.members[member_id]
        try:
            accepted = check_heartbeat(self.group, member_id, consumer.generation)
        except IllegalGenerationError:
            # Only a generation the member never acknowledged and the group has left:
            # a StartFetchers it processed whose ack the restarted rebalance dropped.
            assert consumer.generation not in (member.generation, self.group.generation)
            # The client reconnects: its connection ends (the broker removes it), then it
            # joins again with its member id.
            self.remove_unstopped(member_id)
            if member_id in self.departed:
                self.reconnect_of(member_id)
            else:  # its lease ran out as it went: it dropped everything, joins afresh
                consumer.fetching.clear()
                self.admit(member_id, consumer)
            return
        assert accepted is member
        self.group.heartbeat(
            self.now,
            member,
            [PartitionOffset(tp.topic, tp.partition, p) for tp, p in consumer.fetching.items()],
        )

    def remove_unstopped(self, member_id: str) -> None:
        """Lost connection or session expiry: the member may fetch until its lease ends."""
        member = self.group.remove_member(self.now, member_id, stopped=False)
        consumer = self.consumers.pop(member_id)
        if member.lease_end > self.now:
            self.departed[member_id] = Departed(consumer, member.lease_end)
        self.restart()

    def admit(self, member_id: str, consumer: Consumer) -> bool:
        """JoinGroup as the broker handles it; False if the join is refused."""
        others = [m.assignors for m in self.group.members.values() if m.member_id != member_id]
        try:
            join(
                self.group,
                member_id,
                self.now,
                limits=LIMITS,
                host="127.0.0.1",
                topics=sorted(consumer.topics),
                session_timeout=consumer.session_timeout,
                assignors=consumer.assignors,
                offset_reset=consumer.offset_reset,
                protocol=consumer.protocol,
            )
        except InconsistentAssignorError:
            assert choose_assignor([consumer.assignors, *others], ASSIGNORS) is None
            return False
        assert choose_assignor([consumer.assignors, *others], ASSIGNORS) is not None
        consumer.generation = self.group.generation  # from the JoinGroup response
        self.consumers[member_id] = consumer
        self.restart()
        return True

    def reconnect_of(self, member_id: str) -> None:
        """A departed consumer, still running, rejoins with its member id."""
        departed = self.departed[member_id]
        if not self.group.knows_former_member(member_id):
            # The broker answers UNKNOWN_MEMBER_ID (GroupRunner.join): the client drops
            # its partitions and joins afresh (the model reuses the label: no fence or
            # departed consumer refers to it any more).
            del self.departed[member_id]
            departed.consumer.fetching.clear()
            self.admit(member_id, departed.consumer)
            return
        if self.admit(member_id, departed.consumer):  # it keeps fetching what it had
            del self.departed[member_id]

    # -- one step of the rebalance ------------------------------------------------------------

    def take_over(self, member_id: str, consumer: Consumer) -> None:
        """A new process of static member ``member_id`` joins (GroupRunner.join): the old
        one, cut off, fetches on until its lease ends."""
        group = self.group
        old = self.consumers[member_id]
        member = group.members[member_id]
        if old.fetching and member.lease_end > self.now:
            self.ghosts.append((member_id + PREDECESSOR_SUFFIX, Departed(old, member.lease_end)))
        group.replace_process(self.now, member_id)
        if (
            group.state is S.STABLE
            and member.topics == consumer.topics
            and member.assignors == consumer.assignors
            and member.protocol == consumer.protocol
        ):
            member.last_heartbeat = self.now  # (GroupRunner._resume_static)
            member.session_timeout = consumer.session_timeout
            consumer.generation = group.generation
            self.consumers[member_id] = consumer
            plan = group.planning.resume_plan(self.now, member_id, log_offsets)
            self.resumes[member_id] = (plan, group.generation)
        else:
            del self.consumers[member_id]
            assert self.admit(member_id, consumer)

    def resume(self) -> bool:
        """The broker's start of a resumed static member, once its not_before has come."""
        member_id = sorted(self.resumes)[0]
        plan, generation = self.resumes[member_id]
        if plan.not_before > self.now:
            self.advance_to(plan.not_before)
            if member_id not in self.resumes:
                return True  # a rebalance came first: the start is void
        del self.resumes[member_id]
        consumer = self.consumers[member_id]
        assert self.group.state is S.STABLE and self.group.generation == generation
        self.group.member_starting(member_id)
        consumer.fetching = {po.tp: max(po.offset, 0) for po in plan.partitions} | (
            consumer.fetching
        )
        self.group.member_started(member_id)
        return True

    def step(self, choice: int) -> bool:
        """Advance the rebalance by one event; False if nothing can happen now."""
        group = self.group
        if group.state is S.STABLE and self.resumes:
            return self.resume()
        if group.state is S.STOPPING:
            answering = sorted(m for m in self.to_stop if not self.consumers[m].frozen)
            if answering:
                member_id = answering[choice % len(answering)]
                consumer = self.consumers[member_id]
                revoked = self.revoke.get(member_id) if self.computed else None
                stopping = sorted(consumer.fetching if revoked is None else revoked)
                positions = [
                    PartitionOffset(tp.topic, tp.partition, consumer.fetching[tp])
                    for tp in stopping
                    if tp in consumer.fetching
                ]
                group.member_stopped(member_id, positions, revoked)
                for tp in stopping:
                    consumer.fetching.pop(tp, None)
                self.to_stop.discard(member_id)
                return True
            if self.to_stop:
                return False  # waiting for frozen members to time out
            self.commit_positions()
            generation = group.generation
            # The partition counts the group had seen (its last durable generation's).
            seen = dict(group.record.topics) if group.record is not None else {}
            plan = group.plan_assignment(
                self.now,
                partitions=self.subscribed_partitions(),
                available=ASSIGNORS,
                log_offsets=log_offsets,
                computed=self.computed,
            )
            # Each subscribed topic keeps the count it was first seen with (0 while it
            # does not exist); one no longer subscribed keeps its entry.
            subscribed = set().union(*(m.topics for m in group.members.values()))
            expected_seen = dict(seen)
            for topic in subscribed:
                if topic in self.topics:
                    expected_seen.setdefault(topic, self.topics[topic])
                else:
                    expected_seen[topic] = 0
            assert plan.record.topics == expected_seen
            assert group.state is S.ASSIGNING and group.generation == generation
            assert all(
                s[0].incremental == (self.computed is not None) for s in plan.stages().values()
            )
            assert plan.record.generation == generation + 1
            assert [s.member_id for s in plan.starts] == sorted(s.member_id for s in plan.starts)
            assert set(plan.stages()) == set(group.members)
            for stages in plan.stages().values():
                # Stages in time order, each adding to the last; the last is everything.
                times = [s.not_before for s in stages]
                assert times == sorted(set(times))
                for before, after in itertools.pairwise(stages):
                    assert after.incremental
                    assert {p.tp for p in before.partitions} < {p.tp for p in after.partitions}
            assert [m.member_id for m in plan.record.members] == sorted(group.members)
            for start in plan.starts:
                assert start.not_before >= self.now
                for po in start.partitions:
                    committed = group.offsets.get(po.tp)
                    # A partition created since the group subscribed starts at its log
                    # start; any other follows the member's reset policy.
                    created_since = po.partition >= expected_seen.get(po.topic, math.inf)
                    reset = (
                        LOG_START
                        if created_since
                        or self.consumers[start.member_id].offset_reset == "earliest"
                        else LOG_END
                    )
                    assert po.offset == (committed.offset if committed else reset)
            self.unpersisted = plan
            return True
        if group.state is S.ASSIGNING:
            plan, self.unpersisted = self.unpersisted, None
            assert plan is not None
            group.replay(plan.record, now=self.now)
            group.begin_starting()
            assert group.generation == plan.record.generation
            self.to_start = plan.stages()
            return True
        if group.state is S.STARTING:
            # A member's next stage is sent once it acknowledged the one before.
            candidates = sorted(m for m in self.to_start if m not in self.unacked) + sorted(
                m for m in self.unacked if not self.consumers[m].frozen
            )
            if not candidates:
                if self.unacked:
                    return False  # waiting for frozen members to time out
                group.complete_rebalance()
                self.on_stable()
                return True
            member_id = candidates[choice % len(candidates)]
            if member_id in self.to_start and member_id not in self.unacked:
                start = self.to_start[member_id][0]
                if start.not_before > self.now:
                    restarts = self.restarts
                    self.advance_to(start.not_before)
                    if self.restarts != restarts:
                        return True  # the rebalance restarted while we waited
                consumer = self.consumers[member_id]
                wanted = {po.tp: max(po.offset, 0) for po in start.partitions}
                if start.unchanged:  # it keeps exactly what it fetches, in the new generation
                    wanted = dict(consumer.fetching)
                elif start.incremental:  # it keeps what it fetches, all of which it keeps
                    assert set(consumer.fetching) <= set(wanted), "kept what moved away"
                    wanted.update(consumer.fetching)
                else:
                    assert not consumer.fetching, "started before it was stopped"
                group.member_starting(member_id, [po.tp for po in start.partitions])
                self.to_start[member_id].pop(0)
                last = not self.to_start[member_id]
                if last:
                    del self.to_start[member_id]
                self.unacked.add(member_id)
                # StartFetchers: it fetches from here on (a frozen one, maybe, too).
                consumer.fetching = wanted
                consumer.generation = group.generation
                assignment = group.members[member_id].assignment
                assert set(consumer.fetching) <= assignment
                assert set(consumer.fetching) == assignment or not last
            else:
                group.member_started(member_id)
                self.unacked.discard(member_id)
            return True
        return False

    def on_stable(self) -> None:
        generation = self.group.generation
        assert not self.stable_generations or generation > self.stable_generations[-1]
        self.stable_generations.append(generation)

    def progress(self, steps: int, choice: int) -> None:
        """Let the rebalance take up to ``steps`` steps (so changes land in every phase)."""
        for _ in range(steps):
            if not self.step(choice):
                return
            choice += 1

    # -- rules --------------------------------------------------------------------------------

    consumers_strategy = st.builds(
        Consumer,
        topics=st.frozensets(st.sampled_from(TOPICS), min_size=1),
        session_timeout=st.sampled_from([2.0, 5.0, 10.0]),
        assignors=st.sampled_from(ASSIGNOR_PREFS),
        offset_reset=st.sampled_from(["earliest", "latest"]),
        generation=st.just(-1),
        protocol=st.sampled_from(["eager", "cooperative"]),
    )
    steps = st.integers(0, 8)
    index = st.integers(0, 99)

    @initialize(consumers=st.lists(consumers_strategy, min_size=1, max_size=4))
    def settled_group(self, consumers) -> None:
        """Start from a group that completed its first rebalances."""
        for member_id, consumer in zip(MEMBER_IDS, consumers, strict=False):
            self.admit(member_id, consumer)
        self.progress(1000, 0)
        assert not self.group.members or self.group.state is S.STABLE

    @rule(index=st.integers(0, len(MEMBER_IDS) - 1), consumer=consumers_strategy, then=steps)
    def join(self, index, consumer, then) -> None:
        member_id = MEMBER_IDS[index]
        if member_id not in self.consumers and member_id not in self.departed:
            self.admit(member_id, consumer)
        self.progress(then, index)

    @rule(index=index, topics=st.frozensets(st.sampled_from(TOPICS), min_size=1), then=steps)
    def resubscribe(self, index, topics, then) -> None:
        """A live member rejoins with its id and a new subscription."""
        live = sorted(m for m, c in self.consumers.items() if not c.frozen)
        if live:
            member_id = live[index % len(live)]
            consumer = self.consumers[member_id]
            consumer.topics = topics
            assert self.admit(member_id, consumer)
        self.progress(then, index)

    @rule(index=index, then=steps)
    def leave(self, index, then) -> None:
        """LeaveGroup, sent after stopping the fetchers (the broker commits the positions)."""
        live = sorted(m for m, c in self.consumers.items() if not c.frozen)
        if live:
            member_id = live[index % len(live)]
            consumer = self.consumers.pop(member_id)
            positions = [
                PartitionOffset(tp.topic, tp.partition, p)
                for tp, p in sorted(consumer.fetching.items())
            ]
            consumer.fetching.clear()
            self.group.member_stopped(member_id, positions)
            self.group.remove_member(self.now, member_id, stopped=True)
            self.commit_positions()
            self.restart()
        self.progress(then, index)

    @rule(index=index, then=steps)
    def crash(self, index, then) -> None:
        """The connection is lost: the broker removes the member, which may still fetch."""
        if self.consumers:
            self.remove_unstopped(sorted(self.consumers)[index % len(self.consumers)])
        self.progress(then, index)

    @rule(index=index, then=steps)
    def reconnect(self, index, then) -> None:
        """A departed consumer that is still running rejoins with its member id."""
        candidates = sorted(m for m, d in self.departed.items() if not d.consumer.frozen)
        if candidates:
            self.reconnect_of(candidates[index % len(candidates)])
        self.progress(then, index)

    @rule(
        index=index,
        topics=st.none() | st.frozensets(st.sampled_from(TOPICS), min_size=1),
        then=steps,
    )
    def restart_static(self, index, topics, then) -> None:
        """A member's process is cut off (it fetches on until its lease ends), and a new
        process with its instance id takes its place, maybe with another subscription."""
        if self.consumers:
            member_id = sorted(self.consumers)[index % len(self.consumers)]
            old = self.consumers[member_id]
            new = Consumer(
                topics or old.topics,
                old.session_timeout,
                old.assignors,
                old.offset_reset,
                generation=-1,
                protocol=old.protocol,
            )
            self.take_over(member_id, new)
        self.progress(then, index)

    @rule(index=index, then=steps)
    def freeze(self, index, then) -> None:
        """The consumer stops (SIGSTOP): no more heartbeats, no more answers."""
        live = sorted(m for m, c in self.consumers.items() if not c.frozen)
        if live:
            self.consumers[live[index % len(live)]].frozen = True
        self.progress(then, index)

    @rule(index=index, then=steps)
    def heartbeat(self, index, then) -> None:
        live = sorted(m for m, c in self.consumers.items() if not c.frozen)
        if live:
            self.heartbeat_of(live[index % len(live)])
        self.progress(then, index)

    @rule(dt=st.sampled_from([0.5, 1.0, 3.0, 7.0, 15.0]))
    def advance(self, dt) -> None:
        self.advance_to(self.now + dt)

    @rule(topic=st.sampled_from(TOPICS), more=st.integers(1, 2), then=steps)
    def grow(self, topic, more, then) -> None:
        count = self.topics.get(topic, 0)
        if count + more <= MAX_PARTITIONS:
            self.topics[topic] = count + more
            if any(topic in m.topics for m in self.group.members.values()):
                self.restart()
        self.progress(then, more)

    @rule(choice=index)
    def rebalance_step(self, choice) -> None:
        self.step(choice)

    @rule(choice=index)
    def settle(self, choice) -> None:
        """Let the rebalance run until it is stable or waits for a frozen member."""
        self.progress(1000, choice)

    # -- checks -------------------------------------------------------------------------------

    @invariant()
    def exclusive_ownership(self) -> None:
        fetchers: Counter[TP] = Counter()
        for consumer in self.consumers.values():
            fetchers.update(consumer.fetching.keys())
        for departed in [*self.departed.values(), *(g for _, g in self.ghosts)]:
            assert departed.until > self.now
            fetchers.update(departed.consumer.fetching.keys())
        doubled = sorted(tp for tp, n in fetchers.items() if n > 1)
        assert not doubled, f"fetched twice at t={self.now}: {doubled}"

    @invariant()
    def bookkeeping_covers_every_fetcher(self) -> None:
        group = self.group
        assert set(self.consumers) == set(group.members)
        for member_id, consumer in self.consumers.items():
            missing = set(consumer.fetching) - group.members[member_id].may_own
            assert not missing, f"{member_id} fetches {sorted(missing)} outside may_own"
        for member_id, departed in [*self.departed.items(), *self.ghosts]:
            if departed.consumer.fetching:
                fence = group.fences.get(member_id)
                assert fence is not None, f"departed {member_id} is fetching without a fence"
                assert set(departed.consumer.fetching) <= fence.partitions
                assert fence.until >= departed.until, (member_id, fence, departed.until)

    @invariant()
    def complete_when_stable(self) -> None:
        group = self.group
        if not group.members:
            assert group.state is S.EMPTY
            return
        if group.state is not S.STABLE:
            return
        ownership = group.ownership()
        expected = {TP(t, p) for t, n in self.subscribed_partitions().items() for p in range(n)}
        assert set(ownership) == expected
        assert sum(len(m.assignment) for m in group.members.values()) == len(expected)
        for tp, owner in ownership.items():
            assert tp.topic in group.members[owner].topics
        for member_id, member in group.members.items():
            assert member.generation == group.generation
            if member_id not in self.resumes:  # (a resumed one waits for its start)
                assert set(self.consumers[member_id].fetching) == member.assignment

    @invariant()
    def monotonic(self) -> None:
        assert self.group.generation >= self.max_generation
        self.max_generation = self.group.generation
        for tp, record in self.group.offsets.items():
            assert record.offset >= self.committed.get(tp, 0)
            self.committed[tp] = record.offset


GroupProtocol.TestCase.settings = settings(
    max_examples=200,
    stateful_step_count=40,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow],
)
TestGroupProtocol = GroupProtocol.TestCase


# -- scripted scenarios through the same model (each checks every invariant at every step) -----


class Checked:
    """Calls the machine's rules and checks all its invariants after each."""

    def __init__(self, machine: GroupProtocol) -> None:
        self.machine = machine

    def __getattr__(self, name: str):
        method = getattr(self.machine, name)

        def call(*args, **kwargs):
            result = method(*args, **kwargs)
            self.machine.exclusive_ownership()
            self.machine.bookkeeping_covers_every_fetcher()
            self.machine.complete_when_stable()
            self.machine.monotonic()
            return result

        return call


def consumer(*topics: str, session_timeout: float = 10.0) -> Consumer:
    return Consumer(frozenset(topics), session_timeout, ("range",), "earliest", generation=-1)


def test_member_reconnecting_while_fetching_then_lost_again_stays_fenced() -> None:
    machine = GroupProtocol()
    run = Checked(machine)
    run.settled_group([consumer("t0")])
    assert set(machine.consumers["m0"].fetching) == {TP("t0", 0), TP("t0", 1), TP("t0", 2)}
    run.advance(1.0)
    run.crash(0, then=0)  # connection lost at t=1: lease until 11
    assert machine.departed["m0"].until == 11.0
    run.advance(3.0)
    run.reconnect(0, then=0)  # still fetching, rejoins with its id at t=4: lease until 14
    assert machine.group.members["m0"].may_own == set(machine.consumers["m0"].fetching)
    run.crash(0, then=0)  # lost again before acknowledging the stop
    assert machine.departed["m0"].until == 14.0
    run.join(1, consumer("t0"), then=0)
    run.settle(0)
    # The new owner starts only when the twice-departed one has certainly stopped.
    assert machine.now == 14.0
    assert machine.group.state is S.STABLE
    assert set(machine.consumers["m1"].fetching) == {TP("t0", 0), TP("t0", 1), TP("t0", 2)}


def test_heartbeat_from_a_start_whose_ack_was_dropped_by_a_restart() -> None:
    machine = GroupProtocol()
    run = Checked(machine)
    run.settled_group([consumer("t0"), consumer("t0")])
    assert machine.group.generation == 1
    run.grow("t0", 1, then=4)  # restart; both stopped, generation 2 planned and persisted
    assert machine.group.state is S.STARTING and machine.group.generation == 2
    run.rebalance_step(0)  # StartFetchers(2) to m0; its ack is not handled yet...
    assert machine.consumers["m0"].generation == 2
    assert machine.group.members["m0"].generation == 1
    run.grow("t0", 1, then=4)  # ...when the rebalance restarts and reaches generation 3
    assert machine.group.state is S.STARTING and machine.group.generation == 3
    restarts = machine.restarts
    run.heartbeat(0, then=0)  # generation 2 lies between its acked 1 and the group's 3: alive
    assert machine.restarts == restarts  # no needless reconnect and rebalance
    assert machine.group.state is S.STARTING
    run.settle(0)
    assert machine.group.state is S.STABLE and machine.group.generation == 3
    assert machine.stable_generations == [1, 3]


def test_cooperative_join_stops_only_the_owners_of_what_moves() -> None:
    def coop(*topics: str) -> Consumer:
        return Consumer(
            frozenset(topics), 10.0, ("uniform",), "earliest", generation=-1, protocol="cooperative"
        )

    machine = GroupProtocol()
    run = Checked(machine)
    machine.topics["t0"] = 6
    run.settled_group([coop("t0"), coop("t0")])
    before = {m: dict(c.fetching) for m, c in machine.consumers.items()}
    assert sorted(len(f) for f in before.values()) == [3, 3]
    run.join(2, coop("t0"), then=0)
    assert machine.group.cooperative and machine.computed is not None
    assert set(machine.to_stop) == {"m0", "m1"}  # each gives one up; the joiner nothing
    assert all(len(tps) == 1 for tps in machine.revoke.values())
    run.settle(0)
    assert machine.group.state is S.STABLE
    for member_id, fetched in before.items():  # what stayed kept its position: never stopped
        kept = set(fetched) & set(machine.consumers[member_id].fetching)
        assert len(kept) == 2
        assert all(machine.consumers[member_id].fetching[tp] >= fetched[tp] for tp in kept)
    eager = Consumer(frozenset({"t0"}), 10.0, ("uniform",), "earliest", generation=-1)
    run.join(3, eager, then=0)  # an eager member makes the group eager
    assert not machine.group.cooperative and machine.computed is None
    assert machine.to_stop == {"m0", "m1", "m2", "m3"}
    run.settle(0)
    assert machine.group.state is S.STABLE


def test_static_takeover_then_a_join_waits_for_the_old_process() -> None:
    """The acceptance scenario: a static member's process is cut off, its successor is
    resumed, and a member joins before the old lease ends. Whoever gets the old
    process's partitions starts them after that lease, not at the successor's ack."""
    machine = GroupProtocol()
    run = Checked(machine)
    run.settled_group([consumer("t0", session_timeout=5.0), consumer("t0")])
    had = set(machine.consumers["m0"].fetching)
    assert had
    run.advance(1.0)  # m0's last heartbeat: its lease ends at 6
    run.restart_static(0, topics=None, then=0)
    assert machine.ghosts and machine.resumes
    run.join(2, consumer("t0"), then=0)  # the resume is void; a rebalance runs
    assert not machine.resumes
    run.settle(0)
    assert machine.now >= 6.0  # the new owners waited for the old process's lease
    assert machine.group.state is GroupState.STABLE and not machine.ghosts
