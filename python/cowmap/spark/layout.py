"""Where a query's state lives, and which files hold version ``b`` of a key-group range.

Under ``checkpoint_location/<operator>/``:

- ``layouts/layout-<k>.json``: one record per *layout* (a number of partitions
  over the fixed ``max_parallelism`` key groups), appended by the driver when a
  run starts with another number of partitions than the last run;
- ``L<k>/kg-<start>-<end>/``: a :class:`~cowmap.checkpoint.CheckpointStorage`
  per partition of layout ``k``, whose checkpoint ``v`` is the range's state
  after micro-batch ``v - 1`` (version 0 is the empty state).

Loading version ``b`` for a range of layout ``k`` takes the newest layout (``k``
first, then older ones) in which every range overlapping it holds ``b``: a
rescaled run reads the old partitions' checkpoints by key-group range, and a
layout that committed ``b`` only in part (its run failed in that batch) is
passed over. No clock is consulted, so the choice is the same on every retry.
"""

from __future__ import annotations

import json
import os
import re
from dataclasses import dataclass

from cowmap.checkpoint import CheckpointStorage
from cowmap.checkpoint.files import open_files
from cowmap.checkpoint.storage import Store
from cowmap.state.keygroups import KeyGroupRange, key_group_range_for_operator

__all__ = ["Layout", "Location"]

_LAYOUT = re.compile(r"^layout-(\d{6})\.json$")


@dataclass(frozen=True)
class Layout:
    """A number of partitions over ``max_parallelism`` key groups, recorded as run ``id``."""

    id: int
    num_partitions: int
    max_parallelism: int
    key_hash: str

    def range_of(self, partition: int) -> KeyGroupRange:
        return key_group_range_for_operator(self.max_parallelism, self.num_partitions, partition)

    def ranges(self) -> list[KeyGroupRange]:
        return [self.range_of(p) for p in range(self.num_partitions)]


class Location:
    """The state directory of one operator of one query (shipped to the
    executors, pickled, with the layouts it had on the driver)."""

    def __init__(self, uri: str, operator: str, layouts: list[Layout] | None = None) -> None:
        if not isinstance(uri, str | os.PathLike):
            raise TypeError(f"checkpoint_location must be a path or URI string, not {type(uri).__name__}")
        uri = os.fspath(uri)
        if not uri:
            raise ValueError("checkpoint_location must not be empty")
        if "://" not in uri:
            uri = os.path.abspath(uri)
        self.uri = uri.rstrip("/")
        self.operator = operator
        self.layouts: list[Layout] = layouts if layouts is not None else self._read_layouts()

    def _path(self, *parts: str) -> str:
        return "/".join([self.uri, self.operator, *parts])

    def _store(self, *parts: str) -> Store:
        return Store(self._path(*parts))

    # ------------------------------------------------------------ the driver's side

    def _read_layouts(self) -> list[Layout]:
        store = self._store("layouts")
        out = []
        for name in sorted(store.names()):
            if _LAYOUT.match(name):
                with store.files.open_input_stream(store.join(name)) as f:
                    try:
                        doc = json.loads(f.read())
                        out.append(Layout(**doc))
                    except (ValueError, TypeError) as e:
                        raise ValueError(f"layout record {store.join(name)!r} is damaged: {e}") from None
        return out

    def use(self, num_partitions: int, max_parallelism: int, key_hash: str) -> Layout:
        """The layout of a run with ``num_partitions``: the last one when it is the
        same, else a new record. ``ValueError`` if the key groups cannot carry over
        (another ``max_parallelism`` or key hash than the state was written with)."""
        last = self.layouts[-1] if self.layouts else None
        if last is not None:
            if last.max_parallelism != max_parallelism:
                raise ValueError(
                    f"the state in {self._path()!r} was written with max_parallelism={last.max_parallelism}, "
                    f"not {max_parallelism}: key groups are fixed for a query's life"
                )
            if last.key_hash != key_hash:
                raise ValueError(
                    f"the state in {self._path()!r} maps keys to key groups with {last.key_hash!r}, this query "
                    f"with {key_hash!r}: the key columns' types changed"
                )
            if last.num_partitions == num_partitions:
                return last
        layout = Layout((last.id if last else 0) + 1, num_partitions, max_parallelism, key_hash)
        store = self._store("layouts")
        with store.atomic(f"layout-{layout.id:06d}.json") as out:
            out.write(json.dumps(layout.__dict__).encode())
        self.layouts.append(layout)
        return layout

    def latest_version(self) -> int:
        """The newest version every range of some layout holds (0: none), the
        version a batch (not streaming) query starts from. ``ValueError`` when a
        range holds a version beyond the next one: a run that failed part way
        leaves ranges one version ahead at most, so more means that versions of
        the others were deleted, and a run from this version would silently
        start them over."""
        held = {(layout.id, r): set(self.storage(layout, r).checkpoints()) for layout in self.layouts
                for r in layout.ranges()}
        latest = 0
        for layout in reversed(self.layouts):
            common = self.held_whole(layout, held)
            if common:
                latest = max(common)
                break
        for (_, r), ids in held.items():
            newest = max(ids, default=0)
            if newest > latest + 1:
                raise ValueError(
                    f"the state in {self._path()!r} is incomplete: key groups {r.start}..{r.end} hold version "
                    f"{newest}, but {latest} is the newest version all key groups hold (were a range's "
                    "files deleted?); put them back, or delete the state to start over"
                )
        return latest

    def held_whole(self, layout: Layout, held: dict[tuple[int, KeyGroupRange], set[int]] | None = None) -> set[int]:
        """The versions every range of ``layout`` holds (``held``: each range's, listed already)."""
        common: set[int] | None = None
        for r in layout.ranges():
            have = held[layout.id, r] if held is not None else set(self.storage(layout, r).checkpoints())
            common = have if common is None else common & have
            if not common:
                return set()
        return common or set()

    def prune(self) -> list[int]:
        """Delete the layouts older than the newest one holding two versions
        whole, and return their ids: a restart goes back one micro-batch at
        most, so it loads from that layout or a newer one (a rescaled run's
        state otherwise stays in every old layout for good). The record goes
        first, so that nothing reads a layout half deleted."""
        for i in range(len(self.layouts) - 1, 0, -1):
            if len(self.held_whole(self.layouts[i])) >= 2:
                old, self.layouts = self.layouts[:i], self.layouts[i:]
                records = self._store("layouts")
                for layout in old:
                    records.delete([f"layout-{layout.id:06d}.json"])
                    files, path = open_files(self._path(f"L{layout.id:06d}"))
                    files.delete_dir(path)
                return [layout.id for layout in old]
        return []

    # ------------------------------------------------------------ the executors' side

    def storage(self, layout: Layout, kg_range: KeyGroupRange) -> CheckpointStorage:
        return CheckpointStorage(self._path(f"L{layout.id:06d}", f"kg-{kg_range.start:05d}-{kg_range.end:05d}"))

    def _up_to(self, layout: Layout) -> list[Layout]:
        """``layout`` and the layouts before it, oldest first."""
        return self.layouts[: self.layouts.index(layout) + 1]

    def _covering(self, layout: Layout, kg_range: KeyGroupRange) -> list[CheckpointStorage]:
        """The storages of ``layout``'s ranges that hold key groups of ``kg_range``."""
        return [self.storage(layout, r) for r in layout.ranges() if r.intersection(kg_range)]

    def overlapping(self, layout: Layout, kg_range: KeyGroupRange) -> list[CheckpointStorage]:
        """The storages of ``layout`` and the layouts before it that hold key groups of ``kg_range``."""
        return [s for old in self._up_to(layout) for s in self._covering(old, kg_range)]

    def sources(
        self, layout: Layout, kg_range: KeyGroupRange, version: int, pinned: bool = False
    ) -> list[CheckpointStorage]:
        """The storages holding ``version`` of the key groups of ``kg_range``
        (the range's own when it has it), newest layout first; ``FileNotFoundError``
        when no layout holds it whole (``pinned``: the caller chose ``version``)."""
        for old in reversed(self._up_to(layout)):
            found = self._covering(old, kg_range)
            if all(version in s.checkpoints() for s in found):
                return found
        if pinned:
            why = (f"given batch_id={version}, did the run of batch_id={version - 1} not happen (every batch id "
                   "from 0 on needs its run), or is it older than the retain_versions kept?")
        else:
            why = "the query's checkpoint is ahead of its state: was the state directory deleted or replaced?"
        raise FileNotFoundError(
            f"no state of version {version} for key groups {kg_range.start}..{kg_range.end} under {self._path()!r} "
            f"({why})"
        )
