"""The examples in examples/ run on the local SparkSession, and their output is
checked against plain pandas over the same input files."""

from __future__ import annotations

import importlib.util
import re
import sys
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

ROOT = Path(__file__).resolve().parents[2]
EXAMPLES = ROOT / "examples"


def _load(name: str):
    from pyspark import cloudpickle

    if str(EXAMPLES) not in sys.path:
        sys.path.insert(0, str(EXAMPLES))  # (as running the script puts its directory there: file_stream)

    spec = importlib.util.spec_from_file_location(f"cowmap_example_{name}", EXAMPLES / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    cloudpickle.register_pickle_by_value(module)  # as run as a script: its classes travel by value
    return module


def test_streaming_dedup(spark, tmp_path) -> None:
    example = _load("streaming_dedup")
    out = example.run(spark, tmp_path)
    clicks = pd.concat(example.write_clicks(tmp_path / "again"))
    assert sorted(out["user"]) == sorted(set(clicks["user"]))  # each user once, within the hour
    assert set(zip(out["user"], out["url"], strict=True)) <= set(zip(clicks["user"], clicks["url"], strict=True))


def _sessions(clicks: pd.DataFrame, gap: int) -> set[tuple]:
    out = set()
    for user, rows in clicks.sort_values("ts", kind="stable").groupby("user"):
        ts = rows["ts"].to_numpy()
        pages = rows["page"].to_numpy()
        cut = np.flatnonzero(np.diff(ts) > gap) + 1
        for t, p in zip(np.split(ts, cut), np.split(pages, cut), strict=True):
            out.add((user, int(t[0]), int(t[-1]), len(t), len(set(p))))
    return out


def test_sessionization(spark, tmp_path) -> None:
    example = _load("sessionization")
    out = example.run(spark, tmp_path)
    clicks = pd.concat(example.write_clicks(tmp_path / "again"))
    want = _sessions(clicks, example.GAP_MS)
    got = [tuple(r) for r in out[["user", "start", "end", "clicks", "pages"]].itertuples(index=False)]
    assert len(got) == len(set(got))
    assert set(got) <= want
    # every session is closed but, at most, each user's last (the watermark has not passed it yet)
    assert len(got) >= len(want) - clicks["user"].nunique()
    assert len(got) > clicks["user"].nunique()  # users had several sessions


def test_running_totals(spark, tmp_path) -> None:
    example = _load("running_totals")
    out = example.run(spark, tmp_path)
    purchases = pd.concat(example.write_purchases(tmp_path / "again"))
    want = purchases.groupby("user")["amount"].agg(["size", "sum"])
    final = out.sort_values("purchases").groupby("user").tail(1).set_index("user").sort_index()
    assert final.index.tolist() == want.index.tolist()
    assert final["purchases"].tolist() == want["size"].tolist()
    assert final["total"].to_numpy() == pytest.approx(want["sum"].to_numpy())


def _doc_blocks() -> list[tuple[str, str]]:
    """``(page, block)`` for every python block of README.md and docs/**/*.md that calls
    ``apply_with_state(`` (tests/test_package.py's SPARK_EXAMPLE), each distinct block once."""
    pages = [ROOT / "README.md", *sorted((ROOT / "docs").rglob("*.md"))]
    out: dict[str, str] = {}
    for page in pages:
        for block in re.findall(r"```python\n(.*?)```", page.read_text(), re.S):
            if "apply_with_state(" in block:
                out.setdefault(block, str(page.relative_to(ROOT)))
    return [(page, block) for block, page in out.items()]


def _check_first_clicks(out: pd.DataFrame, clicks: pd.DataFrame) -> None:
    assert sorted(out["user"]) == sorted(set(clicks["user"]))  # each user once, within the hour


def _check_click_counts(out: pd.DataFrame, clicks: pd.DataFrame) -> None:
    assert dict(zip(out["user"], out["clicks"], strict=True)) == clicks["user"].value_counts().to_dict()


#: what each docs example's output must be, by the processor class it defines
DOC_CHECKS = {"FirstClickPerHour": _check_first_clicks, "ClickCount": _check_click_counts}


def _example_id(page: str, block: str) -> str:
    name = re.search(r"^class (\w+)", block, re.M)
    return f"{page}:{name.group(1) if name else '?'}"


@pytest.mark.parametrize(
    ("page", "block"), [pytest.param(page, block, id=_example_id(page, block)) for page, block in _doc_blocks()]
)
def test_docs_streaming_examples(spark, tmp_path, page: str, block: str) -> None:
    """The Spark examples of the README and the docs, as a user would paste them (their classes
    are __main__'s), on one micro-batch of clicks."""
    checks = [check for name, check in DOC_CHECKS.items() if f"class {name}" in block]
    assert len(checks) == 1, f"a Spark example of {page} without a check in DOC_CHECKS"
    clicks = pd.DataFrame({"user": [f"u{i % 7}" for i in range(50)], "url": [f"/{i}" for i in range(50)]})
    (tmp_path / "clicks").mkdir()
    clicks.to_parquet(tmp_path / "clicks" / "part-0.parquet", index=False)
    paths = {name: str(tmp_path / name) for name in ("clicks", "state", "out", "chk")}
    namespace = {
        "__name__": "__main__",
        "spark": spark,
        "clicks_dir": paths["clicks"],
        "state_dir": paths["state"],
        "out_dir": paths["out"],
        "spark_checkpoint": paths["chk"],
    }
    exec(compile(block, page, "exec"), namespace)
    query = namespace["query"]
    try:
        query.processAllAvailable()
    finally:
        query.stop()
    checks[0](spark.read.parquet(paths["out"]).toPandas(), clicks)
