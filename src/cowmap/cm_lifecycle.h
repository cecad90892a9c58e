/*
 * cowmap core, part 7 of 10: a map's start and end, and its size in memory.
 *
 * cm_init (as Flink's constructor: the capacity rounded up to a power of two
 * within [4, 2**30]), cm_dealloc (entries, pages, retire lists and chunks
 * freed, then the deferred DECREFs run) and the memory accounting (cm_nfree,
 * cm_bytes). Last because freeing a map reaches into every other part, the
 * snapshots' retire lists included.
 *
 * Compiled only as part of cowmap_core.h, which includes the parts in order.
 */
#ifndef COWMAP_CM_LIFECYCLE_H
#define COWMAP_CM_LIFECYCLE_H

#include "cm_snapshot.h"

/* ------------------------------------------------------------ lifecycle */

static uint64_t cm_serials; /* maps made so far (under the GIL) */

static int cm_init(cm_map *m, uint32_t capacity) {
    memset(m, 0, sizeof(*m));
    m->serial = ++cm_serials;
    if (capacity < CM_MIN_CAPACITY) capacity = CM_MIN_CAPACITY;
    if (capacity > CM_MAX_CAPACITY) capacity = CM_MAX_CAPACITY;
    uint32_t c = CM_MIN_CAPACITY;
    while (c < capacity) c <<= 1;
    if (cm_table_init(&m->primary, c) < 0) return -1;
    cm_set_threshold(m, c);
    m->next_unused = 1; /* index 0 means "none" */
    m->sweep.phase = 2;
    m->sweep.pos = 0;
    m->ts_floor = m->round_min = INT64_MAX; /* no entry */
    return 0;
}

static void cm_free_table_entries(cm_map *m, cm_table *t, uint32_t from) {
    if (!t->capacity) return;
    for (uint32_t b = from; b < t->capacity; b++) {
        for (uint32_t i = cm_slot_get(t, b); i;) {
            uint32_t n = cm_E(m, i)->next;
            cm_entry_free(m, i);
            i = n;
        }
    }
}

static void cm_free_table_pages(cm_map *m, cm_table *t) {
    if (!t->pages) return;
    for (uint32_t pi = 0; pi < t->npages; pi++)
        if (t->pages[pi]) cm_page_free(m, t->pages[pi]);
    PyMem_RawFree(t->pages);
    t->pages = NULL;
}

/* Frees everything. Live snapshots hold the map alive, so none remain here;
 * any leftover retire lists are freed too for safety. */
static void cm_dealloc(cm_map *m) {
    m->busy = 1;
    cm_free_table_entries(m, &m->primary, m->rehash_index);
    cm_free_table_entries(m, &m->rehash, 0);
    while (m->nsnaps) cm_release_now(m, m->snaps[m->nsnaps - 1].version);
    cm_reclaim_some(m, (size_t)-1);
    PyMem_RawFree(m->rq);
    m->rq = NULL;
    cm_free_table_pages(m, &m->primary);
    cm_free_table_pages(m, &m->rehash);
    for (uint32_t c = 0; c < m->nchunks; c++) cm_ha_free(m->chunks[c], cm_chunk_bytes(c));
    PyMem_RawFree(m->chunks);
    m->chunks = NULL;
    PyMem_RawFree(m->freed.a);
    m->freed.a = NULL; m->freed.n = m->freed.cap = 0;
    PyMem_RawFree(m->snaps);
    PyMem_RawFree(m->pending_release.a);
    m->nchunks = 0; m->snaps = NULL; m->nsnaps = 0;
    m->busy = 0;
    cm_grave_empty(&m->grave);
    PyMem_RawFree(m->grave.a);
    m->grave.a = NULL;
    PyMem_RawFree(m->dirty);
    m->dirty = NULL;
    cm_gone_free(&m->gone);
    Py_CLEAR(m->copier);
}

static inline uint32_t cm_nfree(const cm_map *m) { return (uint32_t)m->freed.n; }

static size_t cm_bytes(const cm_map *m) {
    size_t b = (size_t)cm_chunk_start(m->nchunks) * sizeof(cm_entry) + m->chunks_cap * sizeof(void *);
    b += m->freed.cap * sizeof(uint32_t);
    b += (size_t)m->npages_live * sizeof(cm_page);
    /* slot bytes: pages of the live tables are full-size; retired pages too */
    b += (size_t)m->npages_live * (sizeof(uint32_t) << (m->primary.page_shift));
    b += (size_t)m->primary.npages * sizeof(void *) + (size_t)m->rehash.npages * sizeof(void *);
    return b;
}

#endif /* COWMAP_CM_LIFECYCLE_H */
