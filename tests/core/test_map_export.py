"""``snapshot_columns``: a snapshot read out whole equals iterating it, whatever
the map did before and after (rehash, removals, copy-on-write, later writes)."""

from __future__ import annotations

import gc
import tracemalloc
from typing import Any

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from cowmap import CopyOnWriteStateMap
from cowmap._core import NO_TIMESTAMP, ColumnReader, snapshot_columns

NS = "ns"
KEYS = st.one_of(st.integers(-(2**64), 2**64), st.text(max_size=3))
STATES = st.one_of(st.integers(-(2**64), 2**64), st.floats(allow_nan=False), st.text(max_size=2), st.none())
OPS = st.lists(
    st.tuples(st.sampled_from(["put", "remove", "snap", "release"]), KEYS, st.sampled_from([NS, NS, "other"]),
              STATES, st.integers(0, 2**40)),
    max_size=200,
)


def rows(cols: tuple[Any, Any, Any, Any]) -> list[tuple[Any, Any, Any, int]]:
    keys, nss, states, ts = cols
    n = len(ts)
    keys = keys.tolist() if isinstance(keys, np.ndarray) else keys
    nss = [NS] * n if nss is None else nss
    states = states.tolist() if isinstance(states, np.ndarray) else states
    assert len(keys) == len(states) == len(nss) == n
    return list(zip(keys, nss, states, ts.tolist()))


def canon(rs: list[tuple[Any, ...]]) -> list[tuple[Any, ...]]:
    return sorted(rs, key=repr)


def read_between(s: Any, m: Any, after: list[tuple], rows_a_call: int, **kw: Any) -> Any:
    """Read snapshot ``s`` of map ``m`` out a few rows a call, with ``m`` written
    (``after``'s puts and removes) before each call and after the last."""
    r = ColumnReader(s, NS, **kw)
    ops = iter(after)

    def write() -> None:
        for op, k, ns, st_, ts in ops:
            if op == "put":
                m.put(k, ns, st_, ts)
                return
            if op == "remove":
                m.remove(k, ns)
                return

    write()
    while not r.read(rows_a_call):
        write()
    for _ in after:
        write()
    return r.columns()


@settings(max_examples=150, deadline=None)
@given(ops=OPS, after=OPS, rows_a_call=st.sampled_from([1, 3, 1000]))
def test_columns_equal_iteration(ops: list[tuple], after: list[tuple], rows_a_call: int) -> None:
    """Read whole, or a few rows a call with writes in between (as a checkpoint
    on another thread does): the snapshot's rows, whatever is written after it."""
    m = CopyOnWriteStateMap(capacity=4)
    snaps = []
    for op, k, ns, st_, ts in ops:
        if op == "put":
            m.put(k, ns, st_, ts)
        elif op == "remove":
            m.remove(k, ns)
        elif op == "snap":
            snaps.append(m.snapshot())
        elif snaps:
            snaps.pop(0).release()
    s = m.snapshot()
    expected = canon(list(s.iter_with_timestamps()))
    cols = read_between(s, m, after, rows_a_call)  # writes after the snapshot are not seen
    assert canon(rows(cols)) == expected
    assert canon(rows(snapshot_columns(s, NS))) == expected
    keys, nss, states, _ = cols
    if all(type(k) is int and -(2**63) <= k < 2**63 for k, *_ in expected):
        assert isinstance(keys, np.ndarray)
    if all(r[1] is NS for r in expected):
        assert nss is None
    if expected and all(type(r[2]) is int and -(2**63) <= r[2] < 2**63 for r in expected):
        assert states.dtype == np.int64
    if expected and all(type(r[2]) is float for r in expected):
        assert states.dtype == np.float64
    s.release()
    for x in snaps:
        x.release()


def test_storage_order_and_rehash_midway() -> None:
    m = CopyOnWriteStateMap(capacity=4)
    for i in range(5000):
        m.put(i, NS, i * 2)
    while not m.is_rehashing:
        i += 1
        m.put(i, NS, i * 2)
    s = m.snapshot()
    keys, nss, states, ts = snapshot_columns(s, NS)
    assert nss is None and (states == keys * 2).all() and (ts == NO_TIMESTAMP).all()
    assert sorted(keys.tolist()) == list(range(i + 1))
    s.release()
    with pytest.raises(RuntimeError, match="released"):
        snapshot_columns(s, NS)


def test_no_leak_over_repeated_exports() -> None:
    m = CopyOnWriteStateMap()
    for i in range(2000):
        m.put(f"k{i}", (i,), [i])
    for _ in range(3):
        with m.snapshot() as s:
            snapshot_columns(s, NS)
    gc.collect()
    tracemalloc.start()
    before = tracemalloc.get_traced_memory()[0]
    for _ in range(20):
        with m.snapshot() as s:
            cols = snapshot_columns(s, NS)
            del cols
    gc.collect()
    grown = tracemalloc.get_traced_memory()[0] - before
    tracemalloc.stop()
    assert grown < 64 * 1024, f"{grown} bytes kept over 20 exports"


@settings(max_examples=100, deadline=None)
@given(ops=OPS, after=OPS, rows_a_call=st.sampled_from([1, 3, 1000]))
def test_flat_columns_equal_insertion_order_iteration(ops: list[tuple], after: list[tuple], rows_a_call: int) -> None:
    """A flat map's snapshot comes out in insertion order, exactly as iterating it
    with ``insertion_order=True``; namespaces that are all int64 come as an array."""
    from cowmap._core import FlatStateMap

    m = FlatStateMap()
    for op, k, ns, st_, ts in ops:
        ns = hash(ns) % 1000 if ns == "other" else ns  # int namespaces too
        if op == "put":
            m.put(k, ns, st_, ts)
        elif op == "remove":
            m.remove(k, ns)
    s = m.snapshot()
    expected = list(s.iter_with_timestamps(True))
    keys, nss, states, ts = read_between(s, m, after, rows_a_call)
    n = len(ts)
    ns_list = [NS] * n if nss is None else (nss.tolist() if isinstance(nss, np.ndarray) else nss)
    if expected and all(type(r[1]) is int for r in expected):
        assert isinstance(nss, np.ndarray)
    got = list(zip(rows((keys, None, states, ts)), ns_list))
    assert [(k, ns, st_, t) for (k, _, st_, t), ns in got] == expected
    s.release()


def test_without_timestamps_the_other_columns_are_the_same() -> None:
    m = CopyOnWriteStateMap()
    for i in range(1_000):
        m.put(i, NS, i * 3, i)
    with m.snapshot() as s:
        keys, nss, states, ts = snapshot_columns(s, NS)
        keys2, nss2, states2, ts2 = snapshot_columns(s, NS, timestamps=False)
    assert ts2 is None and ts is not None
    assert keys.tolist() == keys2.tolist() and states.tolist() == states2.tolist() and nss is nss2 is None


def read_with_another_thread(s: Any, between: Any) -> Any:
    """Read snapshot ``s`` out 1,000 rows a call, with ``between()`` run on
    another thread after each call (a handshake: it runs exactly then, as
    a thread that takes the GIL between two calls would)."""
    import threading

    turn, done, stop = threading.Event(), threading.Event(), threading.Event()
    errors: list[BaseException] = []

    def other() -> None:
        while turn.wait() and not stop.is_set():
            turn.clear()
            try:
                between()
            except BaseException as e:  # noqa: BLE001 - reported by the reader
                errors.append(e)
            done.set()

    t = threading.Thread(target=other)
    t.start()
    try:
        r = ColumnReader(s, NS, False)
        while not r.read(1000):
            turn.set()
            done.wait()
            done.clear()
            assert not errors, errors
        return r.columns()
    finally:
        stop.set()
        turn.set()
        t.join()


@pytest.mark.parametrize("kind", ["chained", "flat"])
@pytest.mark.parametrize("state", [int, str])
def test_writes_on_another_thread_during_a_read_out_do_not_reach_it(kind: str, state: type) -> None:
    """Between two calls of a read-out another thread writes the map (entries
    overwritten from the end, so those still to be read, and new ones
    added): the columns hold the snapshot's contents."""
    from cowmap._core import FlatStateMap

    n = 20_000
    keys = np.arange(n, dtype=np.int64)
    m: Any = CopyOnWriteStateMap() if kind == "chained" else FlatStateMap()
    for k in range(n):
        m.put(k, NS, state(k * 3))
    writes = iter(range(1, 10**6))

    def write() -> None:
        r = next(writes)
        for k in range(n - 1, 0, -7):
            m.put(k, NS, state(-r))
        m.put(n + r, NS, state(r))

    with m.snapshot() as s:
        got_keys, nss, states, _ = read_with_another_thread(s, write)
        order = np.argsort(got_keys)
        assert nss is None
        assert np.array_equal(np.asarray(got_keys)[order], keys)
        assert [state(x) for x in np.asarray(states)[order].tolist()] == [state(x) for x in keys * 3]
    assert m.get(n - 1, NS) == state(-(n // 1000 - 1))  # the writes were made: one per call but the last


@pytest.mark.parametrize("kind", ["chained", "flat"])
def test_a_snapshot_released_by_another_thread_during_its_read_out(kind: str) -> None:
    """Released between two calls of its read-out: RuntimeError at the next
    call, before a freed entry is read."""
    from cowmap._core import FlatStateMap

    n = 20_000
    m: Any = CopyOnWriteStateMap() if kind == "chained" else FlatStateMap()
    for k in range(n):
        m.put(k, NS, k)
    s = m.snapshot()
    for k in range(0, n, 3):  # the snapshot alone holds these entries: its release frees them
        m.put(k, NS, -k)
    with pytest.raises(RuntimeError, match="released while it was being read out"):
        read_with_another_thread(s, s.release)
    assert s.released


def test_a_read_out_without_the_gil_sees_the_snapshot_while_another_thread_writes() -> None:
    """A chained snapshot's entries are found and read without the GIL (whole,
    or its changes since the previous cut): another thread writes the map all
    the while (overwrites, so entries are copied; inserts, so the map's chunk
    table grows; removals), and every read-out still holds exactly the
    snapshot's contents."""
    import threading

    from cowmap._core import snapshot_changes_many, snapshot_columns_many

    n = 60_000
    m = CopyOnWriteStateMap()
    m.snapshot(cut=True).release()  # the first cut: the next one knows its changes, every entry
    for k in range(n):
        m.put(k, NS, k * 3)
    stop = threading.Event()
    wrote = [0]

    def write() -> None:
        r = 0
        while not stop.is_set():
            r += 1
            for k in range(r % 7, n, 97):
                m.put(k, NS, -r)
            for k in range(200):
                m.put(n + r * 200 + k, NS, r)
            m.remove(r % n, NS)
            wrote[0] = r

    with m.snapshot(cut=True) as s:
        t = threading.Thread(target=write)
        t.start()
        try:
            for i in range(30):
                read = (snapshot_columns, lambda s, ns: snapshot_columns_many([s], ns)[:4],
                        lambda s, ns: snapshot_changes_many([s], ns)[:4])[i % 3]
                keys, nss, states, _ = read(s, NS)
                order = np.argsort(keys)
                assert nss is None
                assert np.array_equal(np.asarray(keys)[order], np.arange(n))
                assert np.array_equal(np.asarray(states)[order], np.arange(n) * 3)
        finally:
            stop.set()
            t.join()
    assert wrote[0] > 0 and m.memory_stats()["snapshots"] == 0


def test_a_release_while_another_thread_reads_without_the_gil_waits_for_that_read() -> None:
    """Released by one thread while another reads it out: the read gives the
    snapshot's contents or RuntimeError, never freed memory, and the map lets
    go of the snapshot once the read is through."""
    import threading

    n = 200_000
    m = CopyOnWriteStateMap()
    for k in range(n):
        m.put(k, NS, k)
    for _ in range(5):
        s = m.snapshot()
        for k in range(0, n, 3):  # the snapshot alone holds these entries: its release frees them
            m.put(k, NS, -k)
        results: list[Any] = []
        started = threading.Event()

        def read(s: Any = s, results: list[Any] = results, started: threading.Event = started) -> None:
            started.set()
            try:
                while True:
                    keys, _, states, _ = snapshot_columns(s, NS)
                    results.append(np.array_equal(np.sort(np.asarray(states)), np.arange(n)))
            except RuntimeError as e:
                results.append(str(e))

        t = threading.Thread(target=read)
        t.start()
        started.wait()
        s.release()
        t.join()
        assert all(r is True for r in results[:-1])
        assert "released" in results[-1]
        assert s.released and m.memory_stats()["snapshots"] == 0
        for k in range(0, n, 3):
            m.put(k, NS, k)
