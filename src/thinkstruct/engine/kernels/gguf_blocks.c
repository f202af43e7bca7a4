/* GGUF weight blocks as the file ships them (Q4_0, Q4_1, Q5_0, Q5_1, Q8_0, Q4_K, Q6_K), multiplied without
 * dequantizing the matrix: included by cpu_kernels.c (after the int8 kernels, whose helpers
 * it uses) into the same library.
 *
 * ggml's blocks hold 32 weights of one row: Q4_0 an f16 scale d and 16 bytes of nibbles,
 * w = d * (q - 8); Q4_1 f16 d and f16 m, w = d * q + m; Q8_0 f16 d and 32 int8, w = d * q.
 * Byte j of a Q4 block holds element j in its low nibble and element j + 16 in its high
 * one. gguf_weights.py repacks a [N, K] tensor's blocks (N % 16 == 0, K % 32 == 0) into
 * groups of 16 output rows x 32 inputs, [N / 16][K / 32] groups, each:
 *   Q4_0: u16 d[16]; u8 q[8][16][2]            288 bytes
 *   Q4_1: u16 d[16]; u16 m[16]; u8 q[8][16][2] 320 bytes
 *         (q[c][r][i]: row r's byte 2c + i, i.e. its elements 2c + i and 16 + 2c + i)
 *   Q8_0: u16 d[16]; i8 q[16][16][2]           544 bytes (q[c][r][i]: row r's element 2c + i)
 *   Q5_0: u16 d[16]; u8 q[8][16][2]; u8 qh[4][16]            352 bytes
 *   Q5_1: u16 d[16]; u16 m[16]; u8 q[8][16][2]; u8 qh[4][16] 384 bytes
 *         (Q4_0's and Q4_1's and a fifth bit: w = d (q - 16), w = d q + m; the file's 32
 *         high bits of a block as qh[k][r]: its low nibble the bits of elements 2c, 2c + 1,
 *         16 + 2c, 16 + 2c + 1 for c = 2k, its high nibble those for c = 2k + 1)
 *   Q4_K: u16 d[16]; u16 dmin[16]; u8 sc[16]; u8 mn[16]; u8 q[8][16][2]   352 bytes
 * Q4_K's super-blocks of 256 weights (f16 d and dmin, 6-bit scales sc and mins mn for
 * each 32, w = d sc q - dmin mn) are Q4_1 blocks of 32 with d = d sc and m = -dmin mn,
 * both computed here in float32 (exact: an f16 times a 6-bit integer), from the
 * super-block's d and dmin and the 32's sc and mn, each block holding its own copy (0.6875
 * bytes a weight against the file's 0.5625; gguf_weights.py regroups them).
 *   Q6_K: u16 d[16]; i8 sc[2][16]; u8 ql[8][16][2]; u8 qh[8][16]   448 bytes
 * Q6_K's super-blocks of 256 (f16 d, an int8 scale sc for each 16, 6-bit q, w = d sc (q -
 * 32)) keep their bytes but per block of 32: the super-block's d, the two 16s' scales,
 * the low 4 bits of each q as Q4's nibbles (ql, the same order) and the high 2 bits of
 * elements 2c, 2c + 1, 16 + 2c, 16 + 2c + 1 in bits 0-1, 2-3, 4-5, 6-7 of qh[c][r] (0.875
 * bytes a weight against the file's 0.82). The integer sum is split at 16: elements 0-15
 * (the low nibbles) and 16-31 (the high ones), each scaled by d * its sc (exact).
 * the file's bytes reordered so that one load widened to 16-bit holds 2 consecutive quants
 * of each of 16 rows: one int32 lane of a pairwise dot-product instruction a row.
 *
 * Activations are rounded to int16 per row and block of 32 (gq_quantize): dx = max |x| /
 * 32767, xq = round(x * 32767 / max |x|) (ties to even; |error| <= dx / 2, 1/65534 of the
 * block's largest activation), with the block's float sum of x, xs. Each output n of a row
 * is then, in this order and on every path:
 *   for each block b:
 *     i = sum_k xq[32b + k] * q[n, 32b + k]       (integers: exact, any order)
 *         minus 8 sum xq (Q4_0)
 *     acc = fma(d * dx, (float)i, acc); then Q4_1: acc = fma(m, xs, acc)
 *   y = acc (+ bias[n]) (out + y where accumulating: a residual connection)
 * which is sum_k x[k] * w[n, k] of the file's weights up to that rounding (about float32's
 * own for the sums of a few hundred products) and float summation order. (llama.cpp rounds
 * the activations to int8 instead, 256 times coarser: measured on SmolLM2's Q4_1 against
 * its float32 model, 92.4 % top-1 and KL 0.014 nats where int16 keeps the float32 model's
 * answers.) A row's result depends on its own activations only; the AVX-512 VNNI path
 * (vpdpwssd) and the AVX2 path (vpmaddwd) compute the same integers and each lane's float
 * operations alike: the same bits. */

#define TS_INT8 0
#define TS_Q4_0 1
#define TS_Q4_1 2
#define TS_Q8_0 3
#define TS_Q4_K 4
#define TS_Q6_K 5
#define TS_Q5_0 6
#define TS_Q5_1 7

#define TS_IS_Q5(fmt) ((fmt) == TS_Q5_0 || (fmt) == TS_Q5_1)

/* Formats with Q4_1's form, w = d q + m (Q4_K's d and m computed from its fields). */
#define TS_HAS_MIN(fmt) ((fmt) == TS_Q4_1 || (fmt) == TS_Q5_1 || (fmt) == TS_Q4_K)
/* Where a format's quants start in a group (the nibbles, or low 4 bits, for the 4-, 5-
 * and 6-bit ones). */
#define TS_QOFF(fmt) ((fmt) == TS_Q4_K ? 96 : (fmt) == TS_Q4_1 || (fmt) == TS_Q5_1 || (fmt) == TS_Q6_K ? 64 : 32)
/* Where Q5's fifth bits and Q6_K's high 2 bits start in a group. */
#define TS_HOFF(fmt) ((fmt) == TS_Q5_1 || (fmt) == TS_Q6_K ? 320 : 288)

/* Bytes of one group of 16 rows x 32 inputs; 0 for a format these kernels do not run. */
static int64_t gguf_group_bytes(int64_t fmt) {
    return fmt == TS_Q4_0   ? 288
           : fmt == TS_Q4_1 ? 320
           : fmt == TS_Q8_0 ? 544
           : fmt == TS_Q4_K ? 352
           : fmt == TS_Q6_K ? 448
           : fmt == TS_Q5_0 ? 352
           : fmt == TS_Q5_1 ? 384
                            : 0;
}

/* Whether a projection of this format can take K inputs. */
static int ts_projection_fits(int64_t fmt, int64_t K) {
    return fmt == TS_INT8 || (gguf_group_bytes(fmt) > 0 && K % 32 == 0);
}

/* M rows of activations rounded per block of 32 (nb = K / 32 blocks a row): xq [M][K]
 * int16, and per row and block dx (the scale), xs (the float sum of x: Q4_1's m term) and
 * xc (the integer subtracted from the dot product: Q4_0's 8 times the sum of xq). */
typedef struct {
    const int16_t *xq;
    const float *dx, *xs;
    const int32_t *xc;
} gq_acts;

/* Floats of scratch gq_quantize needs for M rows of up to K inputs. */
static int64_t gq_quantize_floats(int64_t M, int64_t K) { return M * (3 * (K / 32) + K / 2) + 16; }

/* x [M, K] (row stride ld_x) rounded into scratch (gq_quantize_floats(M, K) floats) for
 * the blocks of any format, as the comment at the top says. One code for every path: the same bits.
 * xs = ((x[0:8] + x[8:16]) + x[16:24]) + x[24:32] lane by lane, summed by hsum256. */
static gq_acts gq_quantize(const float *x, int64_t M, int64_t K, int64_t ld_x, float *scratch) {
    const int64_t nb = K / 32;
    float *dx = scratch, *xs = scratch + M * nb;
    int32_t *xc = (int32_t *)(scratch + 2 * M * nb);
    int16_t *xq = (int16_t *)(scratch + 3 * M * nb);
    const int offset = 8; /* Q4_0's; the other formats do not read xc (one rounding for all) */
    const __m256 sign = _mm256_set1_ps(-0.0f);
    for (int64_t m = 0; m < M; m++)
        for (int64_t b = 0; b < nb; b++) {
            const float *p = x + m * ld_x + 32 * b;
            const __m256 v0 = _mm256_loadu_ps(p), v1 = _mm256_loadu_ps(p + 8);
            const __m256 v2 = _mm256_loadu_ps(p + 16), v3 = _mm256_loadu_ps(p + 24);
            xs[m * nb + b] = hsum256(_mm256_add_ps(_mm256_add_ps(_mm256_add_ps(v0, v1), v2), v3));
            __m256 a = _mm256_max_ps(_mm256_max_ps(_mm256_andnot_ps(sign, v0), _mm256_andnot_ps(sign, v1)),
                                     _mm256_max_ps(_mm256_andnot_ps(sign, v2), _mm256_andnot_ps(sign, v3)));
            __m128 h = _mm_max_ps(_mm256_castps256_ps128(a), _mm256_extractf128_ps(a, 1));
            h = _mm_max_ps(h, _mm_movehl_ps(h, h));
            h = _mm_max_ss(h, _mm_movehdup_ps(h));
            const float amax = _mm_cvtss_f32(h);
            dx[m * nb + b] = amax / 32767.0f;
            const __m256 id = _mm256_set1_ps(amax > 0.0f ? 32767.0f / amax : 0.0f);
            const __m256i q0 = _mm256_cvtps_epi32(_mm256_mul_ps(v0, id)), q1 = _mm256_cvtps_epi32(_mm256_mul_ps(v1, id));
            const __m256i q2 = _mm256_cvtps_epi32(_mm256_mul_ps(v2, id)), q3 = _mm256_cvtps_epi32(_mm256_mul_ps(v3, id));
            int16_t *o = xq + m * K + 32 * b;
            _mm256_storeu_si256((__m256i *)o, _mm256_permute4x64_epi64(_mm256_packs_epi32(q0, q1), 0xd8));
            _mm256_storeu_si256((__m256i *)(o + 16), _mm256_permute4x64_epi64(_mm256_packs_epi32(q2, q3), 0xd8));
            __m256i s = _mm256_add_epi32(_mm256_add_epi32(q0, q1), _mm256_add_epi32(q2, q3));
            __m128i t = _mm_add_epi32(_mm256_castsi256_si128(s), _mm256_extracti128_si256(s, 1));
            t = _mm_add_epi32(t, _mm_shuffle_epi32(t, 0x4e));
            t = _mm_add_epi32(t, _mm_shuffle_epi32(t, 0xb1));
            xc[m * nb + b] = offset * _mm_cvtsi128_si32(t);
        }
    return (gq_acts){xq, dx, xs, xc};
}

/* Two int16 activations as one int32 (to broadcast to every lane). */
static inline int32_t gq_pair(const int16_t *p) {
    int32_t v;
    __builtin_memcpy(&v, p, 4);
    return v;
}

/* Q4_K's d = d sc and m = -(dmin mn) of a group's 16 rows (AVX2: rows 8h to 8h + 7):
 * float32 products of an f16 and a 6-bit integer, exact. */
static inline __attribute__((always_inline)) __m256 gq_q4k_d256(const uint8_t *blk, int h) {
    return _mm256_mul_ps(_mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(blk + 16 * h))),
                         _mm256_cvtepi32_ps(_mm256_cvtepu8_epi32(_mm_loadl_epi64((const __m128i *)(blk + 64 + 8 * h)))));
}
static inline __attribute__((always_inline)) __m256 gq_q4k_m256(const uint8_t *blk, int h) {
    const __m256 x = _mm256_mul_ps(_mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(blk + 32 + 16 * h))),
                                   _mm256_cvtepi32_ps(_mm256_cvtepu8_epi32(_mm_loadl_epi64((const __m128i *)(blk + 80 + 8 * h)))));
    return _mm256_xor_ps(x, _mm256_set1_ps(-0.0f));
}

/* ---- AVX-512 VNNI: groups (side by side) x rows, every row's 16 outputs of a group in
 * one register. fmt, groups, rows and accumulate are constants at each call (folded
 * away). One integer sum a block for each group and row: splitting a block's sum over
 * two registers for one row (4 chains -> 8) measured 3 % slower. */
#ifndef TS_GQ_PREFETCH
#define TS_GQ_PREFETCH 1
#endif
#define TS_VNNI __attribute__((target("avx512f,avx512bw,avx512vl,avx512vnni,avx2,fma,f16c")))

static inline __attribute__((always_inline)) TS_VNNI __m512 gq_q4k_d512(const uint8_t *blk) {
    return _mm512_mul_ps(_mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)blk)),
                         _mm512_cvtepi32_ps(_mm512_cvtepu8_epi32(_mm_loadu_si128((const __m128i *)(blk + 64)))));
}
static inline __attribute__((always_inline)) TS_VNNI __m512 gq_q4k_m512(const uint8_t *blk) {
    const __m512 x = _mm512_mul_ps(_mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)(blk + 32))),
                                   _mm512_cvtepi32_ps(_mm512_cvtepu8_epi32(_mm_loadu_si128((const __m128i *)(blk + 80)))));
    return _mm512_castsi512_ps(_mm512_xor_si512(_mm512_castps_si512(x), _mm512_set1_epi32((int)0x80000000)));
}

static inline __attribute__((always_inline)) TS_VNNI void gq_tile512(const int fmt, const int groups,
                                                                     const int rows, const int accumulate,
                                                                     const gq_acts a, int64_t K,
                                                                     const uint8_t *w, const float *bias,
                                                                     float *out, int64_t ld_out) {
    const int64_t nb = K / 32, gb = gguf_group_bytes(fmt);
    const int qoff = TS_QOFF(fmt), hoff = TS_HOFF(fmt);
    const __m512i low = _mm512_set1_epi16(15), one = _mm512_set1_epi32(0x00100010);
    __m512 acc[4][8];
    _Pragma("GCC unroll 8") for (int g = 0; g < groups; g++)
        _Pragma("GCC unroll 8") for (int r = 0; r < rows; r++) acc[g][r] = _mm512_setzero_ps();
    for (int64_t b = 0; b < nb; b++) {
        const int16_t *xb = a.xq + 32 * b;
        if (TS_GQ_PREFETCH)
            _Pragma("GCC unroll 8") for (int g = 0; g < groups; g++) {
                const char *ahead = (const char *)w + ((g + groups) * nb + b) * gb;
                for (int64_t line = 0; line < gb; line += 64) _mm_prefetch(ahead + line, _MM_HINT_T0);
            }
        __m512i s[4][8], t[4][8]; /* t: Q6_K's second 16 */
        _Pragma("GCC unroll 8") for (int g = 0; g < groups; g++)
            _Pragma("GCC unroll 8") for (int r = 0; r < rows; r++) s[g][r] = t[g][r] = _mm512_setzero_si512();
        if (fmt == TS_Q6_K) {
            const __m512i two = _mm512_set1_epi32(0x00300030), bias = _mm512_set1_epi16(32);
            _Pragma("GCC unroll 8") for (int c = 0; c < 8; c++)
                _Pragma("GCC unroll 8") for (int g = 0; g < groups; g++) {
                    const uint8_t *blk = w + (g * nb + b) * gb;
                    const __m512i q = _mm512_cvtepu8_epi16(_mm256_loadu_si256((const __m256i *)(blk + qoff + 32 * c)));
                    const __m512i h = _mm512_cvtepu8_epi32(_mm_loadu_si128((const __m128i *)(blk + hoff + 16 * c)));
                    const __m512i hl = _mm512_and_si512(_mm512_or_si512(_mm512_slli_epi32(h, 4), _mm512_slli_epi32(h, 18)), two);
                    const __m512i hh = _mm512_and_si512(_mm512_or_si512(h, _mm512_slli_epi32(h, 14)), two);
                    const __m512i lo = _mm512_sub_epi16(_mm512_or_si512(_mm512_and_si512(q, low), hl), bias);
                    const __m512i hi = _mm512_sub_epi16(_mm512_or_si512(_mm512_srli_epi16(q, 4), hh), bias);
                    _Pragma("GCC unroll 8") for (int r = 0; r < rows; r++) {
                        s[g][r] = _mm512_dpwssd_epi32(s[g][r], lo, _mm512_set1_epi32(gq_pair(xb + r * K + 2 * c)));
                        t[g][r] = _mm512_dpwssd_epi32(t[g][r], hi, _mm512_set1_epi32(gq_pair(xb + r * K + 16 + 2 * c)));
                    }
                }
        } else if (fmt == TS_Q8_0) {
            _Pragma("GCC unroll 16") for (int c = 0; c < 16; c++)
                _Pragma("GCC unroll 8") for (int g = 0; g < groups; g++) {
                    const __m512i q = _mm512_cvtepi8_epi16(
                        _mm256_loadu_si256((const __m256i *)(w + (g * nb + b) * gb + 32 + 32 * c)));
                    _Pragma("GCC unroll 8") for (int r = 0; r < rows; r++)
                        s[g][r] = _mm512_dpwssd_epi32(s[g][r], q, _mm512_set1_epi32(gq_pair(xb + r * K + 2 * c)));
                }
        } else {
            _Pragma("GCC unroll 8") for (int c = 0; c < 8; c++)
                _Pragma("GCC unroll 8") for (int g = 0; g < groups; g++) {
                    const __m512i q = _mm512_cvtepu8_epi16(
                        _mm256_loadu_si256((const __m256i *)(w + (g * nb + b) * gb + qoff + 32 * c)));
                    __m512i lo = _mm512_and_si512(q, low), hi = _mm512_srli_epi16(q, 4);
                    if (TS_IS_Q5(fmt)) { /* the fifth bits: see the layout at the top */
                        __m512i h = _mm512_cvtepu8_epi32(
                            _mm_loadu_si128((const __m128i *)(w + (g * nb + b) * gb + hoff + 16 * (c / 2))));
                        if (c & 1) h = _mm512_srli_epi32(h, 4);
                        lo = _mm512_or_si512(lo, _mm512_and_si512(_mm512_or_si512(_mm512_slli_epi32(h, 4), _mm512_slli_epi32(h, 19)), one));
                        hi = _mm512_or_si512(hi, _mm512_and_si512(_mm512_or_si512(_mm512_slli_epi32(h, 2), _mm512_slli_epi32(h, 17)), one));
                    }
                    _Pragma("GCC unroll 8") for (int r = 0; r < rows; r++) {
                        s[g][r] = _mm512_dpwssd_epi32(s[g][r], lo, _mm512_set1_epi32(gq_pair(xb + r * K + 2 * c)));
                        s[g][r] = _mm512_dpwssd_epi32(s[g][r], hi, _mm512_set1_epi32(gq_pair(xb + r * K + 16 + 2 * c)));
                    }
                }
        }
        _Pragma("GCC unroll 8") for (int g = 0; g < groups; g++) {
            const uint8_t *blk = w + (g * nb + b) * gb;
            const __m512 d = fmt == TS_Q4_K ? gq_q4k_d512(blk) : _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)blk));
            if (fmt == TS_Q6_K) {
                const __m512 d0 = _mm512_mul_ps(d, _mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(_mm_loadu_si128((const __m128i *)(blk + 32)))));
                const __m512 d1 = _mm512_mul_ps(d, _mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(_mm_loadu_si128((const __m128i *)(blk + 48)))));
                _Pragma("GCC unroll 8") for (int r = 0; r < rows; r++) {
                    const __m512 dx = _mm512_set1_ps(a.dx[r * nb + b]);
                    acc[g][r] = _mm512_fmadd_ps(_mm512_mul_ps(d0, dx), _mm512_cvtepi32_ps(s[g][r]), acc[g][r]);
                    acc[g][r] = _mm512_fmadd_ps(_mm512_mul_ps(d1, dx), _mm512_cvtepi32_ps(t[g][r]), acc[g][r]);
                }
                continue;
            }
            _Pragma("GCC unroll 8") for (int r = 0; r < rows; r++) {
                __m512i i = s[g][r];
                if (fmt == TS_Q4_0) i = _mm512_sub_epi32(i, _mm512_set1_epi32(a.xc[r * nb + b]));
                if (fmt == TS_Q5_0) i = _mm512_sub_epi32(i, _mm512_set1_epi32(2 * a.xc[r * nb + b]));
                const __m512 dd = _mm512_mul_ps(d, _mm512_set1_ps(a.dx[r * nb + b]));
                acc[g][r] = _mm512_fmadd_ps(dd, _mm512_cvtepi32_ps(i), acc[g][r]);
            }
            if (TS_HAS_MIN(fmt)) {
                const __m512 m = fmt == TS_Q4_K ? gq_q4k_m512(blk)
                                                : _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)(blk + 32)));
                _Pragma("GCC unroll 8") for (int r = 0; r < rows; r++)
                    acc[g][r] = _mm512_fmadd_ps(m, _mm512_set1_ps(a.xs[r * nb + b]), acc[g][r]);
            }
        }
    }
    _Pragma("GCC unroll 8") for (int g = 0; g < groups; g++)
        _Pragma("GCC unroll 8") for (int r = 0; r < rows; r++) {
            float *o = out + r * ld_out + 16 * g;
            __m512 y = acc[g][r];
            if (bias != NULL) y = _mm512_add_ps(y, _mm512_loadu_ps(bias + 16 * g));
            if (accumulate) y = _mm512_add_ps(_mm512_loadu_ps(o), y);
            _mm512_storeu_ps(o, y);
        }
}

/* ---- AVX2: one group x rows (<= 2), each 16 outputs in two registers of 8 lanes: the
 * same integers by vpmaddwd (no pair reaches its saturating case, -32768 squared). */
static inline __attribute__((always_inline)) void gq_tile256(const int fmt, const int rows, const int accumulate,
                                                             const gq_acts a, int64_t K, const uint8_t *w,
                                                             const float *bias, float *out, int64_t ld_out) {
    const int64_t nb = K / 32, gb = gguf_group_bytes(fmt);
    const int qoff = TS_QOFF(fmt), hoff = TS_HOFF(fmt);
    const __m256i low = _mm256_set1_epi16(15), one = _mm256_set1_epi32(0x00100010);
    __m256 acc[2][2];
    for (int r = 0; r < rows; r++) acc[r][0] = acc[r][1] = _mm256_setzero_ps();
    for (int64_t b = 0; b < nb; b++) {
        const int16_t *xb = a.xq + 32 * b;
        const uint8_t *blk = w + b * gb;
        __m256i s[2][2], t[2][2]; /* t: Q6_K's second 16 */
        for (int r = 0; r < rows; r++) s[r][0] = s[r][1] = t[r][0] = t[r][1] = _mm256_setzero_si256();
        if (fmt == TS_Q6_K) {
            const __m256i two = _mm256_set1_epi32(0x00300030), bias = _mm256_set1_epi16(32);
            for (int c = 0; c < 8; c++)
                for (int h = 0; h < 2; h++) {
                    const __m256i q = _mm256_cvtepu8_epi16(_mm_loadu_si128((const __m128i *)(blk + qoff + 32 * c + 16 * h)));
                    const __m256i e = _mm256_cvtepu8_epi32(_mm_loadl_epi64((const __m128i *)(blk + hoff + 16 * c + 8 * h)));
                    const __m256i hl = _mm256_and_si256(_mm256_or_si256(_mm256_slli_epi32(e, 4), _mm256_slli_epi32(e, 18)), two);
                    const __m256i hh = _mm256_and_si256(_mm256_or_si256(e, _mm256_slli_epi32(e, 14)), two);
                    const __m256i lo = _mm256_sub_epi16(_mm256_or_si256(_mm256_and_si256(q, low), hl), bias);
                    const __m256i hi = _mm256_sub_epi16(_mm256_or_si256(_mm256_srli_epi16(q, 4), hh), bias);
                    for (int r = 0; r < rows; r++) {
                        s[r][h] = _mm256_add_epi32(
                            s[r][h], _mm256_madd_epi16(lo, _mm256_set1_epi32(gq_pair(xb + r * K + 2 * c))));
                        t[r][h] = _mm256_add_epi32(
                            t[r][h], _mm256_madd_epi16(hi, _mm256_set1_epi32(gq_pair(xb + r * K + 16 + 2 * c))));
                    }
                }
        } else if (fmt == TS_Q8_0) {
            for (int c = 0; c < 16; c++)
                for (int h = 0; h < 2; h++) {
                    const __m256i q = _mm256_cvtepi8_epi16(_mm_loadu_si128((const __m128i *)(blk + 32 + 32 * c + 16 * h)));
                    for (int r = 0; r < rows; r++)
                        s[r][h] = _mm256_add_epi32(
                            s[r][h], _mm256_madd_epi16(q, _mm256_set1_epi32(gq_pair(xb + r * K + 2 * c))));
                }
        } else {
            for (int c = 0; c < 8; c++)
                for (int h = 0; h < 2; h++) {
                    const __m256i q =
                        _mm256_cvtepu8_epi16(_mm_loadu_si128((const __m128i *)(blk + qoff + 32 * c + 16 * h)));
                    __m256i lo = _mm256_and_si256(q, low), hi = _mm256_srli_epi16(q, 4);
                    if (TS_IS_Q5(fmt)) {
                        __m256i e = _mm256_cvtepu8_epi32(_mm_loadl_epi64((const __m128i *)(blk + hoff + 16 * (c / 2) + 8 * h)));
                        if (c & 1) e = _mm256_srli_epi32(e, 4);
                        lo = _mm256_or_si256(lo, _mm256_and_si256(_mm256_or_si256(_mm256_slli_epi32(e, 4), _mm256_slli_epi32(e, 19)), one));
                        hi = _mm256_or_si256(hi, _mm256_and_si256(_mm256_or_si256(_mm256_slli_epi32(e, 2), _mm256_slli_epi32(e, 17)), one));
                    }
                    for (int r = 0; r < rows; r++) {
                        s[r][h] = _mm256_add_epi32(
                            s[r][h], _mm256_madd_epi16(lo, _mm256_set1_epi32(gq_pair(xb + r * K + 2 * c))));
                        s[r][h] = _mm256_add_epi32(
                            s[r][h], _mm256_madd_epi16(hi, _mm256_set1_epi32(gq_pair(xb + r * K + 16 + 2 * c))));
                    }
                }
        }
        for (int h = 0; h < 2; h++) {
            const __m256 d = fmt == TS_Q4_K ? gq_q4k_d256(blk, h)
                                            : _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(blk + 16 * h)));
            if (fmt == TS_Q6_K) {
                const __m256 d0 = _mm256_mul_ps(d, _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(_mm_loadl_epi64((const __m128i *)(blk + 32 + 8 * h)))));
                const __m256 d1 = _mm256_mul_ps(d, _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(_mm_loadl_epi64((const __m128i *)(blk + 48 + 8 * h)))));
                for (int r = 0; r < rows; r++) {
                    const __m256 dx = _mm256_set1_ps(a.dx[r * nb + b]);
                    acc[r][h] = _mm256_fmadd_ps(_mm256_mul_ps(d0, dx), _mm256_cvtepi32_ps(s[r][h]), acc[r][h]);
                    acc[r][h] = _mm256_fmadd_ps(_mm256_mul_ps(d1, dx), _mm256_cvtepi32_ps(t[r][h]), acc[r][h]);
                }
                continue;
            }
            for (int r = 0; r < rows; r++) {
                __m256i i = s[r][h];
                if (fmt == TS_Q4_0) i = _mm256_sub_epi32(i, _mm256_set1_epi32(a.xc[r * nb + b]));
                if (fmt == TS_Q5_0) i = _mm256_sub_epi32(i, _mm256_set1_epi32(2 * a.xc[r * nb + b]));
                const __m256 dd = _mm256_mul_ps(d, _mm256_set1_ps(a.dx[r * nb + b]));
                acc[r][h] = _mm256_fmadd_ps(dd, _mm256_cvtepi32_ps(i), acc[r][h]);
            }
            if (TS_HAS_MIN(fmt)) {
                const __m256 m = fmt == TS_Q4_K ? gq_q4k_m256(blk, h)
                                                : _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(blk + 32 + 16 * h)));
                for (int r = 0; r < rows; r++)
                    acc[r][h] = _mm256_fmadd_ps(m, _mm256_set1_ps(a.xs[r * nb + b]), acc[r][h]);
            }
        }
    }
    for (int r = 0; r < rows; r++)
        for (int h = 0; h < 2; h++) {
            float *o = out + r * ld_out + 8 * h;
            __m256 y = acc[r][h];
            if (bias != NULL) y = _mm256_add_ps(y, _mm256_loadu_ps(bias + 8 * h));
            if (accumulate) y = _mm256_add_ps(_mm256_loadu_ps(o), y);
            _mm256_storeu_ps(o, y);
        }
}

/* 1: the AVX-512 VNNI tiles run (avx512_on() and the CPU has VNNI). */
static int gq_vnni_on(void) {
    static int vnni = -1;
    if (vnni < 0) vnni = __builtin_cpu_supports("avx512vnni");
    return vnni && avx512_on();
}

/* Rows (M <= 8) of a against `groups` groups of 16 outputs from w, AVX-512 VNNI. */
static inline __attribute__((always_inline)) TS_VNNI void gq_run512_of(const int fmt, const int groups,
                                                                       const int accumulate, const gq_acts a,
                                                                       int64_t M, int64_t K, const uint8_t *w,
                                                                       const float *bias, float *out,
                                                                       int64_t ld_out) {
#define TS_GQ(n)                                                                                   \
    case n:                                                                                        \
        gq_tile512(fmt, groups, n, accumulate, a, K, w, bias, out, ld_out);                        \
        break;
    if (groups == 4) {
        switch (M) { TS_GQ(1) TS_GQ(2) }
    } else if (groups == 2) {
        switch (M) { TS_GQ(1) TS_GQ(2) TS_GQ(3) TS_GQ(4) TS_GQ(8) }
    } else {
        switch (M) { TS_GQ(1) TS_GQ(2) TS_GQ(3) TS_GQ(4) TS_GQ(5) TS_GQ(6) TS_GQ(7) TS_GQ(8) }
    }
#undef TS_GQ
}

/* gq_run512_of for each format, a function of its own (as gcc's clones of a function
 * called with constants were): the formats made constants here, not left to that
 * cloning, which stops at a share of the library's size (with attention's tiles added
 * it left one format's tiles generic: SmolLM2's 200-token GGUF prefill 16 % slower).
 * The three formats switched inside one function ran that prefill at 0.69x; accumulate
 * a constant too made the build 5-9x longer. */
#define TS_GQ_FMT(name, f)                                                                         \
    static __attribute__((noinline)) TS_VNNI void name(const int groups, const int accumulate,     \
                                                       const gq_acts a, int64_t M, int64_t K,      \
                                                       const uint8_t *w, const float *bias,        \
                                                       float *out, int64_t ld_out) {               \
        gq_run512_of(f, groups, accumulate, a, M, K, w, bias, out, ld_out);                        \
    }
TS_GQ_FMT(gq_run512_q4_0, TS_Q4_0)
TS_GQ_FMT(gq_run512_q4_1, TS_Q4_1)
TS_GQ_FMT(gq_run512_q8_0, TS_Q8_0)
TS_GQ_FMT(gq_run512_q4_k, TS_Q4_K)
TS_GQ_FMT(gq_run512_q6_k, TS_Q6_K)
TS_GQ_FMT(gq_run512_q5_0, TS_Q5_0)
TS_GQ_FMT(gq_run512_q5_1, TS_Q5_1)
#undef TS_GQ_FMT

static inline void gq_run512(const int fmt, const int groups, const int accumulate, const gq_acts a, int64_t M,
                             int64_t K, const uint8_t *w, const float *bias, float *out, int64_t ld_out) {
    if (fmt == TS_Q4_0) gq_run512_q4_0(groups, accumulate, a, M, K, w, bias, out, ld_out);
    else if (fmt == TS_Q4_1) gq_run512_q4_1(groups, accumulate, a, M, K, w, bias, out, ld_out);
    else if (fmt == TS_Q4_K) gq_run512_q4_k(groups, accumulate, a, M, K, w, bias, out, ld_out);
    else if (fmt == TS_Q6_K) gq_run512_q6_k(groups, accumulate, a, M, K, w, bias, out, ld_out);
    else if (fmt == TS_Q5_0) gq_run512_q5_0(groups, accumulate, a, M, K, w, bias, out, ld_out);
    else if (fmt == TS_Q5_1) gq_run512_q5_1(groups, accumulate, a, M, K, w, bias, out, ld_out);
    else gq_run512_q8_0(groups, accumulate, a, M, K, w, bias, out, ld_out);
}

/* a's rows from m on. */
static inline gq_acts gq_from(const gq_acts a, int64_t m, int64_t K) {
    const int64_t nb = K / 32;
    return (gq_acts){a.xq + m * K, a.dx + m * nb, a.xs + m * nb, a.xc + m * nb};
}

/* Output blocks [b_lo, b_hi) of 16 (row groups) of the M quantized rows a times the
 * packed weights of format fmt (fmt, accumulate constant at each call; see gguf_blocks).
 * AVX-512: 1-2 rows take 4 groups side by side, more rows 8 at a time over 2 groups
 * (then 4, then what is left; an odd last group: 8 rows at a time over it). 8 rows x 1
 * group spilled registers: 4 x 2 measured 1.9x its speed for Q4_1 at 8 rows, 2.5-3x at 64
 * (one thread, gguf_matvec.py). 8 x 2, which reads each group's widened quants for twice
 * the rows, took 0.91x the time of 4 x 2 for SmolLM2's Q4_1 layers at 8 rows and 0.85-0.93x
 * at 16-64 on one thread, 0.76-0.88x on two (AMD EPYC, benchmarks/batch_kernels.py); only
 * 1-4 and 8 are built for 2 groups (each tile is built for every format).
 * AVX2: 2 rows at a time a group. */
static inline __attribute__((always_inline)) void gq_blocks(const int fmt, const int accumulate, const gq_acts a,
                                                            int64_t M, int64_t K, const uint8_t *w,
                                                            const float *bias, float *out, int64_t ld_out,
                                                            int64_t b_lo, int64_t b_hi) {
    const int64_t nb = K / 32, row_bytes = nb * gguf_group_bytes(fmt);
    if (gq_vnni_on()) {
        const int side = M <= 2 ? 4 : 2;
        for (; b_lo + side <= b_hi; b_lo += side)
            for (int64_t m = 0, n; m < M; m += n) {
                n = side == 4 ? M : M - m >= 8 ? 8 : M - m >= 4 ? 4 : M - m;
                gq_run512(fmt, side, accumulate, gq_from(a, m, K), n, K, w + b_lo * row_bytes,
                          bias == NULL ? NULL : bias + 16 * b_lo, out + m * ld_out + 16 * b_lo, ld_out);
            }
        for (int64_t b = b_lo; b < b_hi; b++)
            for (int64_t m = 0; m < M; m += 8)
                gq_run512(fmt, 1, accumulate, gq_from(a, m, K), M - m < 8 ? M - m : 8, K, w + b * row_bytes,
                          bias == NULL ? NULL : bias + 16 * b, out + m * ld_out + 16 * b, ld_out);
        return;
    }
    for (int64_t b = b_lo; b < b_hi; b++) {
        const float *bb = bias == NULL ? NULL : bias + 16 * b;
        const uint8_t *wb = w + b * row_bytes;
        for (int64_t m = 0; m < M; m += 2) {
            float *ob = out + m * ld_out + 16 * b;
            if (M - m >= 2) gq_tile256(fmt, 2, accumulate, gq_from(a, m, K), K, wb, bb, ob, ld_out);
            else gq_tile256(fmt, 1, accumulate, gq_from(a, m, K), K, wb, bb, ob, ld_out);
        }
    }
}

/* Floats of scratch gguf_blocks needs for M rows of inputs of up to K: the quantized
 * activations. */
static int64_t gguf_scratch_floats(int64_t M, int64_t K) { return gq_quantize_floats(M, K); }

/* Output blocks [b_lo, b_hi) of 16 of the M rows a (x rounded by gq_quantize)
 * times the packed GGUF weights w of format fmt, plus bias [N] where not NULL, into out
 * (row stride ld_out); accumulate: add to what out holds. */
static void gguf_blocks(int64_t fmt, const gq_acts a, int64_t M, int64_t K, const uint8_t *w, const float *bias,
                        float *out, int64_t ld_out, int64_t b_lo, int64_t b_hi, int accumulate) {
    if (b_lo >= b_hi) return;
#define TS_GB(f)                                                                                   \
    if (accumulate) gq_blocks(f, 1, a, M, K, w, bias, out, ld_out, b_lo, b_hi);                    \
    else gq_blocks(f, 0, a, M, K, w, bias, out, ld_out, b_lo, b_hi);
    switch (fmt) {
        case TS_Q4_0: TS_GB(TS_Q4_0) break;
        case TS_Q4_1: TS_GB(TS_Q4_1) break;
        case TS_Q8_0: TS_GB(TS_Q8_0) break;
        case TS_Q4_K: TS_GB(TS_Q4_K) break;
        case TS_Q6_K: TS_GB(TS_Q6_K) break;
        case TS_Q5_0: TS_GB(TS_Q5_0) break;
        case TS_Q5_1: TS_GB(TS_Q5_1) break;
    }
#undef TS_GB
}

/* A projection's input as one thread reads it for every block of outputs it computes:
 * x [M, K] (row stride ld_x), and for GGUF blocks x rounded once (gq_quantize into the
 * thread's scratch of gguf_scratch_floats(M, K) floats), not once a block range. */
typedef struct {
    const float *x;
    int64_t M, K, ld_x;
    gq_acts a;
} ts_input;

static ts_input ts_input_of(int64_t fmt, const float *x, int64_t M, int64_t K, int64_t ld_x, float *xs) {
    ts_input in = {x, M, K, ld_x, {0}};
    if (fmt != TS_INT8) in.a = gq_quantize(x, M, K, ld_x, xs);
    return in;
}

/* Output blocks [b_lo, b_hi) of one projection of format fmt over in (prepared by
 * ts_input_of for fmt): int8 rows with their scales (w8_blocks, wf its scratch) or GGUF
 * blocks (gguf_blocks). */
static void ts_projection(int64_t fmt, const ts_input *in, const void *w, const float *scale, const float *bias,
                          float *out, int64_t ld_out, int64_t b_lo, int64_t b_hi, float *wf, int accumulate) {
    if (fmt == TS_INT8)
        w8_blocks(in->x, in->M, in->K, in->ld_x, (const int8_t *)w, scale, bias, out, ld_out, b_lo, b_hi, wf,
                  accumulate);
    else
        gguf_blocks(fmt, in->a, in->M, in->K, (const uint8_t *)w, bias, out, ld_out, b_lo, b_hi, accumulate);
}

/* out [M, N] (row stride ld_out) = x [M, K] (row stride ld_x) times the packed GGUF
 * weights w of format fmt (+ bias [N] or NULL). Returns 0; -2 for sizes or a format it
 * cannot take (nothing computed); -1 when a thread's scratch could not be allocated. */
int ts_gguf_linear(int64_t fmt, const float *x, int64_t M, int64_t K, int64_t ld_x, const uint8_t *w,
                   const float *bias, int64_t N, float *out, int64_t ld_out) {
    if (fmt == TS_INT8 || !ts_projection_fits(fmt, K) || M < 0 || K < 32 || N < 16 || N % 16 || ld_x < K ||
        ld_out < N)
        return -2;
    int failed = 0;
    /* Chunks taken first come first served (see ts_decoder_layers: a preempted thread's
     * share is taken by the others). */
    const int64_t size = ts_chunk(N / 16, omp_get_max_threads(), 4), chunks = (N / 16 + size - 1) / size;
#pragma omp parallel reduction(| : failed) if (M * N * K >= (int64_t)1 << 18)
    {
        float *xs = (float *)malloc((size_t)gguf_scratch_floats(M, K) * sizeof(float));
        gq_acts a = {0};
        if (xs == NULL) failed = 1;
        else a = gq_quantize(x, M, K, ld_x, xs);
#pragma omp for schedule(dynamic, 1)
        for (int64_t c = 0; c < chunks; c++)
            if (xs != NULL)
                gguf_blocks(fmt, a, M, K, w, bias, out, ld_out, c * size, (c + 1) * size < N / 16 ? (c + 1) * size : N / 16, 0);
        free(xs);
    }
    return failed ? -1 : 0;
}

/* out [N, K] = the float32 weights the packed w of format fmt holds (d * q + m, as ggml
 * dequantizes: each product exact, one rounding for the + m). Returns 0, -2 for sizes or
 * a format it cannot take. */
int ts_gguf_dequantize(int64_t fmt, const uint8_t *w, int64_t N, int64_t K, float *out) {
    if (fmt == TS_INT8 || !ts_projection_fits(fmt, K) || N % 16) return -2;
    const int64_t nb = K / 32, gb = gguf_group_bytes(fmt);
    for (int64_t n = 0; n < N; n++)
        for (int64_t b = 0; b < nb; b++) {
            const uint8_t *blk = w + ((n / 16) * nb + b) * gb;
            const int r = (int)(n % 16);
            const float d = fmt == TS_Q4_K ? _cvtsh_ss(((const uint16_t *)blk)[r]) * (float)blk[64 + r]
                                           : _cvtsh_ss(((const uint16_t *)blk)[r]);
            float *o = out + n * K + 32 * b;
            for (int k = 0; k < 32; k++) {
                if (fmt == TS_Q6_K) {
                    const int j = k % 16;
                    const uint8_t byte = blk[TS_QOFF(fmt) + (j / 2) * 32 + r * 2 + j % 2];
                    const int high = (blk[TS_HOFF(fmt) + (j / 2) * 16 + r] >> ((j % 2) * 2 + (k < 16 ? 0 : 4))) & 3;
                    const int q = (k < 16 ? byte & 15 : byte >> 4) | high << 4;
                    o[k] = d * (float)(int8_t)blk[32 + 16 * (k / 16) + r] * (float)(q - 32);
                    continue;
                }
                if (fmt == TS_Q8_0) {
                    o[k] = d * (float)(int8_t)blk[32 + (k / 2) * 32 + r * 2 + k % 2];
                    continue;
                }
                const int j = k % 16;
                const uint8_t byte = blk[TS_QOFF(fmt) + (j / 2) * 32 + r * 2 + j % 2];
                int q = k < 16 ? byte & 15 : byte >> 4;
                if (TS_IS_Q5(fmt)) {
                    const int c = j / 2;
                    q |= ((blk[TS_HOFF(fmt) + 16 * (c / 2) + r] >> (4 * (c % 2) + j % 2 + (k < 16 ? 0 : 2))) & 1) << 4;
                    o[k] = fmt == TS_Q5_0 ? d * (float)(q - 16) : d * (float)q + _cvtsh_ss(((const uint16_t *)(blk + 32))[r]);
                } else if (fmt == TS_Q4_K)
                    o[k] = d * (float)q + -(_cvtsh_ss(((const uint16_t *)(blk + 32))[r]) * (float)blk[80 + r]);
                else if (fmt == TS_Q4_1)
                    o[k] = d * (float)q + _cvtsh_ss(((const uint16_t *)(blk + 32))[r]);
                else
                    o[k] = d * (float)(q - 8);
            }
        }
    return 0;
}
