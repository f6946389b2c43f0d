"""The data-plane commands of ``trio-coord``, run as a user runs them.

One broker process serves the whole module (``trio-coord broker --port 0
--json``); each test uses its own topics and groups. ``produce`` (stdin
lines, ``--key-separator``, ``--json`` offsets) and ``consume --events json
--max-records`` run as subprocesses, as a user runs them. The admin commands
(``groups describe --json`` with committed offset, log end, lag and owner per
partition; ``groups reset-offsets``, a dry run unless ``--execute``, every
target clamped into the log; ``groups delete-offsets``; ``topics describe
--json``) mostly run in this process through ``trio_coord.cli.main``: the
same parsing, calls, printing and exit status, without a Python start-up per
call (a second or more on a loaded machine). Where a test needs what the CLI
cannot do (records with chosen timestamps, a live member, reading committed
offsets) it uses the library. User mistakes get one ``error:`` line and
status 1.
"""

from __future__ import annotations

import base64
import contextlib
import io
import json
import os
import subprocess
import sys
import uuid
from collections import defaultdict
from concurrent.futures import ThreadPoolExecutor

import pytest
import trio
from broker_process import running_broker

from trio_coord import LogConfig, open_admin, open_consumer, open_producer
from trio_coord.cli import main
from trio_coord.client import partition_for_key

CLI = [sys.executable, "-m", "trio_coord"]
ENV = {**os.environ, "PYTHONUNBUFFERED": "1"}
T0 = 1_700_000_000  # 2023-11-14T22:13:20+00:00, the timestamp of the first timed record


def run(*args: str, stdin: str | None = None, timeout: float = 30.0):
    return subprocess.run(
        [*CLI, *args],
        input=stdin,
        capture_output=True,
        text=True,
        timeout=timeout,
        env=ENV,
        check=False,
    )


def ok(*args: str, stdin: str | None = None) -> str:
    result = run(*args, stdin=stdin)
    assert result.returncode == 0, f"{args} failed: {result.stderr}"
    return result.stdout


def json_lines(text: str) -> list[dict]:
    return [json.loads(line) for line in text.splitlines() if line.strip()]


def error_line(result: subprocess.CompletedProcess[str]) -> str:
    """The one ``error:`` line a user mistake prints (status 1, nothing else on stderr)."""
    assert result.returncode == 1, (result.returncode, result.stdout, result.stderr)
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: "), result.stderr
    return lines[0]


def cli(capsys, *args: str) -> tuple[int, str, str]:
    """Run ``trio-coord ARGS`` in this process (fast); its status, stdout and stderr."""
    capsys.readouterr()
    status = main(list(args))
    out, err = capsys.readouterr()
    return status, out, err


def cli_ok(capsys, *args: str) -> str:
    status, out, err = cli(capsys, *args)
    assert status == 0, f"{args} failed: {err}"
    return out


def cli_error(capsys, *args: str) -> str:
    """The one ``error:`` line of a command that must fail with status 1."""
    status, out, err = cli(capsys, *args)
    return error_line(subprocess.CompletedProcess(args, status, out, err))


@pytest.fixture(scope="module")
def bootstrap(tmp_path_factory):
    """One broker process for the module; yields its address."""
    with running_broker(tmp_path_factory.mktemp("cli-data") / "data") as address:
        yield address


# -- the library, in-process, for what the CLI cannot do -------------------------------------


def committed(bootstrap: str, group: str) -> dict[tuple[str, int], int]:
    async def ask():
        with trio.fail_after(10):
            async with open_admin(bootstrap) as admin:
                return await admin.committed_offsets(group)

    return {tuple(tp): offset for tp, offset in trio.run(ask).items()}


def produce_timed(bootstrap: str, topic: str, count: int, partitions: int) -> None:
    """Records ``i`` with timestamp ``T0 + i`` seconds, to partition ``i % partitions``."""

    async def send():
        with trio.fail_after(10):
            async with open_producer(bootstrap) as producer:
                for i in range(count):
                    await producer.enqueue(
                        topic, str(i), partition=i % partitions, timestamp=T0 + i
                    )

    trio.run(send)


def produce_values(bootstrap: str, topic: str, partition: int, values: list[str]) -> None:
    async def send():
        with trio.fail_after(10):
            async with open_producer(bootstrap) as producer:
                for value in values:
                    await producer.enqueue(topic, value, partition=partition)

    trio.run(send)


def reset(bootstrap: str, group: str, offsets: dict[tuple[str, int], int]) -> None:
    async def go():
        with trio.fail_after(10):
            async with open_admin(bootstrap) as admin:
                await admin.reset_offsets(group, offsets)

    trio.run(go)


# -- produce and consume (subprocesses: they read stdin and run until done) ------------------


def test_produce_sends_stdin_lines_keyed_and_prints_each_offset(bootstrap, capsys):
    cli_ok(capsys, "topics", "create", "keyed", "--partitions", "3", "-b", bootstrap)
    lines = [f"user-{i % 5}:event {i}" for i in range(20)] + ["user-1:a:b", ":no key"]
    out = ok(
        "produce", "keyed", "--key-separator", ":", "--json", "-b", bootstrap,
        stdin="\n".join(lines) + "\n",
    )  # fmt: skip
    metas = json_lines(out)
    assert len(metas) == len(lines)
    next_offset: dict[int, int] = defaultdict(int)
    for line, meta in zip(lines, metas, strict=True):
        key = line.partition(":")[0]
        assert meta == {
            "topic": "keyed",
            "partition": partition_for_key(key.encode(), 3),
            "offset": next_offset[meta["partition"]],  # dense, in line order
        }
        next_offset[meta["partition"]] += 1

    # Without --json it says how many it sent; --partition sends every line there.
    result = run("produce", "keyed", "--partition", "2", "-b", bootstrap, stdin="plain\nx:y\n")
    assert result.returncode == 0, result.stderr
    assert (result.stdout, result.stderr.strip()) == ("", "produced 2 record(s) to keyed")

    total = len(lines) + 2
    out = ok(
        "consume", "keyed", "--group", "reader", "--events", "json", "--offset-reset",
        "earliest", "--max-records", str(total), "-b", bootstrap,
    )  # fmt: skip
    records = {(e["partition"], e["offset"]): e for e in json_lines(out) if e["event"] == "record"}
    assert len(records) == total
    for line, meta in zip(lines, metas, strict=True):
        key, _, value = line.partition(":")
        record = records[meta["partition"], meta["offset"]]
        assert (record["key"], record["value"]) == (key, value)  # split at the first separator
    plain = [records[2, next_offset[2]], records[2, next_offset[2] + 1]]
    assert [(r["key"], r["value"]) for r in plain] == [(None, "plain"), (None, "x:y")]


def test_consume_prints_json_records_and_leaves_after_max_records(bootstrap, capsys):
    cli_ok(capsys, "topics", "create", "events", "--partitions", "2", "-b", bootstrap)
    produce_values(bootstrap, "events", 0, [f"zero-{i}" for i in range(6)])
    produce_values(bootstrap, "events", 1, [f"one-{i}" for i in range(4)])

    def consume_five() -> list[dict]:
        out = ok(
            "consume", "events", "--group", "half", "--events", "json", "--offset-reset",
            "earliest", "--max-records", "5", "-b", bootstrap,
        )  # fmt: skip
        return json_lines(out)

    events = consume_five()
    assert [e["event"] for e in events[:2]] == ["joined", "assigned"]
    assert events[1]["partitions"] == [["events", 0], ["events", 1]]
    assert events[-1]["event"] == "left"
    records = [e for e in events if e["event"] == "record"]
    assert len(records) == 5
    taken: dict[int, list[int]] = defaultdict(list)
    for record in records:
        assert set(record) == {
            "event", "topic", "partition", "offset", "timestamp", "key", "value"
        }  # fmt: skip
        assert record["topic"] == "events" and record["key"] is None
        assert isinstance(record["timestamp"], float)
        prefix = ["zero", "one"][record["partition"]]
        assert record["value"] == f"{prefix}-{record['offset']}"
        taken[record["partition"]].append(record["offset"])
    for offsets in taken.values():
        assert offsets == list(range(len(offsets)))  # in order, from the start

    # It left cleanly, so what it printed is committed: the lag is what it did not read.
    described = json.loads(cli_ok(capsys, "groups", "describe", "half", "--json", "-b", bootstrap))
    assert (described["state"], described["members"]) == ("EMPTY", [])
    log_end = {0: 6, 1: 4}
    rows = {row["partition"]: row for row in described["partitions"]}
    assert sorted(rows) == [0, 1]
    for p, row in rows.items():
        read = len(taken[p])
        assert row["topic"] == "events" and row["owner"] is None
        assert (row["log_start"], row["log_end"]) == (0, log_end[p])
        # A partition it read nothing of may have committed its start, or nothing.
        assert row["committed"] == read or (read == 0 and row["committed"] is None)
        # Nothing committed: no position to count the lag from (null, '-' in text).
        assert row["lag"] == (None if row["committed"] is None else log_end[p] - read)
    assert (
        sum(row["lag"] or 0 for row in rows.values())
        + sum(log_end[p] for p, row in rows.items() if row["committed"] is None)
        == 5
    )
    assert "total lag: 5" in cli_ok(capsys, "groups", "describe", "half", "-b", bootstrap)

    # The next consumer of the group starts where the first one stopped.
    again = [e for e in consume_five() if e["event"] == "record"]
    assert sorted((r["partition"], r["offset"]) for r in records + again) == sorted(
        (p, o) for p, end in log_end.items() for o in range(end)
    )
    described = json.loads(cli_ok(capsys, "groups", "describe", "half", "--json", "-b", bootstrap))
    assert [(r["committed"], r["lag"]) for r in described["partitions"]] == [(6, 0), (4, 0)]


def test_consume_max_records_zero_consumes_nothing(bootstrap, capsys):
    """``--max-records 0`` (or less) must not take a record from the group.

    Fails today: ``cmd_consume`` checks ``printed >= max_records`` only after
    printing a record, so 0 and negative values print one record, and the
    consumer then commits it on leaving. Either refusing the value (status
    2) or consuming nothing is fine.
    """
    cli_ok(capsys, "topics", "create", "zero", "--partitions", "1", "-b", bootstrap)
    produce_values(bootstrap, "zero", 0, ["a", "b"])
    result = run(
        "consume", "zero", "--group", "none", "--events", "json", "--offset-reset", "earliest",
        "--max-records", "0", "-b", bootstrap,
    )  # fmt: skip
    assert result.returncode in (0, 2), result.stderr
    assert [e for e in json_lines(result.stdout) if e["event"] == "record"] == []
    assert committed(bootstrap, "none").get(("zero", 0), 0) == 0


# -- the admin commands (in this process: the same code path, without a start-up each) -------


def test_topics_describe_shows_each_partitions_log_offsets_and_the_configs(bootstrap, capsys):
    cli_ok(capsys, "topics", "create", "described", "--partitions", "3", "-b", bootstrap)
    produce_values(bootstrap, "described", 1, ["a", "b", "c"])
    produce_values(bootstrap, "described", 2, ["d"])
    out = cli_ok(capsys, "topics", "describe", "described", "--json", "-b", bootstrap)
    (described,) = json.loads(out)
    # The topic's id, as Kafka's tools print it (URL-safe base64) and as a UUID.
    topic_id = described.pop("topic_id")
    uuid_bytes = uuid.UUID(described.pop("topic_uuid")).bytes
    assert base64.urlsafe_b64decode(topic_id + "==") == uuid_bytes
    configs = described.pop("configs")
    assert described == {
        "topic": "described",
        "partitions": 3,
        "offsets": [  # (one broker: it holds every partition, no leader is named)
            {"partition": 0, "log_start": 0, "log_end": 0, "leader": None},
            {"partition": 1, "log_start": 0, "log_end": 3, "leader": None},
            {"partition": 2, "log_start": 0, "log_end": 1, "leader": None},
        ],
    }
    # The settings its log follows (the broker's: this one runs with the defaults).
    assert configs["retention.ms"] == str(7 * 24 * 3600 * 1000)
    assert configs["segment.bytes"] == str(LogConfig().segment_bytes)
    assert configs["cleanup.policy"] == "delete"
    text = cli_ok(capsys, "topics", "describe", "described", "-b", bootstrap)
    offsets, ids, config_table = text.split("\n\n")
    lines = offsets.splitlines()
    assert lines[0].split() == ["TOPIC", "PARTITION", "LOG-START", "LOG-END", "RECORDS"]
    assert [line.split() for line in lines[1:]] == [
        ["described", "0", "0", "0", "0"],
        ["described", "1", "0", "3", "3"],
        ["described", "2", "0", "1", "1"],
    ]
    assert [line.split() for line in ids.splitlines()] == [
        ["TOPIC", "TOPIC-ID", "PARTITIONS"],
        ["described", topic_id, "3"],
    ]
    rows = [line.split() for line in config_table.splitlines()]
    assert rows[0] == ["TOPIC", "CONFIG", "VALUE"]
    assert rows[1] == ["described", "partitions", "3"]
    assert ["described", "retention.ms", configs["retention.ms"]] in rows


def test_reset_offsets_is_a_dry_run_unless_executed(bootstrap, capsys):
    cli_ok(capsys, "topics", "create", "dry", "--partitions", "2", "-b", bootstrap)
    produce_timed(bootstrap, "dry", 20, 2)  # ten records per partition

    def reset_offsets(*args: str) -> str:
        return cli_ok(capsys, "groups", "reset-offsets", "dg", "--topic", "dry", *args,
                      "-b", bootstrap)  # fmt: skip

    # Default: the plan, and nothing changes (the group is not even created).
    assert json.loads(reset_offsets("--to-offset", "4", "--json")) == {
        "group": "dg",
        "executed": False,
        "partitions": [
            {"topic": "dry", "partition": 0, "current": None, "new": 4},
            {"topic": "dry", "partition": 1, "current": None, "new": 4},
        ],
    }
    assert committed(bootstrap, "dg") == {}
    assert "does not exist" in cli_error(capsys, "groups", "describe", "dg", "-b", bootstrap)

    executed = json.loads(reset_offsets("--to-offset", "4", "--execute", "--json"))
    assert executed["executed"] is True
    assert [p["new"] for p in executed["partitions"]] == [4, 4]
    assert committed(bootstrap, "dg") == {("dry", 0): 4, ("dry", 1): 4}

    # The table for people, with the verdict; --dry-run says the same as the default.
    lines = reset_offsets("--to-earliest").strip().splitlines()
    assert [line.split() for line in lines[:3]] == [
        ["TOPIC", "PARTITION", "CURRENT", "NEW"],
        ["dry", "0", "4", "0"],
        ["dry", "1", "4", "0"],
    ]
    assert lines[-1] == "dry run: nothing changed (add --execute to apply)"
    plan = json.loads(reset_offsets("--to-latest", "--dry-run", "--json"))
    assert plan["executed"] is False
    assert [(p["current"], p["new"]) for p in plan["partitions"]] == [(4, 10), (4, 10)]
    assert committed(bootstrap, "dg") == {("dry", 0): 4, ("dry", 1): 4}

    # And as a user runs it: a real process, status 0, the same plan.
    out = ok("groups", "reset-offsets", "dg", "--topic", "dry", "--shift-by", "-1", "-b", bootstrap)
    assert out.strip().splitlines()[-1] == "dry run: nothing changed (add --execute to apply)"
    assert committed(bootstrap, "dg") == {("dry", 0): 4, ("dry", 1): 4}


def test_reset_offsets_execute_moves_every_target_clamped_into_the_log(bootstrap, capsys):
    cli_ok(capsys, "topics", "create", "moves", "--partitions", "2", "-b", bootstrap)
    produce_timed(bootstrap, "moves", 20, 2)  # p0: timestamps T0+0,+2,..; p1: T0+1,+3,..
    reset(bootstrap, "mg", {("moves", 0): 4, ("moves", 1): 4})

    def execute(*target: str) -> dict[tuple[str, int], int]:
        out = cli_ok(capsys, "groups", "reset-offsets", "mg", "--topic", "moves", *target,
                     "--execute", "-b", bootstrap)  # fmt: skip
        assert out.strip().endswith("offsets of group mg reset; running members restart from them")
        return committed(bootstrap, "mg")

    def both(a: int, b: int) -> dict[tuple[str, int], int]:
        return {("moves", 0): a, ("moves", 1): b}

    assert execute("--shift-by", "3") == both(7, 7)
    assert execute("--shift-by", "-2") == both(5, 5)
    assert execute("--shift-by", "100") == both(10, 10)  # clamped to the log end
    assert execute("--shift-by", "-100") == both(0, 0)  # clamped to the log start
    assert execute("--to-offset", "999") == both(10, 10)
    assert execute("--to-offset", "-5") == both(0, 0)
    # The first record at or after T0 + 5 s: offset 3 on p0 (T0+6), offset 2 on p1 (T0+5).
    assert execute("--to-datetime", "2023-11-14T22:13:25+00:00") == both(3, 2)
    assert execute("--to-datetime", "2023-11-14T23:13:25+01:00") == both(3, 2)  # same instant
    assert execute("--to-datetime", "2000-01-01T00:00:00+00:00") == both(0, 0)
    assert execute("--to-datetime", "2100-01-01T00:00:00") == both(10, 10)  # local time: none
    assert execute("--to-offset", "6", "--partitions", "1") == both(10, 6)
    assert execute("--to-earliest", "--partitions", "0,1") == both(0, 0)
    assert execute("--to-latest", "--partitions", "0") == both(10, 0)


def test_delete_offsets_forgets_a_topics_offsets_unless_a_member_consumes_it(bootstrap, capsys):
    for topic in ("gone", "kept"):
        cli_ok(capsys, "topics", "create", topic, "--partitions", "2", "-b", bootstrap)
    reset(bootstrap, "del", {("gone", 0): 0, ("gone", 1): 0, ("kept", 0): 0})

    out = cli_ok(capsys, "groups", "delete-offsets", "del", "--topic", "gone", "--partitions",
                 "1", "--json", "-b", bootstrap)  # fmt: skip
    assert json.loads(out) == {"group": "del", "deleted": [["gone", 1]]}
    assert committed(bootstrap, "del") == {("gone", 0): 0, ("kept", 0): 0}
    out = cli_ok(capsys, "groups", "delete-offsets", "del", "--topic", "gone", "-b", bootstrap)
    assert out.strip() == "deleted the offsets of group del for 2 partition(s) of gone"
    assert committed(bootstrap, "del") == {("kept", 0): 0}

    # Refused while a member of the group consumes the topic; the offsets stay.
    async def while_a_member_consumes() -> tuple[subprocess.CompletedProcess[str], str, str]:
        with trio.fail_after(20):
            async with open_consumer(bootstrap, "del", ["kept"], session_timeout=5) as consumer:
                await consumer.wait_assigned()

                def ask():
                    refused = run("groups", "delete-offsets", "del", "--topic", "kept", *b)
                    return refused, run("groups", "describe", "del", "--json", *b).stdout

                refused, described = await trio.to_thread.run_sync(ask)
                return refused, described, consumer.member_id

    b = ("-b", bootstrap)
    refused, described, member_id = trio.run(while_a_member_consumes)
    line = error_line(refused)
    assert "members of group del consume kept-0" in line and "stop them" in line
    assert ("kept", 0) in committed(bootstrap, "del")
    # (and describe names the owner of what the member consumes)
    rows = {(r["topic"], r["partition"]): r for r in json.loads(described)["partitions"]}
    assert rows["kept", 0]["owner"] == rows["kept", 1]["owner"] == member_id
    assert rows["kept", 0]["committed"] == 0 and rows["kept", 1]["committed"] is None


# -- mistakes and help -----------------------------------------------------------------------


def test_user_mistakes_get_one_clear_error_line_and_status_1(bootstrap, capsys):
    cli_ok(capsys, "topics", "create", "two", "--partitions", "2", "-b", bootstrap)
    b = ("-b", bootstrap)
    no_topic = (
        "error: topic 'nope' does not exist; create it first "
        "(trio-coord topics create nope --partitions N)"
    )
    # produce reads stdin: real processes (in parallel, to save their start-up time).
    produce_cases = [
        (("produce", "nope", *b), "x\n", no_topic),
        (
            ("produce", "two", "--partition", "7", *b),
            "x\n",
            "error: topic 'two' has partitions 0..1; partition 7 does not exist",
        ),
        (
            ("produce", "two", "--key-separator", ":", *b),
            "k:v\nno separator here\n",
            "error: line 2 has no key separator ':': 'no separator here'; "
            "the 1 line(s) before it were produced, none after",
        ),
    ]
    with ThreadPoolExecutor(max_workers=3) as pool:
        results = list(pool.map(lambda case: run(*case[0], stdin=case[1]), produce_cases))
    for (args, _, expected), result in zip(produce_cases, results, strict=True):
        assert error_line(result) == expected, args
    described = json.loads(cli_ok(capsys, "topics", "describe", "two", "--json", *b))
    stored = sum(p["log_end"] for p in described[0]["offsets"])
    assert stored == 1, "the line before the bad one was produced, as the error says"

    reset = ("groups", "reset-offsets", "g", "--topic")
    for args, expected in [
        ((*reset, "nope", "--to-earliest"), no_topic),
        (
            (*reset, "two", "--to-datetime", "yesterday"),
            "error: --to-datetime 'yesterday' is not an ISO 8601 time "
            "(e.g. 2026-11-22T10:00:00+00:00)",
        ),
        (
            (*reset, "two", "--to-earliest", "--partitions", "5"),
            "error: topic two has none of the partitions 5",
        ),
        (
            (*reset, "two", "--to-earliest", "--partitions", "a,b"),
            "error: --partitions 'a,b' is not a comma-separated list of numbers",
        ),
        (("groups", "delete-offsets", "g", "--topic", "nope"), no_topic),
        (
            ("groups", "delete-offsets", "no-such-group", "--topic", "two"),
            "error: group 'no-such-group' does not exist on this coordinator",
        ),
        (
            (*reset, "two"),  # no target
            "error: say where to: --to-earliest, --to-latest, --to-offset N, --to-datetime ISO "
            "or --shift-by N (or give the offsets with --from-file)",
        ),
        (
            (*reset, "two:9", "--to-earliest"),
            "error: topic two has none of the partitions 9",
        ),
    ]:
        assert cli_error(capsys, *args, *b) == expected, args

    # Bad usage is argparse's: status 2 and the usage line.
    for args in (
        (*reset, "two", "--to-latest", "--dry-run", "--execute"),
        (*reset, "two", "--to-latest", "--to-earliest"),
    ):
        with pytest.raises(SystemExit) as exit_:
            main([*args, *b])
        assert exit_.value.code == 2, args
        assert "usage: trio-coord groups reset-offsets" in capsys.readouterr().err


@pytest.mark.parametrize(
    ("command", "options"),
    [
        (["produce"], ["--key-separator", "--partition", "--compression", "--json"]),
        (["consume"], ["--group", "--events", "--max-records", "--offset-reset"]),
        (["groups", "describe"], ["--json"]),
        (
            ["groups", "reset-offsets"],
            [
                "--topic", "--all-topics", "--from-file", "--to-earliest", "--to-latest",
                "--to-offset", "--to-datetime", "--shift-by", "--dry-run", "--execute", "--json",
            ],
        ),
        (["groups", "delete-offsets"], ["--topic", "--all-topics", "--json"]),
        (["topics", "describe"], ["--json"]),
        (
            ["broker"],
            ["--flush-interval", "--retention-hours", "--retention-bytes", "--segment-bytes"],
        ),
    ],
)  # fmt: skip
def test_every_data_command_has_help(command, options, capsys):
    with pytest.raises(SystemExit) as exit_:
        main([*command, "--help"])
    assert exit_.value.code == 0
    text = capsys.readouterr().out
    assert text.startswith(f"usage: trio-coord {' '.join(command)} ")
    for option in options:
        assert option in text, option


def test_json_output_goes_to_the_current_stdout(bootstrap):
    """``--json`` output follows ``sys.stdout`` as the text output does.

    Fails today: ``cli._print_json(value, out=sys.stdout)`` binds the
    default when ``cli.py`` is imported, so ``main()`` run under
    ``contextlib.redirect_stdout`` (an embedding application, a test's
    capsys) prints its tables into the redirect but its JSON elsewhere.
    """
    outputs = []
    for args in (["topics", "list"], ["topics", "list", "--json"]):
        text = io.StringIO()
        with contextlib.redirect_stdout(text):
            assert main([*args, "-b", bootstrap]) == 0
        outputs.append(text.getvalue())
    assert "TOPIC" in outputs[0] or "no topics" in outputs[0]
    assert outputs[1].strip(), "the --json output did not go to the redirected sys.stdout"
    assert isinstance(json.loads(outputs[1]), list)


def test_text_consume_prints_records_on_stdout_and_events_on_stderr(bootstrap, capsys):
    cli_ok(capsys, "topics", "create", "split", "--partitions", "1", "-b", bootstrap)
    assert run("produce", "split", "-b", bootstrap, stdin="one\ntwo\n").returncode == 0
    status, out, err = cli(
        capsys, "consume", "split", "--group", "text", "--offset-reset", "earliest",
        "--max-records", "2", "-b", bootstrap,
    )  # fmt: skip
    assert status == 0, err
    assert out.splitlines() == ["split-0@0  one", "split-0@1  two"]  # records only
    assert "assigned" in err and "split-0" in err


def test_json_with_text_events_is_refused(bootstrap, capsys):
    line = cli_error(
        capsys, "consume", "split", "--group", "x", "--json", "--events", "text", "-b", bootstrap
    )
    assert "drop --events text" in line


def test_reset_offsets_takes_kafkas_topic_partition_forms_all_topics_and_a_csv(
    bootstrap, capsys, tmp_path
):
    for topic, partitions in (("ra", "2"), ("rb", "1")):
        cli_ok(capsys, "topics", "create", topic, "--partitions", partitions, "-b", bootstrap)
        for p in range(int(partitions)):
            lines = "".join(f"{i}\n" for i in range(5))
            assert run("produce", topic, "--partition", str(p), "-b", bootstrap, stdin=lines)
    reset(bootstrap, "kf", {("ra", 0): 3, ("ra", 1): 3, ("rb", 0): 3})
    b = ("-b", bootstrap)

    def plan(*args: str) -> list[tuple[str, int, int]]:
        out = cli_ok(capsys, "groups", "reset-offsets", "kf", *args, "--execute", "--json", *b)
        return [(r["topic"], r["partition"], r["new"]) for r in json.loads(out)["partitions"]]

    # Kafka's --topic TOPIC:P,P, repeatable: only ra-1 and all of rb move.
    assert plan("--topic", "ra:1", "--topic", "rb", "--to-earliest") == [
        ("ra", 1, 0),
        ("rb", 0, 0),
    ]
    assert committed(bootstrap, "kf") == {("ra", 0): 3, ("ra", 1): 0, ("rb", 0): 0}
    # --all-topics: every topic the group has offsets for.
    assert plan("--all-topics", "--to-latest") == [("ra", 0, 5), ("ra", 1, 5), ("rb", 0, 5)]
    # --from-file: Kafka's CSV, the offsets themselves (clamped into the log like any target).
    csv = tmp_path / "offsets.csv"
    csv.write_text("# topic,partition,offset\nra,0,1\nrb,0,2\n")
    assert plan("--from-file", str(csv)) == [("ra", 0, 1), ("rb", 0, 2)]
    assert committed(bootstrap, "kf") == {("ra", 0): 1, ("ra", 1): 5, ("rb", 0): 2}
    csv.write_text("ra,zero,1\n")
    assert "line 1: 'ra,zero,1' is not topic,partition,offset" in cli_error(
        capsys, "groups", "reset-offsets", "kf", "--from-file", str(csv), *b
    )


def test_describe_all_groups(bootstrap, capsys):
    cli_ok(capsys, "groups", "create", "described-a", "-b", bootstrap)
    cli_ok(capsys, "groups", "create", "described-b", "-b", bootstrap)
    listed = json.loads(
        cli_ok(capsys, "groups", "describe", "--all-groups", "--json", "-b", bootstrap)
    )
    names = [g["group"] for g in listed]
    assert {"described-a", "described-b"} <= set(names) and names == sorted(names)
    text = cli_ok(capsys, "groups", "describe", "--all-groups", "-b", bootstrap)
    assert "described-a" in text and "described-b" in text
    assert "name one GROUP, or give --all-groups" in cli_error(
        capsys, "groups", "describe", "-b", bootstrap
    )
