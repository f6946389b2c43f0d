"""Cutting a list a client sends into parts: every item once, in order, each part within
the budget of its moment, and a refused part cut again smaller from where it began."""

from __future__ import annotations

from trio_coord.protocol.messages import TopicPartition
from trio_coord.protocol.sizing import FrameGuess, Parts, encoded_size, listed_offset_bytes

ITEMS = [TopicPartition("t" * 40, p) for p in range(3000)]


def test_parts_cover_the_list_once_in_order_within_the_budget() -> None:
    budget = 4096
    parts = list(Parts(ITEMS, lambda: budget))
    assert [tp for part in parts for tp in part] == ITEMS
    assert len(parts) > 1
    assert all(sum(encoded_size(tp) for tp in part) <= budget for part in parts)
    assert list(Parts([], lambda: budget)) == [[]]  # (one empty part: the request is sent)


def test_a_refused_part_is_cut_again_smaller_from_where_it_began() -> None:
    guess = FrameGuess(1024 * 1024)
    parts = Parts(ITEMS, guess.budget, guess.halve)
    sent: list[list[TopicPartition]] = []
    refusals = 0
    for part in parts:
        if sum(encoded_size(tp) for tp in part) > 20_000:  # a broker of a small frame
            refusals += 1
            assert parts.refused()
            continue
        sent.append(part)
    assert [tp for part in sent for tp in part] == ITEMS  # nothing lost, nothing twice
    assert refusals == 4 and guess.broker_frame == 64 * 1024  # 1 MiB halved until it fits


def test_a_refusal_stands_once_the_guess_cannot_go_lower() -> None:
    guess = FrameGuess(1024 * 1024)
    while guess.halve():
        pass
    parts = Parts(ITEMS, guess.budget, guess.halve)
    next(iter(parts))
    assert not parts.refused()
    assert not Parts(ITEMS, guess.budget).refused()  # (no halving at all: it stands)


def test_offsets_lookups_are_cut_by_their_answer() -> None:
    short = [TopicPartition("t", p) for p in range(5000)]
    by_request = list(Parts(short, lambda: 16_384))
    by_answer = list(Parts(short, lambda: 16_384, size_of=listed_offset_bytes))
    assert len(by_answer) > 4 * len(by_request)  # an answer's entry is many times a name's
    assert all(sum(map(listed_offset_bytes, part)) <= 16_384 for part in by_answer)
