/*
 * cowmap core, part 1 of 10: the memory layout, and the helpers every other
 * part uses.
 *
 * The sizes (bucket pages, entry chunks, rehash and reclaim steps), the
 * structs (cm_entry, cm_page, cm_table, cm_map, cm_probe, the vectors and the
 * snapshot bookkeeping), the bucket hash (cm_composite, Flink's compositeHash
 * with the namespace mixed first), entry indices (cm_E), the prefetch helpers
 * and the deferred DECREFs (cm_bury, the grave). It is a part of its own
 * because it is the vocabulary of both maps: flatmap.h stores the same
 * cm_entry, hashes with cm_composite and releases objects through the same
 * grave, so a change here changes both; and nothing here changes a table,
 * an entry or a snapshot.
 *
 * Compiled only as part of cowmap_core.h, which includes the parts in order.
 */
#ifndef COWMAP_CM_LAYOUT_H
#define COWMAP_CM_LAYOUT_H

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
#define CM_NOINLINE __attribute__((noinline))
#else
#define CM_ALWAYS_INLINE
#define CM_NOINLINE
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

/* What left a map since the last checkpoint cut (incremental checkpoints):
 * each removed entry's hash, key and namespace, their references held (state
 * NULL). `lost`: a removal could not be logged (out of memory, or the log
 * outgrew its map: cm_gone_add), so the changes are incomplete and the next
 * checkpoint must be a full one. */
typedef struct {
    cm_entry *a;
    size_t n, cap;
    int lost;
} cm_gonelog;

/* Items reclaimed at release itself, and per later operation: a release never
 * pays for more than this at once, however much the snapshot kept alive. */
#define CM_RECLAIM_EAGER 4096u
#define CM_RECLAIM_PER_OP 32u

/* Position of an incremental visit; tolerant of rehash (see cm_visit_next in cm_ttl.h). */
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
    uint64_t serial;      /* unique among the maps of the process (cm_init): a map at a freed one's address is another */
    cm_entry **chunks;
    uint32_t nchunks, chunks_cap;
    uint32_t next_unused; /* next never-used entry index */
    cm_u32vec freed;      /* free entry indices, a stack (cm_entry_alloc, cm_storage.h) */
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
    /* Expiry bounds (cm_ts_note): no live entry has a ts below ts_floor, so
     * while ts_floor has not expired no entry has, and a sweep has nothing
     * to look for (a sweep costs what expires, not what is stored).
     * round_min: the least ts written, or seen by the sweep, since its round
     * began; a round that visited the whole map makes it the new floor. */
    int64_t ts_floor, round_min;
    /* Changes since the last checkpoint cut (cm_changes.h), NULL = not tracked:
     * a bit per entry index, set while the entry is live and was written since
     * the cut (dbits bits, grown on demand); removals are in `gone` */
    uint64_t *dirty;
    uint32_t dbits;
    cm_gonelog gone;
} cm_map;

typedef struct {
    PyObject *key;   /* may be NULL for an int probe that came from an int64 array */
    int64_t ikey;
    int is_int;
    PyObject *ns;
    uint32_t hash;
} cm_probe;

/* ------------------------------------------------------------------ utils */

/* Every write of an entry's ts passes here (see cm_map.ts_floor). round_min
 * is never below ts_floor, so one compare suffices for most writes. */
CM_ALWAYS_INLINE static inline void cm_ts_note(cm_map *m, int64_t ts) {
    if (CM_UNLIKELY(ts < m->round_min)) {
        m->round_min = ts;
        if (ts < m->ts_floor) m->ts_floor = ts;
    }
}

/* An id of the calling thread, recorded by every call that makes a map busy so
 * cm_busy_error can tell a re-entrant call from another thread's: the address
 * of a thread-local byte, one instruction on ELF platforms (the initial-exec
 * model needs no call to find it), where PyThread_get_thread_ident costs two
 * calls per operation (a snapshot of 128 key-group maps: ~1 us). Unique among
 * live threads, which is all the check needs. glibc only: musl cannot load a
 * module with initial-exec thread-locals through dlopen. */
#if defined(__GNUC__) && defined(__ELF__) && defined(__GLIBC__)
static __thread char cm_tls_anchor __attribute__((tls_model("initial-exec")));
static inline unsigned long cm_thread_id(void) { return (unsigned long)(uintptr_t)&cm_tls_anchor; }
#else
static inline unsigned long cm_thread_id(void) { return PyThread_get_thread_ident(); }
#endif

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

/* Entry i of a map whose chunk table is `chunks`. */
CM_ALWAYS_INLINE static inline cm_entry *cm_E_in(cm_entry *const *chunks, uint32_t i) {
    if (CM_LIKELY(i >= CM_GEO_END)) {
        uint32_t d = i - CM_GEO_END;
        return chunks[CM_GEO_CHUNKS + (d >> CM_BIG_BITS)] + (d & ((1u << CM_BIG_BITS) - 1u));
    }
    uint32_t c = cm_chunk_of(i);
    return chunks[c] + (i - cm_chunk_start(c));
}

CM_ALWAYS_INLINE static inline cm_entry *cm_E(const cm_map *m, uint32_t i) { return cm_E_in(m->chunks, i); }

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

/* An int state kept in the entry itself, with no int object: the `state`
 * pointer's low bit set (an object's address is even), the value in the other
 * 63 bits. The column writes store int64 numbers so (cm_tag_int), which makes
 * a column read, fold or checkpoint export of them touch the entry alone,
 * never an object elsewhere in memory; anything that hands a state to Python
 * makes it an int there (cm_state_ref). Only maps written by the column calls
 * (CopyOnWriteStateMap) hold them, never FlatStateMap. */
#define CM_TAG_MIN (-((int64_t)1 << 62))
#define CM_TAG_MAX (((int64_t)1 << 62) - 1)
static inline int cm_tagged(const void *s) { return ((uintptr_t)s & 1u) != 0; }
static inline int64_t cm_tag_value(const void *s) { return (int64_t)(intptr_t)s >> 1; }
/* v within [CM_TAG_MIN, CM_TAG_MAX] */
static inline PyObject *cm_tag_int(int64_t v) { return (PyObject *)(uintptr_t)(((uint64_t)v << 1) | 1u); }
static inline int cm_taggable(int64_t v) { return v >= CM_TAG_MIN && v <= CM_TAG_MAX; }

/* Request state s's object for a write (its refcount), when it is one: a
 * tagged int is no address, and a prefetch of one costs a page walk. */
CM_ALWAYS_INLINE static inline void cm_prefetch_state(const PyObject *s) {
    if (!cm_tagged(s)) CM_PREFETCH_W(s);
}

/* A new reference to state s: s itself, or a tagged int made an int. NULL
 * (MemoryError) only for a tagged int. */
static inline PyObject *cm_state_ref(PyObject *s) {
    if (cm_tagged(s)) return PyLong_FromLongLong(cm_tag_value(s));
    Py_INCREF(s);
    return s;
}

/* Release a reference a map held. A DECREF that cannot free the object runs
 * no Python code, so it is done now, while the object is likely in cache; a
 * last reference waits in `grave` until the map is consistent again
 * (cm_grave_empty, from cm_leave or fm_leave). */
static inline void cm_bury(cm_ptrvec *grave, PyObject *o) {
    if (cm_tagged(o)) return; /* no object */
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

/* ------------------------------------------------- changes since a cut */

static inline void cm_bit_set(uint64_t *bits, uint32_t i) { bits[i >> 6] |= (uint64_t)1 << (i & 63u); }

/* Whether a state handed to a reader may be changed in place by it (anything
 * but the immutable built-ins): such a read counts as a write for the changes
 * since a cut, as the caller may mutate the object without writing it back. */
static inline int cm_mutable_state(PyObject *o) {
    return !(cm_tagged(o) || o == Py_None || PyLong_CheckExact(o) || PyFloat_CheckExact(o) || PyUnicode_CheckExact(o) ||
             PyBytes_CheckExact(o) || PyTuple_CheckExact(o) || PyBool_Check(o));
}

/* Gives up a removal log: its references to `grave` (the map's: they may be
 * the last ones), the log lost. */
static void cm_gone_drop(cm_gonelog *g, cm_ptrvec *grave) {
    for (size_t i = 0; i < g->n; i++) {
        if (!cm_intkey(&g->a[i])) cm_bury(grave, g->a[i].key.obj);
        cm_bury(grave, g->a[i].ns);
    }
    g->n = 0;
    g->lost = 1;
}

/* Logs removed entry e (its key and namespace, referenced anew), for a map
 * of `size` entries. A log that outgrows twice the map (keys written and
 * removed over and over between two checkpoints) is given up: a full
 * checkpoint then costs less than its tombstones, and memory stays bounded. */
static void cm_gone_add(cm_gonelog *g, const cm_entry *e, size_t size, cm_ptrvec *grave) {
    if (g->lost) return;
    if (g->n >= 2u * size + 4096u) { cm_gone_drop(g, grave); return; }
    if (g->n == g->cap) {
        cm_entry *na = (cm_entry *)cm_vec_grow(g->a, &g->cap, sizeof(cm_entry));
        if (!na) { cm_gone_drop(g, grave); return; }
        g->a = na;
    }
    cm_entry *d = &g->a[g->n++];
    memset(d, 0, sizeof *d);
    d->hash = e->hash;
    d->key = e->key;
    d->ns = e->ns;
    if (!cm_intkey(e)) Py_INCREF(e->key.obj);
    Py_INCREF(e->ns);
}

/* Frees a log and drops its references. The objects may run code when
 * freed: call with the map consistent. */
static void cm_gone_free(cm_gonelog *g) {
    size_t n = g->n;
    g->n = 0;
    g->lost = 0;
    for (size_t i = 0; i < n; i++) {
        if (!cm_intkey(&g->a[i])) Py_DECREF(g->a[i].key.obj);
        Py_DECREF(g->a[i].ns);
    }
    PyMem_RawFree(g->a);
    g->a = NULL;
    g->cap = 0;
}

/* The most bits of changes a map keeps: whole words, all but the last 63 indices */
#define CM_DIRTY_MOST ((((uint64_t)1) << 32) - 64u)

/* The bits grown to hold index i (zeroed); out of memory, the changes are
 * given up as lost (the next checkpoint is a full one), no error. */
static CM_NOINLINE void cm_dirty_grow(cm_map *m, uint32_t i) {
    uint64_t want = (uint64_t)m->dbits * 2u;
    if (want <= i) want = (uint64_t)i + 1u;
    want = (want + 63u) & ~(uint64_t)63u;
    if (want > CM_DIRTY_MOST) want = CM_DIRTY_MOST;
    uint64_t *nb = i < want ? (uint64_t *)PyMem_RawRealloc(m->dirty, (size_t)(want >> 3)) : NULL;
    if (!nb) {
        cm_gone_drop(&m->gone, &m->grave);
        return;
    }
    memset(nb + (m->dbits >> 6), 0, (size_t)((want - m->dbits) >> 3));
    m->dirty = nb;
    m->dbits = (uint32_t)want;
}

/* Entry i (live in the map) was (or is about to be) written. */
static inline void cm_changed(cm_map *m, uint32_t i) {
    if (!m->dirty) return;
    if (CM_UNLIKELY(i >= m->dbits)) {
        cm_dirty_grow(m, i);
        if (i >= m->dbits) return; /* lost */
    }
    cm_bit_set(m->dirty, i);
}

/* The index of entry x, on the chain from entry `head` (0 if it is not there). */
static inline uint32_t cm_index_of(const cm_map *m, uint32_t head, const cm_entry *x) {
    while (head && cm_E(m, head) != x) head = cm_E(m, head)->next;
    return head;
}

/* Entry i leaves the live map (removed, or replaced by its copy). */
static inline void cm_unchanged(cm_map *m, uint32_t i) {
    if (m->dirty && i < m->dbits) m->dirty[i >> 6] &= ~((uint64_t)1 << (i & 63u));
}

static inline int cm_is_changed(const cm_map *m, uint32_t i) {
    return m->dirty && i < m->dbits && (m->dirty[i >> 6] >> (i & 63u)) & 1u;
}

#endif /* COWMAP_CM_LAYOUT_H */
