"""Where a query's state lives: layouts appended per number of partitions, and
the choice of the checkpoints that hold version ``b`` of a key-group range
(the newest layout holding it whole), without Spark."""

from __future__ import annotations

from pathlib import Path

import pytest

from cowmap.spark.layout import Location
from cowmap.state import KeyedStateBackend, KeyGroupRange

HASH = "spark-murmur3-42:bigint"


def commit(loc: Location, layout, version: int, partitions=None) -> None:
    """Version ``version`` committed by the given partitions of ``layout`` (all by default)."""
    for p in range(layout.num_partitions) if partitions is None else partitions:
        r = layout.range_of(p)
        loc.storage(layout, r).save(KeyedStateBackend(layout.max_parallelism, r), checkpoint_id=version)


def test_a_layout_per_number_of_partitions_in_order(tmp_path: Path) -> None:
    loc = Location(str(tmp_path), "op")
    a = loc.use(2, 16, HASH)
    assert loc.use(2, 16, HASH) == a  # the same number again: the same layout
    b = loc.use(3, 16, HASH)
    c = loc.use(2, 16, HASH)
    assert [x.id for x in (a, b, c)] == [1, 2, 3]
    assert Location(str(tmp_path), "op").layouts == [a, b, c]  # recorded, read back
    assert [(r.start, r.end) for r in b.ranges()] == [(0, 5), (6, 10), (11, 15)]
    with pytest.raises(ValueError, match="max_parallelism=16, not 32"):
        loc.use(2, 32, HASH)
    with pytest.raises(ValueError, match="key columns' types changed"):
        loc.use(2, 16, "spark-murmur3-42:string")


def test_a_version_comes_from_the_newest_layout_that_holds_it_whole(tmp_path: Path) -> None:
    loc = Location(str(tmp_path), "op")
    two = loc.use(2, 16, HASH)
    commit(loc, two, 1)
    commit(loc, two, 2)
    three = loc.use(3, 16, HASH)
    mine = three.range_of(1)  # 6..10: the old ranges 0..7 and 8..15
    assert [s.uri for s in loc.sources(three, mine, 2)] == [loc.storage(two, r).uri for r in two.ranges()]
    commit(loc, three, 2, partitions=[0, 1])  # a run that failed half-way through: partition 2 has no version 2
    assert [s.uri for s in loc.sources(three, KeyGroupRange(11, 15), 2)] == [loc.storage(two, two.range_of(1)).uri]
    assert [s.uri for s in loc.sources(three, mine, 2)] == [loc.storage(three, mine).uri]
    assert loc.latest_version() == 2  # the two-partition layout holds version 2 whole
    with pytest.raises(FileNotFoundError, match="no state of version 3"):
        loc.sources(three, mine, 3)


def test_a_range_more_than_a_version_ahead_of_the_others_is_named(tmp_path: Path) -> None:
    """A run that failed part way leaves ranges one version ahead, and the next batch run redoes
    that version. Two ahead means versions of the others went missing (a range's directory
    deleted): a run from the newest whole version would start them over without a word."""
    import shutil

    loc = Location(str(tmp_path), "op")
    two = loc.use(2, 16, HASH)
    for v in (1, 2, 3):
        commit(loc, two, v)
    commit(loc, two, 4, partitions=[1])  # a run that failed part way
    assert loc.latest_version() == 3
    shutil.rmtree(tmp_path / "op" / "L000001" / "kg-00000-00007")
    with pytest.raises(ValueError, match=r"incomplete: key groups 8\.\.15 hold version 4, but 0 is the newest"):
        loc.latest_version()


def test_a_damaged_layout_record_is_named(tmp_path: Path) -> None:
    Location(str(tmp_path), "op").use(2, 16, HASH)
    record = tmp_path / "op" / "layouts" / "layout-000001.json"
    record.write_text(record.read_text()[:-3])
    with pytest.raises(ValueError, match="layout-000001.json.* is damaged"):
        Location(str(tmp_path), "op")
    with pytest.raises(ValueError, match="must not be empty"):
        Location("", "op")
    with pytest.raises(TypeError, match="path or URI"):
        Location(3, "op")  # type: ignore[arg-type]


def test_old_layouts_are_deleted_once_a_newer_one_holds_two_versions_whole(tmp_path: Path) -> None:
    """A restart goes back one micro-batch at most: once a newer layout holds two versions whole,
    the layouts before it go (record first, then files), and every version a restart can ask
    for is still found."""
    loc = Location(str(tmp_path), "op")
    two = loc.use(2, 16, HASH)
    for v in (1, 2, 3):
        commit(loc, two, v)
    three = loc.use(3, 16, HASH)
    assert loc.prune() == []  # the new layout holds nothing yet
    commit(loc, three, 4)
    commit(loc, three, 5, partitions=[0, 2])  # partition 1 has no version 5: one version whole
    assert loc.prune() == []
    assert (tmp_path / "op" / "L000001").is_dir()
    commit(loc, three, 5, partitions=[1])
    four = loc.use(4, 16, HASH)  # a third run: the two-partition layout is no longer needed
    assert loc.prune() == [1]
    assert not (tmp_path / "op" / "L000001").exists()
    assert not (tmp_path / "op" / "layouts" / "layout-000001.json").exists()
    again = Location(str(tmp_path), "op")
    assert again.layouts == [three, four] == loc.layouts
    assert again.latest_version() == 5
    for version in (4, 5):  # what a restart may load
        for r in four.ranges():
            assert loc.sources(four, r, version)
    with pytest.raises(FileNotFoundError, match="no state of version 3"):
        loc.sources(four, four.range_of(0), 3)
    assert again.use(5, 16, HASH).id == four.id + 1  # ids go on from the newest record


def test_pruning_keeps_the_layout_a_failed_rescale_leaves_needed(tmp_path: Path) -> None:
    """A rescaled run that failed in its first batch left its layout with a version in part: the
    layout before it, which still holds the query's versions whole, is kept."""
    loc = Location(str(tmp_path), "op")
    two = loc.use(2, 16, HASH)
    for v in (1, 2):
        commit(loc, two, v)
    three = loc.use(3, 16, HASH)
    commit(loc, three, 3, partitions=[0])
    loc.use(2, 16, HASH)
    assert loc.prune() == []
    assert loc.latest_version() == 2
    assert [x.id for x in Location(str(tmp_path), "op").layouts] == [1, 2, 3]
