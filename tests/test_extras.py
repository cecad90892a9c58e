"""Optional dependencies stay optional: ``import cowmap`` needs numpy at most, and each part
that needs an extra imports it only when used and says how to install it when it is missing.

Each check runs in a child interpreter in which the extras are made unimportable (a finder
first on ``sys.meta_path`` refuses them), as on a machine where they were never installed.
"""

from __future__ import annotations

import subprocess
import sys
import textwrap

#: everything cowmap's extras bring (arrow, spark, plot, bench, test)
EXTRAS = ("pyarrow", "pandas", "pyspark", "matplotlib", "tqdm", "psutil", "cachetools", "pytest", "hypothesis")

_PRELUDE = """
import sys

class _Missing:
    def find_spec(self, name, path=None, target=None):
        if name.partition(".")[0] in {blocked!r}:
            raise ModuleNotFoundError(f"No module named {{name!r}} (not installed)", name=name)
        return None

sys.meta_path.insert(0, _Missing())
"""


def _run(code: str, blocked: tuple[str, ...] = EXTRAS) -> subprocess.CompletedProcess[str]:
    script = _PRELUDE.format(blocked=set(blocked)) + textwrap.dedent(code)
    return subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=120)


def test_the_core_works_without_any_extra(tmp_path) -> None:
    """Keyed state, TTL, async state, timers and local checkpoints need no extra."""
    run = _run(f"""
        import cowmap
        from cowmap import KeyedStateBackend, StateTtlConfig, ValueStateDescriptor

        assert "numpy" not in sys.modules, "import cowmap loaded numpy"
        from cowmap.checkpoint import CheckpointStorage

        b = KeyedStateBackend(max_parallelism=16)
        d = ValueStateDescriptor("n", default_value=0)
        d.enable_time_to_live(StateTtlConfig.new_builder(60_000).build())
        n = b.get_state(d)
        for k in range(100):
            b.set_current_key(k)
            n.update(n.value() + k)
        storage = CheckpointStorage({str(tmp_path / "ck")!r})
        storage.save(b)
        r = KeyedStateBackend(max_parallelism=16)
        storage.restore(r)
        m = r.get_state(d)
        r.set_current_key(7)
        assert m.value() == 7
        loaded = sorted({{m.partition(".")[0] for m in sys.modules}} & {set(EXTRAS)!r})
        assert not loaded, loaded
        print("ok", cowmap.__version__)
    """)
    assert run.returncode == 0, run.stderr[-3000:]
    assert run.stdout.startswith("ok ")


def test_spark_says_how_to_install_its_extra() -> None:
    run = _run("""
        try:
            import cowmap.spark
        except ImportError as e:
            print(e)
    """)
    assert run.returncode == 0, run.stderr[-3000:]
    assert 'pip install "cowmap[spark]"' in run.stdout


def test_remote_checkpoints_say_how_to_install_pyarrow() -> None:
    run = _run("""
        from cowmap.checkpoint import CheckpointStorage
        try:
            CheckpointStorage("s3://bucket/state")
        except ImportError as e:
            print(e)
    """)
    assert run.returncode == 0, run.stderr[-3000:]
    assert 'pip install "cowmap[arrow]"' in run.stdout


def test_a_filesystem_that_is_not_pyarrows_is_refused(tmp_path) -> None:
    import pytest

    from cowmap.checkpoint import CheckpointStorage

    with pytest.raises(TypeError, match="pyarrow.fs.FileSystem"):
        CheckpointStorage(str(tmp_path), filesystem=object())


def test_plots_say_how_to_install_matplotlib(tmp_path) -> None:
    """The harness runs without matplotlib and says why it wrote no plot."""
    run = _run(f"""
        from cowmap.bench.__main__ import main
        sys.exit(main(["core", "--n", "2000", "--repeats", "1", "--plot", {str(tmp_path / "core.png")!r}]))
    """, blocked=("matplotlib", "pyspark", "tqdm"))
    assert run.returncode == 0, run.stderr[-3000:]
    assert "cowmap[plot]" in run.stdout + run.stderr
    assert not (tmp_path / "core.png").exists()


def test_free_threaded_interpreters_are_refused_at_import() -> None:
    """A free-threaded build (3.13t) gets a clear ImportError, not a corrupted map later."""
    run = subprocess.run([sys.executable, "-c", textwrap.dedent("""
        import sys, sysconfig
        real = sysconfig.get_config_var
        sysconfig.get_config_var = lambda name: 1 if name == "Py_GIL_DISABLED" else real(name)
        sys.version_info = (3, 13, 0, "final", 0)
        try:
            import cowmap
        except ImportError as e:
            print(e)
        else:
            print("imported")
    """)], capture_output=True, text=True, timeout=60)
    assert run.returncode == 0, run.stderr[-3000:]
    assert "does not support free-threaded CPython builds" in run.stdout


def test_a_benchmark_without_its_extra_says_which_to_install() -> None:
    """The harness parses and runs what needs nothing more; a scenario that needs pandas says so."""
    run = _run("""
        from cowmap.bench.__main__ import main
        print("rc", main(["columnar", "--rows", "20000", "--repeats", "1"]))
    """)
    assert run.returncode == 0, run.stderr[-3000:]
    assert "rc 2" in run.stdout
    assert 'the columnar benchmark needs pandas: pip install "cowmap[bench]"' in run.stderr
