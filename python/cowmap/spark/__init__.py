"""cowmap.spark: Flink-style keyed state inside PySpark, kept between micro-batches.

    from cowmap.spark import apply_with_state

    out = apply_with_state(events, "user", Dedup, "user string, ts timestamp",
                           checkpoint_location="/data/state/dedup")

See :func:`apply_with_state`. Needs the ``spark`` extra: ``pip install "cowmap[spark]"``.
"""

try:
    import pyspark  # noqa: F401
except ImportError as exc:  # pragma: no cover - the message is the point
    raise ImportError('cowmap.spark needs PySpark (4.1 or newer): pip install "cowmap[spark]"') from exc

from cowmap.spark.context import StateContext
from cowmap.spark.groups import Rows
from cowmap.spark.query import apply_with_state

__all__ = ["Rows", "StateContext", "apply_with_state"]
