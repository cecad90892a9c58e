/*
 * cowmap core, part 6 of 10: walking the live map, and TTL.
 *
 * Iteration of the live map by logical bucket (cm_collect_logical), the
 * incremental visitor (Flink's StateIncrementalVisitor: cm_visit_next hands
 * out whole chains and stays correct across rehashes), the TTL sweep built on
 * it (cm_sweep, Flink's incremental cleanup), and the single-key reads and
 * writes that TTL states make (cm_get_unexpired, cm_get_touch, cm_replace).
 * A part of its own because expiry is cowmap's addition to the map: Flink
 * wraps each value with its timestamp, here the timestamp is the entry's ts
 * field and the expiry check runs in C.
 *
 * Compiled only as part of cowmap_core.h, which includes the parts in order.
 */
#ifndef COWMAP_CM_TTL_H
#define COWMAP_CM_TTL_H

#include "cm_snapshot.h"

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
            if (e->ts < m->round_min) m->round_min = e->ts; /* the round's least (cm_sweep) */
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
    if (cm_check_ttl(ttl) < 0) return -1;
    if (!cm_expired(m->ts_floor, ttl, now)) return 0; /* no entry has expired: nothing to look at */
    if (cm_enter(m) < 0) return -1;
    Py_ssize_t removed = 0, examined = 0;
    int full = max_entries < 0;
    if (full || m->sweep.phase >= 2) {
        cm_cursor_reset(m, &m->sweep);
        m->round_min = INT64_MAX; /* a new round: what it sees and what is written meanwhile */
    }
    uint32_t budget = full || max_entries >= (Py_ssize_t)UINT32_MAX ? UINT32_MAX
                                                                    : (uint32_t)(max_entries > 0 ? max_entries : 1);
    uint32_t pf = m->sweep.pos; /* next position to prefetch: entries are scattered, slots are not */
    while (full || examined < max_entries) {
        cm_vpos vp;
        if (pf < m->sweep.pos) pf = m->sweep.pos;
        for (uint32_t want = m->sweep.pos + CM_SWEEP_PF; pf < want; pf++) cm_visit_prefetch(m, pf);
        int r = cm_visit_next(m, &m->sweep, budget, &vp);
        if (r < 0) {
            /* the round saw every entry present throughout, and cm_ts_note
             * every ts written meanwhile: no live entry is below its least */
            m->ts_floor = m->round_min;
            m->sweep.phase = 2; /* the next call starts a new round */
            break;
        }
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
        if (w) { cm_E(m, w)->ts = ts; cm_ts_note(m, ts); cm_changed(m, w); }
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

#endif /* COWMAP_CM_TTL_H */
