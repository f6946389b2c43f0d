"""What the Spark package needs before anything else loads: pyspark 4.2+, pyarrow, PYSPARK_PYTHON.

Imported first by ``trio_coord.spark``: it raises ImportError saying what to
install when pyspark or pyarrow is missing or pyspark is older than 4.2
(which brought the streaming read-limit API that ``maxRecordsPerBatch`` and
``Trigger.AvailableNow`` use), and sets ``PYSPARK_PYTHON`` to the running
interpreter when it is unset, so that Spark's Python workers run the same
Python, with the same trio_coord, as the program that starts them.
"""

from __future__ import annotations

import os
import sys

__all__ = ["MIN_PYSPARK"]

MIN_PYSPARK = (4, 2)


def _check() -> None:
    try:
        import pyarrow  # noqa: F401
        import pyspark
    except ImportError as exc:
        raise ImportError(
            f"trio_coord.spark needs pyspark and pyarrow ({exc}); pip install 'trio_coord[spark]'"
        ) from exc
    version = tuple(int(part) for part in pyspark.__version__.split(".")[:2])
    if version < MIN_PYSPARK:
        raise ImportError(
            "trio_coord.spark needs pyspark 4.2 or newer (its streaming read-limit API); "
            f"this is pyspark {pyspark.__version__}: pip install 'trio_coord[spark]'"
        )


_check()
os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
