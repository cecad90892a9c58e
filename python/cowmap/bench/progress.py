"""A progress bar for the harness: tqdm when it is installed, else a tiny built-in one."""

from __future__ import annotations

import sys
import time
from typing import Any, TextIO


class Progress:
    """``update(desc)`` advances one unit of work. Writes to ``stream`` (stderr).

    On a terminal it redraws one line; otherwise it prints a line every ~10% so logs stay
    short. ``enabled=False`` makes every call a no-op.
    """

    def __init__(self, total: int, enabled: bool = True, stream: TextIO | None = None) -> None:
        self.total = max(1, total)
        self.done = 0
        self.enabled = enabled
        self.stream = stream if stream is not None else sys.stderr
        self.t0 = time.monotonic()
        self._tqdm: Any = None
        self._last_pct = -10
        if not enabled:
            return
        try:
            from tqdm import tqdm
        except ImportError:
            return
        self._tqdm = tqdm(total=self.total, file=self.stream, unit="step", dynamic_ncols=True, leave=True)

    def add_total(self, extra: int) -> None:
        self.total += extra
        if self._tqdm is not None:
            self._tqdm.total = self.total
            self._tqdm.refresh()

    def update(self, desc: str = "", n: int = 1) -> None:
        if not self.enabled:
            return
        self.done = min(self.total, self.done + n)
        if self._tqdm is not None:
            self._tqdm.set_description_str(desc[:48], refresh=False)
            self._tqdm.update(n)
            return
        elapsed = time.monotonic() - self.t0
        frac = self.done / self.total
        eta = f", ~{elapsed / frac - elapsed:.0f}s left" if frac > 0.02 and frac < 1 else ""
        if self.stream.isatty():
            width = 24
            bar = "#" * int(frac * width) + "." * (width - int(frac * width))
            line = f"\r[{bar}] {self.done}/{self.total} {elapsed:.0f}s{eta}  {desc[:48]}"
            self.stream.write(line.ljust(110)[:110])
            self.stream.flush()
        else:
            pct = int(frac * 100)
            if pct >= self._last_pct + 10 or self.done == self.total:
                self._last_pct = pct
                self.stream.write(f"  {pct:3d}% ({self.done}/{self.total}, {elapsed:.0f}s{eta}) {desc}\n")
                self.stream.flush()

    def close(self) -> None:
        if not self.enabled:
            return
        if self._tqdm is not None:
            self._tqdm.close()
        elif self.stream.isatty():
            self.stream.write("\n")
            self.stream.flush()
