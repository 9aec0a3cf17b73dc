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
 * Portable C11 with x86-64 SIMD variants: each in functions compiled for their instruction set
 * (target attributes), chosen at run time by the CPU's features (fo_set_isa), so one build runs on
 * any x86-64 CPU. Elsewhere (aarch64, ...) only the plain C path is compiled. OpenMP where the
 * compiler has it (_OPENMP), else one thread: the pragmas are then ignored and every result is
 * the same. Built at install as the extension origin.engine.kernels._fixed_order (build.py: -O2
 * -ffp-contract=off, -fopenmp where it works); no -ffast-math: the compiler may not reassociate,
 * nor contract a multiply and an add into an FMA the order above does not name. */
#include "fixed_order.h"

#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

/* FO_SCALAR_ONLY: compile the plain C path alone, as on a CPU without x86-64's vector units
 * (tests build it on x86-64 to run what aarch64 runs) */
#if (defined(__x86_64__) || defined(_M_X64)) && !defined(FO_SCALAR_ONLY)
#define FO_X86 1
#include <cpuid.h>
#include <immintrin.h>
#else
#define FO_X86 0
#endif

#ifndef _OPENMP /* the pragmas are then ignored, on purpose: every loop runs on the calling thread */
#ifdef __clang__
#pragma clang diagnostic ignored "-Wsource-uses-openmp"
#endif
#pragma GCC diagnostic ignored "-Wunknown-pragmas"
#endif

#ifndef FO_SOURCE_DIGEST /* build.py defines it: the digest of this file and the header */
#define FO_SOURCE_DIGEST ""
#endif

#define PANEL FO_PANEL
#define QK FO_QK
#define LANES 8

/* GGUF blocks, repacked by panel: weights [N / PANEL][K / QK] blocks, each holding one panel's
 * 16 columns over QK = 32 rows of the reduction.
 *   Q4_1: d[16], m[16] (fp16), then per pair of rows (k, k + 1) 16 bytes: byte c = q[k][c] |
 *         q[k + 1][c] << 4;
 *         w = d * q + m (q in 0..15), as gguf computes it: fl(fl(d * q) + m). d has 11
 *         significant bits and q 4, so d * q is exact in fp32 and that is one fma(d, q, m).
 *   Q8_0: d[16] (fp16), then per row k 16 int8 q; w = fl(d * q).
 * These are the values gguf's dequantization gives (what the fp32 model holds), so a GGUF
 * weight's products are bitwise those of its fp32 copy. */
#define Q4_BLOCK (4 * PANEL + QK * PANEL / 2)
#define Q8_BLOCK (2 * PANEL + QK * PANEL)
_Static_assert(Q4_BLOCK == FO_Q4_1_BYTES && Q8_BLOCK == FO_Q8_0_BYTES, "fixed_order.h's sizes");

/* Work (multiply-adds) below which a call runs on the calling thread alone. A parallel region's
 * barrier waits for every thread: on a loaded machine a descheduled thread costs a time slice per
 * call, and a decode step makes ~150 calls. Small calls (a batch-1 layer GEMM: 0.3-1.8M) stay
 * serial; large ones (the LM head, batches, prompts) split. Results do not depend on it. */
#define PARALLEL_WORK (1 << 21)

/* The level in use (enum fo_isa; -1: decided on the first call). Each call reads it once and
 * hands it down as `simd`: FO_ISA_SCALAR plain C; FO_ISA_AVX2 the AVX2 + FMA (+ F16C) variants;
 * FO_ISA_AVX512 and AVX-512 for GGUF blocks; FO_ISA_VNNI and VNNI for 8-bit activations. */
static int level = -1;
/* the fo_path bits of the variants run since fo_take_paths last read them */
static unsigned int paths = 0;

/* The highest level from cpuid, where the OS also saves the registers it uses (xgetbv: the YMM
 * state for AVX2; the opmask and ZMM states for AVX-512). cpuid itself, not the compiler's
 * feature names: GCC and clang (Apple's too) know different ones. */
int fo_isa_supported(void) {
#if FO_X86
    unsigned int a, b, c, d;
    if (!__get_cpuid(1, &a, &b, &c, &d)) return FO_ISA_SCALAR;
    const unsigned int fma = c >> 12 & 1, osxsave = c >> 27 & 1, avx = c >> 28 & 1,
                       f16c = c >> 29 & 1;
    if (!(fma && osxsave && avx && f16c)) return FO_ISA_SCALAR;
    unsigned int xcr0, xcr0_high;
    __asm__ volatile("xgetbv" : "=a"(xcr0), "=d"(xcr0_high) : "c"(0));
    (void)xcr0_high;
    if ((xcr0 & 0x6) != 0x6 || !__get_cpuid_count(7, 0, &a, &b, &c, &d) || !(b >> 5 & 1))
        return FO_ISA_SCALAR; /* no YMM state, or no AVX2 */
    const unsigned int avx512 = (b >> 16 & 1) && (b >> 30 & 1) && (b >> 31 & 1); /* F, BW, VL */
    if (!avx512 || (xcr0 & 0xe6) != 0xe6) return FO_ISA_AVX2;
    return c >> 11 & 1 ? FO_ISA_VNNI : FO_ISA_AVX512; /* AVX512_VNNI */
#else
    return FO_ISA_SCALAR;
#endif
}

int fo_set_isa(int want) {
    const int best = fo_isa_supported();
    level = want < 0 || want > best ? best : want;
    return level;
}

int fo_isa(void) { return level < 0 ? fo_set_isa(-1) : level; }

unsigned int fo_take_paths(void) { return __atomic_exchange_n(&paths, 0u, __ATOMIC_RELAXED); }

/* a variant of the path bit's level ran; a read first, so threads do not fight over the line */
static inline void took(unsigned int bit) {
    if (!(__atomic_load_n(&paths, __ATOMIC_RELAXED) & bit))
        __atomic_fetch_or(&paths, bit, __ATOMIC_RELAXED);
}

int fo_a8_path(void) {
    const int simd = fo_isa();
    return simd == FO_ISA_VNNI ? 2 : simd >= FO_ISA_AVX2 ? 1 : 0;
}

long fo_openmp(void) {
#ifdef _OPENMP
    return _OPENMP;
#else
    return FO_OK;
#endif
}

const char *fo_source_digest(void) { return FO_SOURCE_DIGEST; }

static inline float w_scalar(const void *w, int kind, int64_t i) {
    if (kind == FO_F32) return ((const float *)w)[i];
    if (kind == FO_BF16) {
        uint32_t u = (uint32_t)((const uint16_t *)w)[i] << 16;
        float f;
        memcpy(&f, &u, 4);
        return f;
    }
    return (float)((const int8_t *)w)[i];
}

/* IEEE half to float, exactly (F16C's conversion) */
static float half_float(uint16_t h) {
    const uint32_t sign = (uint32_t)(h >> 15) << 31, exp = (h >> 10) & 31, man = h & 1023;
    uint32_t u;
    if (exp == 31)
        u = sign | 0x7f800000u | (man << 13);
    else if (exp)
        u = sign | ((exp + 112) << 23) | (man << 13);
    else if (!man)
        u = sign;
    else { /* subnormal: exact in float */
        const float f = (float)man * 0x1p-24f;
        memcpy(&u, &f, 4);
        u |= sign;
    }
    float f;
    memcpy(&f, &u, 4);
    return f;
}

/* weight (k, column c) of a panel, as every path computes it */
static inline float weight_at(const void *w, int kind, int64_t K, int64_t panel, int64_t k,
                              int c) {
    if (kind < FO_Q4_1) return w_scalar(w, kind, panel * K * PANEL + k * PANEL + c);
    const int64_t block = panel * (K / QK) + k / QK, kk = k % QK;
    if (kind == FO_Q4_1) {
        const uint8_t *b = (const uint8_t *)w + block * Q4_BLOCK;
        const uint16_t *dm = (const uint16_t *)b;
        const uint8_t byte = b[4 * PANEL + kk / 2 * PANEL + c];
        const float q = (float)(kk % 2 ? byte >> 4 : byte & 15);
        return fmaf(half_float(dm[c]), q, half_float(dm[PANEL + c]));
    }
    const uint8_t *b = (const uint8_t *)w + block * Q8_BLOCK;
    return half_float(((const uint16_t *)b)[c]) * (float)((const int8_t *)b)[2 * PANEL + kk * PANEL + c];
}

/* the reference order: rows [r0, r0 + rows) of one panel */
static void panel_scalar(const float *x, int64_t ldx, int rows, const void *w, int kind,
                         int64_t K, int64_t panel, float *y, int64_t ldy) {
    for (int r = 0; r < rows; r++) {
        float acc[PANEL];
        for (int c = 0; c < PANEL; c++) acc[c] = 0.0f;
        for (int64_t k = 0; k < K; k++) {
            const float xv = x[r * ldx + k];
            for (int c = 0; c < PANEL; c++)
                acc[c] = fmaf(xv, weight_at(w, kind, K, panel, k, c), acc[c]);
        }
        memcpy(y + r * ldy + panel * PANEL, acc, sizeof acc);
    }
}

/* row tiles: a panel's rows are taken 6, 4, 2, then 1 at a time */
static const int TILE_ROWS[4] = {6, 4, 2, 1};
/* panels a one-row call takes at once, and the unit a call's panels are split by over threads */
#define GROUP 4

#if FO_X86
__attribute__((target("avx2,fma"))) static inline __m256 w_load(const void *w, int kind,
                                                                 int64_t i) {
    if (kind == FO_F32) return _mm256_loadu_ps((const float *)w + i);
    if (kind == FO_BF16) {
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
#define DECL(r)                                                                                 \
    __m256 a0_##r = from_y ? _mm256_loadu_ps(y + (r) * ldy + panel * PANEL) : _mm256_setzero_ps(); \
    __m256 a1_##r = from_y ? _mm256_loadu_ps(y + (r) * ldy + panel * PANEL + LANES)             \
                           : _mm256_setzero_ps();
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
                                                         int64_t panel, float *y, int64_t ldy,  \
                                                         int from_y) {                          \
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
DEFINE_TILES(FO_F32, f32)
DEFINE_TILES(FO_BF16, bf16)
DEFINE_TILES(FO_I8, i8)

typedef void (*tile_fn)(const float *, int64_t, const void *, int64_t, int64_t, float *, int64_t,
                        int);
static const tile_fn TILES[3][4] = {
    {tile6_f32, tile4_f32, tile2_f32, tile1_f32},
    {tile6_bf16, tile4_bf16, tile2_bf16, tile1_bf16},
    {tile6_i8, tile4_i8, tile2_i8, tile1_i8},
};

/* one row, GROUP panels at once: 2 * GROUP independent FMA chains, enough to hide the FMA
 * latency a single panel's two chains expose at batch 1 (each column's order is unchanged) */
#define G_DECL(p) __m256 g0_##p = _mm256_setzero_ps(), g1_##p = _mm256_setzero_ps();
#define G_STEP(p)                                                                               \
    {                                                                                           \
        const int64_t i = (panel + (p)) * K * PANEL + k * PANEL;                                \
        g0_##p = _mm256_fmadd_ps(xv, w_load(w, kind, i), g0_##p);                               \
        g1_##p = _mm256_fmadd_ps(xv, w_load(w, kind, i + LANES), g1_##p);                       \
    }
#define G_STORE(p)                                                                              \
    _mm256_storeu_ps(y + (panel + (p)) * PANEL, g0_##p);                                        \
    _mm256_storeu_ps(y + (panel + (p)) * PANEL + LANES, g1_##p);
#define DEFINE_ROW_GROUP(NAME, KIND)                                                            \
    __attribute__((target("avx2,fma"))) static void NAME(const float *x, const void *w,         \
                                                         int64_t K, int64_t panel, float *y) {  \
        const int kind = KIND;                                                                  \
        REP4(G_DECL)                                                                            \
        for (int64_t k = 0; k < K; k++) {                                                       \
            const __m256 xv = _mm256_broadcast_ss(x + k);                                       \
            REP4(G_STEP)                                                                        \
        }                                                                                       \
        REP4(G_STORE)                                                                           \
    }
DEFINE_ROW_GROUP(group_f32, FO_F32)
DEFINE_ROW_GROUP(group_bf16, FO_BF16)
DEFINE_ROW_GROUP(group_i8, FO_I8)

/* GGUF blocks in AVX2: one block row k's 16 weights as two vectors of 8, as weight_at computes
 * them (d, m: the block's scales as floats) */
__attribute__((target("avx2,fma,f16c"))) static inline void q_row(const uint8_t *b, int kind,
                                                                  int64_t kk, __m256 d0, __m256 d1,
                                                                  __m256 m0, __m256 m1,
                                                                  __m256 *w0, __m256 *w1) {
    if (kind == FO_Q4_1) {
        __m128i nib = _mm_loadu_si128((const __m128i *)(b + 4 * PANEL + kk / 2 * PANEL));
        if (kk % 2) nib = _mm_srli_epi16(nib, 4);
        const __m128i q = _mm_and_si128(nib, _mm_set1_epi8(15));
        *w0 = _mm256_fmadd_ps(d0, _mm256_cvtepi32_ps(_mm256_cvtepu8_epi32(q)), m0);
        *w1 = _mm256_fmadd_ps(d1, _mm256_cvtepi32_ps(_mm256_cvtepu8_epi32(_mm_srli_si128(q, 8))),
                              m1);
    } else {
        const __m128i q = _mm_loadu_si128((const __m128i *)(b + 2 * PANEL + kk * PANEL));
        *w0 = _mm256_mul_ps(d0, _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(q)));
        *w1 = _mm256_mul_ps(d1, _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(_mm_srli_si128(q, 8))));
    }
}

__attribute__((target("avx2,fma,f16c"))) static inline const uint8_t *
q_block(const void *w, int kind, int64_t K, int64_t panel, int64_t g, __m256 *d0, __m256 *d1,
        __m256 *m0, __m256 *m1) {
    const uint8_t *b =
        (const uint8_t *)w + (panel * (K / QK) + g) * (kind == FO_Q4_1 ? Q4_BLOCK : Q8_BLOCK);
    *d0 = _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)b));
    *d1 = _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(b + 16)));
    if (kind == FO_Q4_1) {
        *m0 = _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(b + 32)));
        *m1 = _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(b + 48)));
    }
    return b;
}

/* block (panel, g) as floats [QK][PANEL] */
__attribute__((target("avx2,fma,f16c"))) static void q_dequant(const void *w, int kind, int64_t K,
                                                               int64_t panel, int64_t g,
                                                               float *tile) {
    __m256 d0, d1, m0 = _mm256_setzero_ps(), m1 = m0, w0, w1;
    const uint8_t *b = q_block(w, kind, K, panel, g, &d0, &d1, &m0, &m1);
    for (int64_t kk = 0; kk < QK; kk++) {
        q_row(b, kind, kk, d0, d1, m0, m1, &w0, &w1);
        _mm256_storeu_ps(tile + kk * PANEL, w0);
        _mm256_storeu_ps(tile + kk * PANEL + LANES, w1);
    }
}

/* one row, GROUP panels of GGUF blocks at once, the weights dequantized in registers */
#define QG_DECL(p) __m256 g0_##p = _mm256_setzero_ps(), g1_##p = g0_##p, d0_##p, d1_##p, m0_##p = g0_##p, m1_##p = g0_##p; const uint8_t *b_##p;
#define QG_LOAD(p) b_##p = q_block(w, kind, K, panel + (p), g, &d0_##p, &d1_##p, &m0_##p, &m1_##p);
#define QG_STEP(p)                                                                              \
    {                                                                                           \
        __m256 w0, w1;                                                                          \
        q_row(b_##p, kind, kk, d0_##p, d1_##p, m0_##p, m1_##p, &w0, &w1);                       \
        g0_##p = _mm256_fmadd_ps(xv, w0, g0_##p);                                               \
        g1_##p = _mm256_fmadd_ps(xv, w1, g1_##p);                                               \
    }
#define DEFINE_Q_GROUP(NAME, KIND)                                                              \
    __attribute__((target("avx2,fma,f16c"))) static void NAME(const float *x, const void *w,    \
                                                              int64_t K, int64_t panel,         \
                                                              float *y) {                       \
        const int kind = KIND;                                                                  \
        REP4(QG_DECL)                                                                           \
        for (int64_t g = 0; g < K / QK; g++) {                                                  \
            REP4(QG_LOAD)                                                                       \
            for (int64_t kk = 0; kk < QK; kk++) {                                               \
                const __m256 xv = _mm256_broadcast_ss(x + g * QK + kk);                         \
                REP4(QG_STEP)                                                                   \
            }                                                                                   \
        }                                                                                       \
        REP4(G_STORE)                                                                           \
    }
DEFINE_Q_GROUP(group_q4_1, FO_Q4_1)
DEFINE_Q_GROUP(group_q8_0, FO_Q8_0)

/* The same for CPUs with AVX-512: a panel's 16 columns in one register, the same operations per
 * lane (so the same bits), half the instructions: the 4-bit kernel is bound by them, not by
 * memory, on a 2-core machine */
#define T512 __attribute__((target("avx512f,avx512bw,avx512vl,fma,f16c")))
#define Z_DECL(p) __m512 z_##p = _mm512_setzero_ps(), zd_##p, zm_##p = z_##p; const uint8_t *zb_##p;
#define Z_LOAD(p)                                                                               \
    zb_##p = (const uint8_t *)w + ((panel + (p)) * (K / QK) + g) * BLOCK;                       \
    zd_##p = _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)zb_##p));                      \
    if (kind == FO_Q4_1) zm_##p = _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)(zb_##p + 32)));
#define Z_STEP(p)                                                                               \
    if (kind == FO_Q4_1) { /* rows kk and kk + 1 from one 16-byte load */                        \
        const __m512i v = _mm512_cvtepu8_epi32(                                                 \
            _mm_loadu_si128((const __m128i *)(zb_##p + 4 * PANEL + kk / 2 * PANEL)));           \
        const __m512 wa = _mm512_fmadd_ps(                                                      \
            zd_##p, _mm512_cvtepi32_ps(_mm512_and_si512(v, _mm512_set1_epi32(15))), zm_##p);    \
        const __m512 wb =                                                                       \
            _mm512_fmadd_ps(zd_##p, _mm512_cvtepi32_ps(_mm512_srli_epi32(v, 4)), zm_##p);       \
        z_##p = _mm512_fmadd_ps(xa, wa, z_##p);                                                 \
        z_##p = _mm512_fmadd_ps(xb, wb, z_##p);                                                 \
    } else {                                                                                    \
        for (int h = 0; h < 2; h++) {                                                           \
            const __m128i q =                                                                   \
                _mm_loadu_si128((const __m128i *)(zb_##p + 2 * PANEL + (kk + h) * PANEL));      \
            const __m512 wv = _mm512_mul_ps(zd_##p, _mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(q))); \
            z_##p = _mm512_fmadd_ps(h ? xb : xa, wv, z_##p);                                    \
        }                                                                                       \
    }
#define Z_STORE(p) _mm512_storeu_ps(y + (panel + (p)) * PANEL, z_##p);
#define DEFINE_Q_GROUP_512(NAME, KIND, BLOCK_BYTES)                                             \
    T512 static void NAME(const float *x, const void *w, int64_t K, int64_t panel, float *y) {  \
        const int kind = KIND;                                                                  \
        const int64_t BLOCK = BLOCK_BYTES;                                                      \
        REP4(Z_DECL)                                                                            \
        for (int64_t g = 0; g < K / QK; g++) {                                                  \
            REP4(Z_LOAD)                                                                        \
            for (int64_t kk = 0; kk < QK; kk += 2) {                                            \
                const __m512 xa = _mm512_set1_ps(x[g * QK + kk]);                               \
                const __m512 xb = _mm512_set1_ps(x[g * QK + kk + 1]);                           \
                REP4(Z_STEP)                                                                    \
            }                                                                                   \
        }                                                                                       \
        REP4(Z_STORE)                                                                           \
    }
DEFINE_Q_GROUP_512(group512_q4_1, FO_Q4_1, Q4_BLOCK)
DEFINE_Q_GROUP_512(group512_q8_0, FO_Q8_0, Q8_BLOCK)

/* GGUF panels for any row count: the panel dequantized once (into scratch: K x PANEL floats),
 * then the float tiles over the whole reduction, as fp32 weights run (the same chains); without
 * scratch, block by block through L1, each output's chain continued from the previous block */
static void q_panel(const float *x, int64_t ldx, const void *w, int kind, float *y, int64_t ldy,
                    int64_t M, int64_t K, int64_t p) {
    float *panel = malloc(sizeof(float) * K * PANEL);
    if (panel) {
        for (int64_t g = 0; g < K / QK; g++) q_dequant(w, kind, K, p, g, panel + g * QK * PANEL);
        int64_t r0 = 0;
        for (int t = 0; t < 4; t++)
            for (const int rows = TILE_ROWS[t]; M - r0 >= rows; r0 += rows)
                TILES[FO_F32][t](x + r0 * ldx, ldx, panel, K, 0, y + r0 * ldy + p * PANEL, ldy, 0);
        free(panel);
        return;
    }
    float tile[QK * PANEL] __attribute__((aligned(32)));
    for (int64_t g = 0; g < K / QK; g++) {
        q_dequant(w, kind, K, p, g, tile);
        int64_t r0 = 0;
        for (int t = 0; t < 4; t++)
            for (const int rows = TILE_ROWS[t]; M - r0 >= rows; r0 += rows)
                TILES[FO_F32][t](x + r0 * ldx + g * QK, ldx, tile, QK, 0, y + r0 * ldy + p * PANEL,
                                ldy, g > 0);
    }
}

#endif /* FO_X86 */

/* panels [p0, p1) of y [M, N] = x [M, K] @ w: every output in the fixed order */
static void gemm_panels(const float *x, int64_t ldx, const void *w, int kind, float *y,
                        int64_t ldy, int64_t M, int64_t K, int64_t p0, int64_t p1, int simd) {
    (void)simd; /* unused where only plain C is compiled */
#if FO_X86
    static void (*const groups[5])(const float *, const void *, int64_t, int64_t, float *) = {
        group_f32, group_bf16, group_i8, group_q4_1, group_q8_0};
#endif
    for (int64_t p = p0; p < p1; p++) {
        int64_t r0 = 0;
#if FO_X86
        if (simd && M == 1 && p + GROUP <= p1) {
            if (simd >= FO_ISA_AVX512 && (kind == FO_Q4_1 || kind == FO_Q8_0)) {
                took(FO_PATH_AVX512);
                (kind == FO_Q4_1 ? group512_q4_1 : group512_q8_0)(x, w, K, p, y);
            } else {
                took(FO_PATH_AVX2);
                groups[kind](x, w, K, p, y);
            }
            p += GROUP - 1;
            continue;
        }
        if (simd) {
            took(FO_PATH_AVX2);
            if (kind >= FO_Q4_1)
                q_panel(x, ldx, w, kind, y, ldy, M, K, p);
            else
                for (int t = 0; t < 4; t++)
                    for (const int rows = TILE_ROWS[t]; M - r0 >= rows; r0 += rows)
                        TILES[kind][t](x + r0 * ldx, ldx, w, K, p, y + r0 * ldy, ldy, 0);
            continue;
        }
#endif
        took(FO_PATH_SCALAR);
        for (int t = 0; t < 4; t++)
            for (const int rows = TILE_ROWS[t]; M - r0 >= rows; r0 += rows)
                panel_scalar(x + r0 * ldx, ldx, rows, w, kind, K, p, y + r0 * ldy, ldy);
    }
}

/* ---- GGUF blocks with 8-bit activations (precision gguf-a8): llama.cpp's CPU arithmetic ----
 * Each row of activations is quantized per block of QK inputs, as llama.cpp quantizes to Q8_1:
 * amax = max |x|, d = amax / 127, q = round-to-nearest-even(x * (1 / d)) in -127..127, with the
 * block's integer sum. A weight block's contribution to output (row r, column c) is then an exact
 * integer dot product isum and, in this order, acc = fma(dw, da * isum, acc) (Q4_1: and then
 * acc = fma(mw, da * sum(q), acc)), blocks in order from acc = 0. The integer sums are exact
 * whatever the instruction (VNNI or scalar) or the order of the additions, and each row is
 * quantized alone, so every output is one written-down sequence of float operations again:
 * invariant to the batch, the thread split and the ISA, but not equal to fp32's.
 * Layouts, per (panel, block):
 *   Q4_1_A8: d[16], m[16] (fp16), then for each group G of 8 reduction rows 64 bytes: byte
 *            4c + j = q[8G + j][c] | q[8G + 4 + j][c] << 4 (j < 4): one 512-bit load holds 4
 *            consecutive rows of every column in its 32-bit lane, twice (VPDPBUSD's shape).
 *   Q8_0_A8: d[16] (fp16), then for each group G of 4 rows 64 bytes: byte 4c + j =
 *            q[4G + j][c] + 128 (unsigned); the offset is taken back as 128 * sum(activations).
 * Q8_0_A16 (the LM head, where the argmax is decided): the same weights, and activations to about
 * 16 bits in two 8-bit passes: q as above, then the residual r = x - d * q quantized with
 * d2 = d / 254; acc = fma(dw, d * isum, acc), then acc = fma(dw, d2 * isum2, acc). */
typedef struct {
    int8_t *q, *q2;      /* [M][K]: the activations; the residual's (A16) */
    float *d, *s, *d2;   /* [M][K / QK]: scale, scale * sum, the residual's scale */
    int32_t *sum, *sum2; /* [M][K / QK] */
} act8;

static void act8_free(act8 *a) {
    free(a->q), free(a->q2), free(a->d), free(a->s), free(a->d2), free(a->sum), free(a->sum2);
}

/* room for M rows of K; 0, or -2 (out of memory: nothing held) */
static int act8_alloc(act8 *a, int64_t M, int64_t K) {
    const int64_t blocks = M * (K / QK) + 1;
    a->q = malloc(M * K + 1), a->q2 = malloc(M * K + 1);
    a->d = malloc(sizeof(float) * blocks), a->s = malloc(sizeof(float) * blocks);
    a->d2 = malloc(sizeof(float) * blocks);
    a->sum = malloc(sizeof(int32_t) * blocks), a->sum2 = malloc(sizeof(int32_t) * blocks);
    if (a->q && a->q2 && a->d && a->s && a->d2 && a->sum && a->sum2) return 0;
    act8_free(a);
    return -2;
}

/* a block's scale, or 0 where its inverse would overflow (|x| below ~1e-30: zeros then) */
static inline float block_scale(float amax, float levels) {
    const float d = amax / levels;
    return d < 0x1p-100f ? 0.0f : d;
}

/* round to nearest, ties to even, for |v| <= 2^22: exact in float arithmetic, no libm call */
static inline float round_even(float v) { return (v + 0x1.8p23f) - 0x1.8p23f; }

static void quantize_row(const float *x, int64_t K, int8_t *q, float *d, float *s, int32_t *sum) {
    for (int64_t g = 0; g < K / QK; g++) {
        const float *xb = x + g * QK;
        float amax = 0.0f;
        for (int k = 0; k < QK; k++) {
            const float a = fabsf(xb[k]);
            amax = a > amax ? a : amax;
        }
        const float dg = block_scale(amax, 127.0f), id = dg != 0.0f ? 1.0f / dg : 0.0f;
        int32_t total = 0;
        for (int k = 0; k < QK; k++) {
            float v = round_even(xb[k] * id);
            v = v > 127.0f ? 127.0f : v < -127.0f ? -127.0f : v;
            q[g * QK + k] = (int8_t)v;
            total += (int8_t)v;
        }
        d[g] = dg;
        sum[g] = total;
        s[g] = dg * (float)total;
    }
}

#if FO_X86
/* quantize_row in AVX-512: the same operations per element (max |x| is exact in any order) */
T512 static void quantize_row_512(const float *x, int64_t K, int8_t *q, float *d, float *s,
                                  int32_t *sum) {
    const __m512 magic = _mm512_set1_ps(0x1.8p23f), top = _mm512_set1_ps(127.0f);
    for (int64_t g = 0; g < K / QK; g++) {
        const __m512 v0 = _mm512_loadu_ps(x + g * QK), v1 = _mm512_loadu_ps(x + g * QK + 16);
        const float amax = _mm512_reduce_max_ps(_mm512_max_ps(_mm512_abs_ps(v0), _mm512_abs_ps(v1)));
        const float dg = block_scale(amax, 127.0f), id = dg != 0.0f ? 1.0f / dg : 0.0f;
        const __m512 idv = _mm512_set1_ps(id);
        __m512i n[2];
        for (int h = 0; h < 2; h++) {
            __m512 t = _mm512_sub_ps(_mm512_add_ps(_mm512_mul_ps(h ? v1 : v0, idv), magic), magic);
            t = _mm512_min_ps(_mm512_max_ps(t, _mm512_sub_ps(_mm512_setzero_ps(), top)), top);
            n[h] = _mm512_cvtps_epi32(t);
            _mm_storeu_si128((__m128i *)(q + g * QK + 16 * h), _mm512_cvtepi32_epi8(n[h]));
        }
        const int32_t total = _mm512_reduce_add_epi32(_mm512_add_epi32(n[0], n[1]));
        d[g] = dg;
        sum[g] = total;
        s[g] = dg * (float)total;
    }
}
#endif

/* the residual pass of Q8_0_A16, one row, after its first pass (plain C on every path) */
static void quantize_residual(const float *x, int64_t K, const int8_t *q, const float *d,
                              int8_t *q2, float *d2, int32_t *sum2) {
    for (int64_t g = 0; g < K / QK; g++) {
        const float dr = block_scale(d[g], 254.0f), id = dr != 0.0f ? 1.0f / dr : 0.0f;
        int32_t total = 0;
        for (int k = 0; k < QK; k++) {
            const int64_t i = g * QK + k;
            float v = round_even((x[i] - d[g] * (float)q[i]) * id);
            v = v > 127.0f ? 127.0f : v < -127.0f ? -127.0f : v;
            q2[i] = (int8_t)v;
            total += (int8_t)v;
        }
        d2[g] = dr;
        sum2[g] = total;
    }
}

/* row m of x (K wide) into a, for kind */
static void quantize(const act8 *a, const float *x, int64_t m, int64_t K, int kind, int simd) {
    (void)simd; /* unused where only plain C is compiled */
    const int64_t at = m * (K / QK);
#if FO_X86
    if (simd >= FO_ISA_AVX512) {
        took(FO_PATH_AVX512);
        quantize_row_512(x, K, a->q + m * K, a->d + at, a->s + at, a->sum + at);
    } else
#endif
        quantize_row(x, K, a->q + m * K, a->d + at, a->s + at, a->sum + at);
    if (kind == FO_Q8_0_A16)
        quantize_residual(x, K, a->q + m * K, a->d + at, a->q2 + m * K, a->d2 + at, a->sum2 + at);
}

static inline int a8_weight(const uint8_t *b, int kind, int k, int c) {
    if (kind == FO_Q4_1_A8) {
        const uint8_t byte = b[4 * PANEL + k / 8 * 64 + 4 * c + k % 4];
        return k % 8 < 4 ? byte & 15 : byte >> 4;
    }
    return (int)b[2 * PANEL + k / 4 * 64 + 4 * c + k % 4] - 128;
}

/* the integer dot products of one row's block with a block's 16 columns (w: its weights as
 * int16 [QK][PANEL]); loops the compiler vectorizes */
static inline void block_dots(const int16_t *w, const int8_t *q, int32_t isum[PANEL]) {
    for (int c = 0; c < PANEL; c++) isum[c] = 0;
    for (int k = 0; k < QK; k++)
        for (int c = 0; c < PANEL; c++) isum[c] += (int32_t)w[k * PANEL + c] * q[k];
}

#define SCALAR_ROWS 8

/* the reference: rows [0, M) of panels [p0, p1), plain C (any ISA; exact integer sums): each
 * block's weights unpacked once for up to SCALAR_ROWS rows */
static void a8_scalar(const act8 *a, int64_t K, const void *w, int kind, float *y, int64_t ldy,
                      int64_t M, int64_t p0, int64_t p1) {
    const int64_t nb = K / QK, bytes = kind == FO_Q4_1_A8 ? Q4_BLOCK : Q8_BLOCK;
    int16_t wq[QK * PANEL];
    for (int64_t p = p0; p < p1; p++)
        for (int64_t r0 = 0; r0 < M; r0 += SCALAR_ROWS) {
            const int64_t rows = M - r0 < SCALAR_ROWS ? M - r0 : SCALAR_ROWS;
            float acc[SCALAR_ROWS][PANEL] = {{0}};
            for (int64_t g = 0; g < nb; g++) {
                const uint8_t *b = (const uint8_t *)w + (p * nb + g) * bytes;
                float dw[PANEL], mw[PANEL];
                for (int c = 0; c < PANEL; c++) {
                    dw[c] = half_float(((const uint16_t *)b)[c]);
                    mw[c] = kind == FO_Q4_1_A8 ? half_float(((const uint16_t *)b)[PANEL + c]) : 0;
                    for (int k = 0; k < QK; k++) wq[k * PANEL + c] = (int16_t)a8_weight(b, kind, k, c);
                }
                for (int64_t i = 0; i < rows; i++) {
                    const int64_t r = r0 + i, at = r * nb + g;
                    int32_t isum[PANEL], isum2[PANEL];
                    block_dots(wq, a->q + r * K + g * QK, isum);
                    if (kind == FO_Q8_0_A16) block_dots(wq, a->q2 + r * K + g * QK, isum2);
                    for (int c = 0; c < PANEL; c++) {
                        acc[i][c] = fmaf(dw[c], a->d[at] * (float)isum[c], acc[i][c]);
                        if (kind == FO_Q4_1_A8) acc[i][c] = fmaf(mw[c], a->s[at], acc[i][c]);
                        if (kind == FO_Q8_0_A16)
                            acc[i][c] = fmaf(dw[c], a->d2[at] * (float)isum2[c], acc[i][c]);
                    }
                }
            }
            for (int64_t i = 0; i < rows; i++)
                memcpy(y + (r0 + i) * ldy + p * PANEL, acc[i], sizeof acc[i]);
        }
}

#if FO_X86
#if defined(__GNUC__) && !defined(__clang__)
/* the tiles' arrays are sized for A8_ROWS rows and a tile of R rows reads only the R it set;
 * GCC cannot prove it once the loops are unrolled */
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#endif
/* AVX-512 VNNI: 16 columns x 4 rows of the reduction per VPDPBUSD (unsigned weights, signed
 * activations), the block's float steps as a8_scalar's, lane by lane */
#define TVNNI __attribute__((target("avx512f,avx512bw,avx512vl,avx512vnni,fma,f16c")))
#define A8_ROWS 4

/* Q4_1_A8: rows [r0, r0 + R) (R <= A8_ROWS) of panels p, p + 1 */
TVNNI static inline void q4_tile(const act8 *a, int64_t K, const uint8_t *w, float *y,
                                 int64_t ldy, int64_t r0, const int R, int64_t p) {
    const int64_t nb = K / QK;
    const __m512i low = _mm512_set1_epi8(15);
    __m512 acc[A8_ROWS][2];
#pragma GCC unroll 4
    for (int r = 0; r < R; r++) acc[r][0] = acc[r][1] = _mm512_setzero_ps();
    for (int64_t g = 0; g < nb; g++) {
        const uint8_t *b[2] = {w + (p * nb + g) * Q4_BLOCK, w + ((p + 1) * nb + g) * Q4_BLOCK};
        __m512i is[A8_ROWS][2];
#pragma GCC unroll 4
        for (int r = 0; r < R; r++) is[r][0] = is[r][1] = _mm512_setzero_si512();
#pragma GCC unroll 4
        for (int G = 0; G < 4; G++) {
            __m512i lo[2], hi[2];
#pragma GCC unroll 2
            for (int h = 0; h < 2; h++) {
                const __m512i v = _mm512_loadu_si512(b[h] + 4 * PANEL + G * 64);
                lo[h] = _mm512_and_si512(v, low);
                hi[h] = _mm512_and_si512(_mm512_srli_epi16(v, 4), low);
            }
#pragma GCC unroll 4
            for (int r = 0; r < R; r++) {
                const int8_t *q = a->q + (r0 + r) * K + g * QK + G * 8;
                int32_t q0, q1;
                memcpy(&q0, q, 4);
                memcpy(&q1, q + 4, 4);
                const __m512i x0 = _mm512_set1_epi32(q0), x1 = _mm512_set1_epi32(q1);
#pragma GCC unroll 2
                for (int h = 0; h < 2; h++) {
                    is[r][h] = _mm512_dpbusd_epi32(is[r][h], lo[h], x0);
                    is[r][h] = _mm512_dpbusd_epi32(is[r][h], hi[h], x1);
                }
            }
        }
#pragma GCC unroll 2
        for (int h = 0; h < 2; h++) {
            const __m512 dw = _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)b[h]));
            const __m512 mw = _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)(b[h] + 32)));
#pragma GCC unroll 4
            for (int r = 0; r < R; r++) {
                const int64_t at = (r0 + r) * nb + g;
                const __m512 t =
                    _mm512_mul_ps(_mm512_set1_ps(a->d[at]), _mm512_cvtepi32_ps(is[r][h]));
                acc[r][h] = _mm512_fmadd_ps(dw, t, acc[r][h]);
                acc[r][h] = _mm512_fmadd_ps(mw, _mm512_set1_ps(a->s[at]), acc[r][h]);
            }
        }
    }
#pragma GCC unroll 4
    for (int r = 0; r < R; r++) {
        _mm512_storeu_ps(y + (r0 + r) * ldy + p * PANEL, acc[r][0]);
        _mm512_storeu_ps(y + (r0 + r) * ldy + (p + 1) * PANEL, acc[r][1]);
    }
}

/* Q8_0_A8 (PASSES 1) and Q8_0_A16 (PASSES 2: the residual's pass too): rows [r0, r0 + R) of
 * panels p, p + 1 */
TVNNI static inline void q8_tile(const act8 *a, int64_t K, const uint8_t *w, float *y,
                                 int64_t ldy, int64_t r0, const int R, int64_t p,
                                 const int PASSES) {
    const int64_t nb = K / QK;
    const int8_t *qs[2] = {a->q, a->q2};
    const float *ds[2] = {a->d, a->d2};
    const int32_t *sums[2] = {a->sum, a->sum2};
    __m512 acc[A8_ROWS][2];
#pragma GCC unroll 4
    for (int r = 0; r < R; r++) acc[r][0] = acc[r][1] = _mm512_setzero_ps();
    for (int64_t g = 0; g < nb; g++) {
        const uint8_t *b[2] = {w + (p * nb + g) * Q8_BLOCK, w + ((p + 1) * nb + g) * Q8_BLOCK};
        __m512i is[2][A8_ROWS][2];
#pragma GCC unroll 2
        for (int i = 0; i < PASSES; i++)
#pragma GCC unroll 4
            for (int r = 0; r < R; r++) is[i][r][0] = is[i][r][1] = _mm512_setzero_si512();
#pragma GCC unroll 8
        for (int G = 0; G < 8; G++) {
            const __m512i v0 = _mm512_loadu_si512(b[0] + 2 * PANEL + G * 64);
            const __m512i v1 = _mm512_loadu_si512(b[1] + 2 * PANEL + G * 64);
#pragma GCC unroll 2
            for (int i = 0; i < PASSES; i++)
#pragma GCC unroll 4
                for (int r = 0; r < R; r++) {
                    int32_t q;
                    memcpy(&q, qs[i] + (r0 + r) * K + g * QK + G * 4, 4);
                    const __m512i x = _mm512_set1_epi32(q);
                    is[i][r][0] = _mm512_dpbusd_epi32(is[i][r][0], v0, x);
                    is[i][r][1] = _mm512_dpbusd_epi32(is[i][r][1], v1, x);
                }
        }
#pragma GCC unroll 2
        for (int h = 0; h < 2; h++) {
            const __m512 dw = _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)b[h]));
#pragma GCC unroll 2
            for (int i = 0; i < PASSES; i++)
#pragma GCC unroll 4
                for (int r = 0; r < R; r++) {
                    const int64_t at = (r0 + r) * nb + g;
                    /* the weights' +128 offset taken back */
                    const __m512i isum =
                        _mm512_sub_epi32(is[i][r][h], _mm512_set1_epi32(128 * sums[i][at]));
                    const __m512 t =
                        _mm512_mul_ps(_mm512_set1_ps(ds[i][at]), _mm512_cvtepi32_ps(isum));
                    acc[r][h] = _mm512_fmadd_ps(dw, t, acc[r][h]);
                }
        }
    }
#pragma GCC unroll 4
    for (int r = 0; r < R; r++) {
        _mm512_storeu_ps(y + (r0 + r) * ldy + p * PANEL, acc[r][0]);
        _mm512_storeu_ps(y + (r0 + r) * ldy + (p + 1) * PANEL, acc[r][1]);
    }
}

/* the tiles with their row counts and passes fixed (each compiled with its loops unrolled) */
#define A8_TILE(NAME, CALL)                                                                     \
    TVNNI static void NAME(const act8 *a, int64_t K, const uint8_t *w, float *y, int64_t ldy,   \
                           int64_t r0, int64_t p) {                                             \
        CALL;                                                                                   \
    }
A8_TILE(q4_tile4, q4_tile(a, K, w, y, ldy, r0, 4, p))
A8_TILE(q4_tile1, q4_tile(a, K, w, y, ldy, r0, 1, p))
A8_TILE(q8_tile4, q8_tile(a, K, w, y, ldy, r0, 4, p, 1))
A8_TILE(q8_tile1, q8_tile(a, K, w, y, ldy, r0, 1, p, 1))
A8_TILE(q16_tile4, q8_tile(a, K, w, y, ldy, r0, 4, p, 2))
A8_TILE(q16_tile1, q8_tile(a, K, w, y, ldy, r0, 1, p, 2))

/* AVX2 without VNNI: VPDPBUSD's exact sums as VPMADDUBSW (unsigned x signed bytes, pairs
 * summed in 16 bits), on 4-bit weights only: Q4_1's nibbles as they are, each Q8_0 byte as two
 * nibbles (16 hi + lo). A 16-bit lane gets at most 8 such pairs in a block (activations are in
 * -127..127): |sum| <= 8 * 2 * 15 * 127 = 30480 < 2^15, exact, and widened to 32 bits (VPMADDWD)
 * once per block. Half a panel (8 columns, one 256-bit vector) at a time; the block's float
 * steps are a8_scalar's, lane by lane. */
#define TAVX2 __attribute__((target("avx2,fma,f16c")))

/* Q4_1_A8: rows [r0, r0 + R) (R <= A8_ROWS) of columns 8h..8h + 7 of panel p */
TAVX2 static inline void q4_half(const act8 *a, int64_t K, const uint8_t *w, float *y,
                                 int64_t ldy, int64_t r0, const int R, int64_t p, int h) {
    const int64_t nb = K / QK;
    const __m256i low = _mm256_set1_epi8(15), ones = _mm256_set1_epi16(1);
    __m256 acc[A8_ROWS];
#pragma GCC unroll 4
    for (int r = 0; r < R; r++) acc[r] = _mm256_setzero_ps();
    for (int64_t g = 0; g < nb; g++) {
        const uint8_t *b = w + (p * nb + g) * Q4_BLOCK;
        __m256i pairs[A8_ROWS]; /* 16-bit sums of 8 pairs */
#pragma GCC unroll 4
        for (int r = 0; r < R; r++) pairs[r] = _mm256_setzero_si256();
#pragma GCC unroll 4
        for (int G = 0; G < 4; G++) {
            const __m256i v = _mm256_loadu_si256((const __m256i *)(b + 4 * PANEL + G * 64 + 32 * h));
            const __m256i lo = _mm256_and_si256(v, low);
            const __m256i hi = _mm256_and_si256(_mm256_srli_epi16(v, 4), low);
#pragma GCC unroll 4
            for (int r = 0; r < R; r++) {
                const int8_t *q = a->q + (r0 + r) * K + g * QK + G * 8;
                int32_t q0, q1;
                memcpy(&q0, q, 4);
                memcpy(&q1, q + 4, 4);
                pairs[r] = _mm256_add_epi16(
                    pairs[r], _mm256_add_epi16(_mm256_maddubs_epi16(lo, _mm256_set1_epi32(q0)),
                                               _mm256_maddubs_epi16(hi, _mm256_set1_epi32(q1))));
            }
        }
        __m256i is[A8_ROWS];
#pragma GCC unroll 4
        for (int r = 0; r < R; r++) is[r] = _mm256_madd_epi16(pairs[r], ones);
        const __m256 dw = _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(b + 16 * h)));
        const __m256 mw = _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(b + 32 + 16 * h)));
#pragma GCC unroll 4
        for (int r = 0; r < R; r++) {
            const int64_t at = (r0 + r) * nb + g;
            const __m256 t = _mm256_mul_ps(_mm256_set1_ps(a->d[at]), _mm256_cvtepi32_ps(is[r]));
            acc[r] = _mm256_fmadd_ps(dw, t, acc[r]);
            acc[r] = _mm256_fmadd_ps(mw, _mm256_set1_ps(a->s[at]), acc[r]);
        }
    }
#pragma GCC unroll 4
    for (int r = 0; r < R; r++) _mm256_storeu_ps(y + (r0 + r) * ldy + p * PANEL + 8 * h, acc[r]);
}

/* Q8_0_A8 (PASSES 1) and Q8_0_A16 (PASSES 2): rows [r0, r0 + R) of columns 8h..8h + 7 of p */
TAVX2 static inline void q8_half(const act8 *a, int64_t K, const uint8_t *w, float *y,
                                 int64_t ldy, int64_t r0, const int R, int64_t p, int h,
                                 const int PASSES) {
    const int64_t nb = K / QK;
    const int8_t *qs[2] = {a->q, a->q2};
    const float *ds[2] = {a->d, a->d2};
    const int32_t *sums[2] = {a->sum, a->sum2};
    const __m256i low = _mm256_set1_epi8(15), ones = _mm256_set1_epi16(1);
    const __m256i sixteen = _mm256_set1_epi16(16);
    __m256 acc[A8_ROWS];
#pragma GCC unroll 4
    for (int r = 0; r < R; r++) acc[r] = _mm256_setzero_ps();
    for (int64_t g = 0; g < nb; g++) {
        const uint8_t *b = w + (p * nb + g) * Q8_BLOCK;
        __m256i los[2][A8_ROWS], his[2][A8_ROWS]; /* 16-bit sums of 8 pairs */
#pragma GCC unroll 2
        for (int i = 0; i < PASSES; i++)
#pragma GCC unroll 4
            for (int r = 0; r < R; r++) los[i][r] = his[i][r] = _mm256_setzero_si256();
#pragma GCC unroll 8
        for (int G = 0; G < 8; G++) {
            const __m256i v = _mm256_loadu_si256((const __m256i *)(b + 2 * PANEL + G * 64 + 32 * h));
            const __m256i lo = _mm256_and_si256(v, low);
            const __m256i hi = _mm256_and_si256(_mm256_srli_epi16(v, 4), low);
#pragma GCC unroll 2
            for (int i = 0; i < PASSES; i++)
#pragma GCC unroll 4
                for (int r = 0; r < R; r++) {
                    int32_t q;
                    memcpy(&q, qs[i] + (r0 + r) * K + g * QK + G * 4, 4);
                    const __m256i x = _mm256_set1_epi32(q);
                    los[i][r] = _mm256_add_epi16(los[i][r], _mm256_maddubs_epi16(lo, x));
                    his[i][r] = _mm256_add_epi16(his[i][r], _mm256_maddubs_epi16(hi, x));
                }
        }
        __m256i is[2][A8_ROWS];
#pragma GCC unroll 2
        for (int i = 0; i < PASSES; i++)
#pragma GCC unroll 4
            for (int r = 0; r < R; r++)
                is[i][r] = _mm256_add_epi32(_mm256_madd_epi16(los[i][r], ones),
                                            _mm256_madd_epi16(his[i][r], sixteen));
        const __m256 dw = _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(b + 16 * h)));
#pragma GCC unroll 2
        for (int i = 0; i < PASSES; i++)
#pragma GCC unroll 4
            for (int r = 0; r < R; r++) {
                const int64_t at = (r0 + r) * nb + g;
                /* the weights' +128 offset taken back */
                const __m256i isum =
                    _mm256_sub_epi32(is[i][r], _mm256_set1_epi32(128 * sums[i][at]));
                const __m256 t = _mm256_mul_ps(_mm256_set1_ps(ds[i][at]), _mm256_cvtepi32_ps(isum));
                acc[r] = _mm256_fmadd_ps(dw, t, acc[r]);
            }
    }
#pragma GCC unroll 4
    for (int r = 0; r < R; r++) _mm256_storeu_ps(y + (r0 + r) * ldy + p * PANEL + 8 * h, acc[r]);
}

#define A8_HALF(NAME, CALL)                                                                     \
    TAVX2 static void NAME(const act8 *a, int64_t K, const uint8_t *w, float *y, int64_t ldy,   \
                           int64_t r0, int64_t p, int h) {                                      \
        CALL;                                                                                   \
    }
A8_HALF(q4_half4, q4_half(a, K, w, y, ldy, r0, 4, p, h))
A8_HALF(q4_half1, q4_half(a, K, w, y, ldy, r0, 1, p, h))
A8_HALF(q8_half4, q8_half(a, K, w, y, ldy, r0, 4, p, h, 1))
A8_HALF(q8_half1, q8_half(a, K, w, y, ldy, r0, 1, p, h, 1))
A8_HALF(q16_half4, q8_half(a, K, w, y, ldy, r0, 4, p, h, 2))
A8_HALF(q16_half1, q8_half(a, K, w, y, ldy, r0, 1, p, h, 2))

static void a8_avx2(const act8 *a, int64_t K, const void *w, int kind, float *y, int64_t ldy,
                    int64_t M, int64_t p0, int64_t p1) {
    typedef void (*half_fn)(const act8 *, int64_t, const uint8_t *, float *, int64_t, int64_t,
                            int64_t, int);
    const half_fn four = kind == FO_Q4_1_A8 ? q4_half4 : kind == FO_Q8_0_A8 ? q8_half4 : q16_half4;
    const half_fn one = kind == FO_Q4_1_A8 ? q4_half1 : kind == FO_Q8_0_A8 ? q8_half1 : q16_half1;
    for (int64_t p = p0; p < p1; p++)
        for (int h = 0; h < 2; h++) {
            int64_t r0 = 0;
            for (; M - r0 >= 4; r0 += 4) four(a, K, (const uint8_t *)w, y, ldy, r0, p, h);
            for (; r0 < M; r0++) one(a, K, (const uint8_t *)w, y, ldy, r0, p, h);
        }
}
#if defined(__GNUC__) && !defined(__clang__)
#pragma GCC diagnostic pop
#endif
#endif /* FO_X86 */

/* panels [p0, p1) for rows [0, M) of quantized activations */
static void a8_panels(const act8 *a, int64_t K, const void *w, int kind, float *y, int64_t ldy,
                      int64_t M, int64_t p0, int64_t p1, int simd) {
#if FO_X86
    if (simd == FO_ISA_AVX2 || simd == FO_ISA_AVX512) {
        took(FO_PATH_AVX2);
        a8_avx2(a, K, w, kind, y, ldy, M, p0, p1);
        return;
    }
#endif
    if (simd < FO_ISA_AVX2) {
        took(FO_PATH_SCALAR);
        a8_scalar(a, K, w, kind, y, ldy, M, p0, p1);
        return;
    }
#if FO_X86
    took(FO_PATH_VNNI);
    typedef void (*a8_fn)(const act8 *, int64_t, const uint8_t *, float *, int64_t, int64_t,
                          int64_t);
    const a8_fn four = kind == FO_Q4_1_A8 ? q4_tile4 : kind == FO_Q8_0_A8 ? q8_tile4 : q16_tile4;
    const a8_fn one = kind == FO_Q4_1_A8 ? q4_tile1 : kind == FO_Q8_0_A8 ? q8_tile1 : q16_tile1;
    int64_t p = p0;
    for (; p + 2 <= p1; p += 2) {
        int64_t r0 = 0;
        for (; M - r0 >= 4; r0 += 4) four(a, K, (const uint8_t *)w, y, ldy, r0, p);
        for (; r0 < M; r0++) one(a, K, (const uint8_t *)w, y, ldy, r0, p);
    }
    if (p < p1) {
        took(FO_PATH_AVX2);
        a8_avx2(a, K, w, kind, y, ldy, M, p, p1);
    }
#endif
}

/* y [M, N] (row stride ldy) = x [M, K] (row stride ldx) @ packed w ([N / PANEL][K][PANEL]) */
int fo_gemm(const float *x, int64_t ldx, const void *w, int kind, float *y, int64_t ldy, int64_t M,
            int64_t K, int64_t N) {
    if (N % PANEL || kind < FO_F32 || kind > FO_Q8_0_A16 || (kind >= FO_Q4_1 && K % QK))
        return FO_REFUSED;
    const int64_t groups = (N / PANEL + GROUP - 1) / GROUP, panels = N / PANEL;
    const int simd = fo_isa();
    act8 a = {0};
    if (kind >= FO_Q4_1_A8) {
        if (act8_alloc(&a, M, K)) return FO_NO_MEMORY;
        for (int64_t m = 0; m < M; m++) quantize(&a, x + m * ldx, m, K, kind, simd);
    }
#pragma omp parallel for schedule(static) if (M * K * N >= PARALLEL_WORK)
    for (int64_t g = 0; g < groups; g++) {
        const int64_t p0 = g * GROUP, p1 = p0 + GROUP < panels ? p0 + GROUP : panels;
        if (kind >= FO_Q4_1_A8)
            a8_panels(&a, K, w, kind, y, ldy, M, p0, p1, simd);
        else
            gemm_panels(x, ldx, w, kind, y, ldy, M, K, p0, p1, simd);
    }
    if (kind >= FO_Q4_1_A8) act8_free(&a);
    return FO_OK;
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

static void axpy_scalar(float a, const float *v, float *acc, int64_t D) {
    for (int64_t d = 0; d < D; d++) acc[d] = fmaf(a, v[d], acc[d]);
}

#if FO_X86
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

/* attend_one for head widths of NV * 8 (64, 128) in AVX2, the same operations in the same order
 * per element: four keys' dot products at once (independent chains: the FMA latency hidden),
 * then the output's NV vectors held in registers across the keys instead of a load and store of
 * each per key */
__attribute__((target("avx2,fma"), always_inline)) static inline void
attend_regs(const int NV, const float *qv, const float *kh, const float *vh, int64_t len,
            float scale, float *o, float *s) {
    const int64_t D = NV * LANES;
    __m256 qr[16], acc[16];
#pragma GCC unroll 16
    for (int i = 0; i < NV; i++) qr[i] = _mm256_loadu_ps(qv + i * LANES);
    float mx = -INFINITY, p[LANES];
    int64_t j = 0;
    for (; j + 4 <= len; j += 4) {
        __m256 a[4];
#pragma GCC unroll 4
        for (int u = 0; u < 4; u++) a[u] = _mm256_setzero_ps();
#pragma GCC unroll 16
        for (int i = 0; i < NV; i++)
#pragma GCC unroll 4
            for (int u = 0; u < 4; u++)
                a[u] = _mm256_fmadd_ps(qr[i], _mm256_loadu_ps(kh + (j + u) * D + i * LANES), a[u]);
#pragma GCC unroll 4
        for (int u = 0; u < 4; u++) {
            _mm256_storeu_ps(p, a[u]);
            s[j + u] = combine(p) * scale;
        }
    }
    for (; j < len; j++) {
        __m256 a = _mm256_setzero_ps();
#pragma GCC unroll 16
        for (int i = 0; i < NV; i++)
            a = _mm256_fmadd_ps(qr[i], _mm256_loadu_ps(kh + j * D + i * LANES), a);
        _mm256_storeu_ps(p, a);
        s[j] = combine(p) * scale;
    }
    for (j = 0; j < len; j++)
        if (s[j] > mx) mx = s[j];
    float sum = 0.0f;
    for (j = 0; j < len; j++) {
        s[j] = expf(s[j] - mx);
        sum += s[j];
    }
#pragma GCC unroll 16
    for (int i = 0; i < NV; i++) acc[i] = _mm256_setzero_ps();
    for (j = 0; j < len; j++) {
        const __m256 sj = _mm256_set1_ps(s[j]);
#pragma GCC unroll 16
        for (int i = 0; i < NV; i++)
            acc[i] = _mm256_fmadd_ps(sj, _mm256_loadu_ps(vh + j * D + i * LANES), acc[i]);
    }
    const __m256 sv = _mm256_set1_ps(sum);
#pragma GCC unroll 16
    for (int i = 0; i < NV; i++) _mm256_storeu_ps(o + i * LANES, _mm256_div_ps(acc[i], sv));
}

__attribute__((target("avx2,fma"))) static void attend_64(const float *qv, const float *kh,
                                                          const float *vh, int64_t len,
                                                          float scale, float *o, float *s) {
    attend_regs(8, qv, kh, vh, len, scale, o, s);
}

__attribute__((target("avx2,fma"))) static void attend_128(const float *qv, const float *kh,
                                                           const float *vh, int64_t len,
                                                           float scale, float *o, float *s) {
    attend_regs(16, qv, kh, vh, len, scale, o, s);
}
#endif /* FO_X86 */

/* the dot product and acc += a * v in their fixed order, in AVX2 or plain C (the same bits) */
static inline float dot(const float *a, const float *b, int64_t D, int simd) {
    (void)simd; /* unused where only plain C is compiled */
#if FO_X86
    if (simd) return dot_avx2(a, b, D);
#endif
    return dot_scalar(a, b, D);
}

static inline void axpy(float a, const float *v, float *acc, int64_t D, int simd) {
    (void)simd; /* unused where only plain C is compiled */
#if FO_X86
    if (simd) {
        axpy_avx2(a, v, acc, D);
        return;
    }
#endif
    axpy_scalar(a, v, acc, D);
}

/* one query row th = t * H + h over keys [0, len) of its slot's head; s: scratch of len floats */
static void attend_one(const float *q, const float *kc, const float *vc, int64_t max_len,
                       int64_t slot, int64_t len, int64_t th, int64_t H, int64_t Hkv, int64_t D,
                       float scale, float *out, float *s, int simd) {
    const int64_t h = th % H;
    const int64_t head = (slot * Hkv + h / (H / Hkv)) * max_len * D;
    const float *qv = q + th * D, *kh = kc + head, *vh = vc + head;
    float *o = out + th * D;
    took(simd ? FO_PATH_AVX2 : FO_PATH_SCALAR);
#if FO_X86
    if (simd && (D == 64 || D == 128)) {
        (D == 64 ? attend_64 : attend_128)(qv, kh, vh, len, scale, o, s);
        return;
    }
#endif
    float mx = -INFINITY;
    for (int64_t j = 0; j < len; j++) {
        s[j] = dot(qv, kh + j * D, D, simd) * scale;
        if (s[j] > mx) mx = s[j];
    }
    float sum = 0.0f;
    for (int64_t j = 0; j < len; j++) {
        s[j] = expf(s[j] - mx);
        sum += s[j];
    }
    for (int64_t d = 0; d < D; d++) o[d] = 0.0f;
    for (int64_t j = 0; j < len; j++) axpy(s[j], vh + j * D, o, D, simd);
    for (int64_t d = 0; d < D; d++) o[d] = o[d] / sum;
}

/* q [T, H, D]; the caches [slots, Hkv, max_len, D] (contiguous, fp32); query t attends keys
 * [0, lens[t]) of slot slots[t]; out [T, H, D]. D must be a multiple of 8. */
int fo_attention(const float *q, const float *kc, const float *vc, int64_t max_len,
                 const int64_t *slots, const int64_t *lens, int64_t T, int64_t H, int64_t Hkv,
                 int64_t D, float scale, float *out) {
    if (D % LANES || H % Hkv) return FO_REFUSED;
    const int simd = fo_isa();
    int failed = 0;
    int64_t work = 0;
    for (int64_t t = 0; t < T; t++) work += lens[t];
    work *= H * D;
    (void)work; /* read by the pragma alone, which a build without OpenMP ignores */
#pragma omp parallel for schedule(static) if (work >= PARALLEL_WORK)
    for (int64_t th = 0; th < T * H; th++) {
        const int64_t len = lens[th / H];
        float *s = malloc(sizeof(float) * (len > 0 ? len : 1));
        if (!s) {
            failed = 1;
            continue;
        }
        attend_one(q, kc, vc, max_len, slots[th / H], len, th, H, Hkv, D, scale, out, s, simd);
        free(s);
    }
    return failed ? FO_NO_MEMORY : FO_OK;
}

/* the sum of squares of x[0, D) in the dot product's order; a tail past the last 8 in order */
static float sum_squares(const float *x, int64_t D, int simd) {
    const int64_t body = D - D % LANES;
    took(simd ? FO_PATH_AVX2 : FO_PATH_SCALAR);
    float s = body ? dot(x, x, body, simd) : 0.0f;
    for (int64_t d = body; d < D; d++) s = fmaf(x[d], x[d], s);
    return s;
}

static void norm_row(const float *xr, const float *w, float *yr, int64_t D, float eps, int simd) {
    const float inv = 1.0f / sqrtf(sum_squares(xr, D, simd) / (float)D + eps);
    for (int64_t d = 0; d < D; d++) yr[d] = w[d] * (xr[d] * inv);
}

/* x, y [M, D]; w [D] */
int fo_rms_norm(const float *x, const float *w, float *y, int64_t M, int64_t D, float eps) {
    const int simd = fo_isa();
#pragma omp parallel for schedule(static) if (M * D >= PARALLEL_WORK)
    for (int64_t m = 0; m < M; m++) norm_row(x + m * D, w, y + m * D, D, eps, simd);
    return FO_OK;
}

static void silu_mul_row(const float *g, float *yr, int64_t N) {
    const float *u = g + N;
    for (int64_t n = 0; n < N; n++) yr[n] = g[n] / (1.0f + expf(-g[n])) * u[n];
}

/* gate_up [M, 2N] (gate columns, then up columns) -> y [M, N] */
int fo_silu_mul(const float *gate_up, float *y, int64_t M, int64_t N) {
#pragma omp parallel for schedule(static) if (M * N * 16 >= PARALLEL_WORK)
    for (int64_t m = 0; m < M; m++) silu_mul_row(gate_up + m * 2 * N, y + m * N, N);
    return FO_OK;
}

/* ---- The whole Llama forward of one engine step in one call ----
 * The same operations, in the same order, as the runner's step composed of the kernels above
 * and elementwise fp32 steps (tests compare the two bit for bit), in one parallel region: a
 * batch-1 decode step is ~30 layers x 10 small operations, and per-operation dispatch from
 * Python cost more than the arithmetic. Threads split every operation by output columns, rows or
 * heads, so results do not depend on the thread count. */

/* whether fo_forward can run linear L as a K -> N layer (N: its scratch's row stride): a known
 * kind, whole panels, whole GGUF blocks */
static int linear_ok(const fo_linear *L, int64_t K, int64_t N) {
    return L->kind >= FO_F32 && L->kind <= FO_Q8_0_A16 && L->K == K && L->N == N && N > 0 &&
           N % PANEL == 0 && L->out <= N && (L->kind < FO_Q4_1 || K % QK == 0);
}

/* columns of panels [p0, p1) of y [M, L->N]: * scale, then + bias */
static void epilogue(const fo_linear *L, float *y, int64_t M, int64_t p0, int64_t p1) {
    const int64_t c1 = p1 * PANEL < L->out ? p1 * PANEL : L->out;
    for (int64_t m = 0; m < M; m++) {
        float *yr = y + m * L->N;
        if (L->scale)
            for (int64_t c = p0 * PANEL; c < c1; c++) yr[c] = yr[c] * L->scale[c];
        if (L->bias)
            for (int64_t c = p0 * PANEL; c < c1; c++) yr[c] = yr[c] + L->bias[c];
    }
}

/* inside a parallel region: y [M, L->N] (stride L->N) = linear(x [M, L->K]); xs: scratch, a:
 * scratch for the quantized activations of 8-bit activation kinds */
static void linear_rows(const fo_linear *L, const float *x, int64_t M, float *xs, const act8 *a,
                        float *y, int simd) {
    const int64_t K = L->K, N = L->N;
    const int kind = (int)L->kind;
    if (L->in_scale) {
#pragma omp for schedule(static)
        for (int64_t i = 0; i < M * K; i++) xs[i] = x[i] * L->in_scale[i % K];
        x = xs;
    }
    if (kind >= FO_Q4_1_A8) {
#pragma omp for schedule(static)
        for (int64_t m = 0; m < M; m++) quantize(a, x + m * K, m, K, kind, simd);
        /* pairs of panels (the VNNI tiles' width): an even split of small layers over threads */
        const int64_t pairs = (N / PANEL + 1) / 2;
#pragma omp for schedule(static)
        for (int64_t i = 0; i < pairs; i++) {
            const int64_t p0 = 2 * i, p1 = p0 + 2 < N / PANEL ? p0 + 2 : N / PANEL;
            a8_panels(a, K, L->w, kind, y, N, M, p0, p1, simd);
            epilogue(L, y, M, p0, p1);
        }
        return;
    }
    const int64_t panels = N / PANEL, groups = (panels + GROUP - 1) / GROUP;
#pragma omp for schedule(static)
    for (int64_t g = 0; g < groups; g++) {
        const int64_t p0 = g * GROUP, p1 = p0 + GROUP < panels ? p0 + GROUP : panels;
        gemm_panels(x, K, L->w, kind, y, N, M, K, p0, p1, simd);
        epilogue(L, y, M, p0, p1);
    }
}

static int64_t padded(int64_t n) { return (n + PANEL - 1) / PANEL * PANEL; }

/* x [T, hidden]: the tokens' embeddings (overwritten: the residual stream). Token t is at
 * position pos[t] of slot slot[t] and attends positions [0, pos[t]]. The caches are
 * [layers, slots, kv_heads, max_len, head_dim]; cos, sin [max_len, head_dim]. logits
 * [R, head->N] for the rows rows[0..R). */
int fo_forward(const fo_dims *dm, const fo_layer *layers, const float *final_norm,
               const fo_linear *head, float *x, int64_t T, const int64_t *pos,
               const int64_t *slot, float *kc, float *vc, const float *cos, const float *sin,
               const int64_t *rows, int64_t R, float *logits) {
    const int64_t D = dm->hidden, H = dm->heads, Hkv = dm->kv_heads, Dh = dm->head_dim;
    const int64_t F = dm->ffn, S = dm->max_len;
    if (Dh % LANES || H % Hkv || Dh % 2) return FO_REFUSED;
    for (int64_t t = 0; t < T; t++)
        if (pos[t] < 0 || pos[t] >= S || slot[t] < 0 || slot[t] >= dm->slots) return FO_REFUSED;
    for (int64_t r = 0; r < R; r++)
        if (rows[r] < 0 || rows[r] >= T) return FO_REFUSED;
    const int64_t qkv_n = padded((H + 2 * Hkv) * Dh), gu_n = padded(2 * F), d_n = padded(D);
    for (int64_t l = 0; l < dm->layers; l++) {
        const fo_layer *ly = layers + l;
        if (!linear_ok(&ly->qkv, D, qkv_n) || !linear_ok(&ly->o, H * Dh, d_n) ||
            !linear_ok(&ly->gate_up, D, gu_n) || !linear_ok(&ly->down, F, d_n))
            return FO_REFUSED;
    }
    if (!linear_ok(head, D, head->N)) return FO_REFUSED;
    const int simd = fo_isa();
    int64_t widest = D > H * Dh ? D : H * Dh;
    if (F > widest) widest = F;
    const int64_t layer_stride = dm->slots * Hkv * S * Dh;
    /* scratch: h, xs, qkv, q, attention, projection, gate_up, act; scores per thread */
    const int64_t sizes[8] = {T * D, T * widest, T * qkv_n, T * H * Dh, T * H * Dh, T * d_n,
                              T * gu_n, T * F};
    int64_t total = 0;
    for (int i = 0; i < 8; i++) total += sizes[i];
    float *buf = malloc(sizeof(float) * (total + R * D));
    if (!buf) return FO_NO_MEMORY;
    float *h = buf, *xs = h + sizes[0], *qkv = xs + sizes[1], *q = qkv + sizes[2];
    float *att = q + sizes[3], *proj = att + sizes[4], *gu = proj + sizes[5], *act = gu + sizes[6];
    float *hr = act + sizes[7];
    /* 8-bit activations (gguf-a8), as wide as any layer's input: only where a layer reads them */
    int quantized = head->kind >= FO_Q4_1_A8;
    for (int64_t l = 0; l < dm->layers; l++) {
        const fo_layer *ly = layers + l;
        quantized |= ly->qkv.kind >= FO_Q4_1_A8 || ly->o.kind >= FO_Q4_1_A8 ||
                     ly->gate_up.kind >= FO_Q4_1_A8 || ly->down.kind >= FO_Q4_1_A8;
    }
    act8 a8 = {0};
    if (quantized && act8_alloc(&a8, T > R ? T : R, widest)) {
        free(buf);
        return FO_NO_MEMORY;
    }
    int failed = 0;
#pragma omp parallel
    {
        float *scores = malloc(sizeof(float) * S);
        if (!scores) {
#pragma omp atomic write
            failed = 1;
        }
#pragma omp barrier
        for (int64_t l = 0; l < dm->layers && !failed; l++) {
            const fo_layer *ly = layers + l;
            float *kl = kc + l * layer_stride, *vl = vc + l * layer_stride;
#pragma omp for schedule(static)
            for (int64_t t = 0; t < T; t++)
                norm_row(x + t * D, ly->input_norm, h + t * D, D, dm->eps, simd);
            linear_rows(&ly->qkv, h, T, xs, &a8, qkv, simd);
            /* rotate q and k heads (x * cos + rotated * sin), store k and v at the position */
#pragma omp for schedule(static)
            for (int64_t th = 0; th < T * (H + 2 * Hkv); th++) {
                const int64_t t = th / (H + 2 * Hkv), hh = th % (H + 2 * Hkv), half = Dh / 2;
                const float *v = qkv + t * qkv_n + hh * Dh;
                const float *c = cos + pos[t] * Dh, *sn = sin + pos[t] * Dh;
                const int64_t cache_at = ((slot[t] * Hkv + (hh - H) % Hkv) * S + pos[t]) * Dh;
                float *out = hh < H ? q + (t * H + hh) * Dh
                             : hh < H + Hkv ? kl + cache_at
                                            : vl + ((slot[t] * Hkv + hh - H - Hkv) * S + pos[t]) * Dh;
                if (hh >= H + Hkv) {
                    memcpy(out, v, sizeof(float) * Dh);
                    continue;
                }
                for (int64_t j = 0; j < Dh; j++) {
                    const float r = j < half ? -v[j + half] : v[j - half];
                    const float a = v[j] * c[j], b = r * sn[j];
                    out[j] = a + b;
                }
            }
#pragma omp for schedule(static)
            for (int64_t th = 0; th < T * H; th++)
                attend_one(q, kl, vl, S, slot[th / H], pos[th / H] + 1, th, H, Hkv, Dh,
                           dm->scale, att, scores, simd);
            linear_rows(&ly->o, att, T, xs, &a8, proj, simd);
#pragma omp for schedule(static)
            for (int64_t t = 0; t < T; t++) {
                for (int64_t d = 0; d < D; d++) x[t * D + d] = x[t * D + d] + proj[t * d_n + d];
                norm_row(x + t * D, ly->post_norm, h + t * D, D, dm->eps, simd);
            }
            linear_rows(&ly->gate_up, h, T, xs, &a8, gu, simd);
#pragma omp for schedule(static)
            for (int64_t t = 0; t < T; t++) {
                /* gate columns [0, F), up columns [F, 2F) */
                silu_mul_row(gu + t * gu_n, act + t * F, F);
            }
            linear_rows(&ly->down, act, T, xs, &a8, proj, simd);
#pragma omp for schedule(static)
            for (int64_t t = 0; t < T; t++)
                for (int64_t d = 0; d < D; d++) x[t * D + d] = x[t * D + d] + proj[t * d_n + d];
        }
        if (!failed) {
#pragma omp for schedule(static)
            for (int64_t r = 0; r < R; r++)
                norm_row(x + rows[r] * D, final_norm, hr + r * D, D, dm->eps, simd);
            linear_rows(head, hr, R, xs, &a8, logits, simd);
        }
        free(scores);
    }
    act8_free(&a8);
    free(buf);
    return failed ? FO_NO_MEMORY : FO_OK;
}
