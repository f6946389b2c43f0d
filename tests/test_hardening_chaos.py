"""A broker under everything at once: the hardening acceptance check, automated.

A broker process on a fixed port (so that a restarted broker is where its
clients left it), with small segments so that partitions have closed ones,
and a low ``--max-connections``. A topic of three partitions; an in-process
producer sends keyed records steadily and notes where each acknowledged one
landed; a group of three consumer processes (``chaos.CONSUMER``) processes
them. A seeded schedule of about fifteen seconds:

* kills consumers with SIGKILL and starts others in their place;
* floods the broker with more connections than it admits, some of them
  sending hostile frames (nested a thousand deep, garbage, a torn frame);
* kills the broker with SIGKILL and restarts it on the same data dir, twice;
  before the second restart a bit is flipped in the middle of a closed
  segment that the group has already committed past, and the broker is
  restarted with ``--repair`` (what its refusal of that partition tells the
  operator to do: ``test_storage_damage.py`` checks the refusal itself).

Then the group runs until every acknowledged record is processed and its
lag is 0, and the test checks the invariants (``chaos.check_processing``:
no acknowledged record lost, in order within each ownership, never two
owners at once, at least once), plus: committed offsets, sampled all along,
never moved backwards; the refused connections were told why
(RESOURCES_EXHAUSTED) while the group kept being served; the repair said
which offsets it lost, all of them in the damaged segment; every
acknowledged record outside them is still at its offset, and a new record
lands above the old log end (no offset is ever reused).
"""

from __future__ import annotations

import itertools
import random
import socket
import time
from dataclasses import dataclass
from pathlib import Path

import pytest
import trio
from chaos import BrokerProcess, Fleet, check_processing

from trio_coord import (
    CoordError,
    TopicPartition,
    open_admin,
    open_consumer,
    open_producer,
)
from trio_coord.protocol.errors import ErrorCode
from trio_coord.protocol.framing import FrameCodec
from trio_coord.protocol.messages import Goodbye

PARTITIONS = 3
WORK = 0.002  # seconds of "processing" per record
MAX_CONNECTIONS = 60
SEGMENT_BYTES = 4096


def free_port() -> int:
    """A port nothing listens on now (the broker binds it at every start)."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


# -- the producer ---------------------------------------------------------------------------


@dataclass
class Sent:
    """What the producer knows: where each acknowledged record is, and every value sent."""

    acked: dict[tuple[int, int], str]
    values: set[str]
    failed: int = 0


async def produce_steadily(bootstrap: str, sent: Sent, until: trio.Event) -> None:
    """Keyed records in small batches until ``until``; a broker restart only delays them."""
    async with open_producer(bootstrap, linger=0.005, delivery_timeout=20.0) as producer:
        i = 0
        while not until.is_set():
            batch = []
            for _ in range(10):
                value = f"v{i}"
                sent.values.add(value)
                batch.append((value, await producer.enqueue("t", value, key=f"key-{i % 37}")))
                i += 1
            for value, delivery in batch:
                try:
                    meta = await delivery
                except CoordError:
                    sent.failed += 1  # not acknowledged: it may or may not be stored
                    continue
                where = (meta.partition, meta.offset)
                assert where not in sent.acked, f"offset {where} acknowledged twice"
                sent.acked[where] = value
            await trio.sleep(0.05)


# -- watching committed offsets -------------------------------------------------------------


async def sample_commits(bootstrap: str, samples: list[dict[int, int]], stop: trio.Event):
    """Committed offsets of the group every 0.2 s (through broker restarts)."""
    tps = [TopicPartition("t", p) for p in range(PARTITIONS)]
    async with open_admin(bootstrap) as admin:
        while not stop.is_set():
            try:
                with trio.move_on_after(2):
                    committed = await admin.committed_offsets("g", tps)
                    samples.append({tp.partition: o for tp, o in committed.items()})
            except CoordError:
                pass  # the broker is down or restarting
            await trio.sleep(0.2)


def regressions(samples: list[dict[int, int]]) -> list[str]:
    """Every time a committed offset was seen lower than before."""
    seen: dict[int, int] = {}
    found = []
    for n, sample in enumerate(samples):
        for p, offset in sample.items():
            if offset < seen.get(p, -1):
                found.append(f"sample {n}: t-{p} committed {offset} after {seen[p]}")
            seen[p] = max(seen.get(p, -1), offset)
    return found


# -- floods ---------------------------------------------------------------------------------

DEEP = b"\x91" * 1000 + b"\xc0"  # an array in an array ... a thousand deep
HOSTILE = [
    len(DEEP).to_bytes(4, "big") + DEEP,
    (15).to_bytes(4, "big") + bytes(range(240, 255)),  # garbage
    (1000).to_bytes(4, "big") + b"\x93\x01",  # a torn frame: the peer goes away
]


async def flood(address: tuple[str, int], count: int, hold: float) -> dict[str, int]:
    """Open ``count`` connections (some sending hostile frames), hold them, close them.

    Returns how the broker treated them: admitted (still open after ``hold``),
    refused with TOO_MANY_CONNECTIONS, or closed for another reason.
    """
    codec = FrameCodec()
    outcome = {"admitted": 0, "refused": 0, "closed": 0}
    streams: list[trio.SocketStream] = []
    try:
        for n in range(count):
            try:
                streams.append(await trio.open_tcp_stream(*address))
            except OSError:
                outcome["closed"] += 1
                continue
            if n % 10 == 0:
                await streams[-1].send_all(HOSTILE[(n // 10) % len(HOSTILE)])
        await trio.sleep(hold)
        for stream in streams:
            verdict = "admitted"
            with trio.move_on_after(0.05):
                data = b""
                try:
                    while chunk := await stream.receive_some():
                        data += chunk
                except trio.BrokenResourceError:
                    pass
                verdict = "closed"
                if len(data) >= 4:
                    frame = codec.decode(data[4 : 4 + int.from_bytes(data[:4], "big")])
                    if isinstance(frame, Goodbye) and (
                        frame.error == ErrorCode.RESOURCES_EXHAUSTED
                    ):
                        verdict = "refused"
            outcome[verdict] += 1
    finally:
        for stream in streams:
            await trio.aclose_forcefully(stream)
    return outcome


# -- damage ---------------------------------------------------------------------------------


def segments(data_dir: Path, partition: int) -> list[tuple[int, Path]]:
    """A partition's segment files, oldest first, with their base offsets."""
    directory = data_dir / "partitions" / "t" / str(partition)
    return sorted((int(f.stem), f) for f in directory.glob("*.log"))


def flip_a_committed_bit(data_dir: Path, committed: dict[int, int]) -> tuple[int, Path, int]:
    """Flip a bit mid-way through a closed segment the group has committed past.

    Returns (partition, segment file, first offset after it).
    """
    for p in range(PARTITIONS):
        files = segments(data_dir, p)
        for (_, path), (next_base, _) in itertools.pairwise(files):
            if next_base <= committed.get(p, 0):
                raw = bytearray(path.read_bytes())
                raw[len(raw) // 2] ^= 0x10
                path.write_bytes(bytes(raw))
                return p, path, next_base
    raise AssertionError(f"no closed segment committed past yet: {committed}")


# -- the test -------------------------------------------------------------------------------


@pytest.mark.slow
async def test_a_broker_under_kills_floods_and_damage_keeps_every_promise(tmp_path):
    rng = random.Random(11)
    data = tmp_path / "data"
    broker = BrokerProcess(
        data,
        "--min-session-timeout", "0.2",
        "--segment-bytes", str(SEGMENT_BYTES),
        "--max-connections", str(MAX_CONNECTIONS),
        "--max-connections-per-ip", str(MAX_CONNECTIONS),
        port=free_port(),
        log=tmp_path / "broker.log",
    )  # fmt: skip
    bootstrap = await broker.start()
    address = ("127.0.0.1", broker.port)
    sent = Sent({}, set())
    samples: list[dict[int, int]] = []
    broker_kills: list[float] = []
    floods: list[dict[str, int]] = []
    damaged: tuple[int, Path, int] | None = None
    try:
        async with open_admin(bootstrap) as admin:
            await admin.create_topic("t", PARTITIONS)
        async with trio.open_nursery() as nursery:
            fleet = Fleet(bootstrap, tmp_path, nursery, WORK)
            try:
                for slot in range(3):
                    await fleet.start(slot)
                produced_all, stop_sampling = trio.Event(), trio.Event()
                nursery.start_soon(produce_steadily, bootstrap, sent, produced_all)
                nursery.start_soon(sample_commits, bootstrap, samples, stop_sampling)
                with trio.fail_after(30):
                    for run in fleet.runs:
                        await run.ready.wait()

                async def kill_consumers(count: int) -> None:
                    slots = rng.sample(range(3), count)
                    for slot in slots:
                        fleet.slots[slot].signal(9)
                    await trio.sleep(rng.uniform(0.1, 0.5))
                    for slot in slots:
                        await fleet.start(slot)

                async def restart_broker(damage: bool) -> None:
                    nonlocal damaged
                    committed = samples[-1] if samples else {}
                    broker.kill()
                    broker_kills.append(time.monotonic())
                    await trio.sleep(rng.uniform(0.1, 0.5))
                    if damage:
                        damaged = flip_a_committed_bit(data, committed)
                        await broker.start("--repair")
                    else:
                        await broker.start()

                with trio.fail_after(60):
                    await trio.sleep(1.5)
                    await kill_consumers(1)
                    await trio.sleep(1.0)
                    floods.append(await flood(address, MAX_CONNECTIONS + 30, 1.5))
                    await restart_broker(damage=False)
                    await trio.sleep(2.0)
                    await kill_consumers(1)
                    await trio.sleep(1.5)
                    await restart_broker(damage=True)
                    await trio.sleep(2.0)
                    await kill_consumers(2)
                    await trio.sleep(1.0)
                    floods.append(await flood(address, MAX_CONNECTIONS + 30, 1.0))
                    await trio.sleep(1.0)
                    produced_all.set()

                # The group runs until every acknowledged record is processed, lag 0.
                async with open_admin(bootstrap) as admin:
                    with trio.move_on_after(40) as waited:
                        while True:
                            lag = await admin.group_lag("g")
                            if set(sent.acked) <= fleet.processed() and not any(r.lag for r in lag):
                                break
                            await trio.sleep(0.25)
                    if waited.cancelled_caught:
                        pytest.fail(
                            f"no convergence within 40 s: "
                            f"{len(set(sent.acked) - fleet.processed())} acknowledged records "
                            f"never processed; lag {[(r.partition, r.lag) for r in lag]}\n"
                            + "\n".join(run.tail() for run in fleet.live())
                        )
                stop_sampling.set()
                with trio.fail_after(30):
                    for run in fleet.live():
                        run.signal(15)
                    for run in fleet.runs:
                        await run.exited.wait()
            finally:
                await fleet.kill_all()

        # The invariants, from what the consumers printed.
        problems, stats = check_processing(
            fleet.runs, sent.acked, unknown=frozenset(sent.values), broker_kills=tuple(broker_kills)
        )
        print(f"{stats}; acked {len(sent.acked)}, failed {sent.failed}; floods {floods}")
        assert not problems, f"{len(problems)} problem(s):\n" + "\n".join(problems[:30])
        assert not regressions(samples), regressions(samples)
        assert len(samples) > 20, "committed offsets were sampled all along"

        # The floods: the broker refused what it could not admit, and said why.
        for outcome in floods:
            assert outcome["refused"] >= 20, floods

        # The damage: repaired, and said so; what it lost lies in the damaged segment.
        assert damaged is not None
        path = damaged[1]
        repaired = [
            line for line in (tmp_path / "broker.log").read_text().splitlines()
            if "repaired" in line and str(path) in line
        ]  # fmt: skip
        assert len(repaired) == 1, repaired
        await check_nothing_reused(bootstrap, sent, damaged)
    finally:
        broker.stop()


async def check_nothing_reused(bootstrap: str, sent: Sent, damaged: tuple[int, Path, int]):
    """After a repair: acknowledged records at their offsets, new ones above the old end."""
    partition, path, after = damaged
    first = int(path.stem)  # the damaged segment's base offset
    tps = [TopicPartition("t", p) for p in range(PARTITIONS)]
    async with open_admin(bootstrap) as admin:
        ends = {tp.partition: o.log_end for tp, o in (await admin.list_offsets(tps)).items()}
    stored: dict[tuple[int, int], str] = {}
    async with open_consumer(bootstrap, partitions=tps, offset_reset="earliest") as consumer:
        with trio.fail_after(30):
            while any((consumer.position(tp) or 0) < ends[tp.partition] for tp in tps):
                for record in await consumer.getmany():
                    stored[record.partition, record.offset] = record.value.decode()
    lost = {where: value for where, value in sent.acked.items() if stored.get(where) != value}
    # Only records of the damaged batch (in the damaged segment) are gone.
    assert all(p == partition and first <= o < after for p, o in lost), sorted(lost)[:20]
    old_end = ends[partition]
    async with open_producer(bootstrap) as producer:
        meta = await producer.send("t", "after the repair", partition=partition)
    assert meta.offset >= old_end, "an offset was reused after the repair"
