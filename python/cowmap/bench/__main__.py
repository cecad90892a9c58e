"""``python -m cowmap.bench``: run a benchmark scenario and print a table."""

from __future__ import annotations

import argparse

from cowmap.bench.core import print_rows, run_core


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m cowmap.bench", description=__doc__)
    parser.add_argument("scenario", nargs="?", default="core", choices=["core"],
                        help="what to measure (default: core = map get/put/snapshot vs dict)")
    parser.add_argument("--n", type=int, default=1_000_000, help="number of keys (default 1,000,000)")
    parser.add_argument("--repeats", type=int, default=5, help="timed repeats; the median is shown")
    args = parser.parse_args(argv)
    if args.n < 1 or args.repeats < 1:
        parser.error("--n and --repeats must be >= 1")
    print(f"cowmap core benchmark: {args.n:,} random int64 keys, median of {args.repeats} runs")
    print_rows(run_core(args.n, args.repeats))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
