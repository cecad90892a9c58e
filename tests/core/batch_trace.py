"""A fixed, seeded run of batch operations with every observable outcome written down.

``test_plain_batch_build.py`` runs :func:`trace` in a process on the normal build and in one on
the plain-batch build (``COWMAP_PLAIN_BATCH=ON``), both with the same ``PYTHONHASHSEED``, and
requires the same lines from both: batch results, errors and their messages, timestamps,
iteration order, capacity and rehash progress after every call, snapshot contents, the entry
and page counts of ``memory_stats()``, and the multi-map calls over chained and flat maps.
"""

from __future__ import annotations

import random
from collections.abc import Callable
from typing import Any

import numpy as np

from cowmap._core import (
    CopyOnWriteStateMap,
    FlatStateMap,
    multi_get,
    multi_put,
    multi_replace,
)

EDGE_INTS = [0, 1, -1, -2, 2**31 - 1, -(2**31), 2**61 - 1, 2**61, 2**63 - 1, -(2**63)]


class Collider:
    """A key whose hash is an int key's (``hash(v)``), equal only to Colliders of the same
    ``v``; with ``boom`` its ``__eq__`` raises, which must stop a batch the same way on both
    builds."""

    def __init__(self, v: int, boom: bool = False) -> None:
        self.v = v
        self.boom = boom

    def __hash__(self) -> int:
        return hash(self.v)

    def __eq__(self, other: object) -> bool:
        if self.boom:
            raise ValueError(f"boom {self.v}")
        return isinstance(other, Collider) and other.v == self.v

    def __repr__(self) -> str:
        return f"Collider({self.v})"


def _keys(rng: random.Random, n: int, hi: int) -> list[Any]:
    """n keys, mostly ints below hi, some edge ints, big ints, strings, tuples."""
    out: list[Any] = []
    for _ in range(n):
        r = rng.random()
        if r < 0.85:
            out.append(rng.randrange(-50, hi))
        elif r < 0.9:
            out.append(rng.choice(EDGE_INTS))
        elif r < 0.94:
            out.append(2**70 + rng.randrange(100))
        elif r < 0.97:
            out.append(f"k{rng.randrange(hi)}")
        else:
            out.append((rng.randrange(50), "t"))
    return out


def _as_arg(rng: random.Random, keys: list[Any]) -> Any:
    """The keys as a list, a tuple, or an integer numpy array when they all fit one."""
    r = rng.random()
    if all(type(k) is int and -(2**63) <= k < 2**63 for k in keys):
        if r < 0.5:
            return np.array(keys, dtype=np.int64)
        if r < 0.6 and all(-(2**31) <= k < 2**31 for k in keys):
            return np.array(keys, dtype=np.int32)
        if r < 0.65 and all(0 <= k < 2**16 for k in keys):
            return np.array(keys, dtype=np.uint16)
    return tuple(keys) if r < 0.8 else list(keys)


def _outcome(fn: Callable[[], Any]) -> str:
    try:
        return repr(fn())
    except Exception as e:  # noqa: BLE001  (the error and its message are part of the trace)
        return f"raised {type(e).__name__}: {e}"


def _shape(m: Any) -> str:
    """What a chained map shows of its structure after a call."""
    s = m.memory_stats()
    return (f"len={len(m)} cap={m.capacity} rehashing={m.is_rehashing} version={m.version} "
            f"total={s['total_entries']} free={s['free_entries']} pages={s['pages']} "
            f"pending={s['reclaim_pending']}")


def trace(seed: int = 20240611, rounds: int = 400) -> list[str]:
    """The trace: one line per call (its outcome and the map's shape after it)."""
    rng = random.Random(seed)
    plain = CopyOnWriteStateMap(capacity=4)
    copied = CopyOnWriteStateMap(capacity=64, copier=list)  # list states, copied when shared
    flat = FlatStateMap(copier=list)
    maps: list[Any] = [plain, copied, flat, None]
    snaps: list[Any] = []
    out: list[str] = []
    namespaces = [0, -1, -2, 7, "ns"]
    for rnd in range(rounds):
        op = rng.random()
        m = plain if rng.random() < 0.6 else copied
        name = "plain" if m is plain else "copied"
        ns = rng.choice(namespaces)
        hi = rng.choice([300, 3000, 20000])
        keys = _keys(rng, rng.choice([0, 1, 5, 40, 47, 48, 49, 120, 257, 600, 1500]), hi)
        arg = _as_arg(rng, keys)
        kind = type(arg).__name__ + ("" if not hasattr(arg, "dtype") else str(arg.dtype))
        if op < 0.3:
            ts = rng.choice([rng.randrange(10**6), 2**62])
            if m is copied:
                states = [[rng.randrange(100)] for _ in keys]
            else:
                states = [rng.choice([None, rng.randrange(100), f"s{rng.randrange(9)}"]) for _ in keys]
            if keys and rng.random() < 0.05:
                bad = list(keys)
                bad[rng.randrange(len(bad))] = None  # rejected mid-batch: the keys before it stay written
                arg = bad
            res = _outcome(lambda: m.put_many(arg, ns, states, ts=ts))
        elif op < 0.5:
            res = _outcome(lambda: m.get_many(arg, ns))
            if m is copied and snaps and rng.random() < 0.5:
                # change the states handed out: shared ones must have been copied for us
                got = m.get_many(arg, ns) if not res.startswith("raised") else []
                for g in got:
                    if isinstance(g, list):
                        g.append(-1)
        elif op < 0.6:
            res = _outcome(lambda: m.contains_many(arg, ns).tolist())
        elif op < 0.7:
            res = _outcome(lambda: m.remove_many(arg, ns))
        elif op < 0.76:
            if len(snaps) < 3:
                snaps.append((name, m.snapshot()))
                res = f"snapshot v{snaps[-1][1].version}"
            else:
                sname, s = snaps.pop(rng.randrange(len(snaps)))
                res = f"released {sname} {list(s.iter_with_timestamps())!r}"
                s.release()
        elif op < 0.82:
            # a key whose __eq__ raises, in a bucket an int probe of the same hash reaches
            boom_ns = "boom"
            v = rng.randrange(hi)
            probe = [v - 1, v, v + 1]
            res = " / ".join(_outcome(f) for f in (
                lambda: m.put(Collider(v, boom=True), boom_ns, "b"),
                lambda: m.get_many(np.array(probe, dtype=np.int64), boom_ns),
                lambda: m.put_many(probe, boom_ns, ["x"] * 3),
                lambda: m.contains_many(probe, boom_ns).tolist(),
                lambda: m.remove_many(probe, boom_ns),
                lambda: m.remove_many([Collider(v)], boom_ns),
            ))
        elif op < 0.9:
            n = len(keys)
            kgs = [rng.randrange(len(maps)) for _ in range(n)]
            nss = [rng.choice(namespaces) for _ in range(n)]
            states = [[rng.randrange(100)] for _ in range(n)]
            sub = rng.random()
            now = rng.randrange(2 * 10**6)
            if sub < 0.35:
                kgs = [kg if maps[kg] is not None else 0 for kg in kgs]
                res = _outcome(lambda: multi_put(maps, kgs, keys, nss, states, ts=now))
            elif sub < 0.7:
                ttl = rng.choice([0, 0, 10**5, 10**6])
                res = _outcome(lambda: multi_get(maps, kgs, keys, nss, now=now, ttl=ttl,
                                                 refresh=rng.random() < 0.5))
            else:
                res = _outcome(lambda: multi_replace(maps, kgs, keys, nss, states, ts=now))
            res += f" flat={len(flat)}"
        elif op < 0.95:
            res = _outcome(lambda: m.sweep_expired(rng.randrange(2 * 10**6), 10**5,
                                                   max_entries=rng.choice([5, 100, None])))
        else:
            probe = keys[:20]
            res = _outcome(lambda: [m.get_with_timestamp(k, ns) for k in probe])
        out.append(f"{rnd} {name} {kind} n={len(keys)} ns={ns!r}: {res} | {_shape(m)}")
    for name, m in (("plain", plain), ("copied", copied)):
        out.append(f"end {name} {list(m)!r}")
        with m.snapshot() as s:
            out.append(f"end {name} ts {list(s.iter_with_timestamps())!r}")
    with flat.snapshot() as s:
        out.append(f"end flat {list(s.iter_with_timestamps(insertion_order=True))!r}")
    for _, s in snaps:
        s.release()
    return out
