"""cowmap: a compiled copy-on-write keyed state store for stream processing.

Modelled on Apache Flink's heap keyed-state backend. The public API is
re-exported here; everything else is private.
"""

try:
    from cowmap._core import (
        NO_TIMESTAMP,
        CopyOnWriteStateMap,
        StateIncrementalVisitor,
        StateMapSnapshot,
    )
except ImportError as exc:  # pragma: no cover - only hit on a broken install
    raise ImportError(
        "cowmap's compiled core (cowmap._core) could not be imported. cowmap must be "
        "built, not used from a source checkout: run `pip install .` (or "
        "`pip install -e .` for development) from the project root."
    ) from exc

__all__ = [
    "NO_TIMESTAMP",
    "CopyOnWriteStateMap",
    "StateIncrementalVisitor",
    "StateMapSnapshot",
]
__version__ = "0.1.0"
