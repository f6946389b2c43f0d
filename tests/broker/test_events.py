"""Group events are typed: each kind is one Struct with a tag, logged and read back as JSON."""

from __future__ import annotations

import msgspec

from trio_coord.broker import events
from trio_coord.broker.events import EVENT_TYPES, GroupEvent, Stable, decode_event


def test_every_event_kind_is_listed_once_with_a_distinct_tag() -> None:
    defined = {
        obj
        for obj in vars(events).values()
        if isinstance(obj, type) and issubclass(obj, GroupEvent) and obj is not GroupEvent
    }
    assert set(EVENT_TYPES) == defined
    kinds = [t.__struct_config__.tag for t in EVENT_TYPES]
    assert len(set(kinds)) == len(kinds)


def test_an_event_logs_as_json_with_its_kind_and_reads_back() -> None:
    event = Stable(
        group="g", time=3.5, generation=2, elapsed=0.25, ownership={"t-0": "m1"}, cause="crash"
    )
    logged = msgspec.json.decode(msgspec.json.encode(event))
    assert logged["kind"] == event.kind == "stable"
    assert logged["group"] == "g" and logged["cause"] == "crash"
    assert decode_event(msgspec.json.encode(event)) == event
