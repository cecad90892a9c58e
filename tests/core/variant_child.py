"""The child process of the tests on other builds of the extension modules
(``test_plain_batch_build.py``, ``test_public_api_build.py``); not a test module itself.

    python variant_child.py ROOT|- BUILD pytest ARGS...
    python variant_child.py ROOT|- BUILD trace OUT

With ROOT, cowmap and all its submodules are imported from the package directory ROOT/cowmap
and nowhere else: a finder placed first on ``sys.meta_path`` resolves them there, ahead of
an editable install's finder (which would load the normal build whatever ``sys.path``
says) and of site-packages. With ``-``, cowmap is imported as installed. The child checks
which build it got (BUILD: ``plain``, ``cowmap._core.PLAIN_BATCH`` True; ``public``,
``cowmap._core.CPYTHON_INTERNALS`` False; ``normal``, neither) and that every cowmap module
it loaded came from ROOT, then runs pytest with ARGS, or writes the lines of
``batch_trace.trace()`` to OUT.
"""

from __future__ import annotations

import importlib.machinery
import json
import os
import sys
from typing import Any


class _OnlyFrom:
    """A meta path finder that finds cowmap and its submodules under one directory only."""

    def __init__(self, root: str) -> None:
        self.root = root

    def find_spec(self, name: str, path: Any = None, target: Any = None) -> Any:
        if name != "cowmap" and not name.startswith("cowmap."):
            return None
        spec = importlib.machinery.PathFinder.find_spec(name, [self.root] if name == "cowmap" else path)
        if spec is None:  # never fall back on the installed package
            raise ModuleNotFoundError(f"{name} is not in {self.root}", name=name)
        return spec


def _loaded_from(root: str) -> list[str]:
    """The cowmap modules loaded from outside root."""
    root = os.path.realpath(root) + os.sep
    return [f"{name}: {mod.__file__}" for name, mod in sorted(sys.modules.items())
            if (name == "cowmap" or name.startswith("cowmap.")) and getattr(mod, "__file__", None)
            and not os.path.realpath(mod.__file__).startswith(root)]


def main(argv: list[str]) -> int:
    root, build, mode, *rest = argv
    if root != "-":
        sys.meta_path.insert(0, _OnlyFrom(root))
    import cowmap
    import cowmap._core

    core = cowmap._core
    print(f"cowmap._core from {core.__file__}, PLAIN_BATCH={core.PLAIN_BATCH}, "
          f"CPYTHON_INTERNALS={core.CPYTHON_INTERNALS}", flush=True)
    if core.PLAIN_BATCH is not (build == "plain") or core.CPYTHON_INTERNALS is (build == "public"):
        print(f"expected the {build} build", flush=True)
        return 3
    if mode == "pytest":
        import pytest

        code = int(pytest.main(rest))
    else:
        import batch_trace

        with open(rest[0], "w") as f:
            json.dump(batch_trace.trace(), f)
        code = 0
    if root != "-" and (stray := _loaded_from(root)):
        print("cowmap modules loaded from outside " + root + ":\n" + "\n".join(stray), flush=True)
        return 4
    return code


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
