/* The fixed-order kernels' ABI: the one definition fixed_order.c compiles against and the Python
 * binding is generated from (cffi, origin/engine/kernels/build.py), so the two cannot disagree on
 * a type, a field's offset or a constant. The arithmetic each function promises is written down
 * in fixed_order.c.
 *
 * Written in the subset cffi's cdef reads: enums whose values are integer literals (the binding
 * reads them as its Python constants too), structs and prototypes. Lines that start with '#' are
 * the C compiler's alone. */
#ifndef EDGEQA_FIXED_ORDER_H
#define EDGEQA_FIXED_ORDER_H

#include <stdint.h>

/* output columns per packed weight panel; reduction rows per GGUF block */
enum fo_layout { FO_PANEL = 16, FO_QK = 32 };

/* a packed weight's kind: panels of fp32, bf16 or int8 values ([N / PANEL][K][PANEL]); GGUF
 * Q4_1 and Q8_0 blocks by panel; the same blocks laid out for 8-bit activations (_A8), and for
 * activations to ~16 bits in two 8-bit passes (Q8_0_A16: the LM head) */
enum fo_kind {
    FO_F32 = 0,
    FO_BF16 = 1,
    FO_I8 = 2,
    FO_Q4_1 = 3,
    FO_Q8_0 = 4,
    FO_Q4_1_A8 = 5,
    FO_Q8_0_A8 = 6,
    FO_Q8_0_A16 = 7
};

/* bytes of one (panel, block) of GGUF blocks, the _A8 layouts included: Q4_1 is d[16] and m[16]
 * (fp16), then 32 x 16 nibbles; Q8_0 is d[16] (fp16), then 32 x 16 int8 */
enum fo_block_bytes { FO_Q4_1_BYTES = 320, FO_Q8_0_BYTES = 544 };

/* the instruction-set levels, each with those below it: plain C; AVX2 + FMA + F16C; and AVX-512
 * (F, BW, VL) for GGUF blocks; and AVX-512 VNNI for the 8-bit activation kernels. Every level
 * computes the same bits. */
enum fo_isa { FO_ISA_SCALAR = 0, FO_ISA_AVX2 = 1, FO_ISA_AVX512 = 2, FO_ISA_VNNI = 3 };

/* fo_take_paths' bits: the levels whose kernel variants ran */
enum fo_path { FO_PATH_SCALAR = 1, FO_PATH_AVX2 = 2, FO_PATH_AVX512 = 4, FO_PATH_VNNI = 8 };

/* what every kernel returns */
enum fo_status { FO_OK = 0, FO_REFUSED = -1, FO_NO_MEMORY = -2 };

/* a linear layer: y = ((x * in_scale) @ w) * scale + bias, each step optional (NULL) */
typedef struct {
    const void *w;                        /* packed: [N / PANEL][K][PANEL], or GGUF blocks */
    const float *in_scale, *scale, *bias; /* [K], [out], [out] */
    int64_t K, N, out;                    /* N: out padded to a multiple of PANEL */
    int64_t kind;                         /* enum fo_kind */
} fo_linear;

typedef struct {
    fo_linear qkv, o, gate_up, down;
    const float *input_norm, *post_norm; /* [hidden] */
} fo_layer;

typedef struct {
    int64_t layers, hidden, heads, kv_heads, head_dim, ffn, slots, max_len;
    float eps, scale;
} fo_dims;

/* y [M, N] (row stride ldy) = x [M, K] (row stride ldx) @ w packed as kind */
int fo_gemm(const float *x, int64_t ldx, const void *w, int kind, float *y, int64_t ldy,
            int64_t M, int64_t K, int64_t N);

/* q [T, H, D]; the caches [slots, Hkv, max_len, D] fp32; query t attends keys [0, lens[t]) of
 * slot slots[t]; out [T, H, D] */
int fo_attention(const float *q, const float *kc, const float *vc, int64_t max_len,
                 const int64_t *slots, const int64_t *lens, int64_t T, int64_t H, int64_t Hkv,
                 int64_t D, float scale, float *out);

/* x, y [M, D]; w [D] */
int fo_rms_norm(const float *x, const float *w, float *y, int64_t M, int64_t D, float eps);

/* gate_up [M, 2N] (gate columns, then up columns) -> y [M, N] */
int fo_silu_mul(const float *gate_up, float *y, int64_t M, int64_t N);

/* one Llama step: x [T, hidden] (overwritten), token t at position pos[t] of slot slot[t]; the
 * caches [layers, slots, kv_heads, max_len, head_dim]; cos, sin [max_len, head_dim]; logits
 * [R, head->N] for the rows rows[0..R) */
int fo_forward(const fo_dims *dm, const fo_layer *layers, const float *final_norm,
               const fo_linear *head, float *x, int64_t T, const int64_t *pos,
               const int64_t *slot, float *kc, float *vc, const float *cos, const float *sin,
               const int64_t *rows, int64_t R, float *logits);

/* the highest level this build runs on this CPU */
int fo_isa_supported(void);
/* run at level (capped at fo_isa_supported(); -1: the highest); returns the level in use */
int fo_set_isa(int level);
/* the level in use */
int fo_isa(void);
/* the fo_path bits of the kernel variants run since the last call (and clears them) */
unsigned int fo_take_paths(void);
/* where the 8-bit activation kernels' integer dot products run at the level in use:
 * 2 AVX-512 VNNI, 1 AVX2, 0 plain C */
int fo_a8_path(void);
/* _OPENMP (the OpenMP version's date) when built with OpenMP, else 0: one thread */
long fo_openmp(void);
/* the digest of fixed_order.c and this header the library was built from (build.py) */
const char *fo_source_digest(void);

#endif
