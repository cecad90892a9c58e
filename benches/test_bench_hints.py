"""Figure 1h: a ``prefetch(key, ns)`` hint hides the cache miss of the lookup it announces.

MapState's single-key paths (``get``, ``put``, the async batches) call ``FlatStateMap.prefetch``
before the work that precedes their lookup (the TTL cleanup step, the clock), so the entry's
miss overlaps that work. The hint is a few loads and prefetch instructions; GCC deems such
a helper pure and deletes its calls unless it is forced inline. That happened once: the hint
compiled to nothing, unnoticed, and figure 7 at 50M entries read 1.9-2.4 instead of 1.6-1.9.
This figure guards against it.

Setup: the "10M" dataset of ``benchlib`` (2M, or 10M with ``COWMAP_BENCH_FULL=1``) put into a
``FlatStateMap`` (state = key, namespace 0), far bigger than the caches. Timed, one round =
200,000 gets of keys in random order; the hinted loop also calls ``prefetch`` on the key four
gets ahead (its cost is included). The plain loop, identical but for the hint, runs round by
round between the hinted rounds (in the untimed setup). Target: hinted / plain <= 0.8 (0.67-0.78
on the dev box with the hint working, 1.05 with it compiled out). The same ratio for
``CopyOnWriteStateMap.prefetch`` (the chained map: the hint reaches only the bucket slot, so it
hides one of two dependent misses) is printed as a detail line, with no target.
"""

from __future__ import annotations

import pytest

from cowmap._core import FlatStateMap

from benchlib import NS, Interleaved, build_cowmap

PROBES = 200_000
AHEAD = 4
ROUNDS = 9
GROUP = "1h. get with prefetch() 4 ahead vs plain get, 200k random keys (ms/round x 5 = ns/get)"


def _loops(m, probe: list[int]):
    pairs = list(zip(probe[AHEAD:], probe))
    get, pf = m.get, m.prefetch

    def plain(pairs=pairs, get=get):
        for _, k in pairs:
            get(k, NS)

    def hinted(pairs=pairs, get=get, pf=pf):
        for a, k in pairs:
            pf(a, NS)
            get(k, NS)

    return plain, hinted, len(pairs)


def _measure(benchmark, m, probe):
    plain, hinted, n = _loops(m, probe)
    other = Interleaved(plain)
    benchmark.group = GROUP
    benchmark.pedantic(hinted, setup=other, rounds=ROUNDS, warmup_rounds=1, iterations=1)
    return benchmark.stats.stats.median * 1e9 / n, other.median() * 1e9 / n


@pytest.fixture(scope="module")
def flat(big):
    m = FlatStateMap()
    put = m.put
    for k in big.keys_list:
        put(k, NS, k)
    assert len(m) == big.n
    return m


def test_flat_prefetch_hint(benchmark, figures, big, flat):
    probe = big.probe_list[:PROBES]
    assert flat.get(probe[0], NS) == probe[0]
    hinted, plain = _measure(benchmark, flat, probe)
    figures.record("flat.get.hinted", hinted)
    figures.record("flat.get.plain", plain)
    figures.detail(f"fig 1h FlatStateMap @{big.label}: hinted {hinted:,.0f} ns/get, plain {plain:,.0f} "
                   f"(x{hinted / plain:.2f})")


def test_chained_prefetch_hint(benchmark, figures, big):
    m = build_cowmap(big)
    probe = big.probe_list[:PROBES]
    hinted, plain = _measure(benchmark, m, probe)
    figures.detail(f"fig 1h CopyOnWriteStateMap @{big.label} (no target): hinted {hinted:,.0f} ns/get, "
                   f"plain {plain:,.0f} (x{hinted / plain:.2f})")
