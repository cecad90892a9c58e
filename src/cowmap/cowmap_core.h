/*
 * cowmap core: a chained hash map keyed by (key, namespace) with incremental
 * rehash, versioned copy-on-write snapshots and per-entry timestamps.
 *
 * Semantics follow Flink's CopyOnWriteStateMap (versions, chain copy-on-write,
 * incremental rehash of >= 4 entries per operation); the memory layout is ours:
 *
 *  - Entries are 48-byte structs in chunks, addressed by 32-bit index (0 = none).
 *    Exact ints that fit in int64 are stored inline (no PyObject kept).
 *  - Bucket arrays are split into pages of up to 4096 uint32 slots. Each page
 *    carries the map version it was made at; a page older than the highest
 *    version a live snapshot needs is copied before it is written. A snapshot
 *    therefore copies only the page-pointer arrays (capacity/4096 pointers).
 *  - Nothing is reference-counted per entry. An entry or page that leaves the
 *    live map while a snapshot may still see it (version < required) is
 *    "retired" onto the list of the newest live snapshot. A release queues that
 *    list in O(1); queued items are reclaimed in bounded steps (at release, and
 *    a few per later operation), each moving to the next older live snapshot
 *    that still sees it (created before it) or being freed. So memory is freed
 *    exactly once, and no single call pays for a large snapshot.
 *  - Buckets of the old table below the rehash index are never read again, so
 *    migration never writes old pages; each old page is dropped as soon as the
 *    migration passes its end (the retired table is freed in pieces).
 *
 * All functions run with the GIL held. A `busy` flag rejects re-entrant use
 * (a key's __eq__, a copier or a transform function calling back into the
 * map) and calls from a second thread the GIL switched to while that code
 * ran (the map records which thread holds it, to say which); a last reference to an object is released only once the map is
 * consistent again (other DECREFs run no Python code and happen at once).
 * Memory is taken with PyMem_Raw*, and entry chunks and full bucket pages
 * with cm_ha_alloc (huge pages where the OS grants them, hugealloc.h); both
 * are traced by tracemalloc.
 *
 * The code is split by concern into parts that compile as one unit: this file
 * includes them in order, each building on the ones before it. Include this
 * file, not a part.
 *   cm_layout.h     sizes, structs, hashing, entry indices, prefetch helpers,
 *                   deferred DECREFs (shared with flatmap.h)
 *   cm_storage.h    tables and pages, entries, page and chain copy-on-write,
 *                   incremental rehash
 *   cm_ops.h        probes, enter/leave, the single-key operations (Flink's
 *                   methods, one by one)
 *   cm_batch.h      multi-map prefetch hints; get_many, put_many,
 *                   contains_many, remove_many and their int64 pipelines
 *   cm_snapshot.h   snapshots, release and reclaim, reading a snapshot
 *   cm_ttl.h        live-map iteration, the incremental visitor, TTL sweeps
 *                   and TTL reads
 *   cm_lifecycle.h  init, dealloc, memory accounting
 *   cm_columns.h    columns: rows spread over a state's key-group maps, in
 *                   one pass (the columnar state calls)
 *   cm_export.h     a snapshot read out whole in storage order, as columns
 *                   (checkpoints)
 *   cm_changes.h    what changed since a checkpoint's cut: the marked entries
 *                   and the removed keys (incremental checkpoints)
 */
#ifndef COWMAP_CORE_H
#define COWMAP_CORE_H

#include "cm_layout.h"
#include "cm_storage.h"
#include "cm_ops.h"
#include "cm_batch.h"
#include "cm_snapshot.h"
#include "cm_ttl.h"
#include "cm_lifecycle.h"
#include "cm_columns.h"
#include "cm_export.h"
#include "cm_changes.h"

#endif /* COWMAP_CORE_H */
