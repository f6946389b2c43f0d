"""A small blocking client for Spark's Python processes: the wire protocol over plain sockets.

Spark runs the data source's code in Python worker processes that have no
Trio event loop (and must not start one per task), so this client speaks the
same wire protocol as :mod:`trio_coord.client` with blocking sockets: the
frames are encoded and decoded by the shared :class:`~trio_coord.protocol.
framing.FrameCodec`, the records by :mod:`trio_coord.protocol.records`. It
opens nothing in ``__init__`` (a client may be made, pickled or dropped
without touching the network); the first request connects, to the broker the
request belongs to (a partition's leader, a group's coordinator, otherwise
any bootstrap broker), and :meth:`BlockingClient.close` closes every socket.
Use it as a context manager, one per task, so that the sockets are closed in
``finally`` whatever the task does.

Retriable errors (a lost connection, a coordinator not known yet or moved, a
leader moved, a broker shutting down) are retried with backoff until
``timeout`` seconds have passed, each retry sent where fresh metadata says;
anything else is raised at once as the typed :class:`CoordError`.

One request at a time, except :meth:`BlockingClient.produce_many`, which
puts one batch per partition in flight together on each leader's connection
(the broker answers them in any order, matched by correlation id): a Spark
write task then waits for one round trip per group of partitions, not per
batch; and :meth:`BlockingClient.fetch` with ``ahead_until``, which sends
the next fetch of a partition before the caller decodes this one's records.
"""

from __future__ import annotations

import itertools
import logging
import socket
import ssl
import time
from collections.abc import Callable, Iterable, Sequence
from typing import NamedTuple, TypeVar

import msgspec

from .._retry import RetryPolicy
from .._routing import Action, Routing, classify, coordinator_of, parse_bootstrap
from ..protocol.errors import (
    ConnectionClosedError,
    CoordError,
    CorruptMessageError,
    FrameTooLargeError,
    SaslAuthenticationError,
    error_for,
)
from ..protocol.framing import HEADER_SIZE, FrameCodec
from ..protocol.messages import (
    NO_OFFSET,
    FetchedPartition,
    FetchPartition,
    FetchRequest,
    FetchResponse,
    Goodbye,
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
    SaslAuthenticateRequest,
    SaslAuthenticateResponse,
    SaslHandshakeRequest,
    TopicPartition,
)
from ..protocol.sizing import FrameGuess, Parts, listed_offset_bytes
from ..security.scram import AuthenticationError, ScramClient, plain_message
from ._options import SparkSecurity

__all__ = ["BlockingClient", "BrokerUnreachableError"]

log = logging.getLogger(__name__)

RECEIVE_LIMIT = 64 * 1024 * 1024
"""The largest answer this client accepts (a broker bounds its answers by its own
maximum frame size, which is far smaller by default)."""

Address = tuple[str, int]

_FRAME_GUESSES: dict[tuple[Address, ...], FrameGuess] = {}
"""The brokers' frame as clients of this process learnt it, per bootstrap list: each Spark
micro-batch opens a client of its own, which learnt it again from the default (each
refusal costs a connection, and the broker a WARNING, at every micro-batch)."""
_MOST_GUESSES = 64


def _frame_guess(addresses: Sequence[Address]) -> FrameGuess:
    """The frame guess shared by this process's clients of ``addresses``."""
    key = tuple(addresses)
    guess = _FRAME_GUESSES.get(key)
    if guess is None:
        if len(_FRAME_GUESSES) >= _MOST_GUESSES:  # (a job of many clusters: start over)
            _FRAME_GUESSES.clear()
        guess = _FRAME_GUESSES[key] = FrameGuess(RECEIVE_LIMIT)
    return guess


_R = TypeVar("_R", bound=ResponseBody)
_T = TypeVar("_T")


class BrokerUnreachableError(ConnectionClosedError):
    """No broker of the bootstrap list could be reached (or one stopped answering)."""


class _Socket:
    """One blocking connection: send requests, read their answers.

    Requests may be sent ahead (:meth:`send`) and their answers read later
    (:meth:`receive`); an answer read while waiting for another is kept until
    it is asked for or :meth:`drop`-ped.
    """

    def __init__(self, sock: socket.socket, address: Address) -> None:
        self.sock = sock
        self.address = address
        self.codec = FrameCodec(RECEIVE_LIMIT)
        self.corr_ids = itertools.count(1)
        self.broken = False
        self._waiting: set[int] = set()  # sent, answer not read yet
        self._early: dict[int, ResponseBody | CoordError] = {}  # read, not asked for yet

    def call(self, body: RequestBody) -> ResponseBody:
        """Send one request and return its answer's body, raising the error it carries."""
        (answer,) = self.call_many([body])
        if isinstance(answer, CoordError):
            raise answer
        return answer

    def call_many(self, bodies: Sequence[RequestBody]) -> list[ResponseBody | CoordError]:
        """Send ``bodies`` together (in flight at once), then read their answers, which the
        broker may give in any order; each answer's body, or the error it carries, in the
        order of ``bodies``.

        Anything but error answers (a broken socket, a Goodbye, a frame that
        does not decode) leaves the connection unusable: ``broken`` is set,
        the error raised, and the caller closes it.
        """
        return self.receive(self.send(bodies))

    def send(self, bodies: Sequence[RequestBody]) -> list[int]:
        """Send ``bodies`` together; their correlation ids, for :meth:`receive`."""
        ids = [next(self.corr_ids) for _ in bodies]
        frames = b"".join(
            self.codec.encode(Request(corr_id, body))
            for corr_id, body in zip(ids, bodies, strict=True)
        )
        self.broken = True
        self.sock.sendall(frames)
        self.broken = False
        self._waiting.update(ids)
        return ids

    def receive(self, ids: Sequence[int]) -> list[ResponseBody | CoordError]:
        """The answers to the requests :meth:`send` gave ``ids``, in that order (each its
        body or the error it carries), reading frames until they have all come."""
        answers = {i: self._early.pop(i) for i in ids if i in self._early}
        self.broken = True
        while len(answers) < len(ids):
            corr_id, value = self._read_answer()
            if corr_id in ids:
                answers[corr_id] = value
            else:
                self._early[corr_id] = value
        self.broken = False
        return [answers[i] for i in ids]

    def drop(self, corr_id: int) -> None:
        """Throw away the answer to request ``corr_id``, reading it first if it has not come
        (any other that comes meanwhile is kept): it is then no longer in flight."""
        if self._early.pop(corr_id, None) is None and corr_id in self._waiting:
            self.receive([corr_id])

    def _read_answer(self) -> tuple[int, ResponseBody | CoordError]:
        """Read one answer: its correlation id and its body or the error it carries; raises
        if the connection is unusable."""
        answer = self.codec.decode(self._read_frame())
        if isinstance(answer, Goodbye):
            raise error_for(answer.error, f"the broker closed the connection: {answer.message}")
        if not isinstance(answer, Response) or answer.corr_id not in self._waiting:
            raise CorruptMessageError(
                f"expected the answer to one of requests {sorted(self._waiting)}, got {answer!r}"
            )
        self._waiting.discard(answer.corr_id)
        if answer.error:
            return answer.corr_id, error_for(answer.error, answer.message)
        if answer.body is None:
            raise CorruptMessageError(f"the answer to request {answer.corr_id} has no body")
        return answer.corr_id, answer.body

    def _read_exactly(self, size: int) -> bytearray:
        buf = bytearray(size)
        view = memoryview(buf)
        got = 0
        while got < size:
            n = self.sock.recv_into(view[got:])
            if n == 0:
                raise ConnectionClosedError(
                    f"the broker at {self.address[0]}:{self.address[1]} closed the connection"
                )
            got += n
        return buf

    def _read_frame(self) -> bytearray:
        size = int.from_bytes(self._read_exactly(HEADER_SIZE), "big")
        if size > RECEIVE_LIMIT:
            raise FrameTooLargeError(f"an answer of {size} bytes exceeds {RECEIVE_LIMIT} bytes")
        return self._read_exactly(size)

    def close(self) -> None:
        self.sock.close()


def _login(sock: _Socket, security: SparkSecurity) -> None:
    """The native SASL login over a blocking socket (SaslAuthenticationError if refused)."""
    user, password = security.user or "", security.password or ""
    sock.call(SaslHandshakeRequest(security.mechanism))
    try:
        if security.mechanism == "PLAIN":
            sock.call(SaslAuthenticateRequest(plain_message(user, password)))
            return
        scram = ScramClient(security.mechanism, user, password)
        first = sock.call(SaslAuthenticateRequest(scram.first()))
        assert isinstance(first, SaslAuthenticateResponse)
        last = sock.call(SaslAuthenticateRequest(scram.final(first.data)))
        assert isinstance(last, SaslAuthenticateResponse)
        scram.verify(last.data)
    except AuthenticationError as exc:
        raise SaslAuthenticationError(str(exc)) from None


def _fetch_request(tp: TopicPartition, offset: int, max_bytes: int, wait: int) -> FetchRequest:
    """The fetch of ``tp`` from ``offset``, sent now or ahead.

    ``max_bytes`` bounds the partition, which a first batch larger than it
    exceeds (the read goes on); the request's own bound is the whole answer,
    what this client reads (:data:`RECEIVE_LIMIT`), which a broker does not
    exceed: a batch larger than that is refused, not sent.
    """
    return FetchRequest(
        [FetchPartition(tp.topic, tp.partition, offset, max_bytes)],
        max_wait_ms=wait,
        max_bytes=RECEIVE_LIMIT,
    )


class _Ahead(NamedTuple):
    """A fetch sent ahead of its caller (see :meth:`BlockingClient.fetch`)."""

    sock: _Socket
    corr_id: int
    tp: TopicPartition
    offset: int
    max_bytes: int
    wait: int


class BlockingClient:
    """Metadata, offsets, fetch, produce and group commits, blocking; see the module docstring.

    ``bootstrap`` is ``"host:port,host:port"``; ``timeout`` bounds each
    request and the retries of retriable errors, in seconds.
    """

    def __init__(
        self,
        bootstrap: str | Sequence[str],
        *,
        timeout: float = 30.0,
        security: SparkSecurity | None = None,
    ) -> None:
        self.addresses = parse_bootstrap(bootstrap)
        self.timeout = timeout
        self.security = security or SparkSecurity()
        self._ssl: ssl.SSLContext | None = None
        if self.security.tls_ca:
            self._ssl = ssl.create_default_context(cafile=self.security.tls_ca)
        self._sockets: dict[Address, _Socket] = {}
        self._routing = Routing()  # what is known of brokers, topics and leaders
        self._answered: Address | None = None  # the broker that last answered Metadata
        self._ahead: _Ahead | None = None  # the fetch sent ahead (see fetch)
        self._frame_guess = _frame_guess(self.addresses)  # the brokers' (learnt from refusals)

    def __enter__(self) -> BlockingClient:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()

    def close(self) -> None:
        """Close every connection this client opened (it may be used again afterwards)."""
        self._ahead = None
        sockets, self._sockets = list(self._sockets.values()), {}
        for sock in sockets:
            sock.close()

    def forget_metadata(self) -> None:
        """Drop what the client knows of topics and brokers (not its connections): the next
        request that needs a leader asks the brokers again."""
        self._routing.forget_all()

    # -- plumbing --------------------------------------------------------------------------

    def _connect(self, address: Address) -> _Socket:
        sock = self._sockets.get(address)
        if sock is not None:
            return sock
        host, port = address
        try:
            raw = socket.create_connection(address, timeout=self.timeout)
        except OSError as exc:
            raise BrokerUnreachableError(
                f"cannot reach a trio_coord broker at {host}:{port} ({exc.strerror or exc}); "
                "is it running, and is the bootstrap option right?"
            ) from None
        raw.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        try:
            if self._ssl is not None:
                raw = self._ssl.wrap_socket(raw, server_hostname=host)
            sock = _Socket(raw, address)
            if self.security.user:
                _login(sock, self.security)
        except (OSError, ssl.SSLError) as exc:
            raw.close()
            raise BrokerUnreachableError(
                f"TLS with the broker at {host}:{port} failed ({exc}); check the tlsCa option"
            ) from None
        except CoordError:
            raw.close()
            raise
        self._sockets[address] = sock
        return sock

    def _call_once(self, address: Address, body: RequestBody) -> ResponseBody:
        (answer,) = self._call_many_once(address, [body])
        if isinstance(answer, CoordError):
            raise answer
        return answer

    def _call_many_once(
        self, address: Address, bodies: Sequence[RequestBody]
    ) -> list[ResponseBody | CoordError]:
        sock = self._connect(address)
        try:
            return sock.call_many(bodies)
        except (OSError, CoordError) as exc:
            if sock.broken:
                self._sockets.pop(address, None)
                sock.close()
            if isinstance(exc, OSError):
                raise ConnectionClosedError(
                    f"lost the connection to the broker at {address[0]}:{address[1]} ({exc})"
                ) from None
            raise

    def _call(
        self,
        body: RequestBody,
        expected: type[_R],
        *,
        tp: TopicPartition | None = None,
        group: str | None = None,
        deadline: float | None = None,
    ) -> _R:
        """Send ``body`` to the leader of partition ``tp``, the coordinator of ``group``, or
        else any bootstrap broker, retrying retriable errors until
        ``deadline`` (``time.monotonic()``; default: ``timeout`` from now).

        The broker is looked up again before every attempt, and what an error
        means for the next one is the routing policy's (``_routing.classify``):
        after NOT_LEADER_FOR_PARTITION or NOT_COORDINATOR the retry goes where
        fresh metadata says, not back to the broker that refused; after a
        broker could not be reached, every leader is asked for again.
        """
        if deadline is None:
            deadline = time.monotonic() + self.timeout
        backoff = RetryPolicy(initial=0.05, maximum=1.0)
        while True:
            try:
                if tp is not None:
                    answer = self._call_once(self._leader(tp), body)
                elif group is not None:
                    answer = self._call_once(self._coordinator(group), body)
                else:
                    answer = self._call_any(body)
            except CoordError as exc:
                action = classify(exc)
                if action is Action.FAIL or time.monotonic() + backoff.current > deadline:
                    raise
                log.debug("retrying %s after %s", type(body).__name__, exc)
                self._after(exc, action, tp)
                time.sleep(backoff.next_delay())
                continue
            if not isinstance(answer, expected):
                raise CorruptMessageError(
                    f"expected {expected.__name__}, the broker answered {type(answer).__name__}"
                )
            return answer

    def _after(self, error: CoordError, action: Action, tp: TopicPartition | None) -> None:
        """Forget what ``error`` says is stale, so that the next lookup asks Metadata again:
        a moved leader's topic, or every topic after a broker could not be reached (its
        leaders, and its address, may have moved). A coordinator is always asked afresh."""
        if action is Action.MOVED and tp is not None:
            self._routing.forget(tp.topic)
        elif action is Action.RECONNECT and isinstance(error, BrokerUnreachableError):
            self._routing.forget_all()

    def _in_parts(
        self,
        items: Sequence[_T],
        send: Callable[[list[_T]], None],
        size_of: Callable[[_T], int] | None = None,
    ) -> None:
        """``send`` ``items`` in order, a part at a time, each within the frame the brokers
        are taken to read: 10,000 partitions of a 120-character topic take 1.3 MB,
        more than a default broker reads, which refuses the frame by closing the
        connection. A refused part is cut smaller and sent again on a new one. An
        item's size is its encoding unless ``size_of`` says (what it adds to the answer)."""
        guess = self._frame_guess
        parts = Parts(items, guess.budget, guess.halve, size_of)
        for part in parts:
            try:
                send(part)
            except FrameTooLargeError:
                if not parts.refused():
                    raise

    def _call_any(self, body: RequestBody) -> ResponseBody:
        error: CoordError | None = None
        for address in self.addresses:
            try:
                answer = self._call_once(address, body)
            except CoordError as exc:
                if not exc.retriable:
                    raise
                error = exc
                continue
            self._answered = address
            return answer
        assert error is not None
        if isinstance(error, BrokerUnreachableError) and len(self.addresses) > 1:
            listed = ",".join(f"{h}:{p}" for h, p in self.addresses)
            raise BrokerUnreachableError(
                f"no broker of the bootstrap list {listed} can be reached ({error})"
            )
        raise error

    # -- metadata ---------------------------------------------------------------------------

    def metadata(self, topics: Iterable[str] | None = None, group: str = "") -> MetadataResponse:
        """Live brokers and the topics asked for (None: all); raises UnknownTopicError."""
        request = MetadataRequest(None if topics is None else sorted(set(topics)), group)
        response = self._call(request, MetadataResponse)
        listed = list(response.topics)
        while response.next:  # all topics, a page at a time
            request = MetadataRequest(None, group, response.next)
            response = self._call(request, MetadataResponse)
            listed.extend(response.topics)
        response = msgspec.structs.replace(response, topics=listed, next="")
        self._routing.learn(response, self._answered)
        return response

    def partition_counts(self, topics: Iterable[str] | None = None) -> dict[str, int]:
        """Partition count per topic (None: every topic), from fresh metadata."""
        return {t.name: t.partitions for t in self.metadata(topics).topics}

    def _leader(self, tp: TopicPartition) -> Address:
        """The address of ``tp``'s leader, as the routing policy finds it: what it does not
        know is asked of Metadata once, and if the fresh answer does not say either, its
        error is raised (retriable, for :meth:`_call`, but for a partition that does not
        exist)."""
        found = self._routing.leader_of(tp)
        if isinstance(found, CoordError):
            self.metadata([tp.topic])
            found = self._routing.leader_of(tp)
            if isinstance(found, CoordError):
                raise found
        return (found.host, found.port)

    def _coordinator(self, group: str) -> Address:
        """The group's coordinator, from fresh metadata (CoordinatorNotAvailable if none yet)."""
        found = coordinator_of(self.metadata([], group), group, self._answered)
        if isinstance(found, CoordError):
            raise found
        return (found.host, found.port)

    def _by_leader(
        self, tps: Iterable[TopicPartition]
    ) -> tuple[dict[Address, list[TopicPartition]], dict[TopicPartition, CoordError]]:
        """``tps`` by the address of their leader (asking Metadata once about the topics
        not known), and those whose leader is still not known, with the policy's error."""
        tps = set(tps)  # (looked through twice)
        grouped, unknown = self._routing.group_by_leader(tps)
        if unknown:
            self.metadata({tp.topic for tp in unknown})
            grouped, unknown = self._routing.group_by_leader(tps)
        return {(b.host, b.port): group for b, group in grouped.items()}, unknown

    # -- offsets ------------------------------------------------------------------------------

    def list_offsets(
        self, partitions: Iterable[TopicPartition], timestamp_ms: int
    ) -> dict[TopicPartition, ListedOffset]:
        """Per partition: the offset for ``timestamp_ms`` (EARLIEST, LATEST or a time), with
        the log's start and end (thousands of partitions are asked for in parts)."""
        result: dict[TopicPartition, ListedOffset] = {}

        def ask(tps: list[TopicPartition]) -> None:
            # Routed by the leader of the first, found again on each retry: a leader that
            # came back elsewhere (a broker restarted on another port) is followed.
            request = ListOffsetsRequest(tps, timestamp_ms)
            response = self._call(request, ListOffsetsResponse, tp=tps[0])
            result.update((o.tp, o) for o in response.offsets)

        grouped, unknown = self._by_leader(partitions)
        # A partition whose leader is not known yet is asked alone, with the retries.
        for tps in [*grouped.values(), *([tp] for tp in unknown)]:
            self._in_parts(sorted(tps), ask, listed_offset_bytes)
        return result

    def committed(self, group: str) -> dict[TopicPartition, int]:
        """The group's committed offsets (partitions without one are left out)."""
        request = OffsetFetchRequest(group, None)
        response = self._call(request, OffsetFetchResponse, group=group)
        offsets = list(response.offsets)
        while response.next is not None:  # a page at a time
            request = OffsetFetchRequest(group, None, response.next)
            response = self._call(request, OffsetFetchResponse, group=group)
            offsets.extend(response.offsets)
        return {o.tp: o.offset for o in offsets if o.offset != NO_OFFSET}

    def commit(self, group: str, offsets: dict[TopicPartition, int], metadata: str = "") -> None:
        """Commit ``offsets`` to ``group`` as a standalone committer (not a member).

        The broker refuses it while the group has live members
        (UnknownMemberError) and refuses to move an offset backwards
        (OffsetRegressionError). More offsets than one request holds
        (thousands of partitions) are committed in parts, in order; if one
        fails, the parts before it stay committed.
        """
        if not offsets:
            return

        def commit_part(part: list[PartitionOffset]) -> None:
            body = OffsetCommitRequest(group, "", -1, part)
            self._call(body, OffsetCommitResponse, group=group)

        positions = [
            PartitionOffset(tp.topic, tp.partition, o, metadata)
            for tp, o in sorted(offsets.items())
        ]
        self._in_parts(positions, commit_part)

    # -- records ------------------------------------------------------------------------------

    def fetch(
        self,
        tp: TopicPartition,
        offset: int,
        *,
        max_bytes: int,
        max_wait_ms: int = 0,
        ahead_until: int | None = None,
    ) -> FetchedPartition:
        """Batches of ``tp`` from ``offset`` (the first may begin before it); raises the
        partition's error (OffsetOutOfRangeError, UnknownTopicError, ...).

        With ``ahead_until``, the fetch of the records that follow these (if
        they start below ``ahead_until``) is sent as soon as this answer is
        read, on the same connection: the broker reads them while the caller
        decodes these, and the next call asking for them takes that answer
        instead of a round trip. The pipeline is one request deep and needs no
        thread. When the next call asks for something else, the early answer
        is read out and thrown away first (nothing is sent while the broker
        may still be sending it); one that carries an error is acted on and
        asked for again the usual way, with its retries. The early answer is
        waited for ``timeout`` at most, as the fetch itself would be.
        """
        part = self._take_ahead(tp, offset, max_bytes, max_wait_ms)
        if part is None:
            request = _fetch_request(tp, offset, max_bytes, max_wait_ms)
            response = self._call(request, FetchResponse, tp=tp)
            (part,) = response.partitions
            if part.error:
                raise error_for(part.error, part.message)
        if ahead_until is not None and part.batches:
            last = part.batches[-1]
            following = last.base_offset + last.count
            if following < ahead_until:
                self._send_ahead(tp, following, max_bytes, max_wait_ms)
        return part

    def _send_ahead(self, tp: TopicPartition, offset: int, max_bytes: int, wait: int) -> None:
        """Send the fetch of ``tp`` from ``offset`` to its leader, its answer to be read by
        :meth:`fetch` (nothing is sent if the leader's connection is not open)."""
        found = self._routing.leader_of(tp)  # (known: it just answered)
        if isinstance(found, CoordError):
            return
        sock = self._sockets.get((found.host, found.port))
        if sock is None:
            return
        request = _fetch_request(tp, offset, max_bytes, wait)
        try:
            (corr_id,) = sock.send([request])
        except OSError:
            self._discard(sock)
            return
        self._ahead = _Ahead(sock, corr_id, tp, offset, max_bytes, wait)

    def drop_ahead(self) -> None:
        """Let go of the fetch sent ahead, if any: its answer is read and thrown away, so
        that this client's connections are idle (nothing in flight) when it returns.

        A read that stops half-way (a Spark task abandoned between batches)
        calls it before its client goes back to the worker's idle pool: an
        answer left unread there would keep the broker's side of the
        connection busy, up to a fetch's worth of records unsent, for as long
        as the worker idles. A connection that fails meanwhile is closed.
        """
        ahead, self._ahead = self._ahead, None
        if ahead is not None:
            self._let_go(ahead)

    def _let_go(self, ahead: _Ahead) -> None:
        """Read the answer to the fetch ``ahead`` out and throw it away (closing its
        connection if that fails): nothing of it is then in flight."""
        if self._sockets.get(ahead.sock.address) is not ahead.sock:
            return  # (closed already)
        try:
            ahead.sock.drop(ahead.corr_id)
        except (OSError, CoordError) as exc:
            log.debug("closing the connection to %s:%d: %s", *ahead.sock.address, exc)
            self._discard(ahead.sock)

    def _take_ahead(
        self, tp: TopicPartition, offset: int, max_bytes: int, wait: int
    ) -> FetchedPartition | None:
        """The answer to the fetch sent ahead, if it is this one and it carries records or
        no error; None otherwise (an early answer not wanted is thrown away).

        An error it carries is acted on as :meth:`_call` would (a leader that
        moved is looked up afresh, not asked again) before the fetch is sent
        the usual way; so is a lost connection. An answer that did not come
        within ``timeout`` raises ConnectionClosedError, as the fetch sent the
        usual way would have after waiting as long.
        """
        ahead, self._ahead = self._ahead, None
        if ahead is None or self._sockets.get(ahead.sock.address) is not ahead.sock:
            return None
        if (ahead.tp, ahead.offset, ahead.max_bytes, ahead.wait) != (tp, offset, max_bytes, wait):
            # Read out and thrown away before anything else is sent: a large request sent
            # while the broker is still sending this answer could block both until the
            # timeout (each waiting for the other to read).
            self._let_go(ahead)
            return None
        try:
            (answer,) = ahead.sock.receive([ahead.corr_id])
        except TimeoutError as exc:
            # The broker had a whole timeout (and more) to answer: give up as _call does
            # when its attempt times out, rather than wait another one for the same fetch.
            self._discard(ahead.sock)
            host, port = ahead.sock.address
            raise ConnectionClosedError(
                f"lost the connection to the broker at {host}:{port} ({exc})"
            ) from None
        except (OSError, CoordError):  # (a broken connection: sent again, with the retries)
            self._discard(ahead.sock)
            return None
        if isinstance(answer, FetchResponse) and len(answer.partitions) == 1:
            (part,) = answer.partitions
            if not part.error:
                return part
            answer = error_for(part.error, part.message)
        if isinstance(answer, CoordError):
            self._after(answer, classify(answer), tp)
        return None

    def _discard(self, sock: _Socket) -> None:
        """Close ``sock`` if it is broken (an exchange on it failed half-way)."""
        if sock.broken:
            if self._sockets.get(sock.address) is sock:
                del self._sockets[sock.address]
            sock.close()

    def produce(
        self,
        tp: TopicPartition,
        payload: bytes,
        count: int,
        max_timestamp_ms: int,
        *,
        deadline: float | None = None,
    ) -> int:
        """Append one encoded batch to ``tp``; the offset of its first record. Retriable
        errors are retried until ``deadline`` (``time.monotonic()``; default: ``timeout``
        from now)."""
        request = ProduceRequest(tp.topic, tp.partition, payload, count, max_timestamp_ms)
        return self._call(request, ProduceResponse, tp=tp, deadline=deadline).base_offset

    def produce_many(self, batches: Sequence[ProduceRequest]) -> list[int]:
        """Append several encoded batches, at most one per partition, their requests in
        flight together (one write and one wait per leader, not one round trip per batch);
        the offset of each one's first record, in their order.

        A batch whose leader cannot be found yet, whose request fails with a
        retriable error, or whose answer is lost with its connection, is sent
        again alone by :meth:`produce` (with its retries) before this returns,
        all within one ``timeout`` from the call; any other
        error is raised. One batch per partition keeps each partition's
        records in the order they were given, whatever order the broker
        answers in; delivery is at least once, as for :meth:`produce`.
        """
        deadline = time.monotonic() + self.timeout
        seen = {(b.topic, b.partition) for b in batches}
        if len(seen) != len(batches):
            raise ValueError("produce_many takes at most one batch per partition")
        offsets: list[int | None] = [None] * len(batches)
        index_of = {TopicPartition(b.topic, b.partition): i for i, b in enumerate(batches)}
        by_leader, unknown = self._by_leader(index_of)
        for tp, error in unknown.items():
            # (a leader not live yet, say: produce() below retries it until the deadline)
            if classify(error) is Action.FAIL:
                raise error
            self._routing.forget(tp.topic)
        for address, tps in by_leader.items():
            indexes = [index_of[tp] for tp in tps]
            try:
                answers = self._call_many_once(address, [batches[i] for i in indexes])
            except CoordError as exc:
                action = classify(exc)
                if action is Action.FAIL:
                    raise
                log.debug("sending %d batches again one by one after %s", len(indexes), exc)
                for tp in tps:  # (all of them are sent again below)
                    self._after(exc, action, tp)
                continue
            for tp, index, answer in zip(tps, indexes, answers, strict=True):
                if isinstance(answer, ProduceResponse):
                    offsets[index] = answer.base_offset
                elif isinstance(answer, CoordError):
                    action = classify(answer)
                    if action is Action.FAIL:
                        raise answer
                    self._after(answer, action, tp)
                else:
                    raise CorruptMessageError(
                        f"expected ProduceResponse, the broker answered {type(answer).__name__}"
                    )
        for index, offset in enumerate(offsets):
            if offset is None:
                batch = batches[index]
                tp = TopicPartition(batch.topic, batch.partition)
                offsets[index] = self.produce(
                    tp, batch.records, batch.count, batch.max_timestamp_ms, deadline=deadline
                )
        return offsets  # type: ignore[return-value]  # every one was filled
