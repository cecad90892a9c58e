"""Suite-wide hooks: the slow jobs of a few modules (``background.py``) start as soon as their
tests are selected and run beside the rest of the suite, whose tests go first; and what the
examples of the docs make with :mod:`tempfile` lands in pytest's temporary directory."""

from __future__ import annotations

import tempfile
from collections.abc import Iterator

import background
import pytest


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    waiting = background.modules()
    items.sort(key=lambda item: str(item.path) in waiting)  # stable: the order is kept otherwise


def pytest_collection_finish(session: pytest.Session) -> None:
    background.start({str(item.path) for item in session.items})


def pytest_sessionfinish() -> None:
    background.stop()


@pytest.fixture(autouse=True, scope="session")
def _temporary_files(tmp_path_factory: pytest.TempPathFactory) -> Iterator[None]:
    """The examples (docstrings, README, guides) make their directories with
    :func:`tempfile.mkdtemp`, as a reader would; in the suite those go where pytest clears."""
    before = tempfile.tempdir
    tempfile.tempdir = str(tmp_path_factory.mktemp("tempfile"))
    yield
    tempfile.tempdir = before
