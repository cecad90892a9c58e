/*
 * FlatStateMap, part 2 of 2: snapshots and the changes since a checkpoint
 * cut.
 *
 * A snapshot takes the map's version and a reference to each segment of the
 * directory (fm_snapshot) and gives them back on release (fm_release); reads
 * of it (fm_snap_next, fm_snap_at) go through part 1's fm_snap_slot, which
 * picks a page's live contents or the saved copy covering the snapshot's
 * version; fm_snap_order lists its entries in insertion order. fm_cut hands
 * over the dirty bits and removals since the last cut for a snapshot taken
 * just before it, and fm_changed_entries lists what those bits mark. A part of its own because none of it is on the path of a get or
 * a put: it reads what the writes in part 1 leave (page versions, copies,
 * dirty bits).
 *
 * Compiled only as part of flatmap.h, which includes it last.
 */
#ifndef COWMAP_FM_SNAPSHOT_H
#define COWMAP_FM_SNAPSHOT_H

/* ------------------------------------------------------------- snapshots */

static int fm_snapshot(fm_map *m, fm_snap *snap) {
    uint32_t n = 0;
    if (fm_enter(m) < 0) return -1;
    for (uint32_t k = 0; k < (1u << m->gdepth); k += fm_run(m, k)) n++;
    snap->segs = PyMem_RawMalloc((size_t)n * sizeof(fm_seg *));
    if (!snap->segs || cm_u32vec_push(&m->snaps, m->version) < 0) {
        if (!snap->segs) PyErr_NoMemory();
        PyMem_RawFree(snap->segs);
        snap->segs = NULL;
        fm_leave(m);
        return -1;
    }
    snap->nsegs = 0;
    for (uint32_t k = 0; k < (1u << m->gdepth); k += fm_run(m, k)) {
        m->segs[k]->refs++;
        snap->segs[snap->nsegs++] = m->segs[k];
    }
    snap->version = m->version;
    snap->size = m->size;
    m->required = m->version;
    m->version++;
    fm_leave(m);
    return 0;
}

/* Whether a live snapshot's version lies in [from, to). */
static int fm_needed(const fm_map *m, uint32_t from, uint32_t to) {
    for (size_t k = 0; k < m->snaps.n; k++)
        if (m->snaps.a[k] >= from && m->snaps.a[k] < to) return 1;
    return 0;
}

static void fm_release(fm_map *m, fm_snap *snap) {
    if (!snap->segs) return;
    size_t w = 0;
    for (size_t k = 0; k < m->snaps.n; k++)
        if (m->snaps.a[k] != snap->version) m->snaps.a[w++] = m->snaps.a[k];
    m->snaps.n = w;
    m->required = w ? m->snaps.a[w - 1] : 0;
    int was_busy = m->busy;
    if (!was_busy) {
        m->busy = 1;
        m->owner = cm_thread_id();
    }
    for (uint32_t j = 0; j < snap->nsegs; j++) {
        fm_seg *s = snap->segs[j];
        if (s->copies) {
            for (uint32_t p = 0; p < s->npages; p++) {
                fm_copy **link = &s->copies[p];
                while (*link) {
                    fm_copy *c = *link;
                    if (fm_needed(m, c->from, c->to)) { link = &c->next; continue; }
                    *link = c->next;
                    fm_copy_free(m, s, c);
                }
            }
        }
        fm_seg_decref(m, s);
    }
    PyMem_RawFree(snap->segs);
    snap->segs = NULL;
    if (!was_busy) fm_leave(m);
}

/* The next entry of the snapshot from position (*j segment, *i slot) on, or
 * NULL at the end. */
static const cm_entry *fm_snap_next(const fm_snap *snap, uint32_t *j, uint32_t *i) {
    while (*j < snap->nsegs) {
        const fm_seg *s = snap->segs[*j];
        while (*i < fm_cap(s)) {
            const cm_entry *e = fm_snap_slot(s, (*i)++, snap->version);
            if (e && fm_used(e)) return e;
        }
        (*j)++;
        *i = 0;
    }
    return NULL;
}

/* A snapshot entry's position, by insertion sequence number. */
typedef struct {
    uint64_t seq;
    uint32_t j, i;   /* segment of the snapshot, slot */
} fm_pos;

static int fm_pos_cmp(const void *a, const void *b) {
    uint64_t x = ((const fm_pos *)a)->seq, y = ((const fm_pos *)b)->seq;
    return (x > y) - (x < y);
}

/* The positions of the snapshot's entries in insertion order, in a new array
 * (PyMem_RawFree it) of *n items; NULL with MemoryError set. Positions, not
 * entries: a write to the map after this call may save the entry's page, and
 * fm_snap_slot finds the entry as the snapshot sees it at any time. */
static fm_pos *fm_snap_order(const fm_snap *snap, size_t *n) {
    fm_pos *a = (fm_pos *)PyMem_RawMalloc(((size_t)snap->size + 1u) * sizeof(fm_pos));
    if (!a) { PyErr_NoMemory(); return NULL; }
    uint32_t j = 0, i = 0;
    size_t k = 0;
    const cm_entry *e;
    while (k < snap->size && (e = fm_snap_next(snap, &j, &i)) != NULL) {
        a[k].seq = fm_seq(e);
        a[k].j = j;
        a[k].i = i - 1u; /* fm_snap_next has moved past it */
        k++;
    }
    *n = k;
    if (k < 2) return a;
    /* The sequence numbers are distinct, and dense unless many entries were
     * removed: then each one's place is its number less the smallest, found
     * in O(range) (1M MapState entries over 128 key groups read out in 43 ms,
     * against 130 with qsort); else a sort. */
    uint64_t lo = a[0].seq, hi = a[0].seq;
    for (size_t x = 1; x < k; x++) {
        if (a[x].seq < lo) lo = a[x].seq;
        if (a[x].seq > hi) hi = a[x].seq;
    }
    uint64_t range = hi - lo + 1u;
    uint32_t *at = range <= 4u * (uint64_t)k ? (uint32_t *)PyMem_RawCalloc((size_t)range, sizeof(uint32_t)) : NULL;
    fm_pos *b = at ? (fm_pos *)PyMem_RawMalloc((k + 1u) * sizeof(fm_pos)) : NULL;
    if (!b) { /* sparse, or no memory for the placement: sort */
        PyMem_RawFree(at);
        qsort(a, k, sizeof(fm_pos), fm_pos_cmp);
        return a;
    }
    for (size_t x = 0; x < k; x++) at[a[x].seq - lo] = (uint32_t)x + 1u;
    size_t y = 0;
    for (uint64_t r = 0; r < range; r++)
        if (at[r]) b[y++] = a[at[r] - 1u];
    PyMem_RawFree(at);
    PyMem_RawFree(a);
    return b;
}

/* The entry at position p of the snapshot, as the snapshot sees it. */
static inline const cm_entry *fm_snap_at(const fm_snap *snap, const fm_pos *p) {
    return fm_snap_slot(snap->segs[p->j], p->i, snap->version);
}

/* ------------------------------------------------- changes since a cut */

/* Hands the changes since the last cut over, for snapshot snap taken just
 * before (its segments are the live ones): out[j] = the dirty bits of
 * snap->segs[j] (NULL where the map was not tracking), *gone = the removed
 * entries; every segment gets fresh bits and tracking goes on from now.
 * Returns whether the map was tracking (0: the changes are unknown), or -1
 * out of memory (MemoryError set, nothing changed). */
static int fm_cut(fm_map *m, const fm_snap *snap, uint64_t **out, cm_gonelog *gone) {
    for (uint32_t j = 0; j < snap->nsegs; j++) {
        out[j] = PyMem_RawCalloc(fm_dirty_words(snap->segs[j]), sizeof(uint64_t));
        if (!out[j]) {
            while (j) PyMem_RawFree(out[--j]);
            PyErr_NoMemory();
            return -1;
        }
    }
    for (uint32_t j = 0; j < snap->nsegs; j++) {
        fm_seg *s = snap->segs[j];
        uint64_t *fresh = out[j];
        out[j] = s->dirty;
        s->dirty = fresh;
    }
    *gone = m->gone;
    memset(&m->gone, 0, sizeof m->gone);
    int was = m->tracking;
    m->tracking = 1;
    return was;
}

static int fm_seq_cmp(const void *a, const void *b) {
    uint64_t x = fm_seq(*(const cm_entry *const *)a), y = fm_seq(*(const cm_entry *const *)b);
    return (x > y) - (x < y);
}

/* The entries of snapshot snap whose home slots are marked in bits (from
 * fm_cut), appended to out in insertion order (so a restore that appends the
 * new ones keeps the map's order; what out held before stays as it was, other
 * maps' entries): each marked home's probe run is read up to its
 * first empty slot. The homes are listed first and their slots requested
 * FM_CH_AHEAD homes before they are read (the changes lie scattered: a cache
 * miss each). O(marked slots + their runs, and a sort); -1 out of memory. */
#define FM_CH_AHEAD 16u
static int fm_changed_entries(const fm_snap *snap, uint64_t *const *bits, cm_ptrvec *out) {
    cm_u32vec todo = {0}; /* (segment, home) pairs */
    const size_t start = out->n; /* entries already in out (other maps') stay where they are */
    int rc = -1;
    for (uint32_t j = 0; j < snap->nsegs; j++) {
        const uint64_t *b = bits[j];
        if (!b) continue;
        for (size_t w = 0; w < fm_dirty_words(snap->segs[j]); w++)
            for (uint64_t word = b[w]; word; word &= word - 1u)
                if (cm_u32vec_push(&todo, j) < 0 ||
                    cm_u32vec_push(&todo, (uint32_t)(w << 6) | (uint32_t)__builtin_ctzll(word)) < 0)
                    goto done;
    }
    size_t n = todo.n / 2u;
    for (size_t i = 0; i < n + FM_CH_AHEAD; i++) {
        if (i < n) {
            const cm_entry *e = &snap->segs[todo.a[2u * i]]->e[todo.a[2u * i + 1u]];
            CM_PREFETCH(e);
            CM_PREFETCH((const char *)e + sizeof(cm_entry) - 1u);
        }
        size_t k = i - FM_CH_AHEAD;
        if (i < FM_CH_AHEAD || k >= n) continue;
        const fm_seg *s = snap->segs[todo.a[2u * k]];
        uint32_t mask = fm_cap(s) - 1u, h = todo.a[2u * k + 1u], at = h;
        do {
            const cm_entry *e = fm_snap_slot(s, at, snap->version);
            if (!e || !fm_used(e)) break;
            if ((fm_hash(e) & mask) == h && cm_ptrvec_push(out, (void *)e) < 0) goto done;
            at = (at + 1u) & mask;
        } while (at != h);
    }
    if (out->n - start > 1) qsort(out->a + start, out->n - start, sizeof(void *), fm_seq_cmp);
    rc = 0;
done:
    PyMem_RawFree(todo.a);
    return rc;
}

#endif /* COWMAP_FM_SNAPSHOT_H */
