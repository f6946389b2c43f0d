"""The columnar batch layout: what goes in comes out, and hostile bytes are refused cleanly.

Every reader of a batch (decode_batch for consumers and the Kafka gateway,
decode_untracked and check_batch for the broker, the Spark source) reads both
layouts and gives the same records; a columnar batch whose lengths, offsets
or count do not add up, or that inflates past the limit, is an
InvalidRecordError and nothing else (never an IndexError, a MemoryError or a
crash in Arrow).
"""

from __future__ import annotations

import struct
import zlib

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from trio_coord.protocol.errors import InvalidRecordError
from trio_coord.protocol.records import (
    COLUMNAR,
    MAX_BATCH_BYTES,
    WireRecord,
    check_batch,
    decode_batch,
    decode_untracked,
    encode_batch,
    records_from,
)

pa = pytest.importorskip("pyarrow")
from trio_coord.spark._arrow import (  # noqa: E402
    Pending,
    RawPiece,
    _binary,
    decode_lazily,
    decode_records,
)

HEADER = struct.Struct("<IBBHIIII")
CODECS = [None, "zlib", "lzma", "lz4", "zstd"]

blobs = st.none() | st.binary(max_size=40)
records_st = st.lists(
    st.builds(
        WireRecord,
        st.integers(-(2**63), 2**63 - 1),
        blobs,
        blobs,
        st.lists(st.tuples(st.text(max_size=5), st.binary(max_size=5)), max_size=3),
    ),
    max_size=40,
)


def spark_rows(payload: bytes) -> list[tuple]:
    """The records of a batch as the Spark source's pieces hold them (timestamps in ms: an
    Arrow batch's microseconds would overflow at the extremes this test draws)."""
    piece = decode_records(payload)
    headers = (
        [[] for _ in range(len(piece))] if piece.headers is None else piece.headers.to_pylist()
    )
    return list(
        zip(
            piece.stamps.to_pylist(),
            _binary([piece.keys]).to_pylist(),
            _binary([piece.values]).to_pylist(),
            [[(h["key"], h["value"]) for h in hs] for hs in headers],
            strict=True,
        )
    )


def spark_batch(*payloads: bytes) -> pa.RecordBatch:
    """The batches as the Spark source reads them (:func:`decode_lazily`, then one Arrow
    batch of them all, which is where the lengths of a :class:`RawPiece` are checked)."""
    pending = Pending(include_headers=False)
    for payload in payloads:
        pending.add(decode_lazily(payload, include_headers=False))
    return pending.take("t", 0, 0, len(pending))


READERS = (decode_batch, decode_untracked, check_batch, decode_records, spark_batch)
"""Every reader of a stored batch, each of which must refuse a malformed one alike."""


@pytest.mark.parametrize("include_headers", [True, False])
def test_the_spark_source_joins_stored_batches_of_any_presence_into_one_arrow_batch(
    include_headers,
):
    batches = [
        [WireRecord(1, b"a", b"1"), WireRecord(2, b"bb", b"")],  # every key and value present
        [WireRecord(3, None, b"3", [("h", b"x")])],  # no key
        [WireRecord(4, b"", None), WireRecord(5, b"e", b"5")],  # some values absent
        [WireRecord(6, b"f", b"6")],
    ]
    pending = Pending(include_headers)
    for records in batches:
        pending.add(decode_records(encode_batch(records), include_headers=include_headers))
    pending.add(decode_records(encode_batch(batches[0], columnar=False)).slice(1, 2))
    out = pending.take("t", 0, 10, 3)  # cuts the third batch in two
    rest = pending.take("t", 0, 13, 100)
    for batch in (out, rest):
        batch.validate(full=True)
    records = [r for b in batches for r in b] + [batches[0][1]]
    for name, get in (("key", lambda r: r.key), ("value", lambda r: r.value)):
        assert out.column(name).to_pylist() + rest.column(name).to_pylist() == [
            get(r) for r in records
        ]
    assert out.column("offset").to_pylist() + rest.column("offset").to_pylist() == list(
        range(10, 10 + len(records))
    )
    if include_headers:
        assert out.column("headers").to_pylist()[2] == [{"key": "h", "value": b"x"}]


@settings(max_examples=150, deadline=None)
@given(records_st, st.sampled_from(CODECS), st.booleans())
def test_every_reader_gives_back_what_was_encoded_in_either_layout(records, codec, columnar):
    payload = encode_batch(records, codec, columnar=columnar)
    assert bool(payload[0] & COLUMNAR) == columnar
    assert decode_batch(payload) == records
    untracked = decode_untracked(payload)
    assert [(r.timestamp_ms, r.key, r.value, list(r.headers)) for r in untracked] == [
        (r.timestamp_ms, r.key, r.value, r.headers) for r in records
    ]
    stamps = [r.timestamp_ms for r in records]
    expected = (len(records), min(stamps), max(stamps)) if records else (0, 0, 0)
    assert check_batch(payload) == expected
    assert spark_rows(payload) == [(r.timestamp_ms, r.key, r.value, r.headers) for r in records]
    if records and all(-(2**63) // 1000 <= r.timestamp_ms <= 2**63 // 1000 for r in records):
        table = spark_batch(payload, payload)  # (twice: a run of two when it is a RawPiece)
        assert table.column("key").to_pylist() == [r.key for r in records] * 2
        assert table.column("value").to_pylist() == [r.value for r in records] * 2


@pytest.mark.parametrize("columnar", [True, False])
def test_a_timestamp_spark_cannot_hold_is_an_invalid_record_naming_it(columnar):
    # The broker stores any timestamp from 0 to 2**63 - 1 ms; Spark's are microseconds, so
    # past 2**63 // 1000 ms (year 294,247) a record cannot be read into Spark. That was an
    # ArrowInvalid "overflow" out of the task, naming nothing; it is a clear refusal now.
    pending = Pending()
    far = 2**63 // 1000 + 1
    pending.add(decode_records(encode_batch([WireRecord(far, None, b"v")], columnar=columnar)))
    with pytest.raises(InvalidRecordError, match=f"t-0 at offset 7: timestamp {far} ms"):
        pending.take("t", 0, 7, 1)


def test_a_header_name_that_is_not_utf8_is_an_invalid_record_in_either_layout():
    for columnar in (True, False):
        payload = encode_batch([WireRecord(1, None, b"v", [("\x7f", b"")])], columnar=columnar)
        broken = payload.replace(b"\xa1\x7f", b"\xa1\x80")
        assert broken != payload
        for read in READERS:
            with pytest.raises(InvalidRecordError, match=r"decoded|headers"):
                read(broken)


def test_a_consumer_reads_batches_of_both_layouts_in_one_partition():
    old = encode_batch([WireRecord(1, b"a", b"1"), WireRecord(2, None, b"2")], columnar=False)
    new = encode_batch([WireRecord(3, b"c", None, [("h", b"x")])], "zstd")
    got = list(records_from("t", 0, [(10, old), (12, new)], start=11))
    assert [(r.offset, r.timestamp, r.key, r.value, r.headers) for r in got] == [
        (11, 0.002, None, b"2", ()),
        (12, 0.003, b"c", None, (("h", b"x"),)),
    ]


def test_an_empty_batch_decodes_to_no_records_in_either_layout():
    for columnar in (True, False):
        payload = encode_batch([], columnar=columnar)
        assert decode_batch(payload) == [] and check_batch(payload) == (0, 0, 0)


def test_a_timestamp_beyond_64_bits_cannot_be_encoded():
    with pytest.raises(ValueError, match="64-bit"):
        encode_batch([WireRecord(2**63, None, b"v")])


def body(records) -> bytearray:
    """A valid stored columnar batch's bytes after its codec byte."""
    return bytearray(encode_batch(records)[1:])


def refused(data: bytes | bytearray, match: str = "columnar|empty|more than") -> None:
    payload = bytes((COLUMNAR,)) + bytes(data)
    for read in READERS:
        with pytest.raises(InvalidRecordError, match=match):
            read(payload)


KEYED = [WireRecord(i, b"k%d" % i, b"value %d" % i) for i in range(5)]


def test_a_truncated_or_overlong_columnar_batch_is_refused():
    good = body(KEYED)
    for cut in range(len(good)):
        refused(good[:cut])
    refused(good + b"\0", "header .* says")


def test_a_count_that_lies_is_refused_before_anything_is_allocated():
    good = body(KEYED)
    for count in (4, 6, 2**32 - 1):
        bad = bytearray(good)
        struct.pack_into("<I", bad, 0, count)
        refused(bad, "says")
    huge = bytearray(good)  # byte counts near 2**32 claim far more than is there
    struct.pack_into("<II", huge, 8, 2**32 - 1, 2**32 - 8)
    refused(huge, "says")


def lengths_at(records) -> tuple[bytearray, int]:
    data = body(records)
    count = HEADER.unpack_from(data)[0]
    return data, HEADER.size + 8 * count  # the key lengths follow the timestamps


def transposed(numbers: list[int], fmt: str) -> bytes:
    """Numbers packed little-endian and transposed, as the layout stores them."""
    raw = struct.pack(f"<{len(numbers)}{fmt}", *numbers)
    width = struct.calcsize(fmt)
    return b"".join(raw[i::width] for i in range(width))


def with_key_lengths(records, lengths: list[int]) -> bytearray:
    data, at = lengths_at(records)
    packed = transposed(lengths, "i")
    data[at : at + len(packed)] = packed
    return data


def test_the_layout_stores_timestamps_and_lengths_transposed():
    records = [WireRecord(1_000 + i // 3, b"key", b"v" * (i + 1)) for i in range(6)]
    data, at = lengths_at(records)
    assert data[HEADER.size : at] == transposed([r.timestamp_ms for r in records], "q")
    assert data[HEADER.size : HEADER.size + 8] == b"\xe8\xe8\xe8\xe9\xe9\xe9\x03\x03"
    assert data[at : at + 24] == transposed([3] * 6, "i") == b"\3" * 6 + bytes(18)
    assert data[at + 24 : at + 48] == transposed(list(range(1, 7)), "i")
    assert decode_batch(encode_batch(records)) == records


def test_lengths_that_are_negative_overflow_or_leave_the_bytes_are_refused():
    for lengths, match in [
        ([2, 2, 2, 2, 3], "add up"),  # one byte more than the key bytes
        ([2, 2, 2, 2, 1], "add up"),  # one byte short
        ([4, -2, 2, 2, 4], "negative"),  # the sum is right, a length is not
        ([2**31 - 1, 2**31 - 1, 2, 2, 8], "add up"),  # 10 only once wrapped at 32 bits
        ([-(2**31), 2**31 - 1, 2, 2, 9], "negative"),
    ]:
        refused(with_key_lengths(KEYED, lengths), match)


def test_an_unknown_header_or_an_absent_key_with_bytes_is_refused():
    good = body(KEYED)
    for at, fmt, value in [(4, "<B", 3), (6, "<H", 1), (20, "<I", 7)]:
        bad = bytearray(good)
        struct.pack_into(fmt, bad, at, value)
        refused(bad, "unknown header")
    no_keys = body([WireRecord(1, None, b"v")])
    bad = bytearray(no_keys)
    struct.pack_into("<I", bad, 8, 8)  # "no key present" yet 8 key bytes
    refused(bad, "empty")
    mixed = [WireRecord(1, None, b"v"), WireRecord(2, b"key", b"w")]
    data, _ = lengths_at(mixed)
    assert HEADER.unpack_from(data)[1] == 2  # some keys present: a validity bitmap
    refused(with_key_lengths(mixed, [1, 2]), "absent key has bytes")  # the absent first key


def test_headers_that_name_records_out_of_order_or_twice_are_refused():
    import msgspec

    for section in (
        [[1, [["a", b""]]], [0, [["b", b""]]]],
        [[0, [["a", b""]]], [0, [["b", b""]]]],
        [[2, [["a", b""]]]],
        [[0, []]],
        [[-1, [["a", b""]]]],
    ):
        records = [WireRecord(1, None, b"v"), WireRecord(2, None, b"w")]
        data = body(records)
        packed = msgspec.msgpack.encode(section)
        struct.pack_into("<I", data, 16, len(packed))
        refused(data + packed, "headers")
    data = body([WireRecord(1, None, b"v")])
    struct.pack_into("<I", data, 16, 2)
    refused(data + b"\xc1\xc1", "headers")  # not msgpack


def test_a_columnar_decompression_bomb_is_refused():
    inflated = body([WireRecord(0, None, bytes(MAX_BATCH_BYTES + 2**20))])
    bomb = bytes((COLUMNAR | 1,)) + zlib.compress(bytes(inflated), 9)
    assert len(bomb) < 128 * 1024
    for read in READERS:
        with pytest.raises(InvalidRecordError, match="more than"):
            read(bomb)


@settings(max_examples=300, deadline=None)
@given(st.binary(max_size=300), st.sampled_from([0, 1, 3, 4]))
def test_random_columnar_bytes_only_ever_give_invalid_record(data, codec):
    if codec:  # compressed well-formed garbage exercises the sections, not the codec
        payload = encode_batch([], ["zlib", "lz4", "zstd"][[1, 3, 4].index(codec)])
        payload = bytes((payload[0],)) + data
    else:
        payload = bytes((COLUMNAR,)) + data
    for read in READERS:
        try:
            read(payload)
        except InvalidRecordError:
            pass


@settings(max_examples=200, deadline=None)
@given(records_st.filter(bool), st.data())
def test_a_flipped_byte_in_a_columnar_batch_is_read_or_refused_never_a_crash(records, data):
    good = body(records)
    at = data.draw(st.integers(0, len(good) - 1))
    good[at] ^= data.draw(st.integers(1, 255))
    payload = bytes((COLUMNAR,)) + bytes(good)
    for read in READERS:
        try:
            read(payload)
        except InvalidRecordError:
            pass


def test_the_spark_source_checks_each_stored_batch_s_lengths_even_when_it_checks_many_at_once():
    # The source checks the lengths of all the stored batches of an Arrow batch together:
    # one batch's lengths one byte too long and the next one's one byte short add up over
    # the two, and must still be refused (they would shift every record of the second).
    first = with_key_lengths(KEYED, [2, 2, 2, 2, 3])
    second = with_key_lengths(KEYED, [2, 2, 2, 2, 1])
    good = bytes((COLUMNAR,)) + bytes(body(KEYED))
    for pair in [(first, second), (second, first)]:
        payloads = [bytes((COLUMNAR,)) + bytes(b) for b in pair]
        assert all(isinstance(decode_lazily(p), RawPiece) for p in payloads)
        with pytest.raises(InvalidRecordError, match="add up"):
            spark_batch(good, *payloads, good)
    # Lengths that add up to the right bytes only once the running sum wraps at 32 bits.
    wraps = with_key_lengths(KEYED, [2**31 - 1, 2**31 - 1, 2, 2, 8])
    with pytest.raises(InvalidRecordError, match="add up"):
        spark_batch(good, bytes((COLUMNAR,)) + bytes(wraps))


def test_the_spark_source_reads_runs_of_batches_with_and_without_keys_into_one_batch():
    keyless = [WireRecord(i, None, b"v%d" % i) for i in range(3)]
    valueless = [WireRecord(i, b"k%d" % i, None) for i in range(2)]
    batches = [KEYED, keyless, KEYED, valueless, keyless]
    payloads = [encode_batch(b) for b in batches]
    assert all(isinstance(decode_lazily(p), RawPiece) for p in payloads)
    table = spark_batch(*payloads)
    table.validate(full=True)
    records = [r for b in batches for r in b]
    assert table.column("key").to_pylist() == [r.key for r in records]
    assert table.column("value").to_pylist() == [r.value for r in records]
    assert table.column("timestamp").to_pylist() == [
        pa.scalar(r.timestamp_ms * 1000, pa.timestamp("us", tz="UTC")).as_py() for r in records
    ]
    # Cut anywhere, the same records come out.
    for cut in range(1, len(records)):
        pending = Pending(include_headers=False)
        for payload in payloads:
            pending.add(decode_lazily(payload, include_headers=False))
        head, tail = pending.take("t", 0, 0, cut), pending.take("t", 0, cut, len(records))
        assert head.num_rows == cut
        assert head.column("value").to_pylist() + tail.column("value").to_pylist() == [
            r.value for r in records
        ]


def test_the_spark_source_refuses_a_stored_batch_of_no_records_that_has_bytes():
    # A batch of 0 records holds no lengths, so its key and value bytes must be 0 too; one
    # that has some is refused by every reader, the Spark source too (though it reads none
    # of its records).
    data = body([])
    struct.pack_into("<BBxxI", data, 4, 0, 0, 8)  # keys and values "all present", 8 key bytes
    bad = bytes((COLUMNAR,)) + bytes(data + b"12345678")
    good = bytes((COLUMNAR,)) + bytes(body(KEYED))
    for read in (decode_batch, decode_untracked, check_batch, decode_records):
        with pytest.raises(InvalidRecordError, match="add up"):
            read(bad)
    with pytest.raises(InvalidRecordError, match="add up"):
        spark_batch(good, bad, good)


present = st.binary(max_size=12)
batch_records = st.one_of(  # (each column all present or all absent: what is checked in bulk)
    *(
        st.lists(
            st.builds(WireRecord, st.integers(-(2**40), 2**40), keys, values),
            max_size=6,
        )
        for keys in (present, st.none())
        for values in (present, st.none())
    ),
    records_st.map(lambda rs: [WireRecord(r.timestamp_ms // 2**24, r.key, r.value) for r in rs]),
)


@st.composite
def stored_batches(draw) -> list[bytes]:
    """A few stored columnar batches, some with their key or value lengths changed: at
    random, or by moving bytes from one batch's length to another's (the sums over all the
    batches then still add up)."""
    batches = [body(records) for records in draw(st.lists(batch_records, min_size=1, max_size=5))]
    columns = []  # (batch, position of its lengths, count) of each column with lengths
    for index, data in enumerate(batches):
        count, keys, values = HEADER.unpack_from(data)[:3]
        at = HEADER.size + 8 * count
        for presence in (keys, values):
            if presence != 1:  # (1: none present, no lengths)
                columns.append((index, at, count))
                at += 4 * count + (-4 * count % 8)
                if presence == 2:  # (some present: a validity bitmap)
                    at += (count + 7) // 8 + (-((count + 7) // 8) % 8)
    for _ in range(draw(st.integers(0, 2)) if columns else 0):
        index, at, count = draw(st.sampled_from(columns))
        if not count:
            continue
        row = draw(st.integers(0, count - 1))
        lengths = lengths_in(batches[index], at, count)
        if draw(st.booleans()):
            lengths[row] = draw(st.integers(-(2**31), 2**31 - 1))
        else:
            delta = draw(st.integers(-3, 3))
            lengths[row] += delta
            other, other_at, other_count = draw(st.sampled_from(columns))
            if other_count:
                other_lengths = lengths_in(batches[other], other_at, other_count)
                other_lengths[0] -= delta
                put(batches[other], other_at, other_lengths)
        put(batches[index], at, lengths)
    return [bytes((COLUMNAR,)) + bytes(data) for data in batches]


def lengths_in(data: bytearray, at: int, count: int) -> list[int]:
    """The ``count`` transposed int32 lengths at ``at``."""
    raw = bytes(data[at : at + 4 * count])
    packed = bytearray(4 * count)
    for plane in range(4):
        packed[plane::4] = raw[plane * count : (plane + 1) * count]
    return list(struct.unpack(f"<{count}i", packed))


def put(data: bytearray, at: int, lengths: list[int]) -> None:
    """Store ``lengths`` transposed at ``at`` (each wrapped to 32 bits, as a batch would be
    written with them)."""
    packed = transposed([(n + 2**31) % 2**32 - 2**31 for n in lengths], "i")
    data[at : at + len(packed)] = packed


@settings(max_examples=300, deadline=None)
@given(stored_batches(), st.data())
def test_the_spark_source_reads_or_refuses_stored_batches_as_each_batch_alone_does(payloads, data):
    # The reference: each batch read and checked alone (decode_untracked, no Arrow).
    try:
        expected = [r for payload in payloads for r in decode_untracked(payload)]
    except InvalidRecordError:
        expected = None
    pending = Pending(include_headers=data.draw(st.booleans()))
    for payload in payloads:
        try:
            pending.add(decode_lazily(payload, include_headers=pending.include_headers))
        except InvalidRecordError:
            assert expected is None
            return
    rows = len(pending)
    if not rows:  # (an Arrow batch is never taken of no records)
        assert expected == []
        return
    drawn = data.draw(st.lists(st.integers(1, 40), max_size=3))  # (where Arrow batches end)
    cuts = sorted({cut for cut in drawn if cut < rows})
    tables = []
    try:
        for low, high in zip([0, *cuts], [*cuts, rows], strict=True):
            tables.append(pending.take("t", 0, low, high - low))
    except InvalidRecordError:
        assert expected is None
        return
    assert expected is not None, "a batch that reading it alone refuses was read"
    assert len(pending) == 0
    got = pa.Table.from_batches(tables)
    got.validate(full=True)
    assert got.column("key").to_pylist() == [r.key for r in expected]
    assert got.column("value").to_pylist() == [r.value for r in expected]
    assert got.column("offset").to_pylist() == list(range(len(expected)))
    assert got.column("timestamp").to_pylist() == [
        pa.scalar(r.timestamp_ms * 1000, pa.timestamp("us", tz="UTC")).as_py() for r in expected
    ]
    if pending.include_headers:
        assert got.column("headers").to_pylist() == [
            [{"key": k, "value": v} for k, v in r.headers] for r in expected
        ]
