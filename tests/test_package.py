"""The package imports, exports its public API (docs/architecture.md#conventions), and the README examples run."""

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


def run_readme_example(marker: str, namespace: dict | None = None) -> dict:
    """Execute the README's first python block that mentions ``marker``; its namespace."""
    readme = (Path(__file__).resolve().parents[1] / "README.md").read_text()
    blocks = [b for b in re.findall(r"```python\n(.*?)```", readme, re.S) if marker in b]
    assert blocks, f"README has no python example using {marker}"
    namespace = {} if namespace is None else namespace
    exec(compile(blocks[0], "README.md", "exec"), namespace)
    return namespace


def test_readme_python_example_runs(capsys):
    m = run_readme_example("CopyOnWriteStateMap", {"copy": copy})["m"]
    assert m.get("user-1", "window-0") == [1, 2, 3]
    assert not m.contains_key("session", "ns")
    assert len(m) == 2 + 1_000_000
    assert "[('user-1', 'window-0', [1, 2])]" in capsys.readouterr().out


def test_readme_keyed_state_example_runs(capsys):
    namespace = run_readme_example("KeyedStateBackend(max_parallelism")
    assert capsys.readouterr().out.splitlines() == ["2 ['/a', '/c']", "0 False []"]
    assert namespace["restored"].num_entries() == 4  # 2 users x (count, seen): snapshot taken before expiry
    assert namespace["snap"].released


def test_readme_async_example_runs(capsys):
    namespace = run_readme_example("AsyncExecutionController")
    assert capsys.readouterr().out.splitlines() == ["2"]
    assert namespace["aec"].in_flight_records == 0
