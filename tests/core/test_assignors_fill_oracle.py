"""The i14-joins rewrites answer exactly what the code they replaced answered.

The sticky/uniform quota fill was rewritten on plain ints (``core/_sticky.py``)
and :func:`validate_assignment` got a fast first pass; neither may change a
single answer. The balancing is compared, on random small groups (identical
and mixed subscriptions, claims that count and claims that cannot, racks),
with the module as it was before (``_sticky_before_i14.py``, a verbatim copy):
any answer that differs is a behaviour change users would see as partitions
moving. The fast pass is compared with the detailed check on valid
assignments and on each way one can be wrong: it must accept exactly what the
detailed check accepts, and every error must say what it said before.
"""

from __future__ import annotations

from unittest import mock

import _sticky_before_i14 as before
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from trio_coord.core import assignors
from trio_coord.core._sticky import balanced_assignment
from trio_coord.core.assignors import GroupSpec, MemberSpec, validate_assignment
from trio_coord.protocol.messages import TopicPartition as TP

TOPICS = ["a", "b", "c", "d"]
RACKS = ["", "r1", "r2"]


@st.composite
def groups(draw: st.DrawFn, max_members: int = 7, max_partitions: int = 9) -> GroupSpec:
    """A group of up to ``max_members``: identical or mixed subscriptions, owned claims
    (some on topics, partitions or members that cannot count), racks or none."""
    ids = draw(
        st.lists(
            st.text("abcdefgh", min_size=1, max_size=2),
            min_size=1,
            max_size=max_members,
            unique=True,
        )
    )
    partitions = draw(
        st.dictionaries(st.sampled_from(TOPICS), st.integers(0, max_partitions), min_size=1)
    )
    topic_sets = st.frozensets(st.sampled_from([*TOPICS, "absent"]), min_size=1)
    shared = draw(topic_sets) if draw(st.booleans()) else None
    claimable = [TP(t, p) for t in [*TOPICS, "absent"] for p in range(-1, max_partitions + 2)]
    racked = draw(st.booleans())
    members = {}
    for member_id in ids:
        topics = shared if shared is not None else draw(topic_sets)
        owned = draw(st.lists(st.sampled_from(claimable), max_size=12))
        rack = draw(st.sampled_from(RACKS)) if racked else ""
        members[member_id] = MemberSpec(member_id, topics, owned=tuple(owned), rack=rack)
    racks = {}
    if racked:
        for topic, count in partitions.items():
            if draw(st.booleans()):
                racks[topic] = draw(
                    st.lists(st.sampled_from(RACKS), min_size=count, max_size=count)
                )
    return GroupSpec(members, partitions, racks)


def _as_lists(assignment):
    return {m: list(tps) for m, tps in assignment.items()}


@settings(max_examples=250, deadline=None)
@given(spec=groups(), spread=st.booleans())
def test_the_balancing_answers_what_it_answered_before_the_rewrite(spec, spread) -> None:
    assert _as_lists(balanced_assignment(spec, spread=spread)) == _as_lists(
        before.balanced_assignment(spec, spread=spread)
    )


@settings(max_examples=150, deadline=None)
@given(spec=groups(max_members=3, max_partitions=9), spread=st.booleans(), data=st.data())
def test_a_rebalance_fed_its_own_answer_answers_what_it_answered_before(spec, spread, data):
    """The second generation (every member owns what it got, one member more or less)
    takes the paths where owned partitions are kept and released."""
    first = balanced_assignment(spec, spread=spread)
    members = dict(spec.members)
    if len(members) > 1 and data.draw(st.booleans()):
        del members[data.draw(st.sampled_from(sorted(members)))]
    else:
        newcomer = data.draw(st.text("xyz", min_size=1, max_size=2))
        members[newcomer] = MemberSpec(newcomer, next(iter(spec.members.values())).topics)
    fed = {
        m: MemberSpec(m, ms.topics, owned=tuple(first.get(m, ())), rack=ms.rack)
        for m, ms in members.items()
    }
    again = GroupSpec(fed, spec.partitions, spec.racks)
    assert _as_lists(balanced_assignment(again, spread=spread)) == _as_lists(
        before.balanced_assignment(again, spread=spread)
    )


def test_a_larger_group_answers_what_it_answered_before() -> None:
    """60 members, 3 topics of 200 partitions, half of them owned unevenly."""
    partitions = {"a": 200, "b": 200, "c": 200}
    members = {}
    for k in range(60):
        member_id = f"m{k:02d}"
        owned = [TP(t, p) for t in "abc" for p in range(200) if (p * 7 + k) % 97 == 0 and k % 3]
        members[member_id] = MemberSpec(member_id, frozenset("abc"), owned=tuple(owned))
    spec = GroupSpec(members, partitions)
    for spread in (False, True):
        assert balanced_assignment(spec, spread=spread) == before.balanced_assignment(
            spec, spread=spread
        )


# -- validate_assignment: the fast pass accepts exactly what the detailed check accepts ---


def _outcome(spec: GroupSpec, assignment, *, slow: bool) -> str | None:
    """None if valid, else the exception's type and message."""
    with mock.patch.object(assignors, "_plainly_valid", lambda *_: False) if slow else _no_patch():
        try:
            validate_assignment(spec, assignment)
        except Exception as exc:  # (a TypeError would be a regression too)
            return f"{type(exc).__name__}: {exc}"
    return None


class _no_patch:
    def __enter__(self) -> None:
        return None

    def __exit__(self, *exc_info: object) -> None:
        return None


MISTAKES = [
    "none",
    "given twice",
    "missing",
    "unknown member",
    "not subscribed",
    "out of range",
    "negative",
    "twice in one member",
    "bool partition",
    "a tuple, not a list",
    "not a TopicPartition",
    "a plain tuple",
    "a topic that is not a str",
    "an unhashable topic",
]


def _spoil(spec: GroupSpec, good: dict[str, list[TP]], mistake: str, data: st.DataObject):
    bad = {m: list(tps) for m, tps in good.items()}
    holders = sorted(m for m in bad if bad[m])
    member = data.draw(st.sampled_from(sorted(bad)))
    if mistake == "none":
        return bad
    if mistake in ("given twice", "missing", "twice in one member") and not holders:
        return bad
    if mistake == "given twice":
        victim = data.draw(st.sampled_from(holders))
        bad[member].append(data.draw(st.sampled_from(bad[victim])))
    elif mistake == "missing":
        victim = data.draw(st.sampled_from(holders))
        bad[victim].pop(data.draw(st.integers(0, len(bad[victim]) - 1)))
    elif mistake == "twice in one member":
        victim = data.draw(st.sampled_from(holders))
        bad[victim].append(bad[victim][0])
    elif mistake == "unknown member":
        bad["nobody"] = []
    elif mistake == "not subscribed":
        other = [t for t in spec.topics() if t not in spec.members[member].topics]
        bad[member].append(TP(data.draw(st.sampled_from(other)), 0) if other else TP("zz", 0))
    elif mistake == "out of range":
        topic = data.draw(st.sampled_from(sorted(spec.partitions)))
        bad[member].append(TP(topic, spec.partitions[topic]))
    elif mistake == "negative":
        bad[member].append(TP(data.draw(st.sampled_from(sorted(spec.partitions))), -1))
    elif mistake == "bool partition" and bad[member]:
        topic, _ = bad[member][0]
        bad[member][0] = TP(topic, True)
    elif mistake == "a tuple, not a list":
        bad[member] = tuple(bad[member])  # type: ignore[assignment]
    elif mistake == "not a TopicPartition":
        bad[member].append("a-0")  # type: ignore[arg-type]
    elif mistake == "a plain tuple" and bad[member]:
        bad[member][0] = tuple(bad[member][0])  # type: ignore[call-overload]
    elif mistake == "an unhashable topic":  # (a custom assignor's mistake)
        bad[member].append(TP([sorted(spec.partitions)[0]], 0))  # type: ignore[arg-type]
    elif mistake == "a topic that is not a str":
        bad[member].append(TP(("a",), 0))  # type: ignore[arg-type]
    return bad


@settings(max_examples=300, deadline=None)
@given(spec=groups(), mistake=st.sampled_from(MISTAKES), data=st.data())
def test_the_fast_pass_accepts_what_the_detailed_check_accepts_with_the_same_errors(
    spec, mistake, data
) -> None:
    good = balanced_assignment(spec, spread=data.draw(st.booleans()))
    assignment = _spoil(spec, good, mistake, data)
    slow = _outcome(spec, assignment, slow=True)
    assert _outcome(spec, assignment, slow=False) == slow
    assert slow is None or slow.startswith("ValueError: invalid assignment: ")


@pytest.mark.parametrize(
    ("assignment", "message"),
    [
        ({"m1": [TP("a", 0), TP("a", 1)], "m2": [TP("a", 1)]}, "assigned more than once: a-1"),
        ({"m1": [TP("a", 0)], "m2": []}, "assigned to no member: a-1"),
        ({"m1": [TP("a", 0), TP("a", 1)], "m3": []}, "unknown member(s) 'm3'"),
        (
            {"m1": [TP("a", 0), TP("a", 1), TP("b", 0)]},
            "'m1' got b-0 but does not subscribe to 'b'",
        ),
        (
            {"m1": [TP("a", 0), TP("a", 1), TP("a", 2)]},
            "'m1' got a-2: no such partition ('a' has 2)",
        ),
        ({"m1": [TP("a", 0), TP("a", 1), TP("a", 0)]}, "assigned more than once: a-0"),
    ],
    ids=["twice", "missing", "unknown member", "not subscribed", "out of range", "dup in one"],
)
def test_each_mistake_is_reported_in_the_words_it_was(assignment, message) -> None:
    spec = GroupSpec(
        {"m1": MemberSpec("m1", frozenset({"a"})), "m2": MemberSpec("m2", frozenset({"a"}))},
        {"a": 2, "b": 1},
    )
    with pytest.raises(ValueError) as caught:
        validate_assignment(spec, assignment)
    assert str(caught.value) == f"invalid assignment: {message}"
