"""Without Java, the Spark helpers say what to install instead of failing deep inside PySpark."""

from __future__ import annotations

import pytest

from trio_coord.spark import JavaNotFoundError, check_java, local_session


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
