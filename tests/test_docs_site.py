"""The documentation site builds without a warning, and its API reference has the docstrings.

``mkdocs build --strict`` of ``mkdocs.yml`` (MkDocs with mkdocs-material and mkdocstrings: the
``docs`` extra) into a temporary directory: a broken link between pages, a missing anchor, a page
left out of the nav or an object mkdocstrings cannot find fails the build. Then the API pages
must document every public name (``cowmap.__all__``, ``cowmap.checkpoint.__all__`` and
``cowmap.spark.__all__``) with its docstring, the compiled classes' methods included.
"""

from __future__ import annotations

import ast
import html
import inspect
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

import cowmap
import cowmap.checkpoint

pytest.importorskip("mkdocs", reason="the docs site needs the docs extra: pip install '.[docs]'")

ROOT = Path(__file__).resolve().parents[1]


@pytest.fixture(scope="module")
def site(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("site")
    env = {**os.environ, "NO_MKDOCS_2_WARNING": "1"}
    proc = subprocess.run(
        [sys.executable, "-m", "mkdocs", "build", "--strict", "-f", str(ROOT / "mkdocs.yml"), "-d", str(out)],
        cwd=ROOT, env=env, capture_output=True, text=True, timeout=300,
    )
    assert proc.returncode == 0, f"mkdocs build --strict failed:\n{proc.stdout}{proc.stderr}"
    return out


def _text(page: Path) -> str:
    """A built page's text: tags dropped, entities resolved, whitespace collapsed."""
    body = re.sub(r"<(script|style)\b.*?</\1>", " ", page.read_text(), flags=re.S)
    body = re.sub(r"</?(code|span|a|em|strong|wbr)\b[^>]*>", "", body)  # inline: no word break
    return " ".join(html.unescape(re.sub(r"<[^>]+>", " ", body)).split())


def _first_sentence(doc: str) -> str:
    """The first sentence of a docstring as the site shows it (code marks dropped)."""
    # a reST role as the site shows it: :class:`a.B` as a.B, :meth:`~a.B.c` as c
    doc = re.sub(r":\w+:`(~?)([^`]+)`", lambda m: m[2].rsplit(".", 1)[-1] if m[1] else m[2], doc)
    text = " ".join(doc.replace("`", "").split())
    return re.split(r"(?<=[.:;])\s", text, maxsplit=1)[0]


def _api_html(site: Path) -> str:
    return "\n".join(p.read_text() for p in sorted((site / "api").rglob("index.html")))


def test_every_public_name_is_documented(site: Path) -> None:
    spark_init = ast.parse((ROOT / "python/cowmap/spark/__init__.py").read_text())
    spark_all = next(
        ast.literal_eval(node.value) for node in spark_init.body
        if isinstance(node, ast.Assign) and any(getattr(t, "id", None) == "__all__" for t in node.targets)
    )  # (read from the source: importing cowmap.spark needs pyspark)
    names = [f"cowmap.{n}" for n in cowmap.__all__]
    names += [f"cowmap.checkpoint.{n}" for n in cowmap.checkpoint.__all__]
    names += [f"cowmap.spark.{n}" for n in spark_all]
    api = _api_html(site)
    missing = [n for n in names if f'id="{n}"' not in api]
    assert not missing, f"public names with no entry in docs/api/*.md (add a '::: name' line): {missing}"


@pytest.mark.parametrize(
    ("page", "obj"),
    [
        ("state", cowmap.ValueState),
        ("state", cowmap.KeyedStateBackend),
        ("state", cowmap.MapState.put),  # the per-key accesses are compiled functions bound in the class
        ("state", cowmap.MapState.get),
        ("state", cowmap.ValueState.value),
        ("state", cowmap.ValueState.update),
        ("map", cowmap.CopyOnWriteStateMap),
        ("map", cowmap.CopyOnWriteStateMap.put),  # compiled: its docstring comes from the built module
        ("map", cowmap.CopyOnWriteStateMap.snapshot),
        ("timers", cowmap.TimerService.advance_watermark),
        ("asyncstate", cowmap.StateFuture.then_apply),
        ("checkpoint", cowmap.checkpoint.CheckpointStorage.save),
    ],
    ids=lambda v: v if isinstance(v, str) else v.__qualname__,
)
def test_api_pages_show_the_docstrings(site: Path, page: str, obj: object) -> None:
    doc = inspect.getdoc(obj)
    assert doc, f"{obj!r} has no docstring"
    doc = re.sub(r"^[\w.]+\(.*?\)\n\n", "", doc, count=1, flags=re.S)  # a compiled signature line
    sentence = _first_sentence(doc)
    assert sentence in _text(site / "api" / page / "index.html")


def test_spark_api_page_shows_apply_with_state(site: Path) -> None:
    source = ast.parse((ROOT / "python/cowmap/spark/query.py").read_text())
    fn = next(n for n in source.body if isinstance(n, ast.FunctionDef) and n.name == "apply_with_state")
    doc = ast.get_docstring(fn)
    assert doc
    text = _text(site / "api" / "spark" / "index.html")
    assert _first_sentence(doc) in text
    assert "checkpoint_location" in text and "max_parallelism" in text  # its parameters, from Args:


def test_guide_and_benchmark_pages_are_built(site: Path) -> None:
    for page in ("guide/spark", "guide/keyed-state", "benchmarks/ttl", "architecture", "checkpoint-format"):
        assert (site / page / "index.html").is_file(), page
    for png in (ROOT / "docs" / "benchmarks" / "img").glob("*.png"):
        assert (site / "benchmarks" / "img" / png.name).is_file(), png.name
        assert png.stat().st_size < 200_000, f"{png.name} is {png.stat().st_size:,} bytes: keep plots under 200 KB"
