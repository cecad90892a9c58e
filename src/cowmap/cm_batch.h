/*
 * cowmap core, part 4 of 10: many keys in one call.
 *
 * The prefetch hints for batches spread over many maps (multi_get, multi_put
 * and multi_replace in _core.pyx), and the batch ops of one map (get_many,
 * put_many, contains_many, remove_many): the general path, one cm_locate per
 * key inside a single cm_enter/cm_leave (cm_batch_one), and the int64
 * software pipelines that overlap the cache misses of many keys
 * (cm_batch_fast_run for puts, cm_batch_read_run for gets and contains). A
 * part of its own because it is tuned for speed rather than written to be read
 * against Flink, under one rule: a batch gives the results, errors and
 * timestamps the single ops of cm_ops.h would give for its keys one after
 * another. A build with COWMAP_PLAIN_BATCH set runs every batch the plain way
 * (cm_batch_plain), to check that rule and to measure the pipelines.
 *
 * Compiled only as part of cowmap_core.h, which includes the parts in order.
 */
#ifndef COWMAP_CM_BATCH_H
#define COWMAP_CM_BATCH_H

#include "cm_ops.h"

/* COWMAP_PLAIN_BATCH = 1 (the CMake option COWMAP_PLAIN_BATCH=ON) sends every
 * batch through the plain path: its keys one after another through the steps
 * of the single op (cm_batch_plain; cm_remove_probe for remove_many), with no
 * pipeline and no prefetch, and the multi-map calls of _core.pyx give no
 * hints. Results, errors, timestamps and rehash steps are the same either
 * way. The plain build is there to show that (the batch tests run on both
 * builds, tests/core/test_plain_batch_build.py) and to measure what the
 * pipelines are worth; _core.PLAIN_BATCH tells which build is loaded. */
#ifndef COWMAP_PLAIN_BATCH
#define COWMAP_PLAIN_BATCH 0
#endif

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
 * the single-map pipeline (cm_pf_step, below) does not apply: stage 0
 * prefetches the bucket slot, stage 1 the head entry of the bucket (its slot
 * prefetched by an earlier stage 0), stage 2 that entry's state, or the next
 * entry of the chain when the head's hash is not the key's. Hints only: it reads the map as it is
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
    if (!cm_prefetch_past_head(m, e, h) && e->state) cm_prefetch_state(e->state);
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
        if (e && !cm_prefetch_past_head(m, cm_E(m, e), h) && want_state) cm_prefetch_state(cm_E(m, e)->state);
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

/* Every key of a batch through cm_batch_one, one after another: the general
 * path without its prefetches, the whole batch when COWMAP_PLAIN_BATCH is set.
 * The int64 probes are the ones cm_batch_probe makes, without the pipeline. */
static int cm_batch_plain(cm_map *m, const cm_keys *ks, const cm_batch *bt) {
    cm_probe p;
    for (Py_ssize_t i = 0; i < ks->n; i++) {
        PyObject *key = NULL;
        if (!ks->ints) {
            /* hold the key: its own __eq__ may drop it from a live list */
            if (!(key = cm_seq_item(ks->seq, i, "keys"))) return -1;
            Py_INCREF(key);
        }
        int r = cm_probe_at(ks, i, bt->ns, bt->hn, &p);
        if (r == 0) {
            if (key) p.key = key;
            r = cm_batch_one(m, bt, &p, i);
        }
        if (key) cm_grave(m, key);
        if (r < 0) return -1;
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
                cm_prefetch_state(cm_E(m, e)->state);
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
            cm_ts_note(m, bt->ts);
            cm_changed(m, e);
            continue;
        }
        Py_INCREF(ns_state);
        if (!hit) {
            e = cm_add_entry(m, &p, &m->primary);
            if (!e) { cm_grave(m, ns_state); return -1; }
            hit = cm_E(m, e);
        } else if (cm_ev(hit) < m->required) {
            /* the copy takes the new state: the old one stays with the
             * snapshot's entry, untouched */
            PyObject *own = ns_state;
            e = cm_chain_cow(m, &m->primary, h & cmask, e, &own);
            if (!e) { if (own) cm_grave(m, own); return -1; }
            hit = cm_E(m, e);
            if (!own) { hit->ts = bt->ts; cm_ts_note(m, bt->ts); cm_changed(m, e); continue; }
        }
        if (hit->state != ns_state) {
            PyObject *old = hit->state;
            hit->state = ns_state;
            cm_prefetch_state(old);
            PyObject **lp = &late[nlate++ & (CM_FLATE - 1u)];
            if (*lp) cm_grave(m, *lp);
            *lp = old;
        } else {
            Py_DECREF(ns_state); /* the entry holds it too: cannot be the last */
        }
        hit->sv = m->version;
        hit->ts = bt->ts;
        cm_ts_note(m, bt->ts);
        cm_changed(m, e);
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
        if (get && hit && m->dirty && cm_mutable_state(hit->state)) cm_changed(m, cm_index_of(m, *r->slot, hit));
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

/* INCREF the borrowed items out[start, stop) (independent read-modify-writes,
 * prefetched ahead), a tagged int made an int; -1 (MemoryError) if one cannot
 * be, the items all valid (None in its place). */
static int cm_incref_range(PyObject *out, Py_ssize_t start, Py_ssize_t stop) {
    PyObject **items = ((PyListObject *)out)->ob_item;
    int r = 0;
    for (Py_ssize_t i = start; i < stop; i++) {
        if (i + 16 < stop && !cm_tagged(items[i + 16])) CM_PREFETCH_W(items[i + 16]);
        if (!cm_tagged(items[i])) { Py_INCREF(items[i]); continue; }
        PyObject *o = r ? NULL : cm_state_ref(items[i]);
        if (!o) { r = -1; o = Py_NewRef(Py_None); }
        items[i] = o;
    }
    return r;
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
            (void)cm_incref_range(bt->out_list, start, i);
        } else if (cm_incref_range(bt->out_list, start, stop) < 0) {
            stop = -1;
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
    if (COWMAP_PLAIN_BATCH) {
        if (cm_batch_plain(m, ks, bt) < 0) goto done;
    } else {
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
    if (ks->ints && !COWMAP_PLAIN_BATCH) cm_pf_init(ks, &pf, hn); else pf.hn = hn;
    for (Py_ssize_t i = 0; i < ks->n; i++) {
        int r = -1;
        PyObject *key = NULL;
        if (!ks->ints) {
            /* hold the key: its own __hash__/__eq__ may drop it from a live list */
            if (!(key = cm_seq_item(ks->seq, i, "keys"))) { removed = -1; goto done; }
            Py_INCREF(key);
        }
        int pr = (COWMAP_PLAIN_BATCH || key) ? cm_probe_at(ks, i, ns, hn, &p)
                                             : cm_batch_probe(m, ks, i, ns, &pf, &p, 1);
        if (pr == 0) {
            if (key) p.key = key;
            r = cm_remove_probe(m, &p, NULL);
        }
        if (key) cm_grave(m, key);
        if (r < 0) {
            removed = -1;
            goto done;
        }
        removed += r;
    }
done:
    cm_leave(m);
    return removed;
}

#endif /* COWMAP_CM_BATCH_H */
