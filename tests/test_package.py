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
    for name in ("KeyedStateBackend", "ValueStateDescriptor", "MapStateDescriptor", "StateTtlConfig", "MapState"):
        assert name in cowmap.__all__
        assert getattr(cowmap, name) is getattr(__import__("cowmap.state").state, name)


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


def test_readme_keyed_state_example_runs(capsys):
    readme = (Path(__file__).resolve().parents[1] / "README.md").read_text()
    blocks = [b for b in re.findall(r"```python\n(.*?)```", readme, re.S) if "KeyedStateBackend" in b]
    assert blocks, "README has no keyed state example"
    namespace: dict = {}
    exec(compile(blocks[0], "README.md", "exec"), namespace)
    out = capsys.readouterr().out.splitlines()
    assert out == ["2 ['/a', '/c']", "0 False []"]
    restored = namespace["restored"]
    assert restored.num_entries() == 4  # 2 users x (count, seen): the snapshot was taken before expiry
    snap = namespace["snap"]
    assert snap.released
