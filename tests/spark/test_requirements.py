"""What Spark needs, checked up front: Java, pyspark 4.2+, and PYSPARK_PYTHON.

Without Java, or with a pyspark too old for the read-limit API, the package
says what to install instead of failing deep inside PySpark; importing it
points Spark's Python workers at the running interpreter unless told otherwise.
"""

from __future__ import annotations

import importlib
import os
import subprocess
import sys

import pyspark
import pytest

from trio_coord.spark import JavaNotFoundError, check_java, java_major, local_session


def test_no_java_on_the_path_says_what_to_install(monkeypatch, tmp_path):
    monkeypatch.delenv("JAVA_HOME", raising=False)
    monkeypatch.setenv("PATH", str(tmp_path))
    with pytest.raises(JavaNotFoundError) as caught:
        local_session("no-java")
    message = str(caught.value)
    assert message.startswith("no java on PATH. Spark needs Java 17 or newer")
    assert "apt-get install openjdk-17-jre-headless" in message
    assert "set JAVA_HOME" in message


def test_a_java_home_without_java_is_named(monkeypatch, tmp_path):
    monkeypatch.setenv("JAVA_HOME", str(tmp_path))
    with pytest.raises(JavaNotFoundError, match=f"JAVA_HOME={tmp_path} has no bin/java"):
        check_java()


def test_a_java_that_does_not_run_is_reported(monkeypatch, tmp_path):
    (tmp_path / "bin").mkdir()
    broken = tmp_path / "bin" / "java"
    broken.write_text("#!/bin/sh\nexit 1\n")
    broken.chmod(0o755)
    monkeypatch.setenv("JAVA_HOME", str(tmp_path))
    with pytest.raises(JavaNotFoundError, match="does not run"):
        check_java()


def test_the_machines_java_is_found():
    assert check_java().endswith("java")


def test_an_old_pyspark_is_refused_with_what_to_install(monkeypatch):
    from trio_coord.spark import _requirements

    monkeypatch.setattr(pyspark, "__version__", "4.0.1")
    with pytest.raises(ImportError, match=r"needs pyspark 4\.2 or newer.*pyspark 4\.0\.1"):
        importlib.reload(_requirements)
    monkeypatch.undo()
    importlib.reload(_requirements)


@pytest.mark.parametrize("preset", [None, "/opt/other/python"])
def test_importing_the_package_sets_pyspark_python_only_when_unset(preset):
    env = {k: v for k, v in os.environ.items() if k != "PYSPARK_PYTHON"}
    if preset:
        env["PYSPARK_PYTHON"] = preset
    code = "import os, trio_coord.spark; print(os.environ['PYSPARK_PYTHON'])"
    done = subprocess.run(
        [sys.executable, "-c", code], env=env, capture_output=True, text=True, check=True
    )
    assert done.stdout.strip() == (preset or sys.executable)


@pytest.mark.parametrize(
    ("banner", "major"),
    [
        ('openjdk version "11.0.22" 2024-01-16\nOpenJDK Runtime Environment', 11),
        ('java version "1.8.0_392"\nJava(TM) SE Runtime Environment', 8),
    ],
)
def test_a_java_older_than_17_is_refused_with_its_version(monkeypatch, tmp_path, banner, major):
    (tmp_path / "bin").mkdir()
    old = tmp_path / "bin" / "java"
    old.write_text(f"#!/bin/sh\ncat >&2 <<'END'\n{banner}\nEND\n")
    old.chmod(0o755)
    monkeypatch.setenv("JAVA_HOME", str(tmp_path))
    with pytest.raises(JavaNotFoundError) as caught:
        check_java()
    assert str(caught.value).startswith(f"{old} is Java {major}, too old. Spark needs Java 17")


def test_java_versions_are_read_from_the_banner():
    assert java_major('openjdk version "21" 2023-09-19') == 21
    assert java_major('openjdk version "17.0.9" 2023-10-17 LTS') == 17
    assert java_major('java version "1.8.0_392"') == 8
    assert java_major("something else") is None


def test_a_spark_worker_imports_neither_the_broker_nor_the_trio_clients():
    # Spark's Python workers import the package to find the data source (and its reader and
    # writer) in every process they start: the broker and the Trio clients would add a few
    # hundred milliseconds to each, and are only imported when a program asks for them.
    code = (
        "import sys, trio_coord.spark._source as s; "
        "print(sorted(m for m in ('trio_coord.broker', 'trio_coord.client.admin', "
        "'trio_coord.client.consumer', 'trio_coord.client.producer', 'trio_coord.log', "
        "'trio_coord.store', 'trio_coord.security.server') if m in sys.modules)); "
        "from trio_coord.spark import background_broker; import trio_coord; "
        "print(background_broker.__module__, trio_coord.open_broker.__module__, "
        "trio_coord.Sasl.__module__, 'open_broker' in dir(trio_coord))"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert done.stdout.splitlines() == [
        "[]",
        "trio_coord.spark._embedded trio_coord.broker.server trio_coord.security.client True",
    ]
