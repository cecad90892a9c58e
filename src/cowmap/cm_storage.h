/*
 * cowmap core, part 2 of 10: where entries and slots live, and how they move.
 *
 * Bucket tables and their pages (cm_table_init: Flink's makeTable), entry
 * allocation and the free stack, the two copy-on-write steps a write makes
 * under a live snapshot (cm_slot_w copies a shared page; cm_chain_cow copies
 * a shared chain up to the entry written, Flink's
 * handleChainedEntryCopyOnWrite), and the incremental rehash with its
 * prefetching (cm_double_capacity and cm_rehash_step: Flink's doubleCapacity
 * and incrementalRehash; cm_select: selectActiveTable). A part of its own
 * because none of it looks at a key: it moves entry indices between slots and
 * retires what a snapshot may still see, so the rehash schedule and the
 * copy-on-write rules can be read against Flink's without the probes.
 *
 * Compiled only as part of cowmap_core.h, which includes the parts in order.
 */
#ifndef COWMAP_CM_STORAGE_H
#define COWMAP_CM_STORAGE_H

#include "cm_layout.h"

/* ----------------------------------------------------------------- tables */

/* Flink's makeTable, in pages (the threshold is cm_set_threshold's) */
static int cm_table_init(cm_table *t, uint32_t capacity) {
    uint32_t shift = 0;
    while ((1u << shift) < capacity && shift < CM_PAGE_MAX_BITS) shift++;
    uint32_t np = capacity >> shift;
    cm_page **pages = (cm_page **)PyMem_RawCalloc(np, sizeof(cm_page *) + sizeof(uint32_t));
    if (!pages) { PyErr_NoMemory(); return -1; } /* t unchanged: a failed rehash start is not a rehash */
    t->capacity = capacity;
    t->page_shift = shift;
    t->npages = np;
    t->pages = pages;
    t->vers = (uint32_t *)(pages + np);
    return 0;
}

static inline uint32_t cm_page_slots(const cm_table *t) { return 1u << t->page_shift; }

static inline uint32_t cm_slot_get(const cm_table *t, uint32_t b) {
    const cm_page *p = t->pages[b >> t->page_shift];
    return p ? p->slots[b & (cm_page_slots(t) - 1u)] : 0u;
}

static inline size_t cm_page_bytes(uint32_t shift) {
    return sizeof(cm_page) + ((size_t)sizeof(uint32_t) << shift);
}

static cm_page *cm_page_alloc(cm_map *m, uint32_t shift, int zero) {
    cm_page *p = (cm_page *)cm_ha_alloc(cm_page_bytes(shift), zero);
    if (!p) return NULL;
    p->version = m->version;
    p->shift = shift;
    m->npages_live++;
    return p;
}

static void cm_page_free(cm_map *m, cm_page *p) {
    cm_ha_free(p, cm_page_bytes(p->shift));
    m->npages_live--;
}

static int cm_retire_page(cm_map *m, cm_page *p) {
    if (p->version >= m->required) { cm_page_free(m, p); return 0; }
    return cm_ptrvec_push(&m->snaps[m->nsnaps - 1].pages, p);
}

/* Pointer to slot b, making its page exist and be private to the live map. */
static uint32_t *cm_slot_w(cm_map *m, cm_table *t, uint32_t b) {
    uint32_t pi = b >> t->page_shift, n = cm_page_slots(t);
    cm_page *p = t->pages[pi];
    if (CM_UNLIKELY(!p)) {
        p = cm_page_alloc(m, t->page_shift, 1);
        if (!p) return NULL;
        t->pages[pi] = p;
        t->vers[pi] = p->version;
    } else if (CM_UNLIKELY(t->vers[pi] < m->required)) {
        cm_page *np = cm_page_alloc(m, t->page_shift, 0);
        if (!np) return NULL;
        memcpy(np->slots, p->slots, (size_t)n * sizeof(uint32_t));
        if (cm_retire_page(m, p) < 0) { cm_page_free(m, np); return NULL; }
        t->pages[pi] = np;
        t->vers[pi] = np->version;
        p = np;
    }
    return &p->slots[b & (n - 1u)];
}

/* ---------------------------------------------------------------- entries */

static uint32_t cm_entry_alloc(cm_map *m) {
    if (m->freed.n) {
        /* freed entries are scattered (freed in the order a snapshot retired
         * them): a stack of indices, unlike a list linked through the entries,
         * lets the entries of the allocations to come be prefetched */
        uint32_t i = m->freed.a[--m->freed.n];
        if (m->freed.n >= 8) CM_PREFETCH_W(cm_E(m, m->freed.a[m->freed.n - 8]));
        return i;
    }
    uint32_t i = m->next_unused;
    if (CM_UNLIKELY(i == UINT32_MAX)) {
        PyErr_SetString(PyExc_MemoryError, "CopyOnWriteStateMap is full (2**32 - 1 entries)");
        return 0;
    }
    uint32_t c = cm_chunk_of(i);
    if (c >= m->nchunks) {
        if (m->nchunks == m->chunks_cap) {
            uint32_t nc = m->chunks_cap ? m->chunks_cap * 2 : 16;
            cm_entry **na = (cm_entry **)PyMem_RawRealloc(m->chunks, nc * sizeof(cm_entry *));
            if (!na) { PyErr_NoMemory(); return 0; }
            m->chunks = na; m->chunks_cap = nc;
        }
        cm_entry *chunk = (cm_entry *)cm_ha_alloc(cm_chunk_bytes(c), 0);
        if (!chunk) return 0;
        m->chunks[m->nchunks++] = chunk;
    }
    m->next_unused = i + 1;
    return i;
}

static void cm_entry_free(cm_map *m, uint32_t i) {
    cm_entry *e = cm_E(m, i);
    cm_bury_entry(&m->grave, e);
    e->state = NULL;
    /* out of memory: the entry is never reused (a leak of 48 bytes), no error */
    (void)cm_u32vec_add(&m->freed, i);
}

/* Entry i leaves the live map (removed, or replaced by a copy): freed now, or
 * kept for the snapshots that still read it. */
static int cm_retire_entry(cm_map *m, uint32_t i) {
    cm_unchanged(m, i);
    if (cm_ev(cm_E(m, i)) >= m->required) { cm_entry_free(m, i); return 0; }
    return cm_u32vec_push(&m->snaps[m->nsnaps - 1].ents, i);
}

/* A private copy of entry i at the current version (Flink: new StateMapEntry(e, version)).
 * With `state` (a reference, stolen) the copy holds it instead of i's state,
 * which stays with i alone: a copy made to be overwritten never touches the
 * old state object, a cache miss in a big map. */
static uint32_t cm_entry_copy(cm_map *m, uint32_t i, PyObject *state) {
    uint32_t j = cm_entry_alloc(m);
    if (!j) return 0;
    cm_entry *src = cm_E(m, i), *dst = cm_E(m, j);
    *dst = *src;
    dst->ev = m->version;
    if (cm_is_changed(m, i)) cm_changed(m, j); /* the copy replaces i in the live map */
    if (!cm_intkey(dst)) Py_INCREF(dst->key.obj);
    Py_INCREF(dst->ns);
    if (state) { dst->state = state; dst->sv = m->version; }
    else if (!cm_tagged(dst->state)) Py_INCREF(dst->state);
    return j;
}

/* Flink's handleChainedEntryCopyOnWrite, with pages: copy the chain of bucket b
 * up to `until` where shared; returns until's
 * private index. With `until_state` (a reference, or NULL) a copy of `until`
 * holds *until_state instead of until's state, and *until_state is set to NULL:
 * the caller owns it no more. */
static uint32_t cm_chain_cow(cm_map *m, cm_table *t, uint32_t b, uint32_t until, PyObject **until_state) {
    uint32_t *link = cm_slot_w(m, t, b); /* the slot, then the next field of the last private entry */
    if (!link) return 0;
    PyObject *st = until_state ? *until_state : NULL;
    for (uint32_t cur = *link;; cur = *link) {
        int last = cur == until;
        if (cm_ev(cm_E(m, cur)) < m->required) {
            uint32_t copy = cm_entry_copy(m, cur, last ? st : NULL);
            if (!copy) return 0;
            if (last && st) *until_state = NULL;
            *link = copy;
            if (cm_retire_entry(m, cur) < 0) return 0;
            cur = copy;
        }
        if (last) return cur;
        link = &cm_E(m, cur)->next;
    }
}

/* ----------------------------------------------------------------- rehash */

/* 3/4 of the capacity, as Flink's makeTable sets it */
static void cm_set_threshold(cm_map *m, uint32_t capacity) {
    m->threshold = capacity < CM_MAX_CAPACITY ? (capacity >> 1) + (capacity >> 2) : UINT32_MAX;
}

/* Flink's doubleCapacity: a table twice the size, filled by the rehash steps */
static int cm_double_capacity(cm_map *m) {
    if (m->primary.capacity >= CM_MAX_CAPACITY) return 0;
    if (cm_table_init(&m->rehash, m->primary.capacity * 2) < 0) return -1;
    cm_set_threshold(m, m->rehash.capacity);
    m->rh_heads = m->rh_chains = 0;
    return 0;
}

static int cm_drop_old_page(cm_map *m, uint32_t pi) {
    cm_page *p = m->primary.pages[pi];
    m->primary.pages[pi] = NULL;
    return p ? cm_retire_page(m, p) : 0;
}

/* The entries the next rehash steps move, prefetched at the end of a step:
 * the old slots are read in order, but the entries they lead to are scattered,
 * and each was a serial cache miss of the operation paying the step (a step
 * moves at least 4). Heads are requested CM_RH_AHEAD buckets ahead (about six
 * steps), each bucket once; a bucket CM_RH_CHASE ahead has its head in cache
 * by then, so the entry after the head is requested too (at the load a rehash
 * starts at, three entries in ten are past their chain's head). The new
 * table's slots need no help: a chain of old bucket b goes to new buckets b
 * and b + capacity, two runs in order. */
#define CM_RH_AHEAD 32u
#define CM_RH_CHASE 16u

/* A step reads an entry's hash and next and writes next (the first line);
 * under a live snapshot it reads the version too. */
CM_ALWAYS_INLINE static inline void cm_rehash_prefetch_entry(const cm_map *m, uint32_t i) {
    const char *e = (const char *)cm_E(m, i);
    CM_PREFETCH_W(e);
    if (m->required) CM_PREFETCH(e + offsetof(cm_entry, ev));
}

CM_ALWAYS_INLINE static inline void cm_rehash_prefetch(cm_map *m, uint32_t rh) {
    const cm_table *old = &m->primary;
    uint32_t cap = old->capacity;
    uint32_t end = cap - rh > CM_RH_AHEAD ? rh + CM_RH_AHEAD : cap;
    for (uint32_t b = m->rh_heads > rh ? m->rh_heads : rh; b < end; b++) {
        uint32_t i = cm_slot_get(old, b);
        if (i) cm_rehash_prefetch_entry(m, i);
    }
    uint32_t asked = m->rh_heads; /* heads requested by earlier steps: arrived */
    m->rh_heads = end;
    end = cap - rh > CM_RH_CHASE ? rh + CM_RH_CHASE : cap;
    if (end > asked) end = asked;
    for (uint32_t b = m->rh_chains > rh ? m->rh_chains : rh; b < end; b++) {
        uint32_t i = cm_slot_get(old, b);
        if (i && (i = cm_E(m, i)->next)) cm_rehash_prefetch_entry(m, i);
    }
    if (end > m->rh_chains) m->rh_chains = end;
}

/* One step of incremental rehash (Flink's incrementalRehash): move whole
 * chains until >= 4 entries moved. */
static int cm_rehash_step(cm_map *m) {
    cm_table *old = &m->primary, *nw = &m->rehash;
    uint32_t rh = m->rehash_index, moved = 0, nmask = nw->capacity - 1u;
    uint32_t pmask = cm_page_slots(old) - 1u;
    while (moved < CM_MIN_TRANSFER) {
        uint32_t i = cm_slot_get(old, rh);
        while (i) {
            uint32_t n = cm_E(m, i)->next;
            if (m->required && cm_ev(cm_E(m, i)) < m->required) {
                uint32_t c = cm_entry_copy(m, i, NULL);
                if (!c || cm_retire_entry(m, i) < 0) return -1;
                i = c;
            }
            cm_entry *e = cm_E(m, i);
            uint32_t *slot = cm_slot_w(m, nw, e->hash & nmask); /* nmask < CM_F_INTKEY */
            if (!slot) return -1;
            e->next = *slot;
            *slot = i;
            i = n;
            moved++;
        }
        rh++;
        if ((rh & pmask) == 0 && cm_drop_old_page(m, (rh - 1u) >> old->page_shift) < 0) return -1;
        if (rh == old->capacity) {
            PyMem_RawFree(old->pages);
            m->primary = *nw;
            memset(nw, 0, sizeof(*nw));
            m->rehash_index = 0;
            return 0;
        }
    }
    m->rehash_index = rh;
    cm_rehash_prefetch(m, rh);
    return 0;
}

/* Flink's selectActiveTable */
static inline cm_table *cm_select(cm_map *m, uint32_t hash) {
    return (hash & (m->primary.capacity - 1u)) < m->rehash_index ? &m->rehash : &m->primary;
}

/* The bucket slot of hash h in the table a lookup would use now, or NULL when
 * its page (or the table) does not exist: for prefetches and hints. */
CM_ALWAYS_INLINE static inline const uint32_t *cm_slot_at(const cm_map *m, uint32_t h) {
    const cm_table *t = cm_select((cm_map *)m, h);
    if (!t->capacity) return NULL;
    uint32_t b = h & (t->capacity - 1u);
    const cm_page *pg = t->pages[b >> t->page_shift];
    return pg ? &pg->slots[b & ((1u << t->page_shift) - 1u)] : NULL;
}

#endif /* COWMAP_CM_STORAGE_H */
