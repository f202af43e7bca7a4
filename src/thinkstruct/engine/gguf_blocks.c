/* GGUF weight blocks as the file ships them (Q4_0, Q4_1, Q8_0), multiplied by float32
 * activations without dequantizing the matrix: included by cpu_kernels.c (after the int8
 * kernels, whose helpers it uses) into the same library.
 *
 * ggml's blocks hold 32 weights of one row: Q4_0 an f16 scale d and 16 bytes of nibbles,
 * w = d * (q - 8); Q4_1 f16 d and f16 m, w = d * q + m; Q8_0 f16 d and 32 int8, w = d * q.
 * Byte j of a Q4 block holds element j in its low nibble and element j + 16 in its high
 * one. gguf_weights.py repacks a [N, K] tensor's blocks (N % 16 == 0, K % 32 == 0) into
 * groups of 16 output rows x 32 inputs, [N / 16][K / 32] groups, each:
 *   Q4_0: u16 d[16]; u8 q[16][16]            288 bytes (q[j][r]: row r's byte j)
 *   Q4_1: u16 d[16]; u16 m[16]; u8 q[16][16] 320 bytes
 *   Q8_0: u16 d[16]; i8 q[32][16]            544 bytes (q[k][r]: row r's element k)
 * the same bytes as the file, reordered so that one vector load holds 16 rows' weights.
 *
 * Each output n of an activation row x is, in this order and on every path:
 *   for each block b (xs[b]: the block's sum of x, see gguf_block_sums):
 *     s = one chain of fused multiply-adds x[32b + k] * q[n, 32b + k], k = 0, 16, 1, 17, ..., 15, 31
 *         (a Q4 byte's low nibble, then its high one)
 *     acc = fma(d, s, acc); then Q4_1: acc = fma(m, xs[b], acc), Q4_0: fma(-8 d, xs[b], acc)
 *   y = acc (+ bias[n]) (out + y where accumulating: a residual connection)
 * which is sum_k x[k] * w[n, k] of the file's weights up to float summation order. A row's
 * result depends on its own activations only, and the AVX2 and AVX-512 paths compute each
 * lane alike: the same bits. */

#define TS_INT8 0
#define TS_Q4_0 1
#define TS_Q4_1 2
#define TS_Q8_0 3

/* Bytes of one group of 16 rows x 32 inputs; 0 for a format these kernels do not run. */
static int64_t gguf_group_bytes(int64_t fmt) {
    return fmt == TS_Q4_0 ? 288 : fmt == TS_Q4_1 ? 320 : fmt == TS_Q8_0 ? 544 : 0;
}

/* Whether a projection of this format can take K inputs. */
static int ts_projection_fits(int64_t fmt, int64_t K) {
    return fmt == TS_INT8 || (gguf_group_bytes(fmt) > 0 && K % 32 == 0);
}

/* xs[m * (K / 32) + b] = ((x[0:8] + x[8:16]) + x[16:24]) + x[24:32] lane by lane, summed
 * by hsum256, over the block's 32 activations x[m, 32b ...]: a fixed order. */
static void gguf_block_sums(const float *x, int64_t M, int64_t K, int64_t ld_x, float *xs) {
    const int64_t nb = K / 32;
    for (int64_t m = 0; m < M; m++)
        for (int64_t b = 0; b < nb; b++) {
            const float *p = x + m * ld_x + 32 * b;
            __m256 v = _mm256_add_ps(_mm256_loadu_ps(p), _mm256_loadu_ps(p + 8));
            v = _mm256_add_ps(v, _mm256_loadu_ps(p + 16));
            v = _mm256_add_ps(v, _mm256_loadu_ps(p + 24));
            xs[m * nb + b] = hsum256(v);
        }
}

/* One row group's blocks decoded to float32 once, for passes of more rows than the wide
 * tiles take (prefill): per block b, at dq + b * TS_GQ_FLOATS, q[32][16] (element j of the
 * block for row r at [j][r], as a float: exactly the integer), then d[16] and m[16] (Q4_0:
 * -8 d; Q8_0: unused). The tiles then read these instead of widening the bytes: the same
 * values into the same operations, so the same bits. */
#define TS_GQ_FLOATS (32 * 16 + 32)

static void gq_decode(const int64_t fmt, const uint8_t *w, int64_t nb, float *dq) {
    const int64_t gb = gguf_group_bytes(fmt);
    for (int64_t b = 0; b < nb; b++) {
        const uint8_t *blk = w + b * gb;
        float *o = dq + b * TS_GQ_FLOATS;
        for (int j = 0; j < 16; j++)
            for (int h = 0; h < 2; h++) {
                if (fmt == TS_Q8_0) {
                    const int8_t *q = (const int8_t *)(blk + 32);
                    _mm256_storeu_ps(o + j * 16 + 8 * h, TS_W8_LOAD(q + j * 16 + 8 * h));
                    _mm256_storeu_ps(o + (16 + j) * 16 + 8 * h, TS_W8_LOAD(q + (16 + j) * 16 + 8 * h));
                } else {
                    const uint8_t *q = blk + (fmt == TS_Q4_1 ? 64 : 32);
                    const __m256i bytes = _mm256_cvtepu8_epi32(_mm_loadl_epi64((const __m128i *)(q + j * 16 + 8 * h)));
                    _mm256_storeu_ps(o + j * 16 + 8 * h,
                                     _mm256_cvtepi32_ps(_mm256_and_si256(bytes, _mm256_set1_epi32(15))));
                    _mm256_storeu_ps(o + (16 + j) * 16 + 8 * h, _mm256_cvtepi32_ps(_mm256_srli_epi32(bytes, 4)));
                }
            }
        for (int h = 0; h < 2; h++) {
            const __m256 d = _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(blk + 16 * h)));
            _mm256_storeu_ps(o + 512 + 8 * h, d);
            if (fmt == TS_Q4_1)
                _mm256_storeu_ps(o + 528 + 8 * h, _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(blk + 32 + 16 * h))));
            else
                _mm256_storeu_ps(o + 528 + 8 * h, _mm256_mul_ps(d, _mm256_set1_ps(-8.0f)));
        }
    }
}

/* ---- AVX-512: groups (side by side) x rows, every row's 16 outputs of a group in one
 * register. fmt, groups, rows and accumulate are constants at each call (folded away). */
static inline __attribute__((always_inline)) TS_AVX512 void gq_tile512(
    const int fmt, const int groups, const int rows, const int accumulate, const int from_float, const float *x,
    int64_t ld_x, const float *xs, const uint8_t *w, const float *dq, int64_t K, const float *bias, float *out,
    int64_t ld_out) {
    const int64_t nb = K / 32, gb = gguf_group_bytes(fmt);
    __m512 acc[4][8];
    _Pragma("GCC unroll 8") for (int g = 0; g < groups; g++)
        _Pragma("GCC unroll 8") for (int r = 0; r < rows; r++) acc[g][r] = _mm512_setzero_ps();
    for (int64_t b = 0; b < nb; b++) {
        const float *xb = x + 32 * b;
        __m512 sum[4][8];
        _Pragma("GCC unroll 8") for (int g = 0; g < groups; g++)
            _Pragma("GCC unroll 8") for (int r = 0; r < rows; r++) sum[g][r] = _mm512_setzero_ps();
        for (int j = 0; j < 16; j++)
            _Pragma("GCC unroll 8") for (int g = 0; g < groups; g++) {
                const uint8_t *blk = w + (g * nb + b) * gb;
                __m512 w_lo, w_hi;
                if (from_float) {
                    w_lo = _mm512_loadu_ps(dq + b * TS_GQ_FLOATS + j * 16);
                    w_hi = _mm512_loadu_ps(dq + b * TS_GQ_FLOATS + (16 + j) * 16);
                } else if (fmt == TS_Q8_0) {
                    const int8_t *q = (const int8_t *)(blk + 32);
                    w_lo = _mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(_mm_loadu_si128((const __m128i *)(q + j * 16))));
                    w_hi = _mm512_cvtepi32_ps(
                        _mm512_cvtepi8_epi32(_mm_loadu_si128((const __m128i *)(q + (j + 16) * 16))));
                } else {
                    const uint8_t *q = blk + (fmt == TS_Q4_1 ? 64 : 32);
                    const __m512i bytes = _mm512_cvtepu8_epi32(_mm_loadu_si128((const __m128i *)(q + j * 16)));
                    w_lo = _mm512_cvtepi32_ps(_mm512_and_si512(bytes, _mm512_set1_epi32(15)));
                    w_hi = _mm512_cvtepi32_ps(_mm512_srli_epi32(bytes, 4));
                }
                _Pragma("GCC unroll 8") for (int r = 0; r < rows; r++) {
                    sum[g][r] = _mm512_fmadd_ps(_mm512_set1_ps(xb[r * ld_x + j]), w_lo, sum[g][r]);
                    sum[g][r] = _mm512_fmadd_ps(_mm512_set1_ps(xb[r * ld_x + 16 + j]), w_hi, sum[g][r]);
                }
            }
        _Pragma("GCC unroll 8") for (int g = 0; g < groups; g++) {
            const uint8_t *blk = w + (g * nb + b) * gb;
            const __m512 d = from_float ? _mm512_loadu_ps(dq + b * TS_GQ_FLOATS + 512)
                                        : _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)blk));
            _Pragma("GCC unroll 8") for (int r = 0; r < rows; r++)
                acc[g][r] = _mm512_fmadd_ps(d, sum[g][r], acc[g][r]);
            if (fmt != TS_Q8_0) {
                const __m512 m = from_float      ? _mm512_loadu_ps(dq + b * TS_GQ_FLOATS + 528)
                                 : fmt == TS_Q4_1 ? _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)(blk + 32)))
                                                  : _mm512_mul_ps(d, _mm512_set1_ps(-8.0f));
                _Pragma("GCC unroll 8") for (int r = 0; r < rows; r++)
                    acc[g][r] = _mm512_fmadd_ps(m, _mm512_set1_ps(xs[r * nb + b]), acc[g][r]);
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

/* ---- AVX2: one group x rows (<= 2), each 16 outputs in two registers of 8 lanes. */
static inline __attribute__((always_inline)) void gq_tile256(const int fmt, const int rows, const int accumulate,
                                                             const int from_float, const float *x, int64_t ld_x,
                                                             const float *xs, const uint8_t *w, const float *dq,
                                                             int64_t K, const float *bias, float *out,
                                                             int64_t ld_out) {
    const int64_t nb = K / 32, gb = gguf_group_bytes(fmt);
    __m256 acc[2][2];
    for (int r = 0; r < rows; r++) acc[r][0] = acc[r][1] = _mm256_setzero_ps();
    for (int64_t b = 0; b < nb; b++) {
        const float *xb = x + 32 * b;
        const uint8_t *blk = w + b * gb;
        __m256 sum[2][2];
        for (int r = 0; r < rows; r++) sum[r][0] = sum[r][1] = _mm256_setzero_ps();
        for (int j = 0; j < 16; j++) {
            for (int h = 0; h < 2; h++) {
                __m256 w_lo, w_hi;
                if (from_float) {
                    w_lo = _mm256_loadu_ps(dq + b * TS_GQ_FLOATS + j * 16 + 8 * h);
                    w_hi = _mm256_loadu_ps(dq + b * TS_GQ_FLOATS + (16 + j) * 16 + 8 * h);
                } else if (fmt == TS_Q8_0) {
                    const int8_t *q = (const int8_t *)(blk + 32);
                    w_lo = TS_W8_LOAD(q + j * 16 + 8 * h);
                    w_hi = TS_W8_LOAD(q + (j + 16) * 16 + 8 * h);
                } else {
                    const uint8_t *q = blk + (fmt == TS_Q4_1 ? 64 : 32);
                    const __m256i bytes = _mm256_cvtepu8_epi32(_mm_loadl_epi64((const __m128i *)(q + j * 16 + 8 * h)));
                    w_lo = _mm256_cvtepi32_ps(_mm256_and_si256(bytes, _mm256_set1_epi32(15)));
                    w_hi = _mm256_cvtepi32_ps(_mm256_srli_epi32(bytes, 4));
                }
                for (int r = 0; r < rows; r++) {
                    sum[r][h] = _mm256_fmadd_ps(_mm256_broadcast_ss(xb + r * ld_x + j), w_lo, sum[r][h]);
                    sum[r][h] = _mm256_fmadd_ps(_mm256_broadcast_ss(xb + r * ld_x + 16 + j), w_hi, sum[r][h]);
                }
            }
        }
        for (int h = 0; h < 2; h++) {
            const __m256 d = from_float ? _mm256_loadu_ps(dq + b * TS_GQ_FLOATS + 512 + 8 * h)
                                        : _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(blk + 16 * h)));
            for (int r = 0; r < rows; r++)
                acc[r][h] = _mm256_fmadd_ps(d, sum[r][h], acc[r][h]);
            if (fmt != TS_Q8_0) {
                const __m256 m =
                    from_float      ? _mm256_loadu_ps(dq + b * TS_GQ_FLOATS + 528 + 8 * h)
                    : fmt == TS_Q4_1 ? _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(blk + 32 + 16 * h)))
                                     : _mm256_mul_ps(d, _mm256_set1_ps(-8.0f));
                for (int r = 0; r < rows; r++)
                    acc[r][h] = _mm256_fmadd_ps(m, _mm256_broadcast_ss(xs + r * nb + b), acc[r][h]);
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

/* Rows ((M <= 8) of x against `groups` groups of 16 outputs from w, AVX-512. */
static TS_AVX512 void gq_run512(const int fmt, const int groups, const int accumulate, const float *x, int64_t M,
                                int64_t ld_x, const float *xs, const uint8_t *w, const float *dq, int64_t K,
                                const float *bias, float *out, int64_t ld_out) {
#define TS_GQ(n, f)                                                                                \
    case n:                                                                                        \
        gq_tile512(fmt, groups, n, accumulate, f, x, ld_x, xs, w, dq, K, bias, out, ld_out);       \
        break;
    if (groups == 4) {
        switch (M) { TS_GQ(1, 0) TS_GQ(2, 0) }
    } else if (dq == NULL) {
        switch (M) { TS_GQ(1, 0) TS_GQ(2, 0) TS_GQ(3, 0) TS_GQ(4, 0) TS_GQ(5, 0) TS_GQ(6, 0) TS_GQ(7, 0) TS_GQ(8, 0) }
    } else {
        switch (M) { TS_GQ(1, 1) TS_GQ(2, 1) TS_GQ(3, 1) TS_GQ(4, 1) TS_GQ(5, 1) TS_GQ(6, 1) TS_GQ(7, 1) TS_GQ(8, 1) }
    }
#undef TS_GQ
}

/* Output blocks [b_lo, b_hi) of 16 (row groups) of x [M, K] times the packed weights of
 * format fmt (fmt, accumulate constant at each call; see gguf_blocks). A tile's rows
 * widen each group's bytes as they stream; more rows than one tile takes (AVX-512: 8,
 * AVX2: 2) first decode a group into dq (gq_decode) and run their tiles over it. */
static inline __attribute__((always_inline)) void gq_blocks(const int fmt, const int accumulate, const float *x,
                                                            int64_t M, int64_t K, int64_t ld_x, const uint8_t *w,
                                                            const float *bias, float *out, int64_t ld_out,
                                                            int64_t b_lo, int64_t b_hi, const float *xs, float *dq) {
    const int64_t nb = K / 32, row_bytes = nb * gguf_group_bytes(fmt);
    if (avx512_on()) {
        if (M <= 2) { /* decoding one or two rows: TS_WIDE groups side by side, more chains */
            for (; b_lo + TS_WIDE <= b_hi; b_lo += TS_WIDE)
                gq_run512(fmt, TS_WIDE, accumulate, x, M, ld_x, xs, w + b_lo * row_bytes, NULL, K,
                          bias == NULL ? NULL : bias + 16 * b_lo, out + 16 * b_lo, ld_out);
            for (int64_t b = b_lo; b < b_hi; b++)
                gq_run512(fmt, 1, accumulate, x, M, ld_x, xs, w + b * row_bytes, NULL, K,
                          bias == NULL ? NULL : bias + 16 * b, out + 16 * b, ld_out);
            return;
        }
        /* Decoding a group costs about half a tile of streaming: worth it past four tiles. */
        const int decode = M > 4 * 8;
        for (int64_t b = b_lo; b < b_hi; b++) {
            if (decode) gq_decode(fmt, w + b * row_bytes, nb, dq);
            for (int64_t m = 0; m < M; m += 8)
                gq_run512(fmt, 1, accumulate, x + m * ld_x, M - m < 8 ? M - m : 8, ld_x, xs + m * nb,
                          w + b * row_bytes, decode ? dq : NULL, K, bias == NULL ? NULL : bias + 16 * b,
                          out + m * ld_out + 16 * b, ld_out);
        }
        return;
    }
    for (int64_t b = b_lo; b < b_hi; b++) {
        const float *bb = bias == NULL ? NULL : bias + 16 * b;
        const uint8_t *wb = w + b * row_bytes;
        if (M > 2) gq_decode(fmt, wb, nb, dq);
        for (int64_t m = 0; m < M; m += 2) {
            float *ob = out + m * ld_out + 16 * b;
            const float *xm = x + m * ld_x, *xsm = xs + m * nb;
            if (M > 2 && M - m >= 2) gq_tile256(fmt, 2, accumulate, 1, xm, ld_x, xsm, wb, dq, K, bb, ob, ld_out);
            else if (M > 2) gq_tile256(fmt, 1, accumulate, 1, xm, ld_x, xsm, wb, dq, K, bb, ob, ld_out);
            else if (M - m >= 2) gq_tile256(fmt, 2, accumulate, 0, xm, ld_x, xsm, wb, NULL, K, bb, ob, ld_out);
            else gq_tile256(fmt, 1, accumulate, 0, xm, ld_x, xsm, wb, NULL, K, bb, ob, ld_out);
        }
    }
}

/* Floats of scratch gguf_blocks needs for M rows of inputs of up to K: the block sums
 * and one decoded row group. */
static int64_t gguf_scratch_floats(int64_t M, int64_t K) { return M * (K / 32) + (K / 32) * TS_GQ_FLOATS + 1; }

/* Output blocks [b_lo, b_hi) of 16 of x [M, K] (row stride ld_x) times the packed GGUF
 * weights w of format fmt, plus bias [N] where not NULL, into out (row stride ld_out);
 * accumulate: add to what out holds. xs: scratch of gguf_scratch_floats(M, K) floats. */
static void gguf_blocks(int64_t fmt, const float *x, int64_t M, int64_t K, int64_t ld_x, const uint8_t *w,
                        const float *bias, float *out, int64_t ld_out, int64_t b_lo, int64_t b_hi, float *xs,
                        int accumulate) {
    if (fmt != TS_Q8_0) gguf_block_sums(x, M, K, ld_x, xs);
    float *dq = xs + M * (K / 32);
#define TS_GB(f)                                                                                   \
    if (accumulate) gq_blocks(f, 1, x, M, K, ld_x, w, bias, out, ld_out, b_lo, b_hi, xs, dq);      \
    else gq_blocks(f, 0, x, M, K, ld_x, w, bias, out, ld_out, b_lo, b_hi, xs, dq);
    switch (fmt) {
        case TS_Q4_0: TS_GB(TS_Q4_0) break;
        case TS_Q4_1: TS_GB(TS_Q4_1) break;
        case TS_Q8_0: TS_GB(TS_Q8_0) break;
    }
#undef TS_GB
}

/* One projection of format fmt: int8 rows with their scales (w8_blocks, wf its scratch) or
 * GGUF blocks (gguf_blocks, xs its scratch). */
static void ts_projection(int64_t fmt, const float *x, int64_t M, int64_t K, int64_t ld_x, const void *w,
                          const float *scale, const float *bias, float *out, int64_t ld_out, int64_t b_lo,
                          int64_t b_hi, float *wf, float *xs, int accumulate) {
    if (fmt == TS_INT8)
        w8_blocks(x, M, K, ld_x, (const int8_t *)w, scale, bias, out, ld_out, b_lo, b_hi, wf, accumulate);
    else
        gguf_blocks(fmt, x, M, K, ld_x, (const uint8_t *)w, bias, out, ld_out, b_lo, b_hi, xs, accumulate);
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
#pragma omp parallel reduction(| : failed) if (M * N * K >= (int64_t)1 << 18)
    {
        const int nt = omp_get_num_threads(), id = omp_get_thread_num();
        float *xs = (float *)malloc((size_t)gguf_scratch_floats(M, K) * sizeof(float));
        if (xs == NULL)
            failed = 1;
        else
            gguf_blocks(fmt, x, M, K, ld_x, w, bias, out, ld_out, N / 16 * id / nt, N / 16 * (id + 1) / nt, xs, 0);
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
            const float d = _cvtsh_ss(((const uint16_t *)blk)[r]);
            float *o = out + n * K + 32 * b;
            for (int k = 0; k < 32; k++) {
                if (fmt == TS_Q8_0) {
                    o[k] = d * (float)((const int8_t *)(blk + 32))[k * 16 + r];
                    continue;
                }
                const uint8_t byte = blk[(fmt == TS_Q4_1 ? 64 : 32) + (k % 16) * 16 + r];
                const int q = k < 16 ? byte & 15 : byte >> 4;
                if (fmt == TS_Q4_1)
                    o[k] = d * (float)q + _cvtsh_ss(((const uint16_t *)(blk + 32))[r]);
                else
                    o[k] = d * (float)(q - 8);
            }
        }
    return 0;
}
