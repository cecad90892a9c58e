"""The async twins of the state methods (see docs/architecture.md#the-async-layer), mixed into the state classes.

Each queues a request with the backend's ``AsyncExecutionController`` (made
with the backend) for the record being processed, and returns a
``StateFuture``; the request runs the synchronous method, with its TTL
semantics, when the controller runs its batch.

The twins are compiled functions (``src/cowmap/_requests.pyx``) bound here as
methods: a request is one C call from the user's code to the controller.
Those completing with a ``StateIterator`` wrap the compiled request here.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from cowmap import _requests
from cowmap._requests import request as _request

if TYPE_CHECKING:
    from cowmap.asyncstate.future import StateFuture

__all__ = ["AsyncListMethods", "AsyncMapMethods", "AsyncMergingMethods", "AsyncValueMethods"]


def _iterator(items: Any) -> Any:
    from cowmap.asyncstate.iterator import StateIterator

    return StateIterator(list(items))


class AsyncValueMethods:
    __slots__ = ()

    async_value = _requests.async_value
    async_update = _requests.async_update
    async_clear = _requests.async_clear


class AsyncListMethods:
    __slots__ = ()

    def async_get(self) -> StateFuture[Any]:
        """A future of a ``StateIterator`` over the elements."""
        return _request(self, "get").then_apply(_iterator)

    async_add = _requests.async_add
    async_add_all = _requests.async_list_add_all
    async_update = _requests.async_list_update
    async_clear = _requests.async_clear


class AsyncMapMethods:
    __slots__ = ()

    async_get = _requests.async_map_get
    async_put = _requests.async_map_put
    async_put_all = _requests.async_map_put_all
    async_remove = _requests.async_map_remove
    async_contains = _requests.async_map_contains

    def async_entries(self) -> StateFuture[Any]:
        """A future of a ``StateIterator`` over ``(user_key, value)`` pairs."""
        return _request(self, "items").then_apply(_iterator)

    def async_keys(self) -> StateFuture[Any]:
        return _request(self, "keys").then_apply(_iterator)

    def async_values(self) -> StateFuture[Any]:
        return _request(self, "values").then_apply(_iterator)

    async_is_empty = _requests.async_map_is_empty
    async_clear = _requests.async_clear


class AsyncMergingMethods:
    __slots__ = ()

    async_get = _requests.async_get_value
    async_add = _requests.async_add
    async_clear = _requests.async_clear
