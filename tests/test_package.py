"""The package imports, exports its public API (docs/architecture.md#conventions), and the examples run:
every python block of README.md and of the docs' pages (docs/**/*.md)."""

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

#: Where each example the tests below run lives: (markdown file, a marker only its python block has).
QUICK_START = ("README.md", "for user in [")
SESSION_EXAMPLE = ("README.md", "def end_session(")
COLUMNS_AND_CHECKPOINT = ("README.md", "counts.add_many(batch.user")
MAP_EXAMPLE = ("docs/guide/map.md", "CopyOnWriteStateMap(")
KEYED_STATE_EXAMPLE = ("docs/guide/keyed-state.md", "KeyedStateBackend(max_parallelism=128, time_provider")
RESCALE_EXAMPLE = ("docs/guide/keyed-state.md", "key_group_range_for_operator(")
TTL_EXAMPLE = ("docs/guide/ttl.md", "ReturnExpiredIfNotCleanedUp")
COLUMNAR_EXAMPLE = ("docs/guide/columnar.md", "add_many(batch")
ASYNC_EXAMPLE = ("docs/guide/async-state.md", "AsyncExecutionController(")
TIMERS_EXAMPLE = ("docs/guide/timers.md", "get_timer_service(")
CHECKPOINT_EXAMPLE = ("docs/guide/checkpoints.md", "checkpoint_id = storage.save(backend)")
VERSIONS_EXAMPLE = ("docs/guide/checkpoints.md", "checkpoint_id=batch")
#: run by tests/spark/test_examples.py on the Spark tests' session: every block that calls it
SPARK_EXAMPLE = "apply_with_state("


def markdown_files() -> list[Path]:
    """README.md and every page of the docs."""
    return [ROOT / "README.md", *sorted((ROOT / "docs").rglob("*.md"))]


def python_blocks(path: Path) -> list[str]:
    """The ```python blocks of a markdown file, in order."""
    return re.findall(r"```python\n(.*?)```", path.read_text(), re.S)


def run_example(where: tuple[str, str], namespace: dict | None = None) -> dict:
    """Execute the python block of ``where[0]`` that mentions the marker ``where[1]``; its namespace."""
    path, marker = where
    blocks = [b for b in python_blocks(ROOT / path) if marker in b]
    assert len(blocks) == 1, f"{path} has {len(blocks)} python examples using {marker!r}, not 1"
    namespace = {} if namespace is None else namespace
    exec(compile(blocks[0], path, "exec"), namespace)
    return namespace


def test_quick_start_runs(capsys):
    run_example(QUICK_START)
    assert capsys.readouterr().out.splitlines() == ["2", "0"]


def test_map_example_runs(capsys):
    m = run_example(MAP_EXAMPLE, {"copy": copy})["m"]
    assert m.get("user-1", "window-0") == [1, 2, 3]
    assert not m.contains_key("session", "ns")
    assert len(m) == 2 + 1_000_000
    assert "[('user-1', 'window-0', [1, 2])]" in capsys.readouterr().out


def test_keyed_state_example_runs(capsys):
    namespace = run_example(KEYED_STATE_EXAMPLE)
    assert capsys.readouterr().out.splitlines() == ["2 ['/a', '/c']", "0 False []"]
    assert namespace["restored"].num_entries() == 4  # 2 users x (count, seen): snapshot taken before expiry
    assert namespace["snap"].released


def test_rescale_example_runs(capsys):
    namespace = run_example(RESCALE_EXAMPLE)
    assert capsys.readouterr().out.splitlines() == ["[3, 3]", "3"]
    assert namespace["snap"].released
    assert sum(b.num_entries() for b in namespace["two"]) == namespace["one"].num_entries() == 6


def test_ttl_example_runs(capsys):
    run_example(TTL_EXAMPLE)
    assert capsys.readouterr().out.splitlines() == ["t-1 ['/b'] 7 None", "None []"]


def test_columnar_example_runs(capsys):
    run_example(COLUMNAR_EXAMPLE)
    assert capsys.readouterr().out.splitlines() == ["[2 1 1 0]"]


def test_async_example_runs(capsys):
    namespace = run_example(ASYNC_EXAMPLE)
    assert capsys.readouterr().out.splitlines() == ["2"]
    assert namespace["aec"].in_flight_records == 0


def test_timers_example_runs(capsys):
    namespace = run_example(TIMERS_EXAMPLE)
    expected = [("bob", 60_000, 60_000, 1), ("ann", 0, 600_000, 2), ("ann", 4_000_000, 4_000_000, 1)]
    assert namespace["emitted"] == expected
    assert capsys.readouterr().out.splitlines() == [str(expected)]
    assert namespace["timers"].num_event_time_timers() == 0
    assert namespace["backend"].num_entries() == 0  # every session emitted and cleared


def test_readme_session_window_example_runs(capsys):
    namespace = run_example(SESSION_EXAMPLE)
    assert capsys.readouterr().out.splitlines() == [
        "bob: 1 events, 60000..60000",
        "ann: 2 events, 0..600000",
        "ann: 1 events, 4000000..4000000",
    ]
    assert namespace["timers"].num_event_time_timers() == 0
    assert namespace["backend"].num_entries() == 0  # every session emitted and cleared


def test_readme_columnar_count_and_checkpoint_example_runs(capsys):
    namespace = run_example(COLUMNS_AND_CHECKPOINT)
    assert capsys.readouterr().out.splitlines() == ["[2 1 0]"]
    assert len(namespace["storage"].checkpoints()) == 1
    assert namespace["restored"].num_entries() == 2


def test_checkpoint_example_runs(capsys):
    namespace = run_example(CHECKPOINT_EXAMPLE)
    assert capsys.readouterr().out.splitlines() == ["41"]
    assert namespace["storage"].checkpoints() == [namespace["checkpoint_id"]]


def test_versions_example_runs(capsys):
    namespace = run_example(VERSIONS_EXAMPLE)
    assert capsys.readouterr().out.splitlines() == ["['full', 'incremental', 'incremental']", "4 [1, 2]", "3"]
    assert namespace["storage"].checkpoints() == [3, 4]


EXAMPLES = (
    QUICK_START,
    SESSION_EXAMPLE,
    COLUMNS_AND_CHECKPOINT,
    MAP_EXAMPLE,
    KEYED_STATE_EXAMPLE,
    RESCALE_EXAMPLE,
    TTL_EXAMPLE,
    COLUMNAR_EXAMPLE,
    ASYNC_EXAMPLE,
    TIMERS_EXAMPLE,
    CHECKPOINT_EXAMPLE,
    VERSIONS_EXAMPLE,
)


def test_every_python_example_in_the_docs_is_run():
    """Every python block of README.md and docs/**/*.md is one a test runs: one of EXAMPLES
    above, or a Spark example (tests/spark/test_examples.py). An example added to a page needs a
    test here that runs it and checks what it shows."""
    run = {(path, b) for path, marker in EXAMPLES for b in python_blocks(ROOT / path) if marker in b}
    assert len(run) == len(EXAMPLES), "a marker of EXAMPLES matches no block, or several"
    not_run = [
        f"{path.relative_to(ROOT)}: {block.splitlines()[0]}"
        for path in markdown_files()
        for block in python_blocks(path)
        if (str(path.relative_to(ROOT)), block) not in run and SPARK_EXAMPLE not in block
    ]
    assert not_run == [], "python examples no test runs:\n  " + "\n  ".join(not_run)


def test_import_cowmap_does_not_load_numpy():
    """numpy is loaded by the first columnar call, not by ``import cowmap``: the
    harness can still configure it (its thread count) before it loads."""
    import subprocess
    import sys

    code = "import sys, cowmap, cowmap.state, cowmap.asyncstate; print('numpy' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "False"
