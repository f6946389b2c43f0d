"""The blocking client follows a coordinator or a leader that moved, and a failed commit is retried.

A cluster moves a group's coordinator (or a partition's leader) when a broker
loses its ZooKeeper session; the broker that was asked then answers
NOT_COORDINATOR (NOT_LEADER_FOR_PARTITION), and the retry must go where fresh
metadata says, not back to the broker that refused. These tests script two
brokers on 127.0.0.1 (port 0) that speak the wire protocol from threads: the
blocking client is synchronous, so no Trio broker is needed, and the move
happens exactly between the client's lookup and its request.
"""

from __future__ import annotations

import socket
import threading
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field

import pytest

from trio_coord.protocol.errors import (
    BrokerShuttingDownError,
    ConnectionClosedError,
    CoordError,
    NotCoordinatorError,
    NotLeaderForPartitionError,
    UnknownMemberError,
)
from trio_coord.protocol.framing import HEADER_SIZE, FrameCodec
from trio_coord.protocol.messages import (
    LATEST,
    BrokerInfo,
    FetchedBatch,
    FetchedPartition,
    FetchRequest,
    FetchResponse,
    ListedOffset,
    ListOffsetsRequest,
    ListOffsetsResponse,
    MetadataRequest,
    MetadataResponse,
    OffsetCommitRequest,
    OffsetCommitResponse,
    OffsetFetchRequest,
    OffsetFetchResponse,
    PartitionOffset,
    ProduceRequest,
    ProduceResponse,
    Request,
    RequestBody,
    Response,
    ResponseBody,
    TopicInfo,
    TopicPartition,
)
from trio_coord.spark import BlockingClient
from trio_coord.spark._options import read_options
from trio_coord.spark._plan import offsets_to_json
from trio_coord.spark._read import StreamReader, commit_quietly

TP = TopicPartition("t", 0)


def _recv_exactly(conn: socket.socket, size: int) -> bytes | None:
    data = b""
    while len(data) < size:
        chunk = conn.recv(size - len(data))
        if not chunk:
            return None
        data += chunk
    return data


class _ScriptedBroker:
    """Listens on 127.0.0.1 port 0 and answers each request with ``answer(broker_id, body)``
    (a raised CoordError becomes an error answer)."""

    def __init__(self, broker_id: int, answer: Callable[[int, RequestBody], ResponseBody]):
        self._listener = socket.create_server(("127.0.0.1", 0))
        self._listener.settimeout(0.05)
        self.info = BrokerInfo(broker_id, "127.0.0.1", self._listener.getsockname()[1])
        self._answer = answer
        self._stopping = threading.Event()
        self._threads = [threading.Thread(target=self._accept, daemon=True)]
        self._threads[0].start()

    def _accept(self) -> None:
        while not self._stopping.is_set():
            try:
                conn, _ = self._listener.accept()
            except TimeoutError:
                continue
            thread = threading.Thread(target=self._serve, args=(conn,), daemon=True)
            self._threads.append(thread)
            thread.start()

    def _serve(self, conn: socket.socket) -> None:
        codec = FrameCodec()
        conn.settimeout(0.05)
        with conn:
            while not self._stopping.is_set():
                try:
                    header = _recv_exactly(conn, HEADER_SIZE)
                except TimeoutError:
                    continue
                body = header and _recv_exactly(conn, int.from_bytes(header, "big"))
                if not body:
                    return
                request = codec.decode(body)
                assert isinstance(request, Request)
                try:
                    response = Response(
                        request.corr_id, 0, body=self._answer(self.info.broker_id, request.body)
                    )
                except CoordError as exc:
                    response = Response(request.corr_id, exc.code, str(exc))
                try:
                    conn.sendall(codec.encode(response))
                except OSError:  # (the client gave up on this connection)
                    return

    def close(self) -> None:
        self._stopping.set()
        for thread in self._threads:
            thread.join()
        self._listener.close()


@dataclass
class _Cluster:
    """Two scripted brokers sharing one view: who coordinates, who leads TP, what is committed.

    ``move_on`` names a request type: the first time the coordinator (or
    TP's leader) is sent one, it hands over to the other broker and refuses.
    ``refuse_commits`` commits answer UNKNOWN_MEMBER (a consumer is in the group).
    """

    move_on: type[RequestBody] | None = None
    moved_says: type[CoordError] = NotLeaderForPartitionError
    """What TP's leader answers the ``move_on`` request with as it hands TP over."""
    moves_after: int = 0
    """How many ``move_on`` requests TP's leader answers before it hands TP over."""
    stall_after_fetches: int | None = None
    """Fetches answered before the brokers stop answering them (until the test ends)."""
    unstall: threading.Event = field(default_factory=threading.Event)
    refuse_commits: int = 0
    ghost_leader: int = 0
    """How many Metadata answers name TP's leader as broker 9, which is not live (a leader
    between ZooKeeper sessions)."""
    coordinator: int = 1
    leader: int = 1
    committed: dict[TopicPartition, int] = field(default_factory=dict)
    asked: list[tuple[int, str]] = field(default_factory=list)
    brokers: dict[int, _ScriptedBroker] = field(default_factory=dict)

    def answer(self, broker: int, body: RequestBody) -> ResponseBody:
        self.asked.append((broker, type(body).__name__))
        other = 3 - broker
        if isinstance(body, MetadataRequest):
            infos = [self.brokers[b].info for b in sorted(self.brokers)]
            leader = self.leader
            if self.ghost_leader:
                self.ghost_leader -= 1
                leader = 9
            topics = [TopicInfo(TP.topic, 1, [leader])]
            return MetadataResponse(infos, topics, self.brokers[self.coordinator].info)
        if isinstance(body, ProduceRequest | ListOffsetsRequest | FetchRequest):
            if broker != self.leader:
                raise NotLeaderForPartitionError(f"broker {broker} does not lead {TP}")
            if type(body) is self.move_on and self.moves_after:
                self.moves_after -= 1
            elif type(body) is self.move_on:
                self.move_on, self.leader = None, other
                raise self.moved_says(f"broker {broker} no longer leads {TP}")
            if isinstance(body, FetchRequest):
                return self._fetched(body.partitions[0].offset)
            if isinstance(body, ListOffsetsRequest):
                return ListOffsetsResponse([ListedOffset(TP.topic, TP.partition, 7, 0, 7)])
            return ProduceResponse(7)
        if broker != self.coordinator:
            raise NotCoordinatorError(f"broker {broker} does not coordinate the group")
        if type(body) is self.move_on:
            self.move_on, self.coordinator = None, other
            raise NotCoordinatorError(f"broker {broker} was deposed; ask Metadata again")
        if isinstance(body, OffsetFetchRequest):
            return OffsetFetchResponse(
                [PartitionOffset(tp.topic, tp.partition, o) for tp, o in self.committed.items()]
            )
        assert isinstance(body, OffsetCommitRequest)
        if self.refuse_commits:
            self.refuse_commits -= 1
            raise UnknownMemberError("the group has live members")
        self.committed.update((o.tp, o.offset) for o in body.offsets)
        return OffsetCommitResponse()

    def _fetched(self, offset: int) -> FetchResponse:
        """Ten records of TP from ``offset`` (their bytes are not looked at), or no answer at
        all once ``stall_after_fetches`` have been answered."""
        if self.stall_after_fetches is not None:
            if not self.stall_after_fetches:
                self.unstall.wait()
                raise BrokerShuttingDownError("the test is over")
            self.stall_after_fetches -= 1
        batch = FetchedBatch(offset, 10, b"")
        return FetchResponse([FetchedPartition(TP.topic, TP.partition, 0, "", 0, 100, [batch])])

    @property
    def bootstrap(self) -> str:
        return self.brokers[1].info.address


@pytest.fixture
def cluster() -> Iterator[_Cluster]:
    scripted = _Cluster()
    for broker_id in (1, 2):
        scripted.brokers[broker_id] = _ScriptedBroker(broker_id, scripted.answer)
    yield scripted
    scripted.unstall.set()
    for broker in scripted.brokers.values():
        broker.close()


@pytest.mark.parametrize("refused", [OffsetFetchRequest, OffsetCommitRequest])
def test_a_commit_follows_the_coordinator_that_moved_while_asked(cluster, refused):
    cluster.move_on = refused
    assert commit_quietly(cluster.bootstrap, "g", {TP: 42})
    assert cluster.committed == {TP: 42}
    assert cluster.coordinator == 2
    assert (1, refused.__name__) in cluster.asked  # refused by the deposed coordinator...
    assert cluster.asked[-1] == (2, "OffsetCommitRequest")  # ...and committed at the new one


def test_a_produce_follows_the_leader_that_moved_while_asked(cluster):
    cluster.move_on = ProduceRequest
    with BlockingClient(cluster.bootstrap, timeout=5.0) as client:
        assert client.produce(TP, b"", 0, 0) == 7
    produces = [broker for broker, kind in cluster.asked if kind == "ProduceRequest"]
    assert produces == [1, 2]


def test_batches_produced_together_follow_the_leader_that_moved_while_asked(cluster):
    cluster.move_on = ProduceRequest
    with BlockingClient(cluster.bootstrap, timeout=5.0) as client:
        assert client.produce_many([ProduceRequest(TP.topic, TP.partition, b"", 0, 0)]) == [7]
        with pytest.raises(ValueError, match="at most one batch per partition"):
            client.produce_many([ProduceRequest(TP.topic, TP.partition, b"", 0, 0)] * 2)
    produces = [broker for broker, kind in cluster.asked if kind == "ProduceRequest"]
    assert produces == [1, 2]


def test_batches_produced_together_wait_for_a_leader_that_is_not_live_yet(cluster):
    # produce() retries a leader the metadata names but does not list as live (retriable
    # NOT_LEADER_FOR_PARTITION); produce_many used to raise it at once, failing the task.
    cluster.ghost_leader = 1
    with BlockingClient(cluster.bootstrap, timeout=5.0) as client:
        assert client.produce_many([ProduceRequest(TP.topic, TP.partition, b"", 0, 0)]) == [7]
    produces = [broker for broker, kind in cluster.asked if kind == "ProduceRequest"]
    assert produces == [1]


def test_a_produce_refused_by_a_broker_shutting_down_goes_to_the_new_leader_next(cluster):
    # The routing policy takes BROKER_SHUTTING_DOWN as a move: the retry asks Metadata
    # again rather than going back to the broker that is leaving.
    cluster.move_on, cluster.moved_says = ProduceRequest, BrokerShuttingDownError
    with BlockingClient(cluster.bootstrap, timeout=5.0) as client:
        assert client.produce(TP, b"", 0, 0) == 7
    produces = [broker for broker, kind in cluster.asked if kind == "ProduceRequest"]
    assert produces == [1, 2]


def test_list_offsets_waits_for_a_leader_that_is_not_live_yet(cluster):
    # (It used to raise the retriable NOT_LEADER_FOR_PARTITION at once, failing the task.)
    cluster.ghost_leader = 2
    with BlockingClient(cluster.bootstrap, timeout=5.0) as client:
        assert client.list_offsets([TP], LATEST)[TP].offset == 7
    asked = [broker for broker, kind in cluster.asked if kind == "ListOffsetsRequest"]
    assert asked == [1]


def test_list_offsets_follows_the_leader_that_moved_while_asked(cluster):
    # (It used to retry at the address it had first: the refusing broker, until it gave up.)
    cluster.move_on = ListOffsetsRequest
    with BlockingClient(cluster.bootstrap, timeout=5.0) as client:
        assert client.list_offsets([TP], LATEST)[TP].offset == 7
    asked = [broker for broker, kind in cluster.asked if kind == "ListOffsetsRequest"]
    assert asked == [1, 2]


def test_a_fetch_follows_the_leader_that_moved_while_the_next_fetch_was_ahead(cluster):
    # The fetch sent ahead is refused by the deposed leader: the next fetch asks Metadata
    # again rather than going back to the broker that refused it (a wasted round trip and
    # a backoff, which the fetch without a pipeline did not pay).
    cluster.move_on, cluster.moves_after = FetchRequest, 1
    with BlockingClient(cluster.bootstrap, timeout=5.0) as client:
        assert client.fetch(TP, 0, max_bytes=64, ahead_until=100).batches[0].base_offset == 0
        assert client.fetch(TP, 10, max_bytes=64, ahead_until=20).batches[0].base_offset == 10
    fetches = [broker for broker, kind in cluster.asked if kind == "FetchRequest"]
    assert fetches == [1, 1, 2]  # the fetch, the one sent ahead (refused), the one at 2


def test_a_broker_that_stops_answering_fails_a_fetch_after_one_timeout_not_two(cluster):
    # The fetch sent ahead had the whole timeout to be answered: the fetch that waited
    # for it fails then, as one without a pipeline does, rather than sending it again on
    # a new connection and waiting another timeout.
    cluster.stall_after_fetches = 1
    with BlockingClient(cluster.bootstrap, timeout=0.3) as client:
        assert client.fetch(TP, 0, max_bytes=64, ahead_until=100).batches[0].base_offset == 0
        with pytest.raises(ConnectionClosedError, match="timed out"):
            client.fetch(TP, 10, max_bytes=64, ahead_until=100)
    fetches = [broker for broker, kind in cluster.asked if kind == "FetchRequest"]
    assert fetches == [1, 1]  # the fetch and the one sent ahead, never answered


def test_a_fetch_or_produce_follows_a_leader_that_moved_off_a_lost_broker(cluster):
    both = f"{cluster.bootstrap},{cluster.brokers[2].info.address}"
    with BlockingClient(both, timeout=5.0) as client:
        assert client.produce(TP, b"", 0, 0) == 7  # at broker 1, which leads TP
        cluster.brokers[1].close()  # broker 1 dies; broker 2 takes TP over
        cluster.leader = 2
        assert client.produce(TP, b"", 0, 0) == 7
    produces = [broker for broker, kind in cluster.asked if kind == "ProduceRequest"]
    assert produces == [1, 2]


def test_a_stream_commit_that_failed_is_tried_again_for_the_same_batch(cluster):
    cluster.refuse_commits = 1
    options = read_options(
        {"bootstrap": cluster.bootstrap, "topic": TP.topic, "group": "g"}, streaming=True
    )
    reader = StreamReader(options)
    end = offsets_to_json({TP: 42}, group="g", bootstrap=cluster.bootstrap)
    reader.commit(end)  # refused: a consumer was in the group
    assert cluster.committed == {}
    reader.commit(end)  # Spark commits the same end again (or latestOffset starts from it)
    assert cluster.committed == {TP: 42}
    reader.stop()
