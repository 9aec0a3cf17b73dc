/* Fixed-order kernels: a GEMM, an attention, RMSNorm and SiLU whose every output is one
 * written-down sequence of IEEE operations, so a row's numbers do not depend on how many rows
 * are computed with it, on chunk boundaries, on the thread count or on the instruction set.
 *
 * GEMM: y[m][n] = fma(x[m][K-1], w[K-1][n], ... fma(x[m][0], w[0][n], 0.0f)), k in order. The
 *   weights are packed in panels of PANEL output columns ([N / PANEL][K][PANEL]) as fp32, bf16 or
 *   int8 (converted to fp32 exactly). Vector lanes are output columns, so a vector FMA is PANEL
 *   scalar FMAs: the AVX2 path and the scalar path (CPUs without FMA) give the same bits.
 * RMS norm: sum of squares as the attention's dot product (8 lane sums, a fixed tree, then any
 *   tail in order), y = w * (x * (1 / sqrtf(sum / D + eps))).
 * SiLU-and-multiply: y = g / (1 + expf(-g)) * u, one element at a time with the C library's expf.
 * Attention: for one query and one head, score_j = (q . k_j) * scale with the dot product in 8
 *   partial sums (lane l takes d = l, l + 8, ...) combined as ((p0+p1)+(p2+p3))+((p4+p5)+(p6+p7));
 *   p_j = expf(score_j - max); sum = p_0 + p_1 + ... in key order; out = (sum_j p_j v_j) / sum,
 *   keys in order. A query sees only its own keys, so prefill chunks and decode steps agree.
 *
 * Built on first use by origin/engine/kernels/__init__.py (cc -O2 -fopenmp); no -ffast-math: the
 * compiler may not reassociate. */
#include <immintrin.h>
#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#define PANEL 16
#define LANES 8

enum { W_F32 = 0, W_BF16 = 1, W_I8 = 2 };

/* Work (multiply-adds) below which a call runs on the calling thread alone. A parallel region's
 * barrier waits for every thread: on a loaded machine a descheduled thread costs a time slice per
 * call, and a decode step makes ~150 calls. Small calls (a batch-1 layer GEMM: 0.3-1.8M) stay
 * serial; large ones (the LM head, batches, prompts) split. Results do not depend on it. */
#define PARALLEL_WORK (1 << 21)

static int use_avx2 = -1; /* -1: decide on first call; 0: scalar; 1: AVX2 + FMA */

int fo_set_simd(int on) {
    if (on < 0) on = __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma");
    use_avx2 = on;
    return use_avx2;
}

static inline float w_scalar(const void *w, int kind, int64_t i) {
    if (kind == W_F32) return ((const float *)w)[i];
    if (kind == W_BF16) {
        uint32_t u = (uint32_t)((const uint16_t *)w)[i] << 16;
        float f;
        memcpy(&f, &u, 4);
        return f;
    }
    return (float)((const int8_t *)w)[i];
}

/* the reference order: rows [r0, r0 + rows) of one panel */
static void panel_scalar(const float *x, int64_t ldx, int rows, const void *w, int kind,
                         int64_t K, int64_t panel, float *y, int64_t ldy) {
    const int64_t base = panel * K * PANEL;
    for (int r = 0; r < rows; r++) {
        float acc[PANEL];
        for (int c = 0; c < PANEL; c++) acc[c] = 0.0f;
        for (int64_t k = 0; k < K; k++) {
            const float xv = x[r * ldx + k];
            for (int c = 0; c < PANEL; c++)
                acc[c] = fmaf(xv, w_scalar(w, kind, base + k * PANEL + c), acc[c]);
        }
        memcpy(y + r * ldy + panel * PANEL, acc, sizeof acc);
    }
}

__attribute__((target("avx2,fma"))) static inline __m256 w_load(const void *w, int kind,
                                                                 int64_t i) {
    if (kind == W_F32) return _mm256_loadu_ps((const float *)w + i);
    if (kind == W_BF16) {
        __m128i h = _mm_loadu_si128((const __m128i *)((const uint16_t *)w + i));
        return _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32(h), 16));
    }
    __m128i b = _mm_loadl_epi64((const __m128i *)((const int8_t *)w + i));
    return _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(b));
}

/* R x PANEL tiles with named accumulators (they stay in registers), R in {6, 4, 2, 1} */
#define REP1(M) M(0)
#define REP2(M) REP1(M) M(1)
#define REP4(M) REP2(M) M(2) M(3)
#define REP6(M) REP4(M) M(4) M(5)
#define DECL(r) __m256 a0_##r = _mm256_setzero_ps(), a1_##r = _mm256_setzero_ps();
#define STEP(r)                                                                                 \
    {                                                                                           \
        const __m256 xv = _mm256_broadcast_ss(x + (r) * ldx + k);                               \
        a0_##r = _mm256_fmadd_ps(xv, w0, a0_##r);                                               \
        a1_##r = _mm256_fmadd_ps(xv, w1, a1_##r);                                               \
    }
#define STORE(r)                                                                                \
    _mm256_storeu_ps(y + (r) * ldy + panel * PANEL, a0_##r);                                    \
    _mm256_storeu_ps(y + (r) * ldy + panel * PANEL + LANES, a1_##r);
#define DEFINE_TILE(NAME, KIND, REP)                                                            \
    __attribute__((target("avx2,fma"))) static void NAME(const float *x, int64_t ldx,           \
                                                         const void *w, int64_t K,              \
                                                         int64_t panel, float *y, int64_t ldy) { \
        const int64_t base = panel * K * PANEL;                                                 \
        REP(DECL)                                                                               \
        for (int64_t k = 0; k < K; k++) {                                                       \
            const __m256 w0 = w_load(w, KIND, base + k * PANEL);                                \
            const __m256 w1 = w_load(w, KIND, base + k * PANEL + LANES);                        \
            REP(STEP)                                                                           \
        }                                                                                       \
        REP(STORE)                                                                              \
    }
#define DEFINE_TILES(KIND, SUFFIX)                                                              \
    DEFINE_TILE(tile6_##SUFFIX, KIND, REP6)                                                     \
    DEFINE_TILE(tile4_##SUFFIX, KIND, REP4)                                                     \
    DEFINE_TILE(tile2_##SUFFIX, KIND, REP2)                                                     \
    DEFINE_TILE(tile1_##SUFFIX, KIND, REP1)
DEFINE_TILES(W_F32, f32)
DEFINE_TILES(W_BF16, bf16)
DEFINE_TILES(W_I8, i8)

typedef void (*tile_fn)(const float *, int64_t, const void *, int64_t, int64_t, float *, int64_t);
static const int TILE_ROWS[4] = {6, 4, 2, 1};
static const tile_fn TILES[3][4] = {
    {tile6_f32, tile4_f32, tile2_f32, tile1_f32},
    {tile6_bf16, tile4_bf16, tile2_bf16, tile1_bf16},
    {tile6_i8, tile4_i8, tile2_i8, tile1_i8},
};

/* y [M, N] (row stride ldy) = x [M, K] (row stride ldx) @ packed w ([N / PANEL][K][PANEL]) */
int fo_gemm(const float *x, int64_t ldx, const void *w, int kind, float *y, int64_t ldy, int64_t M,
            int64_t K, int64_t N) {
    if (N % PANEL || kind < W_F32 || kind > W_I8) return -1;
    if (use_avx2 < 0) fo_set_simd(-1);
    const int64_t panels = N / PANEL;
    const int simd = use_avx2;
#pragma omp parallel for schedule(static) if (M * K * N >= PARALLEL_WORK)
    for (int64_t p = 0; p < panels; p++) {
        int64_t r0 = 0;
        for (int t = 0; t < 4; t++) {
            const int rows = TILE_ROWS[t];
            for (; M - r0 >= rows; r0 += rows) {
                if (simd)
                    TILES[kind][t](x + r0 * ldx, ldx, w, K, p, y + r0 * ldy, ldy);
                else
                    panel_scalar(x + r0 * ldx, ldx, rows, w, kind, K, p, y + r0 * ldy, ldy);
            }
        }
    }
    return 0;
}

/* the dot product's fixed order: 8 lane sums, then a fixed tree */
static inline float combine(const float p[LANES]) {
    return ((p[0] + p[1]) + (p[2] + p[3])) + ((p[4] + p[5]) + (p[6] + p[7]));
}

static float dot_scalar(const float *a, const float *b, int64_t D) {
    float p[LANES] = {0};
    for (int64_t d = 0; d < D; d += LANES)
        for (int l = 0; l < LANES; l++) p[l] = fmaf(a[d + l], b[d + l], p[l]);
    return combine(p);
}

__attribute__((target("avx2,fma"))) static float dot_avx2(const float *a, const float *b,
                                                          int64_t D) {
    __m256 acc = _mm256_setzero_ps();
    for (int64_t d = 0; d < D; d += LANES)
        acc = _mm256_fmadd_ps(_mm256_loadu_ps(a + d), _mm256_loadu_ps(b + d), acc);
    float p[LANES];
    _mm256_storeu_ps(p, acc);
    return combine(p);
}

__attribute__((target("avx2,fma"))) static void axpy_avx2(float a, const float *v, float *acc,
                                                          int64_t D) {
    const __m256 av = _mm256_set1_ps(a);
    for (int64_t d = 0; d < D; d += LANES)
        _mm256_storeu_ps(acc + d,
                         _mm256_fmadd_ps(av, _mm256_loadu_ps(v + d), _mm256_loadu_ps(acc + d)));
}

static void axpy_scalar(float a, const float *v, float *acc, int64_t D) {
    for (int64_t d = 0; d < D; d++) acc[d] = fmaf(a, v[d], acc[d]);
}

/* q [T, H, D]; the caches [slots, Hkv, max_len, D] (contiguous, fp32); query t attends keys
 * [0, lens[t]) of slot slots[t]; out [T, H, D]. D must be a multiple of 8. */
int fo_attention(const float *q, const float *kc, const float *vc, int64_t max_len,
                 const int64_t *slots, const int64_t *lens, int64_t T, int64_t H, int64_t Hkv,
                 int64_t D, float scale, float *out) {
    if (D % LANES || H % Hkv) return -1;
    if (use_avx2 < 0) fo_set_simd(-1);
    const int simd = use_avx2;
    const int64_t group = H / Hkv;
    int failed = 0;
    int64_t work = 0;
    for (int64_t t = 0; t < T; t++) work += lens[t];
    work *= H * D;
#pragma omp parallel for schedule(static) if (work >= PARALLEL_WORK)
    for (int64_t th = 0; th < T * H; th++) {
        const int64_t t = th / H, h = th % H, len = lens[t];
        const int64_t head = (slots[t] * Hkv + h / group) * max_len * D;
        const float *qv = q + th * D, *kh = kc + head, *vh = vc + head;
        float *o = out + th * D;
        float *s = malloc(sizeof(float) * (len > 0 ? len : 1));
        if (!s) {
            failed = 1;
            continue;
        }
        float mx = -INFINITY;
        for (int64_t j = 0; j < len; j++) {
            s[j] = (simd ? dot_avx2(qv, kh + j * D, D) : dot_scalar(qv, kh + j * D, D)) * scale;
            if (s[j] > mx) mx = s[j];
        }
        float sum = 0.0f;
        for (int64_t j = 0; j < len; j++) {
            s[j] = expf(s[j] - mx);
            sum += s[j];
        }
        for (int64_t d = 0; d < D; d++) o[d] = 0.0f;
        for (int64_t j = 0; j < len; j++) {
            if (simd)
                axpy_avx2(s[j], vh + j * D, o, D);
            else
                axpy_scalar(s[j], vh + j * D, o, D);
        }
        for (int64_t d = 0; d < D; d++) o[d] = o[d] / sum;
        free(s);
    }
    return failed ? -2 : 0;
}

/* the sum of squares of x[0, D) in the dot product's order; a tail past the last 8 in order */
static float sum_squares(const float *x, int64_t D, int simd) {
    const int64_t body = D - D % LANES;
    float s = body ? (simd ? dot_avx2(x, x, body) : dot_scalar(x, x, body)) : 0.0f;
    for (int64_t d = body; d < D; d++) s = fmaf(x[d], x[d], s);
    return s;
}

/* x, y [M, D]; w [D] */
int fo_rms_norm(const float *x, const float *w, float *y, int64_t M, int64_t D, float eps) {
    if (use_avx2 < 0) fo_set_simd(-1);
    const int simd = use_avx2;
#pragma omp parallel for schedule(static) if (M * D >= PARALLEL_WORK)
    for (int64_t m = 0; m < M; m++) {
        const float *xr = x + m * D;
        float *yr = y + m * D;
        const float inv = 1.0f / sqrtf(sum_squares(xr, D, simd) / (float)D + eps);
        for (int64_t d = 0; d < D; d++) yr[d] = w[d] * (xr[d] * inv);
    }
    return 0;
}

/* gate_up [M, 2N] (gate columns, then up columns) -> y [M, N] */
int fo_silu_mul(const float *gate_up, float *y, int64_t M, int64_t N) {
#pragma omp parallel for schedule(static) if (M * N * 16 >= PARALLEL_WORK)
    for (int64_t m = 0; m < M; m++) {
        const float *g = gate_up + m * 2 * N, *u = g + N;
        float *yr = y + m * N;
        for (int64_t n = 0; n < N; n++) yr[n] = g[n] / (1.0f + expf(-g[n])) * u[n];
    }
    return 0;
}
