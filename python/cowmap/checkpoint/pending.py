"""The records waiting at an unaligned-style checkpoint, as one block.

The block has key groups ``PENDING_BLOCK..PENDING_BLOCK`` and one section
(state index ``PENDING_BLOCK``, no runs) of two columns: each record's key group (int64) and its
``(key, record)`` pair (pickled). A restore returns the pairs of its own key
groups, in their order.
"""

from __future__ import annotations

import pickle
from typing import Any

import numpy as np

from cowmap.checkpoint.columns import PICKLE, column_list, encode_column
from cowmap.checkpoint.fileformat import PENDING_BLOCK, DataFileReader, Section
from cowmap.state.backend import KeyedStateBackend

__all__ = ["decode_pending", "encode_pending"]


def encode_pending(backend: KeyedStateBackend, waiting: list[tuple[Any, Any]]) -> Section:
    """The section of ``waiting`` ``(key, record)`` pairs; ``TypeError`` naming
    the first record that cannot be pickled."""
    kg_of = backend.key_group_of
    kgs = np.fromiter((kg_of(k) for k, _ in waiting), np.int64, len(waiting))
    try:
        pairs = encode_column(waiting, PICKLE)
    except Exception:
        for key, record in waiting:
            try:
                pickle.dumps(record, protocol=5)
            except Exception as e:
                raise TypeError(
                    f"the record waiting for key {key!r} cannot be pickled ({type(e).__name__}: {e}); records "
                    f"written with an unaligned checkpoint must be picklable"
                ) from e
        raise
    return (PENDING_BLOCK, len(waiting), [encode_column(kgs, PICKLE), pairs], ([], []))


def decode_pending(reader: DataFileReader, lo: int, hi: int) -> list[tuple[Any, Any]]:
    """The waiting records of key groups ``lo..hi`` in a checked data file."""
    raw = reader.block_bytes(PENDING_BLOCK)
    serializers = {PENDING_BLOCK: [PICKLE, PICKLE]}
    out: list[tuple[Any, Any]] = []
    for _, n, (kgs, pairs), _ in reader.sections(PENDING_BLOCK, raw, serializers):
        for kg, pair in zip(column_list(kgs, n), column_list(pairs, n)):
            if lo <= kg <= hi:
                out.append(tuple(pair))
    return out
