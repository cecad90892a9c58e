"""Durable checkpoints of keyed state, on the local disk or any ``pyarrow.fs`` filesystem.

    >>> import tempfile
    >>> from cowmap.checkpoint import CheckpointStorage
    >>> from cowmap.state import KeyedStateBackend, ValueStateDescriptor
    >>> backend = KeyedStateBackend()
    >>> count = backend.get_state(ValueStateDescriptor("count", default_value=0))
    >>> backend.set_current_key("user-1"); count.update(41)
    >>> storage = CheckpointStorage(tempfile.mkdtemp())
    >>> storage.save(backend)
    1
    >>> fresh = KeyedStateBackend()
    >>> storage.restore(fresh)
    []
    >>> fresh.set_current_key("user-1")
    >>> fresh.get_state(ValueStateDescriptor("count", default_value=0)).value()
    41

The file format is described in docs/checkpoint-format.md.
"""

from cowmap.checkpoint.checkpoint_storage import CheckpointStorage, SaveHandle
from cowmap.checkpoint.columns import Serializer
from cowmap.checkpoint.errors import CorruptCheckpointError

__all__ = ["CheckpointStorage", "CorruptCheckpointError", "SaveHandle", "Serializer"]
