"""The package imports, exports its public API (docs/architecture.md#conventions), and the README examples run:
every python block of README.md and docs/*.md."""

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


ROOT = Path(__file__).resolve().parents[1]

#: The README example each test below runs: the first python block that mentions the marker.
CORE_EXAMPLE = "CopyOnWriteStateMap"
KEYED_STATE_EXAMPLE = "KeyedStateBackend(max_parallelism"
ASYNC_EXAMPLE = "AsyncExecutionController"
COLUMNAR_EXAMPLE = "add_many(batch"
CHECKPOINT_EXAMPLE = "CheckpointStorage("
TIMERS_EXAMPLE = "get_timer_service("
#: run by tests/spark/test_examples.py, on the Spark tests' session
SPARK_EXAMPLE = "apply_with_state("


def python_blocks(path: Path) -> list[str]:
    """The ```python blocks of a markdown file, in order."""
    return re.findall(r"```python\n(.*?)```", path.read_text(), re.S)


def run_readme_example(marker: str, namespace: dict | None = None) -> dict:
    """Execute the README's first python block that mentions ``marker``; its namespace."""
    blocks = [b for b in python_blocks(ROOT / "README.md") if marker in b]
    assert blocks, f"README has no python example using {marker}"
    namespace = {} if namespace is None else namespace
    exec(compile(blocks[0], "README.md", "exec"), namespace)
    return namespace


def test_readme_python_example_runs(capsys):
    m = run_readme_example(CORE_EXAMPLE, {"copy": copy})["m"]
    assert m.get("user-1", "window-0") == [1, 2, 3]
    assert not m.contains_key("session", "ns")
    assert len(m) == 2 + 1_000_000
    assert "[('user-1', 'window-0', [1, 2])]" in capsys.readouterr().out


def test_readme_keyed_state_example_runs(capsys):
    namespace = run_readme_example(KEYED_STATE_EXAMPLE)
    assert capsys.readouterr().out.splitlines() == ["2 ['/a', '/c']", "0 False []"]
    assert namespace["restored"].num_entries() == 4  # 2 users x (count, seen): snapshot taken before expiry
    assert namespace["snap"].released


def test_readme_async_example_runs(capsys):
    namespace = run_readme_example(ASYNC_EXAMPLE)
    assert capsys.readouterr().out.splitlines() == ["2"]
    assert namespace["aec"].in_flight_records == 0


def test_readme_columnar_example_runs(capsys):
    run_readme_example(COLUMNAR_EXAMPLE)
    assert capsys.readouterr().out.splitlines() == ["[2 1 1 0]"]


def test_readme_checkpoint_example_runs(capsys):
    namespace = run_readme_example(CHECKPOINT_EXAMPLE)
    assert capsys.readouterr().out.splitlines() == ["41"]
    assert namespace["storage"].checkpoints() == [namespace["checkpoint_id"]]


def test_readme_timers_example_runs(capsys):
    namespace = run_readme_example(TIMERS_EXAMPLE)
    expected = [("bob", 60_000, 60_000, 1), ("ann", 0, 600_000, 2), ("ann", 4_000_000, 4_000_000, 1)]
    assert namespace["emitted"] == expected
    assert capsys.readouterr().out.splitlines() == [str(expected)]
    assert namespace["timers"].num_event_time_timers() == 0
    assert namespace["backend"].num_entries() == 0  # every session emitted and cleared


def test_every_python_example_in_the_docs_is_run():
    """Each python block of README.md is the one some test above runs, and docs/*.md has none
    (an example added there needs a test here that runs it and checks what it shows)."""
    blocks = python_blocks(ROOT / "README.md")
    markers = (
        CORE_EXAMPLE,
        KEYED_STATE_EXAMPLE,
        ASYNC_EXAMPLE,
        COLUMNAR_EXAMPLE,
        CHECKPOINT_EXAMPLE,
        TIMERS_EXAMPLE,
        SPARK_EXAMPLE,
    )
    run = [next(b for b in blocks if marker in b) for marker in markers]
    assert [b for b in blocks if b not in run] == []
    assert {doc.name: n for doc in (ROOT / "docs").glob("*.md") if (n := len(python_blocks(doc)))} == {}


def test_import_cowmap_does_not_load_numpy():
    """numpy is loaded by the first columnar call, not by ``import cowmap``: the
    harness can still configure it (its thread count) before it loads."""
    import subprocess
    import sys

    code = "import sys, cowmap, cowmap.state, cowmap.asyncstate; print('numpy' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "False"
