/*
 * cowmap core, part 8 of 10: columns, one pass over a batch of rows spread
 * over the key-group maps of one state (the columnar state calls).
 *
 * A row is a key (an int64 or an object), the map of its key group and, for
 * a write, a state. Rows run in order through the same steps as the single
 * ops (cm_locate, cm_read_state, cm_writable, cm_add_entry, cm_unlink), so a
 * column gives what the single ops give one row after another, duplicate
 * keys and rehash steps included. What makes it fast is around those steps:
 * every map of the column is entered once, not once per row; object keys are
 * hashed (and so checked) in a first pass, before anything is written; and a
 * software pipeline across the maps prefetches, CM_CD rows ahead, the row's
 * bucket slot, then its head entry, then its state or the chain's next
 * entry, so the cache misses of many rows overlap.
 *
 * Compiled only as part of cowmap_core.h, which includes the parts in order.
 */
#ifndef COWMAP_CM_COLUMNS_H
#define COWMAP_CM_COLUMNS_H

#include "cm_ttl.h"

enum { CM_COL_GET, CM_COL_PUT, CM_COL_REMOVE, CM_COL_CONTAINS, CM_COL_FOLD };
/* How CM_COL_FOLD combines a stored int with the row's. */
enum { CM_FOLD_ADD, CM_FOLD_MIN, CM_FOLD_MAX };

/* What a column GET found for a row (cm_col.status); CM_ROW_TYPED is or-ed in
 * when the fast read wrote the row's number to iout/fout instead of out. */
enum { CM_ROW_ABSENT = 0, CM_ROW_LIVE = 1, CM_ROW_EXPIRED = 2, CM_ROW_TYPED = 0x80 };
/* A PUT row written by cm_col_put_located (cm_col.status). */
#define CM_ROW_DONE 4

typedef struct {
    int op;
    Py_ssize_t n;
    const int64_t *ikeys;   /* int64 keys, or NULL */
    PyObject **okeys;       /* object keys: the items of a list the caller holds, or NULL */
    const int32_t *kgs;     /* the key group of each row, an index into maps (checked by the caller) */
    cm_map **maps;          /* per key group: its map (the caller holds a reference), NULL = none;
                             * set only for the key groups of the rows (each map entered once) */
    Py_ssize_t nmaps;
    PyObject *ns;
    /* GET: with ttl > 0 an expired entry is removed and its state returned
     * with CM_ROW_EXPIRED; refresh: a live entry's ts is set to now */
    int64_t now, ttl;
    int refresh;
    int peek;               /* GET: expired entries stay (CM_ROW_EXPIRED, state returned), no refresh */
    PyObject **out;         /* GET: a new reference per row found, NULL where absent */
    int64_t *iout;          /* GET, or NULL: where the fast read may put exact ints fitting int64 */
    double *fout;           /* GET, or NULL: where the fast read may put exact floats */
    uint8_t *status;        /* GET: CM_ROW_*; CONTAINS: 0/1 */
    /* PUT: states[i] (borrowed) is written with ts; NULL or None = remove the row's key */
    PyObject *const *states;
    const int64_t *istates; /* PUT: int64 states made into ints as they are written, or NULL */
    const double *fstates;  /* PUT: float64 states made into floats, or NULL */
    int64_t ts;
    const int64_t *tss;     /* PUT: one timestamp per row (a restore's), used instead of ts, or NULL */
    /* FOLD: istates[i] is combined (fold: CM_FOLD_*) with the row's stored int
     * when that is usable (present, and unexpired unless return_expired), else
     * written as it is; written with ts. A row whose stored value is no int of
     * int64, or whose result would leave int64, is left as it is and its index
     * appended to `unfit` (a list). */
    int fold, return_expired;
    PyObject *unfit;
    /* Row locations, for a read-modify-write of one int64 column (cm_colmark):
     * a fast GET writes the entry index of each live row it reads to locs[i]
     * (0 elsewhere; the caller zeroes it) and marks[kg] for each map; a PUT
     * given the GET's locs and marks writes those rows' entries without a
     * lookup while their map is as the GET left it. NULL = none. */
    uint32_t *locs;
    struct cm_colmark *marks;
    Py_ssize_t located;     /* PUT: the rows written through locs */
    Py_ssize_t typed_live;  /* GET: the live rows the fast read wrote to iout/fout (all: nothing in out) */
    Py_ssize_t nslow;       /* the rows a fast pass left to the general one (CM_ROW_SLOW) */
} cm_col;

/* A map as a GET left it: the same map (address and serial: the mark holds
 * no reference, and the map may have been freed since), with no entry added
 * or removed (mod_count) and no snapshot taken (version) since, so every
 * entry the GET found is still the live map's entry at the same index. m
 * NULL: the GET's rows of this map have no locations (it was rehashing, had
 * a live snapshot, or some of its rows went the general way). Only compared,
 * never followed. */
typedef struct cm_colmark {
    const cm_map *m;
    uint64_t serial, mod;
    uint32_t version;
} cm_colmark;

#define CM_CD 48u   /* rows between prefetching a row's slot and running it */
#define CM_CR 64u   /* ring of row hashes, a power of two > CM_CD */

/* The probe of row i: int64 keys are made on the spot, object keys were made
 * by cm_col_probes. */
static inline void cm_col_probe(const cm_col *c, const cm_probe *probes, Py_hash_t hn, Py_ssize_t i,
                                cm_probe *p) {
    if (c->ikeys) {
        p->key = NULL; p->ikey = c->ikeys[i]; p->is_int = 1; p->ns = c->ns;
        p->hash = cm_composite(cm_int_hash(p->ikey), hn);
    } else {
        *p = probes[i];
    }
}

/* The check of a column's key groups: the first row whose key group is not
 * within 0..nmaps-1, or -1 (then, with `seen`, seen[kg] is set for each key
 * group of the rows). Branch-free passes (the first vectorises): a per-row
 * check with a branch on seen cost 0.5 ns a row. */
static Py_ssize_t cm_col_seen(const int32_t *kgs, Py_ssize_t n, Py_ssize_t nmaps, uint8_t *seen) {
    const uint32_t end = nmaps > (Py_ssize_t)INT32_MAX ? (uint32_t)INT32_MAX + 1u : (uint32_t)nmaps;
    uint32_t over = 0;
    for (Py_ssize_t i = 0; i < n; i++) over |= (uint32_t)kgs[i] >= end;
    if (over) {
        for (Py_ssize_t i = 0; i < n; i++)
            if ((uint32_t)kgs[i] >= end) return i;
    }
    if (seen)
        for (Py_ssize_t i = 0; i < n; i++) seen[kgs[i]] = 1;
    return -1;
}

/* Object keys hashed before anything is written: a key whose __hash__ fails
 * fails the column with nothing done. */
static cm_probe *cm_col_probes(const cm_col *c, Py_hash_t hn) {
    if (c->ikeys) return NULL;
    cm_probe *probes = PyMem_Malloc((size_t)(c->n ? c->n : 1) * sizeof(cm_probe));
    if (!probes) { PyErr_NoMemory(); return NULL; }
    for (Py_ssize_t i = 0; i < c->n; i++) {
        Py_hash_t hk;
        if (cm_probe_key(&probes[i], c->okeys[i], &hk) < 0) { PyMem_Free(probes); return NULL; }
        probes[i].ns = c->ns;
        probes[i].hash = cm_composite(hk, hn);
    }
    return probes;
}

/* The pipeline's stages for rows ahead of row i (hints only: they read the
 * maps as they are, and a row's slot may move before the row runs). */
CM_ALWAYS_INLINE static inline void cm_col_hints(const cm_col *c, const cm_probe *probes, Py_hash_t hn,
                                                 uint32_t *ring, Py_ssize_t i) {
#if defined(__GNUC__)
    Py_ssize_t j = i + CM_CD;
    if (j < c->n) {
        uint32_t h = c->ikeys ? cm_composite(cm_int_hash(c->ikeys[j]), hn) : probes[j].hash;
        ring[j & (CM_CR - 1u)] = h;
        const cm_map *m = c->maps[c->kgs[j]];
        if (m) {
            const uint32_t *slot = cm_slot_at(m, h);
            if (slot) CM_PREFETCH(slot);
        }
    }
    j = i + CM_CD / 2;
    if (j < c->n) {
        const cm_map *m = c->maps[c->kgs[j]];
        if (m) {
            const uint32_t *slot = cm_slot_at(m, ring[j & (CM_CR - 1u)]);
            if (slot && *slot) cm_prefetch_entry(m, *slot);
        }
    }
    j = i + CM_CD / 4;
    if (j < c->n) {
        const cm_map *m = c->maps[c->kgs[j]];
        if (m) {
            uint32_t h = ring[j & (CM_CR - 1u)];
            const uint32_t *slot = cm_slot_at(m, h);
            if (slot && *slot) {
                const cm_entry *e = cm_E(m, *slot);
                if (!cm_prefetch_past_head(m, e, h) && (c->op == CM_COL_GET || c->op == CM_COL_FOLD))
                    cm_prefetch_state(e->state);
            }
        }
    }
#else
    (void)c; (void)probes; (void)hn; (void)ring; (void)i;
#endif
}

/* An int state of value v: kept in the entry (cm_tag_int) when it fits, else
 * a new int; NULL on error. */
static inline PyObject *cm_col_int(int64_t v) {
    return cm_taggable(v) ? cm_tag_int(v) : PyLong_FromLongLong(v);
}

/* The state to write for row i: a new reference (or a tagged int), Py_None
 * for a removal, NULL on error. */
static inline PyObject *cm_col_state(const cm_col *c, Py_ssize_t i) {
    if (c->istates) return cm_col_int(c->istates[i]);
    if (c->fstates) return PyFloat_FromDouble(c->fstates[i]);
    PyObject *s = c->states[i] ? c->states[i] : Py_None;
    Py_INCREF(s);
    return s;
}

/* The value a FOLD row writes over the found entry e: *v (the row's value on
 * entry) combined with e's int when that is usable. 1 done, 0 unfit (e's
 * state is no int of int64, or the result would leave int64). */
static inline int cm_col_fold_value(const cm_col *c, const cm_entry *e, int64_t *v) {
    if (c->ttl && !c->return_expired && cm_expired(e->ts, c->ttl, c->now)) return 1; /* dropped */
    int64_t old;
    if (cm_tagged(e->state)) {
        old = cm_tag_value(e->state);
    } else {
        if (!PyLong_CheckExact(e->state)) return 0;
        int overflow = 0;
        old = cm_as_int64(e->state, &overflow);
        if (overflow) return 0;
    }
    if (c->fold == CM_FOLD_ADD) return !__builtin_add_overflow(old, *v, v);
    if ((c->fold == CM_FOLD_MIN) == (old < *v)) *v = old;
    return 1;
}

/* Note row i as unfit for the fold (left as it is): 0, or -1. */
static int cm_col_unfit(const cm_col *c, Py_ssize_t i) {
    PyObject *ix = PyLong_FromSsize_t(i);
    int r = ix ? PyList_Append(c->unfit, ix) : -1;
    Py_XDECREF(ix);
    return r;
}

/* The timestamp row i is written with. */
static inline int64_t cm_col_ts(const cm_col *c, Py_ssize_t i) {
    return c->tss ? c->tss[i] : c->ts;
}

/* The new state object of row i (FOLD: the int v), a new reference. */
static inline PyObject *cm_col_new_state(const cm_col *c, Py_ssize_t i, int64_t v) {
    return c->op == CM_COL_FOLD ? cm_col_int(v) : cm_col_state(c, i);
}

/* Row i's float written over the float of the map's own entry w, in place,
 * when nothing but w holds that float (nothing allocated or freed): 1 done
 * (state version and ts set), 0 not (the caller writes a new state). Ints
 * need no such thing: they are written into the entry (cm_col_int). */
static inline int cm_col_rewrite(cm_map *m, uint32_t w, const cm_col *c, Py_ssize_t i) {
    cm_entry *e = cm_E(m, w);
    if (!c->fstates || cm_state_shared(m, e) || cm_tagged(e->state) || !cm_float_rewrite(e->state, c->fstates[i]))
        return 0;
    e->sv = m->version;
    e->ts = cm_col_ts(c, i);
    cm_ts_note(m, e->ts);
    cm_changed(m, w);
    return 1;
}

/* Row i of a FOLD in map m: see cm_col. */
static int cm_col_fold_row(cm_map *m, const cm_col *c, const cm_probe *p, Py_ssize_t i) {
    cm_loc loc;
    if (cm_locate(m, p, &loc) < 0) return -1;
    int64_t v = c->istates[i];
    uint32_t w = 0;
    if (loc.found) {
        if (!cm_col_fold_value(c, cm_E(m, loc.idx), &v)) return cm_col_unfit(c, i);
        if (!(w = cm_writable(m, p, &loc))) return -1;
        if (cm_col_rewrite(m, w, c, i)) return 0;
    }
    PyObject *st = cm_col_new_state(c, i, v);
    if (!st) return -1;
    if (!w && !(w = cm_add_entry(m, p, loc.t))) { cm_grave(m, st); return -1; }
    cm_set_state(m, w, st, cm_col_ts(c, i));
    return 0;
}

/* Row i in map m, the single op's steps. */
static int cm_col_row(cm_map *m, const cm_col *c, const cm_probe *p, Py_ssize_t i) {
    cm_loc loc;
    if (c->op == CM_COL_FOLD) return cm_col_fold_row(m, c, p, i);
    if (c->op == CM_COL_PUT) {
        PyObject *st = cm_col_state(c, i);
        if (!st) return -1;
        if (st == Py_None) { /* update(None) is clear() */
            Py_DECREF(st);
            return cm_remove_probe(m, p, NULL) < 0 ? -1 : 0;
        }
        if (cm_locate(m, p, &loc) < 0) { Py_DECREF(st); return -1; }
        uint32_t w = loc.found ? cm_writable(m, p, &loc) : cm_add_entry(m, p, loc.t);
        if (!w) { cm_grave(m, st); return -1; }
        cm_set_state(m, w, st, cm_col_ts(c, i));
        return 0;
    }
    if (c->op == CM_COL_REMOVE) return cm_remove_probe(m, p, NULL) < 0 ? -1 : 0;
    if (cm_locate(m, p, &loc) < 0) return -1;
    if (c->op == CM_COL_CONTAINS) { c->status[i] = (uint8_t)loc.found; return 0; }
    if (!loc.found) { c->status[i] = CM_ROW_ABSENT; return 0; }
    cm_entry *e = cm_E(m, loc.idx);
    PyObject *s;
    if (c->ttl > 0 && c->peek) {
        /* a look at the state and its expiry, changing nothing (Flink's getUnexpired) */
        if (!(s = cm_read_state(m, p, &loc))) return -1;
        c->status[i] = cm_expired(e->ts, c->ttl, c->now) ? CM_ROW_EXPIRED : CM_ROW_LIVE;
    } else if (c->ttl > 0 && cm_expired(e->ts, c->ttl, c->now)) {
        /* the value's read of an expired entry: removed, its state handed back */
        if (!(s = cm_old_state(m, e))) return -1;
        if (cm_unlink(m, loc.t, p->hash & (loc.t->capacity - 1u), loc.idx, loc.prev) < 0) {
            Py_DECREF(s);
            return -1;
        }
        c->status[i] = CM_ROW_EXPIRED;
    } else {
        s = c->ttl > 0 && c->refresh ? cm_read_touch(m, p, &loc, c->now) : cm_read_state(m, p, &loc);
        if (!s) return -1;
        c->status[i] = CM_ROW_LIVE;
    }
    c->out[i] = s;
    return 0;
}

/* A row of the fast write in flight: its map, hash and key, then its slot,
 * then its head entry. (The fast read has its own, cm_rrow.) */
typedef struct {
    cm_map *m;              /* NULL: the row has no map, or its map goes the general way */
    const uint32_t *slot;
    const cm_entry *head;
    uint32_t h;
    int64_t k;
} cm_crow;

/* The fast write's second stage for row r, whose slot has arrived: its head
 * entry, requested whole (the write sets state, ts and versions). The slot is
 * a hint: an insert may have changed it, and the row is resolved afresh. */
CM_ALWAYS_INLINE static inline void cm_crow_head(cm_crow *r) {
    uint32_t e = r->slot ? *r->slot : 0u;
    r->head = e ? cm_E(r->m, e) : NULL;
    if (e) cm_prefetch_entry(r->m, e);
}

/* The third stage, the head having arrived: the chain's next entry if the head
 * is another key's, else the state, which the write rewrites or releases (its
 * refcount is written either way). */
CM_ALWAYS_INLINE static inline void cm_crow_next(const cm_crow *r) {
    const cm_entry *x = r->head;
    if (x && !cm_hash_is(x, r->h)) { if (x->next) cm_prefetch_entry(r->m, x->next); }
    else if (x) cm_prefetch_state(x->state);
}

/* Whether the fast read can take rows of map m: nothing of it can move or be
 * copied by a read (no rehash running; no copy-on-read, which a copier and a
 * live snapshot would make). */
static inline int cm_col_fast_map(const cm_map *m) {
    return !m->rehash.capacity && !(m->copier && m->required);
}

/* Whether the fast write can take rows of map m: no rehash running and no
 * live snapshot (whose copy-on-write the general pass does). */
static inline int cm_col_fast_write_map(const cm_map *m) {
    return !m->rehash.capacity && !m->required;
}

/* The fast write's first stage for row i: its map (NULL when the pass cannot
 * take the map: see cm_col_fast_write_map), hash and key, and its slot,
 * requested. */
CM_ALWAYS_INLINE static inline void cm_crow_start(cm_crow *r, const cm_col *c, Py_ssize_t i, uint32_t nsmix,
                                                  const uint8_t *slow) {
    int32_t kg = c->kgs[i];
    cm_map *m = c->maps[kg];
    r->k = c->ikeys[i];
    r->h = cm_mix(cm_int_hash(r->k), nsmix);
    r->slot = NULL;
    r->m = m && !slow[kg] && cm_col_fast_write_map(m) ? m : NULL;
    if (r->m && c->status[i] != CM_ROW_DONE) {
        const uint32_t *slot = cm_slot_at(m, r->h);
        if (slot) { CM_PREFETCH(slot); r->slot = slot; }
    }
}

/* Stages two and three for the rows CM_CD/3 and 2*CM_CD/3 behind row i. */
CM_ALWAYS_INLINE static inline void cm_crow_stages(cm_crow *ring, Py_ssize_t i, Py_ssize_t n) {
    Py_ssize_t j = i - (Py_ssize_t)(CM_CD / 3);
    if (j >= 0 && j < n) cm_crow_head(&ring[j & (CM_CR - 1u)]);
    j = i - (Py_ssize_t)(2 * CM_CD / 3);
    if (j >= 0 && j < n) cm_crow_next(&ring[j & (CM_CR - 1u)]);
}

/* A map as the fast read sees it, copied into one small array per call: a
 * row's lookup then reads no map header, pages array or chunk table pointer
 * of its own (with 128 maps those are ~800 scattered cache lines, enough to
 * miss the L1 cache on most rows). Nothing a read does moves them. */
typedef struct {
    const uint32_t *slots;      /* the slots, when the table is one page; else NULL */
    cm_page *const *pages;      /* NULL: the read does not take the map's rows (none, or not fast) */
    cm_entry *const *chunks;
    uint32_t mask, shift;       /* capacity - 1, page_shift */
    /* whether a row's read needs the entry's ts: a TTL read, unless the map's
     * expiry floor says no entry has expired and it does not refresh; without
     * the ts a read needs an entry only up to its state (1.25 cache lines an
     * entry instead of 1.5) */
    int needs_ts;
} cm_cview;

/* The slot of hash h in map view v (whose pages are set). */
CM_ALWAYS_INLINE static inline const uint32_t *cm_cview_slot(const cm_cview *v, uint32_t h) {
    uint32_t b = h & v->mask;
    if (CM_LIKELY(v->slots != NULL)) return &v->slots[b];
    const cm_page *pg = v->pages[b >> v->shift];
    return pg ? &pg->slots[b & ((1u << v->shift) - 1u)] : NULL;
}

/* A row of the fast read in flight: its map view, hash and key, then its
 * slot, then its head entry and that entry's index. */
typedef struct {
    const cm_cview *v;          /* NULL: the row has no map, or its map goes the general way */
    const uint32_t *slot;
    const cm_entry *head;
    uint32_t h, hi;
    int64_t k;
} cm_rrow;

/* Row j's number was written to iout/fout (CM_ROW_TYPED): counted when live. */
CM_ALWAYS_INLINE static inline void cm_col_typed(cm_col *c, Py_ssize_t j) {
    c->typed_live += c->status[j] == CM_ROW_LIVE;
    c->status[j] |= CM_ROW_TYPED;
}

/* Pipelined int64 GET over all rows, for maps that nothing can move during
 * it: the pipeline of cm_batch_read_run, across maps. Each row's slot address
 * and head entry are found once and carried down the ring. A row it cannot
 * finish (an expired entry to remove, a refresh of an entry shared with a
 * snapshot, a map that is rehashing or copies on read) stops its map: that
 * row and every later row of the map are left to the general pass (slow[kg]
 * = 1, and the row's status CM_ROW_SLOW), so each map's rows still run in
 * order. Changes nothing but the timestamps a refresh writes. */
#define CM_ROW_SLOW 3
static int cm_col_read_fast(cm_col *c, Py_hash_t hn, uint8_t *slow) {
    const Py_ssize_t n = c->n;
    const uint32_t nsmix = cm_fmix32(cm_fold(hn));
    const int ttl = c->ttl > 0;
    cm_rrow ring[CM_CR];
    cm_probe p;
    p.key = NULL; p.is_int = 1; p.ns = c->ns;
    cm_cview *views = PyMem_Malloc((size_t)(c->nmaps ? c->nmaps : 1) * sizeof(cm_cview));
    if (!views) { PyErr_NoMemory(); return -1; }
    for (Py_ssize_t k = 0; k < c->nmaps; k++) {
        const cm_map *m = c->maps[k];
        cm_cview *v = &views[k];
        memset(v, 0, sizeof(*v));
        if (!m) continue;
        if (!cm_col_fast_map(m) || !m->primary.capacity) { slow[k] = 1; continue; }
        v->needs_ts = ttl && ((c->refresh && !c->peek) || cm_expired(m->ts_floor, c->ttl, c->now));
        v->pages = m->primary.pages;
        v->slots = m->primary.npages == 1 && m->primary.pages[0] ? m->primary.pages[0]->slots : NULL;
        v->chunks = m->chunks;
        v->mask = m->primary.capacity - 1u;
        v->shift = m->primary.page_shift;
    }
    for (Py_ssize_t i = 0; i < n + (Py_ssize_t)CM_CD; i++) {
        if (i < n) { /* stage one: the slot, requested */
            cm_rrow *r = &ring[i & (CM_CR - 1u)];
            int32_t kg = c->kgs[i];
            const cm_cview *v = &views[kg];
            r->k = c->ikeys[i];
            r->h = cm_mix(cm_int_hash(r->k), nsmix);
            r->slot = NULL;
            r->v = v->pages && !slow[kg] ? v : NULL;
            if (r->v && (r->slot = cm_cview_slot(v, r->h))) CM_PREFETCH(r->slot);
        }
        Py_ssize_t t = i - (Py_ssize_t)(CM_CD / 3);
        if (t >= 0 && t < n) { /* stage two: the head entry, requested (up to its state when the ts is not read) */
            cm_rrow *r = &ring[t & (CM_CR - 1u)];
            uint32_t e = r->slot ? *r->slot : 0u;
            r->hi = e;
            r->head = e ? cm_E_in(r->v->chunks, e) : NULL;
            if (e) {
                CM_PREFETCH(r->head);
                CM_PREFETCH((const char *)r->head + (r->v->needs_ts ? sizeof(cm_entry) : offsetof(cm_entry, ts)) - 1);
            }
        }
        t = i - (Py_ssize_t)(2 * CM_CD / 3);
        if (t >= 0 && t < n) { /* stage three: a collision's next entry, or the state */
            const cm_rrow *r = &ring[t & (CM_CR - 1u)];
            const cm_entry *x = r->head;
            if (x && !cm_hash_is(x, r->h)) { if (x->next) CM_PREFETCH(cm_E_in(r->v->chunks, x->next)); }
            else if (x) cm_prefetch_state(x->state);
        }
        Py_ssize_t j = i - (Py_ssize_t)CM_CD;
        if (j < 0) continue;
        const cm_rrow *r = &ring[j & (CM_CR - 1u)];
        int32_t kg = c->kgs[j];
        if (!r->v) {
            if (!c->maps[kg]) { c->status[j] = CM_ROW_ABSENT; continue; }
            slow[kg] = 1;
            c->status[j] = CM_ROW_SLOW; c->nslow++;
            continue;
        }
        if (slow[kg]) { c->status[j] = CM_ROW_SLOW; c->nslow++; continue; }
        cm_map *m = c->maps[kg];
        cm_entry *hit = NULL;
        uint32_t hi = r->hi; /* the index of x below (nothing moves in a read) */
        p.ikey = r->k; p.hash = r->h;
        for (const cm_entry *x = r->head; x; hi = x->next, x = x->next ? cm_E(m, x->next) : NULL) {
            int eq = cm_match(x, &p);
            if (eq < 0) goto fail;
            if (eq) { hit = (cm_entry *)x; break; }
        }
        if (!hit) { c->status[j] = CM_ROW_ABSENT; continue; }
        if (r->v->needs_ts && cm_expired(hit->ts, c->ttl, c->now)) {
            if (!c->peek) { slow[kg] = 1; c->status[j] = CM_ROW_SLOW; c->nslow++; continue; }
            c->status[j] = CM_ROW_EXPIRED;
        } else {
            if (r->v->needs_ts && c->refresh && !c->peek && hit->ts != c->now) {
                if (cm_ev(hit) < m->required) { slow[kg] = 1; c->status[j] = CM_ROW_SLOW; c->nslow++; continue; }
                hit->ts = c->now; /* cm_read_touch, for an entry the map owns alone */
                cm_ts_note(m, c->now);
                cm_changed(m, hi);
            }
            c->status[j] = CM_ROW_LIVE;
            if (c->locs) c->locs[j] = hi;
        }
        PyObject *st = hit->state;
        if (cm_tagged(st)) {
            if (c->iout) { c->iout[j] = cm_tag_value(st); cm_col_typed(c, j); continue; }
            if (!(c->out[j] = cm_state_ref(st))) goto fail;
            continue;
        }
        if (c->iout && PyLong_CheckExact(st)) { /* a typed read: the number itself, no reference */
            int overflow = 0;
            int64_t v = cm_as_int64(st, &overflow);
            if (!overflow) { c->iout[j] = v; cm_col_typed(c, j); continue; }
        } else if (c->fout && PyFloat_CheckExact(st)) {
            c->fout[j] = PyFloat_AS_DOUBLE(st);
            cm_col_typed(c, j);
            continue;
        }
        if (m->dirty && cm_mutable_state(st)) cm_changed(m, hi);
        Py_INCREF(st);
        c->out[j] = st;
    }
    PyMem_Free(views);
    return 0;
fail:
    PyMem_Free(views);
    return -1;
}

#define CM_LD 16u   /* rows between requesting a located row's entry and writing it */

/* The PUT rows whose entry the read that left c->locs found, written in place
 * with no lookup: the rows of each map that is as that read left it (the same
 * map, no entry added or removed, no snapshot taken: cm_colmark), and that
 * has no rehash running or live snapshot. Their keys were all present at the
 * read, so every row left (a key absent then, or a map changed since) has a
 * key none of them has, and may run after them. Marks the rows it writes
 * CM_ROW_DONE; returns how many, or -1. The states may hold no None (a
 * removal): the caller checks. */
static Py_ssize_t cm_col_put_located(cm_col *c, uint8_t *ok) {
    const Py_ssize_t n = c->n;
    Py_ssize_t done = 0;
    /* what a row's write needs of its map, in one small array (see cm_cview) */
    typedef struct { cm_entry *const *chunks; uint32_t version; uint8_t track, wrote; } cm_pview;
    cm_pview *views = PyMem_Calloc((size_t)(c->nmaps ? c->nmaps : 1), sizeof(cm_pview));
    if (!views) { PyErr_NoMemory(); return -1; }
    for (Py_ssize_t k = 0; k < c->nmaps; k++) {
        const cm_map *m = c->maps[k];
        const cm_colmark *mk = &c->marks[k];
        ok[k] = m && mk->m == m && mk->serial == m->serial && mk->mod == m->mod_count &&
                mk->version == m->version && cm_col_fast_write_map(m);
        if (!ok[k]) continue;
        views[k].chunks = m->chunks;
        views[k].version = m->version;
        views[k].track = m->dirty != NULL;
    }
    cm_entry *ring[CM_LD]; /* each row's entry, found once as it is prefetched */
    for (Py_ssize_t i = 0; i < n + (Py_ssize_t)CM_LD; i++) {
        Py_ssize_t j = i - (Py_ssize_t)CM_LD;
        cm_entry *e = j >= 0 ? ring[j & (CM_LD - 1u)] : NULL;
        if (i < n) {
            uint32_t w = c->locs[i];
            int32_t kg = c->kgs[i];
            cm_entry *x = w && ok[kg] ? cm_E_in(views[kg].chunks, w) : NULL;
            if (x) { CM_PREFETCH_W(x); CM_PREFETCH_W((const char *)x + sizeof(cm_entry) - 1); }
            ring[i & (CM_LD - 1u)] = x;
        }
        if (!e || !cm_intkey(e) || e->key.i != c->ikeys[j]) continue; /* not the read's: cannot be, checked anyway */
        int32_t kg = c->kgs[j];
        cm_pview *v = &views[kg];
        uint32_t w = c->locs[j];
        if (!c->fstates || !cm_col_rewrite(c->maps[kg], w, c, j)) {
            PyObject *st = cm_col_state(c, j), *old = e->state;
            if (!st) { done = -1; break; }
            /* cm_set_state, on the entry in hand */
            int64_t ts = cm_col_ts(c, j);
            if (v->track) cm_changed(c->maps[kg], w);
            e->state = st;
            e->sv = v->version;
            e->ts = ts;
            if (c->tss) cm_ts_note(c->maps[kg], ts);
            v->wrote = 1;
            if (!cm_tagged(old)) cm_grave(c->maps[kg], old);
        }
        c->status[j] = CM_ROW_DONE;
        done++;
    }
    for (Py_ssize_t k = 0; k < c->nmaps; k++) /* the one timestamp the rows wrote, noted once per map */
        if (views[k].wrote && !c->tss) cm_ts_note(c->maps[k], c->ts);
    PyMem_Free(views);
    return done;
}

/* Pipelined int64 PUT over all rows, the pipeline of cm_batch_fast_run across
 * maps: slots prefetched CM_CD rows ahead, head entries CM_CD/3 later, the
 * chain's next entry another CM_CD/3 later; each row is then resolved afresh
 * (its slot and chain read again), so entries added by earlier rows are seen.
 * A row it cannot do (a None state: a removal; a map rehashing, or that
 * starts to on an insert, or has a live snapshot) stops its map as in
 * cm_col_read_fast: it and every later row of the map go to the general pass
 * (status CM_ROW_SLOW). */
static int cm_col_put_fast(cm_col *c, Py_hash_t hn, uint8_t *slow) {
    const Py_ssize_t n = c->n;
    const uint32_t nsmix = cm_fmix32(cm_fold(hn));
    cm_crow ring[CM_CR];
    cm_probe p;
    p.key = NULL; p.is_int = 1; p.ns = c->ns;
    for (Py_ssize_t i = 0; i < n + (Py_ssize_t)CM_CD; i++) {
        if (i < n) cm_crow_start(&ring[i & (CM_CR - 1u)], c, i, nsmix, slow);
        cm_crow_stages(ring, i, n);
        Py_ssize_t j = i - (Py_ssize_t)CM_CD;
        if (j < 0) continue;
        const cm_crow *r = &ring[j & (CM_CR - 1u)];
        if (c->status[j] == CM_ROW_DONE) continue;
        int32_t kg = c->kgs[j];
        cm_map *m = r->m;
        if (!m || slow[kg] || !cm_col_fast_write_map(m) || (c->states && (!c->states[j] || c->states[j] == Py_None))) {
            slow[kg] = 1;
            c->status[j] = CM_ROW_SLOW; c->nslow++;
            continue;
        }
        /* resolve afresh: the pipeline's slot and head were hints */
        const cm_table *t = &m->primary;
        uint32_t b = r->h & (t->capacity - 1u);
        const cm_page *pg = t->pages[b >> t->page_shift];
        uint32_t e = pg ? pg->slots[b & ((1u << t->page_shift) - 1u)] : 0u;
        uint32_t hit = 0;
        p.ikey = r->k; p.hash = r->h;
        for (; e; e = cm_E(m, e)->next) {
            int eq = cm_match(cm_E(m, e), &p);
            if (eq < 0) return -1;
            if (eq) { hit = e; break; }
        }
        int64_t fv = 0; /* FOLD: the value to write */
        if (c->op == CM_COL_FOLD) {
            fv = c->istates[j];
            if (hit && !cm_col_fold_value(c, cm_E(m, hit), &fv)) {
                if (cm_col_unfit(c, j) < 0) return -1;
                continue;
            }
        }
        /* no snapshot is live here: a hit is the map's own entry */
        if (hit && cm_col_rewrite(m, hit, c, j)) continue;
        PyObject *st = cm_col_new_state(c, j, fv);
        if (!st) return -1;
        if (!hit && !(hit = cm_add_entry(m, &p, &m->primary))) { cm_grave(m, st); return -1; }
        cm_set_state(m, hit, st, cm_col_ts(c, j));
        if (m->rehash.capacity) slow[kg] = 1; /* the insert started a rehash: later rows go the general way */
    }
    return 0;
}

/* Whether no row of a PUT removes its key (a None state). */
static int cm_col_no_removal(const cm_col *c) {
    if (!c->states) return 1;
    for (Py_ssize_t i = 0; i < c->n; i++)
        if (!c->states[i] || c->states[i] == Py_None) return 0;
    return 1;
}

/* Enter the maps of the column's rows (each once: c->maps holds only
 * theirs), or none: a busy map fails the column before anything is done. */
static int cm_col_enter(const cm_col *c) {
    for (Py_ssize_t k = 0; k < c->nmaps; k++) {
        if (c->maps[k] && cm_enter(c->maps[k]) < 0) {
            while (k-- > 0)
                if (c->maps[k]) cm_leave(c->maps[k]);
            return -1;
        }
    }
    return 0;
}

static void cm_col_leave(const cm_col *c) {
    uint32_t *rows = NULL; /* the rows of each map, counted only for a map with items to reclaim */
    for (Py_ssize_t k = 0; k < c->nmaps && !rows; k++)
        if (c->maps[k] && c->maps[k]->nrq && (rows = PyMem_RawCalloc((size_t)c->nmaps, sizeof(uint32_t))))
            for (Py_ssize_t i = 0; i < c->n; i++) rows[c->kgs[i]]++;
    for (Py_ssize_t k = 0; k < c->nmaps; k++) {
        cm_map *m = c->maps[k];
        if (!m) continue;
        /* as a batch of the map's rows would (without the count, for want of memory: a step's) */
        if (m->nrq) cm_reclaim_some(m, rows ? 2 * (size_t)rows[k] : CM_RECLAIM_PER_OP);
        cm_leave(m);
    }
    PyMem_RawFree(rows);
}

/* Run the column: 0, or -1 with an exception set (rows before the failing one done). */
static int cm_col_run(cm_col *c) {
    Py_hash_t hn;
    cm_probe p;
    if (cm_probe_ns(&p, c->ns, &hn) < 0) return -1;
    if (c->op == CM_COL_GET && c->ttl != 0 && cm_check_ttl(c->ttl) < 0) return -1;
    cm_probe *probes = cm_col_probes(c, hn);
    if (!probes && !c->ikeys) return -1;
    int r = -1, own_status = 0;
    uint8_t *slow = NULL;
    c->typed_live = c->nslow = 0;
    if (cm_col_enter(c) < 0) goto out;
    uint32_t ring[CM_CR];
    for (Py_ssize_t j = 0; j < c->n && j < (Py_ssize_t)CM_CD; j++)
        ring[j] = c->ikeys ? cm_composite(cm_int_hash(c->ikeys[j]), hn) : probes[j].hash;
    /* int64 reads: the fast pass first, then the rows it left, in order */
    int fast = !COWMAP_PLAIN_BATCH && c->op != CM_COL_REMOVE && c->op != CM_COL_CONTAINS && c->ikeys;
    if (fast) {
        slow = PyMem_Calloc((size_t)(c->nmaps ? c->nmaps : 1), 1);
        if (!slow) { PyErr_NoMemory(); cm_col_leave(c); goto out; }
        if (c->op != CM_COL_GET && !c->status) {
            /* the put pass marks the rows it leaves in a status array of its own */
            c->status = PyMem_Calloc((size_t)(c->n ? c->n : 1), 1);
            if (!c->status) { PyErr_NoMemory(); cm_col_leave(c); goto out; }
            own_status = 1;
        }
        Py_ssize_t done = 0;
        if (c->op == CM_COL_PUT && c->locs && cm_col_no_removal(c)) {
            /* slow, all zeros, lends its room to the located rows' maps */
            done = cm_col_put_located(c, slow);
            c->located = done > 0 ? done : 0;
            memset(slow, 0, (size_t)(c->nmaps ? c->nmaps : 1));
        }
        if (done < 0 || (done < c->n && (c->op == CM_COL_GET ? cm_col_read_fast(c, hn, slow)
                                                             : cm_col_put_fast(c, hn, slow)) < 0)) {  /* PUT, FOLD */
            cm_col_leave(c);
            goto out;
        }
    }
    Py_ssize_t i = 0;
    if (fast && !c->nslow) i = c->n; /* the fast pass did every row */
    for (; i < c->n; i++) {
        if (fast) {
            if (c->status[i] != CM_ROW_SLOW) continue;
            c->status[i] = CM_ROW_ABSENT;
        } else if (!COWMAP_PLAIN_BATCH) {
            cm_col_hints(c, probes, hn, ring, i);
        }
        cm_map *m = c->maps[c->kgs[i]];
        if (!m) { /* no map: nothing to read or remove (writes make their maps first) */
            if (c->status) c->status[i] = 0;
            if (c->op == CM_COL_PUT || c->op == CM_COL_FOLD) {
                PyErr_Format(PyExc_ValueError, "no map for key group %d of row %zd", (int)c->kgs[i], i);
                break;
            }
            continue;
        }
        cm_col_probe(c, probes, hn, i, &p);
        if (cm_col_row(m, c, &p, i) < 0) break;
    }
    r = i == c->n ? 0 : -1;
    if (c->op == CM_COL_GET && c->locs && r == 0)
        for (Py_ssize_t k = 0; k < c->nmaps; k++) {
            const cm_map *m = c->maps[k];
            int held = m && slow && !slow[k] && cm_col_fast_write_map(m);
            c->marks[k].m = held ? m : NULL;
            c->marks[k].serial = held ? m->serial : 0;
            c->marks[k].mod = held ? m->mod_count : 0;
            c->marks[k].version = held ? m->version : 0;
        }
    cm_col_leave(c);
out:
    if (own_status) { PyMem_Free(c->status); c->status = NULL; }
    PyMem_Free(slow);
    PyMem_Free(probes);
    return r;
}

#endif /* COWMAP_CM_COLUMNS_H */
