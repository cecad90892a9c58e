/*
 * Blocks for the core's big, long-lived arrays (entry chunks and full bucket
 * pages), carved from 2 MiB-aligned regions marked MADV_HUGEPAGE.
 *
 * Why: a lookup in a big map misses the cache on a bucket page and on an
 * entry chunk. On 4 KiB pages each of those misses also misses the TLB, and
 * the page walk (two-dimensional under virtualisation) costs about as much as
 * the miss itself. With transparent huge pages one TLB entry covers 2 MiB, so
 * the walks mostly go; the kernel grants them on request when
 * /sys/kernel/mm/transparent_hugepage/enabled is `madvise` or `always`, and
 * with THP off the regions are ordinary memory. Where there is no madvise
 * (not Linux), blocks come from PyMem_RawMalloc.
 *
 * Each block size the core asks for (a handful: the chunk sizes and the page
 * size) has a free list; a freed block is reused by the next allocation of its
 * size. A freed block of >= CM_HA_GIVE_BACK bytes returns its memory to the OS
 * at once (MADV_DONTNEED), and once no block is in use every region but the
 * newest is unmapped, so a process that drops its maps gets its memory back.
 * Every block is reported to tracemalloc, as PyMem_Raw* blocks are.
 * Called with the GIL held only: the GIL serialises the free lists.
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

#define CM_HA_HUGE ((size_t)2 << 20)         /* huge page size and region alignment */
#define CM_HA_REGION ((size_t)32 << 20)      /* bytes mapped at a time */
#define CM_HA_MIN_BLOCK ((size_t)2048)      /* blocks outside [MIN, MAX] come from PyMem_RawMalloc */
#define CM_HA_MAX_BLOCK (CM_HA_REGION / 4)
#define CM_HA_GIVE_BACK ((size_t)1 << 20)
#define CM_HA_CLASSES 24
#define CM_HA_GRAIN ((size_t)64)             /* blocks start on cache lines */

typedef struct cm_ha_link { struct cm_ha_link *next; } cm_ha_link;

typedef struct {
    size_t size[CM_HA_CLASSES];
    cm_ha_link *head[CM_HA_CLASSES];
    unsigned ncls;
    char *cur, *end;      /* bump range of the newest region */
    char **regions;       /* region starts; the newest last */
    size_t nregions, regions_cap;
    size_t live;          /* blocks handed out and not freed */
} cm_ha_state;

static cm_ha_state cm_ha;

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
/* Maps a new 2 MiB-aligned region and makes it the bump range; 0 or -1. */
static int cm_ha_new_region(void) {
    if (cm_ha.nregions == cm_ha.regions_cap) {
        size_t nc = cm_ha.regions_cap ? cm_ha.regions_cap * 2 : 8;
        char **na = (char **)PyMem_RawRealloc(cm_ha.regions, nc * sizeof(char *));
        if (!na) return -1;
        cm_ha.regions = na;
        cm_ha.regions_cap = nc;
    }
    size_t len = CM_HA_REGION + CM_HA_HUGE;
    char *raw = (char *)mmap(NULL, len, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (raw == MAP_FAILED) return -1;
    char *a = (char *)(((uintptr_t)raw + CM_HA_HUGE - 1) & ~(uintptr_t)(CM_HA_HUGE - 1));
    if (a > raw) munmap(raw, (size_t)(a - raw));
    if (a + CM_HA_REGION < raw + len) munmap(a + CM_HA_REGION, (size_t)(raw + len - (a + CM_HA_REGION)));
    (void)madvise(a, CM_HA_REGION, MADV_HUGEPAGE); /* a request: THP may be off */
    cm_ha.regions[cm_ha.nregions++] = a;
    cm_ha.cur = a;
    cm_ha.end = a + CM_HA_REGION;
    return 0;
}

/* No block in use: unmap all regions but the newest, and forget the free
 * blocks that lay in them. */
static void cm_ha_trim(void) {
    if (cm_ha.nregions <= 1) return;
    char *keep = cm_ha.regions[cm_ha.nregions - 1];
    /* the links live in the blocks: unlink before unmapping */
    for (unsigned c = 0; c < cm_ha.ncls; c++) {
        cm_ha_link **pp = &cm_ha.head[c];
        while (*pp) {
            char *b = (char *)*pp;
            if (b >= keep && b < keep + CM_HA_REGION) pp = &(*pp)->next;
            else *pp = (*pp)->next;
        }
    }
    for (size_t r = 0; r + 1 < cm_ha.nregions; r++) munmap(cm_ha.regions[r], CM_HA_REGION);
    cm_ha.regions[0] = keep;
    cm_ha.nregions = 1;
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
        p = cm_ha.head[c];
        cm_ha.head[c] = cm_ha.head[c]->next;
        if (zero) memset(p, 0, size); /* a reused block holds old data */
    } else {
        size_t need = (size + CM_HA_GRAIN - 1) & ~(CM_HA_GRAIN - 1);
        if (!cm_ha.cur || (size_t)(cm_ha.end - cm_ha.cur) < need) {
            if (cm_ha_new_region() < 0) { PyErr_NoMemory(); return NULL; }
        }
        p = cm_ha.cur;
        cm_ha.cur += need;
    }
    /* region memory never handed out before is zero as mapped */
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
    if (size >= CM_HA_GIVE_BACK) {
        /* keep the link word's page; give the rest of the block back now */
        uintptr_t lo = ((uintptr_t)p + sizeof(cm_ha_link) + 4095u) & ~(uintptr_t)4095u;
        uintptr_t hi = ((uintptr_t)p + size) & ~(uintptr_t)4095u;
        if (hi > lo) (void)madvise((void *)lo, hi - lo, MADV_DONTNEED);
    }
    cm_ha_link *l = (cm_ha_link *)p;
    l->next = cm_ha.head[c];
    cm_ha.head[c] = l;
    if (--cm_ha.live == 0) cm_ha_trim();
#endif
}

/* Bytes mapped for blocks (for tests and diagnostics). */
static size_t cm_ha_mapped(void) {
    return cm_ha.nregions * CM_HA_REGION;
}

#endif /* COWMAP_HUGEALLOC_H */
