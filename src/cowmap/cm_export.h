/*
 * cowmap core, part 9 of 9: a snapshot read out whole, as columns.
 *
 * A checkpoint writes every entry of a snapshot. Walking the buckets (the
 * snapshot iterator) visits entries in hash order: a cache miss for the entry
 * and another for its state object, at every step. Here the entry indices are
 * collected first (a sequential scan of the slots, then the rest of each
 * chain, prefetched ahead), sorted, and the entries read in storage order:
 * the order they were allocated in, and mostly the order their key and state
 * objects were made in, so the reads walk memory forward. Numbers come out as
 * int64 / float64 columns with no Python object made.
 *
 * Compiled only as part of cowmap_core.h, which includes the parts in order.
 */
#ifndef COWMAP_CM_EXPORT_H
#define COWMAP_CM_EXPORT_H

#include "cm_snapshot.h"

#define CM_X_KEYS_INT 1     /* every key is an int stored inline */
#define CM_X_NS_SAME 2      /* every namespace is the given object */
#define CM_X_STATES_INT 4   /* every state is an exact int that fits in int64 */
#define CM_X_STATES_FLOAT 8 /* every state is an exact float */
#define CM_X_PREFETCH 16

/* idx[0..n) sorted in place (LSD radix, 11 bits a pass, only the passes the
 * largest index needs); tmp holds n items. */
static void cm_export_sort(uint32_t *idx, uint32_t *tmp, size_t n) {
    uint32_t top = 0;
    for (size_t i = 0; i < n; i++) top |= idx[i];
    for (unsigned shift = 0; shift < 32 && (top >> shift); shift += 11) {
        size_t count[2048] = {0};
        for (size_t i = 0; i < n; i++) count[(idx[i] >> shift) & 2047u]++;
        size_t sum = 0;
        for (size_t d = 0; d < 2048; d++) { size_t c = count[d]; count[d] = sum; sum += c; }
        for (size_t i = 0; i < n; i++) tmp[count[(idx[i] >> shift) & 2047u]++] = idx[i];
        memcpy(idx, tmp, n * sizeof(uint32_t));
    }
}

/* The entry indices of snapshot s (at most cap of them), in storage order;
 * returns how many. */
static size_t cm_export_indices(const cm_map *m, const cm_snap *s, uint32_t *idx, uint32_t *tmp, size_t cap) {
    size_t n = 0;
    for (int phase = 0; phase < 2; phase++) {
        const cm_tview *v = phase == 0 ? &s->primary : &s->rehash;
        if (!v->capacity) continue;
        uint32_t per = 1u << v->page_shift, b0 = phase == 0 ? s->rehash_index : 0;
        for (uint32_t pi = b0 >> v->page_shift; pi < v->npages; pi++) {
            const cm_page *p = v->pages[pi];
            if (!p) continue;
            for (uint32_t j = pi == (b0 >> v->page_shift) ? (b0 & (per - 1u)) : 0; j < per; j++) {
                uint32_t e = p->slots[j];
                if (e && n < cap) idx[n++] = e;
            }
        }
    }
    /* The heads sorted, their `next` links are read in storage order: a
     * forward walk, where reading them in slot order would jump. Only the
     * rest of each chain (about one entry in four at a full table) is a jump. */
    size_t heads = n;
    cm_export_sort(idx, tmp, heads);
    for (size_t h = 0; h < heads; h++) {
        uint32_t e = cm_E(m, idx[h])->next;
        while (e && n < cap) {
            idx[n++] = e;
            e = cm_E(m, e)->next;
        }
    }
    if (n > heads) cm_export_sort(idx, tmp, n);
    return n;
}

/* Keys, states and timestamps of the entries idx[0..n) into int64 columns
 * (a float state's bits into states); returns the CM_X_* flags that held.
 * A column whose flag is off holds garbage. */
static int cm_export_numbers(const cm_map *m, const uint32_t *idx, size_t n, const PyObject *ns0,
                             int64_t *keys, int64_t *states, int64_t *ts) {
    int f = CM_X_KEYS_INT | CM_X_NS_SAME | CM_X_STATES_INT | CM_X_STATES_FLOAT;
    for (size_t k = 0; k < n; k++) {
        if (k + CM_X_PREFETCH < n) CM_PREFETCH(cm_E(m, idx[k + CM_X_PREFETCH])->state);
        const cm_entry *e = cm_E(m, idx[k]);
        if (cm_intkey(e)) keys[k] = e->key.i; else f &= ~CM_X_KEYS_INT;
        if (e->ns != ns0) f &= ~CM_X_NS_SAME;
        PyObject *st = e->state;
        if (PyLong_CheckExact(st)) {
            int64_t v;
            if (!cm_fast_int(st, &v)) {
                int overflow;
                v = (int64_t)PyLong_AsLongLongAndOverflow(st, &overflow);
                if (overflow) f &= ~CM_X_STATES_INT;
            }
            states[k] = v;
            f &= ~CM_X_STATES_FLOAT;
        } else if (PyFloat_CheckExact(st)) {
            double d = PyFloat_AS_DOUBLE(st);
            memcpy(&states[k], &d, sizeof d);
            f &= ~CM_X_STATES_INT;
        } else {
            f &= ~(CM_X_STATES_INT | CM_X_STATES_FLOAT);
        }
        ts[k] = e->ts;
    }
    return f;
}

/* A list of one field (0 key, 1 namespace, 2 state) of the entries idx[0..n). */
static PyObject *cm_export_list(const cm_map *m, const uint32_t *idx, size_t n, int field) {
    PyObject *out = PyList_New((Py_ssize_t)n);
    if (!out) return NULL;
    for (size_t k = 0; k < n; k++) {
        const cm_entry *e = cm_E(m, idx[k]);
        PyObject *o;
        if (field == 0) {
            o = cm_entry_key(e);
            if (!o) { Py_DECREF(out); return NULL; }
        } else {
            o = field == 1 ? e->ns : e->state;
            Py_INCREF(o);
        }
        PyList_SET_ITEM(out, (Py_ssize_t)k, o);
    }
    return out;
}

#endif /* COWMAP_CM_EXPORT_H */
