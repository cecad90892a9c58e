"""The repository stands alone: its references point inside it, and its docs' links lead somewhere.

- No tracked file (except ``.ci/`` and generated ``.c`` files) names a path that climbs out of
  the checkout into a shared directory, an outside design document, or an issue by number: a
  reader of the repository cannot follow those. The architecture lives in
  ``docs/architecture.md``; point there, with a section anchor, or explain in place.
- Every relative link in ``README.md``, ``CONTRIBUTING.md``, ``CHANGELOG.md`` and ``docs/**/*.md``
  names a file inside the repository that exists, and its ``#anchor``, if any, a heading of that
  file; so does every mention of
  ``docs/architecture.md#<anchor>`` in any tracked file.

The patterns are assembled from pieces so that this file does not match them itself.
"""

from __future__ import annotations

import fnmatch
import re
import shutil
import subprocess
from functools import cache
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
ARCHITECTURE = "docs/architecture.md"

#: What a reference may not name (case-insensitive): a path out of the checkout into a shared
#: directory, the outside design document, an issue number (the word, an optional hash sign, a digit).
FORBIDDEN = [
    ("a path outside the repository", re.compile(r"\.\./" + "shared", re.I)),
    ("the outside design document", re.compile("DESIGN" + r"\.md", re.I)),
    ("an issue number", re.compile(r"\bissue\s*" + "#" + r"?\s*\d", re.I)),
]

#: Links to files a page tells the reader to generate, as (page, link); allowed only while git
#: ignores them. (None today: the plots the pages show are committed, under docs/benchmarks/img/.)
GENERATED: set[tuple[str, str]] = set()

_LINK = re.compile(r"!?\[[^\]]*\]\(\s*<?([^)\s>]+)>?(?:\s+\"[^\"]*\")?\s*\)")
_REF_DEF = re.compile(r"^\s{0,3}\[[^\]]+\]:\s*<?(\S+?)>?(?:\s+\"[^\"]*\")?\s*$", re.M)
_FENCE = re.compile(r"^(```|~~~).*?^\1[^\n]*$", re.M | re.S)
_CODE_SPAN = re.compile(r"(`+)(?:(?!\1).)+?\1", re.S)
_HEADING = re.compile(r"^(#{1,6})\s+(.*?)\s*#*\s*$", re.M)
_ARCH_ANCHOR = re.compile(re.escape(ARCHITECTURE) + r"#([A-Za-z0-9_-]+)")


def _git(*args: str) -> subprocess.CompletedProcess[bytes]:
    return subprocess.run(["git", "-C", str(ROOT), *args], capture_output=True, check=False)


def _ignored(path: str) -> bool:
    """Whether git ignores ``path``: asked of git in a checkout, else read from .gitignore."""
    if shutil.which("git") is not None and _git("rev-parse", "--git-dir").returncode == 0:
        return _git("check-ignore", "-q", path).returncode == 0
    patterns = [ln.strip() for ln in (ROOT / ".gitignore").read_text().splitlines() if ln.strip()[:1] not in ("", "#")]
    return any(fnmatch.fnmatch(path, pat.lstrip("/")) or fnmatch.fnmatch(Path(path).name, pat) for pat in patterns)


@cache
def _tracked() -> tuple[str, ...]:
    """Tracked files (plus README.md and docs/**/*.md, so new docs are checked before they are
    added), without .ci/ and generated .c files."""
    if shutil.which("git") is not None and _git("rev-parse", "--git-dir").returncode == 0:
        out = _git("ls-files", "-z").stdout.decode()
        paths = {p for p in out.split("\0") if p}
    else:  # an unpacked source archive: every file but build output and caches
        skip = {".git", "build", "dist", "__pycache__", ".mypy_cache", ".ruff_cache", ".pytest_cache"}
        paths = {
            str(p.relative_to(ROOT))
            for p in ROOT.rglob("*")
            if p.is_file() and not skip.intersection(p.relative_to(ROOT).parts) and ".egg-info" not in str(p)
        }
    paths |= {str(p.relative_to(ROOT)) for p in [ROOT / "README.md", *(ROOT / "docs").rglob("*.md")] if p.exists()}
    return tuple(sorted(p for p in paths if not p.startswith(".ci/") and not p.endswith(".c")))


def _text(path: str) -> str | None:
    """The file's text, or None for a binary file or one deleted from the work tree."""
    try:
        data = (ROOT / path).read_bytes()
    except (FileNotFoundError, IsADirectoryError):
        return None
    if b"\0" in data:
        return None
    return data.decode("utf-8", errors="replace")


@cache
def _offenders() -> dict[str, list[str]]:
    """``path -> ["line: what it names: the line", ...]`` for every forbidden reference."""
    found: dict[str, list[str]] = {}
    for path in _tracked():
        text = _text(path)
        if text is None:
            continue
        for lineno, line in enumerate(text.splitlines(), 1):
            for what, pattern in FORBIDDEN:
                if pattern.search(line):
                    found.setdefault(path, []).append(f"{lineno}: {what}: {line.strip()}")
    return found


def test_no_reference_leaves_the_repository() -> None:
    bad = _offenders()
    assert not bad, "references a reader of the repository cannot follow:\n" + "\n".join(
        f"  {p}:{hit}" for p, hits in sorted(bad.items()) for hit in hits
    ) + f"\npoint at {ARCHITECTURE} (with a #section anchor) or explain in place"


def _strip_code(text: str) -> str:
    """Markdown without fenced blocks and code spans (links there are not links)."""
    return _CODE_SPAN.sub("", _FENCE.sub("", text))


def github_slug(heading: str) -> str:
    """The anchor GitHub gives a heading: lower case, punctuation dropped, spaces to hyphens."""
    text = re.sub(r"<[^>]+>", "", heading)  # inline HTML
    text = re.sub(r"\[([^\]]*)\]\([^)]*\)", r"\1", text)  # links: their text
    return re.sub(r"[^\w\- ]", "", text.strip().lower()).replace(" ", "-")


@cache
def _anchors(path: str) -> frozenset[str]:
    """The heading anchors of a markdown file (GitHub numbers repeated ones -1, -2, ...)."""
    seen: dict[str, int] = {}
    out = set()
    for _, title in _HEADING.findall(_FENCE.sub("", (ROOT / path).read_text())):
        slug = github_slug(title)
        n = seen.get(slug, 0)
        seen[slug] = n + 1
        out.add(slug if n == 0 else f"{slug}-{n}")
    return frozenset(out)


def _markdown_files() -> list[str]:
    top = ["README.md", "CONTRIBUTING.md", "CHANGELOG.md"]
    return [p for p in [*top, *sorted(str(f.relative_to(ROOT)) for f in (ROOT / "docs").rglob("*.md"))]
            if (ROOT / p).exists()]


def _check_target(source: str, target: str) -> str | None:
    """Why the relative link ``target`` in ``source`` leads nowhere, or None if it is fine."""
    if re.match(r"^[a-z][a-z0-9+.-]*:", target, re.I):  # http:, https:, mailto:, ...
        return None
    path_part, _, anchor = target.partition("#")
    if path_part:
        dest = (ROOT / source).parent / path_part
        try:
            rel = dest.resolve().relative_to(ROOT)
        except ValueError:
            return "points outside the repository"
        if (source, path_part) in GENERATED:
            ignored = _ignored(rel.as_posix())
            return None if ignored else "a generated file that git does not ignore: commit it or ignore it"
        if not dest.exists():
            return "no such file"
        rel_s = rel.as_posix()
    else:
        rel_s = source
    if anchor and rel_s.endswith(".md") and anchor not in _anchors(rel_s):
        return f"no heading with anchor #{anchor} in {rel_s}"
    return None


@pytest.mark.parametrize("source", _markdown_files())
def test_relative_links_lead_somewhere(source: str) -> None:
    text = _strip_code((ROOT / source).read_text())
    targets = _LINK.findall(text) + _REF_DEF.findall(text)
    bad = [f"{t}: {why}" for t in targets if (why := _check_target(source, t))]
    assert not bad, f"{source} has links that lead nowhere:\n  " + "\n  ".join(bad)


def test_architecture_anchors_exist() -> None:
    """``docs/architecture.md#<section>`` mentions (docstrings, comments) name real sections."""
    anchors = _anchors(ARCHITECTURE)
    bad = [
        f"{path}:{lineno}: #{a}"
        for path in _tracked()
        if (text := _text(path)) is not None
        for lineno, line in enumerate(text.splitlines(), 1)
        for a in _ARCH_ANCHOR.findall(line)
        if a not in anchors
    ]
    assert not bad, f"mentions of sections {ARCHITECTURE} does not have:\n  " + "\n  ".join(bad)


def test_github_slug() -> None:
    assert github_slug("The core map: CopyOnWriteStateMap") == "the-core-map-copyonwritestatemap"
    assert github_slug("Keys, key groups and hashes") == "keys-key-groups-and-hashes"
    assert github_slug("`multi_get` and **batches**") == "multi_get-and-batches"
