"""``StateFuture``: the result of an async state request (Flink 2.x's ``StateFuture``).

Callbacks registered with ``then_*`` run on the task thread: inline when the
future is already complete, else when it completes — right away if it is
completed on the task thread, otherwise through a mail posted to the task
thread's mailbox. An exception raised by a callback completes the derived
future exceptionally and is re-raised where the task thread runs that
callback, so it fails the processing instead of being swallowed.

Each future may belong to a record context (``retain()`` / ``release()``): as
in Flink's ``ContextStateFutureImpl`` it holds one reference until it
completes and one per registered callback until that callback has run, so the
context lives exactly as long as work of its record is pending.
"""

from __future__ import annotations

from typing import Any, Callable, Generic, Iterable, Protocol, TypeVar

from cowmap.asyncstate.mailbox import Mailbox

__all__ = ["RecordContextLike", "StateFuture", "StateFutureUtils"]

T = TypeVar("T")
U = TypeVar("U")
V = TypeVar("V")

_PENDING = object()


class RecordContextLike(Protocol):
    def retain(self) -> None: ...
    def release(self) -> None: ...


class StateFuture(Generic[T]):
    """A value that a state request will produce, with Flink's ``then_*`` chaining."""

    __slots__ = ("_result", "_exc", "_callbacks", "_mailbox", "_ctx")

    def __init__(self, mailbox: Mailbox | None = None, context: RecordContextLike | None = None) -> None:
        self._result: Any = _PENDING
        self._exc: BaseException | None = None
        self._callbacks: list[Callable[[], None]] | None = []
        self._mailbox = mailbox
        self._ctx = context
        if context is not None:
            context.retain()

    # ------------------------------------------------------------ completion

    def is_done(self) -> bool:
        return self._callbacks is None

    def get(self) -> T:
        """The result of a completed future (raises its exception; RuntimeError if pending)."""
        if self._callbacks is not None:
            raise RuntimeError("the future is not complete yet")
        if self._exc is not None:
            raise self._exc
        return self._result  # type: ignore[no-any-return]

    def complete(self, value: T) -> None:
        """Complete with ``value``; callable from any thread (callbacks run on the task thread)."""
        self._finish(value, None)

    def complete_exceptionally(self, exc: BaseException) -> None:
        if not isinstance(exc, BaseException):
            raise TypeError(f"expected an exception, not {type(exc).__name__}")
        self._finish(None, exc)

    def _finish(self, value: Any, exc: BaseException | None) -> None:
        mb = self._mailbox
        if mb is not None and not mb.is_task_thread():
            mb.post(lambda: self._finish_here(value, exc))
        else:
            self._finish_here(value, exc)

    def _finish_here(self, value: Any, exc: BaseException | None) -> None:
        callbacks = self._callbacks
        if callbacks is None:
            raise RuntimeError("the future is already complete")
        self._result = value
        self._exc = exc
        self._callbacks = None
        ctx = self._ctx
        if ctx is None:
            for cb in callbacks:
                cb()
            return
        try:
            for i, cb in enumerate(callbacks):
                try:
                    cb()
                finally:
                    ctx.release()  # the reference the callback held
        except BaseException:
            for _ in range(len(callbacks) - i - 1):  # callbacks that will not run now
                ctx.release()
            raise
        finally:
            ctx.release()  # the reference the pending future held

    # ------------------------------------------------------------ chaining

    def _derived(self) -> StateFuture[Any]:
        return StateFuture(self._mailbox, self._ctx)

    def _on_done(self, cb: Callable[[], None]) -> None:
        """Run ``cb`` when complete (now if already); counts as a registered callback."""
        callbacks = self._callbacks
        if callbacks is None:
            cb()
            return
        if self._ctx is not None:
            self._ctx.retain()  # released by _finish_here once cb has run
        callbacks.append(cb)

    def _chain(self, step: Callable[[StateFuture[Any], Any], None]) -> StateFuture[Any]:
        """A derived future completed by ``step(derived, result)``; errors propagate."""
        out = self._derived()

        def cb() -> None:
            if self._exc is not None:
                out._finish_here(None, self._exc)
                return
            try:
                step(out, self._result)
            except BaseException as exc:  # user code failed: fail the chain, surface it
                if not out.is_done():
                    out._finish_here(None, exc)
                raise

        self._on_done(cb)
        return out

    def then_apply(self, fn: Callable[[T], U]) -> StateFuture[U]:
        """A future of ``fn(result)``."""
        _callable(fn, "fn")
        return self._chain(lambda out, r: out._finish_here(fn(r), None))

    def then_accept(self, action: Callable[[T], Any]) -> StateFuture[None]:
        """A future of None, completed after ``action(result)`` ran."""
        _callable(action, "action")

        def step(out: StateFuture[Any], r: Any) -> None:
            action(r)
            out._finish_here(None, None)

        return self._chain(step)

    def then_compose(self, fn: Callable[[T], StateFuture[U]]) -> StateFuture[U]:
        """A future of the result of the future ``fn(result)`` returns."""
        _callable(fn, "fn")

        def step(out: StateFuture[Any], r: Any) -> None:
            inner = _as_future(fn(r), "then_compose's function")
            inner._on_done(lambda: out._finish_here(inner._result, inner._exc))

        return self._chain(step)

    def then_combine(self, other: StateFuture[U], fn: Callable[[T, U], V]) -> StateFuture[V]:
        """A future of ``fn(result, other's result)``, once both are complete."""
        _as_future(other, "other")
        _callable(fn, "fn")

        def step(out: StateFuture[Any], r: Any) -> None:
            def both() -> None:
                if other._exc is not None:
                    out._finish_here(None, other._exc)
                    return
                try:
                    value = fn(r, other._result)
                except BaseException as exc:
                    out._finish_here(None, exc)
                    raise
                out._finish_here(value, None)

            other._on_done(both)

        return self._chain(step)

    def then_conditionally_apply(
        self, condition: Callable[[T], bool], if_true: Callable[[T], U], if_false: Callable[[T], V] | None = None
    ) -> StateFuture[tuple[bool, Any]]:
        """A future of ``(condition(result), the applied branch's result or None)``."""
        _callable(condition, "condition")
        _callable(if_true, "if_true")

        def step(out: StateFuture[Any], r: Any) -> None:
            if condition(r):
                out._finish_here((True, if_true(r)), None)
            else:
                out._finish_here((False, if_false(r) if if_false is not None else None), None)

        return self._chain(step)

    def then_conditionally_accept(
        self, condition: Callable[[T], bool], if_true: Callable[[T], Any], if_false: Callable[[T], Any] | None = None
    ) -> StateFuture[bool]:
        """A future of ``condition(result)``, completed after the chosen action ran."""
        _callable(condition, "condition")
        _callable(if_true, "if_true")

        def step(out: StateFuture[Any], r: Any) -> None:
            ok = bool(condition(r))
            if ok:
                if_true(r)
            elif if_false is not None:
                if_false(r)
            out._finish_here(ok, None)

        return self._chain(step)

    def then_conditionally_compose(
        self,
        condition: Callable[[T], bool],
        if_true: Callable[[T], StateFuture[U]],
        if_false: Callable[[T], StateFuture[V]] | None = None,
    ) -> StateFuture[tuple[bool, Any]]:
        """A future of ``(condition(result), the chosen branch future's result or None)``."""
        _callable(condition, "condition")
        _callable(if_true, "if_true")

        def step(out: StateFuture[Any], r: Any) -> None:
            ok = bool(condition(r))
            branch = if_true if ok else if_false
            if branch is None:
                out._finish_here((False, None), None)
                return
            inner = _as_future(branch(r), "then_conditionally_compose's function")
            inner._on_done(
                lambda: out._finish_here(None, inner._exc)
                if inner._exc is not None
                else out._finish_here((ok, inner._result), None)
            )

        return self._chain(step)

    def __repr__(self) -> str:
        if self._callbacks is not None:
            return "<StateFuture pending>"
        if self._exc is not None:
            return f"<StateFuture failed: {self._exc!r}>"
        return f"<StateFuture done: {self._result!r}>"


def _callable(fn: object, what: str) -> None:
    if not callable(fn):
        raise TypeError(f"{what} must be callable, not {type(fn).__name__}")


def _as_future(f: object, what: str) -> StateFuture[Any]:
    if not isinstance(f, StateFuture):
        raise TypeError(f"{what} must return a StateFuture, not {type(f).__name__}")
    return f


class StateFutureUtils:
    """Helpers with Flink's names."""

    @staticmethod
    def completed_future(value: T) -> StateFuture[T]:
        f: StateFuture[T] = StateFuture()
        f._finish_here(value, None)
        return f

    @staticmethod
    def completed_void_future() -> StateFuture[None]:
        return StateFutureUtils.completed_future(None)

    @staticmethod
    def combine_all(futures: Iterable[StateFuture[T]]) -> StateFuture[list[T]]:
        """A future of every result, in input order, once the last one completes."""
        fs = [_as_future(f, "combine_all's input") for f in futures]
        if not fs:
            return StateFutureUtils.completed_future([])
        out: StateFuture[list[T]] = fs[0]._derived()
        left = [len(fs)]

        def one_done() -> None:
            left[0] -= 1
            if left[0] == 0 and not out.is_done():
                failed = next((f._exc for f in fs if f._exc is not None), None)
                out._finish_here(None if failed else [f._result for f in fs], failed)

        for f in fs:
            f._on_done(one_done)
        return out

    @staticmethod
    def to_iterable(future: StateFuture[Any]) -> StateFuture[list[Any]]:
        """A future of a list of what the iterable result of ``future`` yields."""
        _as_future(future, "to_iterable's input")
        return future._chain(lambda out, it: out._finish_here([] if it is None else list(it), None))
