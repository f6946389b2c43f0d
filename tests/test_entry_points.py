"""open_consumer and open_producer take named, typed options, the same as the classes.

No ``**options``: a misspelt option is a TypeError at the call (and a type
checker's error before it), and each option's type is what the class
accepts, so the two can never drift apart.
"""

from __future__ import annotations

import inspect
import typing

import pytest

from trio_coord import Consumer, Producer, open_consumer, open_producer
from trio_coord.client.consumer import OffsetReset, RebalanceProtocol
from trio_coord.client.producer import Compression
from trio_coord.core.group import OFFSET_RESET_POLICIES, REBALANCE_PROTOCOLS
from trio_coord.protocol.records import COMPRESSION


@pytest.mark.parametrize(("entry", "cls"), [(open_consumer, Consumer), (open_producer, Producer)])
def test_an_entry_point_has_exactly_its_classes_options(entry, cls) -> None:
    opened = inspect.signature(entry).parameters
    built = dict(inspect.signature(cls.__init__).parameters)
    built.pop("self")
    assert not [p for p in opened.values() if p.kind is p.VAR_KEYWORD]
    assert [(p.name, p.kind, p.default, p.annotation) for p in opened.values()] == [
        (p.name, p.kind, p.default, p.annotation) for p in built.values()
    ]


def test_the_literal_types_are_the_policies_the_broker_and_codecs_know() -> None:
    assert typing.get_args(OffsetReset) == OFFSET_RESET_POLICIES
    assert typing.get_args(RebalanceProtocol) == REBALANCE_PROTOCOLS
    assert set(typing.get_args(Compression)) == {c for c in COMPRESSION if c is not None}


def test_a_misspelt_option_fails_at_the_call() -> None:
    with pytest.raises(TypeError, match="session_timout"):
        open_consumer("localhost:1", "g", ["t"], session_timout=1.0)  # type: ignore[call-arg]
    with pytest.raises(TypeError, match="lingr"):
        open_producer("localhost:1", lingr=0.1)  # type: ignore[call-arg]
