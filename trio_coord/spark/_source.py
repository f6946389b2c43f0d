"""The ``trio_coord`` data source itself, and the listener that commits a stream's last batch.

:class:`TrioCoordDataSource` is what ``spark.dataSource.register`` takes: it
checks the options and hands Spark the reader or writer for what was asked
(batch or stream, read or write). :class:`GroupCommitListener` runs in the
driver's Python process: Spark calls a stream reader's ``commit`` only when
it plans the batch after, so the last batch of a query (all of an
``AvailableNow`` run, say) would otherwise never reach the group; the
listener commits each finished batch's end offset as the query reports its
progress, never backwards.
"""

from __future__ import annotations

import json
import logging
from typing import Any

from pyspark.sql.datasource import (
    DataSource,
    DataSourceReader,
    DataSourceStreamReader,
    DataSourceStreamWriter,
    DataSourceWriter,
)
from pyspark.sql.streaming import StreamingQueryListener
from pyspark.sql.types import StructType

from ._options import read_options, write_options
from ._plan import offsets_from_json
from ._read import SCHEMA, BatchReader, StreamReader, commit_quietly
from ._write import BatchWriter, StreamWriter

__all__ = ["FORMAT", "GroupCommitListener", "TrioCoordDataSource"]

log = logging.getLogger(__name__)

FORMAT = "trio_coord"
"""The name to give ``spark.read.format(...)`` once the source is registered."""


class TrioCoordDataSource(DataSource):
    """Topics of trio_coord brokers as a Spark data source (batch and stream, read and write)."""

    @classmethod
    def name(cls) -> str:
        """The format name, ``trio_coord``."""
        return FORMAT

    def schema(self) -> StructType:
        """One row per record: topic, partition, offset, timestamp, key, value, headers."""
        return SCHEMA

    def reader(self, schema: StructType) -> DataSourceReader:
        """A batch read of the options' topics."""
        return BatchReader(read_options(self.options, streaming=False))

    def streamReader(self, schema: StructType) -> DataSourceStreamReader:
        """A stream read of the options' topics."""
        return StreamReader(read_options(self.options, streaming=True))

    def writer(self, schema: StructType, overwrite: bool) -> DataSourceWriter:
        """A batch write of the DataFrame's rows as records."""
        return BatchWriter(write_options(self.options), schema)

    def streamWriter(self, schema: StructType, overwrite: bool) -> DataSourceStreamWriter:
        """A stream write of each micro-batch's rows as records."""
        return StreamWriter(write_options(self.options), schema)


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
        """Nothing to do when a query ends (its last progress was committed)."""
