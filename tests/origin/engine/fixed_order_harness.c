/* Every fixed-order kernel on fixed pseudo-random inputs, one FNV-1a hash of each result per
 * line: built with another compiler or for another CPU (test_kernel_isa.py), it must print the
 * lines this machine's build prints. Usage: harness [level] (fixed_order.h's enum fo_isa; -1 or
 * none: the highest this CPU runs). */
#include "fixed_order.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static unsigned long long state = 88172645463325252ull;

static unsigned long long next(void) { /* xorshift64 */
    state ^= state << 13;
    state ^= state >> 7;
    state ^= state << 17;
    return state;
}

static void fill(float *x, size_t n, float scale) {
    for (size_t i = 0; i < n; i++) x[i] = (float)((long long)(next() >> 11) % 2000001 - 1000000) / 1e6f * scale;
}

static unsigned long long fnv(const void *p, size_t n) {
    unsigned long long h = 1469598103934665603ull;
    for (size_t i = 0; i < n; i++) h = (h ^ ((const unsigned char *)p)[i]) * 1099511628211ull;
    return h;
}

enum { K = 128, N = 64, M = 7, T = 5, H = 4, HKV = 2, L = 16, D_NORM = K + 5 };

int main(int argc, char **argv) {
    printf("level %d\n", fo_set_isa(argc > 1 ? atoi(argv[1]) : -1));
    static float x[M * K], y[M * N], w32[N * K];
    static unsigned short w16[N * K];
    static signed char w8[N * K];
    fill(x, M * K, 3.0f);
    fill(w32, N * K, 0.1f);
    for (int i = 0; i < N * K; i++) {
        unsigned int u;
        memcpy(&u, &w32[i], 4);
        w16[i] = (unsigned short)(u >> 16);
        w8[i] = (signed char)(next() % 255 - 127);
    }
    const void *dense[3] = {w32, w16, w8};
    /* one row (the grouped panels) and 7 (the tiles) of every weight kind */
    for (int kind = FO_F32; kind <= FO_I8; kind++)
        for (int m = 1; m <= M; m += 6) {
            fo_gemm(x, K, dense[kind], kind, y, N, m, K, N);
            printf("gemm %d x%d %016llx\n", kind, m, fnv(y, sizeof(float) * m * N));
        }
    static unsigned char blocks[(N / FO_PANEL) * (K / FO_QK) * FO_Q8_0_BYTES];
    for (size_t i = 0; i < sizeof blocks; i++) blocks[i] = (unsigned char)next();
    for (int kind = FO_Q4_1; kind <= FO_Q8_0_A16; kind++) {
        const int q4 = kind == FO_Q4_1 || kind == FO_Q4_1_A8;
        const int bytes = q4 ? FO_Q4_1_BYTES : FO_Q8_0_BYTES;
        for (int b = 0; b < (N / FO_PANEL) * (K / FO_QK); b++) { /* fp16 scales: d > 0, m < 0 */
            unsigned short *scales = (unsigned short *)(blocks + b * bytes);
            for (int c = 0; c < FO_PANEL; c++) scales[c] = (unsigned short)(0x1c00 | (next() & 0x3ff));
            for (int c = 0; q4 && c < FO_PANEL; c++)
                scales[FO_PANEL + c] = (unsigned short)(0xa400 | (next() & 0x3ff));
        }
        for (int m = 1; m <= M; m += 6) {
            const int code = fo_gemm(x, K, blocks, kind, y, N, m, K, N);
            printf("gemm %d x%d %d %016llx\n", kind, m, code, fnv(y, sizeof(float) * m * N));
        }
    }
    for (int d = 40; d <= 128; d += d == 40 ? 24 : 64) { /* the general kernel; 64 and 128 */
        float *q = malloc(sizeof(float) * T * H * d), *out = malloc(sizeof(float) * T * H * d);
        float *kc = malloc(sizeof(float) * 3 * HKV * L * d), *vc = malloc(sizeof(float) * 3 * HKV * L * d);
        fill(q, (size_t)T * H * d, 1.0f);
        fill(kc, (size_t)3 * HKV * L * d, 1.0f);
        fill(vc, (size_t)3 * HKV * L * d, 1.0f);
        const int64_t slots[T] = {0, 1, 2, 1, 0}, lens[T] = {1, 5, 16, 9, 3};
        fo_attention(q, kc, vc, L, slots, lens, T, H, HKV, d, 0.125f, out);
        printf("attention %d %016llx\n", d, fnv(out, sizeof(float) * T * H * d));
        free(q), free(out), free(kc), free(vc);
    }
    static float weight[D_NORM], xn[M * D_NORM], yn[M * D_NORM];
    fill(weight, D_NORM, 1.0f);
    fill(xn, M * D_NORM, 4.0f);
    fo_rms_norm(xn, weight, yn, M, D_NORM, 1e-5f);
    printf("rms_norm %016llx\n", fnv(yn, sizeof yn));
    fo_silu_mul(xn, yn, M, D_NORM / 2);
    printf("silu_mul %016llx\n", fnv(yn, sizeof(float) * M * (D_NORM / 2)));
    printf("paths %u\n", fo_take_paths());
    return 0;
}
