# cython: language_level=3
"""C declarations of the core map (cowmap_core.h)."""

from cpython.object cimport PyObject
from libc.stdint cimport int32_t, int64_t, uint8_t, uint32_t, uint64_t


cdef extern from "cowmap_core.h":
    int64_t CM_NO_TS
    bint COWMAP_PLAIN_BATCH
    bint CM_CPYTHON_INTERNALS  # cpython_internals.h

    ctypedef struct cm_table:
        uint32_t capacity

    ctypedef struct cm_cursor:
        int phase
        uint32_t pos

    ctypedef struct cm_vpos:
        int n

    ctypedef struct cm_map:
        cm_table primary
        cm_table rehash
        uint32_t rehash_index
        uint32_t size
        uint32_t version
        uint32_t required
        uint64_t mod_count
        uint32_t next_unused
        uint64_t npages_live
        int64_t ts_floor
        uint32_t nsnaps
        size_t rq_items
        PyObject *copier

    ctypedef struct cm_snap:
        uint32_t version
        uint32_t size

    ctypedef struct cm_snapit:
        pass

    ctypedef struct cm_keys:
        PyObject *seq
        const int64_t *ints
        Py_ssize_t n

    int CM_X_KEYS_INT, CM_X_NS_SAME, CM_X_NS_INT, CM_X_STATES_INT, CM_X_STATES_FLOAT

    int cm_init(cm_map *m, uint32_t capacity) except -1
    void cm_dealloc(cm_map *m)
    int cm_enter(cm_map *m) except -1
    void cm_leave(cm_map *m)

    object cm_get(cm_map *m, object key, object ns)
    object cm_get_with_ts(cm_map *m, object key, object ns)
    object cm_timestamp(cm_map *m, object key, object ns)
    int cm_set_timestamp(cm_map *m, object key, object ns, int64_t ts) except -1
    int cm_contains(cm_map *m, object key, object ns) except -1
    int cm_put(cm_map *m, object key, object ns, object state, int64_t ts) except -1
    object cm_put_and_get_old(cm_map *m, object key, object ns, object state, int64_t ts)
    int cm_remove(cm_map *m, object key, object ns) except -1
    object cm_remove_and_get_old(cm_map *m, object key, object ns)
    int cm_transform(cm_map *m, object key, object ns, object value, object fn, int64_t ts) except -1

    bint cm_hint_composite(PyObject *key, PyObject *ns, uint32_t *h)
    void cm_hint_at(const cm_map *m, uint32_t h, int stage)

    object cm_get_many(cm_map *m, const cm_keys *ks, object ns)
    int cm_put_many(cm_map *m, const cm_keys *ks, object ns, PyObject *states, int64_t ts) except -1
    int cm_contains_many(cm_map *m, const cm_keys *ks, object ns, uint8_t *out) except -1
    Py_ssize_t cm_remove_many(cm_map *m, const cm_keys *ks, object ns) except -1

    int cm_check_ttl(int64_t ttl) except -1
    int cm_expired(int64_t ts, int64_t ttl, int64_t now)
    void CM_PREFETCH(const void *p)
    object cm_get_unexpired(cm_map *m, object key, object ns, int64_t now, int64_t ttl, int refresh, object expired)
    object cm_get_touch(cm_map *m, object key, object ns, int64_t ts)
    int cm_replace(cm_map *m, object key, object ns, object state, int64_t ts) except -1
    Py_ssize_t cm_sweep(cm_map *m, int64_t now, int64_t ttl, Py_ssize_t max_entries, PyObject *sink) except -1

    int cm_snapshot(cm_map *m, cm_snap *s) except -1
    void cm_release(cm_map *m, cm_snap *s)
    object cm_snapshot_versions(const cm_map *m)
    Py_ssize_t cm_reclaim(cm_map *m, Py_ssize_t budget) except -1
    void cm_snapit_init(const cm_snap *s, cm_snapit *it)
    uint32_t cm_snapit_next(const cm_map *m, const cm_snap *s, cm_snapit *it)
    object cm_entry_tuple(const void *e, int with_ts)
    const void *cm_E(const cm_map *m, uint32_t i)

    int cm_collect_logical(const cm_map *m, uint32_t base_cap, uint32_t j, object out) except -1
    void cm_cursor_reset(const cm_map *m, cm_cursor *c)
    int cm_visit_next(cm_map *m, cm_cursor *c, uint32_t max_empty, cm_vpos *out)
    object cm_chain_list(const cm_map *m, const cm_vpos *vp)
    size_t cm_bytes(const cm_map *m)

    int CM_COL_GET, CM_COL_PUT, CM_COL_REMOVE, CM_COL_CONTAINS, CM_COL_FOLD
    int CM_FOLD_ADD, CM_FOLD_MIN, CM_FOLD_MAX
    ctypedef struct cm_colmark:
        const cm_map *m
        uint64_t serial
        uint64_t mod
        uint32_t version
    ctypedef struct cm_col:
        int op
        Py_ssize_t n
        const int64_t *ikeys
        PyObject **okeys
        const int32_t *kgs
        cm_map **maps
        Py_ssize_t nmaps
        PyObject *ns
        int64_t now
        int64_t ttl
        int refresh
        int peek
        PyObject **out
        int64_t *iout
        double *fout
        uint8_t *status
        PyObject *const *states
        const int64_t *istates
        const double *fstates
        int64_t ts
        const int64_t *tss
        int fold
        int return_expired
        PyObject *unfit
        uint32_t *locs
        cm_colmark *marks
        Py_ssize_t located
        Py_ssize_t typed_live
        Py_ssize_t nslow
    int cm_col_run(cm_col *c) except -1
    Py_ssize_t cm_col_seen(const int32_t *kgs, Py_ssize_t n, Py_ssize_t nmaps, uint8_t *seen)
    uint32_t cm_nfree(const cm_map *m)


cdef extern from "hugealloc.h":
    ctypedef struct cm_ha_state:
        size_t live
        size_t prefaulted
    cm_ha_state cm_ha
    size_t cm_ha_mapped()
    size_t cm_ha_spare()
    int cm_ha_huge_pages()


cdef extern from "flatmap.h":
    ctypedef struct cm_entry:
        pass

    ctypedef struct fm_map:
        PyObject *copier
        uint32_t size
        uint32_t version
        uint32_t required
        uint32_t gdepth
        uint64_t mod_count
        int64_t ts_floor

    ctypedef struct fm_snap:
        uint32_t version
        uint32_t size
        uint32_t nsegs

    int fm_init(fm_map *m, uint32_t max_shift) except -1
    void fm_dealloc(fm_map *m)
    int fm_put(fm_map *m, object key, object ns, object state, int64_t ts) except -1
    object fm_get(fm_map *m, object key, object ns)
    object fm_get_unexpired(fm_map *m, object key, object ns, int64_t now, int64_t ttl, int refresh,
                            object expired)
    object fm_remove_and_get_old(fm_map *m, object key, object ns)
    int fm_contains(fm_map *m, object key, object ns) except -1
    int fm_enter(fm_map *m) except -1
    void fm_leave(fm_map *m)
    void fm_col_lookup(fm_map *const *maps, const int32_t *kgs, const int64_t *ukeys, const int64_t *nss,
                       Py_ssize_t n, int64_t now, int64_t ttl, uint8_t *out)
    int fm_timestamp(fm_map *m, object key, object ns, int64_t *ts) except -1
    int fm_replace(fm_map *m, object key, object ns, object state, int64_t ts) except -1
    void fm_hint_at(const fm_map *m, uint32_t h, int stage)
    int fm_remove(fm_map *m, object key, object ns, PyObject **old) except -1
    Py_ssize_t fm_sweep(fm_map *m, int64_t now, int64_t ttl, Py_ssize_t max_entries, PyObject *sink) except -1
    void fm_prefetch(const fm_map *m, uint32_t h)
    int fm_snapshot(fm_map *m, fm_snap *s) except -1
    void fm_release(fm_map *m, fm_snap *s)
    const cm_entry *fm_snap_next(const fm_snap *s, uint32_t *j, uint32_t *i)
    ctypedef struct fm_pos:
        pass
    fm_pos *fm_snap_order(const fm_snap *s, size_t *n) except NULL
    const cm_entry *fm_snap_at(const fm_snap *s, const fm_pos *p)
    uint32_t FM_MAX_SHIFT_DEFAULT

    ctypedef struct cm_gonelog:
        size_t n
        int lost
    ctypedef struct cm_ptrvec:
        void **a
        size_t n
    ctypedef struct cm_changes:
        uint64_t *bits
        cm_gonelog gone
    int cm_cut(cm_map *m, cm_changes *out) except -1
    void cm_changes_free(cm_changes *c)
    int cm_changed_entries(const cm_map *m, const cm_changes *c, cm_ptrvec *out) except -1
    int fm_cut(fm_map *m, const fm_snap *snap, uint64_t **out, cm_gonelog *gone) except -1
    int fm_changed_entries(const fm_snap *snap, uint64_t *const *bits, cm_ptrvec *out) except -1
    void cm_gone_free(cm_gonelog *g)
    int cm_gone_numbers(const cm_gonelog *g, const PyObject *ns0, int64_t *keys)
    void cm_gone_ptrs(const cm_gonelog *g, const cm_entry **out)

    size_t cm_export_entries(const cm_map *m, const cm_snap *s, const cm_entry **ents, uint64_t *seen, size_t cap) nogil
    int cm_export_numbers(const cm_entry *const *ents, size_t start, size_t stop, size_t n, const PyObject *ns0,
                          int64_t *keys, int64_t *nss, int64_t *states, int64_t *ts)
    int CM_X_ALL
    size_t cm_export_numbers_bare(const cm_entry *const *ents, size_t start, size_t stop, size_t n,
                                  const PyObject *ns0, int ns0_int, int64_t ns0_val, int64_t *keys, int64_t *nss,
                                  int64_t *states, int64_t *ts, int *fp) nogil
    int cm_export_view(const cm_map *m, cm_map *view)
    void cm_export_view_free(cm_map *view)
    int cm_export_bare_row(const cm_entry *e, const PyObject *ns0)
    int cm_export_int(PyObject *o, int64_t *out)
    object cm_export_list(const cm_entry *const *ents, size_t n, int field)
    uint32_t FM_MIN_SHIFT
