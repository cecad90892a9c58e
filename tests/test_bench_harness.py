"""The README's main job, ``python -m cowmap.bench``, runs end to end (tiny size)."""

import re
import subprocess
import sys

import pytest

from cowmap.bench.__main__ import main


def test_core_scenario_prints_a_table(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["core", "--n", "2000", "--repeats", "1"]) == 0
    out = capsys.readouterr().out
    assert "2,000 random int64 keys" in out
    for row in ("get hit (ns/op)", "put hit (ns/op)", "snapshot() start (us)"):
        assert row in out
    ratios = [line.split()[-3] for line in out.splitlines() if line.startswith(("get hit", "put hit"))]
    assert ratios and all(float(r) > 0 for r in ratios)


def test_bad_arguments_are_rejected() -> None:
    proc = subprocess.run([sys.executable, "-m", "cowmap.bench", "--n", "0"], capture_output=True, text=True)
    assert proc.returncode == 2 and "--n and --repeats must be >= 1" in proc.stderr


# ----------------------------------------------------------------------- the ttl scenario

import json  # noqa: E402
from pathlib import Path  # noqa: E402

from cowmap.bench import report  # noqa: E402
from cowmap.bench.ttl import MapLayout, ValueLayout, run_cowmap  # noqa: E402
from cowmap.bench.workload import Settings, make_records  # noqa: E402

ROW_FIELDS = {
    "system", "layout", "ttl", "entries_per_key", "groups", "users_per_group", "records_per_round",
    "ns_per_record", "ns_median", "ns_min", "ns_max", "records_per_s", "build_s", "mem_bytes",
    "peak_mem_bytes", "bytes_per_entry", "alive", "expected", "value_sum", "value_sum_expected", "state_ok",
}
TINY = ["--groups", "4", "--users-per-group", "50", "--sweep", "1,10", "--records", "400", "--repeats", "2",
        "--no-progress"]


def test_ttl_scenario_end_to_end_writes_documented_json(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    out = tmp_path / "results.json"
    assert main(TINY + ["--zipf", "--out", str(out)]) == 0
    text = capsys.readouterr().out
    assert "200 entries per state" in text and "Zipf s=1.1" in text
    assert "ns/record (median)" in text and "targets (TTL with default cleanup" in text
    doc = json.loads(out.read_text())
    assert doc["scenario"] == "ttl" and doc["state_lost"] is False and doc["errors"] == []
    assert doc["flink"]["requested"] is False
    assert doc["settings"]["total_entries"] == 200 and doc["settings"]["zipf"] == 1.1
    # sweep points 1, 10 and the given users-per-group (50); 2 layouts x 3 TTL modes each
    assert [p["entries_per_key"] for p in doc["settings"]["points"]] == [1, 10, 50]
    rows = doc["rows"]
    assert len(rows) == 3 * 2 * 3
    assert {(r["layout"], r["ttl"]) for r in rows} == {(lay, m) for lay in ("value", "map")
                                                       for m in ("off", "default", "every")}
    for r in rows:
        assert set(r) >= ROW_FIELDS, ROW_FIELDS - set(r)
        assert r["system"] == "cowmap" and r["state_ok"] is True
        assert r["alive"] == r["expected"] == 200 and r["groups"] * r["users_per_group"] == 200
        assert len(r["ns_per_record"]) == 2 and r["ns_min"] <= r["ns_median"] <= r["ns_max"]
        assert r["records_per_s"] > 0 and r["records_per_round"] == 400
    names = [t["target"] for t in doc["targets"]]
    assert len(names) == 4
    assert doc["targets"][0]["met"] in (True, False) and doc["targets"][2]["met"] is None  # no Flink


class LossyMapLayout(MapLayout):
    """'Wins' by keeping at most 5 users per group: evicts the rest."""

    name = "map"

    def replay(self, records: list[tuple[int, int, int]]) -> None:
        sck, get, put, remove = self.backend.set_current_key, self.state.get, self.state.put, self.state.remove
        for g, u, v in records:
            sck(g)
            put(u, (get(u) or 0) + v)
            if u >= 5:
                remove(u)


class DroppedWritesValueLayout(ValueLayout):
    """Keeps every entry but drops every other write."""

    name = "value"

    def replay(self, records: list[tuple[int, int, int]]) -> None:
        sck, value, update = self.backend.set_current_key, self.state.value, self.state.update
        for i, (g, u, v) in enumerate(records):
            sck((g, u))
            if i % 2:
                update(value() + v)


def test_entries_alive_check_catches_a_lossy_layout() -> None:
    st = Settings(groups=3, users_per_group=40, sweep=(10,), records=300, repeats=1, ttl_modes=("default",))
    rows, errors = run_cowmap(st, layouts={"map": LossyMapLayout, "value": DroppedWritesValueLayout})
    assert errors == []
    rows = [report.finish_row(r) for r in rows]
    by = {(r["layout"], r["entries_per_key"]): r for r in rows}
    lossy = by["map", 10]
    assert lossy["alive"] < lossy["expected"] == 120 and lossy["state_ok"] is False
    dropped = by["value", 10]
    assert dropped["alive"] == 120 and dropped["value_sum"] < dropped["value_sum_expected"]
    assert dropped["state_ok"] is False
    assert "LOST STATE" in "\n".join(report.rows_table(rows))
    honest, _ = run_cowmap(st)
    assert all(report.finish_row(r)["state_ok"] for r in honest)


def test_with_flink_without_the_jar_says_what_is_missing(monkeypatch: pytest.MonkeyPatch, tmp_path: Path,
                                                         capsys: pytest.CaptureFixture[str]) -> None:
    monkeypatch.setenv("COWMAP_FLINK_DIST_JAR", str(tmp_path / "no-such-flink-dist.jar"))
    out = tmp_path / "r.json"
    assert main(TINY + ["--sweep", "5", "--ttl-modes", "default", "--with-flink", "--out", str(out)]) == 0
    err = capsys.readouterr().err
    assert "--with-flink skipped" in err and "apache-flink-libraries==2.3.0" in err
    doc = json.loads(out.read_text())
    assert doc["flink"]["ran"] is False and doc["flink"]["requested"] is True
    assert {r["system"] for r in doc["rows"]} == {"cowmap"}


def test_plot_is_written_or_skipped_with_a_message(tmp_path: Path) -> None:
    rows = [report.finish_row({"system": s, "layout": lay, "ttl": "default", "entries_per_key": e, "groups": 100 // e,
                               "users_per_group": e, "records_per_round": 10, "ns_per_record": [100.0 * e, 120.0 * e],
                               "build_s": 0.0, "mem_bytes": 1000, "alive": 100, "expected": 100, "value_sum": 1,
                               "value_sum_expected": 1})
            for s in ("cowmap", "flink") for lay in ("value", "map") for e in (1, 10)]
    png = tmp_path / "p.png"
    why = report.plot(rows, png, "title")
    try:
        import matplotlib  # noqa: F401
    except ImportError:
        assert why is not None and "matplotlib" in why and not png.exists()
    else:
        assert why is None and png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_records_are_reproducible_and_zipf_is_skewed() -> None:
    st = Settings(groups=100, users_per_group=100, records=20_000, seed=7)
    a, b = make_records(st, 100, 100), make_records(st, 100, 100)
    assert a.dtype.str == "<i4" and a.shape == (20_000, 3) and (a == b).all()
    assert a[:, 0].max() < 100 and a[:, 1].max() < 100 and a[:, 2].min() >= 1
    st.zipf = 1.2
    z = make_records(st, 100, 100)
    top = max((z[:, 0] == g).sum() for g in range(100))
    assert top > 5 * 20_000 / 100  # the hottest group gets far more than a uniform share


def test_ttl_flags_are_validated() -> None:
    for argv in (["--groups", "0"], ["--sweep", "0,10"], ["--layouts", "list"], ["--n", "5"]):
        with pytest.raises(SystemExit) as e:
            main(argv)
        assert e.value.code == 2


def test_snapshot_scenario_prints_a_table(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["snapshot", "--sizes", "3000"]) == 0
    out = capsys.readouterr().out
    assert "start (us)" in out and "3,000" in out


def test_columnar_scenario_prints_a_table_and_checks_state(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    out_json = tmp_path / "col.json"
    assert main(["columnar", "--rows", "20000", "--repeats", "1", "--cases", "value,map_dedup,reduce_add",
                 "--out", str(out_json)]) == 0
    out = capsys.readouterr().out
    for case in ("value ", "map_dedup", "reduce_add"):
        assert case in out
    doc = json.loads(out_json.read_text())
    assert doc["scenario"] == "columnar" and [r["case"] for r in doc["rows"]] == ["value", "map_dedup", "reduce_add"]
    for r in doc["rows"]:
        assert r["state_ok"] and r["cowmap_ns"] > 0 and r["pandas_ns"] > 0 and r["loop_ns"] > 0


def test_columnar_flags_are_validated() -> None:
    proc = subprocess.run([sys.executable, "-m", "cowmap.bench", "columnar", "--cases", "nope"],
                          capture_output=True, text=True)
    assert proc.returncode == 2 and "expected some of" in proc.stderr
    proc = subprocess.run([sys.executable, "-m", "cowmap.bench", "columnar", "--rows", "5"],
                          capture_output=True, text=True)
    assert proc.returncode == 2 and "--rows must be >=" in proc.stderr


def test_timers_scenario_prints_figures_against_heapq(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["timers", "--timer-keys", "300", "--timers-per-key", "3", "--repeats", "1"]) == 0
    out = capsys.readouterr().out
    for label in ("register", "delete", "fire", "memory"):
        assert re.search(rf"^  {label} .*heapq \+ dict .*x \((met|NOT met)\)$", out, re.M), out


def test_heapq_alternative_has_the_same_semantics() -> None:
    from cowmap.bench.timers import HeapqTimers

    fired: list[tuple[int, object]] = []
    h = HeapqTimers(lambda ts, key, ns: fired.append((ts, key)))
    for key, ts in [("a", 3), ("b", 1), ("a", 3), ("c", 2)]:
        h.register(key, ts)
    h.delete("c", 2)
    h.register("c", 2)  # registered again after a delete: fires once
    h.delete("b", 9)  # none: no-op
    assert len(h) == 3
    assert h.advance_watermark(2) == 2 and h.advance_watermark(1) == 0
    assert h.advance_watermark(5) == 1
    assert fired == [(1, "b"), (2, "c"), (3, "a")]


# ------------------------------------------------- --out and --plot of every scenario

PNG = b"\x89PNG\r\n\x1a\n"


@pytest.mark.parametrize(
    "argv",
    [
        ["core", "--n", "2000", "--repeats", "1"],
        ["snapshot", "--sizes", "2000,4000"],
        ["timers", "--timer-keys", "300", "--timers-per-key", "3", "--repeats", "1"],
        ["checkpoint", "--entries", "20000", "--map-entries", "1000", "--repeats", "1"],
    ],
    ids=lambda argv: argv[0],
)
def test_scenarios_write_json_and_a_plot(argv: list[str], tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    pytest.importorskip("matplotlib")
    out, png = tmp_path / "r.json", tmp_path / "r.png"
    where = ["--dir", str(tmp_path)] if argv[0] == "checkpoint" else []
    assert main([*argv, *where, "--out", str(out), "--plot", str(png)]) == 0
    text = capsys.readouterr().out
    assert f"wrote {out}" in text and f"wrote {png}" in text
    assert json.loads(out.read_text())["scenario"] == argv[0]
    assert png.read_bytes()[:8] == PNG


def test_plot_without_matplotlib_says_so(monkeypatch: pytest.MonkeyPatch, tmp_path: Path,
                                         capsys: pytest.CaptureFixture[str]) -> None:
    monkeypatch.setattr(report, "pyplot", lambda: None)
    png = tmp_path / "r.png"
    assert main(["core", "--n", "1000", "--repeats", "1", "--plot", str(png)]) == 0
    assert "matplotlib is not installed" in capsys.readouterr().err and not png.exists()
