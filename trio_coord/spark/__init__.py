"""trio_coord on Spark: a PySpark data source for topics, with consumer-group progress.

``register(spark)`` makes the format ``trio_coord`` known to a session (and
adds the listener that commits a stream's progress to its group, with an exit
hook that lets Spark deliver its last events to it); then::

    spark.read.format("trio_coord").option("bootstrap", "127.0.0.1:9092")
        .option("topic", "events").load()

reads a topic as a batch (``spark.readStream`` as a stream), and
``df.write.format("trio_coord")`` produces rows as records. ``local_session``
builds a local session with the source registered, after checking that Java
is there; ``background_broker`` runs a broker in a thread, for programs that
want one of their own. Importing this package sets ``PYSPARK_PYTHON`` to the running
interpreter when it is unset, so that Spark's Python workers import the same
trio_coord. ``docs/spark.md`` has the options and a cluster set-up.

Needs ``pip install trio_coord[spark]`` (pyspark >= 4.2, pyarrow) and Java 17+.
"""

from __future__ import annotations

import atexit
import logging
import os
import re
import shutil
import subprocess
import weakref
from pathlib import Path
from typing import TYPE_CHECKING, Any

from .._lazy import lazy_exports
from . import _requirements as _requirements  # first: checks pyspark, sets PYSPARK_PYTHON
from ._client import BlockingClient as BlockingClient
from ._client import BrokerUnreachableError as BrokerUnreachableError
from ._options import OptionError as OptionError
from ._read import ARROW_SCHEMA as ARROW_SCHEMA
from ._read import SCHEMA as SCHEMA
from ._read import SCHEMA_WITHOUT_HEADERS as SCHEMA_WITHOUT_HEADERS
from ._read import DataLossError as DataLossError
from ._source import FORMAT as FORMAT
from ._source import GroupCommitListener as GroupCommitListener
from ._source import TrioCoordDataSource as TrioCoordDataSource
from ._source import bound_to

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

    from ._embedded import background_broker as background_broker

__all__ = [
    "ARROW_SCHEMA",
    "FORMAT",
    "SCHEMA",
    "SCHEMA_WITHOUT_HEADERS",
    "BlockingClient",
    "BrokerUnreachableError",
    "DataLossError",
    "GroupCommitListener",
    "JavaNotFoundError",
    "OptionError",
    "TrioCoordDataSource",
    "background_broker",
    "check_java",
    "java_major",
    "local_session",
    "register",
]

log = logging.getLogger(__name__)

# The broker is imported only by a program that runs one: Spark's Python workers import this
# package (to find the data source) and must not pay for the broker's import.
if not TYPE_CHECKING:  # (mypy would take every name the module lacks for an Any)
    __getattr__, __dir__ = lazy_exports(globals(), {"background_broker": "._embedded"})

_registered: weakref.WeakKeyDictionary[Any, GroupCommitListener] = weakref.WeakKeyDictionary()


class JavaNotFoundError(RuntimeError):
    """Spark needs a Java runtime, and none was found."""


_JAVA_VERSION = re.compile(r'version "(\d+)(?:\.(\d+))?')
MIN_JAVA = 17
"""The oldest Java that Spark 4 runs on."""


def java_major(version_output: str) -> int | None:
    """The major version in ``java -version``'s output (``1.8.0`` is 8), None if it has none."""
    found = _JAVA_VERSION.search(version_output)
    if found is None:
        return None
    major = int(found.group(1))
    return int(found.group(2) or 0) if major == 1 else major


def check_java() -> str:
    """The ``java`` Spark will run (from JAVA_HOME, else PATH); JavaNotFoundError if none
    runs, or if it is older than Java 17."""
    home = os.environ.get("JAVA_HOME")
    candidate = str(Path(home) / "bin" / "java") if home else shutil.which("java")
    advice = (
        "Spark needs Java 17 or newer: install it (on Debian or Ubuntu: "
        "sudo apt-get install openjdk-17-jre-headless) or set JAVA_HOME to a Java installation"
    )
    if not candidate or not Path(candidate).exists():
        where = f"JAVA_HOME={home} has no bin/java" if home else "no java on PATH"
        raise JavaNotFoundError(f"{where}. {advice}")
    try:
        done = subprocess.run(
            [candidate, "-version"], capture_output=True, text=True, check=True, timeout=30
        )
    except (OSError, subprocess.SubprocessError) as exc:
        raise JavaNotFoundError(f"{candidate} does not run ({exc}). {advice}") from None
    major = java_major(done.stderr + done.stdout)
    if major is not None and major < MIN_JAVA:
        raise JavaNotFoundError(f"{candidate} is Java {major}, too old. {advice}")
    return candidate


def register(spark: SparkSession) -> None:
    """Make the ``trio_coord`` format known to ``spark``, with the group-commit listener
    (once per session, however often it is called).

    The format is registered with the session's ``defaultParallelism``, so that
    a read makes one task per core (each with an equal share of the records)
    rather than one per partition; ``spark.dataSource.register(TrioCoordDataSource)``
    registers it without, Kafka's way.
    """
    spark.dataSource.register(bound_to(_parallelism(spark)))
    if spark not in _registered:
        listener = GroupCommitListener()
        spark.streams.addListener(listener)
        _registered[spark] = listener
        atexit.register(_remove_listener, weakref.ref(spark), listener)


def _parallelism(spark: SparkSession) -> int | None:
    """The session's ``defaultParallelism`` (its cores), None where it has no SparkContext
    (a Spark Connect session)."""
    try:
        return int(spark.sparkContext.defaultParallelism)
    except Exception:
        log.debug("the session's parallelism is unknown; reads make a task per partition")
        return None


def _remove_listener(spark: weakref.ref[SparkSession], listener: GroupCommitListener) -> None:
    """At exit, before pyspark stops the JVM: let Spark's listener bus deliver what it has
    queued (up to 10 s), then take the listener off it, so that no event reaches a Python
    process that is going away (Spark would log each as a listener error). Nothing depends
    on it: the stream readers have committed every finished batch already."""
    session = spark()
    if session is None or session.sparkContext._jsc is None:  # stopped: nothing is queued
        return
    try:
        session.sparkContext._jsc.sc().listenerBus().waitUntilEmpty(10_000)
    except Exception:  # stopped, gone, or a Spark without this (internal) method
        log.debug("could not drain Spark's listener bus at exit", exc_info=True)
    try:
        session.streams.removeListener(listener)
    except Exception:  # the session was stopped, or the JVM is gone: nothing to remove
        log.debug("could not remove the group-commit listener at exit", exc_info=True)


def local_session(
    app_name: str = "trio_coord", master: str = "local[*]", **conf: str
) -> SparkSession:
    """A Spark session on this machine with ``trio_coord`` registered.

    ``conf`` adds Spark settings (dots as in Spark: pass them as
    ``**{"spark.sql.shuffle.partitions": "4"}``). Raises JavaNotFoundError
    with what to install when there is no Java.
    """
    check_java()
    from pyspark.sql import SparkSession

    builder = SparkSession.builder.master(master).appName(app_name)
    for key, value in {"spark.ui.enabled": "false", **conf}.items():
        builder = builder.config(key, value)
    spark = builder.getOrCreate()
    register(spark)
    return spark
