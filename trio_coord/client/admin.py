"""The admin client: topics and groups, as ``trio-coord topics`` and ``groups`` use them.

``open_admin(bootstrap)`` keeps one connection to a bootstrap broker for
cluster-wide requests (topics, metadata) and asks each group's coordinator
about that group, so the same calls work on one broker or a cluster. Every
method raises the typed :class:`~trio_coord.CoordError` subclass for what the
broker refused, with the broker's message.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Iterable, Sequence
from contextlib import asynccontextmanager
from typing import TypeVar

from ..protocol.connection import Connection, open_connection, serving
from ..protocol.messages import (
    AddPartitionsRequest,
    AddPartitionsResponse,
    BrokerInfo,
    CreateGroupRequest,
    CreateTopicRequest,
    CreateTopicResponse,
    DeleteGroupRequest,
    DescribeGroupRequest,
    DescribeGroupResponse,
    GroupDescription,
    GroupSummary,
    ListGroupsRequest,
    ListGroupsResponse,
    MetadataRequest,
    MetadataResponse,
    OffsetFetchRequest,
    OffsetFetchResponse,
    RequestBody,
    TopicInfo,
    TopicPartition,
)
from ._bootstrap import Bootstrap

__all__ = ["Admin", "open_admin"]

_R = TypeVar("_R")


class Admin:
    """Administrative operations on a cluster; create it with :func:`open_admin`."""

    def __init__(self, bootstrap: Bootstrap, conn: Connection) -> None:
        self._bootstrap = bootstrap
        self._conn = conn

    async def _ask(
        self, request: RequestBody, expected: type[_R], conn: Connection | None = None
    ) -> _R:
        response = await (conn or self._conn).request(request)
        assert isinstance(response, expected), f"unexpected answer {response!r}"
        return response

    async def _ask_coordinator(self, group_id: str, request: RequestBody, expected: type[_R]) -> _R:
        coordinator = await self._bootstrap.find_coordinator(group_id)
        async with open_connection(coordinator.host, coordinator.port) as conn:
            return await self._ask(request, expected, conn)

    # -- cluster and topics ------------------------------------------------------------

    async def metadata(self, topics: Sequence[str] | None = None) -> MetadataResponse:
        """Live brokers and topics (``topics=None``: all topics)."""
        return await self._ask(
            MetadataRequest(list(topics) if topics is not None else None), MetadataResponse
        )

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

    async def list_topics(self) -> list[TopicInfo]:
        """Every topic, sorted by name."""
        return (await self.metadata()).topics

    async def describe_topics(self, names: Iterable[str]) -> list[TopicInfo]:
        """The named topics (raises UnknownTopicError for a missing one)."""
        return (await self.metadata(list(names))).topics

    # -- groups --------------------------------------------------------------------------

    async def list_groups(self) -> list[GroupSummary]:
        """Every group of every live broker, sorted by id."""
        groups: dict[str, GroupSummary] = {}
        for broker in await self.brokers():
            async with open_connection(broker.host, broker.port) as conn:
                response = await self._ask(ListGroupsRequest(), ListGroupsResponse, conn)
            groups.update((g.group_id, g) for g in response.groups)
        return [groups[g] for g in sorted(groups)]

    async def describe_group(self, group_id: str) -> GroupDescription:
        """State, generation, members with their partitions, and committed offsets."""
        response = await self._ask_coordinator(
            group_id, DescribeGroupRequest(group_id), DescribeGroupResponse
        )
        return response.group

    async def committed_offsets(
        self, group_id: str, partitions: Iterable[TopicPartition] | None = None
    ) -> dict[TopicPartition, int]:
        """A group's committed offsets (all, or for ``partitions``)."""
        wanted = None if partitions is None else [TopicPartition(*tp) for tp in partitions]
        response = await self._ask_coordinator(
            group_id, OffsetFetchRequest(group_id, wanted), OffsetFetchResponse
        )
        return {o.tp: o.offset for o in response.offsets}

    async def create_group(self, group_id: str) -> None:
        """Create an empty group (raises GroupAlreadyExistsError)."""
        await self._ask_coordinator(group_id, CreateGroupRequest(group_id), object)

    async def delete_group(self, group_id: str) -> None:
        """Delete an empty group and its offsets (raises NonEmptyGroupError)."""
        await self._ask_coordinator(group_id, DeleteGroupRequest(group_id), object)


@asynccontextmanager
async def open_admin(bootstrap: str | Sequence[str]) -> AsyncIterator[Admin]:
    """Connect to a bootstrap broker for administrative calls, for the life of the block.

    Retries with backoff while no bootstrap broker accepts a connection;
    bound it with ``trio.fail_after`` to give up.
    """
    boot = Bootstrap(bootstrap)
    stream, (host, port) = await boot.connect_any()
    async with serving(Connection(stream, name=f"{host}:{port}")) as conn:
        yield Admin(boot, conn)
