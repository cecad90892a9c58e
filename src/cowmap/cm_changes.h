/*
 * cowmap core, part 10 of 10: what changed since a checkpoint's cut.
 *
 * An incremental checkpoint writes only the entries written or removed since
 * the last one. Finding them must not cost a pass over every entry, so a
 * tracking map keeps a bit per entry index, set while the entry is live and
 * has been written, had its timestamp refreshed or its mutable state read
 * since the cut (cm_changed, at the write sites of every part). A copy of a
 * marked entry (copy-on-write, rehash) takes its mark; an entry leaving the
 * live map (cm_retire_entry) drops it; removals go to a log of the removed
 * keys instead (cm_unlink). So at a cut every marked index is an entry of the
 * cut's snapshot. A cut, taken with a checkpoint's snapshot, hands the bits
 * and the log over and starts afresh; the checkpoint then reads the marked
 * entries in index order (memory order: no slot or chain is read) and writes
 * the log as tombstones.
 *
 * Compiled only as part of cowmap_core.h, which includes the parts in order.
 */
#ifndef COWMAP_CM_CHANGES_H
#define COWMAP_CM_CHANGES_H

#include "cm_export.h"

/* What a cut hands over: bits NULL when the map was not tracking (then its
 * changes are unknown), else the marked entries (nbits bits) and the removed keys. */
typedef struct {
    uint64_t *bits;
    uint32_t nbits;
    cm_gonelog gone;
} cm_changes;

static void cm_changes_free(cm_changes *c) {
    PyMem_RawFree(c->bits);
    c->bits = NULL;
    cm_gone_free(&c->gone);
}

/* Hands the changes since the last cut to *out and tracks afresh from now:
 * 0, or -1 out of memory (MemoryError set; the map as it was). */
static int cm_cut(cm_map *m, cm_changes *out) {
    /* every index in use, rounded up to whole words (cm_changed grows it later) */
    uint64_t want = ((uint64_t)m->next_unused + 63u) & ~(uint64_t)63u;
    uint32_t nbits = want > CM_DIRTY_MOST ? (uint32_t)CM_DIRTY_MOST : (uint32_t)want;
    uint64_t *bits = (uint64_t *)PyMem_RawCalloc(nbits >> 6, sizeof(uint64_t));
    if (!bits) { PyErr_NoMemory(); return -1; }
    out->bits = m->dirty;
    out->nbits = m->dbits;
    out->gone = m->gone;
    m->dirty = bits;
    m->dbits = nbits;
    memset(&m->gone, 0, sizeof m->gone);
    return 0;
}

/* The entries marked in c (of the snapshot cut with it) appended to out, in
 * index order (pointers into the map, valid while the snapshot is).
 * O(marked entries + indices / 64); -1 out of memory. */
static int cm_changed_entries(const cm_map *m, const cm_changes *c, cm_ptrvec *out) {
    for (uint32_t w = 0; w < (c->nbits >> 6); w++)
        for (uint64_t bits = c->bits[w]; bits; bits &= bits - 1u)
            if (cm_ptrvec_push(out, cm_E(m, (w << 6) | (uint32_t)__builtin_ctzll(bits))) < 0) return -1;
    return 0;
}

/* The removed entries' keys into keys[0..g->n) when every key is an int
 * stored inline: CM_X_KEYS_INT, with CM_X_NS_SAME when every namespace is ns0. */
static int cm_gone_numbers(const cm_gonelog *g, const PyObject *ns0, int64_t *keys) {
    int f = CM_X_KEYS_INT | CM_X_NS_SAME;
    for (size_t k = 0; k < g->n; k++) {
        const cm_entry *e = &g->a[k];
        if (cm_intkey(e)) keys[k] = e->key.i; else f &= ~CM_X_KEYS_INT;
        if (e->ns != ns0) f &= ~CM_X_NS_SAME;
    }
    return f;
}

/* Pointers to the removed entries (for cm_export_list, fields 0 and 1 only). */
static void cm_gone_ptrs(const cm_gonelog *g, const cm_entry **out) {
    for (size_t k = 0; k < g->n; k++) out[k] = &g->a[k];
}

#endif /* COWMAP_CM_CHANGES_H */
