"""The columnar batch layout against the row layout: compressed sizes and the cost of reading.

``python bench/batch_layout.py [--records N] [--repeat R] [--json] [--quick]``
encodes the same records in both layouts of ``protocol/records.py`` and
reports, in one process:

* the size of a batch of N records (500 by default) in each layout, stored
  and with each codec, for three kinds of data: JSON-like values of about 80
  bytes keyed ``u1234`` (the user id repeated in the value), equal 100-byte
  values without keys, and random 100-byte values without keys; timestamps
  as a producer stamps them (a clock in milliseconds, several records per
  millisecond);
* the broker's check of a produced batch (``check_batch``) of 450 records of
  100 bytes, a consumer's ``records_from`` of it, and (with pyarrow) the
  Spark source's decode of 200,000 records in producer-sized batches of 112
  records into 8,192-row Arrow batches: columnar against rows, R
  repetitions alternating, medians with ranges. The figures that travel are
  the ratios columnar/rows of each repetition.
"""

from __future__ import annotations

import argparse
import json
import random
import statistics
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

if __package__ in (None, ""):
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench._common import load_average
from trio_coord.protocol.records import WireRecord, check_batch, encode_batch, records_from

CODECS = (None, "zlib", "lz4", "zstd")
BASE_MS = 1_764_115_200_000


def datasets(count: int) -> dict[str, list[WireRecord]]:
    """The three kinds of records (see the module docstring), ``count`` of each."""
    rng = random.Random(17)
    stamps = [BASE_MS + i // 7 for i in range(count)]
    json_like = []
    for stamp in stamps:
        user = f"u{rng.randrange(10_000):04d}"
        value = json.dumps(
            {
                "user": user,
                "event": rng.choice(["click", "view", "buy"]),
                "page": f"/p/{rng.randrange(1000)}",
                "n": rng.randrange(10**6),
            }
        ).encode()
        json_like.append(WireRecord(stamp, user.encode(), value))
    return {
        "json-like": json_like,
        "equal": [WireRecord(stamp, None, b"x" * 100) for stamp in stamps],
        "random": [WireRecord(stamp, None, rng.randbytes(100)) for stamp in stamps],
    }


def sizes(count: int) -> list[dict[str, Any]]:
    """Each data set's batch size per codec in both layouts."""
    out = []
    for name, records in datasets(count).items():
        for codec in CODECS:
            rows = len(encode_batch(records, codec, columnar=False))
            columnar = len(encode_batch(records, codec))
            out.append(
                {
                    "data": name,
                    "codec": codec or "none",
                    "rows": rows,
                    "columnar": columnar,
                    "ratio": columnar / rows,
                }
            )
    return out


def _seconds(run: Callable[[], object], number: int) -> float:
    start = time.perf_counter()
    for _ in range(number):
        run()
    return (time.perf_counter() - start) / number


def timings(repeat: int, quick: bool) -> dict[str, dict[str, Any]]:
    """Microseconds (or milliseconds) per operation in each layout, and their ratios."""
    rng = random.Random(1)
    total = 20_000 if quick else 200_000
    records = [
        WireRecord(BASE_MS + i // 7, b"u%04d" % rng.randrange(10_000), rng.randbytes(100))
        for i in range(total)
    ]
    big = {c: encode_batch(records[:450], columnar=c) for c in (True, False)}
    small = {
        c: [encode_batch(records[i : i + 112], columnar=c) for i in range(0, total, 112)]
        for c in (True, False)
    }
    cases: dict[str, Callable[[bool], float]] = {
        "check_batch, 450 records (us)": lambda c: 1e6 * _seconds(lambda: check_batch(big[c]), 200),
        "records_from, 450 records (us)": lambda c: (
            1e6 * _seconds(lambda: list(records_from("t", 0, [(0, big[c])])), 50)
        ),
    }
    try:
        from trio_coord.spark._arrow import Pending, decode_records
    except ImportError:  # (pyarrow is an extra)
        pass
    else:

        def spark(c: bool) -> float:
            def read() -> None:
                pending = Pending(include_headers=False)
                for payload in small[c]:
                    pending.add(decode_records(payload, include_headers=False))
                first = 0
                while len(pending):
                    first += pending.take("t", 0, first, 8192).num_rows

            return 1e3 * _seconds(read, 1)

        cases[f"Spark decode, {total:,} records in 112s (ms)"] = spark
    out: dict[str, dict[str, Any]] = {}
    for name, measure in cases.items():
        columnar: list[float] = []
        rows: list[float] = []
        for i in range(repeat):
            for c in (True, False) if i % 2 == 0 else (False, True):
                (columnar if c else rows).append(measure(c))
        ratios = [a / b for a, b in zip(columnar, rows, strict=True)]
        out[name] = {
            "columnar": statistics.median(columnar),
            "rows": statistics.median(rows),
            "ratio": statistics.median(ratios),
            "ratio_range": [min(ratios), max(ratios)],
        }
    return out


def main(argv: list[str] | None = None) -> None:
    """Parse the options, measure, print the tables (or JSON)."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--records", type=int, default=500, help="records per sized batch")
    parser.add_argument("--repeat", type=int, default=5)
    parser.add_argument("--json", action="store_true", help="print the result as JSON")
    parser.add_argument("--quick", action="store_true", help="fewer records and repetitions")
    options = parser.parse_args(argv)
    repeat = 2 if options.quick else options.repeat
    load = load_average()
    result: dict[str, Any] = {
        "params": {"records": options.records, "repeat": repeat, "quick": options.quick},
        "load_average": load,
        "sizes": sizes(options.records),
        "timings": timings(repeat, options.quick),
    }
    if options.json:
        print(json.dumps(result))
        return
    print(
        f"batch_layout: {options.records} records per sized batch, {repeat} repetition(s), "
        f"medians; load average {load:.2f}\n"
    )
    print(f"{'data':10} {'codec':6} {'rows':>8} {'columnar':>9} {'ratio':>6}")
    for row in result["sizes"]:
        print(
            f"{row['data']:10} {row['codec']:6} {row['rows']:8,} {row['columnar']:9,} "
            f"{row['ratio']:6.2f}"
        )
    print(f"\n{'read':44} {'columnar':>9} {'rows':>9} {'ratio':>6}  range")
    for name, figures in result["timings"].items():
        low, high = figures["ratio_range"]
        print(
            f"{name:44} {figures['columnar']:9.1f} {figures['rows']:9.1f} "
            f"{figures['ratio']:6.2f}  {low:.2f}-{high:.2f}"
        )


if __name__ == "__main__":
    main()
