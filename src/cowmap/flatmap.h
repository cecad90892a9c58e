/*
 * FlatStateMap: a copy-on-write state map with its entries inline in an
 * open-addressed table, for maps too big for the CPU caches that are read one
 * key at a time (MapState's user entries).
 *
 * Why a second map: a lookup in the chained CopyOnWriteStateMap reads the
 * bucket's slot and then the entry the slot names, two dependent cache misses
 * that cost ~300-450 ns each in a map of gigabytes. Here the entry sits in the
 * slot (linear probing), so a lookup costs one miss. A prototype of it, in
 * figure 7's setup at 50M user entries, gave 811 ns per access against 1,466
 * for the chained map (1.52 against 2.68 times the 1-entry/key figure).
 *
 * Layout. The table is split into segments (extendible hashing): a directory
 * of 2^gdepth segment pointers indexed by the hash's top bits; a segment of
 * local depth d holds the keys whose top d bits are its own. A segment grows by
 * doubling up to 2^max_shift slots, then splits in two by the next hash bit, so
 * no resize copies more than one segment (no stop-the-world pause beyond a few
 * hundred microseconds at the default size).
 *
 * Snapshots copy on write per page of FM_PAGE entries. Every page records the
 * map version of its last write (pver). A snapshot takes the version and
 * holds a reference to each segment of the directory; before a write to a page
 * whose last write is at or before the newest live snapshot's version, the page
 * is saved (its objects referenced anew) in a copy that serves the snapshots
 * of versions [pver, now). A snapshot reads a page live when the page was last
 * written at or before its version, else from the copy covering its version.
 * Segments that resizes replace live on while a snapshot holds them, unchanged.
 * States shared with a snapshot are copied on read when a copier is set,
 * exactly as in the chained map (the entry's sv is the version its state was
 * set at; shared while sv <= the newest live snapshot's version).
 *
 * Entries remember the order they were added in: the chained map's `next`
 * and `ev`, unused here, hold a sequence number the map counts up per insert,
 * so a snapshot can be read in insertion order (fm_snap_order).
 *
 * Deletion shifts the rest of the probe run back (no tombstones). Objects the
 * map lets go of are DECREFed once it is consistent again (fm_leave), as a
 * DECREF may run arbitrary code. The `busy` flag turns away re-entrant use.
 *
 * This file is part 1 of 2: the layout, the operations and the TTL sweep.
 * Part 2, fm_snapshot.h (included at the end), reads snapshots and the
 * changes since a checkpoint cut.
 */
#ifndef COWMAP_FLATMAP_H
#define COWMAP_FLATMAP_H

#include <stdlib.h>
#include "cowmap_core.h"

#define FM_PAGE_SHIFT 8u                /* entries per copy-on-write page: 256 (12 KiB) */
#define FM_MIN_SHIFT 3u                 /* a new map's segment: 8 slots */
#define FM_MAX_SHIFT_DEFAULT 13u        /* segments split rather than grow past 8,192 slots */
#define FM_HASH_BITS 31u                /* cm_composite's hashes */
#define FM_MAX_GDEPTH 24u

/* A page's entries saved for the snapshots of versions [from, to). */
typedef struct fm_copy {
    struct fm_copy *next;
    uint32_t from, to;
    cm_entry e[];
} fm_copy;

typedef struct {
    Py_ssize_t refs;   /* the live directory (1 while the map uses it) + snapshots holding it */
    uint32_t shift;    /* log2 of the slot count */
    uint32_t depth;    /* top hash bits all its keys share */
    uint32_t count;
    uint32_t npages;
    uint32_t *pver;    /* per page: map version of its last write */
    fm_copy **copies;  /* per page: saved contents, newest first; NULL until a save */
    cm_entry *e;       /* a slot is empty when its state is NULL */
    uint64_t *dirty;   /* while the map tracks changes: a bit per home slot written
                        * since the last checkpoint cut (fm_changed) */
} fm_seg;

/* A directory slot: what a lookup needs of its segment in 8 bytes, its entry
 * array's address with log2 of its slot count in the top bits (user-space
 * addresses stay below 2^58; fm_seg_new checks), so that finding the key's slot
 * reads no segment header and the directory stays small for the caches: a
 * 50M-entry MapState has ~16,000 slots over its 128 maps. */
typedef uint64_t fm_dent;
#define FM_DENT_SHIFT 58u

typedef struct {
    fm_dent *dir;      /* 1 << gdepth slots; a segment of depth d fills 2^(gdepth-d) in a row */
    fm_seg **segs;     /* the segment of each directory slot (for writes) */
    uint32_t gdepth;
    uint32_t max_shift;
    uint32_t size;
    uint64_t slots;    /* of all the directory's segments: bounds a sweep call */
    uint32_t version;  /* starts at 1; a snapshot takes it and it moves on */
    uint32_t required; /* the newest live snapshot's version, 0 = none */
    cm_u32vec snaps;   /* live snapshot versions, ascending */
    uint64_t mod_count;
    uint64_t seq;      /* the insertion sequence number of the next new entry */
    PyObject *copier;  /* borrowed from the Python object; NULL = immutable states */
    int busy;
    unsigned long owner; /* while busy: the thread that made it so (cm_busy_error) */
    cm_ptrvec grave;
    uint32_t sweep_dir, sweep_slot; /* incremental sweep position */
    /* No live entry has a ts below it (as cm_map.ts_floor): lowered by every
     * ts written (fm_ts_note), raised by a full sweep; while it has not
     * expired, sweeps have nothing to look for. */
    int64_t ts_floor;
    int tracking;      /* changes since a checkpoint cut are recorded (segments' dirty bits) */
    cm_gonelog gone;   /* entries removed since the cut */
} fm_map;

typedef struct {
    uint32_t version;
    uint32_t size;
    uint32_t nsegs;
    fm_seg **segs;     /* distinct segments, a reference each */
} fm_snap;

static inline uint32_t fm_cap(const fm_seg *s) { return 1u << s->shift; }
static inline uint32_t fm_page_len(const fm_seg *s) {
    return s->shift < FM_PAGE_SHIFT ? fm_cap(s) : 1u << FM_PAGE_SHIFT;
}
static inline int fm_used(const cm_entry *e) { return e->state != NULL; }
static inline uint32_t fm_hash(const cm_entry *e) { return e->hash & CM_HMASK; }
static inline uint64_t fm_seq(const cm_entry *e) { return (uint64_t)e->ev << 32 | e->next; }
static inline void fm_set_seq(cm_entry *e, uint64_t seq) {
    e->next = (uint32_t)seq;
    e->ev = (uint32_t)(seq >> 32);
}

static inline uint32_t fm_dir_index(const fm_map *m, uint32_t h) {
    return m->gdepth ? h >> (FM_HASH_BITS - m->gdepth) : 0;
}

static inline cm_entry *fm_dent_e(fm_dent d) { return (cm_entry *)(uintptr_t)(d & (((uint64_t)1 << FM_DENT_SHIFT) - 1u)); }
static inline uint32_t fm_dent_mask(fm_dent d) { return (1u << (uint32_t)(d >> FM_DENT_SHIFT)) - 1u; }

static inline fm_seg *fm_seg_for(const fm_map *m, uint32_t h) {
    return m->segs[fm_dir_index(m, h)];
}

/* ------------------------------------------------------------ ownership */

static inline void fm_grave(fm_map *m, PyObject *o) { cm_bury(&m->grave, o); }

static void fm_entry_incref(const cm_entry *e) {
    if (!cm_intkey(e)) Py_INCREF(e->key.obj);
    Py_INCREF(e->ns);
    Py_INCREF(e->state);
}

/* ------------------------------------------------------------- segments */

static void fm_seg_free_empty(fm_seg *s) {
    PyMem_RawFree(s->dirty);
    PyMem_RawFree(s->pver);
    cm_ha_free(s->e, (size_t)fm_cap(s) * sizeof(cm_entry));
    PyMem_RawFree(s);
}

static fm_seg *fm_seg_new(uint32_t shift, uint32_t depth, uint32_t version) {
    fm_seg *s = PyMem_RawCalloc(1, sizeof(fm_seg));
    if (!s) { PyErr_NoMemory(); return NULL; }
    s->shift = shift;
    s->depth = depth;
    s->refs = 1;
    s->npages = fm_cap(s) / fm_page_len(s);
    s->pver = PyMem_RawMalloc(s->npages * sizeof(uint32_t));
    s->e = cm_ha_alloc((size_t)fm_cap(s) * sizeof(cm_entry), 1);
    if (!s->pver || !s->e) {
        if (!s->pver) PyErr_NoMemory();
        fm_seg_free_empty(s);
        return NULL;
    }
    if ((uint64_t)(uintptr_t)s->e >> FM_DENT_SHIFT) { /* no room for the shift in a directory slot */
        fm_seg_free_empty(s);
        PyErr_SetString(PyExc_MemoryError, "FlatStateMap: a segment was mapped above 2**58");
        return NULL;
    }
    for (uint32_t p = 0; p < s->npages; p++) s->pver[p] = version;
    return s;
}

static void fm_copy_free(fm_map *m, const fm_seg *s, fm_copy *c) {
    uint32_t n = fm_page_len(s);
    for (uint32_t i = 0; i < n; i++)
        if (fm_used(&c->e[i])) cm_bury_entry(&m->grave, &c->e[i]);
    PyMem_RawFree(c);
}

/* Frees a segment no one holds; with `owned`, its entries' references go too
 * (without, they were handed on to the segments that replaced it). */
static void fm_seg_free(fm_map *m, fm_seg *s, int owned) {
    uint32_t cap = fm_cap(s);
    if (owned)
        for (uint32_t i = 0; i < cap; i++)
            if (fm_used(&s->e[i])) cm_bury_entry(&m->grave, &s->e[i]);
    if (s->copies) {
        for (uint32_t p = 0; p < s->npages; p++) {
            fm_copy *c = s->copies[p];
            while (c) { fm_copy *n = c->next; fm_copy_free(m, s, c); c = n; }
        }
        PyMem_RawFree(s->copies);
    }
    cm_ha_free_ex(s->e, (size_t)cap * sizeof(cm_entry), 0);
    PyMem_RawFree(s->pver);
    PyMem_RawFree(s->dirty);
    PyMem_RawFree(s);
}

static void fm_seg_decref(fm_map *m, fm_seg *s) {
    if (--s->refs == 0) fm_seg_free(m, s, 1);
}

/* ------------------------------------------------- changes since a cut */

static inline size_t fm_dirty_words(const fm_seg *s) { return (fm_cap(s) + 63u) >> 6; }

/* An entry of hash h was (or is about to be) written. A segment
 * without its bits while tracking (out of memory when it was made) loses the
 * changes: the next checkpoint is then a full one. */
static inline void fm_changed(fm_map *m, uint32_t h) {
    if (!m->tracking) return;
    fm_seg *s = fm_seg_for(m, h & CM_HMASK);
    if (s->dirty) cm_bit_set(s->dirty, h & (fm_cap(s) - 1u));
    else m->gone.lost = 1;
}

/* Fresh (zeroed) dirty bits for segment s; -1 out of memory (no error set). */
static int fm_seg_track(fm_seg *s) {
    uint64_t *b = PyMem_RawCalloc(fm_dirty_words(s), sizeof(uint64_t));
    if (!b) return -1;
    PyMem_RawFree(s->dirty);
    s->dirty = b;
    return 0;
}

/* The dirty bits of s carried to x, which takes some of s's entries (a
 * segment of at least s's size: a home slot h of s is h + j * cap(s) in x). */
static void fm_dirty_carry(fm_map *m, const fm_seg *s, fm_seg *x) {
    if (!m->tracking || !x) return;
    if (!s->dirty || (!x->dirty && fm_seg_track(x) < 0)) { m->gone.lost = 1; return; }
    uint32_t cs = fm_cap(s), cx = fm_cap(x);
    for (size_t w = 0; w < fm_dirty_words(s); w++)
        for (uint64_t bits = s->dirty[w]; bits; bits &= bits - 1u) {
            uint32_t h = (uint32_t)(w << 6) | (uint32_t)__builtin_ctzll(bits);
            for (uint32_t j = h; j < cx; j += cs) cm_bit_set(x->dirty, j);
        }
}

/* Before slot i of s changes: saves its page for the live snapshots that still
 * read it (those of versions >= its last write). 0, or -1 out of memory. */
static int fm_touch(fm_map *m, fm_seg *s, uint32_t i) {
    /* No live snapshot: nothing to save, and the page's stamp may stay old (a
     * later snapshot's first write to it then saves a copy for versions from
     * that stamp on, all of which saw the page as it is now). This keeps the
     * segment header out of a write's cache misses. */
    if (CM_LIKELY(!m->required)) return 0;
    uint32_t p = i >> FM_PAGE_SHIFT;
    if (s->pver[p] > m->required) return 0;
    uint32_t n = fm_page_len(s);
    if (!s->copies) {
        s->copies = PyMem_RawCalloc(s->npages, sizeof(fm_copy *));
        if (!s->copies) { PyErr_NoMemory(); return -1; }
    }
    fm_copy *c = PyMem_RawMalloc(sizeof(fm_copy) + (size_t)n * sizeof(cm_entry));
    if (!c) { PyErr_NoMemory(); return -1; }
    cm_entry *src = &s->e[(size_t)p << FM_PAGE_SHIFT];
    memcpy(c->e, src, (size_t)n * sizeof(cm_entry));
    for (uint32_t k = 0; k < n; k++)
        if (fm_used(&c->e[k])) fm_entry_incref(&c->e[k]);
    c->from = s->pver[p];
    c->to = m->version;
    c->next = s->copies[p];
    s->copies[p] = c;
    s->pver[p] = m->version;
    return 0;
}

/* Slot i of segment s as snapshot version v sees it. */
static inline const cm_entry *fm_snap_slot(const fm_seg *s, uint32_t i, uint32_t v) {
    uint32_t p = i >> FM_PAGE_SHIFT;
    if (s->pver[p] <= v) return &s->e[i];
    for (const fm_copy *c = s->copies ? s->copies[p] : NULL; c; c = c->next)
        if (c->from <= v && v < c->to) return &c->e[i & ((1u << FM_PAGE_SHIFT) - 1u)];
    return NULL; /* unreachable while the invariants hold */
}

/* ------------------------------------------------------------- the map */

static inline void fm_set_dent(fm_map *m, uint32_t k, fm_seg *s) {
    m->dir[k] = (uint64_t)(uintptr_t)s->e | ((uint64_t)s->shift << FM_DENT_SHIFT);
    m->segs[k] = s;
}

static int fm_init(fm_map *m, uint32_t max_shift) {
    memset(m, 0, sizeof(*m));
    m->version = 1;
    m->max_shift = max_shift;
    m->ts_floor = INT64_MAX; /* no entry */
    m->dir = PyMem_RawMalloc(sizeof(fm_dent));
    m->segs = PyMem_RawMalloc(sizeof(fm_seg *));
    fm_seg *s = m->dir && m->segs ? fm_seg_new(FM_MIN_SHIFT < max_shift ? FM_MIN_SHIFT : max_shift, 0, m->version) : NULL;
    if (!s) {
        if (!m->dir || !m->segs) PyErr_NoMemory();
        PyMem_RawFree(m->dir); PyMem_RawFree(m->segs);
        m->dir = NULL; m->segs = NULL;
        return -1;
    }
    fm_set_dent(m, 0, s);
    m->slots = fm_cap(s);
    return 0;
}

static int fm_enter(fm_map *m) {
    if (CM_UNLIKELY(m->busy))
        return cm_busy_error("FlatStateMap", "a key's __eq__/__hash__ or a copier", m->owner);
    m->busy = 1;
    m->owner = cm_thread_id();
    return 0;
}

static void fm_leave(fm_map *m) {
    m->busy = 0;
    cm_grave_empty(&m->grave);
}

/* Directory slots of the run segment dir[k] fills (k its first). */
static inline uint32_t fm_run(const fm_map *m, uint32_t k) { return 1u << (m->gdepth - m->segs[k]->depth); }

static void fm_dealloc(fm_map *m) {
    if (!m->dir) return;
    m->busy = 1;
    for (uint32_t k = 0, run; k < (1u << m->gdepth); k += run) {
        run = fm_run(m, k);
        fm_seg_decref(m, m->segs[k]);
    }
    PyMem_RawFree(m->dir);
    PyMem_RawFree(m->segs);
    m->dir = NULL;
    m->segs = NULL;
    PyMem_RawFree(m->snaps.a);
    m->snaps.a = NULL;
    fm_leave(m);
    m->tracking = 0;
    cm_gone_free(&m->gone);
    PyMem_RawFree(m->grave.a);
    m->grave.a = NULL;
}

/* 1 found at *slot, 0 absent (*slot = the empty slot ending the run), -1 error. */
CM_ALWAYS_INLINE static inline int fm_find(fm_dent d, const cm_probe *p, uint32_t *slot) {
    const cm_entry *E = fm_dent_e(d);
    uint32_t mask = fm_dent_mask(d), i = p->hash & mask;
    for (;;) {
        const cm_entry *e = &E[i];
        if (!fm_used(e)) { *slot = i; return 0; }
        int r = cm_match(e, p);
        if (r) { *slot = i; return r; }
        i = (i + 1u) & mask;
    }
}

/* The home slot of hash h: where a lookup of h starts probing. */
static inline const cm_entry *fm_home(const fm_map *m, uint32_t h) {
    fm_dent d = m->dir[fm_dir_index(m, h)];
    return &fm_dent_e(d)[h & fm_dent_mask(d)];
}

/* The lines of the key's home slot and the two after it: at loads up to 3/4
 * linear probing finds a key ~1.5 slots past its home on average (three
 * prefetched entries gave 3.5% off figure 7 at 50M entries against one).
 * Forced inline, as every prefetch helper: out of line GCC deletes its calls
 * (benches/test_bench_hints.py guards this). */
CM_ALWAYS_INLINE static inline void fm_prefetch(const fm_map *m, uint32_t h) {
    /* integer arithmetic: near a segment's end these addresses lie past its
     * array, which a prefetch may name but a pointer may not */
    uintptr_t a = (uintptr_t)fm_home(m, h);
    CM_PREFETCH((const void *)a);
    CM_PREFETCH((const void *)(a + 64u));
    CM_PREFETCH((const void *)(a + 3u * sizeof(cm_entry) - 1u));
}

/* Puts entry e (its references handed over) into fresh segment s, which has room. */
static void fm_place(fm_seg *s, const cm_entry *e) {
    uint32_t mask = fm_cap(s) - 1u, i = fm_hash(e) & mask;
    while (fm_used(&s->e[i])) i = (i + 1u) & mask;
    s->e[i] = *e;
    s->count++;
}

/* Replaces the directory's segment s by `a` (and `b` for the upper half of
 * its run, when splitting); the entries of s move, or are referenced anew if a
 * snapshot still holds s. */
static int fm_replace_seg(fm_map *m, fm_seg *s, fm_seg *a, fm_seg *b) {
    uint32_t cap = fm_cap(s);
    int shared = s->refs > 1;
    uint32_t bit = b ? FM_HASH_BITS - 1u - s->depth : 0;
    fm_dirty_carry(m, s, a);
    fm_dirty_carry(m, s, b);
    PyMem_RawFree(s->dirty); /* a snapshot holding s never reads them */
    s->dirty = NULL;
    for (uint32_t i = 0; i < cap; i++) {
        const cm_entry *e = &s->e[i];
        if (!fm_used(e)) continue;
        if (shared) fm_entry_incref(e);
        fm_place(b && (fm_hash(e) >> bit) & 1u ? b : a, e);
    }
    /* the run of directory slots that pointed at s */
    uint32_t run = 1u << (m->gdepth - s->depth), first = 0;
    while (m->segs[first] != s) first += run;
    for (uint32_t k = 0; k < run; k++) fm_set_dent(m, first + k, (b && k >= run / 2) ? b : a);
    m->slots += fm_cap(a) + (b ? fm_cap(b) : 0u) - (uint64_t)cap;
    if (shared) s->refs--;
    else fm_seg_free(m, s, 0);
    return 0;
}

/* Whether splitting s would leave one half empty: its keys all agree on the
 * next hash bit (hashes that collide by design). Then it doubles instead, so
 * that memory stays in proportion to the entries. */
static int fm_split_useless(const fm_seg *s) {
    uint32_t bit = FM_HASH_BITS - 1u - s->depth, ones = 0, cap = fm_cap(s);
    for (uint32_t i = 0; i < cap; i++)
        if (fm_used(&s->e[i])) ones += (fm_hash(&s->e[i]) >> bit) & 1u;
    return ones == 0 || ones == s->count;
}

/* Grows or splits segment s (over its load limit). 0, or -1 with an error set
 * (out of memory: the map unchanged, still correct, only fuller). */
static int fm_grow(fm_map *m, fm_seg *s) {
    if (s->shift < m->max_shift || s->depth >= FM_MAX_GDEPTH || fm_split_useless(s)) {
        if (s->shift >= 30u) { PyErr_NoMemory(); return -1; }
        fm_seg *a = fm_seg_new(s->shift + 1u, s->depth, m->version);
        if (!a) return -1;
        return fm_replace_seg(m, s, a, NULL);
    }
    if (s->depth == m->gdepth) { /* double the directory */
        uint32_t n = 1u << m->gdepth;
        fm_dent *d = PyMem_RawMalloc(2u * n * sizeof(fm_dent));
        fm_seg **sg = d ? PyMem_RawMalloc(2u * n * sizeof(fm_seg *)) : NULL;
        if (!sg) { PyMem_RawFree(d); PyErr_NoMemory(); return -1; }
        for (uint32_t k = 0; k < n; k++) {
            d[2u * k] = d[2u * k + 1u] = m->dir[k];
            sg[2u * k] = sg[2u * k + 1u] = m->segs[k];
        }
        PyMem_RawFree(m->dir);
        PyMem_RawFree(m->segs);
        m->dir = d;
        m->segs = sg;
        m->gdepth++;
        /* the sweep position keeps its place in hash order */
        m->sweep_dir *= 2u;
    }
    fm_seg *a = fm_seg_new(s->shift, s->depth + 1u, m->version);
    fm_seg *b = a ? fm_seg_new(s->shift, s->depth + 1u, m->version) : NULL;
    if (!b) { if (a) fm_seg_free(m, a, 0); return -1; }
    return fm_replace_seg(m, s, a, b);
}

static inline int fm_over(const fm_seg *s) { return (uint64_t)s->count * 4u > (uint64_t)fm_cap(s) * 3u; }

/* Removes the entry at slot i of s (already made writable), shifting the rest
 * of its probe run back. The entry's references go to the grave first. */
static int fm_delete_at(fm_map *m, fm_seg *s, uint32_t i) {
    uint32_t mask = fm_cap(s) - 1u;
    if (m->tracking) cm_gone_add(&m->gone, &s->e[i], m->size, &m->grave); /* logged, not marked (cm_unlink) */
    cm_bury_entry(&m->grave, &s->e[i]);
    uint32_t j = i;
    for (uint32_t k = (j + 1u) & mask; fm_used(&s->e[k]); k = (k + 1u) & mask) {
        uint32_t home = fm_hash(&s->e[k]) & mask;
        /* k's entry may fill j unless its home lies cyclically in (j, k] */
        int stays = j <= k ? (home > j && home <= k) : (home > j || home <= k);
        if (stays) continue;
        if (fm_touch(m, s, k) < 0) return -1;
        s->e[j] = s->e[k];
        j = k;
    }
    memset(&s->e[j], 0, sizeof(cm_entry));
    s->count--;
    m->size--;
    m->mod_count++;
    return 0;
}

/* Whether a reader must get a copy of e's state: a copier is set and the state
 * was set at or before the newest live snapshot. */
static inline int fm_state_shared(const fm_map *m, const cm_entry *e) {
    return m->copier && e->state != Py_None && e->sv <= m->required;
}

/* fm_touch for slot i of directory slot k's segment, read only when needed. */
static inline int fm_touch_at(fm_map *m, uint32_t k, uint32_t i) {
    return CM_LIKELY(!m->required) ? 0 : fm_touch(m, m->segs[k], i);
}

/* The entry at slot i of directory slot k's segment. */
static inline cm_entry *fm_entry_at(const fm_map *m, uint32_t k, uint32_t i) { return &fm_dent_e(m->dir[k])[i]; }

/* The state of the entry at slot i of directory slot k for a reader: a copy
 * first, stored in the entry, when it is shared with a snapshot and a copier
 * is set. New ref. */
static PyObject *fm_read_state(fm_map *m, uint32_t k, uint32_t i) {
    cm_entry *e = fm_entry_at(m, k, i);
    if (m->tracking && cm_mutable_state(e->state)) fm_changed(m, e->hash);
    if (fm_state_shared(m, e)) {
        PyObject *c = PyObject_CallOneArg(m->copier, e->state);
        if (!c) return NULL;
        if (fm_touch_at(m, k, i) < 0) { Py_DECREF(c); return NULL; }
        fm_grave(m, e->state);
        e->state = c;
        e->sv = m->version;
    }
    Py_INCREF(e->state);
    return e->state;
}

/* ------------------------------------------------------------- operations */

static inline void fm_ts_note(fm_map *m, int64_t ts) {
    if (CM_UNLIKELY(ts < m->ts_floor)) m->ts_floor = ts;
}

/* Overwrites the state (borrowed) and ts of a live entry already made writable. */
static inline void fm_set_state(fm_map *m, cm_entry *e, PyObject *state, int64_t ts) {
    Py_INCREF(state);
    fm_grave(m, e->state);
    e->state = state;
    e->sv = m->version;
    e->ts = ts;
    fm_ts_note(m, ts);
}

/* 1 added, 0 overwritten, -1 error. `state` borrowed. */
static int fm_put(fm_map *m, PyObject *key, PyObject *ns, PyObject *state, int64_t ts) {
    cm_probe p;
    if (fm_enter(m) < 0) return -1;
    if (cm_make_probe(&p, key, ns) < 0) { fm_leave(m); return -1; }
    uint32_t k = fm_dir_index(m, p.hash), i;
    int r = fm_find(m->dir[k], &p, &i);
    if (r >= 0 && fm_touch_at(m, k, i) < 0) r = -1;
    if (r >= 0) fm_changed(m, p.hash);
    fm_seg *s = r == 0 ? m->segs[k] : NULL; /* a new entry: its segment's count */
    if (r == 1) {
        fm_set_state(m, fm_entry_at(m, k, i), state, ts);
        r = 0;
    } else if (r == 0 && s->count + 2u > fm_cap(s)) {
        PyErr_NoMemory(); /* only when growing failed before: keep a slot empty for probes */
        r = -1;
    } else if (r == 0) {
        cm_entry *e = &s->e[i];
        e->hash = p.hash | (p.is_int ? CM_F_INTKEY : 0u);
        fm_set_seq(e, m->seq++);
        if (p.is_int) e->key.i = p.ikey;
        else { Py_INCREF(p.key); e->key.obj = p.key; }
        Py_INCREF(ns);
        e->ns = ns;
        Py_INCREF(state);
        e->state = state;
        e->ts = ts;
        fm_ts_note(m, ts);
        e->sv = m->version;
        s->count++;
        m->size++;
        m->mod_count++;
        r = 1;
        /* a split may leave the key's half over the limit still */
        for (fm_seg *g = s; fm_over(g); g = fm_seg_for(m, p.hash))
            if (fm_grow(m, g) < 0) { PyErr_Clear(); break; } /* out of memory: valid, only fuller */
    }
    fm_leave(m);
    return r;
}

/* Looks up (key, ns): 1 found (*k its directory slot, *slot its slot), 0
 * absent, -1 error. Enters the map before the key's __hash__ runs, as every
 * call does (and leaves it on error). */
static int fm_lookup(fm_map *m, PyObject *key, PyObject *ns, uint32_t *k, uint32_t *slot) {
    cm_probe p;
    if (fm_enter(m) < 0) return -1;
    int r = cm_make_probe(&p, key, ns);
    if (r == 0) {
        *k = fm_dir_index(m, p.hash);
        r = fm_find(m->dir[*k], &p, slot);
    }
    if (r < 0) fm_leave(m);
    return r;
}

/* New ref: the state, None when absent (as cm_get); NULL on error. */
static PyObject *fm_get(fm_map *m, PyObject *key, PyObject *ns) {
    uint32_t k, i;
    int r = fm_lookup(m, key, ns, &k, &i);
    if (r < 0) return NULL;
    PyObject *v = r ? fm_read_state(m, k, i) : Py_NewRef(Py_None);
    fm_leave(m);
    return v;
}

/* TTL read (as cm_get_unexpired): the state (new ref) if live at `now`;
 * `expired` (new ref) when expired, left in place; None when absent. */
static PyObject *fm_get_unexpired(fm_map *m, PyObject *key, PyObject *ns, int64_t now, int64_t ttl,
                                  int refresh, PyObject *expired) {
    uint32_t k, i;
    if (cm_check_ttl(ttl) < 0) return NULL;
    int r = fm_lookup(m, key, ns, &k, &i);
    if (r < 0) return NULL;
    PyObject *v;
    if (!r) {
        v = Py_NewRef(Py_None);
    } else {
        cm_entry *e = fm_entry_at(m, k, i);
        if (cm_expired(e->ts, ttl, now)) {
            Py_INCREF(expired);
            v = expired;
        } else if (refresh && e->ts != now && fm_touch_at(m, k, i) < 0) {
            v = NULL;
        } else {
            if (refresh && e->ts != now) { e->ts = now; fm_ts_note(m, now); fm_changed(m, e->hash); }
            v = fm_read_state(m, k, i);
        }
    }
    fm_leave(m);
    return v;
}

/* 1 present, 0 absent, -1 error. */
static int fm_contains(fm_map *m, PyObject *key, PyObject *ns) {
    uint32_t k, i;
    int r = fm_lookup(m, key, ns, &k, &i);
    if (r >= 0) fm_leave(m);
    return r;
}

/* What a column lookup found for a row (fm_col_lookup). */
enum { FM_COL_ABSENT = 0, FM_COL_LIVE = 1, FM_COL_EXPIRED = 2, FM_COL_OTHER = 3 };
#define FM_CD 32u   /* rows between requesting a row's home slot and deciding it */

/* A column of lookups of int64 pairs, reading only: row i looks up the int
 * key ukeys[i] with the int namespace nss[i] (stored as an int object: the
 * key of MapState's user entries) in maps[kgs[i]] (NULL: absent), all with
 * no Python object made or called. out[i] gets FM_COL_LIVE, FM_COL_ABSENT,
 * FM_COL_EXPIRED (ttl > 0: expired at now, left in place) or FM_COL_OTHER:
 * no entry of the row's int pair, but one of its hash whose key or namespace
 * is no int of int64 (a float or a bool may equal an int), which only the
 * general lookup can decide. Each row's home slot is requested FM_CD rows ahead, and the
 * namespace object of its key's entry FM_CD/2 rows ahead (a third miss: the
 * objects lie anywhere). The caller has entered every map of the rows. */
static void fm_col_lookup(fm_map *const *maps, const int32_t *kgs, const int64_t *ukeys, const int64_t *nss,
                          Py_ssize_t n, int64_t now, int64_t ttl, uint8_t *out) {
    uint32_t ring[2u * FM_CD]; /* the rows' hashes, from request to decision */
    const Py_ssize_t half = (Py_ssize_t)FM_CD / 2;
    for (Py_ssize_t i = 0; i < n + (Py_ssize_t)FM_CD; i++) {
        if (i < n && maps[kgs[i]]) {
            uint32_t hi = cm_composite(cm_int_hash(ukeys[i]), cm_int_hash(nss[i]));
            ring[i & (2u * FM_CD - 1u)] = hi;
            fm_prefetch(maps[kgs[i]], hi);
        }
        Py_ssize_t t = i - half;
        if (t >= 0 && t < n && maps[kgs[t]]) { /* the home slot has arrived: request the first candidate's namespace */
            uint32_t h = ring[t & (2u * FM_CD - 1u)];
            const cm_entry *e = fm_home(maps[kgs[t]], h);
            if (fm_used(e) && fm_hash(e) == h && cm_intkey(e) && e->key.i == ukeys[t]) CM_PREFETCH(e->ns);
        }
        Py_ssize_t j = i - (Py_ssize_t)FM_CD;
        if (j < 0) continue;
        const fm_map *m = maps[kgs[j]];
        out[j] = FM_COL_ABSENT;
        if (!m) continue;
        uint32_t h = ring[j & (2u * FM_CD - 1u)];
        fm_dent d = m->dir[fm_dir_index(m, h)];
        const cm_entry *E = fm_dent_e(d);
        uint32_t mask = fm_dent_mask(d);
        /* an entry of the row's hash that only Python can compare (a key or
         * namespace of another type) leaves the row undecided, unless the run
         * holds the row's own int pair: a map holds one entry per equal pair,
         * so that one is the row's */
        int maybe = 0;
        for (uint32_t s = h & mask;; s = (s + 1u) & mask) {
            const cm_entry *e = &E[s];
            if (!fm_used(e)) { out[j] = maybe ? FM_COL_OTHER : FM_COL_ABSENT; break; }
            if (fm_hash(e) != h) continue;
            if (!cm_intkey(e)) { maybe = 1; continue; }
            if (e->key.i != ukeys[j]) continue;
            if (!PyLong_CheckExact(e->ns)) { maybe = 1; continue; }
            int overflow = 0;
            int64_t v = cm_as_int64(e->ns, &overflow);
            if (overflow || v != nss[j]) continue;
            out[j] = ttl > 0 && cm_expired(e->ts, ttl, now) ? FM_COL_EXPIRED : FM_COL_LIVE;
            break;
        }
    }
}

/* 1 and *ts set when (key, ns) is mapped, 0 absent, -1 error. */
static int fm_timestamp(fm_map *m, PyObject *key, PyObject *ns, int64_t *ts) {
    uint32_t k, i;
    int r = fm_lookup(m, key, ns, &k, &i);
    if (r < 0) return r;
    if (r) *ts = fm_entry_at(m, k, i)->ts;
    fm_leave(m);
    return r;
}

/* Removes (key, ns): 1 removed (*old, when asked, a new ref to its state,
 * copied if shared), 0 absent, -1 error. */
static int fm_remove(fm_map *m, PyObject *key, PyObject *ns, PyObject **old) {
    uint32_t k, i;
    int r = fm_lookup(m, key, ns, &k, &i);
    if (r < 0) return r;
    if (r == 0) { fm_leave(m); return 0; }
    fm_seg *s = m->segs[k];
    if (old) {
        cm_entry *e = &s->e[i];
        *old = fm_state_shared(m, e) ? PyObject_CallOneArg(m->copier, e->state) : Py_NewRef(e->state);
        if (!*old) r = -1;
    }
    if (r == 1 && (fm_touch(m, s, i) < 0 || fm_delete_at(m, s, i) < 0)) {
        r = -1;
        if (old) Py_CLEAR(*old);
    }
    fm_leave(m);
    return r;
}

/* New ref: the removed state (copied if shared), None when absent; NULL on error. */
static PyObject *fm_remove_and_get_old(fm_map *m, PyObject *key, PyObject *ns) {
    PyObject *old = NULL;
    int r = fm_remove(m, key, ns, &old);
    if (r < 0) return NULL;
    return r ? old : Py_NewRef(Py_None);
}

/* Overwrites the state and ts of (key, ns) if it is mapped: 1, else 0 (nothing
 * added), -1 error. `state` borrowed. */
static int fm_replace(fm_map *m, PyObject *key, PyObject *ns, PyObject *state, int64_t ts) {
    uint32_t k, i;
    int r = fm_lookup(m, key, ns, &k, &i);
    if (r < 0) return r;
    if (r == 1) {
        if (fm_touch_at(m, k, i) < 0) r = -1;
        else {
            fm_changed(m, fm_entry_at(m, k, i)->hash);
            fm_set_state(m, fm_entry_at(m, k, i), state, ts);
        }
    }
    fm_leave(m);
    return r;
}

/* Prefetch stages of a batch item with hash h: 0 its slot, 2 the state a hit
 * will INCREF (when the slot holds the key's hash). Hints only. */
CM_ALWAYS_INLINE static inline void fm_hint_at(const fm_map *m, uint32_t h, int stage) {
    if (stage == 0) { fm_prefetch(m, h); return; }
    if (stage != 2) return;
    const cm_entry *e = fm_home(m, h);
    if (fm_used(e) && fm_hash(e) == h) CM_PREFETCH_W(e->state);
}

/* ------------------------------------------------------------- TTL sweep */

/* Flink's incremental cleanup: examines up to max_entries entries from where the
 * last call stopped (all when < 0), removing those with ts + ttl <= now; each
 * removed entry goes to `sink` (a list, or NULL) as (key, ns, state). Returns
 * the number removed, or -1. */
static Py_ssize_t fm_sweep(fm_map *m, int64_t now, int64_t ttl, Py_ssize_t max_entries, PyObject *sink) {
    if (cm_check_ttl(ttl) < 0) return -1;
    if (!cm_expired(m->ts_floor, ttl, now)) return 0; /* no entry has expired: nothing to look at */
    if (fm_enter(m) < 0) return -1;
    Py_ssize_t removed = 0, examined = 0;
    int full = max_entries < 0;
    int64_t least = INT64_MAX; /* a full pass: the least ts it leaves */
    uint64_t total = m->slots, scanned = 0;
    if (full) { m->sweep_dir = 0; m->sweep_slot = 0; }
    /* a bounded call looks at no more slots than the map has (a re-look after
     * a removal counts too); a full pass goes once round */
    while (full || (scanned < total && examined < max_entries)) {
        if (m->sweep_dir >= (1u << m->gdepth)) {
            m->sweep_dir = 0; m->sweep_slot = 0;
            if (full) break;
        }
        uint32_t k = m->sweep_dir;
        fm_seg *s = m->segs[k];
        uint32_t run = fm_run(m, k);
        if (m->sweep_slot >= fm_cap(s)) {
            m->sweep_dir = (k & ~(run - 1u)) + run;
            m->sweep_slot = 0;
            continue;
        }
        uint32_t i = m->sweep_slot;
        cm_entry *e = &s->e[i];
        scanned++;
        if (!fm_used(e)) { m->sweep_slot++; continue; }
        examined++;
        if (!cm_expired(e->ts, ttl, now)) {
            if (e->ts < least) least = e->ts;
            m->sweep_slot++;
            continue;
        }
        if (sink) {
            PyObject *tup = cm_entry_tuple(e, 0);
            int rc = tup ? PyList_Append(sink, tup) : -1;
            Py_XDECREF(tup);
            if (rc < 0) { removed = -1; break; }
        }
        if (fm_touch(m, s, i) < 0 || fm_delete_at(m, s, i) < 0) { removed = -1; break; }
        removed++;
        /* slot i may now hold a later entry of the run: look at it again */
    }
    if (full) {
        m->sweep_dir = 0; m->sweep_slot = 0;
        /* one call saw every entry (a removal only moves entries back onto the
         * slot it looks at again), and nothing else ran meanwhile */
        if (removed >= 0) m->ts_floor = least;
    }
    fm_leave(m);
    return removed;
}

#include "fm_snapshot.h"

#endif /* COWMAP_FLATMAP_H */
