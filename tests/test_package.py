"""The package imports, exports what DESIGN.md promises, and the README example runs."""

import copy
import re
from pathlib import Path

import cowmap


def test_public_api_is_exported():
    for name in ("CopyOnWriteStateMap", "StateMapSnapshot", "StateIncrementalVisitor", "NO_TIMESTAMP"):
        assert name in cowmap.__all__
        assert getattr(cowmap, name) is not None
    assert cowmap.NO_TIMESTAMP == 2**63 - 1


def test_readme_python_example_runs(capsys):
    readme = (Path(__file__).resolve().parents[1] / "README.md").read_text()
    blocks = re.findall(r"```python\n(.*?)```", readme, re.S)
    assert blocks, "README has no python example"
    namespace: dict = {"copy": copy}
    exec(compile(blocks[0], "README.md", "exec"), namespace)
    m = namespace["m"]
    assert m.get("user-1", "window-0") == [1, 2, 3]
    assert not m.contains_key("session", "ns")
    assert len(m) == 2 + 1_000_000
    assert "[('user-1', 'window-0', [1, 2])]" in capsys.readouterr().out
