"""A writer for test_kill: saves checkpoints of a deterministic backend in a loop
until killed. Step i's state is ``state_after(i)``; the step is stored in the
state itself, so whoever restores knows which step a checkpoint holds."""

from __future__ import annotations

import sys

from cowmap.checkpoint import CheckpointStorage
from cowmap.state import KeyedStateBackend, MapStateDescriptor, ValueStateDescriptor

KEYS = 4000


def step(b: KeyedStateBackend, i: int) -> None:
    v = b.get_state(ValueStateDescriptor("v"))
    m = b.get_map_state(MapStateDescriptor("m"))
    timers = b.get_timer_service("t", lambda ts, key, ns, domain: None)
    for k in range(i * 131 % KEYS, KEYS, 3):
        b.set_current_key(k)
        v.update(i * k)
        m.put(i % 5, f"s{i}")
        if k % 7 == i % 7:
            v.clear()
        if k % 5 == i % 5:
            timers.register_event_time_timer(i * 10 + k % 40)
    b.set_current_key("step")
    v.update(i)
    timers.advance_watermark(i * 10 + 5)  # fires (removes) some timers of earlier steps


def state_after(i: int) -> KeyedStateBackend:
    b = KeyedStateBackend(max_parallelism=16)
    for j in range(i + 1):
        step(b, j)
    return b


if __name__ == "__main__":
    storage = CheckpointStorage(sys.argv[1])
    b = KeyedStateBackend(max_parallelism=16)
    print("ready", flush=True)
    i = 0
    while True:
        step(b, i)
        storage.save(b)
        i += 1
