"""The error a damaged checkpoint raises."""

from __future__ import annotations

__all__ = ["CorruptCheckpointError"]


class CorruptCheckpointError(ValueError):
    """A checkpoint file that fails a check: bad magic, checksum, length or structure.

    ``path`` names the file and ``block`` the part of it (``"header"``, ``"index"``,
    ``"footer"``, ``"manifest"`` or ``"key group N"``) that failed. A restore that
    raises it has changed nothing.
    """

    def __init__(self, path: str, block: str, problem: str) -> None:
        super().__init__(f"corrupt checkpoint file {path!r}, {block}: {problem}")
        self.path = path
        self.block = block
        self.problem = problem
