"""Unaligned-style checkpoints with an AsyncExecutionController: records holding
a key are finished, records waiting for a busy key are written with the
checkpoint instead, and state + those records replayed equals draining first."""

from __future__ import annotations

import random
import threading
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from cowmap.asyncstate import AsyncExecutionController
from cowmap.checkpoint import CheckpointStorage
from cowmap.state import KeyedStateBackend, KeyGroupRange, ListStateDescriptor, ValueStateDescriptor, key_group_for

from ckpt_helpers import contents

MAX_PAR = 16


def make() -> tuple[KeyedStateBackend, AsyncExecutionController, Any]:
    b = KeyedStateBackend(max_parallelism=MAX_PAR)
    aec = AsyncExecutionController(b, batch_size=50, buffer_timeout_ms=0)
    return b, aec, handler(b)


def handler(b: KeyedStateBackend) -> Any:
    """A record ``(key, n)``: count += n, log n (two dependent requests)."""
    count = b.get_state(ValueStateDescriptor("count", default_value=0))
    log = b.get_list_state(ListStateDescriptor("log"))

    def fn(record: tuple[str, int]) -> None:
        _, n = record
        count.async_value().then_compose(lambda c: count.async_update(c + n)).then_compose(
            lambda _: log.async_add(n)
        )

    return fn


def feed(aec: AsyncExecutionController, fn: Any, records: list[tuple[str, int]]) -> None:
    for r in records:
        aec.process(r[0], fn, r)


def test_waiting_records_are_checkpointed_not_drained(tmp_path: Path) -> None:
    rng = random.Random(5)
    records = [(rng.choice(["hot"] * 8 + ["a", "b", "c"]), i) for i in range(400)]
    b, aec, fn = make()
    feed(aec, fn, records[:300])
    waiting_before = aec.blocking_size
    assert waiting_before > 100  # the hot key's queue
    storage = CheckpointStorage(tmp_path)
    cid = storage.save(b, controller=aec)
    assert storage.manifest(cid)["pending_records"] > 0
    # the records go on after the checkpoint
    feed(aec, fn, records[300:])
    aec.drain()
    full = contents(b)

    # recovery: restore, process the waiting records first, then the input after the checkpoint
    r, raec, rfn = make()
    pending = storage.restore(r)
    assert pending and all(isinstance(p, tuple) and len(p) == 2 for p in pending)
    assert [rec for _, rec in pending] == sorted((rec for _, rec in pending), key=lambda x: x[1])
    for key, rec in pending:
        raec.process(key, rfn, rec)
    feed(raec, rfn, records[300:])
    raec.drain()
    assert contents(r) == full

    # the same as draining everything first
    d, daec, dfn = make()
    feed(daec, dfn, records)
    daec.drain()
    assert contents(d) == full


def test_pending_records_follow_their_key_groups_on_rescale(tmp_path: Path) -> None:
    b, aec, fn = make()
    keys = [f"k{i}" for i in range(30)]
    for i in range(5):
        feed(aec, fn, [(k, i) for k in keys])
    storage = CheckpointStorage(tmp_path)
    storage.save(b, controller=aec)
    aec.drain()
    halves = [KeyGroupRange(0, 7), KeyGroupRange(8, 15)]
    got = []
    for rng in halves:
        part = KeyedStateBackend(max_parallelism=MAX_PAR, key_group_range=rng)
        pend = storage.restore(part)
        assert all(key_group_for(k, MAX_PAR) in rng for k, _ in pend)
        got.extend(pend)
    whole = storage.restore(KeyedStateBackend(max_parallelism=MAX_PAR))
    assert sorted(got) == sorted(whole) and len(whole) == 4 * len(keys)


def test_unpicklable_record_is_named_and_nothing_is_written(tmp_path: Path) -> None:
    b, aec, fn = make()
    count = b.get_state(ValueStateDescriptor("count", default_value=0))
    aec.process("k", fn, ("k", 1))
    aec.process("k", lambda rec: count.async_value(), threading.Lock())  # waits behind the first
    storage = CheckpointStorage(tmp_path)
    with pytest.raises(TypeError, match="record waiting for key 'k' cannot be pickled"):
        storage.save(b, controller=aec)
    assert storage.checkpoints() == []
    aec.drain()  # the controller goes on as before
    b.set_current_key("k")
    assert count.value() == 1


def test_controller_of_another_backend_is_refused(tmp_path: Path) -> None:
    b, _, _ = make()
    _, other, _ = make()
    with pytest.raises(ValueError, match="controller"):
        CheckpointStorage(tmp_path).save(b, controller=other)


def test_new_records_queue_behind_held_back_ones() -> None:
    """While the barrier holds a key's waiting records back, a new record of that
    key does not jump the queue."""
    b, aec, fn = make()
    feed(aec, fn, [("k", 1), ("k", 2)])
    waiting = aec.begin_unaligned_checkpoint()
    assert waiting == [("k", ("k", 2))]
    assert aec.occupied_keys == 0
    feed(aec, fn, [("k", 3)])
    aec.end_unaligned_checkpoint()
    aec.drain()
    b.set_current_key("k")
    assert b.get_list_state(ListStateDescriptor("log")).get() == [1, 2, 3]


@settings(max_examples=60, deadline=None)
@given(
    records=st.lists(st.tuples(st.sampled_from(["a", "b", "c", "hot"]), st.integers(0, 9)), max_size=120),
    at=st.integers(0, 120),
    batch=st.integers(1, 40),
)
def test_recovery_from_an_unaligned_checkpoint_equals_draining(
    tmp_path_factory: Any, records: list[tuple[str, int]], at: int, batch: int
) -> None:
    """Whatever the records, the batch size and where the checkpoint falls:
    restore + the waiting records + the input after the checkpoint == all input
    processed with no checkpoint."""
    records = [(k, n * 1000 + i) for i, (k, n) in enumerate(records)]  # distinct, ordered values
    at = min(at, len(records))

    def run(aec: AsyncExecutionController, fn: Any, rs: list[tuple[str, int]]) -> None:
        for r in rs:
            aec.process(r[0], fn, r)

    b = KeyedStateBackend(max_parallelism=MAX_PAR)
    aec = AsyncExecutionController(b, batch_size=batch, buffer_timeout_ms=0)
    fn = handler(b)
    run(aec, fn, records[:at])
    storage = CheckpointStorage(tmp_path_factory.mktemp("ck"))
    storage.save(b, controller=aec)
    run(aec, fn, records[at:])
    aec.drain()

    r = KeyedStateBackend(max_parallelism=MAX_PAR)
    raec = AsyncExecutionController(r, batch_size=batch, buffer_timeout_ms=0)
    rfn = handler(r)
    pending = storage.restore(r)
    run(raec, rfn, [rec for _, rec in pending])
    run(raec, rfn, records[at:])
    raec.drain()

    d = KeyedStateBackend(max_parallelism=MAX_PAR)
    daec = AsyncExecutionController(d, batch_size=batch, buffer_timeout_ms=0)
    run(daec, handler(d), records)
    daec.drain()
    assert contents(r) == contents(d) == contents(b)
