"""``StateFuture``, ``StateFutureUtils`` and the ``Mailbox`` (Flink's StateFutureTest and
ContextStateFutureImplTest behaviours)."""

from __future__ import annotations

import itertools
import threading
from typing import Any

import pytest

from cowmap.asyncstate import Mailbox, StateFuture, StateFutureUtils


class Ctx:
    """A record context that counts references (Flink's RecordContext)."""

    def __init__(self) -> None:
        self.refs = 0
        self.max_refs = 0

    def retain(self) -> None:
        self.refs += 1
        self.max_refs = max(self.max_refs, self.refs)

    def release(self) -> None:
        assert self.refs > 0, "released more than retained"
        self.refs -= 1


def done(v: Any) -> StateFuture[Any]:
    return StateFutureUtils.completed_future(v)


# --------------------------------------------------------------------------- chaining


def test_callbacks_on_a_completed_future_run_inline() -> None:
    seen: list[Any] = []
    f = done(3)
    g = f.then_apply(lambda x: x + 1)
    assert g.is_done() and g.get() == 4
    f.then_accept(seen.append)
    assert seen == [3]


def test_callbacks_wait_for_completion_and_run_in_order() -> None:
    seen: list[Any] = []
    f: StateFuture[int] = StateFuture()
    f.then_accept(lambda x: seen.append(("a", x)))
    f.then_accept(lambda x: seen.append(("b", x)))
    assert seen == []
    f.complete(7)
    assert seen == [("a", 7), ("b", 7)]
    with pytest.raises(RuntimeError, match="already complete"):
        f.complete(8)


def test_then_compose_and_combine() -> None:
    a: StateFuture[int] = StateFuture()
    b: StateFuture[int] = StateFuture()
    inner: StateFuture[int] = StateFuture()
    composed = a.then_compose(lambda x: inner.then_apply(lambda y: x * y))
    combined = a.then_combine(b, lambda x, y: (x, y))
    a.complete(6)
    assert not composed.is_done() and not combined.is_done()
    inner.complete(7)
    assert composed.get() == 42
    b.complete("b")
    assert combined.get() == (6, "b")


@pytest.mark.parametrize("value", [1, 2])
def test_conditional_variants(value: int) -> None:
    even = value % 2 == 0
    f = done(value)
    assert f.then_conditionally_apply(lambda x: x % 2 == 0, lambda x: "even", lambda x: "odd").get() == (
        even,
        "even" if even else "odd",
    )
    assert f.then_conditionally_apply(lambda x: x % 2 == 0, lambda x: x * 10).get() == (
        even,
        value * 10 if even else None,
    )
    seen: list[str] = []
    accepted = f.then_conditionally_accept(lambda x: x % 2 == 0, lambda x: seen.append("t"), lambda x: seen.append("f"))
    assert accepted.get() is even
    assert seen == ["t" if even else "f"]
    got = f.then_conditionally_compose(lambda x: x % 2 == 0, lambda x: done("T"), lambda x: done("F")).get()
    assert got == (even, "T" if even else "F")
    assert f.then_conditionally_compose(lambda x: x % 2 == 0, lambda x: done("T")).get() == (
        even,
        "T" if even else None,
    )


def test_combine_all_keeps_input_order_and_waits_for_the_last() -> None:
    fs: list[StateFuture[int]] = [StateFuture() for _ in range(4)]
    all_of = StateFutureUtils.combine_all(fs)
    for i in (2, 0, 3):
        fs[i].complete(i * 10)
        assert not all_of.is_done()
    fs[1].complete(10)
    assert all_of.get() == [0, 10, 20, 30]
    assert StateFutureUtils.combine_all([]).get() == []
    assert StateFutureUtils.completed_void_future().get() is None
    assert StateFutureUtils.to_iterable(done(iter([1, 2]))).get() == [1, 2]


def test_user_code_exceptions_surface_and_fail_the_chain() -> None:
    f: StateFuture[int] = StateFuture()
    g = f.then_apply(lambda x: 1 // x)
    h = g.then_apply(lambda x: x + 1)
    with pytest.raises(ZeroDivisionError):
        f.complete(0)  # the callback runs here, on the task thread: it raises here
    with pytest.raises(ZeroDivisionError):
        g.get()
    with pytest.raises(ZeroDivisionError):
        h.get()  # propagated down the chain without running h's function


def test_bad_arguments_are_type_errors() -> None:
    f = done(1)
    with pytest.raises(TypeError, match="callable"):
        f.then_apply(3)  # type: ignore[arg-type]
    with pytest.raises(TypeError, match="StateFuture"):
        f.then_compose(lambda x: x)
    with pytest.raises(TypeError, match="StateFuture"):
        StateFutureUtils.combine_all([1])  # type: ignore[list-item]


# --------------------------------------------------------------------------- reference counts


def _build_chain(ctx: Ctx, sources: list[StateFuture[int]], log: list[str]) -> StateFuture[Any]:
    """Chained and combined futures over 5 sources, like Flink's all-orders test."""
    a, b, c, d, e = sources
    x = a.then_apply(lambda v: v + 1)
    y = b.then_compose(lambda v: c.then_apply(lambda w: v + w))
    z = x.then_combine(y, lambda p, q: p * q)
    w = d.then_conditionally_compose(lambda v: v > 0, lambda v: e.then_apply(lambda u: u - v))
    return StateFutureUtils.combine_all([z, w]).then_accept(lambda r: log.append(repr(r)))


@pytest.mark.parametrize("order", list(itertools.permutations(range(5))), ids=lambda o: "".join(map(str, o)))
def test_every_completion_order_returns_the_context_to_zero(order: tuple[int, ...]) -> None:
    ctx = Ctx()
    sources: list[StateFuture[int]] = [StateFuture(context=ctx) for _ in range(5)]
    log: list[str] = []
    final = _build_chain(ctx, sources, log)
    assert ctx.refs > 0
    for i in order:
        sources[i].complete(i + 1)
    assert final.is_done()
    assert log == ["[10, (True, 1)]"]  # (1+1) * (2+3), 5-4
    assert ctx.refs == 0


def test_callback_count_each_holds_a_reference() -> None:
    ctx = Ctx()
    f: StateFuture[int] = StateFuture(context=ctx)
    assert ctx.refs == 1  # the pending future
    f.then_accept(lambda v: None)
    assert ctx.refs == 3  # + the callback + the derived future
    f.complete(1)
    assert ctx.refs == 0


# --------------------------------------------------------------------------- mailbox and threads


def test_completion_on_another_thread_runs_callbacks_on_the_task_thread() -> None:
    mb = Mailbox()
    ran_on: list[int] = []
    f: StateFuture[int] = StateFuture(mb)
    g = f.then_apply(lambda v: ran_on.append(threading.get_ident()) or v * 2)
    t = threading.Thread(target=f.complete, args=(21,))
    t.start()
    t.join()
    assert not g.is_done()  # only a mail was posted
    assert mb.run_until(g.is_done, timeout=5)
    assert g.get() == 42
    assert ran_on == [threading.get_ident()]


def test_mailbox_runs_mails_in_order_and_surfaces_errors() -> None:
    mb = Mailbox()
    seen: list[int] = []
    for i in range(3):
        mb.post(lambda i=i: seen.append(i))
    mb.post(lambda: 1 // 0)
    mb.post(lambda: seen.append(99))
    with pytest.raises(ZeroDivisionError):
        mb.run_available()
    assert seen == [0, 1, 2]
    assert mb.run_available() == 1 and seen[-1] == 99
    with pytest.raises(TypeError):
        mb.post(5)  # type: ignore[arg-type]


def test_mailbox_is_driven_only_by_its_task_thread() -> None:
    mb = Mailbox()
    errors: list[BaseException] = []

    def other() -> None:
        try:
            mb.run_available()
        except RuntimeError as exc:
            errors.append(exc)

    t = threading.Thread(target=other)
    t.start()
    t.join()
    assert errors and "task thread" in str(errors[0])
    assert mb.run_until(lambda: False, timeout=0.01) is False


def test_many_threads_post_without_losing_mails() -> None:
    mb = Mailbox()
    count = [0]

    def bump() -> None:
        count[0] += 1

    threads = [threading.Thread(target=lambda: [mb.post(bump) for _ in range(2000)]) for _ in range(4)]
    for t in threads:
        t.start()
    assert mb.run_until(lambda: count[0] == 8000, timeout=30)
    for t in threads:
        t.join()
    mb.run_available()
    assert count[0] == 8000


# --------------------------------------------------------------------------- compiled steps


def test_a_failed_source_skips_every_step_kind() -> None:
    f: StateFuture[int] = StateFuture()
    calls: list[str] = []
    derived = [
        f.then_apply(lambda x: calls.append("apply")),
        f.then_accept(lambda x: calls.append("accept")),
        f.then_compose(lambda x: calls.append("compose")),
        f.then_combine(done(1), lambda x, y: calls.append("combine")),
        f.then_conditionally_apply(lambda x: calls.append("cond") or True, lambda x: None),
        f.then_conditionally_accept(lambda x: calls.append("cond") or True, lambda x: None),
        f.then_conditionally_compose(lambda x: calls.append("cond") or True, lambda x: done(1)),
        StateFutureUtils.to_iterable(f),
    ]
    f.complete_exceptionally(KeyError("boom"))
    assert calls == []
    for d in derived:
        with pytest.raises(KeyError, match="boom"):
            d.get()


def test_then_combine_waits_for_a_failing_other() -> None:
    a: StateFuture[int] = StateFuture()
    b: StateFuture[int] = StateFuture()
    c = a.then_combine(b, lambda x, y: x + y)
    a.complete(1)
    assert not c.is_done()
    b.complete_exceptionally(ValueError("other"))
    with pytest.raises(ValueError, match="other"):
        c.get()


def test_a_compose_function_returning_no_future_fails_the_chain() -> None:
    ctx = Ctx()
    f: StateFuture[int] = StateFuture(context=ctx)
    g = f.then_compose(lambda x: x + 1)
    with pytest.raises(TypeError, match="then_compose's function must return a StateFuture, not int"):
        f.complete(1)
    with pytest.raises(TypeError):
        g.get()
    assert ctx.refs == 0


def test_a_raising_callback_releases_the_references_of_those_after_it() -> None:
    ctx = Ctx()
    f: StateFuture[int] = StateFuture(context=ctx)
    seen: list[int] = []
    f.then_accept(seen.append)
    f.then_accept(lambda x: 1 // 0)
    f.then_accept(seen.append)  # does not run: the one before it raised
    assert ctx.refs == 7
    with pytest.raises(ZeroDivisionError):
        f.complete(5)
    assert seen == [5]
    assert ctx.refs == 1  # the derived future of the skipped callback is still pending


def test_on_done_needs_a_callable() -> None:
    with pytest.raises(TypeError, match="callable"):
        StateFuture()._on_done(3)  # type: ignore[arg-type]


def test_a_long_chain_of_derived_futures_completes_in_order() -> None:
    ctx = Ctx()
    src: StateFuture[int] = StateFuture(context=ctx)
    f: StateFuture[Any] = src
    for i in range(200):
        f = f.then_apply(lambda x, i=i: x + i) if i % 2 else f.then_compose(lambda x: done(x * 1))
    src.complete(0)
    assert f.get() == sum(i for i in range(200) if i % 2)
    assert ctx.refs == 0


@pytest.mark.parametrize("how", ["compose", "conditionally_compose", "combine"])
def test_waiting_on_a_future_completed_on_another_thread_runs_callbacks_on_the_task_thread(how: str) -> None:
    mb = Mailbox()
    ran_on: list[int] = []
    f: StateFuture[int] = StateFuture(mb)
    ext: StateFuture[int] = StateFuture()  # no mailbox: completed by an I/O thread
    if how == "compose":
        g = f.then_compose(lambda v: ext)
    elif how == "conditionally_compose":
        g = f.then_conditionally_compose(lambda v: True, lambda v: ext)
    else:
        g = f.then_combine(ext, lambda a, b: b)
    h = g.then_accept(lambda v: ran_on.append(threading.get_ident()))
    f.complete(1)
    t = threading.Thread(target=ext.complete, args=(2,))
    t.start()
    t.join()
    assert not g.is_done() and ran_on == []  # only a mail was posted
    assert mb.run_until(h.is_done, timeout=5)
    assert ran_on == [threading.get_ident()]
    assert g.get() == ((True, 2) if how == "conditionally_compose" else 2)
