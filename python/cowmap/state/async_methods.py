"""The async twins of the state methods (DESIGN.md §4), mixed into the state classes.

Each queues a request with the backend's ``AsyncExecutionController`` (made
with the backend) for the record being processed, and returns a
``StateFuture``; the request runs the synchronous method, with its TTL
semantics, when the controller runs its batch.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Iterable, Mapping

if TYPE_CHECKING:
    from cowmap.asyncstate.future import StateFuture

__all__ = ["AsyncListMethods", "AsyncMapMethods", "AsyncMergingMethods", "AsyncValueMethods"]


def _request(state: Any, op: str, *args: Any) -> StateFuture[Any]:
    aec = state._b._aec
    if aec is None:
        raise RuntimeError(
            f"async calls on state {state._t.name!r} need an AsyncExecutionController for its backend"
        )
    return aec.handle_request(state, op, *args)


def _iterator(items: Any) -> Any:
    from cowmap.asyncstate.iterator import StateIterator

    return StateIterator(list(items))


class AsyncValueMethods:
    __slots__ = ()

    def async_value(self) -> StateFuture[Any]:
        return _request(self, "value")

    def async_update(self, value: Any) -> StateFuture[None]:
        return _request(self, "update", value)

    def async_clear(self) -> StateFuture[None]:
        return _request(self, "clear")


class AsyncListMethods:
    __slots__ = ()

    def async_get(self) -> StateFuture[Any]:
        """A future of a ``StateIterator`` over the elements."""
        return _request(self, "get").then_apply(_iterator)

    def async_add(self, value: Any) -> StateFuture[None]:
        return _request(self, "add", value)

    def async_add_all(self, values: Iterable[Any]) -> StateFuture[None]:
        return _request(self, "add_all", list(values) if values is not None else None)

    def async_update(self, values: Iterable[Any]) -> StateFuture[None]:
        return _request(self, "update", list(values) if values is not None else None)

    def async_clear(self) -> StateFuture[None]:
        return _request(self, "clear")


class AsyncMapMethods:
    __slots__ = ()

    def async_get(self, key: Any) -> StateFuture[Any]:
        return _request(self, "get", key)

    def async_put(self, key: Any, value: Any) -> StateFuture[None]:
        return _request(self, "put", key, value)

    def async_put_all(self, entries: Mapping[Any, Any]) -> StateFuture[None]:
        return _request(self, "put_all", dict(entries) if entries is not None else None)

    def async_remove(self, key: Any) -> StateFuture[None]:
        return _request(self, "remove", key)

    def async_contains(self, key: Any) -> StateFuture[bool]:
        return _request(self, "contains", key)

    def async_entries(self) -> StateFuture[Any]:
        """A future of a ``StateIterator`` over ``(user_key, value)`` pairs."""
        return _request(self, "items").then_apply(_iterator)

    def async_keys(self) -> StateFuture[Any]:
        return _request(self, "keys").then_apply(_iterator)

    def async_values(self) -> StateFuture[Any]:
        return _request(self, "values").then_apply(_iterator)

    def async_is_empty(self) -> StateFuture[bool]:
        return _request(self, "is_empty")

    def async_clear(self) -> StateFuture[None]:
        return _request(self, "clear")


class AsyncMergingMethods:
    __slots__ = ()

    def async_get(self) -> StateFuture[Any]:
        return _request(self, "get")

    def async_add(self, value: Any) -> StateFuture[None]:
        return _request(self, "add", value)

    def async_clear(self) -> StateFuture[None]:
        return _request(self, "clear")
