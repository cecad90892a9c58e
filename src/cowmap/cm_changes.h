/*
 * cowmap core, part 10 of 10: what changed since a checkpoint's cut.
 *
 * An incremental checkpoint writes only the entries written or removed since
 * the last one. Finding them must not cost a pass over every entry, so a
 * tracking map keeps a bit per hash class (hash & dmask, four classes per
 * bucket of the larger table at the cut) set by every write, timestamp
 * refresh and read of a mutable state (cm_changed, at the write sites of
 * every part), and a log of the removed keys (cm_unlink; a removal marks no
 * class). A cut, taken with a checkpoint's
 * snapshot, hands both over and starts afresh; the checkpoint then reads from
 * the snapshot the entries of the marked classes (their buckets only: the
 * cost follows the changes) and writes the log as tombstones. An unchanged
 * entry of a changed one's class goes along: rewriting it is harmless.
 *
 * Compiled only as part of cowmap_core.h, which includes the parts in order.
 */
#ifndef COWMAP_CM_CHANGES_H
#define COWMAP_CM_CHANGES_H

#include "cm_export.h"

/* What a cut hands over: bits NULL when the map was not tracking (then its
 * changes are unknown), else the marked classes and the removed keys. */
typedef struct {
    uint64_t *bits;
    uint32_t mask;
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
    uint32_t cap = m->primary.capacity > m->rehash.capacity ? m->primary.capacity : m->rehash.capacity;
    /* four classes per bucket: an unchanged entry sharing a changed one's
     * bucket goes along only if it also shares its class (at the usual loads
     * 1 in 7 rows of an increment instead of 2 in 5; the bits cost 1/64 of
     * the bucket array) */
    cap = cap < (1u << 29) ? cap * 4u : (1u << 31);
    if (cap < 64u) cap = 64u;
    uint64_t *bits = (uint64_t *)PyMem_RawCalloc(cap >> 6, sizeof(uint64_t));
    if (!bits) { PyErr_NoMemory(); return -1; }
    out->bits = m->dirty;
    out->mask = m->dmask;
    out->gone = m->gone;
    m->dirty = bits;
    m->dmask = cap - 1u;
    memset(&m->gone, 0, sizeof m->gone);
    return 0;
}

#define CM_CH_AHEAD 16u /* buckets between requesting a slot and reading it; as far again to its head entry */

/* The entries of snapshot s in the classes marked in c, appended to out
 * (pointers into the map, valid while s is). O(marked classes + their
 * entries); -1 out of memory. Of a table smaller than the classes a class is
 * part of one bucket, of a larger one every (mask+1)-th bucket from it.
 *
 * The buckets are listed first (a table bit on top of each index), then read
 * as a pipeline: a bucket's slot is requested CM_CH_AHEAD buckets before its
 * head entry is, the head's next entry as many later, and the chain walked as
 * many after that, so the cache misses of the changed entries overlap (they
 * cost nearly all of the time: the changes lie scattered over the table). */
static int cm_changed_entries(const cm_map *m, const cm_snap *s, const cm_changes *c, cm_ptrvec *out) {
    uint32_t nclass = c->mask + 1u;
    cm_u32vec todo = {0};
    int rc = -1;
    for (uint32_t w = 0; w < (nclass >> 6); w++) {
        for (uint64_t bits = c->bits[w]; bits; bits &= bits - 1u) {
            uint32_t cls = (w << 6) | (uint32_t)__builtin_ctzll(bits);
            for (uint32_t phase = 0; phase < 2; phase++) {
                const cm_tview *v = phase == 0 ? &s->primary : &s->rehash;
                uint32_t lo = phase == 0 ? s->rehash_index : 0u;
                for (uint32_t b = cls & (v->capacity - 1u); v->capacity && b < v->capacity; b += nclass)
                    if (b >= lo && (cm_u32vec_push(&todo, b | phase << 31) < 0 || cm_u32vec_push(&todo, cls) < 0))
                        goto done;
            }
        }
    }
    uint32_t heads[4u * CM_CH_AHEAD] = {0};
    size_t n = todo.n / 2u; /* (bucket | table << 31, class) pairs */
    for (size_t i = 0; i < n + 3u * CM_CH_AHEAD; i++) {
        if (i < n) { /* request the slot */
            uint32_t t = todo.a[2u * i];
            const uint32_t *slot = cm_tview_slot_at(t >> 31 ? &s->rehash : &s->primary, t & CM_HMASK);
            if (slot) CM_PREFETCH(slot);
        }
        size_t j = i - CM_CH_AHEAD;
        if (i >= CM_CH_AHEAD && j < n) { /* its slot has arrived: request the head entry */
            uint32_t t = todo.a[2u * j];
            uint32_t h = cm_tview_slot(t >> 31 ? &s->rehash : &s->primary, t & CM_HMASK);
            heads[j % (4u * CM_CH_AHEAD)] = h;
            if (h) cm_prefetch_hot(m, h);
        }
        j = i - 2u * CM_CH_AHEAD;
        if (i >= 2u * CM_CH_AHEAD && j < n) { /* the head has arrived: request the next entry */
            uint32_t h = heads[j % (4u * CM_CH_AHEAD)];
            if (h && cm_E(m, h)->next) cm_prefetch_hot(m, cm_E(m, h)->next);
        }
        size_t k = i - 3u * CM_CH_AHEAD;
        if (i >= 3u * CM_CH_AHEAD && k < n) { /* walk the chain */
            uint32_t cls = todo.a[2u * k + 1u];
            for (uint32_t e = heads[k % (4u * CM_CH_AHEAD)]; e; e = cm_E(m, e)->next) {
                const cm_entry *x = cm_E(m, e);
                if ((x->hash & c->mask) == cls && cm_ptrvec_push(out, (void *)x) < 0) goto done;
            }
        }
    }
    rc = 0;
done:
    PyMem_RawFree(todo.a);
    return rc;
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
