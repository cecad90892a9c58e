"""Figure 1: single-key ``get`` / ``put`` called from Python, one call per operation.

Setup: 1,000,000 unique random int keys, namespace 0, state = the key. The map is built once
(``put_many`` from empty, rehash finished) and so are two dicts holding the same entries:
``{(key, ns): v}`` (what a user keyed by (key, namespace) writes) and ``{key: v}`` (the
lower bound: no namespace at all).

Timed: one round is a Python ``for`` loop over a pre-built list of the 1M keys in random
order, making one call per key (``m.get(k, ns)`` / ``d.get((k, ns))`` / ``d.get(k)``; for
puts ``m.put(k, ns, k)`` / ``d[(k, ns)] = k`` / ``d[k] = k`` on existing keys). Callables and
the namespace are bound as locals, the same way for every contender. The dicts' rounds run
between the map's (in pytest-benchmark's untimed setup), so the three are timed round by round
under the same load (this 2-core machine is shared: the tuple dict's figure moved from 722 to
1,060 ns/op between two runs an hour apart). ns/op = median round time / 1M, so the loop and pytest-benchmark's
per-round overhead are shared and amortised; in pytest-benchmark's table (the map's rounds
only) "ms per round" reads as "ns per op".

Targets: cowmap / dict[(key, ns)] <= 0.8 and cowmap / dict[key] <= 1.5, for get and for put.
"""

from __future__ import annotations

import pytest

from benchlib import NS, Interleaved, build_cowmap, build_key_dict, build_tuple_dict

ROUNDS = 10
GET_GROUP = "1. get hit, 1M keys, random order, 1 call/op (ms/round = ns/op)"
PUT_GROUP = "1. put existing key, 1M keys, random order, 1 call/op (ms/round = ns/op)"


@pytest.fixture(scope="module")
def maps(small):
    m = build_cowmap(small)
    d_tuple = build_tuple_dict(small)
    d_key = build_key_dict(small)
    sample = small.probe_list[:1000]
    assert m.get_many(small.probe[:1000], NS) == sample  # the probes hit
    return m, d_tuple, d_key


def _measure(benchmark, figures, key, loop, n, others):
    """Time ``loop`` as figure ``key``, and each of ``others`` (figure key -> loop) between
    its rounds."""
    timed = {k: Interleaved(other) for k, other in others.items()}

    def setup():
        for t in timed.values():
            t()

    benchmark.pedantic(loop, setup=setup, rounds=ROUNDS, warmup_rounds=1, iterations=1)
    figures.record_median(key, benchmark, n)
    for k, t in timed.items():
        figures.record(k, t.median() * 1e9 / n)


@pytest.mark.benchmark(group=GET_GROUP)
def test_get(benchmark, figures, small, maps):
    m, d_tuple, d_key = maps

    def loop(probe=small.probe_list, get=m.get, ns=NS):
        for k in probe:
            get(k, ns)

    def loop_tuple(probe=small.probe_list, get=d_tuple.get, ns=NS):
        for k in probe:
            get((k, ns))

    def loop_key(probe=small.probe_list, get=d_key.get):
        for k in probe:
            get(k)

    _measure(benchmark, figures, "get.cowmap", loop, small.n, {"get.dict_tuple": loop_tuple, "get.dict_key": loop_key})


@pytest.mark.benchmark(group=PUT_GROUP)
def test_put(benchmark, figures, small, maps):
    m, d_tuple, d_key = maps

    def loop(probe=small.probe_list, put=m.put, ns=NS):
        for k in probe:
            put(k, ns, k)

    def loop_tuple(probe=small.probe_list, d=d_tuple, ns=NS):
        for k in probe:
            d[(k, ns)] = k

    def loop_key(probe=small.probe_list, d=d_key):
        for k in probe:
            d[k] = k

    _measure(benchmark, figures, "put.cowmap", loop, small.n, {"put.dict_tuple": loop_tuple, "put.dict_key": loop_key})
    assert len(m) == len(d_tuple) == len(d_key) == small.n
