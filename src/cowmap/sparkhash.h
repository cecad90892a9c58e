/*
 * Spark SQL's hash() (the Murmur3Hash expression, seed 42), so that a key's
 * key group computed inside a pandas UDF equals pmod(hash(keys), n) computed
 * by Spark before the shuffle.
 *
 * Spark hashes a row of key columns by chaining: the seed starts at 42 and
 * each non-null column's hash, seeded with the running value, becomes the
 * next seed. Per type: 32-bit ints (and bytes, shorts, booleans, dates) with
 * hashInt, 64-bit ints (and timestamps) with hashLong, floats and doubles by
 * their IEEE bits (-0.0 as 0.0), strings by their UTF-8 bytes and binary by
 * its bytes with hashUnsafeBytes. That last one is not the reference
 * Murmur3: the 1-3 bytes after the last whole 4-byte word are each mixed in
 * as a whole word of their own (a sign-extended byte), which is what this
 * does too. Words are read little-endian, as Spark reads them on x86 and
 * ARM.
 */
#ifndef COWMAP_SPARKHASH_H
#define COWMAP_SPARKHASH_H

#include <stdint.h>
#include <string.h>

#define SH_SEED 42

static inline uint32_t sh_rotl(uint32_t x, int r) { return (x << r) | (x >> (32 - r)); }

static inline uint32_t sh_mix_k1(uint32_t k1)
{
    k1 *= 0xcc9e2d51u;
    k1 = sh_rotl(k1, 15);
    return k1 * 0x1b873593u;
}

static inline uint32_t sh_mix_h1(uint32_t h1, uint32_t k1)
{
    h1 ^= k1;
    h1 = sh_rotl(h1, 13);
    return h1 * 5u + 0xe6546b64u;
}

static inline int32_t sh_fmix(uint32_t h1, uint32_t length)
{
    h1 ^= length;
    h1 ^= h1 >> 16;
    h1 *= 0x85ebca6bu;
    h1 ^= h1 >> 13;
    h1 *= 0xc2b2ae35u;
    h1 ^= h1 >> 16;
    return (int32_t)h1;
}

static inline int32_t sh_hash_int(int32_t v, int32_t seed)
{
    return sh_fmix(sh_mix_h1((uint32_t)seed, sh_mix_k1((uint32_t)v)), 4);
}

static inline int32_t sh_hash_long(int64_t v, int32_t seed)
{
    uint64_t u = (uint64_t)v;
    uint32_t h1 = sh_mix_h1((uint32_t)seed, sh_mix_k1((uint32_t)u));
    h1 = sh_mix_h1(h1, sh_mix_k1((uint32_t)(u >> 32)));
    return sh_fmix(h1, 8);
}

static inline int32_t sh_hash_bytes(const char *p, size_t n, int32_t seed)
{
    uint32_t h1 = (uint32_t)seed;
    size_t aligned = n - n % 4, i;
    for (i = 0; i < aligned; i += 4) {
        uint32_t w;
        memcpy(&w, p + i, 4);
#if defined(__BYTE_ORDER__) && __BYTE_ORDER__ == __ORDER_BIG_ENDIAN__
        w = __builtin_bswap32(w);
#endif
        h1 = sh_mix_h1(h1, sh_mix_k1(w));
    }
    for (; i < n; i++)
        h1 = sh_mix_h1(h1, sh_mix_k1((uint32_t)(int32_t)(signed char)p[i]));
    return sh_fmix(h1, (uint32_t)n);
}

static inline int32_t sh_hash_double(double d, int32_t seed)
{
    int64_t bits;
    if (d == 0.0)
        d = 0.0; /* -0.0 hashes as 0.0 */
    if (d != d)
        bits = 0x7ff8000000000000LL; /* Java's canonical NaN */
    else
        memcpy(&bits, &d, 8);
    return sh_hash_long(bits, seed);
}

static inline int32_t sh_hash_float(float f, int32_t seed)
{
    int32_t bits;
    if (f == 0.0f)
        f = 0.0f;
    if (f != f)
        bits = 0x7fc00000;
    else
        memcpy(&bits, &f, 4);
    return sh_hash_int(bits, seed);
}

/* Java's Math.floorMod, as Spark's pmod: the key group of a hash. */
static inline int32_t sh_pmod(int32_t h, int32_t n)
{
    int32_t r = h % n;
    return r < 0 ? r + n : r;
}

#endif
