"""An MkDocs hook: links from a page to a file of the repository outside ``docs/``.

The pages link to source files (``../src/cowmap/cm_ttl.h``, ``../../examples/``) so that they
work where the repository is read, on GitHub or in a checkout. The site has no such files: with
``repo_url`` set in mkdocs.yml such a link goes to the file in the repository, else it becomes
its plain text. Links inside the docs are left to MkDocs, which checks them (``--strict``).
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

_FENCE = re.compile(r"^(```|~~~).*?^\1[^\n]*$", re.M | re.S)
_LINK = re.compile(r"(?<!!)\[([^\]]*)\]\(\s*([^)\s]+)\s*\)")


def _rewrite(text: str, page_dir: Path, docs_dir: Path, root: Path, repo_url: str | None) -> str:
    def link(m: re.Match[str]) -> str:
        label, target = m.group(1), m.group(2)
        if re.match(r"^[a-z][a-z0-9+.-]*:", target, re.I) or target.startswith("#"):
            return m.group(0)
        path_part, _, anchor = target.partition("#")
        dest = (page_dir / path_part).resolve()
        if dest.is_relative_to(docs_dir) or not dest.is_relative_to(root) or not dest.exists():
            return m.group(0)
        if repo_url is None:
            return label
        kind = "tree" if dest.is_dir() else "blob"
        rel = dest.relative_to(root).as_posix()
        return f"[{label}]({repo_url.rstrip('/')}/{kind}/HEAD/{rel}{'#' + anchor if anchor else ''})"

    parts, pos = [], 0
    for fence in _FENCE.finditer(text):
        parts += [_LINK.sub(link, text[pos:fence.start()]), fence.group(0)]
        pos = fence.end()
    parts.append(_LINK.sub(link, text[pos:]))
    return "".join(parts)


def on_page_markdown(markdown: str, page: Any, config: Any, files: Any) -> str:
    docs_dir = Path(config["docs_dir"]).resolve()
    root = Path(config["config_file_path"]).resolve().parent
    page_dir = Path(page.file.abs_src_path).resolve().parent
    return _rewrite(markdown, page_dir, docs_dir, root, config.get("repo_url"))
