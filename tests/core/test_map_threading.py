"""A snapshot may be read from another thread while the owner thread keeps writing.

The reader must see exactly the snapshot's contents, whatever the writer does meanwhile
(puts, removes, in-place mutation through copy-on-write ``get``, transforms, rehashes, other
snapshots). A tiny GIL switch interval makes the two threads interleave inside iterations.
"""

from __future__ import annotations

import random
import sys
import threading

import pytest

from cowmap import CopyOnWriteStateMap

from core_helpers import as_dict


@pytest.fixture
def fast_switching():
    old = sys.getswitchinterval()
    sys.setswitchinterval(1e-6)
    try:
        yield
    finally:
        sys.setswitchinterval(old)


def deep_contents(m: CopyOnWriteStateMap) -> dict:
    """``{(key, ns): (state copy, ts)}`` of the map right now."""
    return {(k, ns): (list(st), m.timestamp(k, ns)) for k, ns, st in list(m)}


def writer_step(m: CopyOnWriteStateMap, rng: random.Random, next_key: list[int]) -> None:
    op = rng.random()
    if op < 0.35:
        m.put(next_key[0], rng.randrange(3), [next_key[0]], rng.randrange(100))  # new key: growth
        next_key[0] += 1
    elif op < 0.55:
        m.remove(rng.randrange(next_key[0]), rng.randrange(3))
    elif op < 0.8:
        st = m.get(rng.randrange(next_key[0]), rng.randrange(3))
        if st is not None:
            st.append("w")  # in place: copy-on-write must keep it out of snapshots
    elif op < 0.95:
        m.transform(rng.randrange(next_key[0]), rng.randrange(3), 1, lambda o, v: (o or []) + [v])
    else:
        m.sweep_expired(rng.randrange(100), 20, 5)


def test_snapshot_read_in_other_thread_while_owner_writes(fast_switching) -> None:
    rng = random.Random(1)
    m = CopyOnWriteStateMap(capacity=4, copier=list)
    next_key = [0]
    for _ in range(3000):
        writer_step(m, rng, next_key)
    for rnd in range(8):
        expected = deep_contents(m)
        s = m.snapshot()
        results: list = []
        errors: list = []

        def reader(s=s, results=results, errors=errors):
            try:
                for _ in range(3):
                    results.append((len(s), as_dict(s.iter_with_timestamps())))
            except BaseException as e:  # noqa: BLE001 - reported by the main thread
                errors.append(e)

        t = threading.Thread(target=reader)
        t.start()
        writes = 0
        while t.is_alive() or writes < 200:
            writer_step(m, rng, next_key)
            writes += 1
        t.join()
        assert not errors, errors
        assert len(results) == 3
        for n, got in results:
            assert n == len(expected)
            assert got == expected, f"round {rnd}: the reader saw a changed snapshot"
        s.release()


def test_several_readers_several_snapshots(fast_switching) -> None:
    rng = random.Random(2)
    m = CopyOnWriteStateMap(capacity=4, copier=list)
    # a big map, so that reading a snapshot takes long enough to overlap many writes
    m.put_many(list(range(-20_000, 0)), 1, [[k] for k in range(-20_000, 0)])
    next_key = [0]
    snaps = []
    for _gen in range(4):
        for _ in range(1500):
            writer_step(m, rng, next_key)
        snaps.append((m.snapshot(), deep_contents(m)))
    outcome: dict[int, object] = {}

    def reader(idx, snap, expected):
        try:
            for _ in range(2):
                assert as_dict(snap.iter_with_timestamps()) == expected
                assert len(snap) == len(expected)
            outcome[idx] = True
        except BaseException as e:  # noqa: BLE001 - the main thread looks at it
            outcome[idx] = e

    threads = [threading.Thread(target=reader, args=(i, s, e)) for i, (s, e) in enumerate(snaps)]
    for t in threads:
        t.start()
    writes = 0
    while any(t.is_alive() for t in threads) or writes < 500:
        writer_step(m, rng, next_key)
        if writes % 300 == 0:
            with m.snapshot():  # other snapshots come and go meanwhile
                pass
        writes += 1
    for t in threads:
        t.join()
    assert outcome == {i: True for i in range(len(snaps))}, outcome
    for s, _ in snaps:
        s.release()
