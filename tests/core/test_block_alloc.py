"""The core's block allocator (``hugealloc.h``): entry chunks and bucket pages come
from 2 MiB-aligned regions offered to the kernel for huge pages.

What must hold: every block goes back when its map goes (through snapshots, retired
pages and rehash too), tracemalloc traces the blocks as it traces ``PyMem_Raw*``
memory, freed blocks are reused, big freed blocks give their memory back to the OS
at once, and the regions are unmapped once no block is in use. Process-wide
figures are checked in a fresh interpreter, where no other map holds blocks.
"""

from __future__ import annotations

import gc
import os
import subprocess
import sys
import textwrap
import tracemalloc

import numpy as np

from cowmap import CopyOnWriteStateMap
from cowmap._core import block_stats

ENTRY_BYTES = 48  # sizeof(cm_entry)


def _fill(m: CopyOnWriteStateMap, n: int, start: int = 0) -> None:
    m.put_many(np.arange(start, start + n, dtype=np.int64), 0, [None] * n)


def _run(code: str, env: dict[str, str] | None = None) -> str:
    out = subprocess.run([sys.executable, "-c", textwrap.dedent(code)], capture_output=True, text=True, timeout=300,
                         env=None if env is None else {**os.environ, **env})
    assert out.returncode == 0, out.stderr
    return out.stdout


def test_blocks_return_when_maps_go_through_snapshots_and_rehash() -> None:
    gc.collect()
    before = block_stats()["blocks"]
    m = CopyOnWriteStateMap()
    snaps = []
    for r in range(6):  # grows through several rehashes with snapshots pinning pages and entries
        _fill(m, 20_000, start=r * 10_000)
        snaps.append(m.snapshot())
        m.remove_many(np.arange(r * 10_000, r * 10_000 + 5_000, dtype=np.int64), 0)
    assert block_stats()["blocks"] > before
    for snap in snaps[::2]:
        snap.release()
    del snaps, snap  # a released snapshot still refers to its map
    assert block_stats()["blocks"] > before  # the map still holds its own
    del m
    gc.collect()
    assert block_stats()["blocks"] == before


def test_tracemalloc_traces_the_blocks() -> None:
    n = 200_000
    gc.collect()
    tracemalloc.start()
    try:
        base = tracemalloc.get_traced_memory()[0]
        m = CopyOnWriteStateMap()
        _fill(m, n)
        grown = tracemalloc.get_traced_memory()[0] - base
        # the states are one shared None: what is traced is the map's own memory
        assert grown >= n * ENTRY_BYTES
        assert grown >= m.memory_stats()["bytes"] * 0.9
        del m
        gc.collect()
        assert tracemalloc.get_traced_memory()[0] - base < 64 * 1024
    finally:
        tracemalloc.stop()


def test_freed_blocks_are_reused() -> None:
    m = CopyOnWriteStateMap()
    _fill(m, 300_000)
    del m
    mapped = block_stats()["mapped"]
    for _ in range(5):
        m = CopyOnWriteStateMap()
        _fill(m, 300_000)
        del m
    assert block_stats()["mapped"] <= mapped


def test_regions_unmapped_once_no_block_is_in_use() -> None:
    out = _run(
        """
        import numpy as np
        from cowmap import CopyOnWriteStateMap
        from cowmap._core import block_stats
        assert block_stats()["mapped"] == 0 and block_stats()["blocks"] == 0, block_stats()
        maps = []
        for i in range(3):
            m = CopyOnWriteStateMap()
            m.put_many(np.arange(400_000, dtype=np.int64), i, [None] * 400_000)
            maps.append(m)
        print(block_stats()["mapped"])
        del maps, m
        s = block_stats()
        print(s["mapped"], s["blocks"])
        """
    )
    peak, after = out.split("\n", 1)
    mapped, blocks = map(int, after.split())
    assert int(peak) >= 3 * 400_000 * ENTRY_BYTES
    assert blocks == 0
    assert mapped <= 32 << 20  # one region kept for the next map


def test_a_dropped_map_gives_its_memory_back_while_others_live() -> None:
    """A small map stays alive throughout: the big map's regions still go (they hold
    none of the small map's blocks), and its memory leaves the process, rounds after
    rounds."""
    out = _run(
        """
        import numpy as np
        from cowmap import CopyOnWriteStateMap
        from cowmap._core import block_stats
        def rss():
            with open("/proc/self/statm") as f:
                return int(f.read().split()[1]) * 4096
        keep = CopyOnWriteStateMap()
        keep.put(1, 0, None)
        n = 2_000_000
        keys, states = np.arange(n, dtype=np.int64), [None] * n  # made once: freed temporaries
        base_rss, base_mapped = rss(), block_stats()["mapped"]  # may stay in the C heap
        for r in range(3):
            m = CopyOnWriteStateMap()
            m.put_many(keys, 0, states)
            held = m.memory_stats()["bytes"]
            full = rss()
            del m
            print(full - base_rss, rss() - base_rss, held, block_stats()["mapped"] - base_mapped)
        """
    )
    for line in out.strip().splitlines():
        grown, left, held, mapped_left = map(int, line.split())
        assert grown >= held * 0.9  # the map's memory was resident
        # entry chunks (85% of held) go back at once; 16 KiB bucket pages only with their
        # region, and two regions stay: the live map's, and the one blocks are cut from
        assert left <= held * 0.5, (left, held)
        assert mapped_left <= 32 << 20


def test_no_region_outlives_its_blocks_over_random_lifetimes() -> None:
    """Maps of mixed sizes made and dropped in a seeded random order: whenever no map
    is left, at most the one region new blocks come from is still mapped."""
    out = _run(
        """
        import random
        import numpy as np
        from cowmap import CopyOnWriteStateMap
        from cowmap._core import block_stats
        rng = random.Random(7)
        live, worst = [], 0
        for step in range(60):
            if live and rng.random() < 0.45:
                live.pop(rng.randrange(len(live)))
            else:
                n = rng.choice([100, 5_000, 60_000, 300_000, 700_000])
                m = CopyOnWriteStateMap()
                m.put_many(np.arange(n, dtype=np.int64), step, [None] * n)
                live.append(m)
                del m
            if rng.random() < 0.2:
                live.clear()
                s = block_stats()
                worst = max(worst, s["mapped"] + (s["blocks"] << 40))
        live.clear()
        s = block_stats()
        print(max(worst, s["mapped"] + (s["blocks"] << 40)))
        """
    )
    assert int(out) <= 32 << 20  # no block in use, one region at most


_GROW = """
    import os, time
    import numpy as np
    from cowmap import CopyOnWriteStateMap
    from cowmap._core import block_stats
    def wait_spare():
        t = time.monotonic() + 60
        while not block_stats()["spare"] and time.monotonic() < t:
            time.sleep(0.01)
        return block_stats()["spare"]
    def huge_kib():
        with open("/proc/self/smaps_rollup") as f:
            return int(f.read().split("AnonHugePages:")[1].split()[0])
    m = CopyOnWriteStateMap()
    n = 0
    def grow(k):
        global n
        m.put_many(np.arange(n, n + k, dtype=np.int64), 0, list(range(n, n + k)))
        n += k
"""


def _thp_offered() -> bool:
    """Whether this kernel grants transparent huge pages to a region that asks."""
    try:
        with open("/sys/kernel/mm/transparent_hugepage/enabled") as f:
            mode = f.read()
    except OSError:
        return False
    return "[always]" in mode or "[madvise]" in mode


def test_huge_page_policy_comes_from_the_environment() -> None:
    code = """
        import numpy as np
        from cowmap import CopyOnWriteStateMap
        from cowmap._core import block_stats
        m = CopyOnWriteStateMap()
        m.put_many(np.arange(1_500_000, dtype=np.int64), 0, list(range(1_500_000)))  # > 2 regions
        assert m.get(1_499_999, 0) == 1_499_999
        s = block_stats()
        print(s["huge_pages"], s["prefaulted"] + s["spare"] > 0)
        """
    unset = {k: v for k, v in os.environ.items() if k != "COWMAP_HUGE_PAGES"}
    out = subprocess.run([sys.executable, "-c", textwrap.dedent(code)], capture_output=True, text=True, timeout=300,
                         env=unset)
    assert out.returncode == 0, out.stderr
    assert out.stdout.split()[0] == "background"
    assert _run(code, {"COWMAP_HUGE_PAGES": "background"}).split()[0] == "background"
    # no prefault thread unless in the background policy
    assert _run(code, {"COWMAP_HUGE_PAGES": "0"}).split() == ["off", "False"]
    assert _run(code, {"COWMAP_HUGE_PAGES": "1"}).split() == ["always", "False"]
    assert _run(code, {"COWMAP_HUGE_PAGES": "always"}).split() == ["always", "False"]


def test_regions_are_faulted_in_ahead_and_used() -> None:
    """Past two regions a spare region is faulted in by another thread; the next
    region the maps need is that one, and its contents are right."""
    out = _run(
        _GROW
        + """
    grow(300_000)
    assert block_stats()["spare"] == 0 and block_stats()["prefaulted"] == 0  # one region: none ahead
    while block_stats()["mapped"] < 2 * (32 << 20):
        grow(100_000)
    assert wait_spare() == 32 << 20, block_stats()
    mapped = block_stats()["mapped"]
    while block_stats()["mapped"] == mapped:
        grow(50_000)
    s = block_stats()
    assert s["prefaulted"] == 1, s
    keys = np.arange(n, dtype=np.int64)
    assert m.get_many(keys, 0) == list(range(n))
    print(huge_kib())
    del m
    s = block_stats()
    assert s["blocks"] == 0 and s["spare"] == 0, s  # nothing in use: nothing kept ahead
    """,
        {"COWMAP_HUGE_PAGES": "background"},
    )
    if _thp_offered():
        assert int(out) >= 2048  # the region faulted in ahead holds huge pages


def test_a_forked_child_drops_the_spare_and_keeps_going() -> None:
    """fork() copies no thread: the child must neither wait for the prefault thread
    nor use a region shared copy-on-write with its parent."""
    out = _run(
        _GROW
        + """
    while block_stats()["mapped"] < 2 * (32 << 20):
        grow(100_000)
    assert wait_spare() == 32 << 20, block_stats()
    pid = os.fork()
    if pid == 0:
        code = 1
        try:
            assert block_stats()["spare"] == 0, block_stats()
            before = block_stats()["mapped"]
            while block_stats()["mapped"] < before + 3 * (32 << 20):
                grow(200_000)
            assert m.get_many(np.arange(n, dtype=np.int64), 0) == list(range(n))
            code = 0
        finally:
            os._exit(code)
    _, status = os.waitpid(pid, 0)
    print(os.waitstatus_to_exitcode(status), block_stats()["spare"])
    """,
        {"COWMAP_HUGE_PAGES": "background"},
    )
    assert out.split() == ["0", str(32 << 20)]  # the child went on; the parent kept its spare


def test_freed_chunks_leave_resident_memory_in_a_region_that_stays() -> None:
    """A map that fits in the region new blocks are cut from (which stays mapped):
    dropping it gives its entry chunks' pages back at once."""
    out = _run(
        """
        import numpy as np
        from cowmap import CopyOnWriteStateMap
        from cowmap._core import block_stats
        def rss():
            with open("/proc/self/statm") as f:
                return int(f.read().split()[1]) * 4096
        n = 250_000
        keys, states = np.arange(n, dtype=np.int64), [None] * n
        m = CopyOnWriteStateMap()
        m.put_many(keys, 0, states)
        assert block_stats()["mapped"] == 32 << 20  # one region: it stays
        held = m.memory_stats()["bytes"]
        full = rss()
        del m
        print(held, full - rss())
        """
    )
    held, dropped = map(int, out.split())
    assert dropped >= held * 0.7, (dropped, held)
