"""``python -m cowmap.bench spark``'s machinery at a small size: every system it
times gives the pandas answer (a persisted one that does not fails the run),
and the report shows each figure with its target."""

from __future__ import annotations

from cowmap.bench import spark as bench


def test_small_run_reports_every_measured_figure(spark) -> None:
    systems = ("dict_map_in_pandas", "cowmap_per_key", "cowmap_columnar")
    logged: list[str] = []
    res = bench.run(systems, rows=3_000, keys=300, batches=3, keys_every=200, commit_keys=20_000, spark=spark,
                    log=logged.append)
    for name, rows in (("large", 3_000), ("every_key", 600)):
        w = res["workloads"][name]
        assert w["rows"] == rows
        assert set(w["figures"]) == set(systems)
        for system in ("cowmap_per_key", "cowmap_columnar"):
            assert w["figures"][system]["state_ok"]
            assert w["figures"][system]["rows_per_s"] > 0
    assert res["commit"]["share"] > 0
    lines = "\n".join(bench.report(res))
    assert "cowmap.spark per-key" in lines and "mapInPandas + dict" in lines
    assert "per-key (persisted) vs mapInPandas + dict" in lines
    assert "transformWithState (Row), one large batch: not measured" in lines
    assert len(logged) == 2 * len(systems) + 1
    assert not spark.sparkContext._jsc.sc().isStopped()  # the caller's session is left running
    # the report names what the figures depend on: the PySpark version, and the socket kind of the
    # session it was given (the test session's default, TCP)
    import pyspark

    assert res["pyspark"] == pyspark.__version__ and res["sockets"] == "tcp"
    assert f"PySpark {pyspark.__version__}, Python workers over tcp sockets" in lines


def test_sockets_other_than_unix_or_tcp_are_refused_before_a_session_starts() -> None:
    import pytest

    with pytest.raises(ValueError, match="sockets must be 'unix' or 'tcp'"):
        bench.run(("cowmap_per_key",), sockets="udp")


def test_a_persisted_system_losing_state_fails_the_run() -> None:
    import pandas as pd
    import pytest

    data = [pd.DataFrame({"k": [1, 2, 1], "v": [1, 1, 1]}), pd.DataFrame({"k": [1], "v": [5]})]
    good = pd.DataFrame({"k": [1, 2, 1], "count": [2, 1, 3], "total": [2, 1, 7]})
    lost = pd.DataFrame({"k": [1, 2, 1], "count": [2, 1, 1], "total": [2, 1, 5]})  # batch 2 forgot batch 1
    assert bench._check(good, data, "cowmap_per_key")
    assert not bench._check(lost, data, "dict_map_in_pandas")  # not persisted: only noted
    with pytest.raises(AssertionError, match="state lost or doubled"):
        bench._check(lost, data, "cowmap_per_key")


def test_the_report_sets_spark_s_floor_against_the_reference_it_is_compared_with() -> None:
    def figures(**rps: float) -> dict:
        return {s: {"rows_per_s": v, "state_ok": True} for s, v in rps.items()}

    res = {"partitions": 2, "repeats": 1, "workloads": {
        "large": {"rows": 10, "micro_batches": 1, "figures": figures(tws_row=10.0, shuffle_floor=95.0)},
        "every_key": {"rows": 10, "micro_batches": 2, "figures": figures(tws_pandas=4.0, shuffle_floor=50.0)},
    }}
    lines = bench.report(res)
    assert "  Spark's floor vs transformWithState (Row), large: 9.50x" in "\n".join(lines)
    assert "  Spark's floor vs transformWithStateInPandas, every_key: 12.50x" in "\n".join(lines)
    res["workloads"]["large"]["figures"].pop("tws_row")
    assert not any("floor vs transformWithState (Row)" in ln for ln in bench.report(res))


def test_repeats_run_round_by_round_and_the_report_gives_each_rounds_figure(monkeypatch) -> None:
    """Every system runs once a round (not all its repeats in a row), so a slow
    spell of the machine falls on all alike; the report shows the spread of a
    figure over the rounds, each round's two queries compared."""
    import pandas as pd

    seconds = {"cowmap_per_key": iter([1.0, 2.0, 1.0, 1.0, 1.0, 1.0]),
               "tws_row": iter([10.0, 30.0, 12.0, 5.0, 5.0, 5.0])}
    calls: list[tuple[str, str]] = []

    def fake_query(spark, system, src, work, partitions, schema):
        calls.append((src.name, system))
        return (0.1 if src.name.startswith("warm") else next(seconds[system])), pd.DataFrame()

    class Conf:
        def get(self, key, default=None):
            return "true"

    class Session:
        conf = Conf()

    monkeypatch.setattr(bench, "_time_query", fake_query)
    monkeypatch.setattr(bench, "_check", lambda out, data, system: True)
    logged: list[str] = []
    res = bench.run(("cowmap_per_key", "tws_row"), rows=10, keys=2, batches=2, keys_every=2, repeats=3,
                    commit_keys=0, spark=Session(), log=logged.append)
    timed = [c for c in calls if not c[0].startswith("warm")]
    assert timed == [("src-large", "cowmap_per_key"), ("src-large", "tws_row")] * 3 + [
        ("src-every_key", "cowmap_per_key"), ("src-every_key", "tws_row")] * 3
    assert bench.round_ratios(res, "per_key_vs_tws_row_large") == [10.0, 15.0, 12.0]
    lines = "\n".join(bench.report(res))
    # medians: 12 s against 1 s
    assert "transformWithState (Row), one large batch: 12.00x, rounds 10.00x-15.00x (target >= 10.00x: met)" in lines
    assert sum("round" in line for line in logged) == 6
