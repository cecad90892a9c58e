/*
 * Timer queues: the timers of one time domain of a timer service, one binary
 * heap per key group (so timers split and merge with key groups like state)
 * and a heap of those heaps ordered by their heads, so the earliest timer of
 * all is found in O(1) and taken in O(log n) (Flink's key-group-partitioned
 * priority queue has this shape). Timers compare by timestamp only, so the
 * order among equal timestamps is the heaps' own; Flink leaves it open too
 * (its heap backend keeps one heap over all key groups, its RocksDB backend
 * orders by serialized key).
 *
 * A key group's timers sit in a block: a 1-based heap array of cm_timer
 * (timestamp, key, namespace, hash, dedup slot; 32 bytes). A timer is one
 * per (key, namespace, timestamp): an open-addressing table per key group
 * (linear probing, backward-shift deletion, at most 3/4 full) maps the
 * timer's hash to its heap position, and each timer records its table slot,
 * so a delete finds its timer in O(1) and a sift keeps the table right as
 * timers move. A slot holds the hash next to the position, so a probe reads
 * the heap only for a timer whose whole 32-bit hash matches (the heap is the
 * cache miss; the slots of a probe run share a cache line).
 *
 * Snapshots share blocks: a block has a reference count, a snapshot takes a
 * reference, and the queue copies a shared block before its first change
 * (copy-on-write per key group, as for state).
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
    PyObject *key;       /* strong */
    PyObject *ns;        /* strong */
    uint32_t hash;       /* of (key, namespace, ts): the dedup table's */
    uint32_t slot;       /* this timer's slot in its key group's dedup table */
} cm_timer;

/* A block's header takes the place of timer 0 (the heap is 1-based), so
 * timer i lies 32 * i bytes in and siblings 2k, 2k + 1 share a cache line. */
typedef struct {
    Py_ssize_t refs;     /* the queue and the snapshots that share it */
    uint32_t size;       /* timers, at CM_HEAP(b)[1..size] */
    uint32_t cap;        /* room for cap timers: the block has 32 * (cap + 1) bytes, a power of two */
    char pad[16];
} cm_tblock;

#define CM_HEAP(b) ((cm_timer *)(b))
#define CM_BLOCK_BYTES(cap) (((size_t)(cap) + 1) * sizeof(cm_timer))

typedef struct {
    cm_tblock *b;        /* NULL: no timers (yet) */
    uint64_t *slots;     /* dedup table: hash << 32 | heap position, 0 = free; NULL when empty */
    uint32_t mask;       /* slots has mask + 1 entries */
    uint32_t pos;        /* position of this key group in the heap of heaps */
} cm_kgq;

typedef struct {
    cm_kgq *kg;          /* by key group, relative to the first one owned */
    uint32_t *hoh;       /* heap of heaps: hoh[1..nkg] are key-group indexes */
    uint32_t nkg;
    Py_ssize_t count;    /* timers in all key groups */
} cm_tqueue;

#define CM_TQ_EMPTY(q, i) ((q)->kg[i].b == NULL || (q)->kg[i].b->size == 0)
#define CM_SLOT(h, pos) (((uint64_t)(h) << 32) | (pos))
#define CM_SLOT_POS(e) ((uint32_t)(e))
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
    cm_timer *h = CM_HEAP(b);
    for (uint32_t i = 1; i <= b->size; i++) {
        Py_DECREF(h[i].key);
        Py_DECREF(h[i].ns);
    }
    /* no pages given back: blocks of this size are wanted again as key groups grow */
    cm_ha_free_ex(b, CM_BLOCK_BYTES(b->cap), 0);
}

/* Blocks and tables come from the huge-page block allocator: a sift or a
 * probe in a big queue misses the cache on every level, and on 4 KiB pages
 * the TLB too. */
static cm_tblock *cm_block_new(uint32_t cap)
{
    cm_tblock *b = (cm_tblock *)cm_ha_alloc(CM_BLOCK_BYTES(cap), 0);
    if (b == NULL)
        return NULL;
    b->refs = 1;
    b->size = 0;
    b->cap = cap;
    return b;
}

static int cm_tq_init(cm_tqueue *q, uint32_t nkg)
{
    q->kg = (cm_kgq *)PyMem_RawCalloc(nkg, sizeof(cm_kgq));
    q->hoh = (uint32_t *)PyMem_RawMalloc(((size_t)nkg + 1) * sizeof(uint32_t));
    if (q->kg == NULL || q->hoh == NULL) {
        PyMem_RawFree(q->kg);
        PyMem_RawFree(q->hoh);
        q->kg = NULL;
        q->hoh = NULL;
        PyErr_NoMemory();
        return -1;
    }
    q->nkg = nkg;
    q->count = 0;
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
        }
    }
    PyMem_RawFree(q->kg);
    PyMem_RawFree(q->hoh);
    q->kg = NULL;
    q->hoh = NULL;
    q->nkg = 0;
    q->count = 0;
}

/* ---------------------------------------------------------------- one key group's heap */

static inline void cm_kg_place(cm_kgq *g, uint32_t pos, cm_timer *t)
{
    CM_HEAP(g->b)[pos] = *t;
    g->slots[t->slot] = CM_SLOT(t->hash, pos);
}

static void cm_kg_sift_up(cm_kgq *g, uint32_t pos)
{
    cm_timer *h = CM_HEAP(g->b), cur = h[pos];
    uint32_t parent = pos >> 1;
    while (parent > 0 && cur.ts < h[parent].ts) {
        cm_kg_place(g, pos, &h[parent]);
        pos = parent;
        parent >>= 1;
    }
    cm_kg_place(g, pos, &cur);
}

static void cm_kg_sift_down(cm_kgq *g, uint32_t pos)
{
    cm_timer *h = CM_HEAP(g->b), cur = h[pos];
    uint32_t n = g->b->size, child = pos << 1;
    if (child + 1 <= n && h[child + 1].ts < h[child].ts)
        child++;
    while (child <= n && h[child].ts < cur.ts) {
        cm_kg_place(g, pos, &h[child]);
        pos = child;
        child = pos << 1;
        if (child + 1 <= n && h[child + 1].ts < h[child].ts)
            child++;
    }
    cm_kg_place(g, pos, &cur);
}

/* Frees table slot s (backward-shift deletion: later timers of its probe run
 * move back, and learn their new slots). */
static void cm_kg_unslot(cm_kgq *g, uint32_t s)
{
    uint32_t mask = g->mask, i = s, j = s;
    cm_timer *h = CM_HEAP(g->b);
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
        h[CM_SLOT_POS(e)].slot = i;
        i = j;
    }
    g->slots[i] = 0;
}

/* Makes the key group's block its own (copies a block a snapshot shares, with
 * new references to its keys and namespaces) with room for one more timer,
 * and its table big enough for it. -1 on no memory. */
static int cm_kg_reserve(cm_kgq *g)
{
    cm_tblock *b = g->b;
    uint32_t size = b ? b->size : 0;
    if (b == NULL || b->refs > 1 || size == b->cap) {
        /* capacities 2^j - 1: blocks of a power-of-two size */
        uint32_t cap = b == NULL ? 3 : (size < b->cap ? b->cap : b->cap * 2 + 1);
        if (cap < size + 1 || cap > (uint32_t)0x7FFFFFF) {
            PyErr_SetString(PyExc_OverflowError, "too many timers in one key group");
            return -1;
        }
        cm_tblock *nb = cm_block_new(cap);
        if (nb == NULL)
            return -1;
        if (b != NULL) {
            memcpy(&CM_HEAP(nb)[1], &CM_HEAP(b)[1], (size_t)size * sizeof(cm_timer));
            nb->size = size;
            if (b->refs > 1) {  /* a snapshot keeps the old block: the new one needs its own references */
                cm_timer *h = CM_HEAP(nb);
                for (uint32_t i = 1; i <= size; i++) {
                    Py_INCREF(h[i].key);
                    Py_INCREF(h[i].ns);
                }
                b->refs--;
            } else {  /* the references move with the timers */
                cm_ha_free_ex(b, CM_BLOCK_BYTES(b->cap), 0);
            }
        }
        g->b = nb;
    }
    /* the table: at most 3/4 full */
    if (g->slots == NULL || (size_t)(size + 1) * 4 > (size_t)(g->mask + 1) * 3) {
        size_t n = g->slots == NULL ? 8 : ((size_t)g->mask + 1) * 2;
        while ((size_t)(size + 1) * 4 > n * 3)
            n *= 2;
        uint64_t *slots = (uint64_t *)cm_ha_alloc(n * sizeof(uint64_t), 1);
        if (slots == NULL)
            return -1;
        if (g->slots != NULL)
            cm_ha_free(g->slots, ((size_t)g->mask + 1) * sizeof(uint64_t));
        g->slots = slots;
        g->mask = (uint32_t)(n - 1);
        cm_timer *h = CM_HEAP(g->b);
        for (uint32_t p = 1; p <= size; p++) {
            uint32_t s = h[p].hash & g->mask;
            while (slots[s] != 0)
                s = (s + 1) & g->mask;
            slots[s] = CM_SLOT(h[p].hash, p);
            h[p].slot = s;
        }
    }
    return 0;
}

/* Makes a shared block the key group's own before a change that adds nothing. */
static int cm_kg_own(cm_kgq *g)
{
    if (g->b->refs == 1)
        return 0;
    return cm_kg_reserve(g);
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

/* The heap position of timer (ts, key, ns) of hash h in key group g, or 0
 * with *free_slot set to the table slot it would take (UINT32_MAX: no table
 * yet); -1 with an exception if comparing keys or namespaces raised; -2 if
 * the Python code such a comparison ran changed this key group (slot s no
 * longer holding e, or its timer another namespace). */
static Py_ssize_t cm_kg_find(cm_kgq *g, int64_t ts, PyObject *key, PyObject *ns, uint32_t h, uint32_t *free_slot)
{
    if (g->slots == NULL) {
        *free_slot = UINT32_MAX;
        return 0;
    }
    uint32_t s = h & g->mask;
    for (;;) {
        uint64_t e = g->slots[s];
        if (e == 0) {
            *free_slot = s;
            return 0;
        }
        uint32_t p = CM_SLOT_POS(e);
        cm_timer *t = &CM_HEAP(g->b)[p];
        if (CM_SLOT_HASH(e) == h && t->ts == ts) {
            PyObject *tns = t->ns;
#define CM_KG_CHANGED (g->slots == NULL || g->slots[s] != e || CM_HEAP(g->b)[p].ns != tns)
            int eq = cm_obj_eq(t->key, key);
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
                if (eq)
                    return p;
            }
#undef CM_KG_CHANGED
        }
        s = (s + 1) & g->mask;
    }
}

/* Removes the timer at heap position pos of g (Flink's removal: the last
 * timer takes its place and moves down or up); its references go to *out
 * if out, else are dropped. The block must be g's own. */
static void cm_kg_remove_at(cm_kgq *g, uint32_t pos, cm_timer *out)
{
    cm_timer *h = CM_HEAP(g->b);
    cm_timer gone = h[pos];
    uint32_t last = g->b->size;
    cm_kg_unslot(g, gone.slot);
    if (pos != last) {
        cm_timer moved = h[last];
        cm_kg_place(g, pos, &moved);
        g->b->size--;
        cm_kg_sift_down(g, pos);
        if (h[pos].slot == moved.slot)  /* it did not move down: maybe up */
            cm_kg_sift_up(g, pos);
    } else {
        g->b->size--;
    }
    if (out != NULL) {
        *out = gone;
    } else {
        Py_DECREF(gone.key);
        Py_DECREF(gone.ns);
    }
}

/* ---------------------------------------------------------------- the heap of heaps */

/* Whether key group a's head comes before b's (an empty one comes last). */
static inline int cm_hoh_less(cm_tqueue *q, uint32_t a, uint32_t b)
{
    if (CM_TQ_EMPTY(q, a))
        return 0;
    if (CM_TQ_EMPTY(q, b))
        return 1;
    return CM_HEAP(q->kg[a].b)[1].ts < CM_HEAP(q->kg[b].b)[1].ts;
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

/* Key group g's head changed: move it in the heap of heaps. */
static void cm_hoh_adjust(cm_tqueue *q, uint32_t g)
{
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
    uint32_t mask_before = kg->mask;
    uint64_t *slots_before = kg->slots;
    if (cm_kg_reserve(kg) < 0)
        return -1;
    if (kg->slots != slots_before || kg->mask != mask_before || s == UINT32_MAX) {
        s = h & kg->mask;  /* a new table: probe it again (no comparison needed: the timer is new) */
        while (kg->slots[s] != 0)
            s = (s + 1) & kg->mask;
    }
    uint32_t pos = ++kg->b->size;
    cm_timer t = {ts, key, ns, h, s};
    Py_INCREF(key);
    Py_INCREF(ns);
    cm_kg_place(kg, pos, &t);
    cm_kg_sift_up(kg, pos);
    q->count++;
    if (CM_SLOT_POS(kg->slots[s]) == 1)  /* a new head of its key group */
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
    cm_kg_remove_at(kg, (uint32_t)p, NULL);
    q->count--;
    if (p == 1)
        cm_hoh_adjust(q, g);
    return 1;
}

/* The earliest timer of all, or NULL. */
static inline cm_timer *cm_tq_peek(cm_tqueue *q)
{
    if (q->nkg == 0)
        return NULL;
    uint32_t g = q->hoh[1];
    return CM_TQ_EMPTY(q, g) ? NULL : &CM_HEAP(q->kg[g].b)[1];
}

/* Takes the earliest timer (its references go to *out); its key group in *g.
 * 0, or -1 on no memory (copying a shared block). The queue must not be empty. */
static int cm_tq_poll(cm_tqueue *q, cm_timer *out, uint32_t *g)
{
    uint32_t k = q->hoh[1];
    cm_kgq *kg = &q->kg[k];
    if (cm_kg_own(kg) < 0)
        return -1;
    cm_kg_remove_at(kg, 1, out);
    q->count--;
    cm_hoh_adjust(q, k);
    *g = k;
    return 0;
}

/* A reference to key group g's block for a snapshot (NULL when it has no timers). */
static inline cm_tblock *cm_tq_share(cm_tqueue *q, uint32_t g)
{
    cm_tblock *b = q->kg[g].b;
    if (b == NULL || b->size == 0)
        return NULL;
    b->refs++;
    return b;
}

#endif
