/*
 * kvcast.stats.native._replay: a native replay engine giving exactly the results of
 * stats/ingest.py's ingest (the one ingest step: parse -> label -> apply, here with the
 * default IntentLabeller and an EngineTarget) + StatsEngine.apply/finish; SPEC.md beside this
 * file states the contract.  Wrapped by stats/native/replay.py;
 * tests/stats/native/test_replay.py holds it to the Python engine.  Lines are parsed as
 * stats/events.py's parse_event does (parse_line).
 *
 * The Python modules are the specification; this file mirrors them literally:
 *   - ingest: payloads in order, a rejection counted where it stands -> core_offer_lines
 *   - IntentLabeller.label_batch/_canonical      -> apply_event (label decision), label_commit
 *   - ConversationTracker.observe/_complete_due/flush and _SecondBuckets
 *                                                -> apply_event, complete_due, core_finish
 *   - the tracker's calls of its shared-prefix index (events with block_hashes)
 *                                                -> index_observe, sess_complete, complete_due
 *     (the index is this module's SharedIndexCore, below, called as C functions)
 *   - StatsWindow.add / Bucket.add_conversation -> window_add
 *   - buckets_in_window(now_s) + expire          -> window_expire
 *   - ArrivalStats.observe/_prune                -> arrivals_observe, arrivals_prune
 *   - StatsEngine counters and the expiry cadence (every 1024 completions).
 * Python dicts keep insertion order; every ordered container here does the same (arrays in
 * insertion order plus a hash index), and every float is computed with the same IEEE
 * operations in the same order.  Values the engine cannot represent exactly raise
 * ReplayUnsupported before any state of the offending event changes.
 *
 * Memory layout.  Session ids and request ids never appear in the results, so the tracker
 * keeps copies of their code units (kind and length included: equal exactly when the Python
 * strings are equal) instead of references to the str objects, so the per-event work touches
 * no old Python object (no refcounts, no cold string headers).  With the shared-prefix index
 * a conversation also keeps what the index needs as objects: its owner id and held ids, and
 * each turn's gaps tuple (none of them can take part in a cycle).  Keys are hashed with a
 * seeded multiply-mix hash of those code units (see bytes_hash), not the str's SipHash.
 *   - A session slot (Sess + SessMeta) holds a session id, its open conversation (turns
 *     inline up to INLINE_TURNS) and the number of deadline entries filed under it.  A slot
 *     lives while its conversation is open or any deadline entry names it, so a deadline
 *     entry finds "the open conversation of this session id" exactly as
 *     open.get(session_id) does (a stale entry can complete a newer conversation of the same
 *     session, in the same order as in Python).
 *   - Request ids are copied into the byte buffer of their second in the id-expiry buckets;
 *     the set of remembered ids indexes those records (each id has exactly one record).
 *   - Labels (which the results carry) are held as the first str object seen for each.
 *   - Every index is one hash table type, HTable (open addressing): int64 keys are its keys;
 *     for a str key it holds the hash, and the value leads to where the str is kept
 *     (label_objs, a session slot, a request id record), where lookups compare it.
 * The module keeps no global mutable state: everything lives in the ReplayCore object (the
 * exception class is in the module state).
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <structmember.h>
#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#define TWO52 4503599627370496.0           /* |values| below this floor exactly into int64 */
#define SMALL_LIMIT ((int64_t)1 << 30)     /* |turn|, |input_tokens| below this */
#define TOKENS_LIMIT ((int64_t)1 << 40)    /* |cached_tokens| below this */
#define MAX_LABEL_IDS ((int64_t)1 << 30)
#define EXPIRE_EVERY_COMPLETIONS 1024
#define INLINE_TURNS 4
#define INLINE_KEY 40      /* sizeof(Sess) == 256: four cache lines */
#define DIRECT_TURNS 32    /* window states of turns 1..32 are found without hashing */

/* math.floor for |x| < 2**52 (every value floored here is checked to be so). */
static inline int64_t
floor_i64(double x)
{
    int64_t i = (int64_t)x; /* truncates toward zero */
    return i - ((double)i > x);
}

/* ------------------------------------------------------------------------------------------ */
/* Growable arrays                                                                              */

static int
grow_array(void **p, Py_ssize_t *cap, Py_ssize_t need, size_t elsize)
{
    if (need <= *cap) {
        return 0;
    }
    Py_ssize_t nc = *cap ? *cap : 4;
    while (nc < need) {
        if (nc > PY_SSIZE_T_MAX / 2) {
            PyErr_NoMemory();
            return -1;
        }
        nc *= 2;
    }
    if ((size_t)nc > SIZE_MAX / elsize) {
        PyErr_NoMemory();
        return -1;
    }
    void *q = realloc(*p, (size_t)nc * elsize);
    if (q == NULL) {
        PyErr_NoMemory();
        return -1;
    }
    *p = q;
    *cap = nc;
    return 0;
}

#define GROW(arr, cap, need) grow_array((void **)&(arr), &(cap), (need), sizeof(*(arr)))

/* ------------------------------------------------------------------------------------------ */
/* Strings                                                                                      */

/* Keys are hashed from their code units with a seeded 64-bit multiply-mix hash (wyhash's
   construction): several times cheaper than the str's SipHash, which the tracker would
   otherwise compute for two fresh strings per event.  The seed comes from Python's own
   randomised str hash.  A probe sequence longer than PROBE_LIMIT (never seen with random
   keys at load factor 1/2) means colliding keys: the engine then raises ReplayUnsupported
   and the Python engine takes over, so crafted keys cannot make it quadratic. */
#ifndef PROBE_LIMIT
#define PROBE_LIMIT 1024
#endif

static inline uint64_t
mum(uint64_t a, uint64_t b)
{
    __uint128_t r = (__uint128_t)a * b;
    return (uint64_t)r ^ (uint64_t)(r >> 64);
}

static inline uint64_t
rd8(const uint8_t *p)
{
    uint64_t v;
    memcpy(&v, p, 8);
    return v;
}

static inline uint64_t
rd4(const uint8_t *p)
{
    uint32_t v;
    memcpy(&v, p, 4);
    return v;
}

#define H_P0 0xa0761d6478bd642fULL
#define H_P1 0xe7037ed1a0b428dbULL
#define H_P2 0x8ebc6af09c88c6e3ULL
#define H_P3 0x589965cc75374cc3ULL

static inline Py_hash_t
bytes_hash(const char *data, size_t len, unsigned int kind, uint64_t seed)
{
    const uint8_t *p = (const uint8_t *)data;
    uint64_t a, b;
    seed ^= (uint64_t)kind * H_P3;
    if (len <= 16) {
        if (len >= 4) {
            size_t q = (len >> 3) << 2;
            a = (rd4(p) << 32) | rd4(p + q);
            b = (rd4(p + len - 4) << 32) | rd4(p + len - 4 - q);
        }
        else if (len > 0) {
            a = ((uint64_t)p[0] << 16) | ((uint64_t)p[len >> 1] << 8) | p[len - 1];
            b = 0;
        }
        else {
            a = b = 0;
        }
    }
    else {
        size_t i = len;
        if (i > 48) {
            uint64_t s1 = seed, s2 = seed;
            do {
                seed = mum(rd8(p) ^ H_P1, rd8(p + 8) ^ seed);
                s1 = mum(rd8(p + 16) ^ H_P2, rd8(p + 24) ^ s1);
                s2 = mum(rd8(p + 32) ^ H_P3, rd8(p + 40) ^ s2);
                p += 48;
                i -= 48;
            } while (i > 48);
            seed ^= s1 ^ s2;
        }
        while (i > 16) {
            seed = mum(rd8(p) ^ H_P1, rd8(p + 8) ^ seed);
            i -= 16;
            p += 16;
        }
        a = rd8(p + i - 16);
        b = rd8(p + i - 8);
    }
    return (Py_hash_t)mum(H_P1 ^ (uint64_t)len, mum(a ^ H_P1, b ^ seed));
}

/* Equality of n bytes, inline for the short keys of the hot path. */
static inline __attribute__((always_inline)) int
bytes_eq(const void *a, const void *b, size_t n)
{
    const uint8_t *x = a, *y = b;
    if (n >= 8) {
        if (n > 32) {
            return memcmp(x, y, n) == 0;
        }
        size_t i = 0;
        for (; i + 8 <= n; i += 8) {
            if (rd8(x + i) != rd8(y + i)) {
                return 0;
            }
        }
        return rd8(x + n - 8) == rd8(y + n - 8); /* the tail, overlapping */
    }
    if (n >= 4) {
        return rd4(x) == rd4(y) && rd4(x + n - 4) == rd4(y + n - 4);
    }
    for (size_t i = 0; i < n; i++) {
        if (x[i] != y[i]) {
            return 0;
        }
    }
    return 1;
}

/* Copy of n bytes, inline for short keys. */
static inline __attribute__((always_inline)) void
bytes_copy(void *dst, const void *src, size_t n)
{
    if (n > 32 || n < 8) {
        memcpy(dst, src, n);
        return;
    }
    uint8_t *d = dst;
    const uint8_t *q = src;
    for (size_t i = 0; i + 8 <= n; i += 8) {
        memcpy(d + i, q + i, 8);
    }
    memcpy(d + n - 8, q + n - 8, 8);
}

static inline Py_hash_t
str_key_hash(PyObject *s, uint64_t seed)
{
    unsigned int kind = PyUnicode_KIND(s);
    return bytes_hash(PyUnicode_DATA(s), (size_t)PyUnicode_GET_LENGTH(s) * kind, kind, seed);
}

/* Exact str equality: canonical strings are equal iff same kind, length and code units. */
static inline __attribute__((always_inline)) int
str_eq(PyObject *a, PyObject *b)
{
    Py_ssize_t n = PyUnicode_GET_LENGTH(a);
    if (n != PyUnicode_GET_LENGTH(b)) {
        return 0;
    }
    unsigned int kind = PyUnicode_KIND(a);
    if (kind != PyUnicode_KIND(b)) {
        return 0;
    }
    return bytes_eq(PyUnicode_DATA(a), PyUnicode_DATA(b), (size_t)n * kind);
}

/* A str seen as its code units (borrowed from the str while it is alive). */
typedef struct {
    const char *data;
    size_t nbytes;
    unsigned int kind;
    Py_hash_t hash;
} KeyView;

/* Whether the code units (data, nbytes, kind) are those of k. */
static inline __attribute__((always_inline)) int
key_is(const KeyView *k, const void *data, size_t nbytes, unsigned int kind)
{
    return nbytes == k->nbytes && kind == k->kind && bytes_eq(data, k->data, nbytes);
}

static inline __attribute__((always_inline)) void
key_view(PyObject *s, KeyView *k, uint64_t seed)
{
    k->kind = PyUnicode_KIND(s);
    k->nbytes = (size_t)PyUnicode_GET_LENGTH(s) * k->kind;
    k->data = PyUnicode_DATA(s);
    k->hash = bytes_hash(k->data, k->nbytes, k->kind, seed);
}

/* ------------------------------------------------------------------------------------------ */
/* Hash tables: well-mixed 64-bit key -> non-negative int64 value                               */
/* Open addressing, linear probing, load factor at most 1/2, backward-shift deletion.           */

/* One implementation serves every index of the engine, in two ways:
     - str keys (labels, session ids, request ids) are kept elsewhere: the table's key is
       their bytes_hash and the value says where the str is, so lookups compare the strings
       through a match function (ht_find, limited to PROBE_LIMIT probes), entries are added
       with ht_insert_reserved and removed by their value (ht_find_val + ht_delete_at);
     - int64 keys (seconds, bucket indices, intent ids, state keys) are the keys, stored
       multiplied by an odd constant (Fibonacci hashing; a bijection, so equal keys stay
       equal): i64_get, i64_insert_reserved, i64_remove.
   Either way a key's probe sequence starts at its top bits. */
typedef struct {
    uint64_t key;
    int64_t val; /* < 0: empty */
} HEntry;

typedef struct {
    HEntry *e;
    size_t mask;
    int shift; /* 64 - log2(capacity) */
    Py_ssize_t used;
} HTable;

/* Whether the entry valued `val` stands for `what` (base: the array the values index). */
typedef int (*HtMatch)(const void *base, const void *what, int64_t val);

static inline size_t
ht_slot(const HTable *t, uint64_t key)
{
    return (size_t)(key >> t->shift);
}

/* The entry at the start of key's probe sequence, for prefetching (NULL: no entries yet). */
static inline const HEntry *
ht_home(const HTable *t, uint64_t key)
{
    return t->e != NULL ? &t->e[ht_slot(t, key)] : NULL;
}

/* Position of the first entry holding `key` that `match` accepts (match NULL: any), -1 when
   none; when `limited`, -2 once the probe sequence is longer than PROBE_LIMIT. */
static inline __attribute__((always_inline)) Py_ssize_t
ht_probe(const HTable *t, uint64_t key, HtMatch match, const void *base, const void *what,
         int limited)
{
    if (t->e == NULL) {
        return -1;
    }
    size_t m = t->mask, i = ht_slot(t, key);
    for (size_t probes = 0;; probes++) {
        const HEntry *x = &t->e[i];
        if (x->val < 0) {
            return -1;
        }
        if (x->key == key && (match == NULL || match(base, what, x->val))) {
            return (Py_ssize_t)i;
        }
        if (limited && probes > PROBE_LIMIT) {
            return -2;
        }
        i = (i + 1) & m;
    }
}

/* Position of the entry for str `what` (hash h), -1 when absent, -2 when the probe sequence
   is too long. */
static inline __attribute__((always_inline)) Py_ssize_t
ht_find(const HTable *t, uint64_t h, HtMatch match, const void *base, const void *what)
{
    return ht_probe(t, h, match, base, what, 1);
}

static inline int
val_is(const void *Py_UNUSED(base), const void *what, int64_t val)
{
    return *(const int64_t *)what == val;
}

/* Position of the entry (h, val), or -1. */
static inline Py_ssize_t
ht_find_val(const HTable *t, uint64_t h, int64_t val)
{
    return ht_probe(t, h, val_is, NULL, &val, 0);
}

static int
ht_resize(HTable *t, int bits)
{
    size_t ncap = (size_t)1 << bits;
    HEntry *ne = malloc(ncap * sizeof(HEntry));
    if (ne == NULL) {
        PyErr_NoMemory();
        return -1;
    }
    memset(ne, 0xff, ncap * sizeof(HEntry)); /* val == -1 everywhere */
    HTable nt = {ne, ncap - 1, 64 - bits, t->used};
    if (t->e != NULL) {
        for (size_t i = 0; i <= t->mask; i++) {
            HEntry *x = &t->e[i];
            if (x->val >= 0) {
                size_t j = ht_slot(&nt, x->key);
                while (ne[j].val >= 0) {
                    j = (j + 1) & nt.mask;
                }
                ne[j] = *x;
            }
        }
        free(t->e);
    }
    *t = nt;
    return 0;
}

/* Room for one more entry. */
static inline int
ht_reserve1(HTable *t)
{
    size_t cap = t->e ? t->mask + 1 : 0;
    if (__builtin_expect((size_t)(t->used + 1) * 2 > cap, 0)) {
        int bits = cap ? 64 - t->shift + 1 : 4;
        if (bits > 40) {
            PyErr_NoMemory();
            return -1;
        }
        return ht_resize(t, bits);
    }
    return 0;
}

/* Add an entry (for an absent str or key); ht_reserve1 must have succeeded. */
static void
ht_insert_reserved(HTable *t, uint64_t key, int64_t val)
{
    size_t m = t->mask, i = ht_slot(t, key);
    while (t->e[i].val >= 0) {
        i = (i + 1) & m;
    }
    t->e[i].key = key;
    t->e[i].val = val;
    t->used++;
}

static void
ht_delete_at(HTable *t, Py_ssize_t pos)
{
    size_t m = t->mask, i = (size_t)pos, j = i;
    for (;;) {
        j = (j + 1) & m;
        if (t->e[j].val < 0) {
            break;
        }
        size_t k = ht_slot(t, t->e[j].key);
        if (i <= j ? (i < k && k <= j) : (i < k || k <= j)) {
            continue;
        }
        t->e[i] = t->e[j];
        i = j;
    }
    t->e[i].val = -1;
    t->used--;
}

static void
ht_clear(HTable *t)
{
    if (t->e != NULL) {
        memset(t->e, 0xff, (t->mask + 1) * sizeof(HEntry));
    }
    t->used = 0;
}

static void
ht_free(HTable *t)
{
    free(t->e);
    memset(t, 0, sizeof(*t));
}

/* int64 keys, as the table stores them. */
static inline uint64_t
i64_key(int64_t key)
{
    return (uint64_t)key * 0x9E3779B97F4A7C15ULL;
}

/* The value of key, or -1. */
static inline int64_t
i64_get(const HTable *t, int64_t key)
{
    Py_ssize_t pos = ht_probe(t, i64_key(key), NULL, NULL, NULL, 0);
    return pos >= 0 ? t->e[pos].val : -1;
}

/* Add an absent key; ht_reserve1 must have succeeded. */
static inline void
i64_insert_reserved(HTable *t, int64_t key, int64_t val)
{
    ht_insert_reserved(t, i64_key(key), val);
}

/* Remove key; returns its value, or -1 when absent. */
static int64_t
i64_remove(HTable *t, int64_t key)
{
    Py_ssize_t pos = ht_probe(t, i64_key(key), NULL, NULL, NULL, 0);
    if (pos < 0) {
        return -1;
    }
    int64_t val = t->e[pos].val;
    ht_delete_at(t, pos);
    return val;
}

/* ------------------------------------------------------------------------------------------ */
/* _SecondBuckets: records filed under whole seconds; a heap of seconds, one byte buffer per    */
/* second holding its records in insertion order.                                               */

typedef struct {
    char *buf;
    size_t len, cap;
} SBList;

typedef struct {
    HTable map; /* second -> list slot */
    SBList *lists;
    Py_ssize_t nlists, caplists;
    int64_t *freeslots;
    Py_ssize_t nfree, capfree;
    int64_t *heap;
    Py_ssize_t nheap, capheap;
    int64_t cache_sec, cache_slot; /* last list added to (cache_slot < 0: none) */
} SecBuckets;

static void
heap_push(int64_t *h, Py_ssize_t *n, int64_t v)
{
    Py_ssize_t i = (*n)++;
    while (i > 0) {
        Py_ssize_t p = (i - 1) / 2;
        if (h[p] <= v) {
            break;
        }
        h[i] = h[p];
        i = p;
    }
    h[i] = v;
}

static int64_t
heap_pop(int64_t *h, Py_ssize_t *n)
{
    int64_t top = h[0];
    int64_t v = h[--(*n)];
    Py_ssize_t len = *n, i = 0;
    for (;;) {
        Py_ssize_t c = 2 * i + 1;
        if (c >= len) {
            break;
        }
        if (c + 1 < len && h[c + 1] < h[c]) {
            c++;
        }
        if (v <= h[c]) {
            break;
        }
        h[i] = h[c];
        i = c;
    }
    if (len > 0) {
        h[i] = v;
    }
    return top;
}

/* The list slot of `second` (made, and its second pushed on the heap, when new); -1: error. */
static int64_t
sb_slot_slow(SecBuckets *sb, int64_t second)
{
    int64_t slot = i64_get(&sb->map, second);
    if (slot < 0) {
        if (GROW(sb->heap, sb->capheap, sb->nheap + 1) < 0 || ht_reserve1(&sb->map) < 0) {
            return -1;
        }
        if (sb->nfree > 0) {
            slot = sb->freeslots[--sb->nfree];
        }
        else {
            if (sb->nlists >= INT32_MAX ||
                GROW(sb->lists, sb->caplists, sb->nlists + 1) < 0 ||
                GROW(sb->freeslots, sb->capfree, sb->nlists + 1) < 0) {
                if (!PyErr_Occurred()) {
                    PyErr_NoMemory();
                }
                return -1;
            }
            slot = sb->nlists++;
            sb->lists[slot].buf = NULL;
            sb->lists[slot].len = 0;
            sb->lists[slot].cap = 0;
        }
        i64_insert_reserved(&sb->map, second, slot);
        heap_push(sb->heap, &sb->nheap, second);
    }
    sb->cache_sec = second;
    sb->cache_slot = slot;
    return slot;
}

static inline int64_t
sb_slot(SecBuckets *sb, int64_t second)
{
    if (sb->cache_slot >= 0 && sb->cache_sec == second) {
        return sb->cache_slot;
    }
    return sb_slot_slow(sb, second);
}

/* Room for n more bytes at the end of list `slot`: returns where to write, sets *off. */
static inline char *
sb_append(SecBuckets *sb, int64_t slot, size_t n, size_t *off)
{
    SBList *l = &sb->lists[slot];
    if (__builtin_expect(l->len + n > l->cap, 0)) {
        size_t nc = l->cap ? l->cap : 64;
        while (nc < l->len + n) {
            if (nc > SIZE_MAX / 2) {
                PyErr_NoMemory();
                return NULL;
            }
            nc *= 2;
        }
        char *q = realloc(l->buf, nc);
        if (q == NULL) {
            PyErr_NoMemory();
            return NULL;
        }
        l->buf = q;
        l->cap = nc;
    }
    *off = l->len;
    l->len += n;
    return l->buf + *off;
}

/* Whether the oldest second is due before time_s (Python: order[0] + 1 <= time_s). */
static inline int
sb_due(const SecBuckets *sb, double time_s)
{
    return sb->nheap > 0 && (double)(sb->heap[0] + 1) <= time_s;
}

/* Pop the oldest second; the caller reads lists[*slot] and then calls sb_release. */
static int64_t
sb_pop(SecBuckets *sb, int64_t *slot)
{
    int64_t second = heap_pop(sb->heap, &sb->nheap);
    *slot = i64_remove(&sb->map, second);
    if (sb->cache_slot >= 0 && sb->cache_sec == second) {
        sb->cache_slot = -1;
    }
    return second;
}

static void
sb_release(SecBuckets *sb, int64_t slot)
{
    sb->lists[slot].len = 0;
    sb->freeslots[sb->nfree++] = slot; /* capacity reserved when the slot was made */
}

static void
sb_free(SecBuckets *sb)
{
    for (Py_ssize_t s = 0; s < sb->nlists; s++) {
        free(sb->lists[s].buf);
    }
    free(sb->lists);
    free(sb->freeslots);
    free(sb->heap);
    ht_free(&sb->map);
    memset(sb, 0, sizeof(*sb));
    sb->cache_slot = -1;
}

/* A remembered request id in its second's buffer: this header, then the code units padded
   to 8 bytes. */
typedef struct {
    Py_hash_t hash;
    uint32_t nbytes;
    uint32_t kind;
} RidHdr;

#define RID_RECORD_SIZE(nbytes) (sizeof(RidHdr) + (((size_t)(nbytes) + 7) & ~(size_t)7))

/* ------------------------------------------------------------------------------------------ */
/* The shared-prefix index (SharedIndexCore, defined below), as the replay engine calls it     */

typedef struct Sp Sp;
static PyObject *sp_observe(Sp *self, PyObject *const *args, Py_ssize_t nargs, PyObject *kwnames);
static PyObject *sp_continues(Sp *self, PyObject *const *args, Py_ssize_t nargs);
static PyObject *sp_release(Sp *self, PyObject *const *args, Py_ssize_t nargs);
static PyObject *sp_expire(Sp *self, PyObject *arg);
static PyObject *sp_clear_private(Sp *self, PyObject *ignored);
static PyObject *sp_clear_changes(Sp *self, PyObject *ignored);
static int sp_has_due(const Sp *self, double watermark);
static Py_ssize_t sp_capacity(const Sp *self);

/* ------------------------------------------------------------------------------------------ */
/* Engine structures                                                                            */

typedef struct {
    double ts;
    int32_t input, blocks, turn, intent;
    /* TurnRecord's shared prefix: its leading shared blocks (at most `blocks`), how many of
       them became shared with it, and their flat (gap s, blocks, ...) tuple (strong; NULL when
       shared is 0, where the window reads none of the three) */
    int32_t shared, born;
    PyObject *gaps;
} Turn;

/* A session slot: a session id with its open conversation (when is_open).  The bookkeeping
   read for every deadline entry lives apart, in SessMeta (small, stays in cache); the key
   and the turns (read when an event arrives or the conversation completes) live in Sess. */
typedef struct {
    int64_t dsec;       /* floor(last_ts + completion_timeout_s) of the open conversation */
    Py_hash_t hash;     /* of the session id */
    int32_t prev, next; /* open-dict insertion order; next also links the free list */
    int32_t pending;    /* deadline entries naming this slot */
    int32_t is_open;
} SessMeta;

typedef struct {
    double last_ts;
    int32_t n;       /* turns, sorted by turn */
    int32_t cap;     /* capacity of theap */
    uint32_t nbytes; /* key code units, in bytes */
    uint8_t kind, on_heap, pad_[2];
    char *kheap;     /* the key when longer than INLINE_KEY bytes */
    Turn *theap;     /* the turns when more than INLINE_TURNS (kept for reuse) */
    /* With the shared-prefix index: the session id its blocks are owned by and the block ids
       it holds there (Conversation.held), both strong; NULL until its first event with
       block_hashes and once the conversation closes. */
    PyObject *owner, *held;
    char kdata[INLINE_KEY];
    Turn tin[INLINE_TURNS];
} Sess;

_Static_assert(sizeof(Sess) == 256, "a session slot is four cache lines");

#define SESS_TURNS(s) ((s)->on_heap ? (s)->theap : (s)->tin)
#define SESS_KEY(s) ((s)->nbytes <= INLINE_KEY ? (s)->kdata : (s)->kheap)

typedef struct {
    int64_t turn;
    int64_t reached, continued;
    int32_t intent;
} StateE;

typedef struct {
    int64_t conversations, sum_R, sum_H, sum_H_hash, sum_B, sum_M;
    int64_t sum_S, sum_S_B, shared_born; /* the shared prefixes' (MomentSums) */
    int32_t intent;
} MomE;

typedef struct {
    double delay;
    int64_t blocks, turn;
    int64_t prev_shared;  /* of blocks, those the revisit finds shared */
    int32_t intent;       /* the conversation's (the forecast's class) */
    int32_t state_intent; /* of the state it leaves (StatsConfig.state_intent) */
} DelayE;

/* Per intent in a bucket: positions of its states of turns 1..DIRECT_TURNS and of its
   moments (-1: none yet). */
typedef struct {
    int32_t state[DIRECT_TURNS + 1];
    int32_t mom;
} IntentRow;

/* A shared block gap: `blocks` shared blocks referenced again `gap` s after their previous
   reference (one pair of Bucket.shared_gaps). */
typedef struct {
    double gap;
    int64_t blocks;
} GapE;

typedef struct {
    int64_t index, conversations;
    HTable smap; /* state key -> position in states (turns outside 1..DIRECT_TURNS) */
    StateE *states;
    Py_ssize_t ns, caps;
    HTable rmap; /* intent id -> row */
    IntentRow *rows;
    Py_ssize_t nr, capr;
    MomE *moms;
    Py_ssize_t nm, capm;
    DelayE *delays;
    Py_ssize_t nd, capd;
    GapE *gaps; /* Bucket.shared_gaps, in order */
    Py_ssize_t ng, capg;
} Bucket;

typedef struct {
    int64_t second, starts, cached, input;
} SecE;

#define N_FIELDS 9
/* Where a struct type keeps the event fields read here (member descriptor offsets). */
typedef struct {
    PyTypeObject *type; /* borrowed: Core holds the reference */
    Py_ssize_t off[N_FIELDS];
    char obj_ex[N_FIELDS];
} FieldTable;

typedef struct {
    PyObject_HEAD
    /* configuration */
    int64_t block_size;
    double timeout, lateness;
    double skew, future_bound; /* max_future_skew_s; max(newest_ts, clock_s) + skew */
    int64_t max_turn;
    int64_t window_conversations;
    double max_age, bucket_s;
    int64_t rate_window;
    int64_t max_open;
    PyObject *label_map;   /* producer label -> state label (IntentLabeller.label_map) */
    PyObject *unknown_label;
    PyObject *parse, *rejected, *event_type, *delay_type;
    PyObject *decode;          /* parse_event's strict decoder, called without parse_event */
    PyObject *decode_type;     /* what decode returns: event_type's fields, no __post_init__ */
    Py_ssize_t max_event_bytes; /* parse_event sends larger payloads to its reference path */
    PyObject *unsupported; /* the ReplayUnsupported class */
    uint64_t seed;         /* of bytes_hash */
    PyObject *s_reason, *s_too_late, *s_future, *s_open_limit;
    PyObject *s_field, *s_timestamp, *s_session_id; /* a rejection's field at fault */
    PyObject *rejections; /* list of (position, reason, field): StatsEngine.note_rejection */
    int64_t offered;      /* lines offered so far: the position of the next one */
    FieldTable ev_fields;  /* of event_type (what parse returns) */
    FieldTable raw_fields; /* of decode_type (what decode returns) */
    PyObject *last_rejection;

    /* labeller */
    HTable labels;         /* label (its hash) -> id (1..); the str is label_objs[id] */
    PyObject **label_objs; /* id -> first str seen (id 0: unknown_label, borrowed) */
    Py_ssize_t nlabel_objs, caplabel_objs;
    PyObject *own_intent;  /* window.own_intent_rule(state_intent): label -> bool */
    uint8_t *own_flags;    /* id -> own_intent(label): its turns key their own state */
    Py_ssize_t capown_flags;
    int64_t folded;

    /* tracker */
    HTable sess_tab; /* session id -> live slot */
    Sess *sess;      /* 64-byte aligned */
    SessMeta *meta;
    Py_ssize_t nsess, capsess;
    int32_t sess_free, open_head, open_tail;
    Py_ssize_t open_count;
    HTable seen;            /* remembered request ids -> (idexp slot << 32 | record offset) */
    SecBuckets deadlines;   /* int32 session slots */
    SecBuckets idexp;       /* request id records */
    double newest_ts;

    /* window */
    Bucket *bk;
    Py_ssize_t nbk, capbk;
    int64_t *bk_free;
    Py_ssize_t nbk_free, capbk_free;
    int64_t *bk_order; /* live bucket slots in creation order */
    Py_ssize_t nbk_order, capbk_order;
    HTable bk_map; /* bucket index -> slot */
    int64_t bk_cache_index, bk_cache_slot;

    /* arrivals */
    SecE *secs;
    Py_ssize_t nsecs, capsecs;
    HTable sec_map; /* second -> position */
    double first_start, newest_start;
    int64_t start_count;

    /* counters */
    int64_t processed, duplicates;
    PyObject *reason_index; /* dict: reason -> int position */
    PyObject **reason_objs;
    int64_t *reason_counts;
    Py_ssize_t nreasons, capreason_objs, capreason_counts;
    int64_t too_late_pos, future_pos, open_limit_pos;
    int64_t completions_since_expiry;

    /* shared-prefix index (ConversationTracker.shared_index): NULL when off */
    int use_index;
    PyObject *shared_index; /* a SharedIndexCore */
    PyObject *last_seen;    /* this core's _last_seen, bound, during offer_lines: the index's
                               callback */
    PyObject *no_held;      /* (): a conversation that holds no blocks */
    PyObject *s_last_seen;  /* "_last_seen", interned: the type's attribute cache keeps its
                               lookups' names, so a fresh str a call would pile up there */
} Core;

enum { F_SESSION, F_TURN, F_TS, F_INPUT, F_RID, F_INTENT, F_CACHED, F_MESSAGES, F_HASHES };
static const char *const FIELD_NAMES[N_FIELDS] = {
    "session_id", "turn", "timestamp", "input_tokens", "request_id", "intent", "cached_tokens",
    "messages", "block_hashes",
};

typedef struct {
    PyObject *unsupported;
    PyObject *core_type;
    PyObject *shared_index_type;
} ModState;

static int
unsupported(Core *self, const char *msg)
{
    PyErr_SetString(self->unsupported, msg);
    return -1;
}

/* ------------------------------------------------------------------------------------------ */
/* Counters                                                                                    */

/* Counter[reason] += 1; *cache (if given) remembers the position of a fixed reason. */
static int
count_reason(Core *self, PyObject *reason, int64_t *cache)
{
    Py_ssize_t pos;
    if (cache != NULL && *cache >= 0) {
        pos = (Py_ssize_t)*cache;
    }
    else {
        PyObject *idx = PyDict_GetItemWithError(self->reason_index, reason);
        if (idx != NULL) {
            pos = PyLong_AsSsize_t(idx);
            if (pos < 0 && PyErr_Occurred()) {
                return -1;
            }
        }
        else {
            if (PyErr_Occurred()) {
                return -1;
            }
            if (GROW(self->reason_objs, self->capreason_objs, self->nreasons + 1) < 0 ||
                GROW(self->reason_counts, self->capreason_counts, self->nreasons + 1) < 0) {
                return -1;
            }
            pos = self->nreasons;
            PyObject *pyidx = PyLong_FromSsize_t(pos);
            if (pyidx == NULL) {
                return -1;
            }
            int r = PyDict_SetItem(self->reason_index, reason, pyidx);
            Py_DECREF(pyidx);
            if (r < 0) {
                return -1;
            }
            Py_INCREF(reason);
            self->reason_objs[pos] = reason;
            self->reason_counts[pos] = 0;
            self->nreasons++;
        }
        if (cache != NULL) {
            *cache = pos;
        }
    }
    self->reason_counts[pos]++;
    return 0;
}

/* StatsEngine.note_rejection: keep (position, reason, field) of the first REJECTIONS_KEPT. */
#define REJECTIONS_KEPT 100 /* kvcast.stats.engine.REJECTIONS_KEPT */
static int
note_rejection(Core *self, PyObject *reason, PyObject *field)
{
    if (PyList_GET_SIZE(self->rejections) >= REJECTIONS_KEPT) {
        return 0;
    }
    PyObject *item = Py_BuildValue("(LOO)", (long long)(self->offered - 1), reason,
                                   field != NULL ? field : Py_None);
    if (item == NULL) {
        return -1;
    }
    int r = PyList_Append(self->rejections, item);
    Py_DECREF(item);
    return r;
}

/* An outcome of the tracker that rejects the event: counted, and kept with its field. */
static int
reject_outcome(Core *self, PyObject *reason, int64_t *cache, PyObject *field)
{
    if (count_reason(self, reason, cache) < 0) {
        return -1;
    }
    return note_rejection(self, reason, field);
}

/* ------------------------------------------------------------------------------------------ */
/* Window                                                                                      */

static void
bucket_free_contents(Bucket *b)
{
    ht_free(&b->smap);
    ht_free(&b->rmap);
    free(b->states);
    free(b->rows);
    free(b->moms);
    free(b->delays);
    free(b->gaps);
    memset(b, 0, sizeof(*b));
}

/* The row of `intent` in bucket b (made when new); -1 on error. */
static int64_t
bucket_row(Bucket *b, int32_t intent)
{
    int64_t r = i64_get(&b->rmap, intent);
    if (r >= 0) {
        return r;
    }
    if (GROW(b->rows, b->capr, b->nr + 1) < 0 || ht_reserve1(&b->rmap) < 0) {
        return -1;
    }
    r = b->nr++;
    memset(&b->rows[r], 0xff, sizeof(IntentRow)); /* all -1 */
    i64_insert_reserved(&b->rmap, intent, r);
    return r;
}

/* The state (intent, turn) of bucket b, made (at the end of the states' order) when new. */
static StateE *
bucket_state(Bucket *b, int64_t row, int32_t intent, int64_t turn)
{
    int direct = turn >= 1 && turn <= DIRECT_TURNS;
    int64_t key = 0, pos;
    if (direct) {
        pos = b->rows[row].state[turn];
    }
    else {
        key = (int64_t)(((uint64_t)(uint32_t)intent << 32) | (uint64_t)(uint32_t)(int32_t)turn);
        pos = i64_get(&b->smap, key);
    }
    if (pos >= 0) {
        return &b->states[pos];
    }
    if (GROW(b->states, b->caps, b->ns + 1) < 0 || (!direct && ht_reserve1(&b->smap) < 0)) {
        return NULL;
    }
    pos = b->ns++;
    if (direct) {
        b->rows[row].state[turn] = (int32_t)pos;
    }
    else {
        i64_insert_reserved(&b->smap, key, pos);
    }
    StateE *s = &b->states[pos];
    s->turn = turn;
    s->reached = 0;
    s->continued = 0;
    s->intent = intent;
    return s;
}

static MomE *
bucket_moments(Bucket *b, int64_t row, int32_t intent)
{
    int32_t pos = b->rows[row].mom;
    if (pos >= 0) {
        return &b->moms[pos];
    }
    if (GROW(b->moms, b->capm, b->nm + 1) < 0) {
        return NULL;
    }
    pos = (int32_t)b->nm++;
    b->rows[row].mom = pos;
    MomE *m = &b->moms[pos];
    memset(m, 0, sizeof(*m));
    m->intent = intent;
    return m;
}

/* Bucket.shared_gaps.extend(gaps): a turn's flat (gap s, blocks, ...), as sp_run builds it. */
static int
bucket_gaps_extend(Bucket *b, PyObject *gaps)
{
    Py_ssize_t n = PyTuple_GET_SIZE(gaps) / 2;
    if (GROW(b->gaps, b->capg, b->ng + n) < 0) {
        return -1;
    }
    for (Py_ssize_t i = 0; i < n; i++) {
        int64_t blocks = PyLong_AsLongLong(PyTuple_GET_ITEM(gaps, 2 * i + 1));
        if (blocks == -1 && PyErr_Occurred()) {
            return -1;
        }
        GapE *g = &b->gaps[b->ng++];
        g->gap = PyFloat_AS_DOUBLE(PyTuple_GET_ITEM(gaps, 2 * i));
        g->blocks = blocks;
    }
    return 0;
}

/* StatsWindow.add + Bucket.add_conversation for the open conversation of slot s. */
static int
window_add(Core *self, const Sess *conv)
{
    int64_t index = floor_i64(conv->last_ts / self->bucket_s);
    int64_t slot;
    if (self->bk_cache_slot >= 0 && self->bk_cache_index == index) {
        slot = self->bk_cache_slot;
    }
    else {
        slot = i64_get(&self->bk_map, index);
        if (slot < 0) {
            if (ht_reserve1(&self->bk_map) < 0 ||
                GROW(self->bk_order, self->capbk_order, self->nbk_order + 1) < 0) {
                return -1;
            }
            if (self->nbk_free > 0) {
                slot = self->bk_free[--self->nbk_free];
            }
            else {
                if (GROW(self->bk, self->capbk, self->nbk + 1) < 0 ||
                    GROW(self->bk_free, self->capbk_free, self->nbk + 1) < 0) {
                    return -1;
                }
                slot = self->nbk++;
            }
            Bucket *nb = &self->bk[slot];
            memset(nb, 0, sizeof(*nb));
            nb->index = index;
            i64_insert_reserved(&self->bk_map, index, slot);
            self->bk_order[self->nbk_order++] = slot;
        }
        self->bk_cache_index = index;
        self->bk_cache_slot = slot;
    }
    Bucket *b = &self->bk[slot];
    const Turn *T = SESS_TURNS(conv);
    Py_ssize_t n = conv->n;
    int64_t first = T[0].turn, last = T[n - 1].turn;
    int32_t intent = T[n - 1].intent;
    int64_t max_turn = self->max_turn;
    int64_t row = bucket_row(b, intent);
    if (row < 0 || GROW(b->delays, b->capd, b->nd + n) < 0 || b->ns > INT32_MAX - (last - first) - 2) {
        if (!PyErr_Occurred()) {
            PyErr_NoMemory();
        }
        return -1;
    }

    /* Whether some turn keys its state by its own intent (StatsConfig.state_intent). */
    const uint8_t *own = self->own_flags;
    int any_own = 0;
    for (Py_ssize_t i = 0; i < n && !any_own; i++) {
        any_own = own[T[i].intent];
    }
    if (any_own) {
        /* States: every turn from the first to the last, keyed (the turn's state intent,
           min(turn, max_turn)); a missing turn takes the state intent of the one before. */
        int32_t current = intent;
        Py_ssize_t i = 0;
        for (int64_t t = first; t <= last; t++) {
            if (T[i].turn == t) {
                current = own[T[i].intent] ? T[i].intent : intent;
                i++;
            }
            int64_t srow = bucket_row(b, current);
            StateE *s = srow < 0 ? NULL : bucket_state(b, srow, current, t < max_turn ? t : max_turn);
            if (s == NULL) {
                return -1;
            }
            s->reached++;
            if (t < last) {
                s->continued++;
            }
        }
    }
    else {
        /* States: every turn from the first to the last, keyed (intent, min(turn, max_turn)). */
        int64_t t = first;
        int64_t lim = last < max_turn - 1 ? last : max_turn - 1;
        for (; t <= lim; t++) {
            StateE *s = bucket_state(b, row, intent, t);
            if (s == NULL) {
                return -1;
            }
            s->reached++;
            if (t < last) {
                s->continued++;
            }
        }
        if (t <= last) { /* turns t..last all share the state max_turn; all but last continue */
            StateE *s = bucket_state(b, row, intent, max_turn);
            if (s == NULL) {
                return -1;
            }
            s->reached += last - t + 1;
            s->continued += last - t;
        }
    }

    /* Delays and the moment sums; the shared blocks' sums and gaps, in turn order. */
    int64_t sum_H = 0, sum_H_hash = 0;
    int64_t sum_S = T[0].shared, shared_born = 0;
    if (sum_S) {
        shared_born = T[0].born;
        if (bucket_gaps_extend(b, T[0].gaps) < 0) {
            return -1;
        }
    }
    for (Py_ssize_t i = 1; i < n; i++) {
        const Turn *prev = &T[i - 1], *rec = &T[i];
        int64_t shared = rec->shared;
        if (shared) {
            sum_S += shared;
            shared_born += rec->born;
            if (bucket_gaps_extend(b, rec->gaps) < 0) {
                return -1;
            }
        }
        int64_t blocks = prev->blocks;
        sum_H += blocks;
        if (blocks > 1) {
            sum_H_hash += blocks - 1;
        }
        if (rec->turn == prev->turn + 1) { /* room reserved above */
            double delay_s = rec->ts - prev->ts;
            DelayE *d = &b->delays[b->nd++];
            d->delay = delay_s >= 0.0 ? delay_s : 0.0;
            d->blocks = blocks;
            d->intent = intent;
            d->state_intent = own[prev->intent] ? prev->intent : intent;
            d->turn = prev->turn < max_turn ? prev->turn : max_turn;
            d->prev_shared = shared < blocks ? shared : blocks;
        }
    }
    MomE *m = bucket_moments(b, row, intent);
    if (m == NULL) {
        return -1;
    }
    int64_t last_blocks = T[n - 1].blocks;
    m->conversations += 1;
    m->sum_R += sum_H + last_blocks;
    m->sum_H += sum_H;
    m->sum_H_hash += sum_H_hash;
    m->sum_B += last_blocks;
    m->sum_M += last;
    if (sum_S) {
        m->sum_S += sum_S;
        m->sum_S_B += T[n - 1].shared;
        m->shared_born += shared_born;
    }
    b->conversations += 1;
    return 0;
}

typedef struct {
    int64_t index, slot;
} IdxSlot;

static int
cmp_index_desc(const void *a, const void *b)
{
    int64_t x = ((const IdxSlot *)a)->index, y = ((const IdxSlot *)b)->index;
    return (x < y) - (x > y);
}

/* StatsWindow.expire(now_s) with buckets_in_window(now_s). */
static int
window_expire(Core *self, double now_s)
{
    Py_ssize_t n = self->nbk_order;
    if (n == 0) {
        return 0;
    }
    IdxSlot *v = malloc((size_t)n * sizeof(IdxSlot));
    if (v == NULL) {
        PyErr_NoMemory();
        return -1;
    }
    for (Py_ssize_t i = 0; i < n; i++) {
        v[i].slot = self->bk_order[i];
        v[i].index = self->bk[v[i].slot].index;
    }
    qsort(v, (size_t)n, sizeof(IdxSlot), cmp_index_desc);
    double oldest_allowed = now_s - self->max_age;
    int64_t covered = 0;
    Py_ssize_t chosen = 0;
    for (Py_ssize_t i = 0; i < n; i++) {
        double end = (double)(v[i].index + 1) * self->bucket_s;
        if (end <= oldest_allowed) {
            break;
        }
        chosen++;
        covered += self->bk[v[i].slot].conversations;
        if (covered >= self->window_conversations) {
            break;
        }
    }
    int drop_all = chosen == 0;
    int64_t oldest_kept = drop_all ? 0 : v[chosen - 1].index;
    free(v);
    Py_ssize_t w = 0;
    for (Py_ssize_t i = 0; i < n; i++) {
        int64_t slot = self->bk_order[i];
        Bucket *b = &self->bk[slot];
        if (drop_all || b->index < oldest_kept) {
            i64_remove(&self->bk_map, b->index);
            bucket_free_contents(b);
            self->bk_free[self->nbk_free++] = slot;
        }
        else {
            self->bk_order[w++] = slot;
        }
    }
    self->nbk_order = w;
    self->bk_cache_slot = -1;
    return 0;
}

/* ------------------------------------------------------------------------------------------ */
/* Arrivals                                                                                    */

static int
arrivals_prune(Core *self)
{
    int64_t first = floor_i64(self->newest_start) - self->rate_window + 1;
    Py_ssize_t w = 0;
    for (Py_ssize_t i = 0; i < self->nsecs; i++) {
        if (self->secs[i].second >= first) {
            self->secs[w++] = self->secs[i];
        }
    }
    if (w == self->nsecs) {
        return 0;
    }
    self->nsecs = w;
    ht_clear(&self->sec_map);
    for (Py_ssize_t i = 0; i < w; i++) {
        i64_insert_reserved(&self->sec_map, self->secs[i].second, i); /* fewer than before */
    }
    return 0;
}

static int
arrivals_observe(Core *self, double ts, int64_t turn, int restarted, int64_t input,
                 int has_cached, int64_t cached)
{
    int is_start = turn == 1 || restarted;
    if (!is_start && !has_cached) {
        return 0;
    }
    int64_t second = floor_i64(ts);
    int64_t pos = i64_get(&self->sec_map, second);
    if (pos < 0) {
        if (GROW(self->secs, self->capsecs, self->nsecs + 1) < 0 ||
            ht_reserve1(&self->sec_map) < 0) {
            return -1;
        }
        pos = self->nsecs++;
        SecE *e = &self->secs[pos];
        e->second = second;
        e->starts = e->cached = e->input = 0;
        i64_insert_reserved(&self->sec_map, second, pos);
    }
    if (is_start) {
        self->secs[pos].starts += 1;
        self->start_count += 1;
        if (ts < self->first_start) {
            self->first_start = ts;
        }
        if (ts > self->newest_start) {
            self->newest_start = ts;
            if ((int64_t)self->nsecs > 4 * self->rate_window) {
                if (arrivals_prune(self) < 0) {
                    return -1;
                }
                pos = i64_get(&self->sec_map, second); /* kept: second >= the first kept */
            }
        }
    }
    if (has_cached) {
        self->secs[pos].cached += cached;
        self->secs[pos].input += input;
    }
    return 0;
}

/* ------------------------------------------------------------------------------------------ */
/* Tracker: session slots                                                                      */

/* Whether slot val of the slots (base) is the slot of session id `what` (a KeyView). */
static inline int
sess_is(const void *base, const void *what, int64_t val)
{
    const Sess *s = (const Sess *)base + val;
    return key_is(what, SESS_KEY(s), s->nbytes, s->kind);
}

/* Position in sess_tab of the live slot of session k, -1 when none, -2 when the probe
   sequence is too long. */
static inline Py_ssize_t
sess_find(const Core *self, const KeyView *k)
{
    return ht_find(&self->sess_tab, k->hash, sess_is, self->sess, k);
}

/* Room for one more slot (sess is kept 64-byte aligned, so it is moved by hand). */
static int
sess_reserve1(Core *self)
{
    if (self->nsess < self->capsess) {
        return 0;
    }
    if (self->nsess >= INT32_MAX - 1) {
        PyErr_NoMemory();
        return -1;
    }
    Py_ssize_t ncap = self->capsess ? self->capsess * 2 : 64;
    if (ncap > INT32_MAX) {
        ncap = INT32_MAX;
    }
    if ((size_t)ncap > SIZE_MAX / sizeof(Sess)) {
        PyErr_NoMemory();
        return -1;
    }
    void *ns = NULL;
    if (posix_memalign(&ns, 64, (size_t)ncap * sizeof(Sess)) != 0) {
        PyErr_NoMemory();
        return -1;
    }
    SessMeta *nm = realloc(self->meta, (size_t)ncap * sizeof(SessMeta));
    if (nm == NULL) {
        free(ns);
        PyErr_NoMemory();
        return -1;
    }
    self->meta = nm;
    if (self->sess != NULL) {
        memcpy(ns, self->sess, (size_t)self->nsess * sizeof(Sess));
        free(self->sess);
    }
    self->sess = ns;
    self->capsess = ncap;
    return 0;
}

/* A new live slot for session k (not open, nothing pending); -1 on error. */
static int32_t
sess_new(Core *self, const KeyView *k)
{
    if (k->nbytes > UINT32_MAX) {
        PyErr_NoMemory();
        return -1;
    }
    char *kheap = NULL;
    if (k->nbytes > INLINE_KEY) {
        kheap = malloc(k->nbytes);
        if (kheap == NULL) {
            PyErr_NoMemory();
            return -1;
        }
    }
    if (ht_reserve1(&self->sess_tab) < 0 || (self->sess_free < 0 && sess_reserve1(self) < 0)) {
        free(kheap);
        return -1;
    }
    int32_t si;
    if (self->sess_free >= 0) {
        si = self->sess_free;
        self->sess_free = self->meta[si].next;
    }
    else {
        si = (int32_t)self->nsess++;
        self->sess[si].theap = NULL;
        self->sess[si].cap = 0;
        self->sess[si].owner = self->sess[si].held = NULL;
    }
    SessMeta *m = &self->meta[si];
    m->dsec = 0;
    m->hash = k->hash;
    m->prev = m->next = -1;
    m->pending = 0;
    m->is_open = 0;
    Sess *s = &self->sess[si];
    s->last_ts = -INFINITY;
    s->n = 0;
    s->on_heap = 0;
    s->kind = (uint8_t)k->kind;
    s->nbytes = (uint32_t)k->nbytes;
    s->kheap = kheap;
    memcpy(kheap ? kheap : s->kdata, k->data, k->nbytes);
    ht_insert_reserved(&self->sess_tab, k->hash, si);
    return si;
}

/* Forget slot si (not open, nothing pending): out of the index, onto the free list. */
static void
sess_release(Core *self, int32_t si)
{
    SessMeta *m = &self->meta[si];
    Py_ssize_t pos = ht_find_val(&self->sess_tab, m->hash, si);
    if (pos >= 0) {
        ht_delete_at(&self->sess_tab, pos);
    }
    Sess *s = &self->sess[si];
    free(s->kheap);
    s->kheap = NULL;
    s->nbytes = 0;
    m->next = self->sess_free;
    self->sess_free = si;
}

/* Open a new conversation in slot si (appended to the open dict's order). */
static void
sess_open(Core *self, int32_t si, const Turn *first)
{
    Sess *s = &self->sess[si];
    s->on_heap = 0;
    s->n = 1;
    s->tin[0] = *first;
    s->last_ts = -INFINITY;
    SessMeta *m = &self->meta[si];
    m->is_open = 1;
    m->prev = self->open_tail;
    m->next = -1;
    if (self->open_tail >= 0) {
        self->meta[self->open_tail].next = si;
    }
    else {
        self->open_head = si;
    }
    self->open_tail = si;
    self->open_count++;
}

/* An open conversation's references (its turns' gaps, its owner and held ids) go. */
static void
sess_drop_refs(Sess *s)
{
    Turn *T = SESS_TURNS(s);
    for (int32_t i = 0; i < s->n; i++) {
        Py_CLEAR(T[i].gaps);
    }
    s->n = 0;
    Py_CLEAR(s->owner);
    Py_CLEAR(s->held);
}

/* Close the open conversation of slot si (out of the open dict); the slot stays. */
static void
sess_close(Core *self, int32_t si)
{
    SessMeta *m = &self->meta[si];
    if (m->prev >= 0) {
        self->meta[m->prev].next = m->next;
    }
    else {
        self->open_head = m->next;
    }
    if (m->next >= 0) {
        self->meta[m->next].prev = m->prev;
    }
    else {
        self->open_tail = m->prev;
    }
    m->prev = m->next = -1;
    m->is_open = 0;
    sess_drop_refs(&self->sess[si]);
    self->open_count--;
}

/* ConversationTracker._release: the open conversation of slot si completes.  Its private
   blocks leave the shared-prefix index, it goes into the window and its slot closes. */
static int
sess_complete(Core *self, int32_t si)
{
    Sess *s = &self->sess[si];
    int r = 0;
    if (s->held != NULL && PyTuple_GET_SIZE(s->held) > 0) {
        PyObject *args[2] = {s->owner, s->held};
        PyObject *done = sp_release((Sp *)self->shared_index, args, 2);
        if (done == NULL) {
            r = -1;
        }
        Py_XDECREF(done);
    }
    if (window_add(self, s) < 0) {
        r = -1;
    }
    sess_close(self, si);
    return r;
}

/* Room for one more turn in slot s; returns its turns (maybe moved to the heap). */
static Turn *
sess_turn_room(Sess *s)
{
    int32_t capacity = s->on_heap ? s->cap : INLINE_TURNS;
    if (s->n < capacity) {
        return SESS_TURNS(s);
    }
    if (s->n >= INT32_MAX / 2) {
        PyErr_NoMemory();
        return NULL;
    }
    if (s->cap < s->n + 1) {
        Py_ssize_t cap = s->cap;
        if (grow_array((void **)&s->theap, &cap, (Py_ssize_t)s->n + 1, sizeof(Turn)) < 0) {
            return NULL;
        }
        s->cap = (int32_t)(cap < INT32_MAX ? cap : INT32_MAX);
    }
    if (!s->on_heap) {
        memcpy(s->theap, s->tin, (size_t)s->n * sizeof(Turn));
        s->on_heap = 1;
    }
    return s->theap;
}

/* ConversationTracker._complete_due(watermark); adds the completions to *completed. */
static int
complete_due(Core *self, double watermark, int64_t *completed)
{
    SecBuckets *ids = &self->idexp;
    while (sb_due(ids, watermark)) {
        int64_t slot;
        sb_pop(ids, &slot);
        const SBList *l = &ids->lists[slot];
        size_t off = 0;
        while (off < l->len) {
            const RidHdr *h = (const RidHdr *)(l->buf + off);
            Py_ssize_t pos = ht_find_val(&self->seen, h->hash, (slot << 32) | (int64_t)off);
            if (pos >= 0) {
                ht_delete_at(&self->seen, pos);
            }
            off += RID_RECORD_SIZE(h->nbytes);
        }
        sb_release(ids, slot);
    }
    SecBuckets *dl = &self->deadlines;
    int err = 0;
    while (sb_due(dl, watermark)) {
        int64_t slot;
        int64_t second = sb_pop(dl, &slot);
        const int32_t *items = (const int32_t *)dl->lists[slot].buf;
        size_t n = dl->lists[slot].len / sizeof(int32_t);
        for (size_t k = 0; k < n && k < 3; k++) {
            const SessMeta *nx = &self->meta[items[k]];
            if (nx->is_open && nx->dsec == second) {
                const char *p = (const char *)&self->sess[items[k]];
                __builtin_prefetch(p);
                __builtin_prefetch(p + 64);
                __builtin_prefetch(p + 128);
                __builtin_prefetch(p + 192);
            }
        }
        for (size_t k = 0; k < n; k++) {
            /* Prefetch ahead: the bookkeeping of later entries, and the turns of those that
               will complete (their slots are cold: last touched a timeout ago). */
            if (k + 8 < n) {
                __builtin_prefetch(&self->meta[items[k + 8]], 1);
            }
            if (k + 3 < n) {
                const SessMeta *nx = &self->meta[items[k + 3]];
                if (nx->is_open && nx->dsec == second) {
                    const char *p = (const char *)&self->sess[items[k + 3]];
                    __builtin_prefetch(p);
                    __builtin_prefetch(p + 64);
                    __builtin_prefetch(p + 128);
                    __builtin_prefetch(p + 192);
                }
            }
            int32_t si = items[k];
            SessMeta *m = &self->meta[si];
            m->pending--;
            /* Python: open.get(session_id) and floor(last_ts + timeout) == second.  Entries
               left behind when a conversation's deadline moved later are skipped. */
            if (m->is_open && m->dsec == second) {
                if (sess_complete(self, si) < 0) {
                    err = 1;
                }
                (*completed)++;
            }
            if (!m->is_open && m->pending == 0) {
                sess_release(self, si);
            }
        }
        sb_release(dl, slot);
        if (err) {
            return -1;
        }
    }
    Sp *sp = (Sp *)self->shared_index;
    if (sp != NULL && sp_has_due(sp, watermark)) {
        PyObject *w = PyFloat_FromDouble(watermark);
        PyObject *done = w != NULL ? sp_expire(sp, w) : NULL;
        Py_XDECREF(w);
        if (done == NULL) {
            return -1;
        }
        Py_DECREF(done);
        /* A replay keeps no checkpoint: the index's changes since the last one can go. */
        done = sp_clear_changes(sp, NULL);
        if (done == NULL) {
            return -1;
        }
        Py_DECREF(done);
    }
    return 0;
}

/* ------------------------------------------------------------------------------------------ */
/* One event                                                                                    */

static int
type_error_field(int f, const char *expected, PyObject *got)
{
    PyErr_Format(PyExc_TypeError, "event field %s: expected %s, got %.100s", FIELD_NAMES[f],
                 expected, Py_TYPE(got)->tp_name);
    return -1;
}

/* A str field: exact str (TypeError when not a str at all, ReplayUnsupported for a subclass). */
static inline int
check_str(Core *self, int f, PyObject *v, int allow_none)
{
    if (PyUnicode_CheckExact(v)) {
        if (PyUnicode_READY(v) < 0) {
            return -1;
        }
        return 0;
    }
    if (allow_none && v == Py_None) {
        return 0;
    }
    if (PyUnicode_Check(v)) {
        return unsupported(self, "str subclass in an event field");
    }
    return type_error_field(f, allow_none ? "str or None" : "str", v);
}

static inline int
check_int(Core *self, int f, PyObject *v, int allow_none)
{
    if (PyLong_CheckExact(v) || (allow_none && v == Py_None)) {
        return 0;
    }
    if (PyLong_Check(v)) {
        return unsupported(self, "int subclass in an event field");
    }
    return type_error_field(f, allow_none ? "int or None" : "int", v);
}

/* An int strictly within +-limit (else ReplayUnsupported). */
static inline int
bounded_int(Core *self, PyObject *v, int64_t limit, int64_t *out)
{
    Py_ssize_t size = Py_SIZE(v);
    if (size >= -1 && size <= 1) { /* one digit: below 2**PyLong_SHIFT <= 2**30 */
        *out = (int64_t)size * (int64_t)((PyLongObject *)v)->ob_digit[0];
        return 0;
    }
    int overflow;
    long long x = PyLong_AsLongLongAndOverflow(v, &overflow);
    if (x == -1 && PyErr_Occurred()) {
        return -1;
    }
    if (overflow || x <= -limit || x >= limit) {
        return unsupported(self, "turn or token count out of the native engine's range");
    }
    *out = (int64_t)x;
    return 0;
}

static inline PyObject *
event_field(const FieldTable *ft, PyObject *ev, int f)
{
    PyObject *v = *(PyObject **)((char *)ev + ft->off[f]);
    if (v == NULL) {
        if (ft->obj_ex[f]) {
            PyErr_Format(PyExc_AttributeError, "event field %s is unset", FIELD_NAMES[f]);
            return NULL;
        }
        return Py_None;
    }
    return v;
}

/* Whether label id val (of label_objs, base) is the str `what`. */
static inline int
label_is(const void *base, const void *what, int64_t val)
{
    PyObject *o = ((PyObject *const *)base)[val];
    return o == what || str_eq(o, (PyObject *)what);
}

/* Commit the labeller's decision (IntentLabeller._canonical). */
static inline int
label_commit(Core *self, int action, PyObject *label, Py_hash_t h, int64_t id)
{
    if (action == 1) {
        PyObject *verdict = PyObject_CallOneArg(self->own_intent, label);
        int own = verdict == NULL ? -1 : PyObject_IsTrue(verdict);
        Py_XDECREF(verdict);
        if (own < 0 ||
            GROW(self->label_objs, self->caplabel_objs, self->nlabel_objs + 1) < 0 ||
            GROW(self->own_flags, self->capown_flags, self->nlabel_objs + 1) < 0 ||
            ht_reserve1(&self->labels) < 0) {
            return -1;
        }
        Py_INCREF(label);
        self->own_flags[self->nlabel_objs] = (uint8_t)(own > 0);
        self->label_objs[self->nlabel_objs++] = label;
        ht_insert_reserved(&self->labels, h, id);
    }
    else if (action == 2) {
        self->folded++;
    }
    return 0;
}

/* Whether the record at val (idexp slot << 32 | offset) of the lists (base) is request id
   `what` (a KeyView). */
static inline int
rid_is(const void *base, const void *what, int64_t val)
{
    const RidHdr *h = (const RidHdr *)(((const SBList *)base)[val >> 32].buf + (val & 0xffffffff));
    return key_is(what, h + 1, h->nbytes, h->kind);
}

/* Whether request id k is remembered (ConversationTracker._seen_ids); -1 when the probe
   sequence is too long. */
static inline int
seen_has(const Core *self, const KeyView *k)
{
    Py_ssize_t pos = ht_find(&self->seen, k->hash, rid_is, self->idexp.lists, k);
    return pos >= 0 ? 1 : pos == -1 ? 0 : -1;
}

/* Remember request id k under second `second` (seen_ids + _id_expiry.add). */
static int
seen_add(Core *self, const KeyView *k, int64_t second)
{
    if (k->nbytes > UINT32_MAX || ht_reserve1(&self->seen) < 0) {
        if (!PyErr_Occurred()) {
            PyErr_NoMemory();
        }
        return -1;
    }
    int64_t slot = sb_slot(&self->idexp, second);
    if (slot < 0) {
        return -1;
    }
    size_t off;
    char *rec = sb_append(&self->idexp, slot, RID_RECORD_SIZE(k->nbytes), &off);
    if (rec == NULL) {
        return -1;
    }
    if (off > UINT32_MAX) {
        self->idexp.lists[slot].len = off;
        PyErr_NoMemory();
        return -1;
    }
    RidHdr *h = (RidHdr *)rec;
    h->hash = k->hash;
    h->nbytes = (uint32_t)k->nbytes;
    h->kind = k->kind;
    bytes_copy(h + 1, k->data, k->nbytes);
    ht_insert_reserved(&self->seen, k->hash, (slot << 32) | (int64_t)off);
    return 0;
}

/* The shared-prefix part of ConversationTracker.observe, for an event with block hashes.  A
   request that does not continue the open conversation's context (a new context: compacted,
   edited) completes it first (*is_open cleared, *restarted set, one more in *completed);
   then the index observes the request.  Fills rec's shared prefix and hands back the
   conversation's held ids (a new reference) and the id its blocks are owned by (borrowed:
   the open conversation's or the event's). */
static int
index_observe(Core *self, int32_t si, int *is_open, PyObject *session, PyObject *ts_o,
              PyObject *hashes, int64_t turn, Turn *rec, PyObject **held_out,
              PyObject **owner_out, int64_t *completed, int *restarted)
{
    Sp *sp = (Sp *)self->shared_index;
    Sess *c = *is_open ? &self->sess[si] : NULL;
    PyObject *owner = c != NULL && c->owner != NULL ? c->owner : session;
    PyObject *held = c != NULL && c->held != NULL ? c->held : self->no_held;
    int newest = c == NULL || turn >= SESS_TURNS(c)[c->n - 1].turn;
    if (c != NULL && newest) {
        PyObject *args[2] = {hashes, held};
        PyObject *verdict = sp_continues(sp, args, 2);
        if (verdict == NULL) {
            return -1;
        }
        int same_context = verdict == Py_True;
        Py_DECREF(verdict);
        if (!same_context) {
            (*completed)++;
            *is_open = 0;
            *restarted = 1;
            owner = session; /* the closed conversation's owner object goes with it */
            held = self->no_held;
            if (sess_complete(self, si) < 0) {
                return -1;
            }
        }
    }
    PyObject *args[6] = {owner, ts_o, hashes, held, self->last_seen,
                         newest ? Py_True : Py_False};
    PyObject *result = sp_observe(sp, args, 6, NULL);
    if (result == NULL) {
        return -1;
    }
    PyObject *run = PyTuple_GET_ITEM(result, 0); /* SharedRun(blocks, gaps, born) */
    int64_t shared = PyLong_AsLongLong(PyTuple_GET_ITEM(run, 0));
    int64_t born = shared == -1 && PyErr_Occurred() ? -1
                                                    : PyLong_AsLongLong(PyTuple_GET_ITEM(run, 2));
    if (born == -1 && PyErr_Occurred()) {
        Py_DECREF(result);
        return -1;
    }
    if (shared > rec->blocks) {
        shared = rec->blocks;
    }
    /* both at most the request's ids (MAX_BLOCK_HASHES) */
    rec->shared = (int32_t)shared;
    rec->born = (int32_t)born;
    rec->gaps = shared > 0 ? Py_NewRef(PyTuple_GET_ITEM(run, 1)) : NULL;
    *held_out = Py_NewRef(PyTuple_GET_ITEM(result, 1));
    *owner_out = owner;
    Py_DECREF(result);
    return 0;
}

/* ingest for a parsed event (read through ft): label it, then StatsEngine.apply.
   default_rid, when not NULL, stands for the event's empty request_id. */
static int
apply_fields(Core *self, PyObject *ev, const FieldTable *ft, PyObject *default_rid)
{
    PyObject *session = event_field(ft, ev, F_SESSION);
    PyObject *turn_o = session ? event_field(ft, ev, F_TURN) : NULL;
    PyObject *ts_o = turn_o ? event_field(ft, ev, F_TS) : NULL;
    PyObject *input_o = ts_o ? event_field(ft, ev, F_INPUT) : NULL;
    PyObject *rid = input_o ? event_field(ft, ev, F_RID) : NULL;
    PyObject *intent_o = rid ? event_field(ft, ev, F_INTENT) : NULL;
    PyObject *cached_o = intent_o ? event_field(ft, ev, F_CACHED) : NULL;
    PyObject *hashes = cached_o ? event_field(ft, ev, F_HASHES) : NULL;
    if (hashes == NULL) {
        return -1;
    }
    if (hashes != Py_None && !PyList_CheckExact(hashes)) {
        return type_error_field(F_HASHES, "list or None", hashes);
    }
    int use_index = self->use_index && hashes != Py_None && PyList_GET_SIZE(hashes) > 0;
    if (default_rid != NULL) {
        rid = default_rid;
    }
    if (check_str(self, F_SESSION, session, 0) < 0 || check_int(self, F_TURN, turn_o, 0) < 0 ||
        check_int(self, F_INPUT, input_o, 0) < 0 || check_str(self, F_RID, rid, 0) < 0 ||
        check_str(self, F_INTENT, intent_o, 1) < 0 || check_int(self, F_CACHED, cached_o, 1) < 0) {
        return -1;
    }
    if (!PyFloat_CheckExact(ts_o)) {
        if (PyFloat_Check(ts_o)) {
            return unsupported(self, "float subclass in an event field");
        }
        return type_error_field(F_TS, "float", ts_o);
    }
    double ts = PyFloat_AS_DOUBLE(ts_o);

    /* Hash the keys first and prefetch their index slots, so that the misses overlap. */
    KeyView rk, sk;
    key_view(session, &sk, self->seed);
    const HEntry *sess_home = ht_home(&self->sess_tab, sk.hash);
    if (sess_home != NULL) {
        __builtin_prefetch(sess_home);
    }
    key_view(rid, &rk, self->seed);
    const HEntry *seen_home = ht_home(&self->seen, rk.hash);
    if (seen_home != NULL) {
        __builtin_prefetch(seen_home);
    }

    /* IntentLabeller.label_batch -> _canonical, decided now, committed below. */
    PyObject *label = intent_o == Py_None ? self->unknown_label : intent_o;
    int action = 0; /* 0: known or unknown, 1: add a label, 2: fold */
    int64_t label_id = 0;
    Py_hash_t label_hash = 0;
    if (label != self->unknown_label) {
        label_hash = str_key_hash(label, self->seed);
        Py_ssize_t lp = ht_find(&self->labels, label_hash, label_is, self->label_objs, label);
        if (lp == -2) {
            return unsupported(self, "colliding intent labels");
        }
        if (lp >= 0) {
            label_id = self->labels.e[lp].val;
        }
        else if (str_eq(label, self->unknown_label)) {
            label_id = 0;
        }
        else {
            /* Not seen yet: the taxonomy's label map decides (absent: fold into unknown). */
            PyObject *state = PyDict_GetItemWithError(self->label_map, label); /* borrowed */
            if (state == NULL) {
                if (PyErr_Occurred()) {
                    return -1;
                }
                action = 2;
            }
            else {
                if (!PyUnicode_CheckExact(state)) {
                    return unsupported(self, "a label map value that is not a str");
                }
                if (state != label && !str_eq(state, label)) { /* a merged category */
                    label = state;
                    label_hash = str_key_hash(label, self->seed);
                    lp = ht_find(&self->labels, label_hash, label_is, self->label_objs, label);
                    if (lp == -2) {
                        return unsupported(self, "colliding intent labels");
                    }
                }
                if (lp >= 0) {
                    label_id = self->labels.e[lp].val;
                }
                else if (str_eq(label, self->unknown_label)) {
                    label_id = 0;
                }
                else {
                    label_id = self->nlabel_objs;
                    if (label_id >= MAX_LABEL_IDS) {
                        return unsupported(self, "too many intent labels for the native engine");
                    }
                    action = 1;
                }
            }
        }
    }

    /* ConversationTracker.observe: the outcome first, without changing anything. */
    if (ts < self->newest_ts - self->lateness) {
        if (label_commit(self, action, label, label_hash, label_id) < 0) {
            return -1;
        }
        return reject_outcome(self, self->s_too_late, &self->too_late_pos, self->s_timestamp);
    }
    if (ts > self->future_bound) {
        if (label_commit(self, action, label, label_hash, label_id) < 0) {
            return -1;
        }
        return reject_outcome(self, self->s_future, &self->future_pos, self->s_timestamp);
    }
    if (sess_home != NULL && sess_home->val >= 0 && sess_home->key == (uint64_t)sk.hash) {
        __builtin_prefetch(&self->sess[sess_home->val]); /* the likely slot of the session */
    }
    int dup = seen_has(self, &rk);
    if (dup < 0) {
        return unsupported(self, "colliding request ids");
    }
    if (dup) {
        if (label_commit(self, action, label, label_hash, label_id) < 0) {
            return -1;
        }
        self->duplicates++;
        return 0;
    }
    Py_ssize_t spos = sess_find(self, &sk);
    if (spos == -2) {
        return unsupported(self, "colliding session ids");
    }
    int32_t si = spos >= 0 ? (int32_t)self->sess_tab.e[spos].val : -1;
    int is_open = si >= 0 && self->meta[si].is_open;
    if (!is_open && (int64_t)self->open_count >= self->max_open) {
        if (label_commit(self, action, label, label_hash, label_id) < 0) {
            return -1;
        }
        return reject_outcome(self, self->s_open_limit, &self->open_limit_pos,
                              self->s_session_id);
    }

    /* Accepted: everything the native engine stores must be exact. */
    int64_t turn, input, cached = 0;
    int has_cached = cached_o != Py_None;
    double deadline = ts + self->timeout;
    double bucket_q = ts / self->bucket_s;
    if (!(fabs(ts) < TWO52) || !(fabs(deadline) < TWO52) || !(fabs(bucket_q) < TWO52)) {
        return unsupported(self, "timestamp out of the native engine's range");
    }
    if (bounded_int(self, turn_o, SMALL_LIMIT, &turn) < 0 ||
        bounded_int(self, input_o, SMALL_LIMIT, &input) < 0 ||
        (has_cached && bounded_int(self, cached_o, TOKENS_LIMIT, &cached) < 0)) {
        return -1;
    }
    if (label_commit(self, action, label, label_hash, label_id) < 0) {
        return -1;
    }
    if (seen_add(self, &rk, floor_i64(ts)) < 0) {
        return -1;
    }

    int64_t completed = 0;
    if (is_open && ts > self->sess[si].last_ts + self->timeout) {
        /* A resumed session: the idle conversation completes, a new one starts. */
        completed++;
        is_open = 0;
        if (sess_complete(self, si) < 0) {
            return -1;
        }
    }
    int64_t bs = self->block_size;
    int64_t blocks = input >= 0 ? (input + bs - 1) / bs : -((-input) / bs);
    Turn rec = {ts, (int32_t)input, (int32_t)blocks, (int32_t)turn, (int32_t)label_id, 0, 0,
                NULL};
    PyObject *held = NULL, *owner = NULL; /* the conversation's held ids (new), its owner */
    int restarted = 0;
    if (use_index && index_observe(self, si, &is_open, session, ts_o, hashes, turn, &rec, &held,
                                   &owner, &completed, &restarted) < 0) {
        return -1;
    }
    if (!is_open) {
        if (si < 0) {
            si = sess_new(self, &sk);
            if (si < 0) {
                Py_XDECREF(rec.gaps);
                Py_XDECREF(held);
                return -1;
            }
        }
        sess_open(self, si, &rec);
    }
    else {
        Sess *c = &self->sess[si];
        Turn *T = SESS_TURNS(c);
        Py_ssize_t n = c->n;
        Py_ssize_t at;
        int found;
        if (turn > T[n - 1].turn) {
            at = n;
            found = 0;
        }
        else if (turn == T[n - 1].turn) {
            at = n - 1;
            found = 1;
        }
        else {
            Py_ssize_t lo = 0, hi = n - 1; /* first position with T[pos].turn >= turn */
            while (lo < hi) {
                Py_ssize_t mid = lo + (hi - lo) / 2;
                if (T[mid].turn < turn) {
                    lo = mid + 1;
                }
                else {
                    hi = mid;
                }
            }
            at = lo;
            found = T[lo].turn == turn;
        }
        if (found) {
            Turn *p = &T[at];
            if (ts < p->ts || (ts == p->ts && input < p->input)) {
                Py_XDECREF(p->gaps);
                *p = rec;
            }
            else {
                Py_XDECREF(rec.gaps); /* the earlier request stays the turn's */
            }
        }
        else {
            T = sess_turn_room(c);
            if (T == NULL) {
                Py_XDECREF(rec.gaps);
                Py_XDECREF(held);
                return -1;
            }
            if (at < n) {
                memmove(&T[at + 1], &T[at], (size_t)(n - at) * sizeof(Turn));
            }
            T[at] = rec;
            c->n = (int32_t)(n + 1);
        }
    }
    if (held != NULL) { /* conversation.held = held */
        Sess *c = &self->sess[si];
        Py_XSETREF(c->held, held);
        if (c->owner == NULL) {
            c->owner = Py_NewRef(owner);
        }
    }
    if (ts > self->sess[si].last_ts) {
        int64_t dsec = floor_i64(deadline);
        int64_t dslot = sb_slot(&self->deadlines, dsec);
        size_t off;
        int32_t *item = dslot < 0 ? NULL
                                  : (int32_t *)sb_append(&self->deadlines, dslot,
                                                         sizeof(int32_t), &off);
        if (item == NULL) {
            return -1;
        }
        *item = si;
        self->meta[si].pending++;
        self->meta[si].dsec = dsec;
        self->sess[si].last_ts = ts;
    }
    if (ts > self->newest_ts) {
        self->newest_ts = ts;
        if (ts + self->skew > self->future_bound) { /* the clock's part is already in it */
            self->future_bound = ts + self->skew;
        }
        if (complete_due(self, ts - self->lateness, &completed) < 0) {
            return -1;
        }
    }

    /* StatsEngine.apply */
    self->processed++;
    if (arrivals_observe(self, ts, turn, restarted, input, has_cached, cached) < 0) {
        return -1;
    }
    self->completions_since_expiry += completed;
    if (self->completions_since_expiry >= EXPIRE_EVERY_COMPLETIONS) {
        self->completions_since_expiry = 0;
        if (window_expire(self, self->newest_ts - self->lateness) < 0) {
            return -1;
        }
    }
    return 0;
}

static int
apply_event(Core *self, PyObject *ev)
{
    const FieldTable *ft;
    if (Py_IS_TYPE(ev, self->raw_fields.type)) {
        ft = &self->raw_fields;
    }
    else if (Py_IS_TYPE(ev, self->ev_fields.type)) {
        ft = &self->ev_fields;
    }
    else {
        PyErr_Format(PyExc_TypeError, "parse returned %.100s, expected %.100s",
                     Py_TYPE(ev)->tp_name, self->ev_fields.type->tp_name);
        return -1;
    }
    PyObject *session = event_field(ft, ev, F_SESSION);
    PyObject *turn_o = session ? event_field(ft, ev, F_TURN) : NULL;
    PyObject *rid = turn_o ? event_field(ft, ev, F_RID) : NULL;
    if (rid == NULL) {
        return -1;
    }
    if (!(PyUnicode_CheckExact(rid) && PyUnicode_GET_LENGTH(rid) == 0)) {
        return apply_fields(self, ev, ft, NULL);
    }
    /* Event.__post_init__'s default request id, f"{session_id}\x1f{turn}", which the decoder's
       type leaves to us (the decoder refuses an explicit empty request_id). */
    if (!PyUnicode_CheckExact(session) || !PyLong_CheckExact(turn_o)) {
        return apply_fields(self, ev, ft, NULL); /* its checks name the wrong type */
    }
    PyObject *default_rid = PyUnicode_FromFormat("%U\x1f%S", session, turn_o);
    if (default_rid == NULL) {
        return -1;
    }
    int r = apply_fields(self, ev, ft, default_rid);
    Py_DECREF(default_rid);
    return r;
}

/* Whether parse_event returns what its strict decoder gave: no messages to check and no
   cached_tokens above input_tokens (stats/events.py, parse_event; keep the two in step). */
static int
decoded_is_final(Core *self, PyObject *ev)
{
    const Py_ssize_t *off = self->raw_fields.off;
    PyObject *messages = *(PyObject **)((char *)ev + off[F_MESSAGES]);
    if (messages != NULL && messages != Py_None) {
        return 0;
    }
    PyObject *cached = *(PyObject **)((char *)ev + off[F_CACHED]);
    PyObject *input = *(PyObject **)((char *)ev + off[F_INPUT]);
    if (cached == NULL || cached == Py_None) {
        return 1;
    }
    if (input == NULL) {
        return 0;
    }
    int at_most = PyObject_RichCompareBool(cached, input, Py_LE);
    if (at_most < 0) {
        PyErr_Clear(); /* the reference path decides */
        return 0;
    }
    return at_most;
}

/* parse_event(line) without its Python frame: the strict decoder for bytes within the size
   limit, parse_event itself for whatever the decoder refuses or leaves for a second look (it
   then decodes again and decides: same outcome, slower, only for those lines). */
static PyObject *
parse_line(Core *self, PyObject *line)
{
    if (self->decode != Py_None && PyBytes_CheckExact(line) &&
        PyBytes_GET_SIZE(line) <= self->max_event_bytes) {
        PyObject *ev = PyObject_CallOneArg(self->decode, line);
        if (ev == NULL) {
            if (!PyErr_ExceptionMatches(PyExc_Exception)) {
                return NULL; /* parse_event catches Exception only */
            }
            PyErr_Clear();
        }
        else if (Py_IS_TYPE(ev, self->raw_fields.type) && decoded_is_final(self, ev)) {
            return ev;
        }
        else {
            Py_DECREF(ev);
        }
    }
    return PyObject_CallOneArg(self->parse, line);
}

static int
offer_one(Core *self, PyObject *line)
{
    self->offered++;
    PyObject *ev = parse_line(self, line);
    if (ev == NULL) {
        PyObject *type, *val, *tb;
        PyErr_Fetch(&type, &val, &tb);
        PyErr_NormalizeException(&type, &val, &tb);
        if (val == NULL || !PyErr_GivenExceptionMatches(val, self->rejected)) {
            PyErr_Restore(type, val, tb);
            return -1;
        }
        if (tb != NULL) {
            PyException_SetTraceback(val, tb);
        }
        Py_XDECREF(type);
        Py_XDECREF(tb);
        Py_INCREF(val);
        Py_XSETREF(self->last_rejection, val); /* ingest returns the last one; counted too */
        PyObject *reason = PyObject_GetAttr(val, self->s_reason);
        PyObject *field = reason != NULL ? PyObject_GetAttr(val, self->s_field) : NULL;
        Py_DECREF(val);
        if (field == NULL) {
            Py_XDECREF(reason);
            return -1;
        }
        int r = count_reason(self, reason, NULL);
        if (r == 0) {
            r = note_rejection(self, reason, field);
        }
        Py_DECREF(reason);
        Py_DECREF(field);
        return r;
    }
    int r = apply_event(self, ev);
    Py_DECREF(ev);
    return r;
}

/* ------------------------------------------------------------------------------------------ */
/* Python methods                                                                              */

static int
core_ready(Core *self)
{
    if (self->parse == NULL || self->decode == NULL || self->decode_type == NULL ||
        self->rejected == NULL ||
        self->event_type == NULL || self->delay_type == NULL || self->unknown_label == NULL || self->reason_index == NULL ||
        self->label_map == NULL || self->rejections == NULL ||
        (self->use_index && (self->shared_index == NULL || self->no_held == NULL))) {
        PyErr_SetString(PyExc_RuntimeError, "ReplayCore has been cleared");
        return -1;
    }
    return 0;
}

static PyObject *offer_lines(Core *self, PyObject *lines);

/* offer_lines(lines): the index's callback, this core's bound _last_seen, lives for the call
   only (kept on the core it would make a cycle that only the collector frees). */
static PyObject *
core_offer_lines(Core *self, PyObject *lines)
{
    if (core_ready(self) < 0) {
        return NULL;
    }
    if (self->use_index) {
        Py_XSETREF(self->last_seen, PyObject_GetAttr((PyObject *)self, self->s_last_seen));
        if (self->last_seen == NULL) {
            return NULL;
        }
    }
    PyObject *count = offer_lines(self, lines);
    Py_CLEAR(self->last_seen);
    return count;
}

static PyObject *
offer_lines(Core *self, PyObject *lines)
{
    Py_ssize_t count = 0;
    if (PyList_CheckExact(lines)) {
        /* A list without an iterator object (its size is read again each time round, and each
           line held while it is offered, in case the list changes meanwhile). */
        for (Py_ssize_t i = 0; i < PyList_GET_SIZE(lines); i++) {
            PyObject *line = Py_NewRef(PyList_GET_ITEM(lines, i));
            count++;
            int r = offer_one(self, line);
            Py_DECREF(line);
            if (r < 0) {
                return NULL;
            }
        }
        return PyLong_FromSsize_t(count);
    }
    PyObject *it = PyObject_GetIter(lines);
    if (it == NULL) {
        return NULL;
    }
    PyObject *line;
    while ((line = PyIter_Next(it)) != NULL) {
        count++;
        int r = offer_one(self, line);
        Py_DECREF(line);
        if (r < 0) {
            Py_DECREF(it);
            return NULL;
        }
    }
    Py_DECREF(it);
    if (PyErr_Occurred()) {
        return NULL;
    }
    return PyLong_FromSsize_t(count);
}

/* StatsEngine.finish: tracker.flush() then window.add of each, in order. */
static PyObject *
core_finish(Core *self, PyObject *Py_UNUSED(ignored))
{
    if (core_ready(self) < 0) {
        return NULL;
    }
    int64_t completed = 0;
    if (complete_due(self, INFINITY, &completed) < 0) {
        return NULL;
    }
    /* Every open conversation has a deadline entry, so none should be left; be sure. */
    while (self->open_head >= 0) {
        int32_t si = self->open_head;
        int r = sess_complete(self, si);
        if (self->meta[si].pending == 0) {
            sess_release(self, si);
        }
        if (r < 0) {
            return NULL;
        }
    }
    if (self->shared_index != NULL) {
        PyObject *done = sp_clear_private((Sp *)self->shared_index, NULL);
        if (done == NULL) {
            return NULL;
        }
        Py_DECREF(done);
    }
    ht_clear(&self->seen);
    while (self->idexp.nheap > 0) {
        int64_t slot;
        sb_pop(&self->idexp, &slot);
        sb_release(&self->idexp, slot);
    }
    Py_RETURN_NONE;
}

static PyObject *
label_obj(Core *self, int32_t id)
{
    PyObject *o = id == 0 ? self->unknown_label : self->label_objs[id];
    Py_INCREF(o);
    return o;
}

static PyObject *
export_bucket(Core *self, const Bucket *b)
{
    PyObject *states = PyList_New(b->ns), *gaps = NULL;
    PyObject *moms = states ? PyList_New(b->nm) : NULL;
    PyObject *delays = moms ? PyList_New(b->nd) : NULL;
    if (delays == NULL) {
        goto fail;
    }
    for (Py_ssize_t i = 0; i < b->ns; i++) {
        const StateE *s = &b->states[i];
        PyObject *t = Py_BuildValue("(NLLL)", label_obj(self, s->intent), (long long)s->turn,
                                    (long long)s->reached, (long long)s->continued);
        if (t == NULL) {
            goto fail;
        }
        PyList_SET_ITEM(states, i, t);
    }
    for (Py_ssize_t i = 0; i < b->nm; i++) {
        const MomE *m = &b->moms[i];
        PyObject *t = Py_BuildValue("(NLLLLLLLLL)", label_obj(self, m->intent),
                                    (long long)m->conversations, (long long)m->sum_R,
                                    (long long)m->sum_H, (long long)m->sum_H_hash,
                                    (long long)m->sum_B, (long long)m->sum_M,
                                    (long long)m->sum_S, (long long)m->sum_S_B,
                                    (long long)m->shared_born);
        if (t == NULL) {
            goto fail;
        }
        PyList_SET_ITEM(moms, i, t);
    }
    PyTypeObject *dt = (PyTypeObject *)self->delay_type;
    for (Py_ssize_t i = 0; i < b->nd; i++) {
        const DelayE *d = &b->delays[i];
        PyObject *t = dt->tp_alloc(dt, 6);
        if (t == NULL) {
            goto fail;
        }
        PyList_SET_ITEM(delays, i, t);
        PyObject *a = PyFloat_FromDouble(d->delay);
        PyObject *bl = PyLong_FromLongLong(d->blocks);
        PyObject *tu = PyLong_FromLongLong(d->turn);
        PyObject *ps = PyLong_FromLongLong(d->prev_shared);
        if (a == NULL || bl == NULL || tu == NULL || ps == NULL) {
            Py_XDECREF(a);
            Py_XDECREF(bl);
            Py_XDECREF(tu);
            Py_XDECREF(ps);
            goto fail;
        }
        PyTuple_SET_ITEM(t, 0, a);
        PyTuple_SET_ITEM(t, 1, bl);
        PyTuple_SET_ITEM(t, 2, label_obj(self, d->intent));
        PyTuple_SET_ITEM(t, 3, tu);
        PyTuple_SET_ITEM(t, 4, ps);
        PyTuple_SET_ITEM(t, 5, label_obj(self, d->state_intent));
        /* A tuple of atoms can be in no cycle: untracked now, as the collector would untrack
           it at its first look, so that the window's samples do not make a young collection
           walk them all. */
        PyObject_GC_UnTrack(t);
    }
    gaps = PyList_New(2 * b->ng); /* flat, as Bucket.shared_gaps */
    for (Py_ssize_t i = 0; gaps != NULL && i < b->ng; i++) {
        PyObject *gap = PyFloat_FromDouble(b->gaps[i].gap);
        PyObject *blocks = gap != NULL ? PyLong_FromLongLong(b->gaps[i].blocks) : NULL;
        if (blocks == NULL) {
            Py_XDECREF(gap);
            Py_CLEAR(gaps);
            break;
        }
        PyList_SET_ITEM(gaps, 2 * i, gap);
        PyList_SET_ITEM(gaps, 2 * i + 1, blocks);
    }
    if (gaps == NULL) {
        goto fail;
    }
    return Py_BuildValue("(LLNNNN)", (long long)b->index, (long long)b->conversations, states,
                         moms, delays, gaps);
fail:
    Py_XDECREF(states);
    Py_XDECREF(moms);
    Py_XDECREF(delays);
    return NULL;
}

static PyObject *
rejected_dict(Core *self)
{
    PyObject *d = PyDict_New();
    if (d == NULL) {
        return NULL;
    }
    for (Py_ssize_t i = 0; i < self->nreasons; i++) {
        PyObject *c = PyLong_FromLongLong(self->reason_counts[i]);
        if (c == NULL || PyDict_SetItem(d, self->reason_objs[i], c) < 0) {
            Py_XDECREF(c);
            Py_DECREF(d);
            return NULL;
        }
        Py_DECREF(c);
    }
    return d;
}

static PyObject *
core_export(Core *self, PyObject *Py_UNUSED(ignored))
{
    if (core_ready(self) < 0) {
        return NULL;
    }
    PyObject *out = NULL, *buckets = NULL, *secs = NULL, *labels = NULL, *v = NULL;
    buckets = PyList_New(self->nbk_order);
    if (buckets == NULL) {
        goto fail;
    }
    for (Py_ssize_t i = 0; i < self->nbk_order; i++) {
        PyObject *b = export_bucket(self, &self->bk[self->bk_order[i]]);
        if (b == NULL) {
            goto fail;
        }
        PyList_SET_ITEM(buckets, i, b);
    }
    secs = PyList_New(self->nsecs);
    if (secs == NULL) {
        goto fail;
    }
    for (Py_ssize_t i = 0; i < self->nsecs; i++) {
        const SecE *e = &self->secs[i];
        PyObject *t = Py_BuildValue("(LLLL)", (long long)e->second, (long long)e->starts,
                                    (long long)e->cached, (long long)e->input);
        if (t == NULL) {
            goto fail;
        }
        PyList_SET_ITEM(secs, i, t);
    }
    labels = PyList_New(self->nlabel_objs > 0 ? self->nlabel_objs - 1 : 0);
    if (labels == NULL) {
        goto fail;
    }
    for (Py_ssize_t i = 1; i < self->nlabel_objs; i++) {
        Py_INCREF(self->label_objs[i]);
        PyList_SET_ITEM(labels, i - 1, self->label_objs[i]);
    }
    out = PyDict_New();
    if (out == NULL) {
        goto fail;
    }
#define PUT(name, expr)                                   \
    do {                                                  \
        v = (expr);                                       \
        if (v == NULL || PyDict_SetItemString(out, name, v) < 0) { \
            goto fail;                                    \
        }                                                 \
        Py_CLEAR(v);                                      \
    } while (0)
    PUT("buckets", Py_NewRef(buckets));
    PUT("arrivals", Py_BuildValue("(OddL)", secs, self->first_start, self->newest_start,
                                  (long long)self->start_count));
    PUT("processed", PyLong_FromLongLong(self->processed));
    PUT("duplicates", PyLong_FromLongLong(self->duplicates));
    PUT("rejected", rejected_dict(self));
    PUT("newest_ts", PyFloat_FromDouble(self->newest_ts));
    PUT("open_conversations", PyLong_FromSsize_t(self->open_count));
    PUT("labels", Py_NewRef(labels));
    PUT("folded", PyLong_FromLongLong(self->folded));
#undef PUT
    Py_DECREF(buckets);
    Py_DECREF(secs);
    Py_DECREF(labels);
    return out;
fail:
    Py_XDECREF(v);
    Py_XDECREF(out);
    Py_XDECREF(buckets);
    Py_XDECREF(secs);
    Py_XDECREF(labels);
    return NULL;
}

static PyObject *
get_rejected_total(Core *self, void *Py_UNUSED(c))
{
    int64_t total = 0;
    for (Py_ssize_t i = 0; i < self->nreasons; i++) {
        total += self->reason_counts[i];
    }
    return PyLong_FromLongLong(total);
}

/* ------------------------------------------------------------------------------------------ */
/* Construction, GC, deallocation                                                              */

static int
cfg_int(Core *self, PyObject *o, const char *name, int64_t *out)
{
    if (!(PyLong_CheckExact(o) || PyBool_Check(o))) {
        PyErr_Format(self->unsupported, "%s: the native engine needs an int", name);
        return -1;
    }
    int overflow;
    long long x = PyLong_AsLongLongAndOverflow(o, &overflow);
    if (x == -1 && PyErr_Occurred()) {
        return -1;
    }
    if (overflow) {
        x = overflow > 0 ? LLONG_MAX : LLONG_MIN;
    }
    *out = (int64_t)x;
    return 0;
}

static int
cfg_float(Core *self, PyObject *o, const char *name, double *out)
{
    if (!(PyFloat_CheckExact(o) || PyLong_CheckExact(o) || PyBool_Check(o))) {
        PyErr_Format(self->unsupported, "%s: the native engine needs a float or an int", name);
        return -1;
    }
    double x = PyFloat_AsDouble(o); /* int: PyLong_AsDouble, as float arithmetic converts it */
    if (x == -1.0 && PyErr_Occurred()) {
        if (PyErr_ExceptionMatches(PyExc_OverflowError)) {
            PyErr_Clear();
            PyErr_Format(self->unsupported, "%s: out of the native engine's range", name);
        }
        return -1;
    }
    *out = x;
    return 0;
}

static int
take_field(FieldTable *ft, int f)
{
    PyObject *d = PyObject_GetAttrString((PyObject *)ft->type, FIELD_NAMES[f]);
    if (d == NULL) {
        if (PyErr_ExceptionMatches(PyExc_AttributeError)) {
            PyErr_Clear();
            PyErr_Format(PyExc_TypeError, "%.100s has no field %s", ft->type->tp_name,
                         FIELD_NAMES[f]);
        }
        return -1;
    }
    int ok = Py_IS_TYPE(d, &PyMemberDescr_Type);
    if (ok) {
        PyMemberDescrObject *md = (PyMemberDescrObject *)d;
        PyMemberDef *m = md->d_member;
        ok = (m->type == T_OBJECT_EX || m->type == T_OBJECT) &&
             PyType_IsSubtype(ft->type, md->d_common.d_type) && m->offset > 0;
        if (ok) {
            ft->off[f] = m->offset;
            ft->obj_ex[f] = m->type == T_OBJECT_EX;
        }
    }
    Py_DECREF(d);
    if (!ok) {
        PyErr_Format(PyExc_TypeError, "%.100s.%s is not an object member descriptor",
                     ft->type->tp_name, FIELD_NAMES[f]);
        return -1;
    }
    return 0;
}

static char *core_kwlist[] = {
    "block_size", "completion_timeout_s", "allowed_lateness_s", "max_turn",
    "window_conversations", "window_max_age_s", "bucket_s", "rate_window_s",
    "max_open_conversations", "label_map", "unknown_label", "parse", "rejected", "event_type",
    "delay_type", "decode", "decode_type", "max_event_bytes", "max_future_skew_s", "clock_s",
    "own_intent", "shared_index", NULL,
};

static PyObject *
core_new(PyTypeObject *type, PyObject *args, PyObject *kwds)
{
    PyObject *a[22] = {NULL};
    if (!PyArg_ParseTupleAndKeywords(args, kwds, "|$OOOOOOOOOOOOOOOOOOOOOO:ReplayCore",
                                     core_kwlist, &a[0], &a[1], &a[2], &a[3], &a[4], &a[5],
                                     &a[6], &a[7], &a[8], &a[9], &a[10], &a[11], &a[12], &a[13],
                                     &a[14], &a[15], &a[16], &a[17], &a[18], &a[19], &a[20],
                                     &a[21])) {
        return NULL;
    }
    for (int i = 0; i < 22; i++) {
        if (a[i] == NULL) {
            PyErr_Format(PyExc_TypeError, "ReplayCore() missing required keyword argument '%s'",
                         core_kwlist[i]);
            return NULL;
        }
    }
    PyObject *mod = PyType_GetModule(type);
    if (mod == NULL) {
        return NULL;
    }
    ModState *ms = PyModule_GetState(mod);
    if (ms == NULL) {
        return NULL;
    }
    Core *self = (Core *)type->tp_alloc(type, 0);
    if (self == NULL) {
        return NULL;
    }
    /* Sentinels first: tp_dealloc must be able to run from here on. */
    self->unsupported = Py_NewRef(ms->unsupported);
    self->sess_free = self->open_head = self->open_tail = -1;
    self->deadlines.cache_slot = self->idexp.cache_slot = -1;
    self->bk_cache_slot = -1;
    self->too_late_pos = self->future_pos = self->open_limit_pos = -1;
    self->newest_ts = -INFINITY;
    self->first_start = INFINITY;
    self->newest_start = -INFINITY;

    double bucket_s;
    if (cfg_int(self, a[0], "block_size", &self->block_size) < 0 ||
        cfg_float(self, a[1], "completion_timeout_s", &self->timeout) < 0 ||
        cfg_float(self, a[2], "allowed_lateness_s", &self->lateness) < 0 ||
        cfg_int(self, a[3], "max_turn", &self->max_turn) < 0 ||
        cfg_int(self, a[4], "window_conversations", &self->window_conversations) < 0 ||
        cfg_float(self, a[5], "window_max_age_s", &self->max_age) < 0 ||
        cfg_float(self, a[6], "bucket_s", &bucket_s) < 0 ||
        cfg_int(self, a[7], "rate_window_s", &self->rate_window) < 0 ||
        cfg_int(self, a[8], "max_open_conversations", &self->max_open) < 0 ||
        cfg_float(self, a[18], "max_future_skew_s", &self->skew) < 0 ||
        cfg_float(self, a[19], "clock_s", &self->future_bound) < 0) {
        goto fail;
    }
    if (!(self->skew > 0.0) || isnan(self->future_bound)) {
        unsupported(self, "max_future_skew_s must be > 0 and clock_s a number");
        goto fail;
    }
    self->future_bound += self->skew; /* clock_s + skew: nothing seen yet */
    if (!PyDict_CheckExact(a[9])) {
        PyErr_SetString(PyExc_TypeError, "label_map must be a dict");
        goto fail;
    }
    self->bucket_s = bucket_s;
    if (self->block_size < 1) {
        unsupported(self, "block_size must be >= 1");
        goto fail;
    }
    if (self->block_size > SMALL_LIMIT) { /* same ceil(input / block_size), |input| < 2**30 */
        self->block_size = SMALL_LIMIT;
    }
    if (!isfinite(self->timeout) || !isfinite(self->lateness)) {
        unsupported(self, "completion_timeout_s and allowed_lateness_s must be finite");
        goto fail;
    }
    if (self->max_turn <= -SMALL_LIMIT) {
        unsupported(self, "max_turn out of the native engine's range");
        goto fail;
    }
    if (self->max_turn > SMALL_LIMIT) { /* never reached by a turn below 2**30 */
        self->max_turn = SMALL_LIMIT;
    }
    if (!(bucket_s > 0.0) || !isfinite(bucket_s) ||
        (!PyFloat_CheckExact(a[6]) && bucket_s > 1125899906842624.0 /* 2**50 */)) {
        unsupported(self, "bucket_s out of the native engine's range");
        goto fail;
    }
    if (self->rate_window < 1 || self->rate_window > TOKENS_LIMIT) {
        unsupported(self, "rate_window_s out of the native engine's range");
        goto fail;
    }
    if (!PyUnicode_Check(a[10])) {
        PyErr_SetString(PyExc_TypeError, "unknown_label must be a str");
        goto fail;
    }
    if (!PyUnicode_CheckExact(a[10])) {
        unsupported(self, "unknown_label is a str subclass");
        goto fail;
    }
    if (PyUnicode_READY(a[10]) < 0) {
        goto fail;
    }
    if (!PyCallable_Check(a[11])) {
        PyErr_SetString(PyExc_TypeError, "parse must be callable");
        goto fail;
    }
    if (!PyType_Check(a[12]) || !PyType_IsSubtype((PyTypeObject *)a[12],
                                                  (PyTypeObject *)PyExc_BaseException)) {
        PyErr_SetString(PyExc_TypeError, "rejected must be an exception class");
        goto fail;
    }
    if (!PyType_Check(a[13])) {
        PyErr_SetString(PyExc_TypeError, "event_type must be a type");
        goto fail;
    }
    if (!PyType_Check(a[14]) || !PyType_IsSubtype((PyTypeObject *)a[14], &PyTuple_Type) ||
        ((PyTypeObject *)a[14])->tp_alloc == NULL) {
        PyErr_SetString(PyExc_TypeError, "delay_type must be a subclass of tuple");
        goto fail;
    }
    if (a[15] != Py_None && !PyCallable_Check(a[15])) {
        PyErr_SetString(PyExc_TypeError, "decode must be callable or None");
        goto fail;
    }
    if (!PyType_Check(a[16])) {
        PyErr_SetString(PyExc_TypeError, "decode_type must be a type");
        goto fail;
    }
    self->max_event_bytes = PyLong_AsSsize_t(a[17]);
    if (self->max_event_bytes == -1 && PyErr_Occurred()) {
        goto fail;
    }
    self->decode = Py_NewRef(a[15]);
    self->decode_type = Py_NewRef(a[16]);
    self->unknown_label = Py_NewRef(a[10]);
    self->label_map = PyDict_Copy(a[9]); /* a private copy: it cannot change under the engine */
    if (self->label_map == NULL) {
        goto fail;
    }
    self->parse = Py_NewRef(a[11]);
    self->rejected = Py_NewRef(a[12]);
    self->event_type = Py_NewRef(a[13]);
    self->delay_type = Py_NewRef(a[14]);
    self->ev_fields.type = (PyTypeObject *)self->event_type;
    self->raw_fields.type = (PyTypeObject *)self->decode_type;
    for (int f = 0; f < N_FIELDS; f++) {
        if (take_field(&self->ev_fields, f) < 0 || take_field(&self->raw_fields, f) < 0) {
            goto fail;
        }
    }
    self->s_reason = PyUnicode_InternFromString("reason");
    self->s_too_late = PyUnicode_InternFromString("too_late");
    self->s_future = PyUnicode_InternFromString("future");
    self->s_field = PyUnicode_InternFromString("field");
    self->s_timestamp = PyUnicode_InternFromString("timestamp");
    self->s_session_id = PyUnicode_InternFromString("session_id");
    self->rejections = PyList_New(0);
    self->s_open_limit = PyUnicode_InternFromString("open_limit");
    self->reason_index = PyDict_New();
    if (self->s_reason == NULL || self->s_too_late == NULL || self->s_future == NULL ||
        self->s_open_limit == NULL || self->s_field == NULL || self->s_timestamp == NULL ||
        self->s_session_id == NULL || self->rejections == NULL ||
        self->reason_index == NULL) {
        goto fail;
    }
    {
        /* The hash seed: Python's randomised str hash of a constant (PYTHONHASHSEED applies). */
        PyObject *name = PyUnicode_FromString("kvcast.stats.native._replay.ReplayCore");
        Py_hash_t h = name ? PyObject_Hash(name) : -1;
        Py_XDECREF(name);
        if (h == -1) {
            goto fail;
        }
        self->seed = mum((uint64_t)h ^ H_P0, H_P1 ^ (uint64_t)(uintptr_t)self);
    }
    if (GROW(self->label_objs, self->caplabel_objs, 1) < 0) {
        goto fail;
    }
    self->label_objs[0] = self->unknown_label; /* borrowed: id 0 is `unknown` */
    self->nlabel_objs = 1;
    if (!PyCallable_Check(a[20])) {
        PyErr_SetString(PyExc_TypeError, "own_intent must be callable");
        goto fail;
    }
    self->own_intent = Py_NewRef(a[20]);
    PyObject *verdict = PyObject_CallOneArg(self->own_intent, self->unknown_label);
    int own = verdict == NULL ? -1 : PyObject_IsTrue(verdict);
    Py_XDECREF(verdict);
    if (own < 0 || GROW(self->own_flags, self->capown_flags, 1) < 0) {
        goto fail;
    }
    self->own_flags[0] = (uint8_t)own;
    /* The shared-prefix index (None: off), its callback and the empty held ids. */
    if (a[21] != Py_None) {
        if (!PyObject_TypeCheck(a[21], (PyTypeObject *)ms->shared_index_type)) {
            PyErr_SetString(PyExc_TypeError, "shared_index must be a SharedIndexCore or None");
            goto fail;
        }
        self->shared_index = Py_NewRef(a[21]);
        self->no_held = PyTuple_New(0);
        self->s_last_seen = PyUnicode_InternFromString("_last_seen");
        if (self->no_held == NULL || self->s_last_seen == NULL) {
            goto fail;
        }
        self->use_index = sp_capacity((Sp *)self->shared_index) > 0;
    }
    return (PyObject *)self;
fail:
    Py_DECREF(self);
    return NULL;
}

/* The references a GC'd struct holds, listed once by their offsets: refs_visit serves its
   tp_traverse and refs_clear its tp_clear (in the list's order), so the two cannot disagree. */
#define REF_AT(base, off) (*(PyObject **)((char *)(base) + (off)))

static int
refs_visit(void *base, const size_t *offs, size_t n, visitproc visit, void *arg)
{
    for (size_t i = 0; i < n; i++) {
        Py_VISIT(REF_AT(base, offs[i]));
    }
    return 0;
}

static void
refs_clear(void *base, const size_t *offs, size_t n)
{
    for (size_t i = 0; i < n; i++) {
        Py_CLEAR(REF_AT(base, offs[i]));
    }
}

/* Besides these, the Core holds its type and the reasons' str objects (both visited), and
   strings that cannot take part in a cycle (dropped in core_dealloc). */
static const size_t core_refs[] = {
    offsetof(Core, parse),       offsetof(Core, decode),         offsetof(Core, decode_type),
    offsetof(Core, rejected),    offsetof(Core, event_type),     offsetof(Core, delay_type),
    offsetof(Core, unsupported), offsetof(Core, last_rejection), offsetof(Core, reason_index),
    offsetof(Core, label_map),   offsetof(Core, rejections),     offsetof(Core, own_intent),
    offsetof(Core, shared_index), offsetof(Core, last_seen),     offsetof(Core, no_held),
};

static int
core_traverse(Core *self, visitproc visit, void *arg)
{
    Py_VISIT(Py_TYPE(self));
    int r = refs_visit(self, core_refs, Py_ARRAY_LENGTH(core_refs), visit, arg);
    if (r != 0) {
        return r;
    }
    for (Py_ssize_t i = 0; i < self->nreasons; i++) {
        Py_VISIT(self->reason_objs[i]);
    }
    return 0;
}

static int
core_clear(Core *self)
{
    refs_clear(self, core_refs, Py_ARRAY_LENGTH(core_refs));
    Py_ssize_t n = self->nreasons;
    self->nreasons = 0;
    self->too_late_pos = self->future_pos = self->open_limit_pos = -1;
    for (Py_ssize_t i = 0; i < n; i++) {
        Py_CLEAR(self->reason_objs[i]);
    }
    return 0;
}

static void
core_dealloc(Core *self)
{
    PyTypeObject *tp = Py_TYPE(self);
    PyObject_GC_UnTrack(self);
    core_clear(self);
    free(self->reason_objs);
    free(self->reason_counts);
    /* labeller */
    ht_free(&self->labels);
    for (Py_ssize_t i = 1; i < self->nlabel_objs; i++) {
        Py_CLEAR(self->label_objs[i]);
    }
    free(self->label_objs);
    free(self->own_flags);
    /* tracker */
    for (Py_ssize_t i = 0; i < self->nsess; i++) {
        if (self->meta[i].is_open) {
            sess_drop_refs(&self->sess[i]);
        }
        free(self->sess[i].kheap);
        free(self->sess[i].theap);
    }
    free(self->sess);
    free(self->meta);
    ht_free(&self->sess_tab);
    ht_free(&self->seen);
    sb_free(&self->deadlines);
    sb_free(&self->idexp);
    /* window */
    for (Py_ssize_t i = 0; i < self->nbk_order; i++) {
        bucket_free_contents(&self->bk[self->bk_order[i]]);
    }
    free(self->bk);
    free(self->bk_free);
    free(self->bk_order);
    ht_free(&self->bk_map);
    /* arrivals */
    free(self->secs);
    ht_free(&self->sec_map);
    Py_CLEAR(self->s_reason);
    Py_CLEAR(self->s_too_late);
    Py_CLEAR(self->s_future);
    Py_CLEAR(self->s_field);
    Py_CLEAR(self->s_timestamp);
    Py_CLEAR(self->s_session_id);
    Py_CLEAR(self->s_open_limit);
    Py_CLEAR(self->s_last_seen);
    Py_CLEAR(self->unknown_label);
    tp->tp_free((PyObject *)self);
    Py_DECREF(tp);
}

/* _last_seen(session_id): ConversationTracker._last_seen, the newest event time (s) of an
   open conversation (KeyError for none); the shared-prefix index's callback. */
static PyObject *
core_last_seen(Core *self, PyObject *session)
{
    if (PyUnicode_CheckExact(session)) {
        KeyView k;
        key_view(session, &k, self->seed);
        Py_ssize_t pos = sess_find(self, &k);
        if (pos == -2) {
            unsupported(self, "colliding session ids");
            return NULL;
        }
        if (pos >= 0) {
            int32_t si = (int32_t)self->sess_tab.e[pos].val;
            if (self->meta[si].is_open) {
                return PyFloat_FromDouble(self->sess[si].last_ts);
            }
        }
    }
    PyErr_SetObject(PyExc_KeyError, session);
    return NULL;
}

static PyMethodDef core_methods[] = {
    {"_last_seen", (PyCFunction)core_last_seen, METH_O,
     "_last_seen(session_id) -> float: an open conversation's newest event time (s)."},
    {"offer_lines", (PyCFunction)core_offer_lines, METH_O,
     "offer_lines(lines) -> int: kvcast.stats.ingest.ingest of the bytes lines, in order."},
    {"finish", (PyCFunction)core_finish, METH_NOARGS,
     "finish(): StatsEngine.finish (complete every open conversation)."},
    {"export", (PyCFunction)core_export, METH_NOARGS,
     "export() -> dict: the window, arrivals, counters and labeller state."},
    {NULL, NULL, 0, NULL},
};

_Static_assert(sizeof(int64_t) == sizeof(long long), "T_LONGLONG members hold int64_t");

static PyMemberDef core_members[] = {
    {"processed", T_LONGLONG, offsetof(Core, processed), READONLY, "accepted events"},
    {"duplicates", T_LONGLONG, offsetof(Core, duplicates), READONLY, "duplicate events"},
    {"open_conversations", T_PYSSIZET, offsetof(Core, open_count), READONLY,
     "open conversations"},
    {"newest_ts", T_DOUBLE, offsetof(Core, newest_ts), READONLY, "newest accepted event time"},
    {"rejections", T_OBJECT, offsetof(Core, rejections), READONLY,
     "(position, reason, field) of the first rejections"},
    {"last_rejection", T_OBJECT, offsetof(Core, last_rejection), READONLY, /* NULL: None */
     "the last parse rejection"},
    {NULL, 0, 0, 0, NULL},
};

static PyGetSetDef core_getset[] = {
    {"rejected_total", (getter)get_rejected_total, NULL, "rejected events (all reasons)", NULL},
    {NULL, NULL, NULL, NULL, NULL},
};

static PyType_Slot core_slots[] = {
    {Py_tp_new, core_new},
    {Py_tp_dealloc, core_dealloc},
    {Py_tp_traverse, core_traverse},
    {Py_tp_clear, core_clear},
    {Py_tp_methods, core_methods},
    {Py_tp_members, core_members},
    {Py_tp_getset, core_getset},
    {Py_tp_doc, "ReplayCore(**config): the native replay engine (see stats/native/_replay.c)."},
    {0, NULL},
};

static PyType_Spec core_spec = {
    .name = "kvcast.stats.native._replay.ReplayCore",
    .basicsize = sizeof(Core),
    .itemsize = 0,
    .flags = Py_TPFLAGS_DEFAULT | Py_TPFLAGS_HAVE_GC,
    .slots = core_slots,
};

/* ------------------------------------------------------------------------------------------ */
/* Shared-prefix index: kvcast.stats.shared_prefix.PySharedPrefixIndex, literally             */
/*
 * The type SharedIndexCore, subclassed in Python as NativeSharedPrefixIndex (which adds the
 * argument checks and the ``changes`` object).  The Python index keeps two dicts, the private
 * blocks (block -> session id) and the shared table (block -> last reference), and the
 * checkpoint's upserts (a dict) and removals (a set).  Here one table of blocks holds both
 * dicts, since a block is in one at most (a private block becomes shared only by leaving the
 * private ones; one is made private only when it is not shared).  Each entry keeps its key
 * object and Python hash and compares keys as the dicts do (identity, hash, ==; two exact
 * ints by value).  The dicts' orders, which callers read, are kept as sequence numbers:
 * ``shared_table`` lists the shared blocks in the order they entered the shared table, and the
 * upserts, whose value is always the block's shared value, in the order they entered the
 * upserts since the last clear (a generation count); both are built when read.  Removals stay
 * a Python set.  The expiry heap is ordered by (floor(last + timeout), push count) as the
 * Python heap of tuples is; the push count makes every key distinct, so both heaps pop the
 * same entries in the same order.
 *
 * Times are doubles; the Python code computes them with the same IEEE operations (the tracker
 * hands it float event times).  A floor is kept as a double (exact: every floor of a double
 * is one), and "floor + 1 <= watermark", an int comparison in Python, is computed exactly.
 */

typedef struct {
    double second; /* math.floor(last + timeout) */
    uint64_t tie;  /* the push count: no two entries compare equal */
    PyObject *block;
} SpEntry;

enum { SP_FREE = 0, SP_PRIVATE = 1, SP_SHARED = 2, SP_BORN = 3 };

/* One cache line an entry (the table is allocated on a line boundary): the fields that no
   state uses together share their bytes. */
typedef struct {
    PyObject *key;   /* strong */
    Py_hash_t hash;  /* hash(key) */
    int64_t ival;    /* as in SpKey: keys compare without reading the key object */
    union {          /* by state: */
        PyObject *owner; /* private: the session id (strong) */
        PyObject *last;  /* shared: the last reference (strong), as the caller gave it;
                            NULL while born (the owner's reference has passed on) */
    };
    double lastv;
    uint64_t shared_seq; /* order in the shared table */
    union {
        uint64_t upsert_seq;  /* shared: order in the upserts, valid in generation upsert_gen */
        Py_ssize_t next_free; /* free: the next free entry */
    };
    uint32_t upsert_gen;  /* the low 32 bits of Sp.upsert_gen */
    uint8_t state;
    uint8_t is_i64;
} SpBlock;

_Static_assert(sizeof(SpBlock) == 64, "an index entry is one cache line");

typedef struct {
    PyObject *obj;
    Py_hash_t hash;
    int64_t ival; /* the value of an exact int that fits */
    int is_i64;
} SpKey;

typedef struct {
    Py_hash_t hash; /* the entry's, so that a probe reads no entry of another hash */
    Py_ssize_t e;   /* the entry, SP_EMPTY or SP_DELETED */
} SpSlot;

/* A recent shared run: the entries of the leading shared ids of a request that began with
   `v[0]`, with the ids' values.  Most requests begin with one of a few system prompts, whose
   ids would otherwise be hashed and probed again on every request.  A memo is only a hint:
   an entry is taken from it only while it is still shared and holds the same int, which
   makes it that int's entry (an id is in the table once), however the table changed since. */
#define SP_MEMO_RUNS 16
#define SP_MEMO_IDS 64
typedef struct {
    Py_ssize_t n;
    int64_t v[SP_MEMO_IDS];
    Py_ssize_t e[SP_MEMO_IDS];
} SpRunMemo;

struct Sp {
    PyObject_HEAD
    Py_ssize_t capacity;
    int64_t dense;
    double timeout;
    PyObject *removals;   /* changes.removals */
    PyObject *run_type;   /* SharedRun */
    PyObject *no_sharing; /* NO_SHARING */
    /* the table of blocks: entries, a free list through next_free, and an open
       addressing index of entry numbers (-1 empty, -2 deleted) */
    SpBlock *blk;
    Py_ssize_t blk_n, blk_cap, free_head;
    SpSlot *slots;
    Py_ssize_t slot_mask, slot_used, slot_deleted;
    Py_ssize_t n_private, n_shared;
    uint64_t shared_seq, upsert_seq, upsert_gen;
    SpEntry *heap;
    Py_ssize_t heap_n, heap_cap;
    uint64_t pushed;
    int64_t *pos; /* indexed positions found so far, increasing */
    Py_ssize_t pos_n, pos_cap;
    int64_t pos_next; /* the next position to examine */
    /* scratch, per call */
    PyObject **lasto; /* the run's last references (borrowed: entries' or the call's) */
    double *lastv;
    PyObject **mine;  /* borrowed from the call's arguments */
    Py_ssize_t *run_blk; /* the run's entries */
    Py_ssize_t scratch_cap;
    SpRunMemo *memo; /* SP_MEMO_RUNS recent shared runs (NULL until the first) */
};

#define SP_EMPTY (-1)
#define SP_DELETED (-2)

/* An exact int below 2**63 in magnitude, read from its digits (1; 0: anything else, or a
   build whose int layout is not known here).  Block ids are 64-bit hashes, up to three 30-bit
   digits: their value and hash come from one pass over the digits instead of two calls
   (PyObject_Hash, PyLong_AsLongLongAndOverflow) that each walk them. */
static inline int
sp_small_int(PyObject *obj, int64_t *out)
{
#if PY_VERSION_HEX < 0x030C0000 && !defined(Py_LIMITED_API) && PyLong_SHIFT == 30
    if (PyLong_CheckExact(obj)) {
        Py_ssize_t size = Py_SIZE(obj), n = size < 0 ? -size : size;
        const digit *d = ((PyLongObject *)obj)->ob_digit;
        if (n < 3 || (n == 3 && d[2] < 8)) {
            uint64_t mag = 0;
            for (Py_ssize_t i = n - 1; i >= 0; i--) {
                mag = (mag << PyLong_SHIFT) | d[i];
            }
            *out = size < 0 ? -(int64_t)mag : (int64_t)mag;
            return 1;
        }
    }
#else
    (void)obj;
    (void)out;
#endif
    return 0;
}

static int
sp_key(PyObject *obj, SpKey *k)
{
    k->obj = obj;
    int64_t v;
    if (sp_small_int(obj, &v)) {
        /* hash(v) as long_hash computes it: |v| mod 2**61 - 1, signed, -1 -> -2 */
        const uint64_t modulus = ((uint64_t)1 << 61) - 1;
        uint64_t mag = v < 0 ? (uint64_t)0 - (uint64_t)v : (uint64_t)v;
        uint64_t h = (mag & modulus) + (mag >> 61);
        if (h >= modulus) {
            h -= modulus;
        }
        Py_hash_t hash = v < 0 ? -(Py_hash_t)h : (Py_hash_t)h;
        k->hash = hash == -1 ? -2 : hash;
        k->ival = v;
        k->is_i64 = 1;
        return 0;
    }
    k->hash = PyObject_Hash(obj);
    if (k->hash == -1) {
        return -1;
    }
    k->is_i64 = 0;
    if (PyLong_CheckExact(obj)) {
        int overflow;
        long long v = PyLong_AsLongLongAndOverflow(obj, &overflow);
        if (v == -1 && PyErr_Occurred()) {
            return -1;
        }
        if (!overflow) {
            k->ival = v;
            k->is_i64 = 1;
        }
    }
    return 0;
}

/* a == b for block ids.  Two exact ints compare by their digits where the int layout is
   known (CPython before 3.12: normalised, so equal values have equal sizes and digits),
   without a rich comparison's dispatch; anything else compares with ==. */
static inline int
sp_eq(PyObject *a, PyObject *b)
{
    if (a == b) {
        return 1;
    }
#if PY_VERSION_HEX < 0x030C0000 && !defined(Py_LIMITED_API)
    if (PyLong_CheckExact(a) && PyLong_CheckExact(b)) {
        Py_ssize_t size = Py_SIZE(a);
        if (size != Py_SIZE(b)) {
            return 0;
        }
        Py_ssize_t digits = size < 0 ? -size : size;
        const digit *x = ((PyLongObject *)a)->ob_digit, *y = ((PyLongObject *)b)->ob_digit;
        for (Py_ssize_t i = 0; i < digits; i++) {
            if (x[i] != y[i]) {
                return 0;
            }
        }
        return 1;
    }
#endif
    return PyObject_RichCompareBool(a, b, Py_EQ);
}

/* The memo slot of runs that begin with the int `first`. */
static inline SpRunMemo *
sp_memo_of(Sp *self, int64_t first)
{
    uint64_t h = (uint64_t)first * 0x9E3779B97F4A7C15ull;
    return &self->memo[h >> 60];
}

/* The dict's key equality: the same object, or equal hashes and ==. */
static inline int
sp_key_eq(const SpBlock *e, const SpKey *k)
{
    if (e->key == k->obj) {
        return 1;
    }
    if (e->hash != k->hash) {
        return 0;
    }
    if (e->is_i64 && k->is_i64) { /* two exact ints: equal iff their values are */
        return e->ival == k->ival;
    }
    return sp_eq(e->key, k->obj);
}

/* The entry of `k` (-1: none; -2: an error is set); *slot_out: its index slot. */
static Py_ssize_t
sp_find(Sp *self, const SpKey *k, Py_ssize_t *slot_out)
{
    if (self->slots == NULL) {
        return -1;
    }
    size_t mask = (size_t)self->slot_mask, i = (size_t)k->hash & mask, perturb = (size_t)k->hash;
    for (;;) {
        Py_ssize_t e = self->slots[i].e;
        if (e == SP_EMPTY) {
            return -1;
        }
        if (e >= 0 && self->slots[i].hash == k->hash) {
            int eq = sp_key_eq(&self->blk[e], k);
            if (eq < 0) {
                return -2;
            }
            if (eq) {
                if (slot_out != NULL) {
                    *slot_out = (Py_ssize_t)i;
                }
                return e;
            }
        }
        perturb >>= 5;
        i = (i * 5 + perturb + 1) & mask;
    }
}

static int
sp_rehash(Sp *self, Py_ssize_t need)
{
    Py_ssize_t size = 8;
    while (size * 2 < need * 3) {
        size *= 2;
    }
    SpSlot *slots = malloc((size_t)size * sizeof(SpSlot));
    if (slots == NULL) {
        PyErr_NoMemory();
        return -1;
    }
    for (Py_ssize_t i = 0; i < size; i++) {
        slots[i].e = SP_EMPTY;
    }
    size_t mask = (size_t)size - 1;
    /* From the old index's slots, which hold each live entry's number and hash: a sequential
       read of 16 bytes a slot, not a read of every entry (88 bytes each, most not cached). */
    for (Py_ssize_t j = 0; self->slots != NULL && j <= self->slot_mask; j++) {
        Py_ssize_t e = self->slots[j].e;
        if (e < 0) {
            continue;
        }
        size_t h = (size_t)self->slots[j].hash, i = h & mask, perturb = h;
        while (slots[i].e != SP_EMPTY) {
            perturb >>= 5;
            i = (i * 5 + perturb + 1) & mask;
        }
        slots[i] = (SpSlot){(Py_hash_t)h, e};
    }
    free(self->slots);
    self->slots = slots;
    self->slot_mask = size - 1;
    self->slot_deleted = 0;
    return 0;
}

/* Twice the entries (16 at first), on a cache-line boundary, so that each is one line:
   realloc's blocks sit 16 bytes past one, and most entries would straddle two. */
static int
sp_grow_blocks(Sp *self)
{
    Py_ssize_t cap = self->blk_cap ? 2 * self->blk_cap : 16;
    if (cap > PY_SSIZE_T_MAX / (Py_ssize_t)sizeof(SpBlock)) {
        PyErr_NoMemory();
        return -1;
    }
    SpBlock *blk = aligned_alloc(64, (size_t)cap * sizeof(SpBlock));
    if (blk == NULL) {
        PyErr_NoMemory();
        return -1;
    }
    if (self->blk_n) {
        memcpy(blk, self->blk, (size_t)self->blk_n * sizeof(SpBlock));
    }
    free(self->blk);
    self->blk = blk;
    self->blk_cap = cap;
    return 0;
}

/* A new entry for `k` (not in the table) in `state`; returns its number (-1: error). */
static Py_ssize_t
sp_insert(Sp *self, const SpKey *k, int state)
{
    Py_ssize_t live = self->n_private + self->n_shared;
    if (self->slots == NULL || (self->slot_used + self->slot_deleted + 1) * 3 > (self->slot_mask + 1) * 2) {
        if (sp_rehash(self, 2 * (live + 1)) < 0) {
            return -1;
        }
    }
    Py_ssize_t e;
    if (self->free_head >= 0) {
        e = self->free_head;
        self->free_head = self->blk[e].next_free;
    } else {
        if (self->blk_n == self->blk_cap && sp_grow_blocks(self) < 0) {
            return -1;
        }
        e = self->blk_n++;
    }
    SpBlock *b = &self->blk[e];
    memset(b, 0, sizeof(*b));
    b->key = Py_NewRef(k->obj);
    b->hash = k->hash;
    b->ival = k->ival;
    b->is_i64 = (uint8_t)k->is_i64;
    b->state = (uint8_t)state;
    size_t mask = (size_t)self->slot_mask, i = (size_t)k->hash & mask, perturb = (size_t)k->hash;
    while (self->slots[i].e >= 0) {
        perturb >>= 5;
        i = (i * 5 + perturb + 1) & mask;
    }
    if (self->slots[i].e == SP_DELETED) {
        self->slot_deleted--;
    }
    self->slots[i] = (SpSlot){k->hash, e};
    self->slot_used++;
    return e;
}

/* Take entry e (at index slot `slot`) out of the table. */
static void
sp_remove(Sp *self, Py_ssize_t e, Py_ssize_t slot)
{
    SpBlock *b = &self->blk[e];
    if (b->state == SP_PRIVATE) {
        self->n_private--;
    } else {
        self->n_shared--;
    }
    PyObject *key = b->key, *ref = b->owner; /* the owner or the last reference */
    b->key = b->owner = NULL;
    b->state = SP_FREE;
    b->next_free = self->free_head;
    self->free_head = e;
    self->slots[slot].e = SP_DELETED;
    self->slot_used--;
    self->slot_deleted++;
    Py_XDECREF(key);
    Py_XDECREF(ref);
}

/* Set entry e's shared value (a reference the entry takes) and, where it was not, make it an
   upsert of this generation. */
static inline void
sp_set_shared(Sp *self, SpBlock *b, PyObject *value, double v)
{
    PyObject *old = b->last;
    b->last = Py_NewRef(value);
    b->lastv = v;
    Py_XDECREF(old);
    if (b->upsert_gen != (uint32_t)self->upsert_gen || b->upsert_seq == 0) {
        b->upsert_gen = (uint32_t)self->upsert_gen;
        b->upsert_seq = ++self->upsert_seq;
    }
}

static inline int
sp_entry_lt(const SpEntry *a, const SpEntry *b)
{
    return a->second < b->second || (a->second == b->second && a->tie < b->tie);
}

/* floor + 1 <= w, exactly (Python computes it on ints).  Below 2**53 in magnitude floor + 1 is
   a double; beyond, doubles are integers at least 2 apart, so floor + 1 <= w iff w > floor. */
static inline int
sp_due(double second, double w)
{
    if (second < 9007199254740992.0 && second >= -9007199254740992.0) {
        return second + 1.0 <= w;
    }
    return w > second;
}

static Py_ssize_t
sp_capacity(const Sp *self)
{
    return self->capacity;
}

/* Whether expire(watermark) drops something: shared_index.next_due <= watermark. */
static int
sp_has_due(const Sp *self, double watermark)
{
    return self->heap_n > 0 && sp_due(self->heap[0].second, watermark);
}

/* math.floor(x), kept as a double; raises as math.floor does where x is not finite. */
static int
sp_floor(double x, double *out)
{
    if (isinf(x)) {
        PyErr_SetString(PyExc_OverflowError, "cannot convert float infinity to integer");
        return -1;
    }
    if (isnan(x)) {
        PyErr_SetString(PyExc_ValueError, "cannot convert float NaN to integer");
        return -1;
    }
    *out = floor(x);
    return 0;
}

/* _schedule: push (floor(last + timeout), pushed, block). */
static int
sp_schedule(Sp *self, PyObject *block, double last)
{
    double second;
    if (sp_floor(last + self->timeout, &second) < 0) {
        return -1;
    }
    if (self->heap_n == self->heap_cap && GROW(self->heap, self->heap_cap, self->heap_n + 1) < 0) {
        return -1;
    }
    SpEntry e = {second, ++self->pushed, Py_NewRef(block)};
    Py_ssize_t i = self->heap_n++;
    while (i > 0) {
        Py_ssize_t parent = (i - 1) / 2;
        if (!sp_entry_lt(&e, &self->heap[parent])) {
            break;
        }
        self->heap[i] = self->heap[parent];
        i = parent;
    }
    self->heap[i] = e;
    return 0;
}

/* Pop the smallest entry; its block reference passes to the caller. */
static PyObject *
sp_pop(Sp *self)
{
    SpEntry *h = self->heap;
    PyObject *block = h[0].block;
    SpEntry e = h[--self->heap_n];
    Py_ssize_t n = self->heap_n, i = 0;
    for (;;) {
        Py_ssize_t c = 2 * i + 1;
        if (c >= n) {
            break;
        }
        if (c + 1 < n && sp_entry_lt(&h[c + 1], &h[c])) {
            c++;
        }
        if (!sp_entry_lt(&h[c], &e)) {
            break;
        }
        h[i] = h[c];
        i = c;
    }
    if (n > 0) {
        h[i] = e;
    }
    return block;
}

static inline int
bit_length_u64(uint64_t x)
{
    return x ? 64 - __builtin_clzll(x) : 0;
}

/* How many indexed positions a request of `blocks` blocks has (positions(): every block
   below 2 D, then one every 2**k blocks from 2**k D on); extends self->pos to cover them. */
static Py_ssize_t
sp_positions(Sp *self, int64_t blocks)
{
    int64_t dense2 = 2 * self->dense;
    int64_t p = self->pos_next;
    while (p < blocks) {
        int64_t step = p < dense2 ? 1 : (int64_t)1 << (bit_length_u64((uint64_t)(p / self->dense)) - 1);
        if (p % step == 0) {
            if (self->pos_n == self->pos_cap && GROW(self->pos, self->pos_cap, self->pos_n + 1) < 0) {
                return -1;
            }
            self->pos[self->pos_n++] = p;
        }
        p += p < dense2 ? 1 : step - p % step;
    }
    self->pos_next = p > self->pos_next ? p : self->pos_next;
    /* bisect_left(pos, blocks) */
    Py_ssize_t lo = 0, hi = self->pos_n;
    while (lo < hi) {
        Py_ssize_t mid = (lo + hi) / 2;
        if (self->pos[mid] < blocks) {
            lo = mid + 1;
        } else {
            hi = mid;
        }
    }
    return lo;
}

static int
sp_scratch(Sp *self, Py_ssize_t need)
{
    if (need <= self->scratch_cap) {
        return 0;
    }
    Py_ssize_t cap = need > 2 * self->scratch_cap ? need : 2 * self->scratch_cap;
    PyObject **lo = PyMem_Realloc(self->lasto, (size_t)cap * sizeof(PyObject *));
    if (lo != NULL) {
        self->lasto = lo;
    }
    double *lv = lo != NULL ? PyMem_Realloc(self->lastv, (size_t)cap * sizeof(double)) : NULL;
    if (lv != NULL) {
        self->lastv = lv;
    }
    PyObject **mi = lv != NULL ? PyMem_Realloc(self->mine, (size_t)cap * sizeof(PyObject *)) : NULL;
    if (mi != NULL) {
        self->mine = mi;
    }
    Py_ssize_t *rb = mi != NULL ? PyMem_Realloc(self->run_blk, (size_t)cap * sizeof(Py_ssize_t)) : NULL;
    if (rb == NULL) {
        PyErr_NoMemory();
        return -1;
    }
    self->run_blk = rb;
    self->scratch_cap = cap;
    return 0;
}

/* owner == session_id, as Python's == */
static inline int
sp_same_owner(PyObject *owner, PyObject *session)
{
    return owner == session ? 1 : PyObject_RichCompareBool(owner, session, Py_EQ);
}

/* Whether entry e is private to `session` (-1: error). */
static inline int
sp_owned_by(const Sp *self, Py_ssize_t e, PyObject *session)
{
    const SpBlock *b = &self->blk[e];
    return b->state == SP_PRIVATE ? sp_same_owner(b->owner, session) : 0;
}

/* The index slot that holds entry e (which is in the table); no key comparisons. */
static Py_ssize_t
sp_slot_of(const Sp *self, Py_ssize_t e)
{
    size_t mask = (size_t)self->slot_mask, h = (size_t)self->blk[e].hash, i = h & mask,
           perturb = h;
    while (self->slots[i].e != e) {
        perturb >>= 5;
        i = (i * 5 + perturb + 1) & mask;
    }
    return (Py_ssize_t)i;
}

typedef struct {
    double gap;
    int64_t blocks;
} SpGap;

static int
sp_gap_cmp(const void *a, const void *b)
{
    double x = ((const SpGap *)a)->gap, y = ((const SpGap *)b)->gap;
    return (x > y) - (x < y);
}

/* A tuple of atoms (ints, strs, floats, tuples of those) can be in no cycle: untracked now,
   as the collector's first look would untrack it (the test of CPython's tuple untracking),
   so that young collections do not walk the index's results, one tuple of ids a request. */
static inline void
untrack_atoms(PyObject *t)
{
    for (Py_ssize_t i = 0; i < PyTuple_GET_SIZE(t); i++) {
        PyObject *item = PyTuple_GET_ITEM(t, i);
        if (PyObject_IS_GC(item) && PyObject_GC_IsTracked(item)) {
            return;
        }
    }
    PyObject_GC_UnTrack(t);
}

/* Set the flat gaps' pair i: (gap s, blocks). */
static int
sp_gap_set(PyObject *gaps, Py_ssize_t i, double gap, int64_t blocks)
{
    PyObject *g = PyFloat_FromDouble(gap);
    PyObject *n = g != NULL ? PyLong_FromLongLong(blocks) : NULL;
    if (n == NULL) {
        Py_XDECREF(g);
        return -1;
    }
    PyTuple_SET_ITEM(gaps, 2 * i, g);
    PyTuple_SET_ITEM(gaps, 2 * i + 1, n);
    return 0;
}

/* _run: the SharedRun of the first `count` indexed ids, last referenced at lastv. */
static PyObject *
sp_run(Sp *self, double ts, Py_ssize_t count, Py_ssize_t npos, int64_t blocks, int64_t born)
{
    if (count == 0) {
        return Py_NewRef(self->no_sharing);
    }
    const int64_t *pos = self->pos;
    const double *lv = self->lastv;
    int64_t start = pos[count - 1];
    int64_t end = count < npos ? pos[count] : blocks;
    int64_t last = (end - start + 1) / 2;
    Py_ssize_t k = 1;
    while (k < count && lv[k] == lv[0]) {
        k++;
    }
    /* Flat: (gap s, blocks, gap s, blocks, ...), no tuple per pair (SharedGaps). */
    PyObject *gaps;
    if (k == count) { /* the usual case: referenced together, one gap */
        double gap = ts - lv[0];
        gaps = PyTuple_New(2);
        if (gaps == NULL || sp_gap_set(gaps, 0, gap > 0.0 ? gap : 0.0, start + last) < 0) {
            Py_XDECREF(gaps);
            return NULL;
        }
    } else {
        /* Each indexed id weighs the blocks up to the next one (1 each in the dense part:
           Counter(lasts[:-1])), the last one `last`; equal gaps merge and sort, as the
           Python code's weights-by-time then gaps-by-gap do (sums of ints: any order). */
        SpGap *g = PyMem_Malloc((size_t)count * sizeof(SpGap));
        if (g == NULL) {
            PyErr_NoMemory();
            return NULL;
        }
        for (Py_ssize_t i = 0; i < count; i++) {
            double gap = ts - lv[i];
            g[i].gap = gap > 0.0 ? gap : 0.0;
            g[i].blocks = i + 1 < count ? pos[i + 1] - pos[i] : last;
        }
        qsort(g, (size_t)count, sizeof(SpGap), sp_gap_cmp);
        Py_ssize_t distinct = 0;
        for (Py_ssize_t i = 0; i < count; i++) {
            if (distinct > 0 && g[distinct - 1].gap == g[i].gap) {
                g[distinct - 1].blocks += g[i].blocks;
            } else {
                g[distinct++] = g[i];
            }
        }
        gaps = PyTuple_New(2 * distinct);
        for (Py_ssize_t i = 0; gaps != NULL && i < distinct; i++) {
            if (sp_gap_set(gaps, i, g[i].gap, g[i].blocks) < 0) {
                Py_CLEAR(gaps);
            }
        }
        PyMem_Free(g);
        if (gaps == NULL) {
            return NULL;
        }
    }
    /* SharedRun(blocks, gaps, born): a tuple subclass with no fields of its own, built as
       tuple.__new__(SharedRun, ...) builds it. */
    PyTypeObject *rt = (PyTypeObject *)self->run_type;
    PyObject *run = rt->tp_alloc(rt, 3);
    PyObject *nb = PyLong_FromLongLong(start + last);
    PyObject *nborn = PyLong_FromLongLong(born);
    if (run == NULL || nb == NULL || nborn == NULL) {
        Py_XDECREF(run);
        Py_XDECREF(nb);
        Py_XDECREF(nborn);
        Py_DECREF(gaps);
        return NULL;
    }
    untrack_atoms(gaps);
    PyTuple_SET_ITEM(run, 0, nb);
    PyTuple_SET_ITEM(run, 1, gaps);
    PyTuple_SET_ITEM(run, 2, nborn);
    untrack_atoms(run);
    return run;
}

/* Remember the run just set (self->run_blk[:count], every entry shared now) as the run of
   requests that begin with the int id `first`. */
static int
sp_memo_keep(Sp *self, int64_t first, Py_ssize_t count)
{
    if (self->memo == NULL) {
        self->memo = PyMem_Calloc(SP_MEMO_RUNS, sizeof(SpRunMemo));
        if (self->memo == NULL) {
            PyErr_NoMemory();
            return -1;
        }
    }
    SpRunMemo *memo = sp_memo_of(self, first);
    Py_ssize_t n = 0;
    for (; n < count && n < SP_MEMO_IDS; n++) {
        const SpBlock *b = &self->blk[self->run_blk[n]];
        if (!b->is_i64) {
            break;
        }
        memo->v[n] = b->ival;
        memo->e[n] = self->run_blk[n];
    }
    memo->n = n;
    return 0;
}

static PyObject *
sp_pair(PyObject *a, PyObject *b) /* steals a, borrows b */
{
    if (a == NULL) {
        return NULL;
    }
    PyObject *t = PyTuple_New(2);
    if (t == NULL) {
        Py_DECREF(a);
        return NULL;
    }
    PyTuple_SET_ITEM(t, 0, a);
    PyTuple_SET_ITEM(t, 1, Py_NewRef(b));
    untrack_atoms(t);
    return t;
}

/* observe(session_id, timestamp, hashes, held, last_seen, newest=True) */
static PyObject *
sp_observe(Sp *self, PyObject *const *args, Py_ssize_t nargs, PyObject *kwnames)
{
    PyObject *newest_obj = Py_True;
    Py_ssize_t nkw = kwnames != NULL ? PyTuple_GET_SIZE(kwnames) : 0;
    if (nargs + nkw < 5 || nargs + nkw > 6 || (nkw == 1 && nargs != 5) || nkw > 1) {
        PyErr_SetString(PyExc_TypeError,
                        "observe(session_id, timestamp, hashes, held, last_seen, newest=True)");
        return NULL;
    }
    if (nkw == 1) {
        if (PyUnicode_CompareWithASCIIString(PyTuple_GET_ITEM(kwnames, 0), "newest") != 0) {
            PyErr_SetString(PyExc_TypeError, "observe() got an unexpected keyword argument");
            return NULL;
        }
        newest_obj = args[5];
    } else if (nargs == 6) {
        newest_obj = args[5];
    }
    PyObject *session = args[0], *ts_obj = args[1], *hashes = args[2], *held = args[3];
    PyObject *last_seen = args[4];
    if (!PyTuple_Check(held)) {
        PyErr_SetString(PyExc_TypeError, "held must be a tuple of block ids");
        return NULL;
    }
    if (!PyList_Check(hashes) && !PyTuple_Check(hashes)) {
        PyErr_SetString(PyExc_TypeError, "hashes must be a list of block ids");
        return NULL;
    }
    Py_ssize_t n = PySequence_Fast_GET_SIZE(hashes);
    if (!self->capacity || n == 0) {
        return sp_pair(Py_NewRef(self->no_sharing), held);
    }
    double ts = PyFloat_AsDouble(ts_obj);
    if (ts == -1.0 && PyErr_Occurred()) {
        return NULL;
    }
    int newest = PyObject_IsTrue(newest_obj);
    if (newest < 0) {
        return NULL;
    }
    Py_ssize_t npos = sp_positions(self, n);
    if (npos < 0 || sp_scratch(self, npos) < 0) {
        return NULL;
    }
    PyObject **items = PySequence_Fast_ITEMS(hashes);
    const int64_t *pos = self->pos;
    PyObject *result = NULL, *run = NULL, *kept_set = NULL;
    Py_ssize_t count = 0, set_done = 0;
    int64_t born = 0;
    SpKey k;
    /* The run of the last request that began with this one's first id, if any: its ids are
       checked against their entries by value, without hashing or probing.  Runs are kept for
       int ids that sp_small_int reads (block ids are 64-bit hashes). */
    int64_t first_v = 0, v;
    int first_is_int = sp_small_int(items[pos[0]], &first_v);
    const SpRunMemo *memo = NULL;
    if (first_is_int && self->memo != NULL) {
        memo = sp_memo_of(self, first_v);
        if (memo->n == 0 || memo->v[0] != first_v) {
            memo = NULL;
        }
    }
    Py_ssize_t memo_served = 0;
    /* The leading indexed ids that are shared, or private to another open conversation (which
       makes them shared now).  A block that became shared in this loop is not yet in the
       shared table: seen again further on, it ends the run as in Python (BORN). */
    while (count < npos) {
        PyObject *block = items[pos[count]];
        Py_ssize_t e;
        if (memo != NULL && count < memo->n && sp_small_int(block, &v) && v == memo->v[count]
            && self->blk[e = memo->e[count]].state == SP_SHARED && self->blk[e].is_i64
            && self->blk[e].ival == v) {
            memo_served++;
        } else {
            memo = NULL;
            if (sp_key(block, &k) < 0) {
                goto done;
            }
            e = sp_find(self, &k, NULL);
            if (e == -2) {
                goto done;
            }
        }
        if (e < 0 || self->blk[e].state == SP_BORN) {
            break;
        }
        SpBlock *b = &self->blk[e];
        if (b->state == SP_SHARED) {
            self->lasto[count] = Py_NewRef(b->last);
            self->lastv[count] = b->lastv;
            self->run_blk[count++] = e;
            continue;
        }
        int same = sp_same_owner(b->owner, session);
        if (same != 0) {
            if (same < 0) {
                goto done;
            }
            break;
        }
        PyObject *owner = b->owner; /* the reference passes to this call */
        b->owner = NULL;
        b->state = SP_BORN;
        self->n_private--;
        self->run_blk[count] = e;
        self->lasto[count++] = NULL;
        born++;
        PyObject *last = PyObject_CallOneArg(last_seen, owner);
        Py_DECREF(owner);
        if (last == NULL) {
            goto done;
        }
        self->lasto[count - 1] = last;
        double d = PyFloat_AsDouble(last);
        self->lastv[count - 1] = d;
        if ((d == -1.0 && PyErr_Occurred()) || sp_schedule(self, block, ts > d ? ts : d) < 0) {
            goto done;
        }
    }
    if (count) {
        Py_ssize_t newest_k = 0; /* max(lasts): the first of the largest */
        for (Py_ssize_t i = 1; i < count; i++) {
            if (self->lastv[i] > self->lastv[newest_k]) {
                newest_k = i;
            }
        }
        int in_order = ts >= self->lastv[newest_k];
        for (Py_ssize_t i = 0; i < count; i++) {
            /* in order: every block's last reference is now; a late event leaves the later
               references standing (max(t, timestamp)) */
            SpBlock *b = &self->blk[self->run_blk[i]];
            int now = in_order || ts > self->lastv[i];
            if (b->state == SP_BORN) { /* it enters the shared table, in the run's order */
                b->state = SP_SHARED;
                b->shared_seq = ++self->shared_seq;
                self->n_shared++;
            }
            sp_set_shared(self, b, now ? ts_obj : self->lasto[i], now ? ts : self->lastv[i]);
        }
    }
    set_done = 1;
    /* a run the memo did not serve whole (as far as it can hold) is remembered */
    Py_ssize_t memorable = count < SP_MEMO_IDS ? count : SP_MEMO_IDS;
    if (first_is_int && memo_served < memorable && sp_memo_keep(self, first_v, count) < 0) {
        goto done;
    }
    run = sp_run(self, ts, count, npos, n, born);
    if (run == NULL) {
        goto done;
    }
    if (!newest) {
        result = sp_pair(run, held);
        run = NULL;
        goto done;
    }
    /* The usual case: this request repeats the one before it, whose ids the conversation
       holds, bar the last (a partly filled block, re-hashed once it fills). */
    Py_ssize_t nheld = PyTuple_GET_SIZE(held);
    Py_ssize_t same = nheld - 1, nmine = 0, rest = npos - count;
    int repeats = same > 0 && rest >= same;
    for (Py_ssize_t i = 0; repeats && i < same; i++) {
        int eq = sp_eq(items[pos[count + i]], PyTuple_GET_ITEM(held, i));
        if (eq < 0) {
            goto done;
        }
        repeats = eq;
    }
    if (repeats) {
        for (Py_ssize_t i = 0; i < same; i++) {
            self->mine[nmine++] = PyTuple_GET_ITEM(held, i);
        }
    } else {
        same = 0;
    }
    Py_ssize_t room = self->capacity - (self->n_private + self->n_shared);
    for (Py_ssize_t i = count + same; i < npos; i++) {
        PyObject *block = items[pos[i]];
        if (sp_key(block, &k) < 0) {
            goto done;
        }
        Py_ssize_t e = sp_find(self, &k, NULL);
        if (e == -2) {
            goto done;
        }
        if (e >= 0) {
            int mine = sp_owned_by(self, e, session);
            if (mine < 0) {
                goto done;
            }
            if (mine) {
                self->mine[nmine++] = block;
            }
        } else if (room > 0) { /* neither private nor shared: this conversation's now */
            e = sp_insert(self, &k, SP_PRIVATE);
            if (e < 0) {
                goto done;
            }
            self->blk[e].owner = Py_NewRef(session);
            self->n_private++;
            self->mine[nmine++] = block;
            room--;
        }
    }
    /* dropped = held[same:]: those private to this conversation leave, unless still among its
       blocks (set(mine) membership; block ids are ints and strs, where == is the set's
       equality) */
    for (Py_ssize_t d = same; d < nheld; d++) {
        PyObject *block = PyTuple_GET_ITEM(held, d);
        Py_ssize_t slot;
        if (sp_key(block, &k) < 0) {
            goto done;
        }
        Py_ssize_t e = sp_find(self, &k, &slot);
        if (e == -2) {
            goto done;
        }
        int ours = e >= 0 ? sp_owned_by(self, e, session) : 0;
        if (ours < 0) {
            goto done;
        }
        if (!ours) {
            continue;
        }
        int kept = 0;
        if (kept_set == NULL && nmine * (nheld - same) > 64) { /* many: set(mine), as Python */
            kept_set = PySet_New(NULL);
            for (Py_ssize_t m = 0; kept_set != NULL && m < nmine; m++) {
                if (PySet_Add(kept_set, self->mine[m]) < 0) {
                    Py_CLEAR(kept_set);
                }
            }
            if (kept_set == NULL) {
                goto done;
            }
        }
        if (kept_set != NULL) {
            kept = PySet_Contains(kept_set, block);
        }
        for (Py_ssize_t m = nmine - 1; kept_set == NULL && m >= 0 && !kept; m--) {
            kept = sp_eq(self->mine[m], block);
        }
        if (kept < 0) {
            goto done;
        }
        if (!kept) {
            sp_remove(self, e, slot);
        }
    }
    PyObject *mine_t = PyTuple_New(nmine);
    if (mine_t == NULL) {
        goto done;
    }
    for (Py_ssize_t i = 0; i < nmine; i++) {
        PyTuple_SET_ITEM(mine_t, i, Py_NewRef(self->mine[i]));
    }
    untrack_atoms(mine_t);
    result = PyTuple_New(2);
    if (result == NULL) {
        Py_DECREF(mine_t);
        goto done;
    }
    PyTuple_SET_ITEM(result, 0, run);
    PyTuple_SET_ITEM(result, 1, mine_t);
    untrack_atoms(result);
    run = NULL;
done:
    if (!set_done) { /* an error in the first loop: its new shared blocks leave, as in Python
                        (out of the private ones, not yet in the shared table) */
        for (Py_ssize_t i = 0; i < count; i++) {
            Py_ssize_t e = self->run_blk[i];
            if (self->blk[e].state == SP_BORN) {
                self->n_private++; /* sp_remove counts it as private */
                self->blk[e].state = SP_PRIVATE;
                sp_remove(self, e, sp_slot_of(self, e));
            }
        }
    }
    for (Py_ssize_t i = 0; i < count; i++) {
        Py_XDECREF(self->lasto[i]);
    }
    Py_XDECREF(run);
    Py_XDECREF(kept_set);
    return result;
}

/* continues(hashes, held) */
static PyObject *
sp_continues(Sp *self, PyObject *const *args, Py_ssize_t nargs)
{
    if (nargs != 2) {
        PyErr_SetString(PyExc_TypeError, "continues(hashes, held)");
        return NULL;
    }
    PyObject *hashes = args[0], *held = args[1];
    if (!PyTuple_Check(held) || (!PyList_Check(hashes) && !PyTuple_Check(hashes))) {
        PyErr_SetString(PyExc_TypeError, "continues(hashes: list, held: tuple)");
        return NULL;
    }
    Py_ssize_t n = PySequence_Fast_GET_SIZE(hashes), nheld = PyTuple_GET_SIZE(held);
    if (nheld < 2 || !self->capacity || n == 0) {
        Py_RETURN_TRUE;
    }
    Py_ssize_t npos = sp_positions(self, n);
    if (npos < 0) {
        return NULL;
    }
    PyObject **items = PySequence_Fast_ITEMS(hashes);
    PyObject *first = PyTuple_GET_ITEM(held, 0);
    for (Py_ssize_t k = 0; k < npos; k++) { /* the usual case, within the first few ids */
        int eq = sp_eq(items[self->pos[k]], first);
        if (eq != 0) {
            return eq < 0 ? NULL : Py_NewRef(Py_True);
        }
    }
    PyObject *rest = PyTuple_GetSlice(held, 0, nheld - 1);
    PyObject *set = rest != NULL ? PySet_New(rest) : NULL;
    Py_XDECREF(rest);
    if (set == NULL) {
        return NULL;
    }
    for (Py_ssize_t k = 0; k < npos; k++) { /* not set(held[:-1]).isdisjoint(indexed) */
        int in = PySet_Contains(set, items[self->pos[k]]);
        if (in != 0) {
            Py_DECREF(set);
            return in < 0 ? NULL : Py_NewRef(Py_True);
        }
    }
    Py_DECREF(set);
    Py_RETURN_FALSE;
}

/* release(session_id, held): a conversation completed, its private blocks leave. */
static PyObject *
sp_release(Sp *self, PyObject *const *args, Py_ssize_t nargs)
{
    if (nargs != 2) {
        PyErr_SetString(PyExc_TypeError, "release(session_id, held)");
        return NULL;
    }
    PyObject *seq = PySequence_Fast(args[1], "held must be a sequence of block ids");
    if (seq == NULL) {
        return NULL;
    }
    Py_ssize_t n = PySequence_Fast_GET_SIZE(seq);
    PyObject **items = PySequence_Fast_ITEMS(seq);
    /* A completed conversation's blocks are cold: each lookup misses on its index slot and
       on its entry.  A batch's keys are hashed first and their first slots fetched, then
       their entries, so that the misses overlap instead of queueing one after another. */
    enum { BATCH = 16 };
    SpKey keys[BATCH];
    for (Py_ssize_t start = 0; start < n; start += BATCH) {
        Py_ssize_t count = n - start < BATCH ? n - start : BATCH;
        for (Py_ssize_t i = 0; i < count; i++) {
            if (sp_key(items[start + i], &keys[i]) < 0) {
                goto fail;
            }
            if (self->slots != NULL) {
                __builtin_prefetch(&self->slots[(size_t)keys[i].hash & (size_t)self->slot_mask]);
            }
        }
        for (Py_ssize_t i = 0; i < count && self->slots != NULL; i++) {
            Py_ssize_t e = self->slots[(size_t)keys[i].hash & (size_t)self->slot_mask].e;
            if (e >= 0) {
                __builtin_prefetch(&self->blk[e]);
            }
        }
        for (Py_ssize_t i = 0; i < count; i++) {
            Py_ssize_t slot;
            Py_ssize_t e = sp_find(self, &keys[i], &slot);
            if (e == -2) {
                goto fail;
            }
            int ours = e >= 0 ? sp_owned_by(self, e, args[0]) : 0;
            if (ours < 0) {
                goto fail;
            }
            if (ours) {
                sp_remove(self, e, slot);
            }
        }
    }
    Py_DECREF(seq);
    Py_RETURN_NONE;
fail:
    Py_DECREF(seq);
    return NULL;
}

/* expire(watermark) */
static PyObject *
sp_expire(Sp *self, PyObject *arg)
{
    double w = PyFloat_AsDouble(arg);
    if (w == -1.0 && PyErr_Occurred()) {
        return NULL;
    }
    while (self->heap_n && sp_due(self->heap[0].second, w)) {
        PyObject *block = sp_pop(self);
        SpKey k;
        Py_ssize_t slot, e;
        if (sp_key(block, &k) < 0 || (e = sp_find(self, &k, &slot)) == -2) {
            Py_DECREF(block);
            return NULL;
        }
        if (e < 0 || self->blk[e].state != SP_SHARED) {
            Py_DECREF(block);
            continue;
        }
        double second;
        if (sp_floor(self->blk[e].lastv + self->timeout, &second) < 0) {
            Py_DECREF(block);
            return NULL;
        }
        int err;
        if (sp_due(second, w)) { /* out of the shared table and the upserts; a removal */
            sp_remove(self, e, slot);
            err = PySet_Add(self->removals, block) < 0;
        } else { /* referenced since it was scheduled: one entry per block, at its deadline */
            err = sp_schedule(self, block, self->blk[e].lastv) < 0;
        }
        Py_DECREF(block);
        if (err) {
            return NULL;
        }
    }
    Py_RETURN_NONE;
}

/* restore(shared, held): into an empty index, the shared table, then each open
   conversation's held ids. */
static PyObject *
sp_restore(Sp *self, PyObject *const *args, Py_ssize_t nargs)
{
    if (nargs != 2) {
        PyErr_SetString(PyExc_TypeError, "restore(shared, held)");
        return NULL;
    }
    if (self->n_private + self->n_shared) {
        PyErr_SetString(PyExc_ValueError, "restore() fills an empty index");
        return NULL;
    }
    PyObject *items = PyMapping_Items(args[0]);
    if (items == NULL) {
        return NULL;
    }
    for (Py_ssize_t i = 0; i < PyList_GET_SIZE(items); i++) {
        PyObject *kv = PyList_GET_ITEM(items, i);
        PyObject *block = PyTuple_GET_ITEM(kv, 0), *last = PyTuple_GET_ITEM(kv, 1);
        SpKey k;
        double d = PyFloat_AsDouble(last);
        Py_ssize_t e = -2;
        if ((d != -1.0 || !PyErr_Occurred()) && sp_key(block, &k) == 0) {
            e = sp_find(self, &k, NULL);
            if (e == -1) {
                e = sp_insert(self, &k, SP_SHARED);
                if (e >= 0) {
                    self->blk[e].shared_seq = ++self->shared_seq;
                    self->n_shared++;
                }
            }
        }
        if (e < 0 || sp_schedule(self, block, d) < 0) {
            Py_DECREF(items);
            return NULL;
        }
        PyObject *old = self->blk[e].last; /* shared[block] = last: not an upsert */
        self->blk[e].last = Py_NewRef(last);
        self->blk[e].lastv = d;
        Py_XDECREF(old);
    }
    Py_DECREF(items);
    PyObject *it = PyObject_GetIter(args[1]), *entry;
    if (it == NULL) {
        return NULL;
    }
    while ((entry = PyIter_Next(it)) != NULL) {
        PyObject *session, *blocks;
        if (!PyArg_ParseTuple(entry, "OO", &session, &blocks)) {
            goto fail;
        }
        PyObject *seq = PySequence_Fast(blocks, "held must be a sequence of block ids");
        if (seq == NULL) {
            goto fail;
        }
        for (Py_ssize_t i = 0; i < PySequence_Fast_GET_SIZE(seq); i++) {
            SpKey k;
            Py_ssize_t e = -2;
            if (sp_key(PySequence_Fast_GET_ITEM(seq, i), &k) == 0) {
                e = sp_find(self, &k, NULL);
                if (e == -1) {
                    e = sp_insert(self, &k, SP_PRIVATE);
                    if (e >= 0) {
                        self->n_private++;
                    }
                }
            }
            if (e < 0) {
                Py_DECREF(seq);
                goto fail;
            }
            SpBlock *b = &self->blk[e];
            if (b->state == SP_PRIVATE) { /* owners[block] = session_id (the last one wins) */
                PyObject *old = b->owner;
                b->owner = Py_NewRef(session);
                Py_XDECREF(old);
            }
        }
        Py_DECREF(seq);
        Py_DECREF(entry);
    }
    Py_DECREF(it);
    if (PyErr_Occurred()) {
        return NULL;
    }
    Py_RETURN_NONE;
fail:
    Py_DECREF(entry);
    Py_DECREF(it);
    return NULL;
}

static PyObject *
sp_positions_list(Sp *self, PyObject *arg)
{
    Py_ssize_t blocks = PyNumber_AsSsize_t(arg, PyExc_OverflowError);
    if (blocks == -1 && PyErr_Occurred()) {
        return NULL;
    }
    Py_ssize_t n = sp_positions(self, blocks);
    if (n < 0) {
        return NULL;
    }
    PyObject *out = PyList_New(n);
    for (Py_ssize_t k = 0; out != NULL && k < n; k++) {
        PyObject *p = PyLong_FromLongLong(self->pos[k]);
        if (p == NULL) {
            Py_CLEAR(out);
            break;
        }
        PyList_SET_ITEM(out, k, p);
    }
    return out;
}

/* next_due: floor + 1 of the earliest entry (an int in Python: a float where that is exact),
   inf when there is none. */
static PyObject *
sp_get_next_due(Sp *self, void *Py_UNUSED(c))
{
    if (!self->heap_n) {
        return PyFloat_FromDouble(INFINITY);
    }
    double second = self->heap[0].second;
    if (second < 9007199254740992.0 && second >= -9007199254740992.0) {
        return PyFloat_FromDouble(second + 1.0);
    }
    PyObject *floor_int = PyLong_FromDouble(second), *one = PyLong_FromLong(1), *due = NULL;
    if (floor_int != NULL && one != NULL) {
        due = PyNumber_Add(floor_int, one);
    }
    Py_XDECREF(floor_int);
    Py_XDECREF(one);
    return due;
}

/* clear(): the end of a finite input, every private block leaves. */
static PyObject *
sp_clear_private(Sp *self, PyObject *Py_UNUSED(ignored))
{
    for (Py_ssize_t e = 0; e < self->blk_n; e++) {
        if (self->blk[e].state == SP_PRIVATE) {
            sp_remove(self, e, sp_slot_of(self, e));
        }
    }
    Py_RETURN_NONE;
}

typedef struct {
    uint64_t seq;
    Py_ssize_t e;
} SpOrder;

static int
sp_order_cmp(const void *a, const void *b)
{
    uint64_t x = ((const SpOrder *)a)->seq, y = ((const SpOrder *)b)->seq;
    return (x > y) - (x < y);
}

/* A dict of the shared blocks (upserts: those upserted in this generation) -> their last
   reference, in the order the Python dict has them. */
static PyObject *
sp_table_dict(Sp *self, int upserts)
{
    SpOrder *order = malloc((size_t)(self->n_shared + 1) * sizeof(SpOrder));
    if (order == NULL) {
        return PyErr_NoMemory();
    }
    Py_ssize_t n = 0;
    for (Py_ssize_t e = 0; e < self->blk_n; e++) {
        const SpBlock *b = &self->blk[e];
        if (b->state != SP_SHARED) {
            continue;
        }
        if (!upserts) {
            order[n++] = (SpOrder){b->shared_seq, e};
        } else if (b->upsert_gen == (uint32_t)self->upsert_gen && b->upsert_seq) {
            order[n++] = (SpOrder){b->upsert_seq, e};
        }
    }
    qsort(order, (size_t)n, sizeof(SpOrder), sp_order_cmp);
    PyObject *out = PyDict_New();
    for (Py_ssize_t i = 0; out != NULL && i < n; i++) {
        const SpBlock *b = &self->blk[order[i].e];
        if (PyDict_SetItem(out, b->key, b->last) < 0) {
            Py_CLEAR(out);
        }
    }
    free(order);
    return out;
}

static PyObject *
sp_get_shared(Sp *self, void *Py_UNUSED(c))
{
    return sp_table_dict(self, 0);
}

static PyObject *
sp_upserts(Sp *self, PyObject *Py_UNUSED(ignored))
{
    return sp_table_dict(self, 1);
}

/* The checkpoint took the changes: no upserts, no removals. */
static PyObject *
sp_clear_changes(Sp *self, PyObject *Py_UNUSED(ignored))
{
    self->upsert_gen++;
    if (PySet_Clear(self->removals) < 0) {
        return NULL;
    }
    Py_RETURN_NONE;
}

static PyObject *
sp_private_count(Sp *self, PyObject *Py_UNUSED(ignored))
{
    return PyLong_FromSsize_t(self->n_private);
}

static PyObject *
sp_get_timeout(Sp *self, void *Py_UNUSED(c))
{
    return PyFloat_FromDouble(self->timeout);
}

static Py_ssize_t
sp_len(Sp *self)
{
    return self->n_private + self->n_shared;
}

/* SharedIndexCore(capacity, timeout_s, dense_blocks, run_type, no_sharing, removals) */
static int
sp_init(Sp *self, PyObject *args, PyObject *kwds)
{
    static char *names[] = {"capacity", "timeout_s", "dense_blocks", "run_type", "no_sharing",
                            "removals", NULL};
    Py_ssize_t capacity;
    long long dense;
    double timeout;
    PyObject *run_type, *no_sharing, *removals;
    if (!PyArg_ParseTupleAndKeywords(args, kwds, "ndLOOO!", names, &capacity, &timeout, &dense,
                                     &run_type, &no_sharing, &PySet_Type, &removals)) {
        return -1;
    }
    if (capacity < 0 || dense < 1 || dense > ((int64_t)1 << 61)) {
        PyErr_SetString(PyExc_ValueError, "capacity must be >= 0 and 1 <= dense_blocks <= 2**61");
        return -1;
    }
    if (!PyType_Check(run_type) || !PyType_IsSubtype((PyTypeObject *)run_type, &PyTuple_Type)) {
        PyErr_SetString(PyExc_TypeError, "run_type must be a tuple subclass (SharedRun)");
        return -1;
    }
    if (self->run_type != NULL) {
        PyErr_SetString(PyExc_RuntimeError, "SharedIndexCore is initialised once");
        return -1;
    }
    self->capacity = capacity;
    self->timeout = timeout;
    self->dense = dense;
    self->free_head = -1;
    self->upsert_gen = 1;
    self->removals = Py_NewRef(removals);
    self->run_type = Py_NewRef(run_type);
    self->no_sharing = Py_NewRef(no_sharing);
    return 0;
}

static const size_t sp_refs[] = {offsetof(Sp, removals), offsetof(Sp, run_type),
                                 offsetof(Sp, no_sharing)};

/* The table's keys, session ids and times and the heap's blocks are not visited: ints, strs
   and floats, which hold no references. */
static int
sp_traverse(Sp *self, visitproc visit, void *arg)
{
    Py_VISIT(Py_TYPE(self));
    return refs_visit(self, sp_refs, Py_ARRAY_LENGTH(sp_refs), visit, arg);
}

static int
sp_clear(Sp *self)
{
    refs_clear(self, sp_refs, Py_ARRAY_LENGTH(sp_refs));
    return 0;
}

static void
sp_dealloc(Sp *self)
{
    PyTypeObject *tp = Py_TYPE(self);
    PyObject_GC_UnTrack(self);
    sp_clear(self);
    for (Py_ssize_t e = 0; e < self->blk_n; e++) {
        if (self->blk[e].state != SP_FREE) { /* a free entry's union holds next_free */
            Py_XDECREF(self->blk[e].key);
            Py_XDECREF(self->blk[e].owner); /* or its last reference */
        }
    }
    for (Py_ssize_t i = 0; i < self->heap_n; i++) {
        Py_DECREF(self->heap[i].block);
    }
    free(self->blk); /* grown by sp_grow_blocks (aligned_alloc) */
    free(self->slots);
    free(self->heap);
    free(self->pos);
    PyMem_Free(self->lasto);
    PyMem_Free(self->lastv);
    PyMem_Free(self->mine);
    PyMem_Free(self->run_blk);
    PyMem_Free(self->memo);
    tp->tp_free((PyObject *)self);
    Py_DECREF(tp);
}

static PyMethodDef sp_methods[] = {
    {"observe", (PyCFunction)(void (*)(void))sp_observe, METH_FASTCALL | METH_KEYWORDS,
     "observe(session_id, timestamp, hashes, held, last_seen, newest=True) -> (run, held)"},
    {"continues", (PyCFunction)(void (*)(void))sp_continues, METH_FASTCALL,
     "continues(hashes, held) -> bool"},
    {"release", (PyCFunction)(void (*)(void))sp_release, METH_FASTCALL,
     "release(session_id, held): a conversation completed"},
    {"expire", (PyCFunction)sp_expire, METH_O, "expire(watermark)"},
    {"restore", (PyCFunction)(void (*)(void))sp_restore, METH_FASTCALL,
     "restore(shared, held): rebuild an empty index from a checkpoint"},
    {"clear", (PyCFunction)sp_clear_private, METH_NOARGS, "clear(): everything completes"},
    {"positions", (PyCFunction)sp_positions_list, METH_O,
     "positions(blocks) -> the indexed positions of a request of `blocks` blocks"},
    {"_upserts", (PyCFunction)sp_upserts, METH_NOARGS,
     "_upserts() -> the shared table's upserts since the last _clear_changes, as a new dict"},
    {"_clear_changes", (PyCFunction)sp_clear_changes, METH_NOARGS,
     "_clear_changes(): no upserts, no removals"},
    {"_private_count", (PyCFunction)sp_private_count, METH_NOARGS,
     "_private_count() -> private blocks held"},
    {NULL, NULL, 0, NULL},
};

static PyMemberDef sp_members[] = {
    {"capacity", T_PYSSIZET, offsetof(Sp, capacity), READONLY, "block ids kept at most"},
    {"dense_blocks", T_LONGLONG, offsetof(Sp, dense), READONLY, "every id below 2x this"},
    {NULL, 0, 0, 0, NULL},
};

static PyGetSetDef sp_getset[] = {
    {"shared_table", (getter)sp_get_shared, NULL,
     "shared block -> last reference (s), a new dict in the Python index's order", NULL},
    {"next_due", (getter)sp_get_next_due, NULL, "event time from which expire drops something",
     NULL},
    {"_timeout", (getter)sp_get_timeout, NULL, "the completion timeout (s)", NULL},
    {NULL, NULL, NULL, NULL, NULL},
};

static PyType_Slot sp_slots[] = {
    {Py_tp_init, sp_init},
    {Py_tp_dealloc, sp_dealloc},
    {Py_tp_traverse, sp_traverse},
    {Py_tp_clear, sp_clear},
    {Py_tp_methods, sp_methods},
    {Py_tp_members, sp_members},
    {Py_tp_getset, sp_getset},
    {Py_sq_length, sp_len},
    {Py_mp_length, sp_len},
    {Py_tp_doc, "SharedIndexCore(...): kvcast.stats.shared_prefix's index in C (see _replay.c)."},
    {0, NULL},
};

static PyType_Spec sp_spec = {
    .name = "kvcast.stats.native._replay.SharedIndexCore",
    .basicsize = sizeof(Sp),
    .itemsize = 0,
    .flags = Py_TPFLAGS_DEFAULT | Py_TPFLAGS_HAVE_GC | Py_TPFLAGS_BASETYPE,
    .slots = sp_slots,
};

/* ------------------------------------------------------------------------------------------ */
/* Module                                                                                      */

static int
mod_exec(PyObject *m)
{
    ModState *st = PyModule_GetState(m);
    st->unsupported = PyErr_NewExceptionWithDoc(
        "kvcast.stats.native._replay.ReplayUnsupported",
        "The input or configuration is outside what the native engine reproduces exactly.",
        PyExc_Exception, NULL);
    if (st->unsupported == NULL || PyModule_AddObjectRef(m, "ReplayUnsupported", st->unsupported) < 0) {
        return -1;
    }
    st->core_type = PyType_FromModuleAndSpec(m, &core_spec, NULL);
    if (st->core_type == NULL || PyModule_AddObjectRef(m, "ReplayCore", st->core_type) < 0) {
        return -1;
    }
    st->shared_index_type = PyType_FromModuleAndSpec(m, &sp_spec, NULL);
    if (st->shared_index_type == NULL ||
        PyModule_AddObjectRef(m, "SharedIndexCore", st->shared_index_type) < 0) {
        return -1;
    }
    return 0;
}

static const size_t mod_refs[] = {offsetof(ModState, unsupported), offsetof(ModState, core_type),
                                  offsetof(ModState, shared_index_type)};

static int
mod_traverse(PyObject *m, visitproc visit, void *arg)
{
    ModState *st = PyModule_GetState(m);
    return st != NULL ? refs_visit(st, mod_refs, Py_ARRAY_LENGTH(mod_refs), visit, arg) : 0;
}

static int
mod_clear(PyObject *m)
{
    ModState *st = PyModule_GetState(m);
    if (st != NULL) {
        refs_clear(st, mod_refs, Py_ARRAY_LENGTH(mod_refs));
    }
    return 0;
}

static void
mod_free(void *m)
{
    mod_clear((PyObject *)m);
}

static PyModuleDef_Slot mod_slots[] = {
    {Py_mod_exec, mod_exec},
    {0, NULL},
};

static struct PyModuleDef replay_module = {
    PyModuleDef_HEAD_INIT,
    .m_name = "kvcast.stats.native._replay",
    .m_doc = "Native replay engine: exactly the statistics of stats.ingest + StatsEngine.",
    .m_size = sizeof(ModState),
    .m_slots = mod_slots,
    .m_traverse = mod_traverse,
    .m_clear = mod_clear,
    .m_free = mod_free,
};

PyMODINIT_FUNC
PyInit__replay(void)
{
    return PyModuleDef_Init(&replay_module);
}
