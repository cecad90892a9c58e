"""Refuses interpreters cowmap cannot run on safely; imported first by ``cowmap/__init__.py``.

The compiled core relies on the GIL to serialise every access to a map and its block
allocator: on a free-threaded build (``--disable-gil``, CPython 3.13 and later) threads would
corrupt them, so cowmap refuses to import there with a clear message.
"""

import sys


def free_threaded() -> bool:
    """Whether this interpreter is a free-threaded build."""
    if sys.version_info < (3, 13):
        return False
    import sysconfig

    return bool(sysconfig.get_config_var("Py_GIL_DISABLED"))


if free_threaded():
    raise ImportError(
        "cowmap does not support free-threaded CPython builds (this interpreter was built with "
        "--disable-gil): use a standard CPython 3.10-3.13 build"
    )
