"""``python -m cowmap.checkpoint inspect|verify URI``: what a checkpoint directory
holds, and whether every byte of it checks out."""

from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Sequence

from cowmap.checkpoint.checkpoint_storage import CheckpointStorage
from cowmap.checkpoint.errors import CorruptCheckpointError
from cowmap.checkpoint.fileformat import PENDING_BLOCK


def _ids(storage: CheckpointStorage, cid: int | None) -> list[int]:
    return storage.checkpoints() if cid is None else [cid]


def inspect(storage: CheckpointStorage, cid: int | None) -> int:
    ids = _ids(storage, cid)
    if not ids:
        print(f"no committed checkpoint in {storage.uri}")
        return 0
    for i in ids:
        m = storage.manifest(i)
        chained = f" on checkpoint {m['parent']}" if m.get("parent") is not None else ""
        print(
            f"checkpoint {i}: {m['type']}{chained}, {m['entries']:,} rows, max parallelism {m['max_parallelism']}"
        )
        for f in m["files"]:
            r = storage._store.open_data(f["name"], f["size"])
            states = r.header["states"]
            timers = r.header.get("timer_services", [])
            # an increment's tombstone sections follow the states' own indices, then the timers'
            rows = [0] * (2 * len(states) + 2 * len(timers))
            size = [0] * len(rows)
            pending = 0
            for kg in r.blocks:
                for s, n, nbytes in r.section_sizes(kg, r.block_bytes(kg)):
                    if kg == PENDING_BLOCK:
                        pending += n
                    else:
                        rows[s] += n
                        size[s] += nbytes
            firsts = sorted(kg for kg in r.blocks if kg != PENDING_BLOCK)
            span = f"key groups {firsts[0]}..{r.last_of(firsts[-1])}" if firsts else "no key group"
            print(f"  {f['name']}: {f['size']:,} bytes, {len(firsts)} blocks of {span}")
            for s, meta in enumerate(states):
                ttl = f"ttl {meta['ttl']['ttl_ms']} ms" if meta["ttl"] else "no ttl"
                print(
                    f"    {meta['name']!r:24} {meta['kind']:11} {ttl:16} {meta['serializer']:10}"
                    f" {rows[s]:>12,} rows {size[s]:>14,} bytes"
                    + (f", {rows[s + len(states)]:,} removed" if r.header.get("type") == "incremental" else "")
                )
            for t, name in enumerate(timers):
                at = 2 * len(states) + 2 * t
                print(
                    f"    timers {name!r:17} {rows[at]:>12,} event time {rows[at + 1]:>12,} processing time"
                    f" {size[at] + size[at + 1]:>14,} bytes"
                )
            if pending:
                print(f"    {pending:,} records waiting at the checkpoint (unaligned)")
    return 0


def verify(storage: CheckpointStorage, cid: int | None) -> int:
    ids = _ids(storage, cid)
    if not ids:  # (nothing to vouch for: a script checking a checkpoint before using it must not pass)
        print(f"no committed checkpoint in {storage.uri}")
        return 1
    bad = 0
    for i in ids:
        try:
            m = storage.manifest(i)
            blocks = 0
            for f in m["files"]:
                r = storage._store.open_data(f["name"], f["size"])
                for kg in r.blocks:
                    r.section_sizes(kg, r.block_bytes(kg))
                    blocks += 1
        except CorruptCheckpointError as e:
            bad += 1
            print(f"checkpoint {i}: CORRUPT: {e}")
        except FileNotFoundError as e:
            bad += 1
            print(f"checkpoint {i}: {e}")
        else:
            print(f"checkpoint {i}: ok ({len(m['files'])} files, {blocks} blocks checked)")
    return 1 if bad else 0


def main(argv: Sequence[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m cowmap.checkpoint", description=__doc__)
    p.add_argument("command", choices=["inspect", "verify"])
    p.add_argument("uri", help="a checkpoint directory: a local path or a pyarrow filesystem URI")
    p.add_argument("--id", type=int, default=None, help="one checkpoint (default: every committed one)")
    args = p.parse_args(argv)
    if "://" not in args.uri and not os.path.isdir(args.uri):
        print(f"no checkpoint directory {args.uri!r}", file=sys.stderr)
        return 2
    storage = CheckpointStorage(args.uri)
    return (inspect if args.command == "inspect" else verify)(storage, args.id)


if __name__ == "__main__":
    sys.exit(main())
