/*
 * Blocks for the core's big, long-lived arrays (entry chunks and full bucket
 * pages), carved from 32 MiB regions aligned to their size (so to huge pages
 * too).
 *
 * Why: a lookup in a big map misses the cache on a bucket page and on an
 * entry chunk. On 4 KiB pages each of those misses also misses the TLB, and
 * the page walk (two-dimensional under virtualisation) costs about as much as
 * the miss itself. With transparent huge pages one TLB entry covers 2 MiB, so
 * the walks mostly go; the kernel grants them on request when
 * /sys/kernel/mm/transparent_hugepage/enabled is `madvise` or `always`, and
 * with THP off the regions are ordinary memory. But a huge page is faulted in
 * whole, which costs 0.2 ms on bare metal and 1-10 ms on a VM whose host backs
 * guest memory lazily: too much for one put (the worst-put promise is 1 ms).
 * So by default huge pages are faulted in off the hot path: once a process
 * holds two regions, a short-lived thread maps the next region, asks for huge
 * pages and touches every page of it; the allocator takes that region when it
 * needs one and starts the next. A region the allocator must map itself
 * because the thread is not done yet gets 4 KiB pages (MADV_NOHUGEPAGE), whose
 * faults come one small page at a time. COWMAP_HUGE_PAGES picks the policy
 * (cm_ha_huge_pages). Where there is no madvise (not Linux), blocks come from
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
 * (MADV_DONTNEED; the page size is the OS's, as madvise rounds lengths up).
 * Every block is reported to tracemalloc, as PyMem_Raw* blocks are. Called
 * with the GIL held only: the GIL serialises all of this. The prefault thread
 * touches no Python object; it shares only atomics with the rest (the ready
 * region, the region in hand, its running flag, the shrink epoch) and reads
 * the page size, set before it starts.
 */
#ifndef COWMAP_HUGEALLOC_H
#define COWMAP_HUGEALLOC_H

#include <Python.h>
#include <stdint.h>
#include <string.h>

/* Under AddressSanitizer blocks come from PyMem_RawMalloc, so an access past
 * an entry chunk or a bucket page hits a redzone instead of the next block. */
#if defined(__SANITIZE_ADDRESS__)
#define CM_HA_ASAN 1
#elif defined(__has_feature)
#if __has_feature(address_sanitizer)
#define CM_HA_ASAN 1
#endif
#endif
#if defined(__linux__) && !defined(CM_HA_ASAN)
#include <limits.h>
#include <pthread.h>
#include <signal.h>
#include <stdatomic.h>
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
#define CM_HA_PREFAULT_FROM 2                /* regions held before a spare is prepared */

/* Huge-page policy (COWMAP_HUGE_PAGES): */
enum {
    CM_HP_OFF = 0,        /* "0": never ask */
    CM_HP_BACKGROUND = 1, /* unset or "background": only for regions faulted in by the prefault thread */
    CM_HP_ALWAYS = 2      /* "1" or "always": every region, faulted in by whoever touches it */
};

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
    int thp;               /* -1: not read yet, else a CM_HP_* policy */
#if CM_HA_ON
    _Atomic(char *) spare; /* a region the prefault thread has faulted in, not yet used */
    _Atomic(char *) inflight; /* the region the prefault thread is faulting in */
    atomic_int busy;       /* the prefault thread runs */
    atomic_uint epoch;     /* bumped when memory shrinks: a region prepared before is unwanted */
#endif
    int atfork;            /* the fork handler is registered */
    size_t prefaulted;     /* regions taken from the prefault thread */
} cm_ha_state;

static cm_ha_state cm_ha = {.thp = -1};

/* The huge-page policy, read once from COWMAP_HUGE_PAGES: "0" off, "1" or
 * "always" for every region, anything else (unset) in the background only.
 * "always" gains a little more for lookups (the first two regions too) and
 * pays each huge page's fault inside whichever put first touches it. */
static int cm_ha_huge_pages(void) {
    if (cm_ha.thp < 0) {
        const char *e = getenv("COWMAP_HUGE_PAGES");
        if (!CM_HA_ON || (e && strcmp(e, "0") == 0)) cm_ha.thp = CM_HP_OFF;
        else if (e && (strcmp(e, "1") == 0 || strcmp(e, "always") == 0)) cm_ha.thp = CM_HP_ALWAYS;
        else cm_ha.thp = CM_HP_BACKGROUND;
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

/* Maps CM_HA_REGION bytes aligned to their size; NULL if the OS says no.
 * Safe off the GIL: no Python call. */
static char *cm_ha_map_region(void) {
    size_t len = 2 * CM_HA_REGION;
    char *raw = (char *)mmap(NULL, len, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (raw == MAP_FAILED) return NULL;
    char *a = (char *)(((uintptr_t)raw + CM_HA_REGION - 1) & ~(uintptr_t)(CM_HA_REGION - 1));
    if (a > raw) munmap(raw, (size_t)(a - raw));
    if (a + CM_HA_REGION < raw + len) munmap(a + CM_HA_REGION, (size_t)(raw + len - (a + CM_HA_REGION)));
    return a;
}

/* Unmaps the ready spare region, if any, and returns it (NULL: none). The
 * exchange makes one caller the owner, from whichever thread. */
static char *cm_ha_drop_spare(void) {
    char *s = atomic_exchange(&cm_ha.spare, NULL);
    if (s) munmap(s, CM_HA_REGION);
    return s;
}

/* The prefault thread: one region, then it ends (a thread that lingered
 * would make every later fork() of the process a fork of a threaded one). */
static void *cm_ha_prefault_main(void *arg) {
    unsigned epoch = (unsigned)(uintptr_t)arg;
    char *a = cm_ha_map_region();
    if (a) {
        atomic_store(&cm_ha.inflight, a);
        (void)madvise(a, CM_HA_REGION, MADV_HUGEPAGE); /* a request: THP may be off */
        /* a write to each page faults it in (a huge page at its first one);
         * MADV_POPULATE_WRITE would hold the mmap lock throughout, stalling
         * the task thread's own mmap for milliseconds */
        for (size_t o = 0; o < CM_HA_REGION; o += cm_ha.page) ((volatile char *)a)[o] = 0;
        atomic_store(&cm_ha.spare, a);
        atomic_store(&cm_ha.inflight, NULL);
        /* memory shrank meanwhile: either that shrink took the region or this
         * exchange does, never both (all seq_cst) */
        if (atomic_load(&cm_ha.epoch) != epoch) cm_ha_drop_spare();
    }
    atomic_store(&cm_ha.busy, 0);
    return NULL;
}

/* In a forked child the thread does not exist: the region it was faulting
 * in and a ready one, both shared copy-on-write with the parent, are dropped
 * rather than copied page by page. (A fork between the thread's mmap and its
 * trim leaves that unaligned mapping in the child: address space only.) */
static void cm_ha_atfork_child(void) {
    char *s = cm_ha_drop_spare();
    char *f = atomic_exchange(&cm_ha.inflight, NULL);
    if (f && f != s) munmap(f, CM_HA_REGION); /* the same region between publish and clear */
    atomic_store(&cm_ha.busy, 0);
}

/* Starts preparing a spare region unless one is ready or under way. */
static void cm_ha_prefault_start(void) {
    if (atomic_load(&cm_ha.busy) || atomic_load(&cm_ha.spare)) return;
    if (!cm_ha.atfork) {
        if (pthread_atfork(NULL, NULL, cm_ha_atfork_child) != 0) return;
        cm_ha.atfork = 1;
    }
    pthread_attr_t at;
    if (pthread_attr_init(&at) != 0) return;
    (void)pthread_attr_setdetachstate(&at, PTHREAD_CREATE_DETACHED);
    size_t stack = (size_t)64 << 10;
    if (stack < (size_t)PTHREAD_STACK_MIN) stack = (size_t)PTHREAD_STACK_MIN; /* 128 KiB on some arm64 */
    (void)pthread_attr_setstacksize(&at, stack);
    /* signals stay with Python's threads: the new thread inherits a full mask */
    sigset_t all, old;
    sigfillset(&all);
    pthread_sigmask(SIG_SETMASK, &all, &old);
    pthread_t th;
    atomic_store(&cm_ha.busy, 1);
    void *epoch = (void *)(uintptr_t)atomic_load(&cm_ha.epoch);
    if (pthread_create(&th, &at, cm_ha_prefault_main, epoch) != 0) atomic_store(&cm_ha.busy, 0);
    pthread_sigmask(SIG_SETMASK, &old, NULL);
    pthread_attr_destroy(&at);
}

/* Makes a new region the bump range: the prefault thread's if it is ready,
 * else one mapped here; 0 or -1. */
static int cm_ha_new_region(void) {
    if (!cm_ha.page) {
        long pg = sysconf(_SC_PAGESIZE);
        cm_ha.page = pg > 0 ? (size_t)pg : 4096u;
    }
    int policy = cm_ha_huge_pages();
    char *a = atomic_exchange(&cm_ha.spare, NULL);
    if (a) {
        cm_ha.prefaulted++;
    } else {
        if (!(a = cm_ha_map_region())) return -1;
        if (policy == CM_HP_ALWAYS) (void)madvise(a, CM_HA_REGION, MADV_HUGEPAGE);
        else if (policy == CM_HP_BACKGROUND) (void)madvise(a, CM_HA_REGION, MADV_NOHUGEPAGE);
    }
    cm_ha_region *r = (cm_ha_region *)a;
    r->live = 0;
    r->free = NULL;
    cm_ha.nregions++;
    cm_ha.cur = a + CM_HA_GRAIN; /* the header's line */
    cm_ha.end = a + CM_HA_REGION;
    if (policy == CM_HP_BACKGROUND && cm_ha.nregions >= CM_HA_PREFAULT_FROM) cm_ha_prefault_start();
    return 0;
}

/* Memory is shrinking (a region unmapped, or no block in use): a spare is
 * kept only while it grows, so drop a ready one and any under way. */
static void cm_ha_shrink(void) {
    atomic_fetch_add(&cm_ha.epoch, 1u);
    (void)cm_ha_drop_spare();
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
    cm_ha_shrink();
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

/* Frees a block; with give_back, a big one's OS pages go back at once (see
 * CM_HA_GIVE_BACK). Blocks that are freed and allocated again all the time
 * (the flat map's segments as it grows) are freed without: giving pages back
 * splits the huge pages they lie on, and they would fault in again as 4 KiB
 * pages. */
static void cm_ha_free_ex(void *p, size_t size, int give_back) {
    if (!p) return;
    int c = cm_ha_class(size, 0);
    if (c < 0) { PyMem_RawFree(p); return; }
#if CM_HA_ON
    (void)PyTraceMalloc_Untrack(0, (uintptr_t)p);
    if (--cm_ha.live == 0) cm_ha_shrink();
    cm_ha_region *r = cm_ha_region_of(p);
    if (--r->live == 0 && r != cm_ha_region_of(cm_ha.cur - 1)) {
        cm_ha_drop_region(r); /* not the bump region: no block of it is wanted */
        return;
    }
    if (give_back && size >= CM_HA_GIVE_BACK) {
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

static void cm_ha_free(void *p, size_t size) { cm_ha_free_ex(p, size, 1); }

/* Bytes mapped for blocks (for tests and diagnostics); a spare region ready
 * in advance is not counted. */
static size_t cm_ha_mapped(void) {
    return cm_ha.nregions * CM_HA_REGION;
}

/* Bytes of the spare region ready in advance: 0 or CM_HA_REGION. */
static size_t cm_ha_spare(void) {
#if CM_HA_ON
    return atomic_load(&cm_ha.spare) ? CM_HA_REGION : 0;
#else
    return 0;
#endif
}

#endif /* COWMAP_HUGEALLOC_H */
