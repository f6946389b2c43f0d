"""The ``trio-coord`` command line and the documented examples, run as a user runs them.

These start real processes: a broker (``trio-coord broker --port 0 --json``),
consumers (``trio-coord consume --events json``), the admin commands, the
demo, and the README's code. The central test is the acceptance check of the
core issue: three consumers on twelve partitions, one killed with SIGKILL,
and the two survivors own every partition exactly once within the session
timeout plus one second, as ``groups describe --json`` confirms.
"""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import threading
import time
from collections import Counter
from pathlib import Path

import pytest
from broker_process import running_broker

ROOT = Path(__file__).resolve().parent.parent
CLI = [sys.executable, "-m", "trio_coord"]
ENV = {**os.environ, "PYTHONUNBUFFERED": "1"}


def run(*args: str, timeout: float = 30.0) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [*CLI, *args], capture_output=True, text=True, timeout=timeout, env=ENV, check=False
    )


def ok(*args: str) -> str:
    result = run(*args)
    assert result.returncode == 0, f"{args} failed: {result.stderr}"
    return result.stdout


@pytest.fixture
def broker_process(tmp_path):
    """A broker in its own process; yields its bootstrap address."""
    with running_broker(tmp_path / "data") as address:
        yield address


class ConsumerProcess:
    """``trio-coord consume --events json`` in a subprocess, its events collected."""

    def __init__(
        self, bootstrap: str, topic: str, group: str, session_timeout: float, *options: str
    ) -> None:
        self.process = subprocess.Popen(
            [
                *CLI,
                "consume",
                topic,
                "--group",
                group,
                "--session-timeout",
                str(session_timeout),
                *options,
                "--events",
                "json",
                "-b",
                bootstrap,
            ],
            stdout=subprocess.PIPE,
            stderr=subprocess.DEVNULL,
            text=True,
            env=ENV,
        )
        self.events: list[dict] = []
        self._reader = threading.Thread(target=self._read, daemon=True)
        self._reader.start()

    def _read(self) -> None:
        assert self.process.stdout is not None
        for line in self.process.stdout:
            if line.strip():
                self.events.append(json.loads(line))

    @property
    def owned(self) -> list[tuple[str, int]]:
        # on_assigned names what it adds (a staged start calls it again in the same
        # generation, with the partitions a fence held back), on_revoked and on_lost
        # what goes.
        owned: list[tuple[str, int]] = []
        for event in self.events:
            partitions = [tuple(p) for p in event.get("partitions", [])]
            if event["event"] == "assigned":
                owned += [p for p in partitions if p not in owned]
            elif event["event"] in ("revoked", "lost"):
                owned = [p for p in owned if p not in partitions]
        return owned

    @property
    def member_id(self) -> str:
        return self.events[0]["member_id"] if self.events else ""

    def stop(self) -> None:
        if self.process.poll() is None:
            self.process.send_signal(signal.SIGTERM)
            self.process.wait(timeout=10)
        self._reader.join(timeout=5)


def wait_for(predicate, timeout: float, interval: float = 0.02) -> float:
    """Poll until ``predicate()``; return the seconds it took (fail at ``timeout``)."""
    start = time.monotonic()
    while not predicate():
        if time.monotonic() - start > timeout:
            raise AssertionError(f"condition not met within {timeout}s")
        time.sleep(interval)
    return time.monotonic() - start


@pytest.mark.slow
def test_sigkill_one_of_three_consumers_the_others_own_everything_exactly_once(broker_process):
    bootstrap = broker_process
    session_timeout = 3.0
    ok("topics", "create", "t", "--partitions", "12", "-b", bootstrap)
    consumers = [ConsumerProcess(bootstrap, "t", "g", session_timeout) for _ in range(3)]
    try:

        def exactly_once(members) -> bool:
            counts = Counter(tp for c in members for tp in c.owned)
            return counts == Counter({("t", p): 1 for p in range(12)})

        wait_for(lambda: exactly_once(consumers) and all(c.owned for c in consumers), 15.0)
        victim, survivors = consumers[1], [consumers[0], consumers[2]]
        victim.process.send_signal(signal.SIGKILL)
        took = wait_for(lambda: exactly_once(survivors), session_timeout + 1.0)
        assert took <= session_timeout + 1.0

        described = json.loads(ok("groups", "describe", "g", "--json", "-b", bootstrap))
        assert described["state"] == "STABLE"
        by_member = {
            m["member_id"]: sorted(map(tuple, m["partitions"])) for m in described["members"]
        }
        assert by_member == {c.member_id: sorted(c.owned) for c in survivors}
    finally:
        for consumer in consumers:
            if consumer.process.poll() is None:
                consumer.stop()
    # The survivors left cleanly on SIGTERM and said so.
    for consumer in survivors:
        assert consumer.events[-1]["event"] == "left"


def test_admin_commands_print_tables_and_json(broker_process):
    bootstrap = broker_process
    assert "created topic orders with 3 partition(s)" in ok(
        "topics", "create", "orders", "--partitions", "3", "-b", bootstrap
    )
    assert json.loads(ok("topics", "list", "--json", "-b", bootstrap)) == [
        {"topic": "orders", "partitions": 3}
    ]
    assert re.search(r"orders\s+2\s+0\s+0", ok("topics", "describe", "orders", "-b", bootstrap))
    ok("topics", "add-partitions", "orders", "--total", "5", "-b", bootstrap)
    described = json.loads(ok("topics", "describe", "orders", "--json", "-b", bootstrap))
    # (the topic's id, kept by add-partitions, is checked in test_cli_data.py, its configs too)
    assert described[0].pop("topic_id") and described[0].pop("topic_uuid")
    configs = described[0].pop("configs")
    assert described == [
        {
            "topic": "orders",
            "partitions": 5,
            "offsets": [
                {"partition": p, "log_start": 0, "log_end": 0, "leader": None} for p in range(5)
            ],
        }
    ]
    assert configs["cleanup.policy"] == "delete"
    ok("groups", "create", "g", "-b", bootstrap)
    listed = json.loads(ok("groups", "list", "--json", "-b", bootstrap))
    assert listed == [{"group": "g", "state": "EMPTY", "generation": 0, "members": 0}]
    assert "group g: EMPTY" in ok("groups", "describe", "g", "-b", bootstrap)
    ok("groups", "delete", "g", "-b", bootstrap)
    assert json.loads(ok("groups", "list", "--json", "-b", bootstrap)) == []


def test_user_mistakes_get_one_clear_line_and_status_1(broker_process, tmp_path):
    bootstrap = broker_process
    result = run("topics", "create", "bad name!", "--partitions", "1", "-b", bootstrap)
    assert result.returncode == 1
    assert result.stderr.strip() == (
        "error: topic name 'bad name!' may only contain letters, digits, '.', '_' and '-'"
    )
    result = run("groups", "describe", "nope", "-b", bootstrap)
    assert result.returncode == 1 and "does not exist" in result.stderr
    result = run("topics", "list", "-b", "127.0.0.1:1", "--timeout", "0.5")
    assert result.returncode == 1
    assert result.stderr == (
        "error: no broker accepted a connection within 0.5s (api_timeout): 127.0.0.1:1 — "
        "connection refused; check that a broker is running at these addresses and reachable "
        "from here (or allow more time)\n"
    )
    result = run("topics", "list", "-b", "nonsense")
    assert result.returncode == 1 and "host:port" in result.stderr
    # A second broker on the same data dir is refused, naming the way out.
    result = run("broker", "--data-dir", str(tmp_path / "data"), "--port", "0")
    assert result.returncode == 1 and "in use by another process" in result.stderr


def test_every_command_has_help():
    top = ok("--help")
    for command in ("broker", "topics", "groups", "consume", "demo"):
        assert command in top
    for args in (
        ["broker"],
        ["topics", "create"],
        ["topics", "list"],
        ["groups", "describe"],
        ["consume"],
        ["demo"],
    ):
        text = ok(*args, "--help")
        assert "usage: trio-coord" in text and "--" in text


@pytest.mark.slow
def test_demo_runs_and_tells_its_story():
    result = run("demo", timeout=60.0)
    assert result.returncode == 0, result.stderr
    out = result.stdout
    for heading in (
        "Three consumers join",
        "A fourth consumer arrives",
        "Consumer B crashes (SIGKILL",
        "shut down cleanly",
    ):
        assert heading in out
    assert re.search(r"stable again [0-9.]+ s after the crash", out)


def run_python(*args: str, cwd: Path) -> str:
    """Run ``python ARGS`` in ``cwd``; return its stdout (fail with its stderr)."""
    result = subprocess.run(
        [sys.executable, *args], cwd=cwd, capture_output=True, text=True, timeout=30, env=ENV
    )
    assert result.returncode == 0, result.stderr
    return result.stdout


def test_readme_example_runs(tmp_path):
    readme = (ROOT / "README.md").read_text()
    code = re.search(r"```python\n(.*?)```", readme, re.S).group(1)
    out = run_python("-c", code, cwd=tmp_path)
    assert "TopicPartition(topic='events', partition=0)" in out
    again = run_python("-c", code, cwd=tmp_path)  # a second run: the topic exists, offsets too
    assert "TopicPartition(topic='events', partition=0)" in again


def test_quickstart_example_runs_and_a_second_run_resumes_where_the_first_stopped(tmp_path):
    first = run_python(str(ROOT / "examples" / "quickstart.py"), cwd=tmp_path)
    assert "a owns ['events-0', 'events-1', 'events-2', 'events-3']" in first
    assert "the group starts at nothing" in first and "a read 8 record(s)" in first
    committed = first.rsplit("committed: ", 1)[1].strip()
    second = run_python(str(ROOT / "examples" / "quickstart.py"), cwd=tmp_path)
    assert f"the group starts at {committed}" in second
    assert "a read 8 record(s)" in second  # its own 8, not the first run's again


def test_consuming_a_topic_that_does_not_exist_yet_says_so(broker_process):
    process = subprocess.Popen(
        [*CLI, "consume", "later", "--group", "g", "--events", "json", "-b", broker_process],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=ENV,
    )
    try:
        assert json.loads(process.stdout.readline())["event"] == "joined"
        assert process.stderr.readline().strip() == (
            "warning: topic 'later' does not exist yet; its partitions will be assigned once "
            "it is created (trio-coord topics create later --partitions N)"
        )
        ok("topics", "create", "later", "--partitions", "2", "-b", broker_process)
        while (event := json.loads(process.stdout.readline()))["partitions"] == []:
            assert event["event"] == "assigned"
        assert event == {**event, "event": "assigned", "partitions": [["later", 0], ["later", 1]]}
    finally:
        process.send_signal(signal.SIGTERM)
        process.wait(timeout=10)


def test_log_level_before_or_after_the_command_or_from_the_environment(monkeypatch):
    from trio_coord.cli import _log_level, build_parser

    parse = build_parser().parse_args
    monkeypatch.delenv("TRIO_COORD_LOG_LEVEL", raising=False)
    assert _log_level(parse(["broker"])) == "INFO"  # the command's default
    assert _log_level(parse(["--log-level", "WARNING", "broker"])) == "WARNING"
    assert _log_level(parse(["broker", "--log-level", "debug"])) == "DEBUG"
    assert _log_level(parse(["topics", "list", "--log-level", "ERROR"])) == "ERROR"
    assert _log_level(parse(["topics", "list"])) == "WARNING"
    monkeypatch.setenv("TRIO_COORD_LOG_LEVEL", "error")
    assert _log_level(parse(["broker"])) == "ERROR"
    assert _log_level(parse(["broker", "--log-level", "INFO"])) == "INFO"  # the flag wins


def test_lag_with_nothing_committed_is_a_dash_not_the_whole_log():
    from trio_coord.cli import describe_text, group_to_json
    from trio_coord.client import PartitionLag
    from trio_coord.protocol.messages import GroupDescription

    group = GroupDescription("g", "EMPTY", 3, "range", [], [])
    rows = [PartitionLag("t", 0, 4, 0, 10, 6, ""), PartitionLag("t", 1, None, 0, 7, 7, "")]
    text = describe_text(group, rows)
    assert "total lag: 6 (1 partition(s) with nothing committed: '-')" in text
    assert [r["lag"] for r in group_to_json(group, rows)["partitions"]] == [6, None]


def test_an_address_in_use_is_named(tmp_path):
    import socket

    held = socket.socket()
    held.bind(("127.0.0.1", 0))
    held.listen()
    port = held.getsockname()[1]
    try:
        result = run("broker", "--data-dir", str(tmp_path), "--port", str(port), timeout=60)
    finally:
        held.close()
    assert result.returncode == 1
    assert f"cannot listen on 127.0.0.1:{port}" in result.stderr
    assert "choose another --port" in result.stderr


def test_broker_settings_come_from_flags_then_environment_then_config_file(
    tmp_path, monkeypatch, capsys
):
    from trio_coord.cli import main

    config = tmp_path / "broker.toml"
    config.write_text("max-connections = 5000\nsegment_bytes = 1048576\nport = 7000\n")
    monkeypatch.setenv("TRIO_COORD_MAX_CONNECTIONS", "6000")
    monkeypatch.setenv("TRIO_COORD_REPAIR", "true")
    argv = ["broker", "--config", str(config), "--port", "7001", "--print-config"]
    assert main([*argv, "--json"]) == 0
    settings = json.loads(capsys.readouterr().out)
    assert settings["max-connections"] == 6000  # the variable beats the file
    assert settings["segment-bytes"] == 1048576  # the file beats the default
    assert settings["port"] == 7001  # the flag beats everything
    assert settings["repair"] is True
    assert main(argv) == 0
    text = capsys.readouterr().out
    assert "max-connections = 6000  # TRIO_COORD_MAX_CONNECTIONS" in text
    assert f"segment-bytes = 1048576  # {config}" in text and "port = 7001  # flag" in text


def test_a_setting_that_does_not_exist_or_does_not_parse_is_named(tmp_path, monkeypatch, capsys):
    from trio_coord.cli import main

    config = tmp_path / "broker.toml"
    config.write_text("max-conections = 5000\n")
    assert main(["broker", "--config", str(config), "--print-config"]) == 1
    err = capsys.readouterr().err
    assert "'max-conections' is not a broker setting (did you mean max-connections?)" in err
    config.write_text("port = 'eighty'\n")
    assert main(["broker", "--config", str(config), "--print-config"]) == 1
    assert "--port 'eighty' is not a valid value" in capsys.readouterr().err
    config.write_text("port = [unclosed\n")
    assert main(["broker", "--config", str(config), "--print-config"]) == 1
    assert f"--config {config} is not valid TOML" in capsys.readouterr().err
    assert main(["broker", "--config", str(tmp_path / "missing.toml"), "--print-config"]) == 1
    assert "missing.toml: No such file or directory" in capsys.readouterr().err
    monkeypatch.setenv("TRIO_COORD_REPAIR", "maybe")
    assert main(["broker", "--print-config"]) == 1
    assert "TRIO_COORD_REPAIR: --repair is a switch" in capsys.readouterr().err


def test_the_shell_completes_commands_and_options(tmp_path):
    # What `eval "$(register-python-argcomplete trio-coord)"` makes bash ask.
    out = tmp_path / "completions"
    env = {
        **ENV,
        "_ARGCOMPLETE": "1",
        "_ARGCOMPLETE_IFS": "\n",
        "_ARGCOMPLETE_STDOUT_FILENAME": str(out),
    }
    for line, expected in (
        ("trio-coord groups re", "reset-offsets"),
        ("trio-coord broker --metrics", "--metrics-port"),
    ):
        subprocess.run(
            [sys.executable, "-m", "trio_coord"],
            env={**env, "COMP_LINE": line, "COMP_POINT": str(len(line))},
            timeout=30,
            check=True,
        )
        assert expected in out.read_text().split()


def test_the_brokers_rack_is_a_setting_and_is_bounded(tmp_path, monkeypatch, capsys):
    """``--rack`` comes from the flag, TRIO_COORD_RACK or the config file like any setting;
    a rack longer than 249 characters, or with control characters, is refused by name."""
    from trio_coord.broker.server import BrokerConfig
    from trio_coord.cli import main

    config = tmp_path / "broker.toml"
    config.write_text('rack = "eu-west-1a"\n')
    assert main(["broker", "--config", str(config), "--print-config", "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["rack"] == "eu-west-1a"
    monkeypatch.setenv("TRIO_COORD_RACK", "eu-west-1b")
    assert main(["broker", "--config", str(config), "--print-config", "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["rack"] == "eu-west-1b"
    BrokerConfig(rack="eu-west-1a").validate()
    for bad in ("z" * 250, "zone\n1"):
        with pytest.raises(ValueError, match="--rack"):
            BrokerConfig(rack=bad).validate()
