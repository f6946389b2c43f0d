# ruff: noqa
# The sticky/uniform balancing of trio_coord/core/_sticky.py as it was before the
# i14-joins rewrite (git show 1423be5^1:trio_coord/core/_sticky.py), kept verbatim
# but for its imports as the oracle of tests/core/test_assignors_fill_oracle.py.
# Do not change it: it is what the current module must keep answering.
"""The engine of the ``sticky`` and ``uniform`` assignors: balance first, then keep ownership.

This module is the algorithm; :mod:`trio_coord.core.assignors` is the
interface and says what the two assignors promise (docs/assignment.md has the
reasoning and worked examples). Everything here works on small integers: a
member is its index in the sorted list of *active* members (those that
subscribe to at least one existing topic), a topic its index in the sorted
list of subscribed topics that have partitions, a partition its number.

Two paths:

* **identical subscriptions** (every active member subscribes to the same
  existing topics): quotas. With ``P`` partitions and ``n`` members each
  member gets ``P // n``, and the ``P % n`` extra ones go to the members that
  own the most (ties: member id; for ``uniform``, the least lopsided first).
  A member keeps as many of its owned partitions as its quota allows; the
  rest, and every partition nobody owns, are dealt to the members below
  their quota. This keeps the largest number of owned partitions any
  balanced assignment can keep.
* **mixed subscriptions**: every member keeps what it owns, the partitions
  nobody owns go one at a time to the least loaded subscriber (the topics
  interleaved), then :meth:`_State.rebalance` moves
  partitions from the most loaded holder of a topic to its least loaded
  subscriber while one has at least two more than the other, moving
  partitions that were not kept in place before kept ones. Last,
  :meth:`_State.give_back` returns any partition to the member that owned it
  (alone, or in exchange for one that member holds of the new holder's) when
  that keeps the assignment balanced.

``uniform`` then runs :func:`_even_out`: it hands one partition over, or
exchanges two between two members, while that lowers ``sum over topics and
subscribers of count(member, topic) ** 2``, keeps the assignment balanced and
keeps at least as many owned partitions in place; on the mixed path it
alternates with ``give_back`` until neither changes anything.

With racks (some member's and some partition's known), :func:`_match_racks`
runs last: it exchanges two partitions of one topic between two members while
that gives more partitions to a member of their rack, which changes no count.

"Balanced" is checked per topic: the most loaded member holding a partition
of the topic has at most one more partition in all than the least loaded
member subscribing to it. That is the same as "no member could take a
partition it subscribes to from a member that has at least two more".
"""

from __future__ import annotations

import heapq
from collections.abc import Iterable, Sequence

from trio_coord.protocol.messages import TopicPartition
from trio_coord.core.assignment import Assignment, GroupSpec

__all__ = ["balanced_assignment"]


def balanced_assignment(spec: GroupSpec, *, spread: bool) -> Assignment:
    """Assign ``spec`` balanced and sticky; with ``spread``, also even out each topic.

    ``spread=False`` is the ``sticky`` assignor, ``spread=True`` the
    ``uniform`` one. Deterministic: only sorted orders and member ids decide.
    """
    result: Assignment = {member_id: [] for member_id in sorted(spec.members)}
    names = [t for t in spec.topics() if spec.partitions[t] > 0]
    index = {t: k for k, t in enumerate(names)}
    sizes = [spec.partitions[t] for t in names]
    ids: list[str] = []
    subs: list[list[int]] = []
    for member_id in sorted(spec.members):
        topics = sorted(index[t] for t in spec.members[member_id].topics if t in index)
        if topics:
            ids.append(member_id)
            subs.append(topics)
    if not ids:
        return result
    owner = _owners(spec, ids, subs, index, sizes)
    identical = all(s == subs[0] for s in subs)
    state = _State(sizes, subs, owner, identical=identical)
    if identical:
        _fill_by_quota(state, spread=spread)
        if spread:
            _even_out(state)
    else:
        _fill_greedily(state)
        state.track_holders()
        state.rebalance()
        state.give_back()
        if spread:
            while _even_out(state) and state.give_back():
                pass
    if spec.rack_aware():
        _match_racks(
            state,
            [spec.members[m].rack for m in ids],
            [_padded(spec.racks.get(n, ()), size) for n, size in zip(names, sizes, strict=True)],
            any_owner=identical,
        )
    for i, member_id in enumerate(ids):
        result[member_id] = [
            TopicPartition(names[t], p)
            for t in sorted(state.parts[i])
            for p in sorted(state.parts[i][t])
        ]
    return result


def _owners(
    spec: GroupSpec,
    ids: list[str],
    subs: list[list[int]],
    index: dict[str, int],
    sizes: list[int],
) -> list[list[int]]:
    """Each partition's valid previous owner (member index), or -1.

    A claim counts if the member still subscribes to the topic and the
    partition exists. Of two members claiming one partition, the first in
    member-id order keeps the claim (members are visited in that order).
    """
    owner = [[-1] * size for size in sizes]
    for i, member_id in enumerate(ids):
        allowed = set(subs[i])
        for tp in spec.members[member_id].owned:
            t = index.get(tp.topic)
            if t is None or t not in allowed:
                continue
            p = tp.partition
            if isinstance(p, int) and 0 <= p < sizes[t] and owner[t][p] < 0:
                owner[t][p] = i
    return owner


class _State:
    """An assignment under construction, with what the balance checks need.

    ``count[i]`` maps topic → how many of its partitions member ``i`` holds,
    ``tcount[t]`` the same from the topic's side, ``parts[i][t]`` lists them,
    ``free[i][t]`` counts those ``i`` holds without having owned them, and
    ``released[i]`` holds the (topic, partition) ``i`` owned that others hold.
    Identical subscriptions keep a histogram of totals (balanced: max - min
    <= 1). Mixed ones keep lazy heaps per topic: of its subscribers by (total,
    count of the topic), lowest first; once :meth:`track_holders` is called,
    of its holders by total, highest first, and of the holders of a partition
    that is not theirs, highest first. A heap holds, for each member it
    covers, at least one entry no worse than the member's present key: a
    change that makes a key better pushes it, one that makes it worse pushes
    nothing, and an out-of-date entry found on top is replaced by the present
    key (if it was better) or dropped (if it was worse).
    """

    def __init__(
        self, sizes: list[int], subs: list[list[int]], owner: list[list[int]], *, identical: bool
    ) -> None:
        members = len(subs)
        self.sizes = sizes
        self.subs = subs
        self.sub_sets = [frozenset(s) for s in subs]
        self.topic_subs: list[list[int]] = [[] for _ in sizes]
        for i, topics in enumerate(subs):
            for t in topics:
                self.topic_subs[t].append(i)
        self.owner = owner
        self.holder = [[-1] * size for size in sizes]
        self.identical = identical
        self.total = [0] * members
        self.count: list[dict[int, int]] = [{} for _ in range(members)]
        self.tcount: list[dict[int, int]] = [{} for _ in sizes]
        self.parts: list[dict[int, list[int]]] = [{} for _ in range(members)]
        self.free: list[dict[int, int]] = [{} for _ in range(members)]
        self.tfree: list[dict[int, int]] = [{} for _ in sizes]
        self.released: list[set[tuple[int, int]]] = [set() for _ in range(members)]
        self.histogram: dict[int, int] = {0: members}
        self.lo_heaps: list[list[tuple[int, int, int]]] = []
        self.hi_heaps: list[list[tuple[int, int]]] = []
        self.free_heaps: list[list[tuple[int, int]]] = []
        self.tracking = False
        if not identical:
            self.lo_heaps = [[(0, 0, i) for i in self.topic_subs[t]] for t in range(len(sizes))]

    def track_holders(self) -> None:
        """Start keeping the heaps of holders (mixed path, once the first fill is done)."""
        self.tracking = True
        self.hi_heaps = [[(-self.total[i], i) for i in held] for held in self.tcount]
        self.free_heaps = [[(-self.total[i], i) for i in held] for held in self.tfree]
        for heap in (*self.hi_heaps, *self.free_heaps):
            heapq.heapify(heap)

    # -- changing the assignment ---------------------------------------------------------

    def _retotal(self, i: int, delta: int) -> None:
        old = self.total[i]
        new = self.total[i] = old + delta
        if self.identical:
            left = self.histogram[old] - 1
            if left:
                self.histogram[old] = left
            else:
                del self.histogram[old]
            self.histogram[new] = self.histogram.get(new, 0) + 1
            return
        if delta < 0:
            for t in self.subs[i]:
                heapq.heappush(self.lo_heaps[t], (new, self.tcount[t].get(i, 0), i))
        elif self.tracking:
            for t in self.count[i]:
                heapq.heappush(self.hi_heaps[t], (-new, i))
            for t in self.free[i]:
                heapq.heappush(self.free_heaps[t], (-new, i))

    def add(self, i: int, t: int, p: int) -> None:
        """Give partition ``p`` of topic ``t`` to member ``i``."""
        self.holder[t][p] = i
        self.parts[i].setdefault(t, []).append(p)
        self.count[i][t] = self.count[i].get(t, 0) + 1
        self.tcount[t][i] = self.tcount[t].get(i, 0) + 1
        o = self.owner[t][p]
        if o != i:
            self.free[i][t] = self.free[i].get(t, 0) + 1
            self.tfree[t][i] = self.tfree[t].get(i, 0) + 1
            if o >= 0:
                self.released[o].add((t, p))
        self._retotal(i, 1)  # after the tables: it pushes t's heaps too, if need be

    def add_many(self, i: int, items: Iterable[tuple[int, int]]) -> None:
        """``add(i, t, p)`` for every ``(t, p)`` of ``items``, the total moved once.

        Identical subscriptions only (the mixed path keeps heaps that every
        single change must push to): the quota fill hands out whole runs.
        """
        assert self.identical
        parts, owner, holder = self.parts[i], self.owner, self.holder
        counted: dict[int, int] = {}  # topic -> partitions added, of which not owned before:
        not_owned: dict[int, int] = {}
        for t, p in items:
            holder[t][p] = i
            held = parts.get(t)
            if held is None:
                held = parts[t] = []
            held.append(p)
            counted[t] = counted.get(t, 0) + 1
            o = owner[t][p]
            if o != i:
                not_owned[t] = not_owned.get(t, 0) + 1
                if o >= 0:
                    self.released[o].add((t, p))
        for table, by_topic in ((self.count[i], counted), (self.free[i], not_owned)):
            for t, n in by_topic.items():
                table[t] = table.get(t, 0) + n
        for tables, by_topic in ((self.tcount, counted), (self.tfree, not_owned)):
            for t, n in by_topic.items():
                tables[t][i] = tables[t].get(i, 0) + n
        if counted:
            self._retotal(i, sum(counted.values()))

    def remove(self, i: int, t: int, p: int) -> None:
        """Take partition ``p`` of topic ``t`` from member ``i``."""
        self.holder[t][p] = -1
        self.parts[i][t].remove(p)
        if not self.parts[i][t]:
            del self.parts[i][t]
        _decrement(self.count[i], t)
        _decrement(self.tcount[t], i)
        o = self.owner[t][p]
        if o != i:
            _decrement(self.free[i], t)
            _decrement(self.tfree[t], i)
            if o >= 0:
                self.released[o].discard((t, p))
        self._retotal(i, -1)

    def move(self, t: int, p: int, src: int, dst: int) -> None:
        """Hand partition ``p`` of topic ``t`` from ``src`` to ``dst``."""
        self.remove(src, t, p)
        self.add(dst, t, p)

    def pick(self, i: int, t: int, *, for_member: int = -1, free_only: bool = False) -> int:
        """The partition of ``t`` that ``i`` gives up: one ``for_member`` owned if any,
        else the highest-numbered one ``i`` did not own, else (unless
        ``free_only``) its highest-numbered one."""
        owner = self.owner[t]
        mine = self.parts[i][t]
        if for_member >= 0:
            back = [p for p in mine if owner[p] == for_member]
            if back:
                return max(back)
        free = [p for p in mine if owner[p] != i]
        if free or free_only:
            return max(free)
        return max(mine)

    # -- balance ----------------------------------------------------------------------------

    def _lowest(self, t: int) -> tuple[int, int]:
        """(total, member) of the least loaded subscriber of ``t`` (mixed path); of
        those, the one holding the fewest of ``t``, then the first."""
        heap = self.lo_heaps[t]
        counts = self.tcount[t]
        while True:
            entry = heap[0]
            i = entry[2]
            present = (self.total[i], counts.get(i, 0), i)
            if entry == present:
                return present[0], i
            if entry < present:
                heapq.heapreplace(heap, present)
            else:
                heapq.heappop(heap)

    def _highest(self, heap: list[tuple[int, int]], t: int, free: bool) -> tuple[int, int] | None:
        """(total, member) of the most loaded holder (of a free partition) of ``t``."""
        table = self.tfree[t] if free else self.tcount[t]
        while heap:
            key, i = heap[0]
            if i not in table or -key < self.total[i]:
                heapq.heappop(heap)
            elif -key > self.total[i]:
                heapq.heapreplace(heap, (-self.total[i], i))
            else:
                return -key, i
        return None

    def rebalance(self) -> None:
        """Move partitions until no topic's holder has two more than a subscriber (mixed path)."""
        pending = list(range(len(self.sizes)))
        queued = [True] * len(self.sizes)
        while pending:
            t = heapq.heappop(pending)
            queued[t] = False
            while True:
                low, receiver = self._lowest(t)
                top = self._highest(self.free_heaps[t], t, free=True)
                if top is None or top[0] < low + 2:
                    top = self._highest(self.hi_heaps[t], t, free=False)
                    if top is None or top[0] < low + 2:
                        break
                donor = top[1]
                self.move(t, self.pick(donor, t, for_member=receiver), donor, receiver)
                # The receiver's total rose: its topics' highest holder may be too high.
                # The donor's total fell: its subscriptions' lowest subscriber may be too low.
                for u in [*self.count[receiver], *self.subs[donor]]:
                    if not queued[u]:
                        queued[u] = True
                        heapq.heappush(pending, u)

    def lost(self) -> list[tuple[int, int, int, int]]:
        """(owner, topic, partition, holder) of every partition held by another than its owner."""
        found = []
        for t, owners in enumerate(self.owner):
            holders = self.holder[t]
            for p, o in enumerate(owners):
                if o >= 0 and holders[p] != o:
                    found.append((o, t, p, holders[p]))
        found.sort()
        return found

    def most_for(self, t: int) -> int:
        """The largest total a holder of ``t`` may have: one more than its least
        loaded subscriber has."""
        return (min(self.histogram) if self.identical else self._lowest(t)[0]) + 1

    def can_shrink(self, i: int) -> bool:
        """Whether ``i`` may lose a partition: no holder of a topic ``i`` subscribes to
        has more than ``i`` (identical subscriptions: somebody has one fewer)."""
        if self.identical:
            return min(self.histogram) == self.total[i] - 1
        for t in self.subs[i]:
            top = self._highest(self.hi_heaps[t], t, free=False)
            if top is not None and top[0] > self.total[i]:
                return False
        return True

    def can_grow(self, i: int, t: int) -> bool:
        """Whether ``i`` may gain a partition of ``t`` from a member with more that
        :meth:`can_shrink`: it is a least loaded subscriber of ``t`` and of every
        topic it holds."""
        if self.identical:
            return self.total[i] == min(self.histogram)
        return all(self._lowest(u)[0] >= self.total[i] for u in (t, *self.count[i]))

    def can_hand_over(self, a: int, b: int, t: int) -> bool:
        """Whether ``a`` handing a partition of ``t`` to ``b`` keeps the balance."""
        return self.total[b] < self.total[a] and self.can_shrink(a) and self.can_grow(b, t)

    def can_exchange(self, a: int, t: int, b: int, u: int) -> bool:
        """Whether ``a`` giving ``b`` a partition of ``t`` for one of ``u`` keeps the balance.

        Totals do not change, so only the two new holders can be too loaded.
        """
        return self.total[b] <= self.most_for(t) and self.total[a] <= self.most_for(u)

    def give_back(self) -> bool:
        """Return partitions to their owners, alone or in exchanges, while balance allows."""
        changed = False
        progress = True
        while progress:
            progress = False
            for o, t, p, h in self.lost():
                if self.holder[t][p] == h and self.can_hand_over(h, o, t):
                    self.move(t, p, h, o)
                    progress = True
            # Exchanges: o holds one of h's partitions while h holds one of o's.
            lost = self.lost()
            by_pair: dict[tuple[int, int], list[tuple[int, int]]] = {}
            for o, t, p, h in lost:
                by_pair.setdefault((o, h), []).append((t, p))
            for o, t, p, h in lost:
                if self.holder[t][p] != h:
                    continue
                for u, q in by_pair.get((h, o), []):
                    if self.holder[u][q] == o and self.can_exchange(h, t, o, u):
                        self.move(t, p, h, o)
                        self.move(u, q, o, h)
                        progress = True
                        break
            changed |= progress
        return changed


def _decrement(table: dict[int, int], key: int) -> None:
    left = table[key] - 1
    if left:
        table[key] = left
    else:
        del table[key]


def _fill_by_quota(state: _State, *, spread: bool) -> None:
    """Identical subscriptions: quotas, keep what fits, deal the rest in member order."""
    members = len(state.subs)
    owned: list[list[tuple[int, int]]] = [[] for _ in range(members)]
    free: list[tuple[int, int]] = []
    for t, owners in enumerate(state.owner):
        for p, o in enumerate(owners):
            if o >= 0:
                owned[o].append((t, p))
            else:
                free.append((t, p))
    base, extra = divmod(sum(state.sizes), members)
    quota = [base] * members
    # The extra partitions go to the members that own the most. With spread,
    # among equals first to those whose holding is the least lopsided, so
    # that the one that must give a partition up has one of a topic it holds
    # too many of.
    excess = [_excess(o, members, state.sizes) if spread else 0 for o in owned]
    for i in sorted(range(members), key=lambda i: (-len(owned[i]), excess[i], i))[:extra]:
        quota[i] += 1
    for i in range(members):
        if len(owned[i]) <= quota[i]:
            keep: Iterable[tuple[int, int]] = owned[i]
        elif spread:
            keep, released = _release_evenly(owned[i], quota[i], members, state.sizes)
            free.extend(released)
        else:
            keep = owned[i][: quota[i]]
            free.extend(owned[i][quota[i] :])
        state.add_many(i, keep)
    free.sort()
    # Dealt in member order, one at a time, to those below their quota: a member's share
    # is every len(receivers)-th free partition while it stays below its quota. Dealt a
    # block of whole rounds at a time (as many as the receiver wanting least still
    # wants), by slicing: the same shares as one partition at a time, without a step
    # per partition (100,000 of them in a large group).
    dealt: list[list[tuple[int, int]]] = [[] for _ in range(members)]
    wanted = [quota[i] - state.total[i] for i in range(members)]
    receivers = [i for i in range(members) if wanted[i] > 0]
    at = 0
    while receivers and at < len(free):
        width = len(receivers)
        rounds = min(min(wanted[i] for i in receivers), (len(free) - at) // width)
        if rounds == 0:  # fewer free partitions left than receivers: a last partial round
            for i, tp in zip(receivers, free[at:], strict=False):
                dealt[i].append(tp)
            break
        end = at + rounds * width
        for k, i in enumerate(receivers):
            dealt[i].extend(free[at + k : end : width])
            wanted[i] -= rounds
        at = end
        receivers = [i for i in receivers if wanted[i] > 0]
    for i, share in enumerate(dealt):
        state.add_many(i, share)


def _excess(owned: list[tuple[int, int]], members: int, sizes: list[int]) -> int:
    """How far above its even share of some topic ``owned`` goes, at most (times ``members``)."""
    counts: dict[int, int] = {}
    for t, _ in owned:
        counts[t] = counts.get(t, 0) + 1
    return max((n * members - sizes[t] for t, n in counts.items()), default=-sum(sizes))


def _release_evenly(
    owned: list[tuple[int, int]], quota: int, members: int, sizes: list[int]
) -> tuple[list[tuple[int, int]], list[tuple[int, int]]]:
    """Keep ``quota`` of ``owned``, giving up partitions of the topics the member
    holds most of relative to that topic's even share (``size / members``)."""
    by_topic: dict[int, list[int]] = {}
    for t, p in owned:
        by_topic.setdefault(t, []).append(p)
    heap = [(-(len(ps) * members - sizes[t]), t) for t, ps in by_topic.items()]
    heapq.heapify(heap)
    released = []
    for _ in range(len(owned) - quota):
        _, t = heapq.heappop(heap)
        released.append((t, by_topic[t].pop()))
        if by_topic[t]:
            heapq.heappush(heap, (-(len(by_topic[t]) * members - sizes[t]), t))
    kept = [(t, p) for t in sorted(by_topic) for p in by_topic[t]]
    return kept, released


def _fill_greedily(state: _State) -> None:
    """Mixed subscriptions: keep everything owned; give every other partition to the
    least loaded subscriber (of those, the one with the fewest of its topic).

    The topics are interleaved, each in proportion to its unowned partitions
    (the k-th of n goes at k/n of the way), so that no topic is handed out
    while the members' loads are all low; at the same point of the way, topics
    with fewer subscribers go first.
    """
    unowned: list[list[int]] = []
    for t, owners in enumerate(state.owner):
        unowned.append([])
        for p, o in enumerate(owners):
            if o >= 0:
                state.add(o, t, p)
            else:
                unowned[t].append(p)
    order = sorted(
        ((k << 32) // len(free), len(state.topic_subs[t]), t, p)
        for t, free in enumerate(unowned)
        for k, p in enumerate(free)
    )
    for _, _, t, p in order:
        state.add(state._lowest(t)[1], t, p)


def _even_out(state: _State) -> bool:
    """``uniform``: hand over or exchange partitions while that lowers the sum of
    squared per-topic counts, keeps the balance and keeps at least as many
    owned partitions in place.

    Every such move involves a topic ``t`` and a member ``a`` giving a
    partition of ``t`` to a subscriber ``b`` with at least two fewer of ``t``
    (an exchange in which neither side has two more of the topic it gives
    cannot lower the sum). So only those pairs are searched, and the search
    ends after a pass that changes nothing. Returns whether anything moved.
    """
    changed_any = False
    while True:
        changed = False
        for t in range(len(state.sizes)):
            counts = state.tcount[t]
            if not counts:
                continue
            # The fewest of t any subscriber holds. Moves in this pass may make
            # it stale; the pass that changes nothing computes it afresh.
            low = 0 if len(counts) < len(state.topic_subs[t]) else min(counts.values())
            if max(counts.values()) < low + 2:
                continue
            for a in sorted(counts):
                while counts.get(a, 0) >= low + 2 and _improve(state, a, t):
                    changed = True
        if not changed:
            return changed_any
        changed_any = True


def _improve(state: _State, a: int, t: int) -> bool:
    """One hand-over or exchange in which ``a`` gives a partition of ``t`` to a member
    ``b`` holding at least two fewer of ``t``: see :func:`_even_out`.

    What keeps the owned partitions in place: a hand-over of a partition ``a``
    did not own; an exchange of two partitions neither side owned; ``a``
    giving a partition back to its owner for one the owner kept; ``a`` giving
    up one it kept for one of its own back.
    """
    counts = state.tcount[t]
    have = counts[a]
    limit = state.most_for(t)  # the most b may have to take a partition of t
    owner_t = state.owner[t]
    free_here = state.free[a].get(t, 0)
    if free_here and state.can_shrink(a) and limit <= state.total[a]:
        # A hand-over: b must be a least loaded subscriber of t (limit - 1).
        candidates = sorted(
            (counts.get(b, 0), b)
            for b in state.topic_subs[t]
            if state.total[b] == limit - 1 and counts.get(b, 0) <= have - 2
        )
        for _, b in candidates:
            if state.can_grow(b, t):
                state.move(t, state.pick(a, t, for_member=b, free_only=True), a, b)
                return True
    # Exchanges: a takes a partition of a topic u it may hold at its total.
    swaps = [u for u in state.subs[a] if u != t and state.total[a] <= state.most_for(u)]
    if not swaps:
        return False
    mine = state.count[a]

    def gain(b: int, u: int) -> int:
        return have - counts.get(b, 0) + state.count[b].get(u, 0) - mine.get(u, 0)

    if free_here:
        # A free partition of a's for a free one of b's.
        if len(state.topic_subs[t]) <= sum(len(state.tfree[u]) for u in swaps):
            pairs: Iterable[tuple[int, int]] = (
                (b, u)
                for _, b in sorted(
                    (counts.get(b, 0), b)
                    for b in state.topic_subs[t]
                    if state.total[b] <= limit and counts.get(b, 0) <= have - 2
                )
                for u in swaps
                if state.free[b].get(u)
            )
        else:
            pairs = (
                (b, u)
                for u in swaps
                for b in sorted(state.tfree[u])
                if state.total[b] <= limit and t in state.sub_sets[b]
            )
        for b, u in pairs:
            if gain(b, u) >= 3:
                _exchange(state, a, t, state.pick(a, t, for_member=b, free_only=True), b, u)
                return True
        # A free partition of a's back to its owner b, for one that b kept.
        for b in sorted({owner_t[p] for p in state.parts[a][t]} - {-1, a}):
            if state.total[b] > limit:
                continue
            for u in swaps:
                if state.count[b].get(u, 0) > state.free[b].get(u, 0) and gain(b, u) >= 3:
                    p = max(p for p in state.parts[a][t] if owner_t[p] == b)
                    q = max(q for q in state.parts[b][u] if state.owner[u][q] == b)
                    _exchange(state, a, t, p, b, u, q)
                    return True
    if counts[a] > free_here:
        # A partition a kept, for one of a's own back from its holder b.
        allowed = set(swaps)
        for u, q in sorted(state.released[a]):
            b = state.holder[u][q]
            if u in allowed and t in state.sub_sets[b] and state.total[b] <= limit:
                if gain(b, u) >= 3:
                    p = max(p for p in state.parts[a][t] if owner_t[p] == a)
                    _exchange(state, a, t, p, b, u, q)
                    return True
    return False


def _padded(racks: Sequence[str], size: int) -> list[str]:
    """``racks`` cut or padded with ``""`` (unknown) to ``size`` entries."""
    out = list(racks[:size])
    return out + [""] * (size - len(out))


def _match_racks(
    state: _State, member_racks: list[str], part_racks: list[list[str]], *, any_owner: bool
) -> None:
    """Exchange two partitions of one topic between two members while that gives more
    partitions to a member of their rack (KIP-881; see the assignors' module docstring).

    Only partitions not kept in place move (``any_owner`` False, the mixed path: only
    those nobody owned, so that none could go back to an owner), and an exchange within
    one topic changes no count: balance, per-topic counts and the owned partitions kept
    stay as they are. Each exchange gives one more partition (or two) to a member of its
    rack, so the loop ends; it is deterministic (partitions in order, lowest first).

    The last step of an assignment: it keeps only ``holder`` and ``parts`` up to date
    (an exchange within a topic changes none of the counts the other tables keep, but
    it would change which partitions are free; nothing reads them after this).
    """
    for t, racks in enumerate(part_racks):
        if not any(racks):
            continue
        holders, owners = state.holder[t], state.owner[t]
        # Partitions that may move: not held by their owner (and, unless any_owner,
        # owned by nobody). An exchange gives one to a member that did not own it, or
        # back to its owner; either way the rest stay movable or become kept.
        movable = [o != h and (any_owner or o < 0) for o, h in zip(owners, holders, strict=True)]
        changed, swapped = True, False
        while changed:
            changed = False
            # pools[r]: movable partitions of rack r held by a member of another rack,
            # highest first (pop() gives the lowest); stale entries are skipped.
            pools: dict[str, list[int]] = {}
            for p in range(len(racks) - 1, -1, -1):
                rack = racks[p]
                if rack and movable[p] and member_racks[holders[p]] != rack:
                    pools.setdefault(rack, []).append(p)
            if not pools:
                break
            for p in range(len(racks)):
                if not movable[p]:
                    continue
                a = holders[p]
                want = member_racks[a]
                if not want or want == racks[p]:
                    continue
                pool = pools.get(want)
                while pool and (not movable[pool[-1]] or member_racks[holders[pool[-1]]] == want):
                    pool.pop()
                if not pool:
                    continue
                q = pool.pop()
                b = holders[q]
                holders[p], holders[q] = b, a
                movable[p] = owners[p] != b
                movable[q] = owners[q] != a
                changed = swapped = True
        if swapped:
            held: dict[int, list[int]] = {}
            for p, i in enumerate(holders):
                if i >= 0:
                    held.setdefault(i, []).append(p)
            for i, parts in held.items():
                state.parts[i][t] = parts


def _exchange(state: _State, a: int, t: int, p: int, b: int, u: int, q: int = -1) -> None:
    """``a`` gives ``b`` partition ``p`` of ``t`` for partition ``q`` of ``u``
    (by default the free one of ``u`` that :meth:`_State.pick` chooses)."""
    if q < 0:
        q = state.pick(b, u, for_member=a, free_only=True)
    state.move(t, p, a, b)
    state.move(u, q, b, a)
