"""The TTL scenarios of Flink's ``TtlStateTestBase``, for every state kind.

Each scenario runs against a small per-kind context (how to update and read the
state, and what a read must give) in the style of Flink's
``TtlValueStateTestContext``, ``TtlFixedLenElemListStateTestContext``,
``TtlMapStateAllEntriesTestContext``, ``TtlMapStatePerElementTestContext``,
``TtlMapStatePerNullElementTestContext``, ``TtlReducingStateTestContext`` and
``TtlAggregatingStateTestContext`` (values as there). As in Flink's base test,
the backend is snapshotted and restored into a fresh backend between most steps
(``take_and_restore``), the TTL is 100 ms and there are 10 key groups.

Expected semantics (Flink 2.3, ``flink-runtime/.../state/ttl``): a value written
at ``ts`` is expired when ``ts + ttl <= now`` (``TtlUtils.expired``, the sum
saturating at ``Long.MAX_VALUE``); ``OnReadAndWrite`` refreshes the timestamp on
reads (``AbstractTtlDecorator.getWrappedWithTtlCheckAndUpdate``);
``ReturnExpiredIfNotCleanedUp`` returns an expired value once and clears it in
that access; list elements and map entries carry their own timestamps
(``TtlListState``, ``TtlMapState``); an expired reducing/aggregating accumulator
is dropped (``TtlReduceFunction``, ``TtlAggregateFunction``).
"""

from __future__ import annotations

import random
from collections.abc import Callable
from datetime import timedelta
from typing import Any

import pytest

from cowmap.state import (
    AggregateFunction,
    AggregatingStateDescriptor,
    KeyedStateBackend,
    ListStateDescriptor,
    MapStateDescriptor,
    ReducingStateDescriptor,
    StateTtlConfig,
    StateVisibility,
    UpdateType,
    ValueStateDescriptor,
)

TTL = 100
MAX_TS = (1 << 63) - 1  # Java's Long.MAX_VALUE
TIMEDELTA_MAX_MS = timedelta.max // timedelta(milliseconds=1)
NUMBER_OF_KEY_GROUPS = 10  # Flink's StateBackendTestContext.NUMBER_OF_KEY_GROUPS
# Flink: ((DEFAULT_CAPACITY >> 1) + (DEFAULT_CAPACITY >> 2) + 1) * NUMBER_OF_KEY_GROUPS
INC_CLEANUP_ALL_KEYS = ((128 >> 1) + (128 >> 2) + 1) * NUMBER_OF_KEY_GROUPS
KEYS_TO_UPDATE = (128 >> 3) * NUMBER_OF_KEY_GROUPS


def conf(ttl: Any = timedelta(milliseconds=TTL)) -> StateTtlConfig.Builder:
    return StateTtlConfig.new_builder(ttl)


def exact_conf(
    update: UpdateType, visibility: StateVisibility, ttl: Any = timedelta(milliseconds=TTL)
) -> StateTtlConfig:
    """Flink's ``initTest(updateType, visibility, ttl)``: background cleanup off."""
    return conf(ttl).set_update_type(update).set_state_visibility(visibility).disable_cleanup_in_background().build()


DEFAULT = exact_conf(UpdateType.OnCreateAndWrite, StateVisibility.NeverReturnExpired)


# --------------------------------------------------------------------------- contexts


class Ctx:
    """How one state kind is written and read, and what reads must return."""

    id = ""
    merging = False
    empty: Any = None
    update_empty: Any
    update_unexpired: Any
    update_expired: Any
    get_update_empty: Any
    get_unexpired: Any
    get_update_expired: Any

    def descriptor(self) -> Any:
        raise NotImplementedError

    def register(self, backend: KeyedStateBackend, desc: Any) -> Any:
        raise NotImplementedError

    def update(self, h: Harness, value: Any) -> None:
        raise NotImplementedError

    def get(self, h: Harness) -> Any:
        raise NotImplementedError

    # merging kinds only
    def random_update(self, rng: random.Random) -> Any:
        raise NotImplementedError

    def merge_result(self, unexpired: list[tuple[str, Any]], final: list[tuple[str, Any]]) -> Any:
        raise NotImplementedError

    def __repr__(self) -> str:
        return self.id


class ValueCtx(Ctx):
    id = "value"
    update_empty, update_unexpired, update_expired = "test value1", "test value2", "test value3"
    get_update_empty, get_unexpired, get_update_expired = "test value1", "test value2", "test value3"

    def descriptor(self) -> Any:
        return ValueStateDescriptor("TtlValueState")

    def register(self, backend: KeyedStateBackend, desc: Any) -> Any:
        return backend.get_state(desc)

    def update(self, h: Harness, value: Any) -> None:
        h.state.update(value)

    def get(self, h: Harness) -> Any:
        return h.state.value()


class ListCtx(Ctx):
    id = "list"
    merging = True
    empty: Any = []
    update_empty, update_unexpired, update_expired = [5, 7, 10], [8, 9, 11], [1, 4]
    get_update_empty, get_unexpired, get_update_expired = [5, 7, 10], [8, 9, 11], [1, 4]

    def descriptor(self) -> Any:
        return ListStateDescriptor("TtlListState")

    def register(self, backend: KeyedStateBackend, desc: Any) -> Any:
        return backend.get_list_state(desc)

    def update(self, h: Harness, value: Any) -> None:
        h.state.add_all(value)

    def get(self, h: Harness) -> Any:
        return list(h.state.get())

    def random_update(self, rng: random.Random) -> Any:
        return [rng.randrange(100) for _ in range(rng.randrange(5))]

    def merge_result(self, unexpired: list[tuple[str, Any]], final: list[tuple[str, Any]]) -> Any:
        return [x for _, values in final for x in values]


class MapAllEntriesCtx(Ctx):
    id = "map_all_entries"
    empty: Any = set()
    update_empty = {3: "3", 5: "5", 23: None, 10: "10"}
    update_unexpired = {12: "12", 24: None, 7: "7"}
    update_expired = {15: "15", 25: None, 4: "4"}
    get_update_empty = set(update_empty.items())
    get_unexpired = set(update_unexpired.items())
    get_update_expired = set(update_expired.items())

    def descriptor(self) -> Any:
        return MapStateDescriptor("TtlMapState")

    def register(self, backend: KeyedStateBackend, desc: Any) -> Any:
        return backend.get_map_state(desc)

    def update(self, h: Harness, value: Any) -> None:
        h.state.put_all(value)

    def get(self, h: Harness) -> Any:
        return set(h.state.items())


class MapPerElementCtx(Ctx):
    id = "map_per_element"
    TEST_KEY = 1
    update_empty, update_unexpired, update_expired = "test value1", "test value2", "test value3"
    get_update_empty, get_unexpired, get_update_expired = "test value1", "test value2", "test value3"

    def descriptor(self) -> Any:
        return MapStateDescriptor("TtlMapState")

    def register(self, backend: KeyedStateBackend, desc: Any) -> Any:
        return backend.get_map_state(desc)

    def update(self, h: Harness, value: Any) -> None:
        h.state.put(self.TEST_KEY, value)

    def get(self, h: Harness) -> Any:
        value = h.state.get(self.TEST_KEY)
        # as Flink's context asserts: contains() agrees with what is stored
        stored = h.present()
        assert h.state.contains(self.TEST_KEY) == stored
        return value


class MapPerNullElementCtx(MapPerElementCtx):
    """Null user values are legal in a MapState, with TTL too."""

    id = "map_per_null_element"
    update_empty = update_unexpired = update_expired = None
    get_update_empty = get_unexpired = get_update_expired = None


class ReducingCtx(Ctx):
    id = "reducing"
    merging = True
    update_empty, update_unexpired, update_expired = 5, 7, 6
    get_update_empty, get_unexpired, get_update_expired = 5, 12, 6

    def descriptor(self) -> Any:
        return ReducingStateDescriptor("TtlReducingState", lambda a, b: a + b)

    def register(self, backend: KeyedStateBackend, desc: Any) -> Any:
        return backend.get_reducing_state(desc)

    def update(self, h: Harness, value: Any) -> None:
        h.state.add(value)

    def get(self, h: Harness) -> Any:
        return h.state.get()

    def random_update(self, rng: random.Random) -> Any:
        return rng.randrange(1000)

    def merge_result(self, unexpired: list[tuple[str, Any]], final: list[tuple[str, Any]]) -> Any:
        return sum(v for _, v in unexpired) + sum(v for _, v in final)


class SumFrom3(AggregateFunction):
    """Flink's test aggregate: the accumulator starts at 3, the result is a string."""

    def create_accumulator(self) -> int:
        return 3

    def add(self, value: int, accumulator: int) -> int:
        return accumulator + value

    def get_result(self, accumulator: int) -> str:
        return str(accumulator)

    def merge(self, acc_a: int, acc_b: int) -> int:
        return acc_a + acc_b


class AggregatingCtx(ReducingCtx):
    id = "aggregating"
    get_update_empty, get_unexpired, get_update_expired = "8", "15", "9"

    def descriptor(self) -> Any:
        return AggregatingStateDescriptor("TtlAggregatingState", SumFrom3())

    def register(self, backend: KeyedStateBackend, desc: Any) -> Any:
        return backend.get_aggregating_state(desc)

    def merge_result(self, unexpired: list[tuple[str, Any]], final: list[tuple[str, Any]]) -> Any:
        namespaces = {ns for ns, _ in unexpired} | {ns for ns, _ in final}
        return str(super().merge_result(unexpired, final) + 3 * len(namespaces))


ALL = [
    ValueCtx(),
    ListCtx(),
    MapAllEntriesCtx(),
    MapPerElementCtx(),
    MapPerNullElementCtx(),
    ReducingCtx(),
    AggregatingCtx(),
]
MERGING = [c for c in ALL if c.merging]

all_kinds = pytest.mark.parametrize("ctx", ALL, ids=repr)
merging_kinds = pytest.mark.parametrize("ctx", MERGING, ids=repr)


# --------------------------------------------------------------------------- harness


class Harness:
    """Flink's ``StateBackendTestContext`` + ``MockTtlTimeProvider`` for one state."""

    DEFAULT_KEY = "defaultKey"
    DEFAULT_NAMESPACE = "defaultNamespace"

    def __init__(self, ctx: Ctx, config: StateTtlConfig, max_parallelism: int = NUMBER_OF_KEY_GROUPS) -> None:
        self.ctx = ctx
        self.config = config
        self.max_parallelism = max_parallelism
        self.clock = [0]
        self.backend: KeyedStateBackend
        self.state: Any
        self.desc: Any
        self._open(None)

    def _open(self, snapshot: Any) -> None:
        clock = self.clock
        self.backend = KeyedStateBackend(self.max_parallelism, time_provider=lambda: clock[0])
        if snapshot is not None:
            self.backend.restore(snapshot)
        self.backend.set_current_key(self.DEFAULT_KEY)
        self.desc = self.ctx.descriptor()
        self.desc.enable_time_to_live(self.config)
        self.state = self.ctx.register(self.backend, self.desc)
        self.state.set_current_namespace(self.DEFAULT_NAMESPACE)

    @property
    def time(self) -> int:
        return self.clock[0]

    @time.setter
    def time(self, t: int) -> None:
        self.clock[0] = t

    def restore(self, snapshot: Any) -> None:
        """A fresh backend restored from ``snapshot``, current key and namespace reset."""
        self._open(snapshot)

    def take_and_restore(self) -> None:
        snap = self.backend.snapshot()
        self.restore(snap)
        snap.release()

    def set_key(self, key: Any) -> None:
        self.backend.set_current_key(key)

    def set_namespace(self, ns: Any) -> None:
        self.state.set_current_namespace(ns)

    def update(self, value: Any) -> None:
        self.ctx.update(self, value)

    def get(self) -> Any:
        return self.ctx.get(self)

    def present(self) -> bool:
        """Whether anything is physically stored for the current key and namespace
        (Flink's ``getOriginal()``: the state under the TTL wrapper)."""
        key = self.backend.get_current_key()
        return key in set(self.backend.keys(self.desc.name, self.state.get_current_namespace()))

    def stored_keys(self) -> set[Any]:
        return set(self.backend.keys(self.desc.name, self.state.get_current_namespace()))


# --------------------------------------------------------------------------- scenarios


@all_kinds
def test_non_existent_value(ctx: Ctx) -> None:
    h = Harness(ctx, DEFAULT)
    assert h.get() == ctx.empty


def test_value_set_null() -> None:
    ctx = ValueCtx()
    h = Harness(ctx, exact_conf(UpdateType.OnCreateAndWrite, StateVisibility.ReturnExpiredIfNotCleanedUp))
    h.update(ctx.update_unexpired)
    assert h.get() == ctx.get_unexpired
    h.update(None)
    assert h.get() == ctx.empty
    assert not h.present()


@all_kinds
def test_exact_expiration_on_write(ctx: Ctx) -> None:
    h = Harness(ctx, exact_conf(UpdateType.OnCreateAndWrite, StateVisibility.NeverReturnExpired))
    h.take_and_restore()
    h.time = 0
    h.update(ctx.update_empty)
    h.take_and_restore()
    h.time = 20
    assert h.get() == ctx.get_update_empty
    h.take_and_restore()
    h.time = 50
    h.update(ctx.update_unexpired)
    h.take_and_restore()
    h.time = 120
    assert h.get() == ctx.get_unexpired, "unexpired state should be available after update"
    h.take_and_restore()
    h.time = 170
    h.update(ctx.update_expired)
    h.take_and_restore()
    h.time = 220
    assert h.get() == ctx.get_update_expired
    h.take_and_restore()
    h.time = 300
    assert h.get() == ctx.empty, "expired state should be unavailable"
    assert not h.present(), "original state should be cleared on access"


@all_kinds
def test_relaxed_expiration_on_write(ctx: Ctx) -> None:
    h = Harness(ctx, exact_conf(UpdateType.OnCreateAndWrite, StateVisibility.ReturnExpiredIfNotCleanedUp))
    h.time = 0
    h.update(ctx.update_empty)
    h.take_and_restore()
    h.time = 120
    assert h.get() == ctx.get_update_empty, "expired state is returned once if not cleaned up"
    assert not h.present(), "original state should be cleared on access"
    assert h.get() == ctx.empty, "expired state should be cleared on access"


@all_kinds
def test_exact_expiration_on_read(ctx: Ctx) -> None:
    h = Harness(ctx, exact_conf(UpdateType.OnReadAndWrite, StateVisibility.NeverReturnExpired))
    h.time = 0
    h.update(ctx.update_empty)
    h.take_and_restore()
    h.time = 50
    assert h.get() == ctx.get_update_empty
    h.take_and_restore()
    h.time = 120
    assert h.get() == ctx.get_update_empty, "unexpired state should be available after read"
    h.take_and_restore()
    h.time = 250
    assert h.get() == ctx.empty
    assert not h.present(), "original state should be cleared on access"


@all_kinds
def test_relaxed_expiration_on_read(ctx: Ctx) -> None:
    h = Harness(ctx, exact_conf(UpdateType.OnReadAndWrite, StateVisibility.ReturnExpiredIfNotCleanedUp))
    h.time = 0
    h.update(ctx.update_empty)
    h.take_and_restore()
    h.time = 50
    assert h.get() == ctx.get_update_empty
    h.take_and_restore()
    h.time = 170
    assert h.get() == ctx.get_update_empty, "expired state should be available once"
    assert h.get() == ctx.empty, "expired state should be cleared on access"


@all_kinds
@pytest.mark.parametrize("start", [10, MAX_TS - 10**12], ids=["small_ts", "ts_near_long_max"])
@pytest.mark.parametrize("cleanup", [False, True], ids=["no_cleanup", "cleanup_every_record"])
def test_expiration_timestamp_overflow(ctx: Ctx, start: int, cleanup: bool) -> None:
    """``ts + ttl`` beyond Long.MAX_VALUE saturates: such a value does not expire
    (``TtlUtils.getExpirationTimestamp``), also not in the C sweep."""
    builder = conf(timedelta.max)
    builder = builder.cleanup_incrementally(5, True) if cleanup else builder.disable_cleanup_in_background()
    h = Harness(ctx, builder.build())
    h.time = start
    h.update(ctx.update_empty)
    h.take_and_restore()
    h.time = start + 40
    for _ in range(50):  # give the incremental cleanup every chance to visit the entry
        h.set_key(h.DEFAULT_KEY)
    assert h.present()
    assert h.get() == ctx.get_update_empty
    # timedelta.max is ~8.64e16 ms: from a small ts the sum stays below Long.MAX_VALUE
    h.time = MAX_TS - 1 if start > TIMEDELTA_MAX_MS else TIMEDELTA_MAX_MS
    for _ in range(50):
        h.set_key(h.DEFAULT_KEY)
    assert h.present()
    assert h.get() == ctx.get_update_empty


@all_kinds
def test_expiration_at_long_max(ctx: Ctx) -> None:
    """The saturated expiration time is Long.MAX_VALUE, and ``<=`` makes it expire there."""
    h = Harness(ctx, exact_conf(UpdateType.OnCreateAndWrite, StateVisibility.NeverReturnExpired, timedelta.max))
    h.time = MAX_TS - 10**12
    h.update(ctx.update_empty)
    h.time = MAX_TS
    assert h.get() == ctx.empty


@all_kinds
@pytest.mark.parametrize("visibility", list(StateVisibility), ids=lambda v: v.name)
def test_expiration_boundary_is_inclusive(ctx: Ctx, visibility: StateVisibility) -> None:
    """``ts + ttl == now`` is expired (``getExpirationTimestamp(ts, ttl) <= now``)."""
    h = Harness(ctx, exact_conf(UpdateType.OnCreateAndWrite, visibility))
    h.time = 1000
    h.update(ctx.update_empty)
    h.time = 1000 + TTL - 1
    assert h.get() == ctx.get_update_empty
    assert h.present()
    h.time = 1000 + TTL
    if visibility is StateVisibility.ReturnExpiredIfNotCleanedUp:
        assert h.get() == ctx.get_update_empty
    assert h.get() == ctx.empty
    assert not h.present()


@all_kinds
def test_incremental_cleanup_boundary_is_inclusive(ctx: Ctx) -> None:
    """The background sweep uses the same inclusive rule as reads."""
    h = Harness(ctx, conf().cleanup_incrementally(5, True).build())
    h.time = 1000
    for i in range(30):
        h.set_key(i)
        h.update(ctx.update_empty)
    h.time = 1000 + TTL - 1
    for _ in range(60):  # a few full rounds of every key group's map
        for i in range(30):
            h.set_key(i)
    assert h.stored_keys() == set(range(30)), "nothing may be cleaned up one ms before expiry"
    h.time = 1000 + TTL
    for _ in range(60):
        for i in range(30):
            h.set_key(i)
    assert h.stored_keys() == set(), "everything expired at ts + ttl == now"
    assert h.backend.num_entries() == 0


@merging_kinds
def test_merge_namespaces(ctx: Ctx) -> None:
    rng = random.Random(20230)
    h = Harness(ctx, DEFAULT)
    namespaces = [
        "unsetNamespace1",
        "unsetNamespace2",
        "expiredNamespace",
        "expiredAndUpdatedNamespace",
        "unexpiredNamespace",
        "finalNamespace",
    ]

    def updates(names: list[str]) -> list[tuple[str, Any]]:
        return [(ns, ctx.random_update(rng)) for ns in names]

    def apply(ups: list[tuple[str, Any]]) -> None:
        for ns, v in ups:
            h.set_namespace(ns)
            h.update(v)

    h.time = 0
    apply(updates(["expiredNamespace"] * 2 + ["expiredAndUpdatedNamespace"] * 2))
    h.take_and_restore()
    h.time = 120
    unexpired = updates(["expiredAndUpdatedNamespace"] * 2 + ["unexpiredNamespace"] * 2)
    apply(unexpired)
    h.take_and_restore()
    h.time = 150
    final = updates(["expiredAndUpdatedNamespace"] * 2 + ["unexpiredNamespace"] * 2 + ["finalNamespace"] * 2)
    apply(final)
    h.take_and_restore()
    h.time = 230
    h.state.merge_namespaces("targetNamespace", namespaces)
    h.set_namespace("targetNamespace")
    assert h.get() == ctx.merge_result(unexpired, final)
    for ns in namespaces:  # the sources are merged away
        assert h.backend.get_current_key() not in set(h.backend.keys(h.desc.name, ns))


def test_reduce_drops_expired_accumulator() -> None:
    """write 5 -> 5, add 7 -> 12; after expiry add 6 -> 6 (not 18)."""
    h = Harness(ReducingCtx(), conf().build())  # default background cleanup
    h.time = 0
    h.update(5)
    assert h.get() == 5
    h.time = 10
    h.update(7)
    assert h.get() == 12
    h.time = 10 + TTL
    h.update(6)
    assert h.get() == 6


@merging_kinds
def test_merge_with_expired_target_and_sources(ctx: Ctx) -> None:
    """Merging only expired accumulators leaves nothing; an expired target is not merged into."""
    h = Harness(ctx, DEFAULT)
    h.time = 0
    for ns in ("a", "b", "target"):
        h.set_namespace(ns)
        h.update(ctx.update_empty)
    h.time = TTL
    h.state.merge_namespaces("target", ["a", "b"])
    h.set_namespace("target")
    assert h.get() == ctx.empty
    h.time = TTL + 5
    h.set_namespace("c")
    h.update(ctx.update_unexpired)
    h.set_namespace("target2")
    h.time = TTL + 10
    h.state.merge_namespaces("target2", ["c", "never-set"])
    assert h.get() == _single(ctx, ctx.update_unexpired)


def _single(ctx: Ctx, update: Any) -> Any:
    """What a read gives after one update into an empty state."""
    if isinstance(ctx, AggregatingCtx):
        return str(3 + update)
    if isinstance(ctx, MapAllEntriesCtx):
        return set(update.items())
    return update


@merging_kinds
def test_relaxed_add_and_merge_use_expired_accumulators(ctx: Ctx) -> None:
    """Under ReturnExpiredIfNotCleanedUp, ``TtlReduceFunction`` / ``TtlAggregateFunction``
    take an expired, uncleaned accumulator as it is (``getUnexpired`` returns it)
    and stamp the result with the current time; list elements keep their own."""
    h = Harness(ctx, exact_conf(UpdateType.OnCreateAndWrite, StateVisibility.ReturnExpiredIfNotCleanedUp))
    both = {"list": ctx.update_empty + ctx.update_unexpired, "reducing": 12, "aggregating": "15"}[ctx.id]
    h.time = 0
    h.update(ctx.update_empty)
    h.time = 120  # expired, not cleaned up
    h.update(ctx.update_unexpired)
    assert h.get() == both
    h.time = 219
    assert h.get() == both
    h.time = 220
    assert h.get() == both  # expired now: returned once ...
    assert h.get() == ctx.empty  # ... and cleared

    h.time = 1000
    for ns, value in (("s1", ctx.update_empty), ("s2", ctx.update_unexpired)):
        h.set_namespace(ns)
        h.update(value)
    h.time = 1150  # both expired
    h.state.merge_namespaces("t", ["s1", "s2"])
    h.set_namespace("t")
    merged = {"list": ctx.update_empty + ctx.update_unexpired, "reducing": 12, "aggregating": "18"}[ctx.id]
    if ctx.id == "list":  # merged elements keep their timestamps (1000): expired
        assert h.get() == merged
        assert h.get() == ctx.empty
        return
    h.time = 1249  # the merge result is stamped 1150
    assert h.get() == merged
    h.time = 1250
    assert h.get() == merged
    assert h.get() == ctx.empty


@merging_kinds
def test_merge_result_timestamps(ctx: Ctx) -> None:
    """``AbstractHeapMergingState.mergeNamespaces``: a single source moved into an
    absent target keeps its timestamp; accumulators combined by
    ``TtlReduceFunction`` / ``TtlAggregateFunction`` are stamped with the merge
    time; list elements always keep their own timestamps."""
    h = Harness(ctx, DEFAULT)
    one = {"list": [9], "reducing": 9, "aggregating": "12"}[ctx.id]
    h.time = 105
    h.set_namespace("s")
    h.update([9] if ctx.id == "list" else 9)
    h.time = 110
    h.state.merge_namespaces("t", ["s", "never-set"])
    h.set_namespace("t")
    h.time = 204
    assert h.get() == one
    h.time = 205  # 105 + TTL: the source's timestamp came along
    assert h.get() == ctx.empty

    h.time = 105
    h.set_namespace("a")
    h.update([1] if ctx.id == "list" else 1)
    h.time = 106
    h.set_namespace("b")
    h.update([2] if ctx.id == "list" else 2)
    h.time = 110
    h.state.merge_namespaces("t2", ["a", "b"])
    h.set_namespace("t2")
    if ctx.id == "list":
        h.time = 205
        assert h.get() == [2]
        h.time = 206
        assert h.get() == []
        return
    both = {"reducing": 3, "aggregating": "9"}[ctx.id]
    h.time = 209
    assert h.get() == both
    h.time = 210  # stamped at the merge (110)
    assert h.get() == ctx.empty


# ----------------------------------------------------------------- multiple keys / namespaces


def _multiple_state_ids(h: Harness, change_id: Callable[[str], None], time_back_after_restore: bool) -> None:
    ctx = h.ctx
    h.take_and_restore()  # empty storage snapshot/restore
    h.time = 0
    change_id("id2")
    h.update(ctx.update_empty)
    h.take_and_restore()
    h.time = 50
    change_id("id1")
    h.update(ctx.update_empty)
    change_id("id2")
    h.update(ctx.update_unexpired)
    h.time = 120
    h.take_and_restore()
    change_id("id1")
    assert h.get() == ctx.get_update_empty
    change_id("id2")
    assert h.get() == ctx.get_unexpired
    h.time = 170
    change_id("id2")
    h.update(ctx.update_expired)
    h.time = 230
    h.take_and_restore()
    if time_back_after_restore:
        h.time = 170
    change_id("id1")
    assert h.get() == ctx.empty
    change_id("id2")
    assert h.get() == ctx.get_update_expired
    h.time = 300
    h.take_and_restore()
    if time_back_after_restore:
        h.time = 230
    change_id("id1")
    assert h.get() == ctx.empty
    change_id("id2")
    assert h.get() == ctx.empty, "expired at the snapshot: a full-snapshot cleanup must have left it out"


@all_kinds
@pytest.mark.parametrize("snapshot_cleanup", [False, True], ids=["plain", "cleanup_full_snapshot"])
def test_multiple_keys(ctx: Ctx, snapshot_cleanup: bool) -> None:
    config = conf().cleanup_full_snapshot().build() if snapshot_cleanup else DEFAULT
    h = Harness(ctx, config)
    _multiple_state_ids(h, h.set_key, snapshot_cleanup)


@all_kinds
@pytest.mark.parametrize("snapshot_cleanup", [False, True], ids=["plain", "cleanup_full_snapshot"])
def test_multiple_namespaces(ctx: Ctx, snapshot_cleanup: bool) -> None:
    config = conf().cleanup_full_snapshot().build() if snapshot_cleanup else DEFAULT
    h = Harness(ctx, config)
    _multiple_state_ids(h, h.set_namespace, snapshot_cleanup)


@all_kinds
@pytest.mark.parametrize("snapshot_cleanup", [False, True], ids=["plain", "cleanup_full_snapshot"])
def test_restore_with_clock_set_back(ctx: Ctx, snapshot_cleanup: bool) -> None:
    """Values expired when the snapshot was taken: left out of it with
    ``cleanup_full_snapshot`` (gone after a restore even with the clock set back),
    kept without it (visible again with the clock set back)."""
    builder = conf().disable_cleanup_in_background()
    if snapshot_cleanup:
        builder = builder.cleanup_full_snapshot()
    h = Harness(ctx, builder.build())
    keys = [f"k{i}" for i in range(20)]
    h.time = 0
    for k in keys:
        h.set_key(k)
        h.update(ctx.update_empty)
    h.set_key("late")
    h.time = 60
    h.update(ctx.update_unexpired)
    h.time = 150  # the first writes have expired, the late one has not
    snap = h.backend.snapshot()
    stored_in_snapshot = {rec[0] for rec in snap.entries(h.desc.name)}
    h.restore(snap)
    snap.release()
    h.time = 50
    if snapshot_cleanup:
        assert stored_in_snapshot == {"late"}
        assert h.stored_keys() == {"late"}
    else:
        assert stored_in_snapshot == set(keys) | {"late"}
    for k in keys:
        h.set_key(k)
        assert h.get() == (ctx.empty if snapshot_cleanup else ctx.get_update_empty)
    h.set_key("late")
    assert h.get() == _single(ctx, ctx.update_unexpired)


@all_kinds
def test_snapshot_change_restore(ctx: Ctx) -> None:
    h = Harness(ctx, DEFAULT)
    h.time = 0
    h.set_key("k1")
    h.update(ctx.update_empty)
    h.time = 50
    h.set_key("k1")
    h.update(ctx.update_unexpired)
    h.time = 100
    h.set_key("k2")
    h.update(ctx.update_empty)
    snapshot = h.backend.snapshot()
    h.time = 170
    h.set_key("k1")
    h.update(ctx.update_expired)
    h.set_key("k2")
    h.update(ctx.update_unexpired)
    h.restore(snapshot)
    snapshot.release()
    h.time = 180
    h.set_key("k1")
    assert h.get() == ctx.empty
    h.set_key("k2")
    assert h.get() == ctx.get_update_empty


# --------------------------------------------------------------------------- per-element TTL


@pytest.mark.parametrize("update", [UpdateType.OnCreateAndWrite, UpdateType.OnReadAndWrite], ids=lambda u: u.name)
def test_list_elements_expire_one_by_one(update: UpdateType) -> None:
    h = Harness(ListCtx(), exact_conf(update, StateVisibility.NeverReturnExpired))
    h.time = 0
    h.state.add("a")
    h.time = 50
    h.state.add("b")
    h.state.add_all(["c"])
    if update is UpdateType.OnReadAndWrite:
        h.time = 60
        assert h.state.get() == ["a", "b", "c"]  # refreshes every unexpired element to 60
        h.time = 159
        assert h.state.get() == ["a", "b", "c"]  # refreshed again, to 159
        h.time = 259
        assert h.state.get() == []
        assert not h.present()
        return
    h.time = 99
    assert h.state.get() == ["a", "b", "c"]
    h.time = 100
    assert h.state.get() == ["b", "c"]
    h.take_and_restore()  # per-element timestamps survive a snapshot
    assert h.state.get() == ["b", "c"]
    h.state.add("d")
    h.time = 150
    assert h.state.get() == ["d"]
    h.time = 200
    assert h.state.get() == []
    assert not h.present()


def test_list_relaxed_returns_partly_expired_list() -> None:
    """``TtlListState.IteratorWithCleanup``: with ReturnExpiredIfNotCleanedUp every
    element is returned, and the list is cleared only when all have expired."""
    h = Harness(ListCtx(), exact_conf(UpdateType.OnCreateAndWrite, StateVisibility.ReturnExpiredIfNotCleanedUp))
    h.time = 0
    h.state.add("a")
    h.time = 50
    h.state.add("b")
    h.time = 120
    assert h.state.get() == ["a", "b"]
    assert h.state.get() == ["a", "b"]
    assert h.present()
    h.time = 150
    assert h.state.get() == ["a", "b"]
    assert not h.present()
    assert h.state.get() == []


def test_list_read_keeps_expired_elements_of_a_partly_live_list() -> None:
    """``TtlListState.get()`` (OnCreateAndWrite) filters while iterating and clears
    the list only when *every* element has expired; a partly live list keeps its
    expired elements until a cleanup, so a snapshot still holds them."""
    h = Harness(ListCtx(), DEFAULT)
    h.time = 0
    h.state.add(1)
    h.time = 50
    h.state.add(2)
    h.time = 120
    assert h.state.get() == [2]
    snap = h.backend.snapshot()
    assert [rec[2] for rec in snap.entries(h.desc.name)] == [[1, 2]]
    h.restore(snap)
    snap.release()
    h.time = 60
    assert h.state.get() == [1, 2]


def test_full_snapshot_list_filter_stops_at_first_live_element() -> None:
    """Flink filters list elements for a full snapshot with
    ``TransformStrategy.STOP_ON_FIRST_INCLUDED``: expired elements are dropped only
    up to the first live one (lists are assumed to be in time order)."""
    h = Harness(ListCtx(), conf().disable_cleanup_in_background().cleanup_full_snapshot().build())
    h.time = 0
    h.set_namespace("old")
    h.state.add(1)
    h.state.add(3)
    h.set_namespace("new")
    h.time = 50
    h.state.add(2)
    h.state.merge_namespaces("new", ["old"])  # [2@50, 1@0, 3@0]
    h.set_namespace("all_old")
    h.time = 10
    h.state.add(4)
    h.time = 60
    h.state.add(5)  # [4@10, 5@60]
    h.time = 120
    snap = h.backend.snapshot()
    stored = {rec[1]: (rec[2], rec[3]) for rec in snap.entries(h.desc.name)}
    assert stored == {"new": ([2, 1, 3], [50, 0, 0]), "all_old": ([5], [60])}
    h.restore(snap)
    snap.release()
    h.time = 40
    h.set_namespace("new")
    assert h.state.get() == [2, 1, 3]
    h.set_namespace("all_old")
    assert h.state.get() == [5]


def test_list_update_stamps_every_element() -> None:
    h = Harness(ListCtx(), DEFAULT)
    h.time = 0
    h.state.add("old")
    h.time = 50
    h.state.update(["x", "y"])
    h.time = 120
    assert h.state.get() == ["x", "y"]
    h.time = 150
    assert h.state.get() == []


@pytest.mark.parametrize("update", [UpdateType.OnCreateAndWrite, UpdateType.OnReadAndWrite], ids=lambda u: u.name)
def test_map_entries_expire_one_by_one(update: UpdateType) -> None:
    h = Harness(MapAllEntriesCtx(), exact_conf(update, StateVisibility.NeverReturnExpired))
    s = h.state
    h.time = 0
    s.put("a", 1)
    s.put("b", 2)
    h.time = 50
    s.put("c", 3)
    s.put("b", 20)  # a write refreshes this entry only
    if update is UpdateType.OnReadAndWrite:
        h.time = 60
        assert s.get("a") == 1  # refreshes "a" only
        h.time = 110
        assert dict(s.items()) == {"a": 1, "b": 20, "c": 3}  # refreshes all three to 110
        h.time = 209
        assert s.keys() == ["a", "b", "c"]
        h.time = 309
        assert s.items() == []
        assert s.is_empty()
        assert not h.present()
        return
    h.time = 100
    assert s.get("a") is None
    assert not s.contains("a")
    assert dict(s.items()) == {"b": 20, "c": 3}
    h.take_and_restore()
    s = h.state
    assert sorted(s.keys()) == ["b", "c"]
    s.put("d", 4)
    h.time = 150
    assert s.items() == [("d", 4)]
    assert s.values() == [4]
    assert not s.is_empty()
    h.time = 200
    assert s.items() == []
    assert s.is_empty()
    assert not h.present()


@pytest.mark.parametrize("visibility", list(StateVisibility), ids=lambda v: v.name)
def test_map_is_empty_ignores_timestamps(visibility: StateVisibility) -> None:
    """Flink 2.3's ``TtlMapState.isEmpty()`` is ``accessCallback.run(); return
    original.isEmpty()``: it does not look at timestamps, so a map holding only
    expired, not yet cleaned-up entries is not empty (and is not cleaned by it)."""
    h = Harness(MapAllEntriesCtx(), exact_conf(UpdateType.OnCreateAndWrite, visibility))
    s = h.state
    s.put("a", 1)
    h.time = TTL
    assert not s.is_empty()
    assert not s.is_empty()
    assert h.present()
    assert s.keys() == (["a"] if visibility is StateVisibility.ReturnExpiredIfNotCleanedUp else [])
    assert s.is_empty()


def test_map_relaxed_returns_expired_entries_once() -> None:
    h = Harness(
        MapAllEntriesCtx(), exact_conf(UpdateType.OnCreateAndWrite, StateVisibility.ReturnExpiredIfNotCleanedUp)
    )
    s = h.state
    h.time = 0
    s.put("a", 1)
    h.time = 50
    s.put("b", 2)
    h.time = 120
    assert dict(s.items()) == {"a": 1, "b": 2}
    assert dict(s.items()) == {"b": 2}
    h.time = 150
    assert s.get("b") == 2  # returned once ...
    assert not s.contains("b")  # ... and gone
    assert s.is_empty()
    assert not h.present()


def test_map_contains_is_true_once_for_expired_uncleaned_entry() -> None:
    """``TtlMapState.contains`` is ``getWrapped(key) != null``: under
    ReturnExpiredIfNotCleanedUp an expired, uncleaned entry counts once."""
    h = Harness(
        MapPerElementCtx(), exact_conf(UpdateType.OnCreateAndWrite, StateVisibility.ReturnExpiredIfNotCleanedUp)
    )
    h.state.put(1, "v")
    h.time = TTL
    assert h.state.contains(1)
    assert not h.state.contains(1)
    assert h.state.get(1) is None


# --------------------------------------------------------------------------- incremental cleanup


def _update_keys(h: Harness, start: int, end: int, value: Any) -> None:
    for i in range(start, end):
        h.set_key(str(i))
        h.update(value)


def _check_unexpired_keys(h: Harness, start: int, end: int, expected: Any) -> None:
    for i in range(start, end):
        h.set_key(str(i))
        assert h.get() == expected, f"key {i}"


def _check_expired_keys(h: Harness, start: int, end: int) -> None:
    """As Flink: each key must be physically gone right after it becomes current."""
    left = []
    for i in range(start, end):
        h.set_key(str(i))
        if h.present():
            left.append(i)
    assert not left, f"{len(left)} of {end - start} expired keys not cleaned up, e.g. {left[:5]}"


def _trigger_more_cleanup_by_other_ops(h: Harness) -> None:
    for i in range(INC_CLEANUP_ALL_KEYS, INC_CLEANUP_ALL_KEYS * 2):
        h.set_key(str(i))
        if i % 2 == 0:
            h.get()
        else:
            h.update(h.ctx.update_empty)


@all_kinds
def test_incremental_cleanup_whole_state(ctx: Ctx) -> None:
    h = Harness(ctx, conf().cleanup_incrementally(5, True).build())
    h.time = 0
    _update_keys(h, 0, INC_CLEANUP_ALL_KEYS, ctx.update_empty)
    before = h.backend.num_entries()
    assert before == INC_CLEANUP_ALL_KEYS
    h.time = 120  # all expired
    for i in range(INC_CLEANUP_ALL_KEYS):  # set_current_key alone runs the cleanup
        h.set_key(str(i))
    assert h.backend.num_entries() < before
    _check_expired_keys(h, 0, INC_CLEANUP_ALL_KEYS)
    assert h.backend.num_entries() == 0
    assert h.stored_keys() == set()


@all_kinds
def test_set_current_key_cleans_only_with_run_cleanup_for_every_record(ctx: Ctx) -> None:
    """Flink registers a key-selection listener only for ``runCleanupForEveryRecord``."""
    h = Harness(ctx, conf().cleanup_incrementally(5, False).build())
    h.time = 0
    _update_keys(h, 0, 100, ctx.update_empty)
    h.time = 120
    for _ in range(3):
        for i in range(100):
            h.set_key(str(i))
    assert h.backend.num_entries() == 100
    # ... while state accesses do run it
    for _ in range(3):
        for i in range(100, 200):
            h.set_key(str(i))
            h.get()
    assert h.backend.num_entries() == 0


@all_kinds
def test_disabled_background_cleanup_never_sweeps(ctx: Ctx) -> None:
    h = Harness(ctx, conf().disable_cleanup_in_background().build())
    h.time = 0
    _update_keys(h, 0, 100, ctx.update_empty)
    h.time = 500
    for _ in range(2):
        for i in range(100, 200):
            h.set_key(str(i))
            h.get()
    assert h.backend.num_entries() == 100
    assert h.stored_keys() == {str(i) for i in range(100)}


@all_kinds
@pytest.mark.parametrize("disable_first", [False, True], ids=["incremental_then_disable", "disable_then_incremental"])
def test_explicit_incremental_cleanup_survives_disable_cleanup_in_background(ctx: Ctx, disable_first: bool) -> None:
    """``disableCleanupInBackground()`` only drops the *default* strategies: Flink
    2.3's ``CleanupStrategies.getIncrementalCleanupStrategy()`` is
    ``strategies.getOrDefault(INCREMENTAL_CLEANUP, isCleanupInBackground ? DEFAULT : null)``,
    so an explicit ``cleanupIncrementally`` stays on in either order."""
    builder = conf()
    if disable_first:
        builder = builder.disable_cleanup_in_background().cleanup_incrementally(5, True)
    else:
        builder = builder.cleanup_incrementally(5, True).disable_cleanup_in_background()
    h = Harness(ctx, builder.build())
    h.time = 0
    _update_keys(h, 0, 100, ctx.update_empty)
    h.time = 120
    for _ in range(40):
        for i in range(100):
            h.set_key(str(i))
    assert h.backend.num_entries() == 0


@all_kinds
def test_incremental_cleanup_with_concurrent_snapshot(ctx: Ctx) -> None:
    """Flink's ``testIncrementalCleanup``: a snapshot taken (and not released)
    before expiry keeps its contents while the cleanup empties the live state."""
    h = Harness(ctx, conf().cleanup_incrementally(5, True).build())
    m = KEYS_TO_UPDATE
    n = INC_CLEANUP_ALL_KEYS

    h.time = 0
    _update_keys(h, 0, n, ctx.update_empty)
    h.time = 50
    _update_keys(h, 0, m, ctx.update_unexpired)
    snapshot = h.backend.snapshot()
    expected_in_snapshot = sorted(map(repr, snapshot.entries(h.desc.name)))

    _update_keys(h, m, m * 2, ctx.update_unexpired)  # concurrently with the snapshot
    h.time = 120  # the rest expires
    _trigger_more_cleanup_by_other_ops(h)
    _check_expired_keys(h, m * 2, n)
    _check_unexpired_keys(h, m * 2 - 10, m * 2, ctx.get_unexpired)

    assert sorted(map(repr, snapshot.entries(h.desc.name))) == expected_in_snapshot
    assert {rec[0] for rec in snapshot.entries(h.desc.name)} == {str(i) for i in range(n)}

    h.time = 50  # restore the snapshot, which discards the concurrent updates
    h.restore(snapshot)
    snapshot.release()
    _check_unexpired_keys(h, m, n, ctx.get_update_empty)

    h.time = 120
    for i in range(m >> 1, m + (m >> 2)):  # remove some
        h.set_key(str(i))
        h.state.clear()
    _check_unexpired_keys(h, 0, m >> 1, ctx.get_unexpired)
    _trigger_more_cleanup_by_other_ops(h)
    _check_expired_keys(h, m, m * 2)  # restored with their original (expired) values

    h.time = 170
    _check_expired_keys(h, m >> 1, n)
    _check_expired_keys(h, 0, m >> 1)
