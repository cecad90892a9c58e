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
 */
#ifndef COWMAP_CORE_H
#define COWMAP_CORE_H

#include <Python.h>
#include <stdint.h>
#include <string.h>
#include "fastint.h"
#include "hugealloc.h"

/* Bucket pages of 4096 slots (16 KiB): every lookup reads its page's pointer
 * first, and with 512-slot pages a 50M-entry MapState's 128 maps had 3 MiB of
 * page pointers, missing the cache on top of the slot and the entry (gets at
 * 50M: -15% with 4096). The cost is the copy-on-write unit: the first write
 * into a page after a snapshot copies 16 KiB. Over a full pass of writes that
 * totals the same (the whole bucket array once, as Flink copies it at every
 * snapshot); only writes sparse enough to leave most small pages untouched
 * copy more. */
#define CM_PAGE_MAX_BITS 12u
/* Entry chunks: chunk c < CM_GEO_CHUNKS holds 64 << c entries, so small maps
 * stay small; after that every chunk holds 1 << CM_BIG_BITS entries (384 KiB),
 * so a map reserves at most one chunk more than it uses. Kept that small
 * because on huge pages the unused tail of a map's last chunk becomes resident
 * with the huge page around it: with 3 MiB chunks, a MapState of 5M entries
 * over 128 key groups took 232 B/entry of RSS instead of 175 (185 now). */
#define CM_CHUNK0_BITS 6u
#define CM_GEO_CHUNKS 8u
#define CM_BIG_BITS (CM_CHUNK0_BITS + CM_GEO_CHUNKS - 1u)
#define CM_GEO_END (((1u << CM_GEO_CHUNKS) - 1u) << CM_CHUNK0_BITS)
#define CM_MIN_TRANSFER 4u
#define CM_MIN_CAPACITY 4u
#define CM_MAX_CAPACITY (1u << 30)
#define CM_NO_TS INT64_MAX
#define CM_F_INTKEY 0x80000000u /* in cm_entry.hash: the key is stored as an int64 */
#define CM_HMASK 0x7FFFFFFFu    /* bucket hashes are 31 bits: the top one is CM_F_INTKEY */
#define CM_VMASK 0x7FFFFFFFu
#define CM_PYHASH_MODULUS (((uint64_t)1 << 61) - 1)

#if defined(__GNUC__)
#define CM_LIKELY(x) __builtin_expect(!!(x), 1)
#define CM_UNLIKELY(x) __builtin_expect(!!(x), 0)
#define CM_PREFETCH(p) __builtin_prefetch(p)
#define CM_PREFETCH_W(p) __builtin_prefetch(p, 1)
/* For helpers made of loads and prefetches only: out of line, GCC deems them
 * pure and deletes their (void) calls as dead code. */
#define CM_ALWAYS_INLINE __attribute__((always_inline))
#else
#define CM_ALWAYS_INLINE
#define CM_PREFETCH_W(p) ((void)0)
#define CM_LIKELY(x) (x)
#define CM_UNLIKELY(x) (x)
#define CM_PREFETCH(p) ((void)0)
#endif

/* What a get reads comes first: the 32 bytes up to `state` lie in one cache
 * line for three entries in four (of all 48 bytes, only two in four), so a
 * batch get fetches 1.25 lines an entry, not 1.5. That is why the int-key flag
 * lives in the hash's top bit and not in the version. */
typedef struct {
    uint32_t hash;     /* 31-bit bucket hash | CM_F_INTKEY */
    uint32_t next;     /* entry index, 0 = end of chain */
    union { PyObject *obj; int64_t i; } key; /* i when hash & CM_F_INTKEY */
    PyObject *ns;
    PyObject *state;   /* never NULL in a live entry */
    int64_t ts;
    uint32_t ev;       /* entry version */
    uint32_t sv;       /* state version */
} cm_entry;

typedef struct {
    uint32_t version;
    uint32_t shift;    /* log2 of the slot count: the page's size when it is freed */
    uint32_t slots[];
} cm_page;

typedef struct {
    uint32_t capacity;   /* power of two; 0 = no table */
    uint32_t page_shift; /* log2(slots per page) */
    uint32_t npages;
    cm_page **pages;     /* NULL page = all slots empty */
    uint32_t *vers;      /* vers[pi] = pages[pi]->version, in the same block: a write's
                          * copy-on-write check would miss the cache on the page header */
} cm_table;

typedef struct { uint32_t *a; size_t n, cap; } cm_u32vec;
typedef struct { void **a; size_t n, cap; } cm_ptrvec;

typedef struct {
    uint32_t version;
    cm_u32vec ents;   /* retired entries this snapshot owns */
    cm_ptrvec pages;  /* retired pages this snapshot owns */
} cm_snapref;

/* Retired items of a released snapshot, still to be handed on or freed. */
typedef struct {
    uint32_t version;
    cm_u32vec ents;
    cm_ptrvec pages;
} cm_rqbatch;

/* Items reclaimed at release itself, and per later operation: a release never
 * pays for more than this at once, however much the snapshot kept alive. */
#define CM_RECLAIM_EAGER 4096u
#define CM_RECLAIM_PER_OP 32u

/* Position of an incremental visit; tolerant of rehash (see cm_visit_next). */
typedef struct {
    int phase;        /* 0: visiting, 2: done */
    uint32_t pos;     /* next position, numbered as buckets of the largest table */
} cm_cursor;

typedef struct {
    cm_table primary, rehash;
    uint32_t rehash_index;
    uint32_t rh_heads, rh_chains; /* old buckets up to which cm_rehash_prefetch has gone (hints) */
    uint32_t size;
    uint32_t threshold;
    uint32_t version;     /* Flink's stateMapVersion */
    uint32_t required;    /* highest version a live snapshot needs, 0 = none */
    uint64_t mod_count;   /* structural changes, for iterators */
    cm_entry **chunks;
    uint32_t nchunks, chunks_cap;
    uint32_t next_unused; /* next never-used entry index */
    cm_u32vec freed;      /* free entry indices, a stack (see cm_entry_alloc) */
    uint64_t npages_live; /* pages allocated and not yet freed */
    cm_snapref *snaps;    /* live snapshots, ascending versions */
    uint32_t nsnaps, snaps_cap;
    cm_u32vec pending_release;
    cm_rqbatch *rq;       /* released snapshots' retired items, reclaimed bit by bit */
    uint32_t nrq, rq_cap;
    size_t rq_items;
    PyObject *last_ns;    /* borrowed: the namespace of entry last_ns_entry */
    uint32_t last_ns_entry; /* dedupes equal namespace objects (as Flink does) */
    PyObject *copier;     /* owned; NULL = immutable states */
    int busy;
    unsigned long owner;  /* while busy: the thread that made it so (cm_busy_error) */
    cm_ptrvec grave;      /* objects to DECREF once the map is consistent */
    cm_cursor sweep;
} cm_map;

typedef struct {
    PyObject *key;   /* may be NULL for an int probe that came from an int64 array */
    int64_t ikey;
    int is_int;
    PyObject *ns;
    uint32_t hash;
} cm_probe;

/* ------------------------------------------------------------------ utils */

/* The items of a full vector (*cap of `size` bytes) moved to twice the room,
 * or NULL (the vector as it was) when out of memory. */
static void *cm_vec_grow(void *a, size_t *cap, size_t size) {
    size_t nc = *cap ? *cap * 2 : 16;
    void *na = PyMem_RawRealloc(a, nc * size);
    if (na) *cap = nc;
    return na;
}

/* The _add functions return -1 when out of memory with no Python error set:
 * releasing and bookkeeping paths use them, so an error being raised stays.
 * The _push functions set MemoryError, for paths that report it. */
static int cm_u32vec_add(cm_u32vec *v, uint32_t x) {
    if (v->n == v->cap) {
        uint32_t *na = (uint32_t *)cm_vec_grow(v->a, &v->cap, sizeof(uint32_t));
        if (!na) return -1;
        v->a = na;
    }
    v->a[v->n++] = x;
    return 0;
}

static int cm_u32vec_push(cm_u32vec *v, uint32_t x) {
    if (cm_u32vec_add(v, x) < 0) { PyErr_NoMemory(); return -1; }
    return 0;
}

static int cm_ptrvec_add(cm_ptrvec *v, void *x) {
    if (v->n == v->cap) {
        void **na = (void **)cm_vec_grow(v->a, &v->cap, sizeof(void *));
        if (!na) return -1;
        v->a = na;
    }
    v->a[v->n++] = x;
    return 0;
}

static int cm_ptrvec_push(cm_ptrvec *v, void *x) {
    if (cm_ptrvec_add(v, x) < 0) { PyErr_NoMemory(); return -1; }
    return 0;
}

static inline uint32_t cm_fmix32(uint32_t h) {
    h ^= h >> 16; h *= 0x85ebca6bu; h ^= h >> 13; h *= 0xc2b2ae35u; h ^= h >> 16;
    return h;
}

static inline uint32_t cm_fold(Py_hash_t h) {
    uint64_t u = (uint64_t)h;
    return (uint32_t)(u ^ (u >> 32));
}

/* The bucket hash of a key hash and a mixed namespace hash (31 bits). */
static inline uint32_t cm_mix(Py_hash_t hk, uint32_t nsmix) {
    return cm_fmix32(cm_fold(hk) ^ nsmix) & CM_HMASK;
}

/* Flink hashes bitMix(key.hashCode() ^ ns.hashCode()); mixing the namespace
 * first keeps that exact result for namespace 0 but for the top bit (so the
 * buckets, and rehash points, match Flink's) while (k, k) pairs no longer
 * collapse into one bucket. */
static inline uint32_t cm_composite(Py_hash_t hk, Py_hash_t hn) {
    return cm_mix(hk, cm_fmix32(cm_fold(hn)));
}

/* Python's hash() of an int, computed without a PyLong. */
static inline Py_hash_t cm_int_hash(int64_t v) {
    uint64_t a = v < 0 ? (uint64_t)0 - (uint64_t)v : (uint64_t)v;
    if (CM_UNLIKELY(a >= CM_PYHASH_MODULUS)) a %= CM_PYHASH_MODULUS;
    Py_hash_t h = (Py_hash_t)a;
    if (v < 0) h = -h;
    if (h == -1) h = -2;
    return h;
}

static inline uint32_t cm_chunk_of(uint32_t i) {
    if (CM_LIKELY(i >= CM_GEO_END)) return CM_GEO_CHUNKS + ((i - CM_GEO_END) >> CM_BIG_BITS);
    return 31u - (uint32_t)__builtin_clz((i >> CM_CHUNK0_BITS) + 1u);
}

static inline uint32_t cm_chunk_start(uint32_t c) {
    if (c >= CM_GEO_CHUNKS) return CM_GEO_END + ((c - CM_GEO_CHUNKS) << CM_BIG_BITS);
    return ((1u << c) - 1u) << CM_CHUNK0_BITS;
}

static inline size_t cm_chunk_bytes(uint32_t c) {
    size_t n = c < CM_GEO_CHUNKS ? (size_t)1 << (c + CM_CHUNK0_BITS) : (size_t)1 << CM_BIG_BITS;
    return n * sizeof(cm_entry);
}

CM_ALWAYS_INLINE static inline cm_entry *cm_E(const cm_map *m, uint32_t i) {
    if (CM_LIKELY(i >= CM_GEO_END)) {
        uint32_t d = i - CM_GEO_END;
        return m->chunks[CM_GEO_CHUNKS + (d >> CM_BIG_BITS)] + (d & ((1u << CM_BIG_BITS) - 1u));
    }
    uint32_t c = cm_chunk_of(i);
    return m->chunks[c] + (i - cm_chunk_start(c));
}

static inline uint32_t cm_ev(const cm_entry *e) { return e->ev; }
static inline int cm_intkey(const cm_entry *e) { return (e->hash & CM_F_INTKEY) != 0; }
/* Whether e is in the chain of (31-bit) hash h for its key's sake. */
static inline int cm_hash_is(const cm_entry *e, uint32_t h) { return (e->hash & CM_HMASK) == h; }

/* Prefetch entry i: both cache lines, as half of all 48-byte entries straddle two. */
CM_ALWAYS_INLINE static inline void cm_prefetch_entry(const cm_map *m, uint32_t i) {
    const char *e = (const char *)cm_E(m, i);
    CM_PREFETCH(e);
    CM_PREFETCH(e + sizeof(cm_entry) - 1);
}

/* Prefetch what a get reads of entry i (up to `state`): one line for three entries in four. */
CM_ALWAYS_INLINE static inline void cm_prefetch_hot(const cm_map *m, uint32_t i) {
    const char *e = (const char *)cm_E(m, i);
    CM_PREFETCH(e);
    CM_PREFETCH(e + offsetof(cm_entry, ts) - 1);
}

/* For a lookup of hash h whose bucket head `head` has arrived: 1 if the head
 * is another key's (the next entry of the chain is prefetched), 0 if it is
 * most likely the key's own. */
CM_ALWAYS_INLINE static inline int cm_prefetch_past_head(const cm_map *m, const cm_entry *head, uint32_t h) {
    if (cm_hash_is(head, h)) return 0;
    if (head->next) cm_prefetch_entry(m, head->next);
    return 1;
}

/* Release a reference a map held. A DECREF that cannot free the object runs
 * no Python code, so it is done now, while the object is likely in cache; a
 * last reference waits in `grave` until the map is consistent again
 * (cm_grave_empty, from cm_leave or fm_leave). */
static inline void cm_bury(cm_ptrvec *grave, PyObject *o) {
    if (Py_REFCNT(o) > 1) {
        Py_DECREF(o);
        return;
    }
    if (cm_ptrvec_add(grave, o) < 0)
        Py_DECREF(o); /* out of memory: release now rather than leak (an error being raised stays) */
}

/* cm_bury for each reference an entry holds. */
static inline void cm_bury_entry(cm_ptrvec *grave, const cm_entry *e) {
    if (!cm_intkey(e)) cm_bury(grave, e->key.obj);
    cm_bury(grave, e->ns);
    cm_bury(grave, e->state);
}

/* The DECREFs cm_bury put off; the map must be usable again (they may run code). */
static void cm_grave_empty(cm_ptrvec *grave) {
    while (grave->n) {
        PyObject *o = (PyObject *)grave->a[--grave->n];
        Py_DECREF(o);
    }
}

static inline void cm_grave(cm_map *m, PyObject *o) { cm_bury(&m->grave, o); }

/* ----------------------------------------------------------------- tables */

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

static int cm_retire_entry(cm_map *m, uint32_t i) {
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
    if (!cm_intkey(dst)) Py_INCREF(dst->key.obj);
    Py_INCREF(dst->ns);
    if (state) { dst->state = state; dst->sv = m->version; }
    else Py_INCREF(dst->state);
    return j;
}

/* Copy the chain of bucket b up to `until` where shared; returns until's
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

static void cm_set_threshold(cm_map *m, uint32_t capacity) {
    m->threshold = capacity < CM_MAX_CAPACITY ? (capacity >> 1) + (capacity >> 2) : UINT32_MAX;
}

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

/* One step of incremental rehash: move whole chains until >= 4 entries moved. */
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

/* ------------------------------------------------------------------ probes */

static int cm_probe_ns(cm_probe *p, PyObject *ns, Py_hash_t *hn) {
    if (CM_UNLIKELY(ns == Py_None)) {
        PyErr_SetString(PyExc_TypeError, "namespace must not be None");
        return -1;
    }
    if (PyLong_CheckExact(ns)) {
        int overflow;
        int64_t v = cm_as_int64(ns, &overflow);
        if (!overflow) { *hn = cm_int_hash(v); p->ns = ns; return 0; }
    }
    *hn = PyObject_Hash(ns);
    if (*hn == -1 && PyErr_Occurred()) return -1;
    p->ns = ns;
    return 0;
}

static int cm_probe_key(cm_probe *p, PyObject *key, Py_hash_t *hk) {
    if (PyLong_CheckExact(key)) {
        int overflow;
        int64_t v = cm_as_int64(key, &overflow);
        if (!overflow) {
            p->key = key; p->ikey = v; p->is_int = 1;
            *hk = cm_int_hash(v);
            return 0;
        }
    } else if (CM_UNLIKELY(key == Py_None)) {
        PyErr_SetString(PyExc_TypeError, "key must not be None");
        return -1;
    }
    *hk = PyObject_Hash(key);
    if (*hk == -1 && PyErr_Occurred()) return -1;
    p->key = key; p->ikey = 0; p->is_int = 0;
    return 0;
}

static int cm_make_probe(cm_probe *p, PyObject *key, PyObject *ns) {
    Py_hash_t hk, hn;
    if (cm_probe_key(p, key, &hk) < 0 || cm_probe_ns(p, ns, &hn) < 0) return -1;
    p->hash = cm_composite(hk, hn);
    return 0;
}

static int cm_key_eq(const cm_entry *e, const cm_probe *p) {
    if (cm_intkey(e)) {
        if (p->is_int) return e->key.i == p->ikey;
        PyObject *tmp = PyLong_FromLongLong(e->key.i);
        if (!tmp) return -1;
        int r = PyObject_RichCompareBool(tmp, p->key, Py_EQ);
        Py_DECREF(tmp);
        return r;
    }
    PyObject *k = e->key.obj;
    if (k == p->key) return 1;
    if (p->key) return PyObject_RichCompareBool(k, p->key, Py_EQ);
    PyObject *tmp = PyLong_FromLongLong(p->ikey);
    if (!tmp) return -1;
    int r = PyObject_RichCompareBool(k, tmp, Py_EQ);
    Py_DECREF(tmp);
    return r;
}

/* Whether entry e is probe p's: 1 yes, 0 no, -1 error. An int probe finds an
 * int-key entry with a single compare of hash | flag; other keys and unequal
 * namespace objects are compared by Python's ==. */
CM_ALWAYS_INLINE static inline int cm_match(const cm_entry *e, const cm_probe *p) {
    int r;
    if (p->is_int && e->hash == (p->hash | CM_F_INTKEY)) r = e->key.i == p->ikey;
    else if (!cm_hash_is(e, p->hash)) return 0;
    else if ((r = cm_key_eq(e, p)) <= 0) return r;
    if (r && e->ns != p->ns) r = PyObject_RichCompareBool(e->ns, p->ns, Py_EQ);
    return r;
}

/* 1 found (idx, prev set), 0 absent, -1 error. */
static inline int cm_find(const cm_map *m, const cm_table *t, const cm_probe *p, uint32_t *idx, uint32_t *prev) {
    uint32_t i = cm_slot_get(t, p->hash & (t->capacity - 1u)), pr = 0;
    while (i) {
        const cm_entry *e = cm_E(m, i);
        CM_PREFETCH_W(e->state); /* a hit will INCREF it: overlap that miss with the compare */
        int r = cm_match(e, p);
        if (r) {
            if (r < 0) return -1;
            *idx = i; *prev = pr;
            return 1;
        }
        pr = i;
        i = e->next;
    }
    return 0;
}

/* --------------------------------------------------------- enter / leave */

static void cm_release_now(cm_map *m, uint32_t version);
static void cm_reclaim_some(cm_map *m, size_t budget);

/* The error for a call into a map that is busy, with `owner` the thread that
 * made it so. A busy map is paused in Python code it runs (a key's __eq__ or
 * __hash__, a copier, ...): the call came from that code, or from another
 * thread the GIL switched to meanwhile. The maps of both kinds say which. */
static int cm_busy_error(const char *map, const char *callbacks, unsigned long owner) {
    if (owner != PyThread_get_thread_ident())
        PyErr_Format(PyExc_RuntimeError,
                     "%s used from two threads at once: a map has a single writer, and only "
                     "its snapshots may be used from another thread", map);
    else
        PyErr_Format(PyExc_RuntimeError,
                     "%s used re-entrantly (from %s); those must not call back into the map",
                     map, callbacks);
    return -1;
}

static inline int cm_enter(cm_map *m) {
    if (CM_UNLIKELY(m->busy))
        return cm_busy_error("CopyOnWriteStateMap",
                             "a key's __eq__/__hash__, a copier or a transform function", m->owner);
    m->busy = 1;
    m->owner = PyThread_get_thread_ident();
    return 0;
}

static void cm_leave(cm_map *m) {
    while (m->pending_release.n) {
        uint32_t v = m->pending_release.a[--m->pending_release.n];
        cm_release_now(m, v);
    }
    if (m->nrq) cm_reclaim_some(m, CM_RECLAIM_PER_OP);
    m->busy = 0;
    cm_grave_empty(&m->grave);
}

/* Rehash step (Flink's computeHashForOperationAndDoIncrementalRehash) + lookup. */
typedef struct {
    cm_table *t;
    uint32_t idx, prev;
    int found;
} cm_loc;

static inline int cm_locate(cm_map *m, const cm_probe *p, cm_loc *loc) {
    if (m->rehash.capacity) {
        /* the key's slot, requested before the step so the two overlap (a step
         * rarely moves the key's own bucket: then the slot asked for is stale) */
        const uint32_t *slot = cm_slot_at(m, p->hash);
        if (slot) CM_PREFETCH(slot);
        if (cm_rehash_step(m) < 0) return -1;
    }
    loc->t = cm_select(m, p->hash);
    loc->found = cm_find(m, loc->t, p, &loc->idx, &loc->prev);
    return loc->found < 0 ? -1 : 0;
}

/* A new entry for probe p with state None (caller sets it); Flink's putEntry tail. */
static uint32_t cm_add_entry(cm_map *m, const cm_probe *p, cm_table *t) {
    PyObject *ns = p->ns;
    if (m->last_ns_entry && m->last_ns != ns) {
        /* last_ns is alive while the entry that took it still holds it */
        const cm_entry *le = cm_E(m, m->last_ns_entry);
        if (le->state && le->ns == m->last_ns) {
            int r = PyObject_RichCompareBool(m->last_ns, ns, Py_EQ);
            if (r < 0) return 0;
            if (r) ns = m->last_ns;
        }
    }
    PyObject *keyobj = p->key;
    m->mod_count++;
    if (m->size > m->threshold && !m->rehash.capacity && cm_double_capacity(m) < 0) return 0;
    uint32_t i = cm_entry_alloc(m);
    if (!i) return 0;
    uint32_t *slot = cm_slot_w(m, t, p->hash & (t->capacity - 1u));
    if (!slot) { (void)cm_u32vec_add(&m->freed, i); return 0; }
    cm_entry *e = cm_E(m, i);
    if (p->is_int) {
        e->key.i = p->ikey;
    } else {
        Py_INCREF(keyobj);
        e->key.obj = keyobj;
    }
    e->ev = m->version;
    Py_INCREF(ns);
    e->ns = ns;
    Py_INCREF(Py_None);
    e->state = Py_None;
    e->sv = m->version;
    e->ts = CM_NO_TS;
    e->hash = p->hash | (p->is_int ? CM_F_INTKEY : 0u);
    e->next = *slot;
    *slot = i;
    m->size++;
    m->last_ns = ns;
    m->last_ns_entry = i;
    return i;
}

/* The located entry, private to the live map (chain copied where shared). */
static inline uint32_t cm_writable(cm_map *m, const cm_probe *p, const cm_loc *loc) {
    if (cm_ev(cm_E(m, loc->idx)) < m->required)
        return cm_chain_cow(m, loc->t, p->hash & (loc->t->capacity - 1u), loc->idx, NULL);
    return loc->idx;
}

/* Unlink entry idx (found with predecessor prev) from bucket b of t and retire it. */
static int cm_unlink(cm_map *m, cm_table *t, uint32_t b, uint32_t idx, uint32_t prev) {
    uint32_t next = cm_E(m, idx)->next;
    if (!prev) {
        uint32_t *slot = cm_slot_w(m, t, b);
        if (!slot) return -1;
        *slot = next;
    } else {
        if (cm_ev(cm_E(m, prev)) < m->required && !(prev = cm_chain_cow(m, t, b, prev, NULL))) return -1;
        cm_E(m, prev)->next = next;
    }
    m->size--;
    m->mod_count++;
    return cm_retire_entry(m, idx);
}

static inline int cm_state_shared(const cm_map *m, const cm_entry *e) {
    return e->sv < m->required;
}

/* New reference to the state of a located entry, copying it first if it is
 * shared with a snapshot and a copier is set (Flink's get). */
static PyObject *cm_read_state(cm_map *m, const cm_probe *p, const cm_loc *loc) {
    cm_entry *e = cm_E(m, loc->idx);
    if (m->copier && e->state != Py_None && cm_state_shared(m, e)) {
        PyObject *c = PyObject_CallOneArg(m->copier, e->state);
        if (!c) return NULL;
        uint32_t w = cm_writable(m, p, loc);
        if (!w) { Py_DECREF(c); return NULL; }
        e = cm_E(m, w);
        cm_grave(m, e->state);
        e->state = c;
        e->sv = m->version;
    }
    Py_INCREF(e->state);
    return e->state;
}

/* New reference to a state about to be handed out as "old": a copy if shared. */
static PyObject *cm_old_state(cm_map *m, const cm_entry *e) {
    if (m->copier && e->state != Py_None && cm_state_shared(m, e)) return PyObject_CallOneArg(m->copier, e->state);
    Py_INCREF(e->state);
    return e->state;
}

/* Replace the state of writable entry w (steals `state`). */
static inline void cm_set_state(cm_map *m, uint32_t w, PyObject *state, int64_t ts) {
    cm_entry *e = cm_E(m, w);
    PyObject *old = e->state;
    e->state = state;
    e->sv = m->version;
    e->ts = ts;
    cm_grave(m, old);
}

/* Write `state` (borrowed) at the probe, creating the entry if needed: 1 a
 * new entry was added, 0 an existing one written, -1 error. */
static int cm_put_probe(cm_map *m, const cm_probe *p, PyObject *state, int64_t ts) {
    cm_loc loc;
    if (cm_locate(m, p, &loc) < 0) return -1;
    uint32_t w = loc.found ? cm_writable(m, p, &loc) : cm_add_entry(m, p, loc.t);
    if (!w) return -1;
    Py_INCREF(state);
    cm_set_state(m, w, state, ts);
    return !loc.found;
}

/* ------------------------------------------------------ public single ops */

static PyObject *cm_get(cm_map *m, PyObject *key, PyObject *ns) {
    cm_probe p; cm_loc loc; PyObject *r = NULL;
    if (cm_enter(m) < 0) return NULL;
    if (cm_make_probe(&p, key, ns) == 0 && cm_locate(m, &p, &loc) == 0) {
        if (loc.found) r = cm_read_state(m, &p, &loc);
        else { r = Py_None; Py_INCREF(r); }
    }
    cm_leave(m);
    return r;
}

/* (state, ts) or None */
static PyObject *cm_get_with_ts(cm_map *m, PyObject *key, PyObject *ns) {
    cm_probe p; cm_loc loc; PyObject *r = NULL;
    if (cm_enter(m) < 0) return NULL;
    if (cm_make_probe(&p, key, ns) == 0 && cm_locate(m, &p, &loc) == 0) {
        if (loc.found) {
            int64_t ts = cm_E(m, loc.idx)->ts; /* a copy made by the read keeps it */
            PyObject *s = cm_read_state(m, &p, &loc);
            if (s) r = Py_BuildValue("(NL)", s, (long long)ts);
        } else { r = Py_None; Py_INCREF(r); }
    }
    cm_leave(m);
    return r;
}

static PyObject *cm_timestamp(cm_map *m, PyObject *key, PyObject *ns) {
    cm_probe p; cm_loc loc; PyObject *r = NULL;
    if (cm_enter(m) < 0) return NULL;
    if (cm_make_probe(&p, key, ns) == 0 && cm_locate(m, &p, &loc) == 0) {
        if (loc.found) r = PyLong_FromLongLong(cm_E(m, loc.idx)->ts);
        else { r = Py_None; Py_INCREF(r); }
    }
    cm_leave(m);
    return r;
}

/* 1 set, 0 absent, -1 error */
static int cm_set_timestamp(cm_map *m, PyObject *key, PyObject *ns, int64_t ts) {
    cm_probe p; cm_loc loc; int r = -1;
    if (cm_enter(m) < 0) return -1;
    if (cm_make_probe(&p, key, ns) == 0 && cm_locate(m, &p, &loc) == 0) {
        if (!loc.found) r = 0;
        else {
            uint32_t w = cm_writable(m, &p, &loc);
            if (w) { cm_E(m, w)->ts = ts; r = 1; }
        }
    }
    cm_leave(m);
    return r;
}

/* 1 / 0 / -1 */
static int cm_contains(cm_map *m, PyObject *key, PyObject *ns) {
    cm_probe p; cm_loc loc; int r = -1;
    if (cm_enter(m) < 0) return -1;
    if (cm_make_probe(&p, key, ns) == 0 && cm_locate(m, &p, &loc) == 0) r = loc.found;
    cm_leave(m);
    return r;
}

static int cm_put(cm_map *m, PyObject *key, PyObject *ns, PyObject *state, int64_t ts) {
    cm_probe p; int r = -1;
    if (cm_enter(m) < 0) return -1;
    if (cm_make_probe(&p, key, ns) == 0) r = cm_put_probe(m, &p, state, ts);
    cm_leave(m);
    return r;
}

static PyObject *cm_put_and_get_old(cm_map *m, PyObject *key, PyObject *ns, PyObject *state, int64_t ts) {
    cm_probe p; cm_loc loc; PyObject *old = NULL;
    if (cm_enter(m) < 0) return NULL;
    if (cm_make_probe(&p, key, ns) == 0 && cm_locate(m, &p, &loc) == 0) {
        if (loc.found) old = cm_old_state(m, cm_E(m, loc.idx));
        else { old = Py_None; Py_INCREF(old); }
        if (old) {
            uint32_t w = loc.found ? cm_writable(m, &p, &loc) : cm_add_entry(m, &p, loc.t);
            if (w) { Py_INCREF(state); cm_set_state(m, w, state, ts); }
            else Py_CLEAR(old);
        }
    }
    cm_leave(m);
    return old;
}

/* Removes if present; *old (if not NULL) receives the old state or None. 1/0/-1. */
static int cm_remove_probe(cm_map *m, const cm_probe *p, PyObject **old) {
    cm_loc loc;
    if (cm_locate(m, p, &loc) < 0) return -1;
    if (!loc.found) {
        if (old) { *old = Py_None; Py_INCREF(Py_None); }
        return 0;
    }
    if (old && !(*old = cm_old_state(m, cm_E(m, loc.idx)))) return -1;
    if (cm_unlink(m, loc.t, p->hash & (loc.t->capacity - 1u), loc.idx, loc.prev) < 0) {
        if (old) Py_CLEAR(*old);
        return -1;
    }
    return 1;
}

static int cm_remove(cm_map *m, PyObject *key, PyObject *ns) {
    cm_probe p; int r = -1;
    if (cm_enter(m) < 0) return -1;
    if (cm_make_probe(&p, key, ns) == 0) r = cm_remove_probe(m, &p, NULL);
    cm_leave(m);
    return r;
}

static PyObject *cm_remove_and_get_old(cm_map *m, PyObject *key, PyObject *ns) {
    cm_probe p; PyObject *old = NULL;
    if (cm_enter(m) < 0) return NULL;
    if (cm_make_probe(&p, key, ns) == 0) cm_remove_probe(m, &p, &old);
    cm_leave(m);
    return old;
}

/* state = fn(old_or_None, value); fn runs while the map is busy (it must not use the map). */
static int cm_transform(cm_map *m, PyObject *key, PyObject *ns, PyObject *value, PyObject *fn, int64_t ts) {
    cm_probe p; cm_loc loc; int r = -1;
    if (cm_enter(m) < 0) return -1;
    if (cm_make_probe(&p, key, ns) == 0 && cm_locate(m, &p, &loc) == 0) {
        PyObject *arg;
        if (loc.found) arg = cm_old_state(m, cm_E(m, loc.idx));
        else { arg = Py_None; Py_INCREF(arg); }
        if (arg) {
            PyObject *args[2] = {arg, value};
            PyObject *nst = PyObject_Vectorcall(fn, args, 2, NULL);
            Py_DECREF(arg);
            if (nst) {
                uint32_t w = loc.found ? cm_writable(m, &p, &loc) : cm_add_entry(m, &p, loc.t);
                if (w) { cm_set_state(m, w, nst, ts); r = 0; }
                else Py_DECREF(nst);
            }
        }
    }
    cm_leave(m);
    return r;
}

/* ------------------------------------------- lookahead hints (multi-map) */

/* The hash the map uses for o, if computing it runs no Python code: exact ints
 * that fit 64 bits, exact str with a cached hash, objects hashed by identity. */
static inline int cm_hint_hash(PyObject *o, Py_hash_t *h) {
    PyTypeObject *t = Py_TYPE(o);
    if (t == &PyLong_Type) {
        int overflow;
        int64_t v = cm_as_int64(o, &overflow); /* cannot fail for an exact int */
        if (overflow) return 0;
        *h = cm_int_hash(v);
        return 1;
    }
    if (t == &PyUnicode_Type) {
        Py_hash_t x = ((PyASCIIObject *)o)->hash;
        if (x == -1) return 0;
        *h = x;
        return 1;
    }
    if (t->tp_hash == PyBaseObject_Type.tp_hash) {
        *h = t->tp_hash(o);
        return 1;
    }
    return 0;
}

/* The composite hash of (key, ns) for cm_hint_at, if computing it runs no
 * Python code (cm_hint_hash); 0 if not. */
static inline int cm_hint_composite(PyObject *key, PyObject *ns, uint32_t *h) {
    Py_hash_t hk, hn;
    if (!cm_hint_hash(key, &hk) || !cm_hint_hash(ns, &hn)) return 0;
    *h = cm_composite(hk, hn);
    return 1;
}

/* A prefetch hint for a coming lookup of the key with composite hash h in m,
 * for batches spread over many maps (multi_get/multi_put/multi_replace), where
 * the single-map pipeline above does not apply: stage 0 prefetches the bucket
 * slot, stage 1 the head entry of the bucket (its slot prefetched by an earlier
 * stage 0), stage 2 that entry's state, or the next entry of the chain when the
 * head's hash is not the key's. Hints only: it reads the map as it is
 * now and changes nothing, so a stale hash only prefetches the wrong lines. */
CM_ALWAYS_INLINE static inline void cm_hint_at(const cm_map *m, uint32_t h, int stage) {
#if defined(__GNUC__)
    if (m->busy) return;
    const uint32_t *slot = cm_slot_at(m, h);
    if (!slot) return;
    if (stage == 0) { CM_PREFETCH(slot); return; }
    uint32_t i = *slot;
    if (!i) return;
    if (stage == 1) { cm_prefetch_entry(m, i); return; }
    const cm_entry *e = cm_E(m, i);
    if (!cm_prefetch_past_head(m, e, h) && e->state) CM_PREFETCH_W(e->state);
#else
    (void)m; (void)h; (void)stage;
#endif
}

/* ---------------------------------------------------------- batch ops */

/* keys: either a Python sequence (fast sequence: list/tuple) or int64 data */
typedef struct {
    PyObject *seq;         /* a list or tuple of key objects, or NULL */
    const int64_t *ints;   /* int64 array data, or NULL */
    Py_ssize_t n;
} cm_keys;

/* Item i of a batch's list or tuple. A list is read live: Python code run
 * during the batch (a key's __eq__, a finalizer) may change it, so the caller
 * uses an item before any such code can run, or holds a reference to it. */
static inline PyObject *cm_seq_get(PyObject *seq, Py_ssize_t i) {
    if (PyList_CheckExact(seq)) return i < PyList_GET_SIZE(seq) ? PyList_GET_ITEM(seq, i) : NULL;
    return PyTuple_GET_ITEM(seq, i);
}

static PyObject *cm_seq_item(PyObject *seq, Py_ssize_t i, const char *what) {
    PyObject *o = cm_seq_get(seq, i);
    if (!o) PyErr_Format(PyExc_RuntimeError, "the list of %s changed size during the batch", what);
    return o;
}

static int cm_probe_at(const cm_keys *ks, Py_ssize_t i, PyObject *ns, Py_hash_t hn, cm_probe *p) {
    Py_hash_t hk;
    if (ks->ints) {
        int64_t v = ks->ints[i];
        p->key = NULL; p->ikey = v; p->is_int = 1;
        hk = cm_int_hash(v);
    } else {
        PyObject *key = cm_seq_item(ks->seq, i, "keys");
        if (!key || cm_probe_key(p, key, &hk) < 0) return -1;
    }
    p->ns = ns;
    p->hash = cm_composite(hk, hn);
    return 0;
}

/* Software pipeline for int64 batches: hash key i+D and prefetch its slot,
 * prefetch the head entry of key i+D/2 and, for key i+D/4, its state or (when
 * the head is another key's) the chain's next entry, so the cache misses of D
 * keys overlap instead of running one after another.
 * Prefetches are only hints: a rehash step in between cannot make them wrong. */
#define CM_PF_D 32u
#define CM_PF_RING 64u

typedef struct { uint32_t h[CM_PF_RING]; Py_hash_t hn; } cm_pf;

static inline uint32_t cm_pf_hash(const cm_keys *ks, Py_ssize_t i, Py_hash_t hn) {
    return cm_composite(cm_int_hash(ks->ints[i]), hn);
}

static inline uint32_t cm_pf_head(const cm_map *m, uint32_t h) {
    const uint32_t *slot = cm_slot_at(m, h);
    return slot ? *slot : 0u;
}

static inline void cm_pf_step(const cm_map *m, const cm_keys *ks, Py_ssize_t i, cm_pf *pf, int want_state) {
    Py_ssize_t j = i + CM_PF_D;
    if (j < ks->n) {
        uint32_t h = cm_pf_hash(ks, j, pf->hn);
        pf->h[j & (CM_PF_RING - 1u)] = h;
        const uint32_t *slot = cm_slot_at(m, h);
        if (slot) CM_PREFETCH(slot);
    }
    j = i + CM_PF_D / 2;
    if (j < ks->n) {
        uint32_t e = cm_pf_head(m, pf->h[j & (CM_PF_RING - 1u)]);
        if (e) cm_prefetch_entry(m, e);
    }
    j = i + CM_PF_D / 4;
    if (j < ks->n) {
        /* the head has arrived: the next entry if the key is further down
         * the chain (its hash differs), else the state a get will INCREF */
        uint32_t h = pf->h[j & (CM_PF_RING - 1u)];
        uint32_t e = cm_pf_head(m, h);
        if (e && !cm_prefetch_past_head(m, cm_E(m, e), h) && want_state) CM_PREFETCH(cm_E(m, e)->state);
    }
}

static inline void cm_pf_init(const cm_keys *ks, cm_pf *pf, Py_hash_t hn) {
    pf->hn = hn;
    for (Py_ssize_t j = 0; j < ks->n && j < (Py_ssize_t)CM_PF_D; j++)
        pf->h[j] = cm_pf_hash(ks, j, hn);
}

/* Probe for key i of a batch; for int64 batches also runs the prefetch pipeline. */
static inline int cm_batch_probe(const cm_map *m, const cm_keys *ks, Py_ssize_t i, PyObject *ns,
                                 cm_pf *pf, cm_probe *p, int want_state) {
    if (ks->ints) {
        cm_pf_step(m, ks, i, pf, want_state);
        /* hash the value read now: the ring's hash only steered prefetches */
        p->key = NULL; p->ikey = ks->ints[i]; p->is_int = 1; p->ns = ns;
        p->hash = cm_composite(cm_int_hash(p->ikey), pf->hn);
        return 0;
    }
    return cm_probe_at(ks, i, ns, pf->hn, p);
}

enum { CM_B_GET, CM_B_CONTAINS, CM_B_PUT };

typedef struct {
    int mode;
    PyObject *ns;
    Py_hash_t hn;
    PyObject *out_list;     /* GET */
    uint8_t *out_flags;     /* CONTAINS */
    PyObject *states;       /* PUT: a list or tuple, read with cm_seq_item */
    int64_t ts;             /* PUT */
} cm_batch;

/* One key of a batch through the general path (rehash step, copy-on-write). */
static int cm_batch_one(cm_map *m, const cm_batch *bt, const cm_probe *p, Py_ssize_t i) {
    cm_loc loc;
    if (cm_locate(m, p, &loc) < 0) return -1;
    if (bt->mode == CM_B_PUT) {
        /* read the state after the lookup (which may run Python code) and own
         * it before the insert (which may too); a failure leaves no entry */
        PyObject *st = cm_seq_item(bt->states, i, "states");
        if (!st) return -1;
        Py_INCREF(st);
        uint32_t w = loc.found ? cm_writable(m, p, &loc) : cm_add_entry(m, p, loc.t);
        if (!w) { cm_grave(m, st); return -1; }
        cm_set_state(m, w, st, bt->ts);
        return 0;
    }
    if (bt->mode == CM_B_CONTAINS) { bt->out_flags[i] = (uint8_t)loc.found; return 0; }
    PyObject *s;
    if (loc.found) { if (!(s = cm_read_state(m, p, &loc))) return -1; }
    else { s = Py_None; Py_INCREF(s); }
    PyList_SET_ITEM(bt->out_list, i, s);
    return 0;
}

/* Keys [start, end) through the general path; int64 keys still prefetch. */
static int cm_batch_general(cm_map *m, const cm_keys *ks, const cm_batch *bt, Py_ssize_t start, Py_ssize_t end) {
    cm_probe p; cm_pf pf;
    cm_keys sub = *ks;
    if (ks->ints) { sub.ints = ks->ints + start; sub.n = end - start; cm_pf_init(&sub, &pf, bt->hn); }
    else pf.hn = bt->hn;
    for (Py_ssize_t i = start; i < end; i++) {
        if (ks->ints) {
            if (bt->mode == CM_B_PUT && i + (Py_ssize_t)CM_PF_D < end)
                CM_PREFETCH_W(cm_seq_get(bt->states, i + CM_PF_D));
            cm_batch_probe(m, &sub, i - start, bt->ns, &pf, &p, bt->mode != CM_B_CONTAINS);
            if (cm_batch_one(m, bt, &p, i) < 0) return -1;
        } else {
            /* hold the key: its own __eq__ may drop it from a live list */
            PyObject *key = cm_seq_item(ks->seq, i, "keys");
            if (!key) return -1;
            Py_INCREF(key);
            int r = cm_probe_at(ks, i, bt->ns, bt->hn, &p);
            if (r == 0) { p.key = key; r = cm_batch_one(m, bt, &p, i); }
            cm_grave(m, key);
            if (r < 0) return -1;
        }
    }
    return 0;
}

/* The fast path applies while nothing can move: no rehash running, and no
 * copy-on-write to do (puts need no live snapshot; gets no copier or none). */
static inline int cm_fast_ok(const cm_map *m, int mode) {
    if (m->rehash.capacity) return 0;
    if (mode == CM_B_CONTAINS) return 1;
    if (mode == CM_B_GET) return !m->copier || !m->required;
    return 1; /* puts copy shared chains themselves */
}

#define CM_FD 48u     /* keys between hashing a key and resolving it */
#define CM_FR 64u     /* ring size, power of two > CM_FD */
#define CM_FLATE 16u  /* replaced states in flight between prefetch and release (power of two) */

/* Pipelined int64 puts over [start, n): each key is hashed once; its slot is
 * prefetched CM_FD keys before the key is resolved and its head entry (both
 * cache lines) CM_FD/3 later. Another CM_FD/3 later the head is read: when its
 * hash is not the key's, the key is further down the chain (about one lookup
 * in four at the usual loads), so the next entry is prefetched too, and the
 * lookup no longer stalls on a chain step. That read is the only one before
 * the key is resolved, and it comes a third of the pipeline after its
 * prefetch: the memory system is the bottleneck here, and a read closer
 * behind its prefetch stalls on it. The final step re-reads the slot, so
 * entries added earlier in the same batch are seen. A replaced state is
 * prefetched when it is replaced and released CM_FLATE replacements later
 * (`late`; the caller releases what is left), so the misses on scattered old
 * states overlap too.
 * Returns the index where it stopped (n, or earlier when an insert started a
 * rehash), or -1 on error. */
static Py_ssize_t cm_batch_fast_run(cm_map *m, const cm_keys *ks, const cm_batch *bt, Py_ssize_t start,
                                    PyObject **late) {
    const Py_ssize_t n = ks->n;
    const int64_t *keys = ks->ints;
    const uint32_t nsmix = cm_fmix32(cm_fold(bt->hn));
    uint32_t ring[CM_FR];
    int64_t kring[CM_FR]; /* each key is read once: the array may be written by Python code */
    uint32_t nlate = 0;
    cm_probe p;
    p.key = NULL; p.is_int = 1; p.ns = bt->ns;
    for (Py_ssize_t i = start; i < n + (Py_ssize_t)CM_FD; i++) {
        const cm_table *t = &m->primary;
        const uint32_t cmask = t->capacity - 1u, shift = t->page_shift, pmask = (1u << shift) - 1u;
        if (i < n) {
            int64_t kv = keys[i];
            uint32_t h = cm_mix(cm_int_hash(kv), nsmix);
            ring[i & (CM_FR - 1u)] = h;
            kring[i & (CM_FR - 1u)] = kv;
            const cm_page *pg = t->pages[(h & cmask) >> shift];
            if (pg) CM_PREFETCH(&pg->slots[h & pmask]);
        }
        Py_ssize_t j = i - (Py_ssize_t)(CM_FD / 3);
        if (j >= start && j < n) {
            uint32_t h = ring[j & (CM_FR - 1u)];
            const cm_page *pg = t->pages[(h & cmask) >> shift];
            uint32_t e = pg ? pg->slots[h & pmask] : 0u;
            if (e) cm_prefetch_entry(m, e);
        }
        j = i - (Py_ssize_t)(2 * CM_FD / 3);
        if (j >= start && j < n) {
            /* the head has arrived by now: if its hash is not the key's, the
             * key is further down the chain, so prefetch the next entry too */
            uint32_t h = ring[j & (CM_FR - 1u)];
            uint32_t e = cm_pf_head(m, h);
            /* a put under a live snapshot copies the head too (its state gains a reference) */
            if (e && cm_prefetch_past_head(m, cm_E(m, e), h) && m->required)
                CM_PREFETCH_W(cm_E(m, e)->state);
        }
        j = i - (Py_ssize_t)CM_FD;
        if (j < start) continue;
        /* resolve key j */
        uint32_t h = ring[j & (CM_FR - 1u)];
        const cm_page *pg = t->pages[(h & cmask) >> shift];
        uint32_t e = pg ? pg->slots[h & pmask] : 0u;
        int64_t k = kring[j & (CM_FR - 1u)];
        cm_entry *hit = NULL;
        p.ikey = k; p.hash = h;
        for (; e; e = cm_E(m, e)->next) {
            cm_entry *x = cm_E(m, e);
            int r = cm_match(x, &p);
            if (r < 0) return -1;
            if (r) { hit = x; break; }
        }
        /* read the state after the lookup (which may run Python code) and
         * own it before the insert (which may too); a failure leaves no entry */
        PyObject *ns_state = cm_seq_item(bt->states, j, "states");
        if (!ns_state) return -1;
        if (hit && hit->state == ns_state && cm_ev(hit) >= m->required) {
            /* the state it holds (say a mutable state changed in place and
             * put back): no reference changes hands, neither object is touched */
            hit->sv = m->version;
            hit->ts = bt->ts;
            continue;
        }
        Py_INCREF(ns_state);
        if (!hit) {
            uint32_t w = cm_add_entry(m, &p, &m->primary);
            if (!w) { cm_grave(m, ns_state); return -1; }
            hit = cm_E(m, w);
        } else if (cm_ev(hit) < m->required) {
            /* the copy takes the new state: the old one stays with the
             * snapshot's entry, untouched */
            PyObject *own = ns_state;
            uint32_t w = cm_chain_cow(m, &m->primary, h & cmask, e, &own);
            if (!w) { if (own) cm_grave(m, own); return -1; }
            hit = cm_E(m, w);
            if (!own) { hit->ts = bt->ts; continue; }
        }
        if (hit->state != ns_state) {
            PyObject *old = hit->state;
            hit->state = ns_state;
            CM_PREFETCH_W(old);
            PyObject **lp = &late[nlate++ & (CM_FLATE - 1u)];
            if (*lp) cm_grave(m, *lp);
            *lp = old;
        } else {
            Py_DECREF(ns_state); /* the entry holds it too: cannot be the last */
        }
        hit->sv = m->version;
        hit->ts = bt->ts;
        if (m->rehash.capacity) return j + 1; /* the insert started a rehash */
    }
    return n;
}

/* A key of a read-only batch in flight: its hash and value, then its slot,
 * then its head entry. */
typedef struct {
    uint32_t h;
    const uint32_t *slot;
    const cm_entry *head;
    int64_t k;
} cm_rkey;

/* Pipelined int64 gets and contains over [start, n): the pipeline of
 * cm_batch_fast_run, but nothing can change the map meanwhile (no insert, and
 * the busy flag turns away any code a key comparison runs), so each key's slot
 * address and head entry are found once and carried down the ring instead of
 * being found again at each stage (a get of 1M keys: 160 instructions a key,
 * not 239). Gets store borrowed states (see cm_batch_fast_refs). Returns n,
 * or -1 on error. */
static Py_ssize_t cm_batch_read_run(cm_map *m, const cm_keys *ks, const cm_batch *bt, Py_ssize_t start) {
    const Py_ssize_t n = ks->n;
    const int64_t *keys = ks->ints;
    const uint32_t nsmix = cm_fmix32(cm_fold(bt->hn));
    const cm_table *t = &m->primary;
    const uint32_t cmask = t->capacity - 1u, shift = t->page_shift, pmask = (1u << shift) - 1u;
    cm_page *const *pages = t->pages;
    PyObject *const ns = bt->ns;
    const int get = bt->mode == CM_B_GET;
    cm_rkey ring[CM_FR];
    cm_probe p;
    p.key = NULL; p.is_int = 1; p.ns = ns;
    for (Py_ssize_t i = start; i < n + (Py_ssize_t)CM_FD; i++) {
        if (i < n) {
            cm_rkey *r = &ring[i & (CM_FR - 1u)];
            r->k = keys[i];
            r->h = cm_mix(cm_int_hash(r->k), nsmix);
            const cm_page *pg = pages[(r->h & cmask) >> shift];
            r->slot = pg ? &pg->slots[r->h & pmask] : NULL;
            if (r->slot) CM_PREFETCH(r->slot);
        }
        Py_ssize_t j = i - (Py_ssize_t)(CM_FD / 3);
        if (j >= start && j < n) {
            cm_rkey *r = &ring[j & (CM_FR - 1u)];
            uint32_t e = r->slot ? *r->slot : 0u;
            r->head = e ? cm_E(m, e) : NULL;
            if (e) cm_prefetch_hot(m, e);
        }
        j = i - (Py_ssize_t)(2 * CM_FD / 3);
        if (j >= start && j < n) {
            const cm_rkey *r = &ring[j & (CM_FR - 1u)];
            /* the head has arrived: if it is another key's, request the next entry */
            const cm_entry *x = r->head;
            if (x && !cm_hash_is(x, r->h) && x->next) cm_prefetch_hot(m, x->next);
        }
        j = i - (Py_ssize_t)CM_FD;
        if (j < start) continue;
        const cm_rkey *r = &ring[j & (CM_FR - 1u)];
        const cm_entry *hit = NULL;
        p.ikey = r->k; p.hash = r->h;
        for (const cm_entry *x = r->head; x; x = x->next ? cm_E(m, x->next) : NULL) {
            int eq = cm_match(x, &p);
            if (eq < 0) return -1;
            if (eq) { hit = x; break; }
        }
        if (get) PyList_SET_ITEM(bt->out_list, j, hit ? hit->state : Py_None);
        else bt->out_flags[j] = hit != NULL;
    }
    return n;
}

static Py_ssize_t cm_batch_fast(cm_map *m, const cm_keys *ks, const cm_batch *bt, Py_ssize_t start) {
    if (bt->mode != CM_B_PUT) return cm_batch_read_run(m, ks, bt, start);
    PyObject *late[CM_FLATE] = {NULL};
    Py_ssize_t r = cm_batch_fast_run(m, ks, bt, start, late);
    for (unsigned k = 0; k < CM_FLATE; k++)
        if (late[k]) cm_grave(m, late[k]);
    return r;
}

/* INCREF out[start, stop): independent read-modify-writes, prefetched ahead. */
static void cm_incref_range(PyObject *out, Py_ssize_t start, Py_ssize_t stop) {
    PyObject **items = ((PyListObject *)out)->ob_item;
    for (Py_ssize_t i = start; i < stop; i++) {
        if (i + 16 < stop) CM_PREFETCH_W(items[i + 16]);
        Py_INCREF(items[i]);
    }
}

static Py_ssize_t cm_batch_fast_refs(cm_map *m, const cm_keys *ks, const cm_batch *bt, Py_ssize_t start) {
    /* while the list holds borrowed references, the GC must not traverse it */
    int tracked = bt->mode == CM_B_GET && PyObject_GC_IsTracked(bt->out_list);
    if (tracked) PyObject_GC_UnTrack(bt->out_list);
    Py_ssize_t stop = cm_batch_fast(m, ks, bt, start);
    if (bt->mode == CM_B_GET) {
        if (stop < 0) {
            /* the failing key and those after it were never set */
            PyObject **items = ((PyListObject *)bt->out_list)->ob_item;
            Py_ssize_t i = start;
            while (i < ks->n && items[i]) i++;
            cm_incref_range(bt->out_list, start, i);
        } else {
            cm_incref_range(bt->out_list, start, stop);
        }
        if (tracked) PyObject_GC_Track(bt->out_list);
    }
    return stop;
}

#define CM_GENERAL_BLOCK 256

static int cm_batch_run(cm_map *m, const cm_keys *ks, cm_batch *bt) {
    cm_probe p;
    if (cm_enter(m) < 0) return -1;
    int r = -1;
    if (cm_probe_ns(&p, bt->ns, &bt->hn) < 0) goto done;
    if (ks->ints && bt->mode != CM_B_PUT) {
        /* gets move nothing but still owe one rehash step each: pay them first */
        for (Py_ssize_t i = 0; i < ks->n && m->rehash.capacity; i++)
            if (cm_rehash_step(m) < 0) goto done;
    }
    for (Py_ssize_t i = 0; i < ks->n;) {
        if (ks->ints && cm_fast_ok(m, bt->mode)) {
            Py_ssize_t stop = cm_batch_fast_refs(m, ks, bt, i);
            if (stop < 0) goto done;
            i = stop;
        } else {
            Py_ssize_t end = !ks->ints ? ks->n : (i + CM_GENERAL_BLOCK < ks->n ? i + CM_GENERAL_BLOCK : ks->n);
            if (cm_batch_general(m, ks, bt, i, end) < 0) goto done;
            i = end;
        }
    }
    if (m->nrq) cm_reclaim_some(m, 2 * (size_t)ks->n);
    r = 0;
done:
    cm_leave(m);
    return r;
}

static PyObject *cm_get_many(cm_map *m, const cm_keys *ks, PyObject *ns) {
    PyObject *out = PyList_New(ks->n); /* NULL items until set: safe to drop on error */
    if (!out) return NULL;
    cm_batch bt = {CM_B_GET, ns, 0, out, NULL, NULL, 0};
    if (cm_batch_run(m, ks, &bt) < 0) { Py_DECREF(out); return NULL; }
    return out;
}

static int cm_put_many(cm_map *m, const cm_keys *ks, PyObject *ns, PyObject *states, int64_t ts) {
    cm_batch bt = {CM_B_PUT, ns, 0, NULL, NULL, states, ts};
    return cm_batch_run(m, ks, &bt);
}

static int cm_contains_many(cm_map *m, const cm_keys *ks, PyObject *ns, uint8_t *out) {
    cm_batch bt = {CM_B_CONTAINS, ns, 0, NULL, out, NULL, 0};
    return cm_batch_run(m, ks, &bt);
}

static Py_ssize_t cm_remove_many(cm_map *m, const cm_keys *ks, PyObject *ns) {
    cm_probe p; Py_hash_t hn; Py_ssize_t removed = 0; cm_pf pf;
    if (cm_enter(m) < 0) return -1;
    if (cm_probe_ns(&p, ns, &hn) < 0) { removed = -1; goto done; }
    if (ks->ints) cm_pf_init(ks, &pf, hn); else pf.hn = hn;
    for (Py_ssize_t i = 0; i < ks->n; i++) {
        int r;
        if (cm_batch_probe(m, ks, i, ns, &pf, &p, 1) < 0 || (r = cm_remove_probe(m, &p, NULL)) < 0) {
            removed = -1;
            goto done;
        }
        removed += r;
    }
done:
    cm_leave(m);
    return removed;
}

/* -------------------------------------------------------------- snapshots */

typedef struct {
    uint32_t capacity, page_shift, npages;
    cm_page **pages;   /* private copy of the page-pointer array */
} cm_tview;

typedef struct {
    uint32_t version;
    uint32_t size;
    uint32_t rehash_index;
    cm_tview primary, rehash;
} cm_snap;

static int cm_tview_take(cm_tview *v, const cm_table *t) {
    v->capacity = t->capacity; v->page_shift = t->page_shift; v->npages = t->npages;
    v->pages = NULL;
    if (!t->capacity) return 0;
    v->pages = (cm_page **)PyMem_RawMalloc((size_t)t->npages * sizeof(cm_page *));
    if (!v->pages) { PyErr_NoMemory(); return -1; }
    memcpy(v->pages, t->pages, (size_t)t->npages * sizeof(cm_page *));
    return 0;
}

static inline uint32_t cm_tview_slot(const cm_tview *v, uint32_t b) {
    const cm_page *p = v->pages[b >> v->page_shift];
    return p ? p->slots[b & ((1u << v->page_shift) - 1u)] : 0u;
}

/* O(capacity / 4096): copies the page-pointer arrays only. */
static int cm_snapshot(cm_map *m, cm_snap *s) {
    if (cm_enter(m) < 0) return -1;
    int r = -1;
    memset(s, 0, sizeof(*s));
    if (m->version >= CM_VMASK) {
        PyErr_SetString(PyExc_RuntimeError, "snapshot version overflow (2**31 snapshots)");
        goto done;
    }
    if (m->nsnaps == m->snaps_cap) {
        uint32_t nc = m->snaps_cap ? m->snaps_cap * 2 : 4;
        cm_snapref *na = (cm_snapref *)PyMem_RawRealloc(m->snaps, nc * sizeof(cm_snapref));
        if (!na) { PyErr_NoMemory(); goto done; }
        m->snaps = na; m->snaps_cap = nc;
    }
    if (cm_tview_take(&s->primary, &m->primary) < 0) goto done;
    if (cm_tview_take(&s->rehash, &m->rehash) < 0) { PyMem_RawFree(s->primary.pages); goto done; }
    s->version = ++m->version;
    s->size = m->size;
    s->rehash_index = m->rehash_index;
    m->required = m->version;
    memset(&m->snaps[m->nsnaps], 0, sizeof(cm_snapref));
    m->snaps[m->nsnaps++].version = m->version;
    r = 0;
done:
    cm_leave(m);
    return r;
}

/* Unregister a snapshot; its retired items join the reclaim queue (O(1)). */
static void cm_release_now(cm_map *m, uint32_t version) {
    uint32_t k;
    for (k = 0; k < m->nsnaps && m->snaps[k].version != version; k++) {}
    if (k == m->nsnaps) return;
    cm_snapref gone = m->snaps[k];
    memmove(&m->snaps[k], &m->snaps[k + 1], (m->nsnaps - k - 1) * sizeof(cm_snapref));
    m->nsnaps--;
    m->required = m->nsnaps ? m->snaps[m->nsnaps - 1].version : 0;
    if (!gone.ents.n && !gone.pages.n) {
        PyMem_RawFree(gone.ents.a);
        PyMem_RawFree(gone.pages.a);
        return;
    }
    if (m->nrq == m->rq_cap) {
        uint32_t nc = m->rq_cap ? m->rq_cap * 2 : 4;
        cm_rqbatch *na = (cm_rqbatch *)PyMem_RawRealloc(m->rq, nc * sizeof(cm_rqbatch));
        if (!na) {
            /* cannot queue: reclaim right here instead (PyMem_RawRealloc sets no error) */
            m->rq_items += gone.ents.n + gone.pages.n;
            cm_rqbatch tmp = {version, gone.ents, gone.pages};
            cm_rqbatch *save = m->rq; uint32_t sn = m->nrq;
            m->rq = &tmp; m->nrq = 1;
            cm_reclaim_some(m, (size_t)-1);
            m->rq = save; m->nrq = sn;
            return;
        }
        m->rq = na; m->rq_cap = nc;
    }
    m->rq[m->nrq].version = version;
    m->rq[m->nrq].ents = gone.ents;
    m->rq[m->nrq].pages = gone.pages;
    m->nrq++;
    m->rq_items += gone.ents.n + gone.pages.n;
}

/* Hand up to `budget` queued items to the next older live snapshot that still
 * sees them (made before it), or free them. */
static void cm_reclaim_some(cm_map *m, size_t budget) {
    while (budget && m->nrq) {
        cm_rqbatch *b = &m->rq[m->nrq - 1];
        cm_snapref *older = NULL;
        for (uint32_t k = m->nsnaps; k-- > 0;)
            if (m->snaps[k].version < b->version) { older = &m->snaps[k]; break; }
        while (budget && b->ents.n) {
            /* the entries are scattered, and freeing one reads it and releases
             * its state: prefetch the entries 16 ahead and the states 8 ahead */
            if (b->ents.n > 16) cm_prefetch_entry(m, b->ents.a[b->ents.n - 17]);
            if (b->ents.n > 8) CM_PREFETCH_W(cm_E(m, b->ents.a[b->ents.n - 9])->state);
            uint32_t e = b->ents.a[--b->ents.n];
            budget--; m->rq_items--;
            if (older && cm_ev(cm_E(m, e)) < older->version) {
                /* out of memory: leaking beats freeing what `older` still reads */
                (void)cm_u32vec_add(&older->ents, e);
                continue;
            }
            cm_entry_free(m, e);
        }
        while (budget && b->pages.n) {
            cm_page *p = (cm_page *)b->pages.a[--b->pages.n];
            budget--; m->rq_items--;
            if (older && p->version < older->version) {
                (void)cm_ptrvec_add(&older->pages, p);
                continue;
            }
            cm_page_free(m, p);
        }
        if (!b->ents.n && !b->pages.n) {
            PyMem_RawFree(b->ents.a);
            PyMem_RawFree(b->pages.a);
            m->nrq--;
        }
    }
}

/* Reclaim up to `budget` queued items now (all when budget < 0); returns how many remain. */
static Py_ssize_t cm_reclaim(cm_map *m, Py_ssize_t budget) {
    if (cm_enter(m) < 0) return -1;
    cm_reclaim_some(m, budget < 0 ? (size_t)-1 : (size_t)budget);
    Py_ssize_t left = (Py_ssize_t)m->rq_items;
    cm_leave(m);
    return left;
}

/* Versions of the live snapshots, ascending, as a list of ints. */
static PyObject *cm_snapshot_versions(const cm_map *m) {
    PyObject *out = PyList_New(m->nsnaps);
    if (!out) return NULL;
    for (uint32_t i = 0; i < m->nsnaps; i++) {
        PyObject *v = PyLong_FromUnsignedLong(m->snaps[i].version);
        if (!v) { Py_DECREF(out); return NULL; }
        PyList_SET_ITEM(out, i, v);
    }
    return out;
}

static void cm_snap_free_views(cm_snap *s) {
    PyMem_RawFree(s->primary.pages); s->primary.pages = NULL;
    PyMem_RawFree(s->rehash.pages); s->rehash.pages = NULL;
}

/* Release a snapshot; deferred to the end of the running operation if busy. */
static void cm_release(cm_map *m, cm_snap *s) {
    cm_snap_free_views(s);
    if (m->busy) {
        /* out of memory it cannot be deferred: a leak beats freeing under a
         * running operation */
        (void)cm_u32vec_add(&m->pending_release, s->version);
        return;
    }
    m->busy = 1;
    m->owner = PyThread_get_thread_ident();
    cm_release_now(m, s->version);
    cm_reclaim_some(m, CM_RECLAIM_EAGER);
    cm_leave(m);
}

/* Position iterator over a snapshot: bucket by bucket, chain by chain. */
typedef struct {
    int phase;       /* 0 primary (from rehash_index), 1 rehash table, 2 done */
    uint32_t b;      /* next bucket */
    uint32_t e;      /* next entry in current chain, 0 = load next bucket */
} cm_snapit;

static void cm_snapit_init(const cm_snap *s, cm_snapit *it) {
    it->phase = 0; it->b = s->rehash_index; it->e = 0;
}

/* Next entry index of the snapshot, 0 at the end. */
static uint32_t cm_snapit_next(const cm_map *m, const cm_snap *s, cm_snapit *it) {
    while (!it->e) {
        const cm_tview *v = it->phase == 0 ? &s->primary : &s->rehash;
        if (it->phase >= 2) return 0;
        if (it->b >= v->capacity) {
            it->phase = (it->phase == 0 && s->rehash.capacity) ? 1 : 2;
            it->b = 0;
            continue;
        }
        it->e = cm_tview_slot(v, it->b++);
    }
    uint32_t cur = it->e;
    it->e = cm_E(m, cur)->next;
    return cur;
}

static PyObject *cm_entry_key(const cm_entry *e) {
    if (cm_intkey(e)) return PyLong_FromLongLong(e->key.i);
    Py_INCREF(e->key.obj);
    return e->key.obj;
}

/* References are taken before the tuple is allocated: that allocation may run
 * a GC pass whose finalizers release the snapshot this entry belongs to. */
static PyObject *cm_entry_tuple(const cm_entry *e, int with_ts) {
    PyObject *ns = e->ns, *state = e->state;
    long long ts = (long long)e->ts;
    Py_INCREF(ns);
    Py_INCREF(state);
    PyObject *k = cm_entry_key(e);
    if (!k) { Py_DECREF(ns); Py_DECREF(state); return NULL; }
    if (with_ts) return Py_BuildValue("(NNNL)", k, ns, state, ts);
    return Py_BuildValue("(NNN)", k, ns, state);
}

/* ------------------------------------------------- live-map iteration */

/* Appends the entries of logical bucket j (hash mod base_cap == j) to `out`.
 * Entries never change logical bucket when the table grows, so an iterator
 * that walks logical buckets sees each entry once even if reads rehash. */
static int cm_collect_logical(const cm_map *m, uint32_t base_cap, uint32_t j, PyObject *out) {
    for (int tt = 0; tt < 2; tt++) {
        const cm_table *t = tt == 0 ? &m->primary : &m->rehash;
        if (!t->capacity) continue;
        for (uint32_t b = j; b < t->capacity; b += base_cap) {
            if (tt == 0 && b < m->rehash_index) continue;
            for (uint32_t i = cm_slot_get(t, b); i; i = cm_E(m, i)->next) {
                PyObject *tup = cm_entry_tuple(cm_E(m, i), 0);
                if (!tup || PyList_Append(out, tup) < 0) { Py_XDECREF(tup); return -1; }
                Py_DECREF(tup);
            }
        }
    }
    return 0;
}

/* ------------------------------------------------- incremental visitor */

static void cm_cursor_reset(const cm_map *m, cm_cursor *c) {
    c->phase = 0; c->pos = 0;
}

/* Up to two buckets visited at one position: (rehash table, p) and (primary, p). */
typedef struct { int n; cm_table *t[2]; uint32_t b[2]; } cm_vpos;

/* Finds the next position holding entries, scanning at most max_empty empty
 * positions. Returns 1 with `out` set, 0 if the budget ran out, -1 when done.
 * Positions are bucket numbers of the largest table (the rehash table while
 * rehashing). Position p covers bucket p of that table and, while rehashing,
 * the unmigrated primary bucket p. A doubling sends bucket b to b or b + cap,
 * never below b, so everything at positions >= pos stays there: each entry
 * present for the whole visit is returned at least once (some twice). */
static int cm_visit_next(cm_map *m, cm_cursor *c, uint32_t max_empty, cm_vpos *out) {
    uint32_t scanned = 0;
    for (;;) {
        uint32_t largest = m->rehash.capacity ? m->rehash.capacity : m->primary.capacity;
        if (c->phase >= 2 || c->pos >= largest) { c->phase = 2; return -1; }
        uint32_t p = c->pos++;
        out->n = 0;
        if (m->rehash.capacity) {
            if (cm_slot_get(&m->rehash, p)) { out->t[out->n] = &m->rehash; out->b[out->n++] = p; }
            if (p < m->primary.capacity && p >= m->rehash_index && cm_slot_get(&m->primary, p)) {
                out->t[out->n] = &m->primary; out->b[out->n++] = p;
            }
        } else if (cm_slot_get(&m->primary, p)) {
            out->t[0] = &m->primary; out->b[0] = p; out->n = 1;
        }
        if (out->n) return 1;
        if (++scanned >= max_empty) return 0;
    }
}

static PyObject *cm_chain_list(const cm_map *m, const cm_vpos *vp) {
    PyObject *out = PyList_New(0);
    if (!out) return NULL;
    for (int k = 0; k < vp->n; k++) {
        for (uint32_t i = cm_slot_get(vp->t[k], vp->b[k]); i; i = cm_E(m, i)->next) {
            PyObject *tup = cm_entry_tuple(cm_E(m, i), 0);
            if (!tup || PyList_Append(out, tup) < 0) { Py_XDECREF(tup); Py_DECREF(out); return NULL; }
            Py_DECREF(tup);
        }
    }
    return out;
}

/* ------------------------------------------------------------ TTL sweep */

/* The one check of a TTL argument, for every map and entry point that takes
 * one: cm_expired's saturating sum is defined only for ttl > 0. */
static inline int cm_check_ttl(int64_t ttl) {
    if (CM_LIKELY(ttl > 0)) return 0;
    PyErr_Format(PyExc_ValueError, "ttl must be > 0 (milliseconds), got %lld", (long long)ttl);
    return -1;
}

static inline int cm_expired(int64_t ts, int64_t ttl, int64_t now) {
    /* ts + ttl <= now, the sum saturating at INT64_MAX as in Flink's TtlUtils (ttl > 0: cm_check_ttl) */
    int64_t end = ts > INT64_MAX - ttl ? INT64_MAX : ts + ttl;
    return end <= now;
}

/* Removes expired entries of bucket b of t; returns the number removed and
 * adds the chain length to *examined. With a `sink` list, each removed entry
 * is appended to it as (key, namespace, state) first. */
static Py_ssize_t cm_sweep_bucket(cm_map *m, cm_table *t, uint32_t b, int64_t now, int64_t ttl,
                                  Py_ssize_t *examined, PyObject *sink) {
    Py_ssize_t removed = 0;
    uint32_t prev = 0, i = cm_slot_get(t, b);
    while (i) {
        cm_entry *e = cm_E(m, i);
        uint32_t next = e->next;
        (*examined)++;
        if (cm_expired(e->ts, ttl, now)) {
            if (sink) {
                PyObject *tup = cm_entry_tuple(e, 0);
                if (!tup) return -1;
                int rc = PyList_Append(sink, tup);
                Py_DECREF(tup);
                if (rc < 0) return -1;
            }
            if (cm_unlink(m, t, b, i, prev) < 0) return -1;
            removed++;
            /* prev may have been copied by the unlink: find it again */
            if (prev) {
                uint32_t q = cm_slot_get(t, b), pq = 0;
                while (q && q != next) { pq = q; q = cm_E(m, q)->next; }
                prev = pq;
            }
        } else {
            prev = i;
        }
        i = next;
    }
    return removed;
}

#define CM_SWEEP_PF 16u /* visit positions between prefetching a bucket's head entry and sweeping it */

/* Prefetch the head entries of visit position p (both tables while a rehash
 * runs). Hints only: a stale slot of the old table still names an allocated
 * entry, and chunks are freed only with the map. */
CM_ALWAYS_INLINE static inline void cm_visit_prefetch(const cm_map *m, uint32_t p) {
    const cm_table *ts[2] = {&m->rehash, &m->primary};
    for (int k = 0; k < 2; k++) {
        if (p >= ts[k]->capacity) continue;
        uint32_t i = cm_slot_get(ts[k], p);
        if (i) cm_prefetch_entry(m, i);
    }
}

/* Flink's incremental cleanup: visit chains until max_entries entries were
 * examined (or max_entries empty buckets scanned); wraps around at the end.
 * max_entries < 0: one full pass. Never calls into Python for the check. */
static Py_ssize_t cm_sweep(cm_map *m, int64_t now, int64_t ttl, Py_ssize_t max_entries, PyObject *sink) {
    if (cm_check_ttl(ttl) < 0 || cm_enter(m) < 0) return -1;
    Py_ssize_t removed = 0, examined = 0;
    int full = max_entries < 0;
    if (full || m->sweep.phase >= 2) cm_cursor_reset(m, &m->sweep);
    uint32_t budget = full || max_entries >= (Py_ssize_t)UINT32_MAX ? UINT32_MAX
                                                                    : (uint32_t)(max_entries > 0 ? max_entries : 1);
    uint32_t pf = m->sweep.pos; /* next position to prefetch: entries are scattered, slots are not */
    while (full || examined < max_entries) {
        cm_vpos vp;
        if (pf < m->sweep.pos) pf = m->sweep.pos;
        for (uint32_t want = m->sweep.pos + CM_SWEEP_PF; pf < want; pf++) cm_visit_prefetch(m, pf);
        int r = cm_visit_next(m, &m->sweep, budget, &vp);
        if (r < 0) { m->sweep.phase = 2; break; } /* the next call starts a new round */
        if (r == 0) break;
        for (int k = 0; k < vp.n; k++) {
            Py_ssize_t n = cm_sweep_bucket(m, vp.t[k], vp.b[k], now, ttl, &examined, sink);
            if (n < 0) { removed = -1; goto out; }
            removed += n;
        }
    }
out:
    if (full) cm_cursor_reset(m, &m->sweep);
    cm_leave(m);
    return removed;
}

/* The state at a found location (copied if shared), its entry's ts set to `ts`. */
static PyObject *cm_read_touch(cm_map *m, const cm_probe *p, cm_loc *loc, int64_t ts) {
    int stale = cm_E(m, loc->idx)->ts != ts;
    PyObject *r = cm_read_state(m, p, loc);
    if (r && stale) { /* the read may have copied the entry: find the live one */
        cm_loc l2; uint32_t w = 0;
        if (cm_locate(m, p, &l2) == 0) {
            if (l2.found) w = cm_writable(m, p, &l2);
            else PyErr_SetString(PyExc_RuntimeError, "entry vanished during a read");
        }
        if (w) cm_E(m, w)->ts = ts;
        else Py_CLEAR(r);
    }
    return r;
}

/* TTL read in one lookup: the state if live (its ts set to `now` when
 * `refresh`), a new reference to None if absent, or to `expired` if the entry
 * is expired (left as it is: the caller decides what expiry means). */
static PyObject *cm_get_unexpired(cm_map *m, PyObject *key, PyObject *ns, int64_t now, int64_t ttl,
                                  int refresh, PyObject *expired) {
    cm_probe p; cm_loc loc; PyObject *r = NULL;
    if (cm_check_ttl(ttl) < 0 || cm_enter(m) < 0) return NULL;
    if (cm_make_probe(&p, key, ns) == 0 && cm_locate(m, &p, &loc) == 0) {
        if (!loc.found) {
            r = Py_None; Py_INCREF(r);
        } else if (cm_expired(cm_E(m, loc.idx)->ts, ttl, now)) {
            r = expired; Py_INCREF(r);
        } else if (refresh) {
            r = cm_read_touch(m, &p, &loc, now);
        } else {
            r = cm_read_state(m, &p, &loc);
        }
    }
    cm_leave(m);
    return r;
}

/* A state handed out for change with a new timestamp, in one lookup: the
 * state (copied if shared) with its ts set to `ts`, or None if absent. */
static PyObject *cm_get_touch(cm_map *m, PyObject *key, PyObject *ns, int64_t ts) {
    cm_probe p; cm_loc loc; PyObject *r = NULL;
    if (cm_enter(m) < 0) return NULL;
    if (cm_make_probe(&p, key, ns) == 0 && cm_locate(m, &p, &loc) == 0) {
        if (loc.found) r = cm_read_touch(m, &p, &loc, ts);
        else { r = Py_None; Py_INCREF(r); }
    }
    cm_leave(m);
    return r;
}

/* Overwrite the state and ts of an existing entry: 1 done, 0 absent (nothing
 * added), -1 error. */
static int cm_replace(cm_map *m, PyObject *key, PyObject *ns, PyObject *state, int64_t ts) {
    cm_probe p; cm_loc loc; int r = -1;
    if (cm_enter(m) < 0) return -1;
    if (cm_make_probe(&p, key, ns) == 0 && cm_locate(m, &p, &loc) == 0) {
        if (!loc.found) r = 0;
        else {
            uint32_t w = cm_writable(m, &p, &loc);
            if (w) { Py_INCREF(state); cm_set_state(m, w, state, ts); r = 1; }
        }
    }
    cm_leave(m);
    return r;
}

/* ------------------------------------------------------------ lifecycle */

static int cm_init(cm_map *m, uint32_t capacity) {
    memset(m, 0, sizeof(*m));
    if (capacity < CM_MIN_CAPACITY) capacity = CM_MIN_CAPACITY;
    if (capacity > CM_MAX_CAPACITY) capacity = CM_MAX_CAPACITY;
    uint32_t c = CM_MIN_CAPACITY;
    while (c < capacity) c <<= 1;
    if (cm_table_init(&m->primary, c) < 0) return -1;
    cm_set_threshold(m, c);
    m->next_unused = 1; /* index 0 means "none" */
    m->sweep.phase = 2;
    m->sweep.pos = 0;
    return 0;
}

static void cm_free_table_entries(cm_map *m, cm_table *t, uint32_t from) {
    if (!t->capacity) return;
    for (uint32_t b = from; b < t->capacity; b++) {
        for (uint32_t i = cm_slot_get(t, b); i;) {
            uint32_t n = cm_E(m, i)->next;
            cm_entry_free(m, i);
            i = n;
        }
    }
}

static void cm_free_table_pages(cm_map *m, cm_table *t) {
    if (!t->pages) return;
    for (uint32_t pi = 0; pi < t->npages; pi++)
        if (t->pages[pi]) cm_page_free(m, t->pages[pi]);
    PyMem_RawFree(t->pages);
    t->pages = NULL;
}

/* Frees everything. Live snapshots hold the map alive, so none remain here;
 * any leftover retire lists are freed too for safety. */
static void cm_dealloc(cm_map *m) {
    m->busy = 1;
    cm_free_table_entries(m, &m->primary, m->rehash_index);
    cm_free_table_entries(m, &m->rehash, 0);
    while (m->nsnaps) cm_release_now(m, m->snaps[m->nsnaps - 1].version);
    cm_reclaim_some(m, (size_t)-1);
    PyMem_RawFree(m->rq);
    m->rq = NULL;
    cm_free_table_pages(m, &m->primary);
    cm_free_table_pages(m, &m->rehash);
    for (uint32_t c = 0; c < m->nchunks; c++) cm_ha_free(m->chunks[c], cm_chunk_bytes(c));
    PyMem_RawFree(m->chunks);
    m->chunks = NULL;
    PyMem_RawFree(m->freed.a);
    m->freed.a = NULL; m->freed.n = m->freed.cap = 0;
    PyMem_RawFree(m->snaps);
    PyMem_RawFree(m->pending_release.a);
    m->nchunks = 0; m->snaps = NULL; m->nsnaps = 0;
    m->busy = 0;
    cm_grave_empty(&m->grave);
    PyMem_RawFree(m->grave.a);
    m->grave.a = NULL;
    Py_CLEAR(m->copier);
}

static inline uint32_t cm_nfree(const cm_map *m) { return (uint32_t)m->freed.n; }

static size_t cm_bytes(const cm_map *m) {
    size_t b = (size_t)cm_chunk_start(m->nchunks) * sizeof(cm_entry) + m->chunks_cap * sizeof(void *);
    b += m->freed.cap * sizeof(uint32_t);
    b += (size_t)m->npages_live * sizeof(cm_page);
    /* slot bytes: pages of the live tables are full-size; retired pages too */
    b += (size_t)m->npages_live * (sizeof(uint32_t) << (m->primary.page_shift));
    b += (size_t)m->primary.npages * sizeof(void *) + (size_t)m->rehash.npages * sizeof(void *);
    return b;
}

#endif /* COWMAP_CORE_H */
