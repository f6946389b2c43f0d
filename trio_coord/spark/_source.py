"""The ``trio_coord`` data source itself, and the listener that commits a stream's last batch.

:class:`TrioCoordDataSource` is what ``spark.dataSource.register`` takes: it
checks the options and hands Spark the reader or writer for what was asked
(batch or stream, read or write). :class:`GroupCommitListener` runs in the
driver's Python process and commits each finished batch's end offset as the
query reports its progress, never backwards. The stream reader commits the
same offsets synchronously (see ``StreamReader.latestOffset``), which is
what a driver that exits at once relies on: Spark runs listeners
asynchronously, so the listener is for promptness, and for the one batch of
a ``Trigger.Once`` query (``register`` lets the listener bus drain when the
driver exits, so that batch is committed even without ``spark.stop()``).
"""

from __future__ import annotations

import dataclasses
import json
import logging
from typing import Any, ClassVar

from pyspark.sql.datasource import (
    DataSource,
    DataSourceReader,
    DataSourceStreamReader,
    DataSourceStreamWriter,
    DataSourceWriter,
)
from pyspark.sql.streaming import StreamingQueryListener
from pyspark.sql.types import StructType

from ._options import OptionError, read_options, write_options
from ._plan import offsets_from_json
from ._read import (
    SCHEMA_WITHOUT_HEADERS,
    BatchReader,
    StreamReader,
    commit_quietly,
    schema_for,
)
from ._write import BatchWriter, StreamWriter

__all__ = ["FORMAT", "GroupCommitListener", "TrioCoordDataSource", "bound_to"]

log = logging.getLogger(__name__)

FORMAT = "trio_coord"
"""The name to give ``spark.read.format(...)`` once the source is registered."""


class TrioCoordDataSource(DataSource):
    """Topics of trio_coord brokers as a Spark data source (batch and stream, read and write).

    ``parallelism`` is the session's cores when known (see :func:`bound_to`):
    reads then make one task per core.
    """

    parallelism: ClassVar[int | None] = None

    @classmethod
    def name(cls) -> str:
        """The format name, ``trio_coord``."""
        return FORMAT

    def schema(self) -> StructType:
        """One row per record: key, value, topic, partition, offset, timestamp,
        timestampType, and headers with ``includeHeaders`` (Spark's Kafka source's columns).

        Spark asks for the schema at ``load()`` (never for a write), so the
        options are checked here already, as far as a read of either kind
        goes: a stream's mistakes fail at ``load()`` rather than when the
        query starts. Options that make a valid write are left to the writer.
        """
        try:
            options = read_options(self.options, streaming=None)
        except OptionError:
            if not _make_a_write(self.options):
                raise
            return SCHEMA_WITHOUT_HEADERS
        return schema_for(options)

    def reader(self, schema: StructType) -> DataSourceReader:
        """A batch read of the options' topics."""
        options = read_options(self.options, streaming=False)
        return BatchReader(dataclasses.replace(options, parallelism=self.parallelism))

    def streamReader(self, schema: StructType) -> DataSourceStreamReader:
        """A stream read of the options' topics (a stream-only mistake is raised by the
        reader's first call: see :class:`_RefusedStreamReader`)."""
        try:
            options = read_options(self.options, streaming=True)
            return StreamReader(dataclasses.replace(options, parallelism=self.parallelism))
        except OptionError as exc:
            return _RefusedStreamReader(exc)

    def writer(self, schema: StructType, overwrite: bool) -> DataSourceWriter:
        """A batch write of the DataFrame's rows as records."""
        return BatchWriter(write_options(self.options), schema)

    def streamWriter(self, schema: StructType, overwrite: bool) -> DataSourceStreamWriter:
        """A stream write of each micro-batch's rows as records."""
        return StreamWriter(write_options(self.options), schema)


def bound_to(parallelism: int | None) -> type[TrioCoordDataSource]:
    """:class:`TrioCoordDataSource` for a session with ``parallelism`` cores.

    The class is made here, so Spark pickles it by value (a class found by its
    module and name would be pickled by reference, without the number): the
    Python workers that plan reads get the session's cores with it.
    """
    if parallelism is None or parallelism < 1:
        return TrioCoordDataSource

    class BoundSource(TrioCoordDataSource):
        __doc__ = TrioCoordDataSource.__doc__

    BoundSource.parallelism = parallelism
    return BoundSource


def _make_a_write(options: Any) -> bool:
    try:
        write_options(options)
    except OptionError:
        return False
    return True


class _RefusedStreamReader(DataSourceStreamReader):
    """A stream read whose options are wrong: each call Spark makes raises the error.

    Raised from ``streamReader`` itself, the error would reach the user
    behind an ``UnboundLocalError`` of pyspark's own stream runner (its
    ``finally`` stops a reader that was never made); raised from the first
    call instead, it is the last word of the query's exception.
    """

    def __init__(self, error: OptionError) -> None:
        self.error = error

    def initialOffset(self) -> dict[str, Any]:
        """Refuse: the options are wrong."""
        raise self.error

    def latestOffset(self, *args: Any) -> dict[str, Any]:
        """Refuse: the options are wrong."""
        raise self.error

    def partitions(self, start: dict[str, Any], end: dict[str, Any]) -> Any:
        """Refuse: the options are wrong."""
        raise self.error

    def read(self, partition: Any) -> Any:
        """Refuse: the options are wrong."""
        raise self.error

    def commit(self, end: dict[str, Any]) -> None:
        """Refuse: the options are wrong."""
        raise self.error

    def stop(self) -> None:
        """Nothing to stop."""


class GroupCommitListener(StreamingQueryListener):
    """Commits each finished micro-batch of a ``trio_coord`` stream with a ``group`` to it."""

    def onQueryStarted(self, event: Any) -> None:
        """Nothing to do when a query starts."""

    def onQueryProgress(self, event: Any) -> None:
        """A micro-batch finished: commit its end offsets, for each source that has a group."""
        for source in event.progress.sources:
            try:
                end = json.loads(source.endOffset) if source.endOffset else None
            except (TypeError, ValueError):
                continue
            if not (isinstance(end, dict) and end.get("group") and end.get("bootstrap")):
                continue
            try:
                offsets = offsets_from_json(end)
            except (TypeError, ValueError):
                continue
            commit_quietly(end["bootstrap"], end["group"], offsets)

    def onQueryIdle(self, event: Any) -> None:
        """Nothing to do while a query waits for data."""

    def onQueryTerminated(self, event: Any) -> None:
        """Nothing to do when a query ends (the reader committed its last batch)."""
