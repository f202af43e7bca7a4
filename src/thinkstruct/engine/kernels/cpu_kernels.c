/* thinkstruct's CPU kernels for a Llama decoding step (float32, AVX2 + FMA).
 *
 * Built on first use by cpu_kernels.py (gcc -O3 -mavx2 -mfma -fopenmp) and loaded with
 * ctypes after torch, so OpenMP here is torch's own runtime and thread pool. Each kernel
 * replaces a chain of small torch operations whose cost at decoding sizes is dispatch and
 * thread wake-ups, not arithmetic.
 *
 * Layouts (all row-major, float32 unless said):
 *   tokens    T tokens of one pass, packed; token t belongs to cache slot slot_of[t] and
 *             sits at position pos_of[t] of it (int64).
 *   qkv       [T, ld]: per token heads*dim query values, then kv_heads*dim keys, then
 *             kv_heads*dim values.
 *   cache     keys/values pools [kv_heads, num_blocks, block_tokens, dim], one a layer, in
 *             blocks of block_tokens positions; a block table (ts_pages) says which block
 *             holds position p of slot s: table[s * max_blocks + p / block_tokens], at
 *             offset p % block_tokens. Blocks are shared between slots (the caller never
 *             lets a kernel write a shared one). Heads outermost: a slot whose blocks
 *             are consecutive reads each head as one run, as contiguous slot buffers did
 *             (measured: blocks first cost attention ~13% at 1k positions). The pools
 *             hold float32 or float16 (ts_pages.half): float16 rows are half the bytes
 *             that attention reads, and their conversion to float32 is exact (stored:
 *             rounded to nearest, saturated at +-65504).
 *
 * Every result of a token depends on that token's inputs and its slot's cache only, in a
 * fixed order of operations: never on the other tokens of the pass or how many there are.
 */
#include <immintrin.h>
#include <math.h>
#include <stdint.h>
#include <omp.h>
#include <linux/futex.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <sys/syscall.h>
#include <unistd.h>

static inline float hsum256(__m256 v) {
    __m128 s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
    s = _mm_add_ps(s, _mm_movehl_ps(s, s));
    s = _mm_add_ss(s, _mm_movehdup_ps(s));
    return _mm_cvtss_f32(s);
}

/* e^x for x <= 0 (softmax after subtracting the maximum): Cephes' expf polynomial,
 * a few ulp; x below -87 gives 0. */
static inline __m256 exp256(__m256 x) {
    const __m256 low = _mm256_set1_ps(-87.0f);
    __m256 tiny = _mm256_cmp_ps(x, low, _CMP_LT_OQ);
    x = _mm256_max_ps(x, low);
    __m256 n = _mm256_round_ps(_mm256_mul_ps(x, _mm256_set1_ps(1.44269504088896341f)),
                               _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
    x = _mm256_fnmadd_ps(n, _mm256_set1_ps(0.693359375f), x);
    x = _mm256_fnmadd_ps(n, _mm256_set1_ps(-2.12194440e-4f), x);
    __m256 y = _mm256_set1_ps(1.9875691500e-4f);
    y = _mm256_fmadd_ps(y, x, _mm256_set1_ps(1.3981999507e-3f));
    y = _mm256_fmadd_ps(y, x, _mm256_set1_ps(8.3334519073e-3f));
    y = _mm256_fmadd_ps(y, x, _mm256_set1_ps(4.1665795894e-2f));
    y = _mm256_fmadd_ps(y, x, _mm256_set1_ps(1.6666665459e-1f));
    y = _mm256_fmadd_ps(y, x, _mm256_set1_ps(5.0000001201e-1f));
    y = _mm256_fmadd_ps(y, _mm256_mul_ps(x, x), x);
    y = _mm256_add_ps(y, _mm256_set1_ps(1.0f));
    __m256i e = _mm256_slli_epi32(_mm256_add_epi32(_mm256_cvtps_epi32(n), _mm256_set1_epi32(127)), 23);
    return _mm256_andnot_ps(tiny, _mm256_mul_ps(y, _mm256_castsi256_ps(e)));
}

/* Code for AVX-512, where the CPU has it (checked at run time: avx512_on; the library is
 * built for AVX2). */
#define TS_AVX512 __attribute__((target("avx512f,avx512bw,avx512vl,avx2,fma")))

/* 1: the AVX-512 code runs (the CPU has it and ts_use_avx512 did not turn it off). */
static int ts_avx512 = -1;

static int avx512_on(void) {
    if (ts_avx512 < 0)
        ts_avx512 = __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") &&
                    __builtin_cpu_supports("avx512vl");
    return ts_avx512;
}

/* Turn the AVX-512 code (int8 tiles, GGUF blocks, attention) on, where the CPU has it, or
 * off; returns whether it runs. */
int ts_use_avx512(int on) {
    ts_avx512 = -1;
    ts_avx512 = on && avx512_on();
    return ts_avx512;
}

/* out[r] = x[r] / sqrt(mean(x[r]^2) + eps) * weight, for rows r < rows; dim % 8 == 0. */
static void ts_rms_norm_rows(const float *x, int64_t rows, int64_t dim, int64_t ld_x, const float *weight,
                             float eps, float *out, int64_t ld_out) {
    for (int64_t r = 0; r < rows; r++) {
        const float *xr = x + r * ld_x;
        float *o = out + r * ld_out;
        __m256 acc = _mm256_setzero_ps();
        for (int64_t i = 0; i < dim; i += 8) {
            __m256 v = _mm256_loadu_ps(xr + i);
            acc = _mm256_fmadd_ps(v, v, acc);
        }
        __m256 inv = _mm256_set1_ps(1.0f / sqrtf(hsum256(acc) / (float)dim + eps));
        for (int64_t i = 0; i < dim; i += 8)
            _mm256_storeu_ps(o + i, _mm256_mul_ps(_mm256_mul_ps(_mm256_loadu_ps(xr + i), inv),
                                                  _mm256_loadu_ps(weight + i)));
    }
}

/* Returns 0; -2 for sizes it cannot take (dim % 8, strides shorter than a row): nothing
 * computed. */
int ts_rms_norm(const float *x, int64_t rows, int64_t dim, int64_t ld_x, const float *weight, float eps,
                float *out, int64_t ld_out) {
    if (rows < 0 || dim < 8 || dim % 8 || ld_x < dim || ld_out < dim) return -2;
#pragma omp parallel for schedule(static) if (rows >= 16)
    for (int64_t r = 0; r < rows; r++) ts_rms_norm_rows(x + r * ld_x, 1, dim, ld_x, weight, eps, out + r * ld_out, ld_out);
    return 0;
}

/* out[t, i] = silu(gate_up[t, i]) * gate_up[t, inter + i]; inter % 8 == 0. */
static void silu_mul_rows(const float *gate_up, int64_t tokens, int64_t inter, float *out) {
    for (int64_t t = 0; t < tokens; t++) {
        const float *g = gate_up + t * 2 * inter;
        const float *u = g + inter;
        float *o = out + t * inter;
        for (int64_t i = 0; i < inter; i += 8) {
            __m256 gv = _mm256_loadu_ps(g + i);
            /* sigmoid(g) = r = 1 / (1 + e^-|g|) for g >= 0, e^-|g| * r for g < 0 */
            __m256 e = exp256(_mm256_or_ps(gv, _mm256_set1_ps(-0.0f))); /* e^-|g| */
            __m256 r = _mm256_div_ps(_mm256_set1_ps(1.0f), _mm256_add_ps(_mm256_set1_ps(1.0f), e));
            __m256 sig = _mm256_blendv_ps(r, _mm256_mul_ps(e, r), gv);
            _mm256_storeu_ps(o + i, _mm256_mul_ps(_mm256_mul_ps(gv, sig), _mm256_loadu_ps(u + i)));
        }
    }
}

void ts_silu_mul(const float *gate_up, int64_t tokens, int64_t inter, float *out) {
#pragma omp parallel for schedule(static) if (tokens >= 16)
    for (int64_t t = 0; t < tokens; t++) silu_mul_rows(gate_up + t * 2 * inter, 1, inter, out + t * inter);
}

/* One layer's treatment of each token's queries and keys before attention (NULL / 0: off). */
typedef struct {
    const float *q_norm, *k_norm; /* [dim]: RMS norm of every query / key head (Qwen3) */
    float qk_eps;
    int64_t rot_half; /* rotary pairs a head: its first 2 * rot_half values rotate (partial rotary);
                         cos/sin rows are this wide */
    int64_t rotate;   /* 0: a layer without rotary positions (SmolLM3's every fourth) */
} ts_qk;

/* The block table of a pass: block of position p of slot s is table[s * max_blocks +
 * p / block_tokens], an index below num_blocks. */
typedef struct {
    const int64_t *table;
    int64_t max_blocks, block_tokens, num_blocks;
    int64_t half; /* 1: the pools hold float16 (rounded to nearest even when written), 0: float32 */
} ts_pages;

/* The pool element at offset at (elements) of a float32 or float16 pool. */
static inline const void *kv_at(const void *pool, int64_t at, int64_t half) {
    return (const char *)pool + at * (half ? 2 : 4);
}

/* 8 float32 values as float16, rounded to nearest even; those past float16's range
 * saturate at +-65504 (rounding would give infinities, and attention NaN); NaN stays NaN
 * (max and min return their second operand where one is NaN). */
static inline __m128i to_half8(__m256 x) {
    const __m256 top = _mm256_set1_ps(65504.0f), bottom = _mm256_set1_ps(-65504.0f);
    return _mm256_cvtps_ph(_mm256_min_ps(top, _mm256_max_ps(bottom, x)), _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
}

/* 8 float32 lanes from elements i.. of a pool row p (float16 converted: exact). */
static inline __attribute__((always_inline)) __m256 kv_load8(const void *p, int64_t i, const int half) {
    return half ? _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)((const uint16_t *)p + i)))
                : _mm256_loadu_ps((const float *)p + i);
}

/* The first key/value row of the block holding position p of slot s, for kv head kvh:
 * block_tokens rows of dim follow it (offset p % block_tokens is the position's). */
static inline int64_t page_row(const ts_pages *pg, int64_t s, int64_t p, int64_t kvh) {
    return (kvh * pg->num_blocks + pg->table[s * pg->max_blocks + p / pg->block_tokens]) * pg->block_tokens;
}

/* 0 when every position 0..pos_of[t] of every token's slot has a block in the pool;
 * -3 otherwise (a table entry missing or outside the pool, or a position past the table). */
static int pages_check(const ts_pages *pg, int64_t tokens, const int64_t *slot_of, const int64_t *pos_of) {
    if (pg->block_tokens < 1 || pg->max_blocks < 1) return -3;
    for (int64_t t = 0; t < tokens; t++) {
        if (slot_of[t] < 0 || pos_of[t] < 0 || pos_of[t] / pg->block_tokens >= pg->max_blocks) return -3;
        const int64_t *row = pg->table + slot_of[t] * pg->max_blocks;
        for (int64_t b = 0; b <= pos_of[t] / pg->block_tokens; b++)
            if (row[b] < 0 || row[b] >= pg->num_blocks) return -3;
    }
    return 0;
}

/* Each token's query and key heads normalized (where q_norm / k_norm), then rotated by
 * its position (cos/sin [T, rot_half], rotate-half layout over the head's first
 * 2 * rot_half values) in place, and the keys and values written into the cache at
 * (slot_of[t], pos_of[t]) through the block table; tokens t_lo <= t < t_hi. dim % 8 == 0,
 * rot_half % 8 == 0. */
static void rope_store_rows(float *qkv, int64_t t_lo, int64_t t_hi, int64_t ld, int64_t heads, int64_t kv_heads,
                            int64_t dim, const ts_qk *qk, const float *cos_t, const float *sin_t,
                            const int64_t *slot_of, const int64_t *pos_of, void *keys, void *values,
                            const ts_pages *pg) {
    const int64_t half = qk->rot_half;
    for (int64_t t = t_lo; t < t_hi; t++) {
        float *row = qkv + t * ld;
        const float *c = cos_t + t * half;
        const float *s = sin_t + t * half;
        for (int64_t h = 0; h < heads + kv_heads; h++) {
            float *x = row + h * dim;
            const float *norm = h < heads ? qk->q_norm : qk->k_norm;
            if (norm != NULL) ts_rms_norm_rows(x, 1, dim, dim, norm, qk->qk_eps, x, dim);
            if (!qk->rotate) continue;
            for (int64_t i = 0; i < half; i += 8) {
                __m256 a = _mm256_loadu_ps(x + i), b = _mm256_loadu_ps(x + half + i);
                __m256 cv = _mm256_loadu_ps(c + i), sv = _mm256_loadu_ps(s + i);
                _mm256_storeu_ps(x + i, _mm256_sub_ps(_mm256_mul_ps(a, cv), _mm256_mul_ps(b, sv)));
                _mm256_storeu_ps(x + half + i, _mm256_add_ps(_mm256_mul_ps(b, cv), _mm256_mul_ps(a, sv)));
            }
        }
        const int64_t off = pos_of[t] % pg->block_tokens;
        for (int64_t h = 0; h < kv_heads; h++) {
            const int64_t at = page_row(pg, slot_of[t], pos_of[t], h) + off;
            void *kd = (void *)kv_at(keys, at * dim, pg->half), *vd = (void *)kv_at(values, at * dim, pg->half);
            const float *ks = row + (heads + h) * dim;
            const float *vs = row + (heads + kv_heads + h) * dim;
            if (pg->half) {
                for (int64_t i = 0; i < dim; i += 8) {
                    _mm_storeu_si128((__m128i *)((uint16_t *)kd + i), to_half8(_mm256_loadu_ps(ks + i)));
                    _mm_storeu_si128((__m128i *)((uint16_t *)vd + i), to_half8(_mm256_loadu_ps(vs + i)));
                }
            } else {
                for (int64_t i = 0; i < dim; i += 8) {
                    _mm256_storeu_ps((float *)kd + i, _mm256_loadu_ps(ks + i));
                    _mm256_storeu_ps((float *)vd + i, _mm256_loadu_ps(vs + i));
                }
            }
        }
    }
}

/* Returns 0; -2 for sizes it cannot take, -3 for a block table that does not cover every
 * token's position (ts_pages): nothing computed. */
int ts_rope_store(float *qkv, int64_t tokens, int64_t ld, int64_t heads, int64_t kv_heads, int64_t dim,
                  const float *q_norm, const float *k_norm, float qk_eps, int64_t rot_half, int64_t rotate,
                  const float *cos_t, const float *sin_t, const int64_t *slot_of, const int64_t *pos_of,
                  void *keys, void *values, const int64_t *table, int64_t max_blocks, int64_t block_tokens,
                  int64_t num_blocks, int64_t half) {
    const ts_pages pg = {table, max_blocks, block_tokens, num_blocks, half != 0};
    if (tokens < 0 || kv_heads < 1 || dim % 8 || rot_half % 8 || 2 * rot_half > dim || ld < (heads + 2 * kv_heads) * dim)
        return -2;
    if (pages_check(&pg, tokens, slot_of, pos_of)) return -3;
    const ts_qk qk = {q_norm, k_norm, qk_eps, rot_half, rotate};
#pragma omp parallel for schedule(static) if (tokens >= 16)
    for (int64_t t = 0; t < tokens; t++)
        rope_store_rows(qkv, t, t + 1, ld, heads, kv_heads, dim, &qk, cos_t, sin_t, slot_of, pos_of, keys, values,
                        &pg);
    return 0;
}

/* ---- attention ------------------------------------------------------------------------
 * A query (token t, query head h, of key/value head kvh = h / (heads / kv_heads)) attends
 * to its own slot's positions lo..pos (lo = 0, or pos + 1 - window for a sliding window:
 * the positions p > pos - window, as transformers masks them), read through the block
 * table: out[t, h*dim:(h+1)*dim] = softmax(q . K[lo..pos] * scale) V[lo..pos]. Each
 * output is computed by this sequence of float operations, whatever is computed with it,
 * on AVX2 or AVX-512, wherever its blocks lie:
 *   score of key p: 16 lanes of q[i + l] * k[i + l] accumulated by fused multiply-adds
 *     over i = 0, 16, ... in order (a tail of dim % 16 into lanes 0-7), lanes l and l + 8
 *     added, the 8 sums reduced as ((0+1)+(2+3))+((4+5)+(6+7)), times scale;
 *   softmax: e_j = exp(score_j - max) for j = p - lo, summed in 8 lanes (lane j % 8) in
 *     order of j, the lanes reduced by hsum256; inv = 1 / that sum;
 *   out lane l: e_j * v_j[l] accumulated by fused multiply-adds in order of p, times inv.
 * What is shared: the queries of one slot and kv head (a GQA group, and the consecutive
 * positions of a verify pass or a prefill) are computed together, up to TS_QUERIES at a
 * time, over the keys in chunks of TS_KEYS positions, so each key and value row is read
 * from memory once for all of them; and 8 keys' scores come out of one reduction tree (a
 * horizontal sum of its own cost about as much as a 64-wide key's multiply-adds). */
#define TS_KEYS 8
/* 8 positions of a verify pass x a GQA group of 3 in one batch (measured against 16:
 * 8 positions 5-7 % faster, a 256-token prefill 6 %) */
#define TS_QUERIES 24

/* One pass's attention: its arguments as ts_attention takes them. */
typedef struct {
    const float *qkv;
    int64_t ld, heads, kv_heads, dim;
    const int64_t *slot_of, *pos_of;
    const void *keys, *values; /* float32 or float16 (pg->half) */
    const ts_pages *pg;
    int64_t window;
    float scale;
    float *out;
    int64_t ld_out;
} ts_att;

/* A thread's attention scratch for positions below span: rows, the pool offset (floats)
 * of the key/value row of each position a batch reads, rounded out to chunks (round8(span)
 * entries); scores, TS_QUERIES buffers of stride floats (each query's scores, then its
 * e_j, from index 8 of its buffer: 32-byte aligned, with 8 floats of slack either side
 * for the chunks that straddle its first and last position); acc, TS_QUERIES x dim
 * output sums. */
typedef struct {
    int64_t *rows;
    float *scores, *acc;
    int64_t stride;
} ts_att_scratch;

/* The scratch in one allocation (to free), NULL when it could not be allocated. */
static void *att_scratch(int64_t span, int64_t dim, ts_att_scratch *sc) {
    const int64_t chunks = (span + TS_KEYS - 1) / TS_KEYS * TS_KEYS;
    sc->stride = chunks + 16;
    const size_t bytes = (size_t)chunks * sizeof(int64_t) + (size_t)TS_QUERIES * (sc->stride + dim) * sizeof(float);
    char *mem = (char *)aligned_alloc(64, (bytes + 63) & ~(size_t)63);
    if (mem == NULL) return NULL;
    sc->rows = (int64_t *)mem;
    sc->scores = (float *)(mem + chunks * sizeof(int64_t));
    sc->acc = sc->scores + TS_QUERIES * sc->stride;
    return mem;
}

/* q . k[j] for keys j < 4, before the final reduction: 8 lanes, the sums of lanes l and
 * l + 8 of the 16-lane partial products (AVX2: two 8-lane accumulators a key). */
static inline __attribute__((always_inline)) void dots4_256(const float *q, const void *const *k, int64_t dim,
                                                            __m256 *v, const int half) {
    __m256 a0[4], a1[4];
    for (int j = 0; j < 4; j++) a0[j] = a1[j] = _mm256_setzero_ps();
    int64_t i = 0;
    for (; i + 16 <= dim; i += 16) {
        const __m256 qa = _mm256_loadu_ps(q + i), qb = _mm256_loadu_ps(q + i + 8);
        for (int j = 0; j < 4; j++) {
            a0[j] = _mm256_fmadd_ps(qa, kv_load8(k[j], i, half), a0[j]);
            a1[j] = _mm256_fmadd_ps(qb, kv_load8(k[j], i + 8, half), a1[j]);
        }
    }
    if (i < dim) {
        const __m256 qa = _mm256_loadu_ps(q + i);
        for (int j = 0; j < 4; j++) a0[j] = _mm256_fmadd_ps(qa, kv_load8(k[j], i, half), a0[j]);
    }
    for (int j = 0; j < 4; j++) v[j] = _mm256_add_ps(a0[j], a1[j]);
}

/* The scores q . k[j] * scale of 8 keys (AVX2). */
static inline __attribute__((always_inline)) __m256 scores8_256(const float *q, const void *const *k, int64_t dim,
                                                                __m256 scale, const int half) {
    __m256 v[8];
    dots4_256(q, k, dim, v, half);
    dots4_256(q, k + 4, dim, v + 4, half);
    /* lo: keys 0-3's sums of lanes 0-3, then keys 4-7's; hi: the same of lanes 4-7 */
    const __m256 h0 = _mm256_hadd_ps(_mm256_hadd_ps(v[0], v[1]), _mm256_hadd_ps(v[2], v[3]));
    const __m256 h1 = _mm256_hadd_ps(_mm256_hadd_ps(v[4], v[5]), _mm256_hadd_ps(v[6], v[7]));
    const __m256 s = _mm256_add_ps(_mm256_permute2f128_ps(h0, h1, 0x20), _mm256_permute2f128_ps(h0, h1, 0x31));
    return _mm256_mul_ps(s, scale);
}

/* 16 float32 lanes from elements i.. of a pool row p (as kv_load8). */
static inline __attribute__((always_inline)) TS_AVX512 __m512 kv_load16(const void *p, int64_t i, const int half) {
    return half ? _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)((const uint16_t *)p + i)))
                : _mm512_loadu_ps((const float *)p + i);
}

/* The same scores on AVX-512, for Q (1 to 3: a GQA group of 3 in one pass) queries q[c]
 * at once, each key's lanes loaded once for all: a key's 16-lane partial products in one
 * register, the 8 keys' reduced by the AVX2 tree's additions; into dst[c][0..8). */
static inline __attribute__((always_inline)) TS_AVX512 void scores8_512(const int Q, const float *const *q,
                                                                        const void *const *k, int64_t dim,
                                                                        __m256 scale, float *const *dst,
                                                                        const int half) {
    __m512 a[3][8];
    for (int c = 0; c < Q; c++)
        for (int j = 0; j < 8; j++) a[c][j] = _mm512_setzero_ps();
    int64_t i = 0;
    for (; i + 16 <= dim; i += 16) {
        __m512 qv[3];
        for (int c = 0; c < Q; c++) qv[c] = _mm512_loadu_ps(q[c] + i);
        for (int j = 0; j < 8; j++) {
            const __m512 kv = kv_load16(k[j], i, half);
            for (int c = 0; c < Q; c++) a[c][j] = _mm512_fmadd_ps(qv[c], kv, a[c][j]);
        }
    }
    if (i < dim) { /* lanes 0-7 only; 8-15 keep their sums */
        __m512 qv[3];
        for (int c = 0; c < Q; c++) qv[c] = _mm512_castps256_ps512(_mm256_loadu_ps(q[c] + i));
        for (int j = 0; j < 8; j++) {
            const __m512 kv = _mm512_castps256_ps512(kv_load8(k[j], i, half));
            for (int c = 0; c < Q; c++) a[c][j] = _mm512_mask3_fmadd_ps(qv[c], kv, a[c][j], 0x00FF);
        }
    }
    /* _mm256_hadd_ps within each 128-bit lane: the even elements plus the odd ones */
#define TS_HADD512(x, y) _mm512_add_ps(_mm512_shuffle_ps(x, y, 0x88), _mm512_shuffle_ps(x, y, 0xDD))
    for (int c = 0; c < Q; c++) {
        /* w[j] = [key j's 8 sums | key j + 4's]: lanes 0-7 plus lanes 8-15 */
        __m512 w[4];
        for (int j = 0; j < 4; j++)
            w[j] = _mm512_add_ps(_mm512_shuffle_f32x4(a[c][j], a[c][j + 4], 0x44),
                                 _mm512_shuffle_f32x4(a[c][j], a[c][j + 4], 0xEE));
        /* 128-bit lanes: keys 0-3's sums of lanes 0-3, of lanes 4-7, keys 4-7's of 0-3, of 4-7 */
        const __m512 g = TS_HADD512(TS_HADD512(w[0], w[1]), TS_HADD512(w[2], w[3]));
        const __m512 s = _mm512_add_ps(_mm512_shuffle_f32x4(g, g, 0x08), _mm512_shuffle_f32x4(g, g, 0x0D));
        _mm256_storeu_ps(dst[c], _mm256_mul_ps(_mm512_castps512_ps256(s), scale));
    }
#undef TS_HADD512
}

/* acc[c][l] += w[c][j] * v[j][l] for Q (1 or 2; 4 on AVX-512) queries, keys j0 <= j < j1
 * in order, l in the nv vectors of 8 from l0 (AVX2): the sums stay in registers over the
 * keys, each value vector is loaded once for all the queries. */
static inline __attribute__((always_inline)) void mix_slice256(const int Q, const int nv, float *const *acc,
                                                               const float *const *w, const void *const *v,
                                                               int j0, int j1, int64_t l0, const int half) {
    __m256 x[4][4];
    for (int c = 0; c < Q; c++)
        for (int u = 0; u < nv; u++) x[c][u] = _mm256_loadu_ps(acc[c] + l0 + 8 * u);
    for (int j = j0; j < j1; j++) {
        __m256 vj[4];
        for (int u = 0; u < nv; u++) vj[u] = kv_load8(v[j], l0 + 8 * u, half);
        for (int c = 0; c < Q; c++) {
            const __m256 wj = _mm256_set1_ps(w[c][j]);
            for (int u = 0; u < nv; u++) x[c][u] = _mm256_fmadd_ps(wj, vj[u], x[c][u]);
        }
    }
    for (int c = 0; c < Q; c++)
        for (int u = 0; u < nv; u++) _mm256_storeu_ps(acc[c] + l0 + 8 * u, x[c][u]);
}

/* mix_slice256 over lanes from <= l < dim, in slices of 4 vectors. */
static inline __attribute__((always_inline)) void mix_256(const int Q, float *const *acc, const float *const *w,
                                                          const void *const *v, int j0, int j1, int64_t from,
                                                          int64_t dim, const int half) {
    int64_t l = from;
    for (; l + 32 <= dim; l += 32) mix_slice256(Q, 4, acc, w, v, j0, j1, l, half);
    switch ((dim - l) / 8) {
        case 3: mix_slice256(Q, 3, acc, w, v, j0, j1, l, half); break;
        case 2: mix_slice256(Q, 2, acc, w, v, j0, j1, l, half); break;
        case 1: mix_slice256(Q, 1, acc, w, v, j0, j1, l, half); break;
    }
}

/* The same on AVX-512: vectors of 16 lanes (a dim % 16 tail by mix_256). */
static inline __attribute__((always_inline)) TS_AVX512 void mix_slice512(const int Q, const int nv, float *const *acc,
                                                                         const float *const *w,
                                                                         const void *const *v, int j0, int j1,
                                                                         int64_t l0, const int half) {
    __m512 x[4][4];
    for (int c = 0; c < Q; c++)
        for (int u = 0; u < nv; u++) x[c][u] = _mm512_loadu_ps(acc[c] + l0 + 16 * u);
    for (int j = j0; j < j1; j++) {
        __m512 vj[4];
        for (int u = 0; u < nv; u++) vj[u] = kv_load16(v[j], l0 + 16 * u, half);
        for (int c = 0; c < Q; c++) {
            const __m512 wj = _mm512_set1_ps(w[c][j]);
            for (int u = 0; u < nv; u++) x[c][u] = _mm512_fmadd_ps(wj, vj[u], x[c][u]);
        }
    }
    for (int c = 0; c < Q; c++)
        for (int u = 0; u < nv; u++) _mm512_storeu_ps(acc[c] + l0 + 16 * u, x[c][u]);
}

static inline __attribute__((always_inline)) TS_AVX512 void mix_512(const int Q, float *const *acc,
                                                                    const float *const *w,
                                                                    const void *const *v, int j0, int j1,
                                                                    int64_t dim, const int half) {
    int64_t l = 0;
    for (; l + 64 <= dim; l += 64) mix_slice512(Q, 4, acc, w, v, j0, j1, l, half);
    switch ((dim - l) / 16) {
        case 3: mix_slice512(Q, 3, acc, w, v, j0, j1, l, half); break;
        case 2: mix_slice512(Q, 2, acc, w, v, j0, j1, l, half); break;
        case 1: mix_slice512(Q, 1, acc, w, v, j0, j1, l, half); break;
    }
    l += (dim - l) / 16 * 16;
    if (l < dim) mix_256(Q, acc, w, v, j0, j1, l, dim, half);
}

/* A query's scores s[0..keys) (s 32-byte aligned) to e_j = exp(s_j - max) in place,
 * padded with zeros to a multiple of 8; returns 1 / the sum of the e_j (AVX2). */
static float softmax_256(float *s, int64_t keys) {
    const int64_t padded = (keys + 7) & ~(int64_t)7;
    for (int64_t j = keys; j < padded; j++) s[j] = -INFINITY;
    __m256 vmax = _mm256_set1_ps(-INFINITY);
    for (int64_t j = 0; j < padded; j += 8) vmax = _mm256_max_ps(vmax, _mm256_load_ps(s + j));
    float lanes[8], peak = -INFINITY;
    _mm256_storeu_ps(lanes, vmax);
    for (int l = 0; l < 8; l++) peak = lanes[l] > peak ? lanes[l] : peak;
    __m256 total = _mm256_setzero_ps();
    const __m256 m = _mm256_set1_ps(peak);
    for (int64_t j = 0; j < padded; j += 8) {
        const __m256 e = exp256(_mm256_sub_ps(_mm256_load_ps(s + j), m));
        _mm256_store_ps(s + j, e);
        total = _mm256_add_ps(total, e);
    }
    return 1.0f / hsum256(total);
}

/* exp256 on 16 lanes: the same operations lane by lane. */
static inline __attribute__((always_inline)) TS_AVX512 __m512 exp512(__m512 x) {
    const __m512 low = _mm512_set1_ps(-87.0f);
    const __mmask16 tiny = _mm512_cmp_ps_mask(x, low, _CMP_LT_OQ);
    x = _mm512_max_ps(x, low);
    __m512 n = _mm512_roundscale_ps(_mm512_mul_ps(x, _mm512_set1_ps(1.44269504088896341f)),
                                    _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
    x = _mm512_fnmadd_ps(n, _mm512_set1_ps(0.693359375f), x);
    x = _mm512_fnmadd_ps(n, _mm512_set1_ps(-2.12194440e-4f), x);
    __m512 y = _mm512_set1_ps(1.9875691500e-4f);
    y = _mm512_fmadd_ps(y, x, _mm512_set1_ps(1.3981999507e-3f));
    y = _mm512_fmadd_ps(y, x, _mm512_set1_ps(8.3334519073e-3f));
    y = _mm512_fmadd_ps(y, x, _mm512_set1_ps(4.1665795894e-2f));
    y = _mm512_fmadd_ps(y, x, _mm512_set1_ps(1.6666665459e-1f));
    y = _mm512_fmadd_ps(y, x, _mm512_set1_ps(5.0000001201e-1f));
    y = _mm512_fmadd_ps(y, _mm512_mul_ps(x, x), x);
    y = _mm512_add_ps(y, _mm512_set1_ps(1.0f));
    __m512i e = _mm512_slli_epi32(_mm512_add_epi32(_mm512_cvtps_epi32(n), _mm512_set1_epi32(127)), 23);
    return _mm512_maskz_mov_ps(~tiny, _mm512_mul_ps(y, _mm512_castsi512_ps(e)));
}

/* The same on AVX-512: the maximum and the e_j 16 at a time, the sum still in 8 lanes in
 * order of j (e_j, then e_j+8). */
static TS_AVX512 float softmax_512(float *s, int64_t keys) {
    const int64_t padded = (keys + 7) & ~(int64_t)7;
    for (int64_t j = keys; j < padded; j++) s[j] = -INFINITY;
    __m512 vmax = _mm512_set1_ps(-INFINITY);
    int64_t j = 0;
    for (; j + 16 <= padded; j += 16) vmax = _mm512_max_ps(vmax, _mm512_loadu_ps(s + j));
    if (j < padded) vmax = _mm512_mask_max_ps(vmax, 0x00FF, vmax, _mm512_castps256_ps512(_mm256_load_ps(s + j)));
    const float peak = _mm512_reduce_max_ps(vmax);
    __m256 total = _mm256_setzero_ps();
    const __m512 m = _mm512_set1_ps(peak);
    for (j = 0; j + 16 <= padded; j += 16) {
        const __m512 e = exp512(_mm512_sub_ps(_mm512_loadu_ps(s + j), m));
        _mm512_storeu_ps(s + j, e);
        const __m256 hi = _mm256_castpd_ps(_mm512_extractf64x4_pd(_mm512_castps_pd(e), 1));
        total = _mm256_add_ps(_mm256_add_ps(total, _mm512_castps512_ps256(e)), hi);
    }
    if (j < padded) {
        const __m256 e = exp256(_mm256_sub_ps(_mm256_load_ps(s + j), _mm512_castps512_ps256(m)));
        _mm256_store_ps(s + j, e);
        total = _mm256_add_ps(total, e);
    }
    return 1.0f / hsum256(total);
}

/* One chunk of TS_KEYS keys k (row pointers) for n queries q[i]: their 8 scores into
 * dst[i][0..8). */
static inline __attribute__((always_inline)) void score_chunk_256(const float *const *q, float *const *dst, int n,
                                                                  const void *const *k, int64_t dim, float scale,
                                                                  const int half) {
    const __m256 sv = _mm256_set1_ps(scale);
    for (int i = 0; i < n; i++) _mm256_storeu_ps(dst[i], scores8_256(q[i], k, dim, sv, half));
}

static inline __attribute__((always_inline)) TS_AVX512 void score_chunk_512(const float *const *q,
                                                                            float *const *dst, int n,
                                                                            const void *const *k, int64_t dim,
                                                                            float scale, const int half) {
    const __m256 sv = _mm256_set1_ps(scale);
    int i = 0;
    for (; i + 3 <= n; i += 3) scores8_512(3, q + i, k, dim, sv, dst + i, half);
    if (i + 2 <= n) scores8_512(2, q + i, k, dim, sv, dst + i, half), i += 2;
    if (i < n) scores8_512(1, q + i, k, dim, sv, dst + i, half);
}

/* One chunk's scores on the CPU's widest code for the pool's element type (each
 * combination its own code: the element type is a constant inside). */
static TS_AVX512 void score_chunk_512_f32(const float *const *q, float *const *dst, int n, const void *const *k,
                                          int64_t dim, float scale) {
    score_chunk_512(q, dst, n, k, dim, scale, 0);
}
static TS_AVX512 void score_chunk_512_f16(const float *const *q, float *const *dst, int n, const void *const *k,
                                          int64_t dim, float scale) {
    score_chunk_512(q, dst, n, k, dim, scale, 1);
}
static void score_chunk(const int wide, const int half, const float *const *q, float *const *dst, int n,
                        const void *const *k, int64_t dim, float scale) {
    if (wide) (half ? score_chunk_512_f16 : score_chunk_512_f32)(q, dst, n, k, dim, scale);
    else if (half) score_chunk_256(q, dst, n, k, dim, scale, 1);
    else score_chunk_256(q, dst, n, k, dim, scale, 0);
}

/* One chunk of TS_KEYS value rows v for n queries: acc[i] += e_j v[j] over their keys
 * j0[i] <= j < j1[i], e_j = w[i][j]; up to most (2 or 4) queries at once where they all
 * take every key. */
#define TS_MIX_CHUNK(mix, most)                                                                    \
    for (int i = 0; i < n;) {                                                                      \
        int f = 0;                                                                                 \
        while (f < (most) && i + f < n && j0[i + f] == 0 && j1[i + f] == TS_KEYS) f++;             \
        if ((most) >= 4 && f == 4) {                                                               \
            mix(4, acc + i, w + i, v, 0, TS_KEYS, dim, half);                                      \
            i += 4;                                                                                \
        } else if (f >= 2) {                                                                       \
            mix(2, acc + i, w + i, v, 0, TS_KEYS, dim, half);                                      \
            i += 2;                                                                                \
        } else if (f == 1) {                                                                       \
            mix(1, acc + i, w + i, v, 0, TS_KEYS, dim, half);                                      \
            i++;                                                                                   \
        } else {                                                                                   \
            mix(1, acc + i, w + i, v, j0[i], j1[i], dim, half);                                    \
            i++;                                                                                   \
        }                                                                                          \
    }

static inline __attribute__((always_inline)) void mix_chunk_256(float *const *acc, const float *const *w,
                                                                const int *j0, const int *j1, int n,
                                                                const void *const *v, int64_t dim, const int half) {
#define TS_MIX256(Q, acc, w, v, j0, j1, dim, half) mix_256(Q, acc, w, v, j0, j1, 0, dim, half)
    TS_MIX_CHUNK(TS_MIX256, 2)
#undef TS_MIX256
}

/* (4 queries: 16 of the 32 registers hold their sums) */
static inline __attribute__((always_inline)) TS_AVX512 void mix_chunk_512(float *const *acc, const float *const *w,
                                                                          const int *j0, const int *j1, int n,
                                                                          const void *const *v, int64_t dim,
                                                                          const int half) {
    TS_MIX_CHUNK(mix_512, 4)
}
#undef TS_MIX_CHUNK

/* One chunk's weighted sum, as score_chunk picks its code. */
static TS_AVX512 void mix_chunk_512_f32(float *const *acc, const float *const *w, const int *j0, const int *j1,
                                        int n, const void *const *v, int64_t dim) {
    mix_chunk_512(acc, w, j0, j1, n, v, dim, 0);
}
static TS_AVX512 void mix_chunk_512_f16(float *const *acc, const float *const *w, const int *j0, const int *j1,
                                        int n, const void *const *v, int64_t dim) {
    mix_chunk_512(acc, w, j0, j1, n, v, dim, 1);
}
static void mix_chunk(const int wide, const int half, float *const *acc, const float *const *w, const int *j0,
                      const int *j1, int n, const void *const *v, int64_t dim) {
    if (wide) (half ? mix_chunk_512_f16 : mix_chunk_512_f32)(acc, w, j0, j1, n, v, dim);
    else if (half) mix_chunk_256(acc, w, j0, j1, n, v, dim, 1);
    else mix_chunk_256(acc, w, j0, j1, n, v, dim, 0);
}

/* Prefetch the rows of the chunk at r (TS_KEYS pool offsets) from base: blocks lie
 * anywhere in the pool, and the hardware prefetcher does not follow a jump (measured:
 * attention over shuffled blocks took 2.2x the time of consecutive ones without this).
 * Every chunk, not only those after a jump: 8 slots' decoding over 4k positions (the
 * rows from memory) took 2.1x the time with those only. */
static inline void chunk_prefetch(const void *base, const int64_t *r, int64_t dim, int64_t half) {
    const int64_t bytes = dim * (half ? 2 : 4);
    for (int j = 0; j < TS_KEYS; j++) {
        const char *row = (const char *)kv_at(base, r[j], half);
        for (int64_t c = 0; c < bytes; c += 64) _mm_prefetch(row + c, _MM_HINT_T0);
    }
}

/* The n <= TS_QUERIES queries (token t[i], query head h[i]) of one slot and kv head kvh:
 * their outputs, as the section's comment says. */
static void attend_batch(const ts_att *a, int64_t slot, int64_t kvh, const int64_t *t, const int64_t *h, int n,
                         const ts_att_scratch *sc) {
    const int64_t dim = a->dim, B = a->pg->block_tokens, half = a->pg->half;
    const int wide = avx512_on();
    int64_t lo[TS_QUERIES], end[TS_QUERIES], first = INT64_MAX, last = 0;
    const float *q[TS_QUERIES];
    for (int i = 0; i < n; i++) {
        end[i] = a->pos_of[t[i]] + 1;
        lo[i] = a->window > 0 && end[i] > a->window ? end[i] - a->window : 0;
        first = lo[i] < first ? lo[i] : first;
        last = end[i] > last ? end[i] : last;
        q[i] = a->qkv + t[i] * a->ld + h[i] * dim;
    }
    /* The rows of positions c_lo..c_hi (whole chunks), those outside first..last - 1 the
     * nearest inside (read, their scores never used): one division a batch. */
    const int64_t c_lo = first / TS_KEYS * TS_KEYS, c_hi = (last + TS_KEYS - 1) / TS_KEYS * TS_KEYS;
    const int64_t *blocks = a->pg->table + slot * a->pg->max_blocks, head = kvh * a->pg->num_blocks;
    int64_t *rows = sc->rows;
    for (int64_t p = first, b = first / B, off = first % B; p < last; p++) {
        rows[p - c_lo] = ((head + blocks[b]) * B + off) * dim;
        if (++off == B) off = 0, b++;
    }
    for (int64_t p = c_lo; p < first; p++) rows[p - c_lo] = rows[first - c_lo];
    for (int64_t p = last; p < c_hi; p++) rows[p - c_lo] = rows[last - 1 - c_lo];

    const float *qa[TS_QUERIES];
    const void *rk[TS_KEYS];
    float *dst[TS_QUERIES];
    for (int64_t c = c_lo; c < c_hi; c += TS_KEYS) {
        const int64_t *r = rows + (c - c_lo);
        if (c + 2 * TS_KEYS < c_hi) chunk_prefetch(a->keys, r + 2 * TS_KEYS, dim, half);
        int m = 0;
        for (int i = 0; i < n; i++)
            if (c + TS_KEYS > lo[i] && c < end[i])
                qa[m] = q[i], dst[m++] = sc->scores + i * sc->stride + 8 + (c - lo[i]);
        for (int j = 0; j < TS_KEYS; j++) rk[j] = kv_at(a->keys, r[j], half);
        score_chunk(wide, (int)half, qa, dst, m, rk, dim, a->scale);
    }

    float inv[TS_QUERIES];
    for (int i = 0; i < n; i++) {
        float *s = sc->scores + i * sc->stride + 8;
        inv[i] = wide ? softmax_512(s, end[i] - lo[i]) : softmax_256(s, end[i] - lo[i]);
        for (int64_t l = 0; l < dim; l += 8) _mm256_storeu_ps(sc->acc + i * dim + l, _mm256_setzero_ps());
    }

    float *acc[TS_QUERIES];
    const float *w[TS_QUERIES];
    const void *rv[TS_KEYS];
    int j0[TS_QUERIES], j1[TS_QUERIES];
    for (int64_t c = c_lo; c < c_hi; c += TS_KEYS) {
        const int64_t *r = rows + (c - c_lo);
        if (c + 2 * TS_KEYS < c_hi) chunk_prefetch(a->values, r + 2 * TS_KEYS, dim, half);
        int m = 0;
        for (int i = 0; i < n; i++)
            if (c + TS_KEYS > lo[i] && c < end[i]) {
                acc[m] = sc->acc + i * dim;
                w[m] = sc->scores + i * sc->stride + 8 + (c - lo[i]);
                j0[m] = lo[i] > c ? (int)(lo[i] - c) : 0;
                j1[m++] = end[i] < c + TS_KEYS ? (int)(end[i] - c) : TS_KEYS;
            }
        for (int j = 0; j < TS_KEYS; j++) rv[j] = kv_at(a->values, r[j], half);
        mix_chunk(wide, (int)half, acc, w, j0, j1, m, rv, dim);
    }
    for (int i = 0; i < n; i++) {
        float *o = a->out + t[i] * a->ld_out + h[i] * dim;
        const __m256 iv = _mm256_set1_ps(inv[i]);
        for (int64_t l = 0; l < dim; l += 8)
            _mm256_storeu_ps(o + l, _mm256_mul_ps(_mm256_loadu_ps(sc->acc + i * dim + l), iv));
    }
}

/* What a query of token t costs, in keys: those it reads plus a fixed part for its batch
 * bookkeeping and its output (an estimate, not measured: it only matters for short
 * contexts, where it keeps a split by count). */
#define TS_QUERY_COST 16
static inline int64_t att_cost(const ts_att *a, int64_t t) {
    const int64_t end = a->pos_of[t] + 1;
    return (a->window > 0 && end > a->window ? a->window : end) + TS_QUERY_COST;
}

/* Thread id's share of the pass's T tokens' queries (nt threads). The queries in order:
 * runs of consecutive tokens of one slot, each run kv head by kv head, within one token
 * by token, then the query heads of the group; each thread takes a consecutive part of
 * about the same cost (att_cost; 9 queries of one token: 4 and 5), so its batches
 * (attend_batch) share a kv head's keys between the heads of a group and the positions
 * of a run. Which thread computes a query, and beside which others, changes no bit of
 * it. */
static void attend_share(const ts_att *a, int64_t T, int id, int nt, const ts_att_scratch *sc) {
    const int64_t group = a->heads / a->kv_heads;
    int64_t total = 0, done = 0;
    for (int64_t t = 0; t < T; t++) total += a->heads * att_cost(a, t);
    for (int64_t t0 = 0, t1; t0 < T; t0 = t1) {
        for (t1 = t0 + 1; t1 < T && a->slot_of[t1] == a->slot_of[t0]; t1++) {
        }
        for (int64_t kvh = 0; kvh < a->kv_heads; kvh++) {
            /* This thread's queries of the run and kv head (the query whose cost's midpoint
             * falls in its part), counted, then in batches of about equal size (30: 15 + 15,
             * not 24 + 6: a batch reads the keys once). */
#define TS_MINE(cost) ((2 * done + (cost)) * nt / (2 * total) == id)
            const int64_t before = done;
            int64_t mine = 0;
            for (int64_t t = t0; t < t1; t++) {
                const int64_t cost = att_cost(a, t);
                for (int64_t g = 0; g < group; g++, done += cost) mine += TS_MINE(cost);
            }
            const int64_t batches = (mine + TS_QUERIES - 1) / TS_QUERIES;
            const int size = batches > 0 ? (int)((mine + batches - 1) / batches) : 0;
            int64_t tq[TS_QUERIES], hq[TS_QUERIES];
            int n = 0;
            done = before;
            for (int64_t t = t0; t < t1; t++) {
                const int64_t cost = att_cost(a, t);
                for (int64_t g = 0; g < group; g++, done += cost) {
                    if (!TS_MINE(cost)) continue;
                    tq[n] = t, hq[n] = kvh * group + g;
                    if (++n == size) {
                        attend_batch(a, a->slot_of[t0], kvh, tq, hq, n, sc);
                        n = 0;
                    }
                }
            }
#undef TS_MINE
            if (n > 0) attend_batch(a, a->slot_of[t0], kvh, tq, hq, n, sc);
        }
    }
}

/* Every token t's queries (in qkv) attend to its slot's positions up to pos_of[t] (see
 * the section's comment; window 0: all of them), through the block table (table,
 * max_blocks, block_tokens, num_blocks, half: ts_pages). span: more than every pos_of (scratch
 * size). Returns 0; -2 for sizes it cannot take, -3 for a table that does not cover every
 * token's positions (nothing computed); -1 when a thread's scratch could not be
 * allocated (out is not all written). */
int ts_attention(const float *qkv, int64_t tokens, int64_t ld, int64_t heads, int64_t kv_heads, int64_t dim,
                 const int64_t *slot_of, const int64_t *pos_of, const void *keys, const void *values,
                 const int64_t *table, int64_t max_blocks, int64_t block_tokens, int64_t num_blocks, int64_t half,
                 int64_t span, int64_t window, float scale, float *out, int64_t ld_out) {
    const ts_pages pg = {table, max_blocks, block_tokens, num_blocks, half != 0};
    if (tokens < 0 || kv_heads < 1 || heads % kv_heads || dim % 8 || dim > 256 || ld < (heads + 2 * kv_heads) * dim ||
        ld_out < heads * dim)
        return -2;
    for (int64_t t = 0; t < tokens; t++)
        if (pos_of[t] >= span) return -2;
    if (pages_check(&pg, tokens, slot_of, pos_of)) return -3;
    const ts_att a = {qkv, ld, heads, kv_heads, dim, slot_of, pos_of, keys, values, &pg, window, scale, out, ld_out};
    int failed = 0;
#pragma omp parallel if (tokens * heads >= 4) reduction(| : failed)
    {
        ts_att_scratch sc;
        void *mem = att_scratch(span, dim, &sc);
        if (mem == NULL) failed = 1;
        else attend_share(&a, tokens, omp_get_thread_num(), omp_get_num_threads(), &sc);
        free(mem);
    }
    return failed ? -1 : 0;
}

/* ---- int8 weights, float32 activations ----------------------------------------------
 * out[m, n] = scale[n] * sum_k x[m, k] * w[n, k] (+ bias[n]), w int8 with one scale per
 * output row, bias float32 or NULL.
 * Packed weights: [N / 16][K][16] (16 output rows interleaved per k). Each output is one
 * chain of fused multiply-adds over k in order, whatever the tile, so a row's result does
 * not depend on how many rows are computed with it. On AVX2, up to 8 rows (decoding)
 * convert the weights as they stream (memory bound); more rows (prefill, compute bound)
 * first convert a block of 16 output rows to float32 once (exactly the same values) and
 * run 6 x 16 register tiles over it. On AVX-512 (below) every 8 rows stream the weights. */
#define TS_W8_LOAD(p) _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(_mm_loadl_epi64((const __m128i *)(p))))

/* rows (<= 6) x 16 outputs. from_float and accumulate (constants at each call, folded
 * away): read the block's float32 copy wf [K][16] instead of converting the int8 wq as it
 * streams; add the result to what out holds. */
static inline __attribute__((always_inline)) void w8_tile(const int rows, const int from_float,
                                                          const int accumulate, const float *x,
                                                          int64_t ld_x, const int8_t *wq, const float *wf,
                                                          int64_t K, const float *scale, const float *bias,
                                                          float *out, int64_t ld_out) {
    __m256 acc[6][2];
    for (int r = 0; r < rows; r++) acc[r][0] = acc[r][1] = _mm256_setzero_ps();
    for (int64_t k = 0; k < K; k++) {
        const __m256 w0 = from_float ? _mm256_load_ps(wf + k * 16) : TS_W8_LOAD(wq + k * 16);
        const __m256 w1 = from_float ? _mm256_load_ps(wf + k * 16 + 8) : TS_W8_LOAD(wq + k * 16 + 8);
        for (int r = 0; r < rows; r++) {
            const __m256 xb = _mm256_broadcast_ss(x + r * ld_x + k);
            acc[r][0] = _mm256_fmadd_ps(xb, w0, acc[r][0]);
            acc[r][1] = _mm256_fmadd_ps(xb, w1, acc[r][1]);
        }
    }
    const __m256 s0 = _mm256_loadu_ps(scale), s1 = _mm256_loadu_ps(scale + 8);
    for (int r = 0; r < rows; r++) {
        float *o = out + r * ld_out;
        __m256 y0 = _mm256_mul_ps(acc[r][0], s0), y1 = _mm256_mul_ps(acc[r][1], s1);
        if (bias != NULL) {
            y0 = _mm256_add_ps(y0, _mm256_loadu_ps(bias));
            y1 = _mm256_add_ps(y1, _mm256_loadu_ps(bias + 8));
        }
        if (accumulate) {
            y0 = _mm256_add_ps(_mm256_loadu_ps(o), y0);
            y1 = _mm256_add_ps(_mm256_loadu_ps(o + 8), y1);
        }
        _mm256_storeu_ps(o, y0);
        _mm256_storeu_ps(o + 8, y1);
    }
}

/* All M rows against one block of 16 outputs, in tiles of `height` rows (4 streaming,
 * 6 over the float32 copy); height, from_float and accumulate are constants at each call. */
static inline __attribute__((always_inline)) void w8_block(const int height, const int from_float,
                                                           const int accumulate, const float *x,
                                                           int64_t M, int64_t ld_x, const int8_t *wq,
                                                           const float *wf, int64_t K, const float *scale,
                                                           const float *bias, float *out, int64_t ld_out) {
    for (int64_t m = 0; m < M; m += height) {
        const float *xm = x + m * ld_x;
        float *om = out + m * ld_out;
        switch (M - m >= height ? height : M - m) {
            case 1: w8_tile(1, from_float, accumulate, xm, ld_x, wq, wf, K, scale, bias, om, ld_out); break;
            case 2: w8_tile(2, from_float, accumulate, xm, ld_x, wq, wf, K, scale, bias, om, ld_out); break;
            case 3: w8_tile(3, from_float, accumulate, xm, ld_x, wq, wf, K, scale, bias, om, ld_out); break;
            case 4: w8_tile(4, from_float, accumulate, xm, ld_x, wq, wf, K, scale, bias, om, ld_out); break;
            case 5: w8_tile(5, from_float, accumulate, xm, ld_x, wq, wf, K, scale, bias, om, ld_out); break;
            default: w8_tile(6, from_float, accumulate, xm, ld_x, wq, wf, K, scale, bias, om, ld_out); break;
        }
    }
}

/* AVX-512 (TS_AVX512): up to 8 rows x 16 outputs in one pass over the weights, every row's 16 outputs in one
 * register, where the AVX2 tiles above take 4 rows and stream (and convert) the weights
 * twice for 8. Each output is the same chain of fused multiply-adds over k in the same
 * order, then the same scaling (and additions), so both give the same bits. */
static inline __attribute__((always_inline)) TS_AVX512 void w8_tile512(const int rows, const int accumulate,
                                                                       const float *x, int64_t ld_x,
                                                                       const int8_t *wq, int64_t K,
                                                                       const float *scale, const float *bias,
                                                                       float *out, int64_t ld_out) {
    __m512 acc[8];
    for (int r = 0; r < rows; r++) acc[r] = _mm512_setzero_ps();
    for (int64_t k = 0; k < K; k++) {
        const __m512 w = _mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(_mm_loadu_si128((const __m128i *)(wq + k * 16))));
        for (int r = 0; r < rows; r++) acc[r] = _mm512_fmadd_ps(_mm512_set1_ps(x[r * ld_x + k]), w, acc[r]);
    }
    const __m512 s = _mm512_loadu_ps(scale);
    for (int r = 0; r < rows; r++) {
        __m512 y = _mm512_mul_ps(acc[r], s);
        if (bias != NULL) y = _mm512_add_ps(y, _mm512_loadu_ps(bias));
        if (accumulate) y = _mm512_add_ps(_mm512_loadu_ps(out + r * ld_out), y);
        _mm512_storeu_ps(out + r * ld_out, y);
    }
}

static TS_AVX512 void w8_stream512(const int accumulate, const float *x, int64_t M, int64_t ld_x, const int8_t *wq,
                                   int64_t K, const float *scale, const float *bias, float *out, int64_t ld_out) {
#define TS_TILE(n)                                                                              \
    case n:                                                                                     \
        if (accumulate) w8_tile512(n, 1, x, ld_x, wq, K, scale, bias, out, ld_out);             \
        else w8_tile512(n, 0, x, ld_x, wq, K, scale, bias, out, ld_out);                        \
        break;
    switch (M) {
        TS_TILE(1) TS_TILE(2) TS_TILE(3) TS_TILE(4) TS_TILE(5) TS_TILE(6) TS_TILE(7) TS_TILE(8)
    }
#undef TS_TILE
}

/* rows (1 to TS_WIDE_ROWS) x TS_WIDE blocks of 16 outputs in one pass over k. A row in
 * w8_tile512 is one chain of fused multiply-adds per block, each waiting on the last
 * one's latency (14 GB/s of weights on one block at a time, measured; 3 to 8 rows took
 * about as long as one row of four blocks side by side takes thrice); four blocks side by
 * side are four chains a row, and each output is still the same chain over k in order,
 * then the same scaling and additions: the same bits as w8_tile512. */
#define TS_WIDE 4
#define TS_WIDE_ROWS 6

static inline __attribute__((always_inline)) TS_AVX512 void w8_wide512(const int rows, const int accumulate,
                                                                       const float *x, int64_t ld_x,
                                                                       const int8_t *wq, int64_t K,
                                                                       const float *scale, const float *bias,
                                                                       float *out, int64_t ld_out) {
    __m512 acc[TS_WIDE_ROWS][TS_WIDE];
    for (int r = 0; r < rows; r++)
        for (int j = 0; j < TS_WIDE; j++) acc[r][j] = _mm512_setzero_ps();
    for (int64_t k = 0; k < K; k++) {
        for (int j = 0; j < TS_WIDE; j++) {
            const __m512 w =
                _mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(_mm_loadu_si128((const __m128i *)(wq + (j * K + k) * 16))));
            for (int r = 0; r < rows; r++) acc[r][j] = _mm512_fmadd_ps(_mm512_set1_ps(x[r * ld_x + k]), w, acc[r][j]);
        }
    }
    for (int j = 0; j < TS_WIDE; j++) {
        const __m512 s = _mm512_loadu_ps(scale + 16 * j);
        for (int r = 0; r < rows; r++) {
            float *o = out + r * ld_out + 16 * j;
            __m512 y = _mm512_mul_ps(acc[r][j], s);
            if (bias != NULL) y = _mm512_add_ps(y, _mm512_loadu_ps(bias + 16 * j));
            if (accumulate) y = _mm512_add_ps(_mm512_loadu_ps(o), y);
            _mm512_storeu_ps(o, y);
        }
    }
}

/* M (1 to TS_WIDE_ROWS) rows against TS_WIDE blocks. */
static TS_AVX512 void w8_wide(const int accumulate, const float *x, int64_t M, int64_t ld_x, const int8_t *wq,
                              int64_t K, const float *scale, const float *bias, float *out, int64_t ld_out) {
#define TS_TILE(n)                                                                              \
    case n:                                                                                     \
        if (accumulate) w8_wide512(n, 1, x, ld_x, wq, K, scale, bias, out, ld_out);             \
        else w8_wide512(n, 0, x, ld_x, wq, K, scale, bias, out, ld_out);                        \
        break;
    switch (M) {
        TS_TILE(1) TS_TILE(2) TS_TILE(3) TS_TILE(4) TS_TILE(5) TS_TILE(6)
    }
#undef TS_TILE
}

/* Up to this many rows (a decoding pass, a speculative draft's verification) run in
 * w8_wide's tiles, split as evenly as they go (9 rows: 5 + 4); more (prefill) stream. */
#define TS_WIDE_MAX_ROWS 16

/* Output blocks [b_lo, b_hi) of x [M, K] (row stride ld_x) times the packed w (as above),
 * plus bias [N] where not NULL, into out [M, N] (row stride ld_out); accumulate: add to
 * what out holds (a residual connection) instead of overwriting it. wf: scratch of K * 16 floats (32-byte aligned),
 * used by the AVX2 tiles when M > 8 (w8_scratch says whether it is needed). */
static void w8_blocks(const float *x, int64_t M, int64_t K, int64_t ld_x, const int8_t *w, const float *scale,
                      const float *bias, float *out, int64_t ld_out, int64_t b_lo, int64_t b_hi, float *wf,
                      int accumulate) {
    if (avx512_on() && M <= TS_WIDE_MAX_ROWS) { /* decoding few rows: TS_WIDE blocks at a time */
        const int64_t tiles = (M + TS_WIDE_ROWS - 1) / TS_WIDE_ROWS;
        for (; b_lo + TS_WIDE <= b_hi; b_lo += TS_WIDE)
            for (int64_t t = 0; t < tiles; t++) {
                const int64_t m = M * t / tiles, rows = M * (t + 1) / tiles - m;
                w8_wide(accumulate, x + m * ld_x, rows, ld_x, w + b_lo * K * 16, K, scale + b_lo * 16,
                        bias == NULL ? NULL : bias + b_lo * 16, out + m * ld_out + b_lo * 16, ld_out);
            }
    }
    for (int64_t b = b_lo; b < b_hi; b++) {
        const int8_t *wq = w + b * K * 16;
        const float *sb = scale + b * 16;
        const float *bb = bias == NULL ? NULL : bias + b * 16;
        float *ob = out + b * 16;
        if (avx512_on()) {
            for (int64_t m = 0; m < M; m += 8)
                w8_stream512(accumulate, x + m * ld_x, M - m < 8 ? M - m : 8, ld_x, wq, K, sb, bb, ob + m * ld_out,
                             ld_out);
            continue;
        }
        if (M <= 8) {
            if (accumulate) w8_block(4, 0, 1, x, M, ld_x, wq, NULL, K, sb, bb, ob, ld_out);
            else w8_block(4, 0, 0, x, M, ld_x, wq, NULL, K, sb, bb, ob, ld_out);
            continue;
        }
        for (int64_t k = 0; k < K * 16; k += 8) _mm256_store_ps(wf + k, TS_W8_LOAD(wq + k));
        if (accumulate) w8_block(6, 1, 1, x, M, ld_x, wq, wf, K, sb, bb, ob, ld_out);
        else w8_block(6, 1, 0, x, M, ld_x, wq, wf, K, sb, bb, ob, ld_out);
    }
}

/* Whether w8_blocks needs a float block scratch for M rows (the AVX2 prefill tiles). */
static int w8_needs_scratch(int64_t M) { return M > 8 && !avx512_on(); }

/* The scratch w8_blocks needs for M rows of inputs of up to K, or NULL (free() takes it). */
static float *w8_scratch(int64_t M, int64_t K) {
    return w8_needs_scratch(M) ? (float *)aligned_alloc(32, (size_t)K * 16 * sizeof(float)) : NULL;
}

/* Chunks a thread, about, in each phase: enough that a preempted thread's chunk is a
 * small part of the phase, few enough that taking them costs nothing next to the work
 * (one chunk is two atomic operations on a line both threads write: chunks of 4 blocks
 * in a one-token pass, ~85 a layer, made a step on two threads 1.2x slower). A phase's
 * chunk size (ts_chunk) is a multiple of the GGUF and int8 tiles' width (4 blocks of 16
 * outputs) for projections; for attention, attend_share's parts of about equal cost
 * (one token's 9 heads over 2 threads: 4 parts of 2-3 queries). */
#define TS_CHUNKS_A_THREAD 2

/* The chunk size of a phase of n items (16-output blocks, tokens) on threads threads: a
 * multiple of unit items, about TS_CHUNKS_A_THREAD chunks a thread. */
static int64_t ts_chunk(int64_t n, int threads, int64_t unit) {
    const int64_t chunks = (int64_t)TS_CHUNKS_A_THREAD * threads;
    const int64_t size = ((n + chunks - 1) / chunks + unit - 1) / unit * unit;
    return size > 0 ? size : unit;
}

/* x [M, K] (row stride ld_x), packed w as above, scale [N], bias [N] or NULL, out [M, N]
 * (row stride ld_out); N % 16 == 0. Returns 0; -2 for sizes it cannot take (nothing
 * computed); -1 when a thread's scratch could not be allocated (out is not all written). */
int ts_w8_linear(const float *x, int64_t M, int64_t K, int64_t ld_x, const int8_t *w, const float *scale,
                 const float *bias, int64_t N, float *out, int64_t ld_out) {
    if (M < 0 || K < 1 || N < 16 || N % 16 || ld_x < K || ld_out < N) return -2;
    const int64_t blocks = N / 16, size = ts_chunk(blocks, omp_get_max_threads(), 4);
    const int64_t chunks = (blocks + size - 1) / size;
    int failed = 0;
#pragma omp parallel reduction(| : failed)
    {
        float *wf = w8_scratch(M, K);
        const int ok = wf != NULL || !w8_needs_scratch(M);
        if (!ok) failed = 1;
#pragma omp for schedule(dynamic, 1)
        for (int64_t c = 0; c < chunks; c++)
            if (ok)
                w8_blocks(x, M, K, ld_x, w, scale, bias, out, ld_out, c * size,
                          (c + 1) * size < blocks ? (c + 1) * size : blocks, wf, 0);
        free(wf);
    }
    return failed ? -1 : 0;
}

#include "gguf_blocks.c"

/* ---- a whole decoder stack in one parallel region ------------------------------------
 * Small torch operations and separate parallel regions cost more than their arithmetic
 * at decoding sizes: every region wakes the sleeping OpenMP threads (about 100 us each
 * on two cores with OMP_WAIT_POLICY=PASSIVE, which the server needs), and a layer makes
 * about ten of them. ts_decoder_layers runs every layer of a pass inside one region.
 *
 * Its phases (norm, projections, rotary + cache store, attention, ...) are cut into
 * chunks (blocks of 16 outputs, tokens, parts of the queries) that the threads take
 * from a counter, first come first served; a thread that has no chunk left waits until
 * every chunk of the phase is done, then goes on to the next. So a thread the system
 * preempts (another process, Ray's threads in a replica, the HTTP loop) holds the others
 * up for at most the chunk it holds: the rest of the phase is taken by those running, and
 * when it runs again it finds the phases it missed done and catches up. With a fixed
 * half each, every preemption stalled the whole pass at the next of its 210 meeting
 * points: 8 clients on a machine with one other busy process measured 52 tok/s on two
 * threads against 486 on one.
 *
 * Each value is computed by the same code whichever thread takes its chunk, so a token's
 * result still depends on its own inputs only. */

/* One phase's counters: chunks taken (a cache line), chunks done and whether a thread
 * sleeps until the phase is done (another). */
typedef struct {
    atomic_int taken;
    char pad0[60];
    atomic_int done, sleepers;
    char pad1[56];
} ts_phase;

/* The next chunk of phase p for this thread, or -1 when all n are taken. */
static inline int ts_take(ts_phase *p, int n) {
    if (atomic_load_explicit(&p->taken, memory_order_relaxed) >= n) return -1;
    const int c = atomic_fetch_add_explicit(&p->taken, 1, memory_order_relaxed);
    return c < n ? c : -1;
}

/* A chunk of phase p (of n) is finished: its writes visible to whoever sees it counted;
 * the last one wakes the threads sleeping on the phase. */
static inline void ts_finish(ts_phase *p, int n) {
    if (atomic_fetch_add(&p->done, 1) + 1 == n && atomic_load(&p->sleepers))
        syscall(SYS_futex, &p->done, FUTEX_WAKE_PRIVATE, INT32_MAX, NULL, NULL, 0);
}

/* Until all n chunks of phase p are done: spin while the wait is short (the last chunks
 * are being computed on the other cores), then sleep until the last one wakes us. Not
 * sched_yield: a yielding thread keeps its core busy, so the scheduler leaves a preempted
 * thread holding a chunk queued behind another process on its own core; a sleeping one
 * leaves its core idle for it. */
#ifndef TS_SPINS
#define TS_SPINS 4000
#endif
static void ts_wait(ts_phase *p, int n) {
    for (int spins = 0; spins < TS_SPINS; spins++) {
        if (atomic_load_explicit(&p->done, memory_order_acquire) >= n) return;
        _mm_pause();
    }
    atomic_store(&p->sleepers, 1);
    for (int seen; (seen = atomic_load(&p->done)) < n;)
        syscall(SYS_futex, &p->done, FUTEX_WAIT_PRIVATE, seen, NULL, NULL, 0);
}

/* Passes of at most this many tokens compute their norms and gated SiLU on every thread
 * that takes a chunk of the projection after them (into its own buffers: the same
 * values), instead of in a phase of their own: 6 phases a layer instead of 9. */
#define TS_OWN_GLUE 16
/* Phases a layer (the slots of the counters; the own-glue ones unused in short passes). */
#define TS_PHASES 9

/* One decoder layer's parameters: projections (q/k/v stacked into qkv, gate/up into
 * gate_up) of format *_format: int8 rows packed as above with their scales (TS_INT8), or
 * GGUF blocks packed as gguf_blocks.c says (scales unused); their biases (NULL: none), the norms' weights, the
 * per-head q/k norms (NULL: none), whether it rotates, its sliding window (0: none) and
 * its cache pools (ts_pages says which block holds which position). GGUF q/k/v of two
 * formats (a Q4_K_M file's Q6_K v beside Q4_K q and k): qkv holds the first qkv_split
 * blocks of 16 outputs, qkv_tail the rest, of format qkv_tail_format (qkv_split 0: one
 * format). */
typedef struct {
    const float *attn_norm, *mlp_norm;
    const void *qkv, *out, *gate_up, *down;
    const float *qkv_scale, *out_scale, *gate_up_scale, *down_scale;
    const float *qkv_bias, *out_bias, *gate_up_bias, *down_bias;
    const float *q_norm, *k_norm;
    void *keys, *values; /* float32 or float16 pools (ts_pages.half) */
    int64_t rotate, window;
    int64_t qkv_format, out_format, gate_up_format, down_format;
    float attn_eps, mlp_eps, qk_eps, scaling;
    const void *qkv_tail;
    int64_t qkv_tail_format, qkv_split;
} ts_layer;

/* Output blocks [b_lo, b_hi) of L's qkv projection over in, its two formats' parts each
 * by its own blocks. */
static void ts_qkv_projection(const ts_layer *L, const ts_input *in, float *out, int64_t ld_out, int64_t b_lo,
                              int64_t b_hi, float *wf) {
    const int64_t split = L->qkv_split;
    if (split <= 0 || b_hi <= split) {
        ts_projection(L->qkv_format, in, L->qkv, L->qkv_scale, L->qkv_bias, out, ld_out, b_lo, b_hi, wf, 0);
        return;
    }
    if (b_lo < split)
        ts_projection(L->qkv_format, in, L->qkv, L->qkv_scale, L->qkv_bias, out, ld_out, b_lo, split, wf, 0);
    gguf_blocks(L->qkv_tail_format, in->a, in->M, in->K, (const uint8_t *)L->qkv_tail,
                L->qkv_bias == NULL ? NULL : L->qkv_bias + 16 * split, out + 16 * split, ld_out,
                (b_lo > split ? b_lo : split) - split, b_hi - split, 0);
}

/* Chunk c of n over [0, total) in steps of size: its first and end. */
#define TS_SPAN(c, size, total) (c) * (size), ((c) + 1) * (size) < (total) ? ((c) + 1) * (size) : (total)
#define TS_CHUNKS(total, size) (int)(((total) + (size) - 1) / (size))

/* h [T, hidden] (the residual stream, updated in place) through layers[0..n_layers):
 * per layer h += o(attention(rope(qk_norm(qkv(norm(h)))))), h += down(silu_mul(gate_up(norm(h)))).
 * cos/sin [T, rot_half], slot_of/pos_of [T] and the cache's block table (table,
 * max_blocks, block_tokens, num_blocks, half) as for ts_rope_store and ts_attention; span:
 * more than every pos_of. hidden, dim, rot_half, heads*dim, inter: % 8 == 0; every
 * projection's outputs % 16 == 0, dim <= 256. Returns 0; -2 for sizes outside these,
 * -3 for a table that does not cover every token's positions (nothing computed); -1 when
 * a buffer could not be allocated (nothing computed). */
int ts_decoder_layers(float *h, int64_t T, int64_t hidden, int64_t heads, int64_t kv_heads, int64_t dim,
                      int64_t inter, int64_t rot_half, const ts_layer *layers, int64_t n_layers,
                      const float *cos_t, const float *sin_t, const int64_t *slot_of, const int64_t *pos_of,
                      const int64_t *table, int64_t max_blocks, int64_t block_tokens, int64_t num_blocks,
                      int64_t half, int64_t span) {
    const int64_t qkv_n = (heads + 2 * kv_heads) * dim, att_n = heads * dim;
    if (T < 1 || kv_heads < 1 || heads % kv_heads || hidden % 16 || dim % 8 || dim > 256 || rot_half % 8 ||
        2 * rot_half > dim || qkv_n % 16 || inter % 8 || span < 1)
        return -2;
    for (int64_t t = 0; t < T; t++)
        if (pos_of[t] >= span) return -2;
    for (int64_t i = 0; i < n_layers; i++)
        if (!ts_projection_fits(layers[i].qkv_format, hidden) || !ts_projection_fits(layers[i].out_format, att_n) ||
            !ts_projection_fits(layers[i].gate_up_format, hidden) || !ts_projection_fits(layers[i].down_format, inter) ||
            (layers[i].qkv_split > 0 &&
             (layers[i].qkv_format == TS_INT8 || layers[i].qkv_tail_format == TS_INT8 ||
              !ts_projection_fits(layers[i].qkv_tail_format, hidden) || layers[i].qkv_split >= qkv_n / 16)))
            return -2;
    const ts_pages pages = {table, max_blocks, block_tokens, num_blocks, half != 0};
    if (pages_check(&pages, T, slot_of, pos_of)) return -3;
    float *x = (float *)malloc((size_t)T * hidden * sizeof(float));
    float *qkv = (float *)malloc((size_t)T * qkv_n * sizeof(float));
    float *att = (float *)malloc((size_t)T * att_n * sizeof(float));
    float *gate_up = (float *)malloc((size_t)T * 2 * inter * sizeof(float));
    float *act = (float *)malloc((size_t)T * inter * sizeof(float));
    ts_phase *phases = (ts_phase *)aligned_alloc(64, (size_t)(n_layers > 0 ? n_layers : 1) * TS_PHASES * sizeof(ts_phase));
    /* The widest input a projection reads: hidden (qkv, gate_up), att_n (o), inter (down). */
    const int64_t k_max = hidden > inter ? (hidden > att_n ? hidden : att_n) : (inter > att_n ? inter : att_n);
    int failed = x == NULL || qkv == NULL || att == NULL || gate_up == NULL || act == NULL || phases == NULL;
    if (phases != NULL)
        for (int64_t i = 0; i < n_layers * TS_PHASES; i++) {
            atomic_init(&phases[i].taken, 0);
            atomic_init(&phases[i].done, 0);
            atomic_init(&phases[i].sleepers, 0);
        }
    /* Chunks of each phase. */
    const int threads = omp_get_max_threads();
    const int64_t s_tokens = ts_chunk(T, threads, 1), s_qkv = ts_chunk(qkv_n / 16, threads, 4);
    const int64_t s_hidden = ts_chunk(hidden / 16, threads, 4), s_gate_up = ts_chunk(2 * inter / 16, threads, 4);
    const int c_tokens = TS_CHUNKS(T, s_tokens), c_att = TS_CHUNKS_A_THREAD * threads;
    const int c_qkv = TS_CHUNKS(qkv_n / 16, s_qkv), c_hidden = TS_CHUNKS(hidden / 16, s_hidden);
    const int c_gate_up = TS_CHUNKS(2 * inter / 16, s_gate_up);
#pragma omp parallel if (!failed)
    {
        float *wf = w8_scratch(T, k_max);
        float *xs = (float *)malloc((size_t)gguf_scratch_floats(T, k_max) * sizeof(float)); /* GGUF blocks' */
        ts_att_scratch att_sc;
        void *att_mem = att_scratch(span, dim, &att_sc);
        /* A short pass: each thread computes the norms and the gated SiLU of every token
         * itself, into its own buffers, once it has taken a chunk of the projection that
         * reads them (see TS_OWN_GLUE). */
        const int own = T <= TS_OWN_GLUE;
        float *x_own = own ? (float *)malloc((size_t)T * hidden * sizeof(float)) : NULL;
        float *act_own = own ? (float *)malloc((size_t)T * inter * sizeof(float)) : NULL;
        float *const x_in = own ? x_own : x, *const act_in = own ? act_own : act;
        /* Every thread learns whether any lacks its scratch before the first phase. */
        if (att_mem == NULL || xs == NULL || (wf == NULL && w8_needs_scratch(T)) || (own && (x_own == NULL || act_own == NULL))) {
#pragma omp atomic write
            failed = 1;
        }
#pragma omp barrier
        int stop;
#pragma omp atomic read
        stop = failed;
        for (int64_t i = 0; i < n_layers && !stop; i++) {
            const ts_layer *L = &layers[i];
            const ts_qk qk = {L->q_norm, L->k_norm, L->qk_eps, rot_half, L->rotate};
            ts_phase *P = phases + i * TS_PHASES;
            ts_input in;
            int c, ready;
            if (!own) {
                for (; (c = ts_take(&P[0], c_tokens)) >= 0; ts_finish(&P[0], c_tokens)) {
                    const int64_t t0 = c * s_tokens, tn = t0 + s_tokens < T ? s_tokens : T - t0;
                    ts_rms_norm_rows(h + t0 * hidden, tn, hidden, hidden, L->attn_norm, L->attn_eps, x + t0 * hidden, hidden);
                }
                ts_wait(&P[0], c_tokens);
            }
            for (ready = 0; (c = ts_take(&P[1], c_qkv)) >= 0; ts_finish(&P[1], c_qkv)) {
                if (!ready) {
                    if (own) ts_rms_norm_rows(h, T, hidden, hidden, L->attn_norm, L->attn_eps, x_own, hidden);
                    in = ts_input_of(L->qkv_format, x_in, T, hidden, hidden, xs);
                    ready = 1;
                }
                ts_qkv_projection(L, &in, qkv, qkv_n, TS_SPAN(c, s_qkv, qkv_n / 16), wf);
            }
            ts_wait(&P[1], c_qkv);
            for (; (c = ts_take(&P[2], c_tokens)) >= 0; ts_finish(&P[2], c_tokens))
                rope_store_rows(qkv, TS_SPAN(c, s_tokens, T), qkv_n, heads, kv_heads, dim, &qk, cos_t,
                                sin_t, slot_of, pos_of, L->keys, L->values, &pages);
            ts_wait(&P[2], c_tokens);
            const ts_att a = {qkv, qkv_n, heads, kv_heads, dim, slot_of, pos_of, L->keys, L->values,
                              &pages, L->window, L->scaling, att, att_n};
            for (; (c = ts_take(&P[3], c_att)) >= 0; ts_finish(&P[3], c_att))
                attend_share(&a, T, c, c_att, &att_sc);
            ts_wait(&P[3], c_att);
            for (ready = 0; (c = ts_take(&P[4], c_hidden)) >= 0; ts_finish(&P[4], c_hidden)) {
                if (!ready) in = ts_input_of(L->out_format, att, T, att_n, att_n, xs), ready = 1;
                ts_projection(L->out_format, &in, L->out, L->out_scale, L->out_bias, h, hidden,
                              TS_SPAN(c, s_hidden, hidden / 16), wf, 1);
            }
            ts_wait(&P[4], c_hidden);
            if (!own) {
                for (; (c = ts_take(&P[5], c_tokens)) >= 0; ts_finish(&P[5], c_tokens)) {
                    const int64_t t0 = c * s_tokens, tn = t0 + s_tokens < T ? s_tokens : T - t0;
                    ts_rms_norm_rows(h + t0 * hidden, tn, hidden, hidden, L->mlp_norm, L->mlp_eps, x + t0 * hidden, hidden);
                }
                ts_wait(&P[5], c_tokens);
            }
            for (ready = 0; (c = ts_take(&P[6], c_gate_up)) >= 0; ts_finish(&P[6], c_gate_up)) {
                if (!ready) {
                    if (own) ts_rms_norm_rows(h, T, hidden, hidden, L->mlp_norm, L->mlp_eps, x_own, hidden);
                    in = ts_input_of(L->gate_up_format, x_in, T, hidden, hidden, xs);
                    ready = 1;
                }
                ts_projection(L->gate_up_format, &in, L->gate_up, L->gate_up_scale, L->gate_up_bias, gate_up,
                              2 * inter, TS_SPAN(c, s_gate_up, 2 * inter / 16), wf, 0);
            }
            ts_wait(&P[6], c_gate_up);
            if (!own) {
                for (; (c = ts_take(&P[7], c_tokens)) >= 0; ts_finish(&P[7], c_tokens)) {
                    const int64_t t0 = c * s_tokens, tn = t0 + s_tokens < T ? s_tokens : T - t0;
                    silu_mul_rows(gate_up + t0 * 2 * inter, tn, inter, act + t0 * inter);
                }
                ts_wait(&P[7], c_tokens);
            }
            for (ready = 0; (c = ts_take(&P[8], c_hidden)) >= 0; ts_finish(&P[8], c_hidden)) {
                if (!ready) {
                    if (own) silu_mul_rows(gate_up, T, inter, act_own);
                    in = ts_input_of(L->down_format, act_in, T, inter, inter, xs);
                    ready = 1;
                }
                ts_projection(L->down_format, &in, L->down, L->down_scale, L->down_bias, h, hidden,
                              TS_SPAN(c, s_hidden, hidden / 16), wf, 1);
            }
            ts_wait(&P[8], c_hidden);
        }
        free(wf);
        free(xs);
        free(att_mem);
        free(x_own);
        free(act_own);
    }
    free(x);
    free(qkv);
    free(att);
    free(gate_up);
    free(act);
    free(phases);
    return failed ? -1 : 0;
}

#undef TS_SPAN
#undef TS_CHUNKS

/* ---- sampling ------------------------------------------------------------------------
 * One token per row of logits [rows, vocab] (row stride ld), in one call instead of a
 * chain of vocabulary-wide torch operations (each ~0.1-0.5 ms on 49k logits x 8 rows, most
 * of it waking threads). Single-threaded: a row is ~50 us. A row's token depends on its
 * own logits, temperature and draw only. */

#define TS_CHUNK 64

/* e[j] = exp((x[j] - peak) * inv_t) for the n <= TS_CHUNK entries of one chunk (padded
 * with zeros to TS_CHUNK); returns their sum. */
static float chunk_exp(const float *x, int64_t n, float peak, float inv_t, float *e) {
    float padded[TS_CHUNK];
    const float *src = x;
    if (n < TS_CHUNK) {
        for (int64_t j = 0; j < TS_CHUNK; j++) padded[j] = j < n ? x[j] : -INFINITY;
        src = padded;
    }
    const __m256 m = _mm256_set1_ps(peak), it = _mm256_set1_ps(inv_t);
    __m256 total = _mm256_setzero_ps();
    for (int j = 0; j < TS_CHUNK; j += 8) {
        __m256 v = exp256(_mm256_mul_ps(_mm256_sub_ps(_mm256_loadu_ps(src + j), m), it));
        _mm256_storeu_ps(e + j, v);
        total = _mm256_add_ps(total, v);
    }
    return hsum256(total);
}

/* out[r]: inv_temperature[r] == 0: the first largest logit (greedy); otherwise the token
 * the draw u[r] in [0, 1) picks from softmax(logits * inv_temperature) by inverting its
 * cumulative sum (a token of probability zero, a masked -inf, is never picked); -1 when
 * every logit of the row is -inf. */
void ts_sample(const float *logits, int64_t rows, int64_t vocab, int64_t ld, const float *inv_temperature,
               const float *u, int64_t *out) {
    const int64_t chunks = (vocab + TS_CHUNK - 1) / TS_CHUNK;
    float *sums = (float *)malloc((size_t)chunks * sizeof(float));
    float e[TS_CHUNK];
    for (int64_t r = 0; r < rows; r++) {
        const float *x = logits + r * ld;
        __m256 vmax = _mm256_set1_ps(-INFINITY);
        int64_t j = 0;
        for (; j + 8 <= vocab; j += 8) vmax = _mm256_max_ps(vmax, _mm256_loadu_ps(x + j));
        float lanes[8], peak = -INFINITY;
        _mm256_storeu_ps(lanes, vmax);
        for (int l = 0; l < 8; l++) peak = lanes[l] > peak ? lanes[l] : peak;
        for (; j < vocab; j++) peak = x[j] > peak ? x[j] : peak;
        if (peak == -INFINITY) {
            out[r] = -1;
            continue;
        }
        if (inv_temperature[r] == 0.0f) {
            int64_t best = 0;
            while (x[best] != peak) best++;
            out[r] = best;
            continue;
        }
        double total = 0.0;
        for (int64_t c = 0; c < chunks; c++) {
            const int64_t n = vocab - c * TS_CHUNK < TS_CHUNK ? vocab - c * TS_CHUNK : TS_CHUNK;
            sums[c] = chunk_exp(x + c * TS_CHUNK, n, peak, inv_temperature[r], e);
            total += sums[c];
        }
        const double target = (double)u[r] * total;
        double below = 0.0;
        int64_t c = 0;
        while (c < chunks && below + sums[c] <= target) below += sums[c++];
        if (c == chunks) /* the draw rounded up to the total: the last chunk with any mass */
            for (c = chunks - 1; sums[c] == 0.0f; c--) {
            }
        const int64_t base = c * TS_CHUNK;
        const int64_t n = vocab - base < TS_CHUNK ? vocab - base : TS_CHUNK;
        chunk_exp(x + base, n, peak, inv_temperature[r], e);
        /* The first token whose cumulative mass passes the draw; if rounding inside the
         * chunk leaves none, the chunk's last token with any mass (there is one). */
        int64_t pick = -1, last = -1;
        for (int64_t k = 0; k < n && pick < 0; k++) {
            if (e[k] == 0.0f) continue;
            last = k;
            below += e[k];
            if (below > target) pick = k;
        }
        out[r] = base + (pick >= 0 ? pick : last);
    }
    free(sums);
}

/* ---- grammar masks -------------------------------------------------------------------
 * logits[r, j] = -inf where bit j % 32 of mask[r, j / 32] is 0 (1: allowed), for the n rows
 * listed in rows_of (a logits row and its mask row share the index); columns past
 * 32 * words are disallowed too. The torch version (shifts, a bool tensor, masked_fill)
 * took 1.6 ms for 8 rows of 49k logits, most of it waking threads; this is ~20 us a row. */
void ts_apply_bitmask(float *logits, int64_t vocab, int64_t ld, const int32_t *mask, int64_t words,
                      int64_t ld_mask, const int64_t *rows_of, int64_t n) {
    const __m256 ninf = _mm256_set1_ps(-INFINITY);
    const int64_t covered = words * 32 < vocab ? words * 32 : vocab;
    for (int64_t i = 0; i < n; i++) {
        float *x = logits + rows_of[i] * ld;
        const int32_t *m = mask + rows_of[i] * ld_mask;
        for (int64_t base = 0; base < covered; base += 32) {
            const uint32_t bits = (uint32_t)m[base / 32];
            if (bits == 0xFFFFFFFFu) continue;
            if (bits == 0 && base + 32 <= covered) {
                for (int k = 0; k < 32; k += 8) _mm256_storeu_ps(x + base + k, ninf);
                continue;
            }
            for (int64_t b = 0; b < 32 && base + b < covered; b++)
                if (!((bits >> b) & 1u)) x[base + b] = -INFINITY;
        }
        for (int64_t j = covered; j < vocab; j++) x[j] = -INFINITY;
    }
}
