"""Columns for the columnar state calls (``get_many``, ``update_many``, ...).

A column of keys or values may be a numpy array, a pandas Series or Index, a
pyarrow Array or ChunkedArray, or any sequence. The compiled calls take two
forms: an int64 numpy array (integer columns: keys hashed and compared in C,
values made into ints as they are written) or a tuple of Python objects
(``tolist()`` of anything else, so numpy and pyarrow scalars arrive as the
Python objects a per-record loop over ``tolist()`` would see). Float values
stay a float64 array. Missing values (pandas ``NA``, pyarrow nulls) become None.

Everything here checks its input and copies nothing it need not: an int64
numpy array goes through as it is.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from cowmap._core import COL_FLOAT64, COL_INT64, COL_LIST

__all__ = ["check_typed", "key_column", "out_type", "typed", "value_column", "value_list"]

_INT64 = np.dtype(np.int64)
_FLOAT64 = np.dtype(np.float64)


def _from_pandas(col: Any) -> Any:
    """A pandas Series or Index as a numpy array; missing values of extension
    dtypes (``pd.NA``) as None; datetimes and timedeltas as the Timestamps and
    Timedeltas a loop over the column sees."""
    dtype = col.dtype
    if getattr(dtype, "kind", None) in ("M", "m"):
        return col.to_numpy(dtype=object)
    if isinstance(dtype, np.dtype):
        return col.to_numpy()
    if bool(col.isna().any()):
        return col.to_numpy(dtype=object, na_value=None)
    return col.to_numpy()


def _from_arrow(col: Any) -> Any:
    """A pyarrow Array or ChunkedArray as an int64 / float64 numpy array when it
    is integer or floating without nulls, else as a tuple of Python objects."""
    import pyarrow as pa

    t = col.type
    if col.null_count == 0 and (pa.types.is_integer(t) or pa.types.is_floating(t)):
        return col.to_numpy()
    return tuple(col.to_pylist())


def _as_column(col: Any, what: str) -> Any:
    """``col`` as a 1-D numpy array or a tuple."""
    if isinstance(col, np.ndarray):
        if col.ndim != 1:
            raise ValueError(f"{what} must be one-dimensional, got an array of shape {col.shape}")
        _check_plain(col, what)
        return col
    if isinstance(col, tuple):
        return col
    if isinstance(col, (str, bytes, bytearray, dict)) or col is None:
        raise TypeError(f"{what} must be a column (an array, Series or sequence), not {type(col).__name__}")
    module = type(col).__module__
    if module.startswith("pandas"):
        if getattr(col, "ndim", 1) != 1:
            raise ValueError(f"{what} must be one-dimensional (a Series or Index), got {type(col).__name__}")
        return _from_pandas(col)
    if module.startswith("pyarrow"):
        if not hasattr(col, "to_pylist") or not hasattr(col, "type"):
            raise TypeError(f"{what} must be a pyarrow Array or ChunkedArray, not {type(col).__name__}")
        return _from_arrow(col)
    if hasattr(col, "__array__") and not isinstance(col, (list, range)):
        arr = np.asarray(col)
        if arr.ndim != 1:
            raise ValueError(f"{what} must be one-dimensional, got shape {arr.shape}")
        _check_plain(arr, what)
        return arr
    try:
        return tuple(col)
    except TypeError:
        raise TypeError(f"{what} must be a column (an array, Series or sequence), not {type(col).__name__}") from None


def _check_plain(arr: np.ndarray, what: str) -> None:
    """``TypeError`` for a numpy array whose values a loop would not see as
    they are stored: a masked array (its mask would be ignored) or datetimes
    and timedeltas (``tolist()`` makes ints of some units, datetimes of others)."""
    if isinstance(arr, np.ma.MaskedArray):
        raise TypeError(f"{what} is a masked array: pass .filled(...) or .tolist() (None where masked)")
    if arr.dtype.kind in "Mm":
        raise TypeError(
            f"{what} is a numpy {arr.dtype} array: pass .astype('int64') (a number of its unit) or a pandas "
            "Series of it (Timestamps or Timedeltas)"
        )


def _fits_int64(arr: np.ndarray) -> bool:
    """Whether an integer array's values all fit int64 (only uint64 may not)."""
    return arr.dtype.kind == "i" or arr.dtype.itemsize < 8 or not len(arr) or int(arr.max()) < 2**63


def key_column(keys: Any) -> np.ndarray | tuple[Any, ...]:
    """``keys`` as the compiled calls take them: a contiguous int64 array for an
    integer column, else a tuple of Python objects. ``TypeError`` for a scalar,
    a str or a dict, ``ValueError`` for a 2-D array."""
    col = _as_column(keys, "keys")
    if isinstance(col, tuple):
        return col
    if col.dtype.kind in "iu" and _fits_int64(col):
        # a copy of our own (80 KB for 10,000 keys): the caller's array cannot change
        # under the call (a key's __eq__ runs Python code) after its key groups were taken
        return np.array(col, dtype=_INT64, order="C", copy=True)
    return tuple(col.tolist())


def value_column(values: Any, n: int, what: str = "values") -> np.ndarray | tuple[Any, ...]:
    """``values`` for ``n`` rows: an int64 array (integer columns), a float64
    array (floating columns) or a tuple of Python objects. ``ValueError`` when
    it has another length than the keys or is not one-dimensional."""
    col = _as_column(values, what)
    if len(col) != n:
        raise ValueError(f"{what} has {len(col)} rows, keys have {n}: columns must have the same length")
    if isinstance(col, tuple):
        return col
    kind = col.dtype.kind
    if kind in "iu" and _fits_int64(col):
        return np.ascontiguousarray(col, dtype=_INT64)
    if kind == "f":
        return np.ascontiguousarray(col, dtype=_FLOAT64)
    return tuple(col.tolist())


def out_type(dtype: Any) -> int:
    """The compiled calls' code for ``get_many(..., dtype=)``: a list for None,
    else an int64 or float64 array (``ValueError`` for other dtypes)."""
    if dtype is None:
        return COL_LIST
    d = np.dtype(dtype)
    if d == _INT64:
        return COL_INT64
    if d == _FLOAT64:
        return COL_FLOAT64
    raise ValueError(f"dtype must be None, int64 or float64, got {d}")


def value_list(values: Any, n: int, what: str = "values") -> list[Any]:
    """``values`` for ``n`` rows as a list of Python objects (what a per-record
    loop over ``tolist()`` sees); ``ValueError`` as :func:`value_column`."""
    col = value_column(values, n, what)
    return col.tolist() if isinstance(col, np.ndarray) else list(col)


def check_typed(dtype: Any, default: Any) -> int:
    """``out_type(dtype)``, checked before a ``get_many`` reads anything: an int64
    read needs a ``default`` (``ValueError``), as int64 has no NaN for a missing key,
    and a default must fit the array (``TypeError``: an int within int64, or a number
    for float64)."""
    code = out_type(dtype)
    if code == COL_INT64 and default is None:
        raise ValueError("an int64 read needs default= for keys with no value (there is no int64 NaN); "
                         "nothing was read")
    if code != COL_LIST and default is not None:
        # (the states themselves are held to the same rule: a float is not read into int64)
        ok = (
            isinstance(default, int | np.integer) and -(2**63) <= default < 2**63
            if code == COL_INT64 else isinstance(default, int | float | np.integer | np.floating)
        )
        if not ok:
            raise TypeError(
                f"default={default!r} does not fit {'an int64' if code == COL_INT64 else 'a float64'} read; "
                "nothing was read"
            )
    return code


def typed(values: list[Any], dtype: Any, default: Any, keys: Any) -> Any:
    """``values`` (None where a key has nothing) as ``get_many`` returns them:
    the list itself without ``dtype``, else a numpy array with ``default`` for
    None (None: NaN for float64, ``ValueError`` naming the key for int64)."""
    code = out_type(dtype)
    if code == COL_LIST:
        return values
    if default is None and code == COL_INT64:
        for i, v in enumerate(values):
            if v is None:
                k = keys[i].item() if isinstance(keys[i], np.generic) else keys[i]
                raise ValueError(
                    f"key {k!r} has no value: pass default= to read missing keys into an int64 array"
                )
    fill = default if default is not None else np.nan
    return np.array([fill if v is None else v for v in values], dtype=_INT64 if code == COL_INT64 else _FLOAT64)
