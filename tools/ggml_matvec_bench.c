// llama.cpp's CPU matvec throughput, measured the same way as strata's
// crates/quant/examples/bench_matvec.rs: a rows x cols matrix of random valid
// blocks times one f32 vector (quantised to the type's vec_dot_type by ggml's
// own from_float), rows split over threads, each row one call of ggml's
// optimised vec_dot (ggml_get_type_traits_cpu). Prints GB/s of weights.
//
// Built and run by ci/bench-quant.sh against the oracle's libggml-cpu:
//   cc -O2 -pthread tools/ggml_matvec_bench.c -I$LLAMA/ggml/include \
//      -L$LIB -lggml-cpu -lggml-base -Wl,-rpath,$LIB -o ggml_matvec_bench
//   ./ggml_matvec_bench [rows] [cols] [threads] [seconds] [type ...]
#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "ggml-cpu.h"
#include "ggml.h"

struct job {
    const struct ggml_type_traits_cpu *tr;
    const uint8_t *w;
    const void *act;
    float *y;
    size_t row_bytes;
    int cols, r0, r1;
};

static void *run_rows(void *p) {
    struct job *j = p;
    for (int r = j->r0; r < j->r1; r++) {
        j->tr->vec_dot(j->cols, &j->y[r], 0, j->w + (size_t)r * j->row_bytes, 0, j->act, 0, 1);
    }
    return NULL;
}

static double now(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return t.tv_sec + t.tv_nsec * 1e-9;
}

static uint64_t rng = 0x9E3779B97F4A7C15ull;
static uint8_t next_byte(void) {
    rng ^= rng << 13;
    rng ^= rng >> 7;
    rng ^= rng << 17;
    return (uint8_t)rng;
}

// Offsets of the f16 scale fields (set to a small finite value, as strata's bench).
static int scale_offsets(enum ggml_type t, int off[2]) {
    switch (t) {
    case GGML_TYPE_Q4_0: case GGML_TYPE_Q5_0: case GGML_TYPE_Q8_0: off[0] = 0; return 1;
    case GGML_TYPE_Q4_1: case GGML_TYPE_Q5_1: case GGML_TYPE_Q4_K: case GGML_TYPE_Q5_K:
        off[0] = 0; off[1] = 2; return 2;
    case GGML_TYPE_Q2_K: off[0] = 80; off[1] = 82; return 2;
    case GGML_TYPE_Q3_K: off[0] = 108; return 1;
    case GGML_TYPE_Q6_K: off[0] = 208; return 1;
    default: return 0;
    }
}

int main(int argc, char **argv) {
    int rows = argc > 1 ? atoi(argv[1]) : 4096;
    int cols = argc > 2 ? atoi(argv[2]) : 4096;
    int threads = argc > 3 ? atoi(argv[3]) : 1;
    double seconds = argc > 4 ? atof(argv[4]) : 1.0;
    const char *defaults[] = {"f32", "f16", "bf16", "q4_0", "q4_1", "q5_0", "q5_1", "q8_0",
                              "q2_K", "q3_K", "q4_K", "q5_K", "q6_K"};
    int ntypes = argc > 5 ? argc - 5 : 13;
    ggml_cpu_init();
    printf("| format | 1 call/row, %d thread(s) GB/s |\n|---|---:|\n", threads);
    for (int ti = 0; ti < ntypes; ti++) {
        const char *name = argc > 5 ? argv[5 + ti] : defaults[ti];
        enum ggml_type t = GGML_TYPE_COUNT;
        for (int k = 0; k < GGML_TYPE_COUNT; k++) {
            const char *n = ggml_type_name((enum ggml_type)k);
            if (n && strcmp(n, name) == 0) t = (enum ggml_type)k;
        }
        if (t == GGML_TYPE_COUNT) { fprintf(stderr, "unknown type %s\n", name); return 2; }
        const struct ggml_type_traits_cpu *tr = ggml_get_type_traits_cpu(t);
        size_t row_bytes = ggml_row_size(t, cols);
        uint8_t *w = malloc(row_bytes * rows);
        for (size_t i = 0; i < row_bytes * rows; i++) w[i] = next_byte();
        int off[2], no = scale_offsets(t, off);
        size_t bs = ggml_type_size(t);
        ggml_fp16_t small = ggml_fp32_to_fp16(0.01f);
        if (t == GGML_TYPE_F16 || t == GGML_TYPE_BF16) {
            for (size_t i = 0; i < row_bytes * rows; i += 2) memcpy(w + i, &small, 2);
        } else if (t == GGML_TYPE_F32) {
            for (size_t i = 0; i < row_bytes * rows; i += 4) { float v = (next_byte() % 100) * 1e-3f; memcpy(w + i, &v, 4); }
        } else {
            for (size_t b = 0; b < row_bytes * rows; b += bs)
                for (int k = 0; k < no; k++) memcpy(w + b + off[k], &small, 2);
        }
        float *x = malloc(sizeof(float) * cols);
        for (int i = 0; i < cols; i++) x[i] = ((i * 7919) % 1000) * 1e-3f - 0.5f;
        enum ggml_type at = tr->vec_dot_type;
        void *act = malloc(ggml_row_size(at, cols));
        float *y = malloc(sizeof(float) * rows);
        const struct ggml_type_traits_cpu *atr = ggml_get_type_traits_cpu(at);

        double best = 1e30;
        double start = now();
        int first = 1;
        while (first || now() - start < seconds) {
            double t0 = now();
            int n = 0;
            do {
                if (at == GGML_TYPE_F32) memcpy(act, x, sizeof(float) * cols);
                else atr->from_float(x, act, cols);
                pthread_t th[256];
                struct job jobs[256];
                int nt = threads < 256 ? threads : 256, per = (rows + nt - 1) / nt;
                for (int k = 0; k < nt; k++) {
                    jobs[k] = (struct job){tr, w, act, y, row_bytes, cols, k * per,
                                           (k + 1) * per < rows ? (k + 1) * per : rows};
                    if (nt == 1) run_rows(&jobs[k]); else pthread_create(&th[k], NULL, run_rows, &jobs[k]);
                }
                if (nt > 1) for (int k = 0; k < nt; k++) pthread_join(th[k], NULL);
                n++;
            } while (now() - t0 < seconds / 5);
            double per_call = (now() - t0) / n;
            if (!first && per_call < best) best = per_call;
            first = 0;
        }
        printf("| %s | %.2f |\n", ggml_type_name(t), row_bytes * rows / best / 1e9);
        free(w); free(x); free(act); free(y);
    }
    return 0;
}
