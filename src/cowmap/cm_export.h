/*
 * cowmap core, part 9 of 10: a snapshot read out whole, as columns.
 *
 * A checkpoint writes every entry of a snapshot. Walking the buckets (the
 * snapshot iterator) visits entries in hash order: a cache miss for the entry
 * and another for its state object, at every step. Here the entries are
 * marked in a bitmap over entry indices (the slots' heads, then each chain's
 * rest) and read in index order: the order they were allocated in, and
 * mostly the order their key and state objects were made in, so the reads
 * walk memory forward. Numbers come out as int64 / float64 columns with no
 * Python object made. The column readers take entry pointers, so the flat
 * map's snapshots (MapState, read in insertion order) use them too.
 *
 * Compiled only as part of cowmap_core.h, which includes the parts in order.
 */
#ifndef COWMAP_CM_EXPORT_H
#define COWMAP_CM_EXPORT_H

#include "cm_snapshot.h"

#define CM_X_KEYS_INT 1     /* every key is an int stored inline */
#define CM_X_NS_SAME 2      /* every namespace is the given object */
#define CM_X_NS_INT 4       /* every namespace is an exact int that fits in int64 */
#define CM_X_STATES_INT 8   /* every state is an exact int that fits in int64 */
#define CM_X_STATES_FLOAT 16 /* every state is an exact float */
#define CM_X_ALL (CM_X_KEYS_INT | CM_X_NS_SAME | CM_X_NS_INT | CM_X_STATES_INT | CM_X_STATES_FLOAT)
/* entries between requesting a state and reading it (an iteration takes a few ns,
 * a miss ~100: 16 gave 385 ms for 10M entries, 64 gave 340, 128 365) */
#define CM_X_PREFETCH 64u

/* The entries of snapshot s (at most cap of them) into ents, about in index
 * order; returns how many. `seen` holds (m->next_unused + 63) / 64 words,
 * zeroed: a bit per entry index, so no sort is needed. The slots are scanned
 * in order and their heads marked; then the marked indices are taken in
 * increasing order, each marking its `next`: a next above the current index
 * is reached later by the scan, one below it is followed at once (each entry
 * is on one chain, so each `next` is read once). The `next` reads then go
 * forward through memory where following chains from the slots would jump. */
static size_t cm_export_entries(const cm_map *m, const cm_snap *s, const cm_entry **ents, uint64_t *seen,
                                size_t cap) {
    uint32_t top = m->next_unused;
    for (int phase = 0; phase < 2; phase++) {
        const cm_tview *v = phase == 0 ? &s->primary : &s->rehash;
        if (!v->capacity) continue;
        uint32_t per = 1u << v->page_shift, b0 = phase == 0 ? s->rehash_index : 0;
        for (uint32_t pi = b0 >> v->page_shift; pi < v->npages; pi++) {
            const cm_page *p = v->pages[pi];
            if (!p) continue;
            for (uint32_t j = pi == (b0 >> v->page_shift) ? (b0 & (per - 1u)) : 0; j < per; j++) {
                uint32_t e = p->slots[j];
                if (e && e < top) seen[e >> 6] |= (uint64_t)1 << (e & 63u);
            }
        }
    }
    size_t n = 0;
    uint32_t words = (top + 63u) >> 6;
    for (uint32_t w = 0; w < words; w++) {
        while (seen[w]) { /* re-read: a chain followed below may mark more of this word */
            uint64_t bits = seen[w];
            uint32_t i = (w << 6) | (uint32_t)__builtin_ctzll(bits);
            seen[w] = bits & (bits - 1u);
            if (n >= cap) return n;
            const cm_entry *e = cm_E(m, i);
            ents[n++] = e;
            for (uint32_t nx = e->next; nx && nx < top; nx = cm_E(m, nx)->next) {
                if (nx > i) { /* reached by the scan */
                    seen[nx >> 6] |= (uint64_t)1 << (nx & 63u);
                    break;
                }
                if (n >= cap) return n;
                ents[n++] = cm_E(m, nx); /* below: taken now, a little out of order */
            }
        }
    }
    return n;
}

/* 1 with *out set if o is an exact int that fits in int64. */
static inline int cm_export_int(PyObject *o, int64_t *out) {
    if (!PyLong_CheckExact(o)) return 0;
    if (cm_fast_int(o, out)) return 1;
    int overflow;
    *out = (int64_t)PyLong_AsLongLongAndOverflow(o, &overflow);
    return !overflow;
}

/* Keys, namespaces, states and timestamps of ents[from..to) (of n) into the
 * same rows of int64 columns (a float state's bits into states; ts may be
 * NULL: not wanted); returns the CM_X_* flags that held for those rows. A
 * column whose flags are all off holds garbage. */
static int cm_export_numbers(const cm_entry *const *ents, size_t from, size_t to, size_t n, const PyObject *ns0,
                             int64_t *keys, int64_t *nss, int64_t *states, int64_t *ts) {
    int f = CM_X_ALL;
    for (size_t k = from; k < to; k++) {
        /* the entry twice as far ahead (its address is known), then its state
         * once the entry has arrived: the entries of an increment lie scattered */
        if (k + 2u * CM_X_PREFETCH < n) CM_PREFETCH(ents[k + 2u * CM_X_PREFETCH]);
        if (k + CM_X_PREFETCH < n && !cm_tagged(ents[k + CM_X_PREFETCH]->state))
            CM_PREFETCH(ents[k + CM_X_PREFETCH]->state);
        const cm_entry *e = ents[k];
        if (cm_intkey(e)) keys[k] = e->key.i; else f &= ~CM_X_KEYS_INT;
        if (e->ns != ns0) f &= ~CM_X_NS_SAME;
        if ((f & CM_X_NS_INT) && !cm_export_int(e->ns, &nss[k])) f &= ~CM_X_NS_INT;
        PyObject *st = e->state;
        if (cm_tagged(st)) {
            states[k] = cm_tag_value(st);
            f &= ~CM_X_STATES_FLOAT;
        } else if (PyLong_CheckExact(st)) {
            if (!cm_export_int(st, &states[k])) f &= ~CM_X_STATES_INT;
            f &= ~CM_X_STATES_FLOAT;
        } else if (PyFloat_CheckExact(st)) {
            double d = PyFloat_AS_DOUBLE(st);
            memcpy(&states[k], &d, sizeof d);
            f &= ~CM_X_STATES_INT;
        } else {
            f &= ~(CM_X_STATES_INT | CM_X_STATES_FLOAT);
        }
        if (ts) ts[k] = e->ts;
    }
    return f;
}

/* 1 if cm_export_numbers reads no Python object for entry e. */
static inline int cm_export_bare_row(const cm_entry *e, const PyObject *ns0) {
    return e->ns == ns0 && cm_tagged(e->state);
}

/* cm_export_numbers over ents[from..to) for as long as no Python object
 * need be read, so that it may run without the GIL: rows whose namespace is
 * ns0 (whether that is an int, and which, read beforehand: ns0_int, ns0_val)
 * and whose state is a tagged int. Returns the row it stopped at (to when it
 * read them all); *fp, CM_X_* flags so far, is narrowed as cm_export_numbers
 * would. The entries must stay put meanwhile: those of a pinned chained
 * snapshot do (a write to the map copies them). */
static size_t cm_export_numbers_bare(const cm_entry *const *ents, size_t from, size_t to, size_t n,
                                     const PyObject *ns0, int ns0_int, int64_t ns0_val, int64_t *keys,
                                     int64_t *nss, int64_t *states, int64_t *ts, int *fp) {
    int f = *fp;
    size_t k;
    for (k = from; k < to; k++) {
        if (k + 2u * CM_X_PREFETCH < n) CM_PREFETCH(ents[k + 2u * CM_X_PREFETCH]);
        const cm_entry *e = ents[k];
        if (!cm_export_bare_row(e, ns0)) break;
        if (cm_intkey(e)) keys[k] = e->key.i; else f &= ~CM_X_KEYS_INT;
        if (f & CM_X_NS_INT) {
            if (ns0_int) nss[k] = ns0_val; else f &= ~CM_X_NS_INT;
        }
        states[k] = cm_tag_value(e->state);
        f &= ~CM_X_STATES_FLOAT;
        if (ts) ts[k] = e->ts;
    }
    *fp = f;
    return k;
}

/* A copy of m's header to find a snapshot's entries through without the GIL:
 * its own copy of the chunk table (a write to m may grow m's, freeing the old
 * one; the chunks themselves never move). -1 when out of memory; the caller
 * frees it with cm_export_view_free (also after a failure). */
static int cm_export_view(const cm_map *m, cm_map *view) {
    *view = *m;
    view->chunks = (cm_entry **)PyMem_RawMalloc((m->nchunks ? m->nchunks : 1u) * sizeof(cm_entry *));
    if (!view->chunks) return -1;
    if (m->nchunks) memcpy(view->chunks, m->chunks, m->nchunks * sizeof(cm_entry *));
    return 0;
}

static void cm_export_view_free(cm_map *view) {
    PyMem_RawFree(view->chunks);
    view->chunks = NULL;
}

/* A list of one field (0 key, 1 namespace, 2 state) of ents[0..n). */
static PyObject *cm_export_list(const cm_entry *const *ents, size_t n, int field) {
    PyObject *out = PyList_New((Py_ssize_t)n);
    if (!out) return NULL;
    for (size_t k = 0; k < n; k++) {
        const cm_entry *e = ents[k];
        PyObject *o;
        if (field == 0) {
            o = cm_entry_key(e);
            if (!o) { Py_DECREF(out); return NULL; }
        } else {
            o = field == 1 ? Py_NewRef(e->ns) : cm_state_ref(e->state);
            if (!o) { Py_DECREF(out); return NULL; }
        }
        PyList_SET_ITEM(out, (Py_ssize_t)k, o);
    }
    return out;
}

#endif /* COWMAP_CM_EXPORT_H */
