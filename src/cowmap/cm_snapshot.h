/*
 * cowmap core, part 5 of 10: snapshots (Flink's stateSnapshot and
 * releaseSnapshot).
 *
 * Taking one (cm_snapshot copies the page-pointer arrays and moves the map
 * version on), releasing it (its retired entries and pages join the reclaim
 * queue in O(1)), reclaiming that queue in bounded steps, and reading a
 * snapshot (cm_snapit_next, cm_entry_tuple). The writers' side of
 * copy-on-write is in cm_storage.h (cm_slot_w, cm_chain_cow); this part keeps
 * the books on which snapshot holds what alive. A snapshot reads only its own
 * copy of the page pointers, and the pages and entries they lead to are never
 * changed in place, so another thread may read it while the owner writes.
 *
 * Compiled only as part of cowmap_core.h, which includes the parts in order.
 */
#ifndef COWMAP_CM_SNAPSHOT_H
#define COWMAP_CM_SNAPSHOT_H

#include "cm_ops.h"

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

/* Flink's snapshotMapArrays (version bump and registration included), in
 * O(capacity / 4096): copies the page-pointer arrays only. */
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

/* Flink's releaseSnapshot(version): unregister a snapshot; its retired items
 * join the reclaim queue (O(1)). */
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
            if (b->ents.n > 8) cm_prefetch_state(cm_E(m, b->ents.a[b->ents.n - 9])->state);
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
    m->owner = cm_thread_id();
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
    PyObject *ns = e->ns, *state = cm_state_ref(e->state); /* a tagged int's object: no GC */
    long long ts = (long long)e->ts;
    if (!state) return NULL;
    Py_INCREF(ns);
    PyObject *k = cm_entry_key(e);
    if (!k) { Py_DECREF(ns); Py_DECREF(state); return NULL; }
    if (with_ts) return Py_BuildValue("(NNNL)", k, ns, state, ts);
    return Py_BuildValue("(NNN)", k, ns, state);
}

#endif /* COWMAP_CM_SNAPSHOT_H */
