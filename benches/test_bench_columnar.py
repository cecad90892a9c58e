"""Figures 16-19: columnar keyed state, a pandas UDF's batches a column at a time.

1,000,000 rows over 200,000 keys in calls of 10,000 rows (what a PySpark pandas UDF sees),
through the columnar twins (``get_many``/``update_many``, ``contains_many``/``put_many``,
``add_many``), against the per-record loop they replace (``set_current_key`` per row, timed on
the first 200,000 rows) and against the pandas way (the state in a ``pd.Series`` indexed by key:
``reindex``, combine, write back), the three alternating round by round in one run. The cases are
``cowmap.bench.columnar``'s, which ``python -m cowmap.bench columnar`` runs too.

16. ValueState read-modify-write, int64 keys, TTL on (default cleanup) and off.
17. The same with TTL and string keys of 10-20 characters.
18. MapState dedup: ``contains_many`` of (key, item) rows, ``put_many`` of the new ones, TTL.
19. ReducingState with ``np.add``: ``add_many`` (grouping within the call included), TTL.
"""

from __future__ import annotations

import gc

import pytest

from cowmap.bench import columnar

ROUNDS = 5


@pytest.fixture(scope="module")
def data() -> columnar.Data:
    return columnar.make_data()


@pytest.mark.benchmark(group="columnar")
@pytest.mark.parametrize("case", columnar.CASES)
def test_columnar(benchmark, figures, data, case):
    c = columnar.make_case(case, data)
    loop = columnar.Interleaved(c.loop) if c.loop is not None else None
    pandas_way = columnar.Interleaved(c.pandas)

    def setup(loop=loop, pandas_way=pandas_way):
        if loop is not None:
            loop()
        pandas_way()

    benchmark.pedantic(c.cowmap, setup=setup, rounds=ROUNDS, warmup_rounds=1, iterations=1)
    k = f"columnar.{case}"
    figures.record_median(k, benchmark, columnar.ROWS)
    if loop is not None:
        figures.record(f"{k}.loop", loop.median() * 1e9 / c.loop_rows)
    figures.record(f"{k}.pandas", pandas_way.median() * 1e9 / columnar.ROWS)
    st = benchmark.stats.stats
    figures.detail(f"fig {case}: cowmap {st.min * 1e9 / columnar.ROWS:.1f}..{st.max * 1e9 / columnar.ROWS:.1f} "
                   f"ns/row over {st.rounds} rounds")
    assert c.check(), f"{case}: cowmap's state differs from the pandas side's"
    del c
    gc.collect()
