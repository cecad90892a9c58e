"""Seeded random modifications with copy-on-write isolation checks.

Modelled on Flink's ``CopyOnWriteStateMapTest.testRandomModificationsAndCopyOnWriteIsolation``:
list states with a copier, a transformation that appends in place and hands back the *same*
list (to catch copy-on-write mistakes), in-place mutation of states returned by ``get``,
``put_and_get_old`` and ``remove_and_get_old``, updates/removes through an incremental visitor,
and snapshots whose expected contents are deep copies of the reference model taken at the same
moment, checked again and again while the map keeps changing. Several snapshot versions are
live at once and released at random.
"""

from __future__ import annotations

import random

import numpy as np
import pytest

from cowmap import CopyOnWriteStateMap

from core_helpers import map_contents, snapshot_contents

pytestmark = pytest.mark.slow


def append_in_place(previous, value):
    """Flink's test transformation: mutate and return the very same list."""
    if previous is None:
        previous = []
    previous.append(value)
    return previous


def visitor_step(visitor, m, ref, update: bool, remove: bool) -> None:
    """Flink's ``testStateIteratorWithUpdate``: one chain from the visitor, checked and changed."""
    entries = visitor.next_entries()
    if entries is None:
        return
    for key, ns, state in entries:
        ck = (key, ns)
        assert state == ref[ck], (ck, state, ref.get(ck))
        if update:
            new_state = list(state)
            if new_state:
                del new_state[0]
            visitor.update(key, ns, new_state)
            ref[ck] = list(new_state)
            assert m.get(key, ns) == new_state
        if remove:
            visitor.remove(key, ns)
            del ref[ck]


def run_random_cow(
    n_ops: int,
    seed: int,
    capacity: int,
    key_space,  # op index -> number of distinct keys at that point
    n_namespaces: int = 4,
    check_every: int = 500,
    max_live: int = 4,
) -> bool:
    """Run the random test; returns whether a rehash ran while a snapshot was live."""
    rng = random.Random(seed)
    nrng = np.random.default_rng(seed)
    m = CopyOnWriteStateMap(capacity=capacity, copier=list)
    ref: dict[tuple[int, int], list] = {}
    live: list[tuple] = []  # (snapshot, deep copy of ref at that moment)
    visitor = m.incremental_visitor(5)
    val = 0
    saw_rehash_with_snapshot = False

    chunk = 100_000
    for base in range(0, n_ops, chunk):
        n = min(chunk, n_ops - base)
        # all random draws for the chunk at once (much faster than per-op calls)
        ops = nrng.integers(0, 10, n).tolist()
        key_draws = nrng.random(n).tolist()
        namespaces = nrng.integers(0, n_namespaces, n).tolist()
        coins = nrng.integers(0, 2, n).tolist()
        update_values = nrng.integers(0, 1000, n).tolist()
        for j in range(n):
            i = base + j
            key = int(key_draws[j] * key_space(i))
            ns = namespaces[j]
            ck = (key, ns)
            op = ops[j]
            state = None
            ref_state = None
            if op <= 1:
                state = m.get(key, ns)
                ref_state = ref.get(ck)
                if state is None:
                    assert ref_state is None
                    state = []
                    m.put(key, ns, state)
                    ref_state = []
                    ref[ck] = ref_state
            elif op == 2:
                m.put(key, ns, [])
                ref[ck] = []
            elif op == 3:
                state = m.put_and_get_old(key, ns, [])
                ref_state = ref.get(ck)
                ref[ck] = []
            elif op == 4:
                m.remove(key, ns)
                ref.pop(ck, None)
            elif op == 5:
                state = m.remove_and_get_old(key, ns)
                ref_state = ref.pop(ck, None)
            elif op == 6:
                value = update_values[j]
                m.transform(key, ns, value, append_in_place)
                ref[ck] = append_in_place(ref.pop(ck, None), value)
            else:  # 7: read, 8: update, 9: remove through the visitor
                if not visitor.has_next():
                    visitor = m.incremental_visitor(5)
                if visitor.has_next():
                    visitor_step(visitor, m, ref, op == 8, op == 9)

            assert len(m) == len(ref)
            if state is not None:
                assert ref_state is not None
                # mutate the returned state in place (it must not reach any snapshot)
                if coins[j] and state:
                    state.pop()
                    ref_state.pop()
                else:
                    state.append(val)
                    ref_state.append(val)
                    val += 1
            assert state == ref_state

            if live and m.is_rehashing:
                saw_rehash_with_snapshot = True

            if i > 0 and i % check_every == 0:
                # deep-check every live snapshot against its reference copy
                for snap, expected in live:
                    assert len(snap) == len(expected)
                    assert snapshot_contents(snap) == expected, f"snapshot v{snap.version} changed at op {i}"
                if i % (2 * check_every) == 0:
                    # draw and release another snapshot while holding the others
                    with m.snapshot() as transient:
                        assert len(transient) == len(ref)
                if live and (i % (5 * check_every) == 0 or len(live) >= max_live):
                    snap, _ = live.pop(rng.randrange(len(live)))  # not always the oldest
                    snap.release()
                if len(live) < max_live and rng.random() < 0.6:
                    live.append((m.snapshot(), {k: list(v) for k, v in ref.items()}))
                assert m.snapshot_versions == sorted(s.version for s, _ in live)

    for snap, expected in live:
        assert snapshot_contents(snap) == expected
        snap.release()
    assert m.snapshot_versions == []
    assert map_contents(m) == ref
    return saw_rehash_with_snapshot


def test_random_modifications_and_copy_on_write_isolation() -> None:
    """3,000,000 operations on keys [0, 20) x namespaces [0, 4), as in Flink's test."""
    run_random_cow(n_ops=3_000_000, seed=42, capacity=4, key_space=lambda i: 20)


def test_random_modifications_while_growing() -> None:
    """A key space that keeps growing makes the map rehash again and again with snapshots live."""
    saw = run_random_cow(
        n_ops=300_000,
        seed=7,
        capacity=4,
        key_space=lambda i: 20 + i // 50,
        check_every=5_000,
    )
    assert saw, "the scenario should rehash while snapshots are live"
