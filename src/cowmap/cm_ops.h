/*
 * cowmap core, part 3 of 10: the single-key operations, to be read side by
 * side with Flink's CopyOnWriteStateMap.
 *
 * Probes (a key and namespace hashed, cm_match), the busy flag (cm_enter and
 * cm_leave, where deferred releases, reclaim steps and the grave run), the
 * lookup that pays a rehash step first (cm_locate: Flink's
 * computeHashForOperationAndDoIncrementalRehash, selectActiveTable and the
 * chain walk), the write helpers (cm_add_entry: the tail of putEntry;
 * cm_writable: putEntry's copy-on-write check; cm_unlink: removeEntry's) and
 * the public single ops, each commented with the Flink method it matches.
 * Every other part that reads or writes a key is built from these helpers:
 * the batch ops (cm_batch.h) and the TTL reads (cm_ttl.h).
 *
 * Compiled only as part of cowmap_core.h, which includes the parts in order.
 */
#ifndef COWMAP_CM_OPS_H
#define COWMAP_CM_OPS_H

#include "cm_storage.h"

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
        cm_prefetch_state(e->state); /* a hit will INCREF it: overlap that miss with the compare */
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

/* cm_leave finishes releases and reclaims; both are defined with the snapshots (cm_snapshot.h) */
static void cm_release_now(cm_map *m, uint32_t version);
static void cm_reclaim_some(cm_map *m, size_t budget);

/* The error for a call into a map that is busy, with `owner` the thread that
 * made it so. A busy map is paused in Python code it runs (a key's __eq__ or
 * __hash__, a copier, ...): the call came from that code, or from another
 * thread the GIL switched to meanwhile. The maps of both kinds say which. */
static int cm_busy_error(const char *map, const char *callbacks, unsigned long owner) {
    if (owner != cm_thread_id())
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
    m->owner = cm_thread_id();
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
    cm_changed(m, i);
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

/* Unlink entry idx (found with predecessor prev) from bucket b of t and retire it
 * (the unlinking half of Flink's removeEntry). */
static int cm_unlink(cm_map *m, cm_table *t, uint32_t b, uint32_t idx, uint32_t prev) {
    const cm_entry *gone = cm_E(m, idx);
    uint32_t next = gone->next;
    if (!prev) {
        uint32_t *slot = cm_slot_w(m, t, b);
        if (!slot) return -1;
        *slot = next;
    } else {
        if (cm_ev(cm_E(m, prev)) < m->required && !(prev = cm_chain_cow(m, t, b, prev, NULL))) return -1;
        cm_E(m, prev)->next = next;
    }
    /* a removal is logged: its tombstone says it all */
    if (m->dirty) cm_gone_add(&m->gone, gone, m->size, &m->grave);
    m->size--;
    m->mod_count++;
    return cm_retire_entry(m, idx);
}

static inline int cm_state_shared(const cm_map *m, const cm_entry *e) {
    return e->sv < m->required;
}

/* Whether a read of e's state hands out a copy: a copier is set, the state is
 * an object (not None, not a tagged int) and a snapshot shares it. */
static inline int cm_copies_on_read(const cm_map *m, const cm_entry *e) {
    return m->copier && e->state != Py_None && !cm_tagged(e->state) && cm_state_shared(m, e);
}

/* New reference to the state of a located entry, copying it first if it is
 * shared with a snapshot and a copier is set (Flink's get). */
static PyObject *cm_read_state(cm_map *m, const cm_probe *p, const cm_loc *loc) {
    cm_entry *e = cm_E(m, loc->idx);
    if (m->dirty && cm_mutable_state(e->state)) cm_changed(m, loc->idx); /* a copy below takes the mark */
    if (cm_copies_on_read(m, e)) {
        PyObject *c = PyObject_CallOneArg(m->copier, e->state);
        if (!c) return NULL;
        uint32_t w = cm_writable(m, p, loc);
        if (!w) { Py_DECREF(c); return NULL; }
        e = cm_E(m, w);
        cm_grave(m, e->state);
        e->state = c;
        e->sv = m->version;
    }
    return cm_state_ref(e->state);
}

/* New reference to a state about to be handed out as "old": a copy if shared. */
static PyObject *cm_old_state(cm_map *m, const cm_entry *e) {
    if (cm_copies_on_read(m, e)) return PyObject_CallOneArg(m->copier, e->state);
    return cm_state_ref(e->state);
}

/* Replace the state of writable entry w (steals `state`). */
CM_ALWAYS_INLINE static inline void cm_set_state(cm_map *m, uint32_t w, PyObject *state, int64_t ts) {
    cm_entry *e = cm_E(m, w);
    PyObject *old = e->state;
    cm_changed(m, w);
    e->state = state;
    e->sv = m->version;
    e->ts = ts;
    cm_ts_note(m, ts);
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

/* Flink's get: the state, copied first if shared and a copier is set; None if absent. */
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
            if (w) { cm_E(m, w)->ts = ts; cm_ts_note(m, ts); cm_changed(m, w); r = 1; }
        }
    }
    cm_leave(m);
    return r;
}

/* Flink's containsKey: 1 / 0 / -1 */
static int cm_contains(cm_map *m, PyObject *key, PyObject *ns) {
    cm_probe p; cm_loc loc; int r = -1;
    if (cm_enter(m) < 0) return -1;
    if (cm_make_probe(&p, key, ns) == 0 && cm_locate(m, &p, &loc) == 0) r = loc.found;
    cm_leave(m);
    return r;
}

/* Flink's put (putEntry, then the state and its version set) */
static int cm_put(cm_map *m, PyObject *key, PyObject *ns, PyObject *state, int64_t ts) {
    cm_probe p; int r = -1;
    if (cm_enter(m) < 0) return -1;
    if (cm_make_probe(&p, key, ns) == 0) r = cm_put_probe(m, &p, state, ts);
    cm_leave(m);
    return r;
}

/* Flink's putAndGetOld: the old state, a copy if shared */
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

/* Flink's removeEntry. Removes if present; *old (if not NULL) receives the old
 * state or None. 1/0/-1. */
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

/* Flink's remove */
static int cm_remove(cm_map *m, PyObject *key, PyObject *ns) {
    cm_probe p; int r = -1;
    if (cm_enter(m) < 0) return -1;
    if (cm_make_probe(&p, key, ns) == 0) r = cm_remove_probe(m, &p, NULL);
    cm_leave(m);
    return r;
}

/* Flink's removeAndGetOld */
static PyObject *cm_remove_and_get_old(cm_map *m, PyObject *key, PyObject *ns) {
    cm_probe p; PyObject *old = NULL;
    if (cm_enter(m) < 0) return NULL;
    if (cm_make_probe(&p, key, ns) == 0) cm_remove_probe(m, &p, &old);
    cm_leave(m);
    return old;
}

/* Flink's transform: state = fn(old_or_None, value); fn runs while the map is
 * busy (it must not use the map). */
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

#endif /* COWMAP_CM_OPS_H */
