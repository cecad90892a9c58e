"""What the Spark tests compare against: running counts computed with pandas."""

from __future__ import annotations

from collections import Counter

import pandas as pd


def running_counts(batches: list[pd.DataFrame]) -> Counter:
    """(key, running count after the batch) for every key of every batch."""
    total: Counter = Counter()
    out: Counter = Counter()
    for b in batches:
        for k, n in b.groupby("k").size().items():
            total[k] += n
            out[(int(k), total[k])] += 1
    return out
