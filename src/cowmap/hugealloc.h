/*
 * Blocks for the core's big, long-lived arrays (entry chunks and full bucket
 * pages), carved from 32 MiB regions aligned to their size (so to huge
 * pages too) and, with COWMAP_HUGE_PAGES=1, marked MADV_HUGEPAGE.
 *
 * Why: a lookup in a big map misses the cache on a bucket page and on an
 * entry chunk. On 4 KiB pages each of those misses also misses the TLB, and
 * the page walk (two-dimensional under virtualisation) costs about as much as
 * the miss itself. With transparent huge pages one TLB entry covers 2 MiB, so
 * the walks mostly go; the kernel grants them on request when
 * /sys/kernel/mm/transparent_hugepage/enabled is `madvise` or `always`, and
 * with THP off the regions are ordinary memory. Huge pages are opt-in (see
 * cm_ha_huge_pages). Where there is no madvise (not Linux), blocks come from
 * PyMem_RawMalloc.
 *
 * Each block size the core asks for (a handful: the chunk sizes and the page
 * size) has a free list; a freed block is reused by the next allocation of its
 * size. Regions are aligned to their size, so a block finds its region's
 * header (the region's first cache line) by masking its address; the header
 * counts the region's blocks in use and lists its free ones. A region whose
 * last block is freed is unmapped at once (its free blocks leave the free
 * lists first), except the region new blocks are carved from. A freed block
 * of >= CM_HA_GIVE_BACK bytes also returns its whole OS pages at once
 * (MADV_DONTNEED; the page size is the OS's, as madvise rounds lengths up). Every block is reported to tracemalloc, as PyMem_Raw*
 * blocks are. Called with the GIL held only: the GIL serialises all of this.
 */
#ifndef COWMAP_HUGEALLOC_H
#define COWMAP_HUGEALLOC_H

#include <Python.h>
#include <stdint.h>
#include <string.h>

#if defined(__linux__)
#include <sys/mman.h>
#include <unistd.h>
#define CM_HA_ON 1
#else
#define CM_HA_ON 0
#endif

#define CM_HA_REGION ((size_t)32 << 20)      /* bytes mapped at a time, and their alignment */
#define CM_HA_MIN_BLOCK ((size_t)2048)      /* blocks outside [MIN, MAX] come from PyMem_RawMalloc */
#define CM_HA_MAX_BLOCK (CM_HA_REGION / 4)
#define CM_HA_GIVE_BACK ((size_t)256 << 10)
#define CM_HA_CLASSES 24
#define CM_HA_GRAIN ((size_t)64)             /* blocks start on cache lines */

/* A free block: in its class's free list and in its region's. */
typedef struct cm_ha_node {
    struct cm_ha_node *cnext, *cprev, *rnext, *rprev;
    unsigned cls;
} cm_ha_node;

typedef struct {
    size_t live;           /* blocks of this region in use */
    cm_ha_node *free;      /* free blocks of this region */
} cm_ha_region;

typedef struct {
    size_t size[CM_HA_CLASSES];
    cm_ha_node *head[CM_HA_CLASSES];
    unsigned ncls;
    char *cur, *end;       /* bump range of the newest region */
    size_t nregions;       /* regions mapped */
    size_t live;           /* blocks handed out and not freed */
    size_t page;           /* the OS page size */
    int thp;               /* -1: not read yet; 0: COWMAP_HUGE_PAGES=0; 1: ask for huge pages */
} cm_ha_state;

static cm_ha_state cm_ha = {.thp = -1};

/* Whether regions ask for transparent huge pages: only when the environment
 * says COWMAP_HUGE_PAGES=1 (read once; Linux). Opt-in because a huge page is
 * faulted in whole: growing into fresh memory then pays ~0.2 ms per 2 MiB at
 * once, and 1-10 ms on a VM whose host backs guest memory lazily (measured on
 * the dev VM), against the <= 1 ms worst-put promise; with 4 KiB pages the same
 * cost comes in pieces of <= 0.35 ms. Lookups in big maps gain ~20-30%. */
static int cm_ha_huge_pages(void) {
    if (cm_ha.thp < 0) {
        const char *e = getenv("COWMAP_HUGE_PAGES");
        cm_ha.thp = CM_HA_ON && e && e[0] == '1' && e[1] == '\0';
    }
    return cm_ha.thp;
}

/* The class of a block size, registered on first use; -1: use PyMem_RawMalloc.
 * Classes are never forgotten, so a block is freed the way it was allocated. */
static int cm_ha_class(size_t size, int add) {
    if (!CM_HA_ON || size < CM_HA_MIN_BLOCK || size > CM_HA_MAX_BLOCK) return -1;
    for (unsigned c = 0; c < cm_ha.ncls; c++)
        if (cm_ha.size[c] == size) return (int)c;
    if (!add || cm_ha.ncls == CM_HA_CLASSES) return -1;
    cm_ha.size[cm_ha.ncls] = size;
    cm_ha.head[cm_ha.ncls] = NULL;
    return (int)cm_ha.ncls++;
}

#if CM_HA_ON
static inline cm_ha_region *cm_ha_region_of(const void *p) {
    return (cm_ha_region *)((uintptr_t)p & ~(uintptr_t)(CM_HA_REGION - 1));
}

/* Maps a new region and makes it the bump range; 0 or -1. */
static int cm_ha_new_region(void) {
    if (!cm_ha.page) {
        long pg = sysconf(_SC_PAGESIZE);
        cm_ha.page = pg > 0 ? (size_t)pg : 4096u;
    }
    size_t len = 2 * CM_HA_REGION;
    char *raw = (char *)mmap(NULL, len, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (raw == MAP_FAILED) return -1;
    char *a = (char *)(((uintptr_t)raw + CM_HA_REGION - 1) & ~(uintptr_t)(CM_HA_REGION - 1));
    if (a > raw) munmap(raw, (size_t)(a - raw));
    if (a + CM_HA_REGION < raw + len) munmap(a + CM_HA_REGION, (size_t)(raw + len - (a + CM_HA_REGION)));
    if (cm_ha_huge_pages()) (void)madvise(a, CM_HA_REGION, MADV_HUGEPAGE); /* a request: THP may be off */
    cm_ha_region *r = (cm_ha_region *)a;
    r->live = 0;
    r->free = NULL;
    cm_ha.nregions++;
    cm_ha.cur = a + CM_HA_GRAIN; /* the header's line */
    cm_ha.end = a + CM_HA_REGION;
    return 0;
}

static void cm_ha_unlink(cm_ha_node *n) {
    if (n->cprev) n->cprev->cnext = n->cnext;
    else cm_ha.head[n->cls] = n->cnext;
    if (n->cnext) n->cnext->cprev = n->cprev;
    cm_ha_region *r = cm_ha_region_of(n);
    if (n->rprev) n->rprev->rnext = n->rnext;
    else r->free = n->rnext;
    if (n->rnext) n->rnext->rprev = n->rprev;
}

/* Unmaps a region with no block in use: its free blocks leave the lists first
 * (their links live in the region). */
static void cm_ha_drop_region(cm_ha_region *r) {
    while (r->free) cm_ha_unlink(r->free);
    cm_ha.nregions--;
    munmap(r, CM_HA_REGION);
}
#endif

/* A block of `size` bytes (zeroed if `zero`), or NULL with MemoryError set. */
static void *cm_ha_alloc(size_t size, int zero) {
    int c = cm_ha_class(size, 1);
    void *p = NULL;
    if (c < 0) {
        p = zero ? PyMem_RawCalloc(1, size) : PyMem_RawMalloc(size);
        if (!p) PyErr_NoMemory();
        return p;
    }
#if CM_HA_ON
    if (cm_ha.head[c]) {
        cm_ha_node *n = cm_ha.head[c];
        cm_ha_unlink(n);
        p = n;
        if (zero) memset(p, 0, size); /* a reused block holds old data */
    } else {
        /* region memory never handed out before is zero as mapped */
        size_t need = (size + CM_HA_GRAIN - 1) & ~(CM_HA_GRAIN - 1);
        if (!cm_ha.cur || (size_t)(cm_ha.end - cm_ha.cur) < need) {
            if (cm_ha_new_region() < 0) { PyErr_NoMemory(); return NULL; }
        }
        p = cm_ha.cur;
        cm_ha.cur += need;
    }
    cm_ha_region_of(p)->live++;
    cm_ha.live++;
    (void)PyTraceMalloc_Track(0, (uintptr_t)p, size);
#endif
    return p;
}

static void cm_ha_free(void *p, size_t size) {
    if (!p) return;
    int c = cm_ha_class(size, 0);
    if (c < 0) { PyMem_RawFree(p); return; }
#if CM_HA_ON
    (void)PyTraceMalloc_Untrack(0, (uintptr_t)p);
    cm_ha.live--;
    cm_ha_region *r = cm_ha_region_of(p);
    if (--r->live == 0 && r != cm_ha_region_of(cm_ha.cur - 1)) {
        cm_ha_drop_region(r); /* not the bump region: no block of it is wanted */
        return;
    }
    if (size >= CM_HA_GIVE_BACK) {
        /* keep the node's page; give the rest of the block back now */
        uintptr_t pg = cm_ha.page;
        uintptr_t lo = ((uintptr_t)p + sizeof(cm_ha_node) + pg - 1) & ~(pg - 1);
        uintptr_t hi = ((uintptr_t)p + size) & ~(pg - 1);
        if (hi > lo) (void)madvise((void *)lo, hi - lo, MADV_DONTNEED);
    }
    cm_ha_node *n = (cm_ha_node *)p;
    n->cls = (unsigned)c;
    n->cprev = NULL;
    n->cnext = cm_ha.head[c];
    if (n->cnext) n->cnext->cprev = n;
    cm_ha.head[c] = n;
    n->rprev = NULL;
    n->rnext = r->free;
    if (n->rnext) n->rnext->rprev = n;
    r->free = n;
#endif
}

/* Bytes mapped for blocks (for tests and diagnostics). */
static size_t cm_ha_mapped(void) {
    return cm_ha.nregions * CM_HA_REGION;
}

#endif /* COWMAP_HUGEALLOC_H */
