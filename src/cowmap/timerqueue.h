/*
 * Timer queues: the timers of one time domain of a timer service, one heap
 * per key group (so timers split and merge with key groups like state) and a
 * heap of those heaps ordered by their heads, so the earliest timer of all is
 * found in O(1) and taken in O(log n) (Flink's key-group-partitioned priority
 * queue has this shape). Timers compare by timestamp only, so the order among
 * equal timestamps is the queue's own; Flink leaves it open too (its heap
 * backend keeps one heap over all key groups, its RocksDB backend orders by
 * serialized key).
 *
 * A key group's timers sit in a block with two arrays of the same capacity:
 *   - records (key, namespace, timestamp; 24 bytes), the timers themselves,
 *     at fixed indexes: a record never moves while its timer lives;
 *   - a 4-ary min-heap of entries (timestamp, record index, hash; 16 bytes),
 *     one per record. The four children of a node share a cache line, so a
 *     sift touches one line per level, and half as many levels as a binary
 *     heap.
 * A timer is one per (key, namespace, timestamp): an open-addressing table
 * per key group (linear probing, backward-shift deletion, at most 3/4 full)
 * maps the timer's hash to its record. Because records do not move, the
 * table is not touched when entries move: a sift writes only entries.
 *
 * Delete is lazy, the usual way with a heap: the timer leaves the table and
 * its record is cleared (O(1) after the probe), while its entry stays in the
 * heap until it surfaces, when it is dropped. Deleted entries are never left
 * at the front (a delete of the head drops it at once), so a key group's head
 * is always a live timer; and when deleted entries outnumber live ones the
 * heap is rebuilt without them (O(n), amortised O(1) per delete), so memory
 * stays within twice the live timers.
 *
 * Firing many timers at once (an advance whose due timers are a good part of
 * a key group's) takes them out of the heap in one sequential pass, sorts
 * them (radix sort) into a run, and rebuilds the heap of the rest: the timers
 * then fire from the run in order, and the next ones' records and table slots
 * are prefetched. Without a run each firing would pop the heap, a cache miss
 * on every level of a big one. A key group's head is the earlier of its heap's
 * and its run's; a timer registered while a run is there goes to the heap,
 * and one deleted is skipped when the run reaches it.
 *
 * Snapshots share blocks: a block has a reference count, a snapshot takes a
 * reference and reads the records (the heap is only the queue's index), and
 * the queue copies a shared block before its first change (copy-on-write per
 * key group, as for state). Runs live outside blocks and name records by
 * index, which a copy keeps.
 *
 * Keys and namespaces are Python objects: comparing them may run Python code
 * (__eq__), which could come back into the queue. The caller (_timers.pyx)
 * refuses such re-entry; the functions here only say where Python ran.
 * Called with the GIL held.
 */
#ifndef COWMAP_TIMERQUEUE_H
#define COWMAP_TIMERQUEUE_H

#include <Python.h>
#include <stdint.h>
#include <string.h>

#include "hugealloc.h"

typedef struct {
    int64_t ts;
    uint32_t rec;        /* its record's index */
    uint32_t hash;       /* of (key, namespace, ts): the table's */
} cm_tent;

typedef struct {
    PyObject *key;       /* strong; NULL: deleted (its entry not dropped yet) or free */
    PyObject *ns;        /* strong while live; when free, the next free record's index */
    int64_t ts;
} cm_trec;

#define CM_NO_REC UINT32_MAX

/* 48 bytes, so that entry i lies at 48 + 16 i: the children 4i+1..4i+4 of
 * entry i start on a cache line when the block does. */
typedef struct {
    Py_ssize_t refs;     /* the queue and the snapshots that share it */
    uint32_t cap;        /* room for cap entries and cap records */
    uint32_t size;       /* entries in the heap */
    uint32_t used;       /* records taken: live, or deleted with an entry in the heap or a run */
    uint32_t live;       /* timers */
    uint32_t nrec;       /* records [0, nrec) have been handed out (the rest were never written) */
    uint32_t free;       /* first free record below nrec, CM_NO_REC: none */
    char pad[16];
} cm_tblock;

#define CM_ENT(b) ((cm_tent *)((char *)(b) + sizeof(cm_tblock)))
#define CM_REC(b) ((cm_trec *)((char *)(b) + sizeof(cm_tblock) + (size_t)(b)->cap * sizeof(cm_tent)))
#define CM_BLOCK_BYTES(cap) (sizeof(cm_tblock) + (size_t)(cap) * (sizeof(cm_tent) + sizeof(cm_trec)))
#define CM_MAX_CAP ((uint32_t)1 << 27)

typedef struct {
    cm_tblock *b;        /* NULL: no timers (yet) */
    uint64_t *slots;     /* table: hash << 32 | (record + 1), 0 = free; NULL when none */
    uint32_t mask;       /* slots has mask + 1 entries */
    uint32_t pos;        /* position of this key group in the heap of heaps */
    int64_t head;        /* the earliest timestamp (valid when nonempty) */
    int nonempty;        /* whether there is a timer (the head's) */
    uint32_t run_at, run_len;
    cm_tent *run;        /* due entries taken out of the heap, ascending from run_at; NULL: none */
} cm_kgq;

typedef struct {
    cm_kgq *kg;          /* by key group, relative to the first one owned */
    uint32_t *hoh;       /* heap of heaps: hoh[1..nkg] are key-group indexes */
    uint32_t nkg;
    Py_ssize_t count;    /* timers in all key groups */
    uint32_t *runs;      /* [nruns] key groups with a run; then room for nkg more (a walk's stack) */
    uint32_t nruns;
} cm_tqueue;

#define CM_SLOT(h, rec) (((uint64_t)(h) << 32) | ((uint64_t)(rec) + 1))
#define CM_SLOT_REC(e) ((uint32_t)(e) - 1)
#define CM_SLOT_HASH(e) ((uint32_t)((e) >> 32))

static inline uint32_t cm_timer_hash(Py_hash_t hk, Py_hash_t hn, int64_t ts)
{
    uint64_t x = (uint64_t)hk * 0x9E3779B97F4A7C15ull;
    x ^= (uint64_t)hn * 0xC2B2AE3D27D4EB4Full + (uint64_t)ts * 0x165667B19E3779F9ull;
    x ^= x >> 29;
    x *= 0xBF58476D1CE4E5B9ull;
    x ^= x >> 32;
    return (uint32_t)x;
}

static void cm_block_decref(cm_tblock *b)
{
    if (b == NULL || --b->refs > 0)
        return;
    cm_trec *r = CM_REC(b);
    for (uint32_t i = 0; i < b->nrec; i++) {
        if (r[i].key != NULL) {
            Py_DECREF(r[i].key);
            Py_DECREF(r[i].ns);
        }
    }
    /* no pages given back: blocks of this size are wanted again as key groups grow */
    cm_ha_free_ex(b, CM_BLOCK_BYTES(b->cap), 0);
}

/* Blocks and tables come from the huge-page block allocator: a sift or a
 * probe in a big queue misses the cache, and on 4 KiB pages the TLB too. */
static cm_tblock *cm_block_new(uint32_t cap)
{
    cm_tblock *b = (cm_tblock *)cm_ha_alloc(CM_BLOCK_BYTES(cap), 0);
    if (b == NULL)
        return NULL;
    memset(b, 0, sizeof(cm_tblock));
    b->refs = 1;
    b->cap = cap;
    b->free = CM_NO_REC;
    return b;
}

static int cm_tq_init(cm_tqueue *q, uint32_t nkg)
{
    q->kg = (cm_kgq *)PyMem_RawCalloc(nkg ? nkg : 1, sizeof(cm_kgq));
    q->hoh = (uint32_t *)PyMem_RawMalloc(((size_t)nkg + 1) * sizeof(uint32_t));
    q->runs = (uint32_t *)PyMem_RawMalloc((nkg ? 2 * (size_t)nkg : 1) * sizeof(uint32_t));
    if (q->kg == NULL || q->hoh == NULL || q->runs == NULL) {
        PyMem_RawFree(q->kg);
        PyMem_RawFree(q->hoh);
        PyMem_RawFree(q->runs);
        q->kg = NULL;
        q->hoh = NULL;
        q->runs = NULL;
        PyErr_NoMemory();
        return -1;
    }
    q->nkg = nkg;
    q->count = 0;
    q->nruns = 0;
    /* all empty: any order is a heap; key-group order, as Flink adds them */
    for (uint32_t i = 0; i < nkg; i++) {
        q->hoh[i + 1] = i;
        q->kg[i].pos = i + 1;
    }
    return 0;
}

static void cm_tq_free(cm_tqueue *q)
{
    if (q->kg != NULL) {
        for (uint32_t i = 0; i < q->nkg; i++) {
            cm_block_decref(q->kg[i].b);
            cm_ha_free(q->kg[i].slots, ((size_t)q->kg[i].mask + 1) * sizeof(uint64_t));
            PyMem_RawFree(q->kg[i].run);
        }
    }
    PyMem_RawFree(q->kg);
    PyMem_RawFree(q->hoh);
    PyMem_RawFree(q->runs);
    q->kg = NULL;
    q->hoh = NULL;
    q->runs = NULL;
    q->nkg = 0;
    q->count = 0;
    q->nruns = 0;
}

/* ---------------------------------------------------------------- 4-ary heaps of entries */

static inline void cm_heap_up(cm_tent *h, uint32_t i)
{
    cm_tent cur = h[i];
    while (i > 0) {
        uint32_t p = (i - 1) >> 2;
        if (!(cur.ts < h[p].ts))
            break;
        h[i] = h[p];
        i = p;
    }
    h[i] = cur;
}

static inline void cm_heap_down(cm_tent *h, uint32_t n, uint32_t i)
{
    cm_tent cur = h[i];
    for (;;) {
        uint32_t c = 4 * i + 1, m = c;
        if (c >= n)
            break;
        uint32_t end = n - c < 4 ? n : c + 4;
        for (uint32_t k = c + 1; k < end; k++)
            if (h[k].ts < h[m].ts)
                m = k;
        if (!(h[m].ts < cur.ts))
            break;
        h[i] = h[m];
        i = m;
    }
    h[i] = cur;
}

static void cm_heapify(cm_tent *h, uint32_t n)
{
    if (n < 2)
        return;
    for (uint32_t i = (n - 2) / 4 + 1; i-- > 0;)
        cm_heap_down(h, n, i);
}

static inline void cm_heap_pop(cm_tblock *b)
{
    cm_tent *h = CM_ENT(b);
    uint32_t n = --b->size;
    if (n > 0) {
        h[0] = h[n];
        cm_heap_down(h, n, 0);
    }
}

/* ---------------------------------------------------------------- records */

static inline uint32_t cm_rec_take(cm_tblock *b)
{
    uint32_t i = b->free;
    if (i != CM_NO_REC)
        b->free = (uint32_t)(uintptr_t)CM_REC(b)[i].ns;
    else
        i = b->nrec++;
    b->used++;
    return i;
}

/* Record i's entry is gone: the record is free (its references were dropped or moved). */
static inline void cm_rec_drop(cm_tblock *b, uint32_t i)
{
    cm_trec *r = &CM_REC(b)[i];
    r->key = NULL;
    r->ns = (PyObject *)(uintptr_t)b->free;
    b->free = i;
    b->used--;
}

/* ---------------------------------------------------------------- one key group */

/* Frees table slot s (backward-shift deletion: later timers of its probe run move back). */
static void cm_kg_unslot(cm_kgq *g, uint32_t s)
{
    uint32_t mask = g->mask, i = s, j = s;
    for (;;) {
        j = (j + 1) & mask;
        uint64_t e = g->slots[j];
        if (e == 0)
            break;
        uint32_t home = CM_SLOT_HASH(e) & mask;
        /* the timer at j stays if its home lies cyclically in (i, j] */
        if (i <= j ? (i < home && home <= j) : (i < home || home <= j))
            continue;
        g->slots[i] = e;
        i = j;
    }
    g->slots[i] = 0;
}

/* The table slot holding record rec of hash h (it is there). */
static inline uint32_t cm_kg_slot_of(cm_kgq *g, uint32_t h, uint32_t rec)
{
    uint64_t want = CM_SLOT(h, rec);
    uint32_t s = h & g->mask;
    while (g->slots[s] != want)
        s = (s + 1) & g->mask;
    return s;
}

static inline void cm_kg_slot_put(cm_kgq *g, uint32_t h, uint32_t rec)
{
    uint32_t s = h & g->mask;
    while (g->slots[s] != 0)
        s = (s + 1) & g->mask;
    g->slots[s] = CM_SLOT(h, rec);
}

/* Drops deleted entries from the front of the heap and of the run (the block must be g's own). */
static void cm_kg_purge(cm_kgq *g)
{
    cm_tblock *b = g->b;
    cm_trec *r = CM_REC(b);
    while (b->size > 0 && r[CM_ENT(b)[0].rec].key == NULL) {
        cm_rec_drop(b, CM_ENT(b)[0].rec);
        cm_heap_pop(b);
    }
    while (g->run_at < g->run_len && r[g->run[g->run_at].rec].key == NULL)
        cm_rec_drop(b, g->run[g->run_at++].rec);
}

/* Whether the front of g's run comes before the front of its heap (both live). */
static inline int cm_kg_run_first(cm_kgq *g)
{
    return g->run_at < g->run_len && (g->b->size == 0 || g->run[g->run_at].ts <= CM_ENT(g->b)[0].ts);
}

/* Recomputes g's head; whether it changed. */
static int cm_kg_rehead(cm_kgq *g)
{
    int nonempty = g->b != NULL && (g->b->size > 0 || g->run_at < g->run_len);
    int64_t head = !nonempty ? 0 : cm_kg_run_first(g) ? g->run[g->run_at].ts : CM_ENT(g->b)[0].ts;
    if (nonempty == g->nonempty && head == g->head)
        return 0;
    g->nonempty = nonempty;
    g->head = head;
    return 1;
}

/* Rebuilds the heap without its deleted entries, freeing their records; with
 * no timer left, the block starts over. The block must be g's own, with no run. */
static void cm_kg_compact(cm_kgq *g)
{
    cm_tblock *b = g->b;
    if (b->live == 0) {
        b->size = b->used = b->nrec = 0;
        b->free = CM_NO_REC;
        return;
    }
    cm_tent *h = CM_ENT(b);
    cm_trec *r = CM_REC(b);
    uint32_t n = 0;
    for (uint32_t i = 0; i < b->size; i++) {
        if (r[h[i].rec].key == NULL)
            cm_rec_drop(b, h[i].rec);
        else
            h[n++] = h[i];
    }
    b->size = n;
    cm_heapify(h, n);
}

/* Makes g's block a copy of capacity cap (new references to a shared block's
 * keys and namespaces; an own block's move, and it is freed). -1 on no memory. */
static int cm_kg_copy(cm_kgq *g, uint32_t cap)
{
    cm_tblock *b = g->b, *nb = cm_block_new(cap);
    if (nb == NULL)
        return -1;
    if (b != NULL) {
        memcpy(CM_ENT(nb), CM_ENT(b), (size_t)b->size * sizeof(cm_tent));
        memcpy(CM_REC(nb), CM_REC(b), (size_t)b->nrec * sizeof(cm_trec));
        nb->size = b->size;
        nb->used = b->used;
        nb->live = b->live;
        nb->nrec = b->nrec;
        nb->free = b->free;
        if (b->refs > 1) {  /* a snapshot keeps the old block */
            cm_trec *r = CM_REC(nb);
            for (uint32_t i = 0; i < nb->nrec; i++) {
                if (r[i].key != NULL) {
                    Py_INCREF(r[i].key);
                    Py_INCREF(r[i].ns);
                }
            }
            b->refs--;
        } else {
            cm_ha_free_ex(b, CM_BLOCK_BYTES(b->cap), 0);
        }
    }
    g->b = nb;
    return 0;
}

/* Makes a shared block g's own before a change. */
static inline int cm_kg_own(cm_kgq *g)
{
    return g->b->refs == 1 ? 0 : cm_kg_copy(g, g->b->cap);
}

/* Makes g's block its own with room for one more record, and its table fit
 * for one more timer. -1 on no memory or too many timers. */
static int cm_kg_reserve(cm_kgq *g)
{
    cm_tblock *b = g->b;
    if (b != NULL && b->used == b->cap && g->run == NULL && b->used - b->live >= b->cap / 4) {
        if (cm_kg_own(g) < 0)
            return -1;
        cm_kg_compact(g);  /* room enough without growing */
        b = g->b;
    }
    if (b == NULL || b->used == b->cap) {
        uint32_t cap = b == NULL ? 4 : b->cap * 2;
        if (cap > CM_MAX_CAP) {
            PyErr_SetString(PyExc_OverflowError, "too many timers in one key group");
            return -1;
        }
        if (cm_kg_copy(g, cap) < 0)
            return -1;
    } else if (cm_kg_own(g) < 0) {
        return -1;
    }
    b = g->b;
    /* the table: at most 3/4 full of live timers */
    if (g->slots == NULL || ((size_t)b->live + 1) * 4 > ((size_t)g->mask + 1) * 3) {
        size_t n = g->slots == NULL ? 8 : ((size_t)g->mask + 1) * 2;
        while (((size_t)b->live + 1) * 4 > n * 3)
            n *= 2;
        uint64_t *slots = (uint64_t *)cm_ha_alloc(n * sizeof(uint64_t), 1);
        if (slots == NULL)
            return -1;
        if (g->slots != NULL)
            cm_ha_free(g->slots, ((size_t)g->mask + 1) * sizeof(uint64_t));
        g->slots = slots;
        g->mask = (uint32_t)(n - 1);
        /* the live timers' entries: all of them when none was deleted (no record read) */
        cm_trec *r = CM_REC(b);
        int all = b->used == b->live;
        for (uint32_t i = 0; i < b->size; i++)
            if (all || r[CM_ENT(b)[i].rec].key != NULL)
                cm_kg_slot_put(g, CM_ENT(b)[i].hash, CM_ENT(b)[i].rec);
        for (uint32_t i = g->run_at; i < g->run_len; i++)
            if (all || r[g->run[i].rec].key != NULL)
                cm_kg_slot_put(g, g->run[i].hash, g->run[i].rec);
    }
    return 0;
}

/* a == b (1, 0, or -1 with an exception), a kept alive whatever __eq__ does. */
static int cm_obj_eq(PyObject *a, PyObject *b)
{
    if (a == b)
        return 1;
    Py_INCREF(a);
    int r = PyObject_RichCompareBool(a, b, Py_EQ);
    Py_DECREF(a);
    return r;
}

/* Record index + 1 of timer (ts, key, ns) of hash h in key group g, its table
 * slot in *slot; or 0 if there is none. -1 with an exception if comparing
 * keys or namespaces raised; -2 if the Python code such a comparison ran
 * changed this key group. */
static Py_ssize_t cm_kg_find(cm_kgq *g, int64_t ts, PyObject *key, PyObject *ns, uint32_t h, uint32_t *slot)
{
    if (g->slots == NULL)
        return 0;
    uint32_t s = h & g->mask;
    for (;;) {
        uint64_t e = g->slots[s];
        if (e == 0)
            return 0;
        uint32_t i = CM_SLOT_REC(e);
        cm_trec *t = &CM_REC(g->b)[i];
        if (CM_SLOT_HASH(e) == h && t->ts == ts) {
            PyObject *tkey = t->key, *tns = t->ns;
#define CM_KG_CHANGED (g->slots == NULL || g->slots[s] != e || CM_REC(g->b)[i].key != tkey || CM_REC(g->b)[i].ns != tns)
            int eq = cm_obj_eq(tkey, key);
            if (eq < 0)
                return -1;
            if (CM_KG_CHANGED)
                return -2;
            if (eq) {
                eq = cm_obj_eq(tns, ns);
                if (eq < 0)
                    return -1;
                if (CM_KG_CHANGED)
                    return -2;
                if (eq) {
                    *slot = s;
                    return (Py_ssize_t)i + 1;
                }
            }
#undef CM_KG_CHANGED
        }
        s = (s + 1) & g->mask;
    }
}

/* ---------------------------------------------------------------- the heap of heaps */

/* Whether key group a's head comes before b's (an empty one comes last). */
static inline int cm_hoh_less(cm_tqueue *q, uint32_t a, uint32_t b)
{
    const cm_kgq *ga = &q->kg[a], *gb = &q->kg[b];
    if (!ga->nonempty)
        return 0;
    return !gb->nonempty || ga->head < gb->head;
}

static inline void cm_hoh_place(cm_tqueue *q, uint32_t pos, uint32_t g)
{
    q->hoh[pos] = g;
    q->kg[g].pos = pos;
}

static void cm_hoh_sift_up(cm_tqueue *q, uint32_t pos)
{
    uint32_t cur = q->hoh[pos], parent = pos >> 1;
    while (parent > 0 && cm_hoh_less(q, cur, q->hoh[parent])) {
        cm_hoh_place(q, pos, q->hoh[parent]);
        pos = parent;
        parent >>= 1;
    }
    cm_hoh_place(q, pos, cur);
}

static void cm_hoh_sift_down(cm_tqueue *q, uint32_t pos)
{
    uint32_t cur = q->hoh[pos], n = q->nkg, child = pos << 1;
    if (child + 1 <= n && cm_hoh_less(q, q->hoh[child + 1], q->hoh[child]))
        child++;
    while (child <= n && cm_hoh_less(q, q->hoh[child], cur)) {
        cm_hoh_place(q, pos, q->hoh[child]);
        pos = child;
        child = pos << 1;
        if (child + 1 <= n && cm_hoh_less(q, q->hoh[child + 1], q->hoh[child]))
            child++;
    }
    cm_hoh_place(q, pos, cur);
}

/* Key group g's head may have changed: move it in the heap of heaps. */
static void cm_hoh_adjust(cm_tqueue *q, uint32_t g)
{
    if (!cm_kg_rehead(&q->kg[g]))
        return;
    uint32_t pos = q->kg[g].pos;
    cm_hoh_sift_down(q, pos);
    if (q->hoh[pos] == g)
        cm_hoh_sift_up(q, pos);
}

/* ---------------------------------------------------------------- the queue */

/* Adds timer (ts, key, ns) to key group g (new references are taken).
 * 1: added; 0: there was one already; -1: error (exception set); -2: Python
 * code run by a key comparison changed this queue (the caller raises). */
static int cm_tq_add(cm_tqueue *q, uint32_t g, int64_t ts, PyObject *key, PyObject *ns, uint32_t h)
{
    cm_kgq *kg = &q->kg[g];
    uint32_t s;
    Py_ssize_t p = cm_kg_find(kg, ts, key, ns, h, &s);
    if (p != 0)
        return p > 0 ? 0 : (int)p;
    if (cm_kg_reserve(kg) < 0)
        return -1;
    cm_tblock *b = kg->b;
    uint32_t i = cm_rec_take(b);
    cm_trec *r = &CM_REC(b)[i];
    Py_INCREF(key);
    Py_INCREF(ns);
    r->key = key;
    r->ns = ns;
    r->ts = ts;
    b->live++;
    cm_kg_slot_put(kg, h, i);
    cm_tent *e = &CM_ENT(b)[b->size];
    e->ts = ts;
    e->rec = i;
    e->hash = h;
    cm_heap_up(CM_ENT(b), b->size++);
    q->count++;
    cm_hoh_adjust(q, g);
    return 1;
}

/* Removes timer (ts, key, ns) from key group g: 1 removed, 0 there was none,
 * -1 error, -2 Python code changed this queue (as cm_tq_add). */
static int cm_tq_remove(cm_tqueue *q, uint32_t g, int64_t ts, PyObject *key, PyObject *ns, uint32_t h)
{
    cm_kgq *kg = &q->kg[g];
    uint32_t s;
    Py_ssize_t p = cm_kg_find(kg, ts, key, ns, h, &s);
    if (p <= 0)
        return (int)p;
    if (cm_kg_own(kg) < 0)
        return -1;
    cm_tblock *b = kg->b;
    uint32_t i = (uint32_t)(p - 1);
    cm_trec *r = &CM_REC(b)[i];
    PyObject *k = r->key, *n = r->ns;
    r->key = NULL;
    r->ns = NULL;
    b->live--;
    q->count--;
    cm_kg_unslot(kg, s);
    if ((b->size > 0 && CM_ENT(b)[0].rec == i) || (kg->run_at < kg->run_len && kg->run[kg->run_at].rec == i)) {
        cm_kg_purge(kg);
        cm_hoh_adjust(q, g);
    }
    if (kg->run == NULL && (b->live == 0 || (b->used - b->live > b->live && b->used - b->live >= 16)))
        cm_kg_compact(kg);
    /* last: dropping them may run Python code (__del__) */
    Py_DECREF(k);
    Py_DECREF(n);
    return 1;
}

/* Whether there is a timer; the earliest one's timestamp in *ts. */
static inline int cm_tq_head(cm_tqueue *q, int64_t *ts)
{
    if (q->nkg == 0)
        return 0;
    cm_kgq *g = &q->kg[q->hoh[1]];
    *ts = g->head;
    return g->nonempty;
}

/* Takes the earliest timer: its timestamp, key and namespace (the references
 * go to the caller), its key group in *g. 0, or -1 on no memory (copying a
 * shared block). There must be a timer. */
static int cm_tq_poll(cm_tqueue *q, int64_t *ts, PyObject **key, PyObject **ns, uint32_t *g)
{
    uint32_t k = q->hoh[1];
    cm_kgq *kg = &q->kg[k];
    if (cm_kg_own(kg) < 0)
        return -1;
    cm_tblock *b = kg->b;
    cm_tent e;
    if (cm_kg_run_first(kg)) {
        e = kg->run[kg->run_at++];
        /* the record and slot of the run's next but one, read when this key group
         * is polled next (the next one's were fetched at this poll's turn) */
#if defined(__GNUC__)
        if (kg->run_at + 1 < kg->run_len) {
            const cm_tent *nx = &kg->run[kg->run_at + 1];
            __builtin_prefetch(&CM_REC(b)[nx->rec]);
            __builtin_prefetch(&kg->slots[nx->hash & kg->mask]);
        }
#endif
    } else {
        e = CM_ENT(b)[0];
        cm_heap_pop(b);
    }
    cm_trec *r = &CM_REC(b)[e.rec];
    *ts = e.ts;
    *key = r->key;
    *ns = r->ns;
    cm_kg_unslot(kg, cm_kg_slot_of(kg, e.hash, e.rec));
    cm_rec_drop(b, e.rec);
    b->live--;
    q->count--;
    cm_kg_purge(kg);
    cm_hoh_adjust(q, k);
    *g = k;
    return 0;
}

/* Sorts n entries by timestamp, stably: an LSD radix sort over the bytes of
 * ts - min that vary. tmp has room for n. */
static void cm_sort_entries(cm_tent *a, cm_tent *tmp, uint32_t n)
{
    if (n < 2)
        return;
    int64_t lo = a[0].ts, hi = a[0].ts;
    for (uint32_t i = 1; i < n; i++) {
        if (a[i].ts < lo)
            lo = a[i].ts;
        if (a[i].ts > hi)
            hi = a[i].ts;
    }
    uint64_t range = (uint64_t)hi - (uint64_t)lo;
    uint32_t count[256];
    cm_tent *src = a, *dst = tmp;
    for (unsigned shift = 0; shift < 64 && (range >> shift) != 0; shift += 8) {
        memset(count, 0, sizeof(count));
        for (uint32_t i = 0; i < n; i++)
            count[(((uint64_t)src[i].ts - (uint64_t)lo) >> shift) & 0xFF]++;
        uint32_t sum = 0;
        for (unsigned d = 0; d < 256; d++) {
            uint32_t c = count[d];
            count[d] = sum;
            sum += c;
        }
        for (uint32_t i = 0; i < n; i++)
            dst[count[(((uint64_t)src[i].ts - (uint64_t)lo) >> shift) & 0xFF]++] = src[i];
        cm_tent *t = src;
        src = dst;
        dst = t;
    }
    if (src != a)
        memcpy(a, src, (size_t)n * sizeof(cm_tent));
}

/* Whether at least want entries of g's heap are due at upto (a walk of the due part from the root). */
static int cm_kg_many_due(const cm_tblock *b, int64_t upto, uint32_t want)
{
    const cm_tent *h = CM_ENT(b);
    uint32_t stack[64 * 4], top = 0, seen = 0;
    if (b->size == 0 || h[0].ts > upto)
        return 0;
    stack[top++] = 0;
    while (top > 0) {
        uint32_t i = stack[--top];
        if (++seen >= want)
            return 1;
        for (uint32_t c = 4 * i + 1; c <= 4 * i + 4 && c < b->size; c++)
            if (h[c].ts <= upto && top < sizeof(stack) / sizeof(stack[0]))
                stack[top++] = c;
    }
    return 0;
}

/* Takes g's due entries out of its heap into a sorted run. 0, or -1 if there is
 * no memory for it (no exception: the timers then fire from the heap). */
static int cm_kg_take_run(cm_kgq *g, int64_t upto)
{
    cm_tblock *b = g->b;
    cm_tent *h = CM_ENT(b);
    uint32_t due = 0, n = 0;
    for (uint32_t i = 0; i < b->size; i++)
        due += h[i].ts <= upto;
    cm_tent *run = (cm_tent *)PyMem_RawMalloc((size_t)due * sizeof(cm_tent));
    cm_tent *tmp = (cm_tent *)PyMem_RawMalloc((size_t)due * sizeof(cm_tent));
    if (run == NULL || tmp == NULL || (b->refs > 1 && cm_kg_copy(g, b->cap) < 0)) {
        PyErr_Clear();
        PyMem_RawFree(run);
        PyMem_RawFree(tmp);
        return -1;
    }
    b = g->b;
    h = CM_ENT(b);
    uint32_t k = 0;
    for (uint32_t i = 0; i < b->size; i++) {
        if (h[i].ts <= upto)
            run[k++] = h[i];
        else
            h[n++] = h[i];
    }
    b->size = n;
    cm_heapify(h, n);
    cm_sort_entries(run, tmp, due);
    PyMem_RawFree(tmp);
    g->run = run;
    g->run_at = 0;
    g->run_len = due;
    cm_kg_purge(g);  /* the new fronts may be deleted timers */
    return 0;
}

/* An advance is about to fire every timer due at upto: key groups with many
 * due timers get a run. */
static void cm_tq_begin_fire(cm_tqueue *q, int64_t upto)
{
    /* a walk of the heap of heaps over the key groups with due heads */
    uint32_t *stack = q->runs + q->nkg, top = 0;
    if (q->nkg == 0)
        return;
    stack[top++] = 1;
    while (top > 0) {
        uint32_t pos = stack[--top], k = q->hoh[pos];
        cm_kgq *g = &q->kg[k];
        if (!g->nonempty || g->head > upto)
            continue;
        if (2 * pos <= q->nkg)
            stack[top++] = 2 * pos;
        if (2 * pos + 1 <= q->nkg)
            stack[top++] = 2 * pos + 1;
        uint32_t size = g->b->size, want = size / 16 > 32 ? size / 16 : 32;
        if (g->run == NULL && size >= want && cm_kg_many_due(g->b, upto, want) && cm_kg_take_run(g, upto) == 0) {
            q->runs[q->nruns++] = k;
            cm_hoh_adjust(q, k);  /* (the same head: the walk's positions hold) */
        }
    }
}

/* Puts what is left of g's run back into its heap. 0, or -1 with an exception
 * (no memory to copy a shared block: the run then stays, which is correct). */
static int cm_kg_end_run(cm_kgq *g)
{
    if (g->run == NULL)
        return 0;
    if (g->run_at < g->run_len) {
        if (cm_kg_own(g) < 0)
            return -1;
        cm_tblock *b = g->b;
        for (uint32_t i = g->run_at; i < g->run_len; i++) {
            CM_ENT(b)[b->size] = g->run[i];
            cm_heap_up(CM_ENT(b), b->size++);
        }
    }
    PyMem_RawFree(g->run);
    g->run = NULL;
    g->run_at = g->run_len = 0;
    if (g->b->size > 0 && CM_REC(g->b)[CM_ENT(g->b)[0].rec].key == NULL)
        cm_kg_purge(g);  /* a deleted one of the run came to the front (the block is own: it moved) */
    return 0;
}

/* The advance is over: runs go back into their heaps. -1 with an exception
 * if one could not (its timers stay in order and will fire). */
static int cm_tq_end_fire(cm_tqueue *q)
{
    int rc = 0;
    uint32_t kept = 0;
    for (uint32_t j = 0; j < q->nruns; j++) {
        cm_kgq *g = &q->kg[q->runs[j]];
        if (cm_kg_end_run(g) < 0) {
            rc = -1;
            q->runs[kept++] = q->runs[j];
            continue;
        }
        cm_tblock *b = g->b;
        if (b != NULL && b->refs == 1 && (b->live == 0 || b->used - b->live > b->live))
            cm_kg_compact(g);
    }
    q->nruns = kept;
    return rc;
}

/* Drops every timer of key group g (a restore that replaces them). */
static void cm_tq_clear(cm_tqueue *q, uint32_t g)
{
    cm_kgq *kg = &q->kg[g];
    cm_tblock *b = kg->b;
    PyMem_RawFree(kg->run);  /* (a run left by a failed end of firing: its key group stays listed, without it) */
    kg->run = NULL;
    kg->run_at = kg->run_len = 0;
    if (b != NULL)
        q->count -= b->live;
    kg->b = NULL;
    cm_ha_free(kg->slots, ((size_t)kg->mask + 1) * sizeof(uint64_t));
    kg->slots = NULL;
    kg->mask = 0;
    cm_hoh_adjust(q, g);
    cm_block_decref(b);  /* last: dropping keys may run Python code (__del__) */
}

/* A reference to key group g's block for a snapshot (NULL when it has no timers). */
static inline cm_tblock *cm_tq_share(cm_tqueue *q, uint32_t g)
{
    cm_tblock *b = q->kg[g].b;
    if (b == NULL || b->live == 0)
        return NULL;
    b->refs++;
    return b;
}

#endif
