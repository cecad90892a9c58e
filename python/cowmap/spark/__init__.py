"""cowmap.spark: Flink-style keyed state inside PySpark, kept between micro-batches.

    from cowmap.spark import apply_with_state

    out = apply_with_state(events, "user", Dedup, "user string, ts timestamp",
                           checkpoint_location="/data/state/dedup")

See :func:`apply_with_state`. Needs the ``spark`` extra: ``pip install "cowmap[spark]"``.
"""

try:
    import pyspark
    from pyspark.sql import DataFrame
except ImportError as exc:
    raise ImportError('cowmap.spark needs PySpark (4.1 or newer): pip install "cowmap[spark]"') from exc
if not hasattr(DataFrame, "repartitionById"):
    raise ImportError(
        f"cowmap.spark needs PySpark 4.1 or newer (DataFrame.repartitionById), found {pyspark.__version__}: "
        'pip install "cowmap[spark]"'
    )

from cowmap.spark.context import StateContext
from cowmap.spark.groups import Rows
from cowmap.spark.query import apply_with_state

__all__ = ["Rows", "StateContext", "apply_with_state"]
