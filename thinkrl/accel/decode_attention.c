/* One decode step's attention for the lean decoder (lean_decoder.py), float32 on the CPU.

   For every (row r, key head h): rotate the new key (rotary embedding, the rotate-half form of Llama and
   Qwen2) and store it with the new value at the row's position pos[r]; rotate the G query heads that share
   key head h; attend over the row's first pos[r] + 1 positions with a plain softmax (no mask: a row's
   length is its mask). Storage is the decoder's (slots, key heads, capacity, head dim) tensor, so row r's
   keys for head h are contiguous vectors of `dim` floats.

   Why a kernel: torch's CPU SDPA (and a matmul formulation) spent 1.5-4x the time it takes to read the keys
   and values once, for 3 queries per key head; see decode_kernel.py for the numbers. Here each (row, head)
   reads its keys once (scores into a scratch row), then its values once for a block of up to 4 query heads
   (one read per query head was 15-20% slower at 600-1,100 positions, measured). Doing the rotation and the
   store here too replaces about ten small torch operations per layer (rotate-half, the products, the
   copies that reorder q and k, the two storage writes). Rows are independent: a row's output never depends
   on which other rows share the step.

   Built by decode_kernel.py with -O3 -march=native -ffast-math (fast math lets the compiler use the
   vectorised expf); threads come from OpenMP when the process already runs torch's libgomp. */

#include <math.h>
#include <string.h>

typedef float v16 __attribute__((vector_size(64), aligned(4))); /* 16 floats; unaligned loads allowed */

static inline float lane_sum(v16 x) {
  float r = 0.f;
  for (int i = 0; i < 16; i++) r += x[i];
  return r;
}

/* Softmax weights s (NQ, L) of a block of queries against values v (L, DIM) -> o (NQ, DIM): every value
   vector is read once for the NQ queries of the block (their sums stay in registers). */
#define DEFINE_VALUES(DIM, NQ)                                                                            \
  static void values_##DIM##_##NQ(const float *s, long L, const float *v, float *o) {                      \
    enum { W = DIM / 16 };                                                                                \
    v16 acc[NQ][W];                                                                                       \
    for (int j = 0; j < NQ; j++)                                                                          \
      for (int w = 0; w < W; w++) acc[j][w] = (v16){0};                                                   \
    for (long t = 0; t < L; t++) {                                                                        \
      const v16 *vt = (const v16 *)(v + t * DIM);                                                         \
      for (int w = 0; w < W; w++) {                                                                       \
        v16 x = vt[w];                                                                                    \
        for (int j = 0; j < NQ; j++) acc[j][w] += s[j * L + t] * x;                                       \
      }                                                                                                   \
    }                                                                                                     \
    for (int j = 0; j < NQ; j++)                                                                          \
      for (int w = 0; w < W; w++) ((v16 *)(o + j * DIM))[w] = acc[j][w];                                 \
  }

/* One (row, key head): q (G, DIM), k and v (L, DIM) -> o (G, DIM); s is scratch for G x L scores. Blocks
   of up to QB queries share each read of the values (QB x DIM / 16 accumulators: 16 of AVX-512's 32
   registers); values_DIM(s, nq, ...) runs a block of nq <= QB queries. */
#define DEFINE_HEAD(DIM, QB)                                                                              \
  static void head_##DIM(const float *q, const float *k, const float *v, float *o, long L, long G,        \
                         float scale, float *s) {                                                         \
    enum { W = DIM / 16 };                                                                                \
    for (long t = 0; t < L; t++) { /* scores: each key read once, for all G queries */                    \
      const v16 *kt = (const v16 *)(k + t * DIM);                                                         \
      for (long g = 0; g < G; g++) {                                                                      \
        const v16 *qg = (const v16 *)(q + g * DIM);                                                       \
        v16 acc = qg[0] * kt[0];                                                                          \
        for (int w = 1; w < W; w++) acc += qg[w] * kt[w];                                                 \
        s[g * L + t] = lane_sum(acc) * scale;                                                             \
      }                                                                                                   \
    }                                                                                                     \
    for (long g = 0; g < G; g++) { /* softmax: the weights, normalised */                                \
      float *sg = s + g * L, top = sg[0], total = 0.f;                                                    \
      for (long t = 1; t < L; t++) top = sg[t] > top ? sg[t] : top;                                       \
      for (long t = 0; t < L; t++) {                                                                      \
        sg[t] = expf(sg[t] - top);                                                                        \
        total += sg[t];                                                                                   \
      }                                                                                                   \
      for (long t = 0; t < L; t++) sg[t] *= 1.f / total;                                                  \
    }                                                                                                     \
    for (long g = 0; g < G; g += QB) { /* the weighted sums of values, a block of queries per pass */    \
      long nq = G - g < QB ? G - g : QB;                                                                  \
      const float *sg = s + g * L;                                                                        \
      float *og = o + g * DIM;                                                                            \
      values_##DIM(sg, nq, L, v, og);                                                                     \
    }                                                                                                     \
  }
DEFINE_VALUES(64, 1)
DEFINE_VALUES(64, 2)
DEFINE_VALUES(64, 3)
DEFINE_VALUES(64, 4)
DEFINE_VALUES(128, 1)
DEFINE_VALUES(128, 2)

static void values_64(const float *s, long nq, long L, const float *v, float *o) {
  if (nq == 1) values_64_1(s, L, v, o);
  else if (nq == 2) values_64_2(s, L, v, o);
  else if (nq == 3) values_64_3(s, L, v, o);
  else values_64_4(s, L, v, o);
}

static void values_128(const float *s, long nq, long L, const float *v, float *o) {
  if (nq == 1) values_128_1(s, L, v, o);
  else values_128_2(s, L, v, o);
}
DEFINE_HEAD(64, 4)
DEFINE_HEAD(128, 2)

/* Any other head size: the same steps with the head dim known only at run time. */
static void head_any(const float *q, const float *k, const float *v, float *o, long L, long G, long dim,
                     float scale, float *s) {
  for (long t = 0; t < L; t++)
    for (long g = 0; g < G; g++) {
      float acc = 0.f;
      for (long d = 0; d < dim; d++) acc += q[g * dim + d] * k[t * dim + d];
      s[g * L + t] = acc * scale;
    }
  for (long g = 0; g < G; g++) {
    float *sg = s + g * L, *og = o + g * dim, top = sg[0], total = 0.f;
    for (long t = 1; t < L; t++) top = sg[t] > top ? sg[t] : top;
    for (long t = 0; t < L; t++) {
      sg[t] = expf(sg[t] - top);
      total += sg[t];
    }
    memset(og, 0, sizeof(float) * dim);
    for (long t = 0; t < L; t++)
      for (long d = 0; d < dim; d++) og[d] += sg[t] * v[t * dim + d];
    for (long d = 0; d < dim; d++) og[d] *= 1.f / total;
  }
}

/* y = x cos + rotate_half(x) sin, rotate_half(x) = (-x[half:], x[:half]) (transformers' apply_rotary_pos_emb). */
static inline void rotate(const float *x, const float *c, const float *s, float *y, long dim) {
  long half = dim / 2;
  for (long d = 0; d < half; d++) y[d] = x[d] * c[d] - x[d + half] * s[d];
  for (long d = half; d < dim; d++) y[d] = x[d] * c[d] + x[d - half] * s[d];
}

/* qkv: (n, hq + 2 hk, dim) contiguous, one row's q heads, then its k heads, then its v heads (query head
   h * g + j uses key head h); cos, sin: (n, dim); k and v: storage whose slot r starts at r * slot_stride
   floats, head h at h * capacity * dim within it; pos: (n,) the new token's position per row, each in
   [0, capacity); out: (n, hq, dim); scratch: n * hk * g * (dim + max_len) floats, max_len >= pos + 1. */
void decode_step(const float *qkv, const float *cos, const float *sin, float *k, float *v, float *out,
                 const long *pos, long n, long hk, long g, long dim, long capacity, long slot_stride, float scale,
                 float *scratch, long max_len) {
  long hq = hk * g;
#pragma omp parallel for schedule(static)
  for (long task = 0; task < n * hk; task++) {
    long r = task / hk, h = task % hk, at = pos[r];
    const float *row = qkv + r * (hq + 2 * hk) * dim, *c = cos + r * dim, *s = sin + r * dim;
    float *kk = k + r * slot_stride + h * capacity * dim, *vv = v + r * slot_stride + h * capacity * dim;
    float *q = scratch + task * g * (dim + max_len), *scores = q + g * dim;
    rotate(row + (hq + h) * dim, c, s, kk + at * dim, dim);
    memcpy(vv + at * dim, row + (hq + hk + h) * dim, sizeof(float) * dim);
    for (long j = 0; j < g; j++) rotate(row + (h * g + j) * dim, c, s, q + j * dim, dim);
    float *o = out + (r * hq + h * g) * dim;
    if (dim == 64)
      head_64(q, kk, vv, o, at + 1, g, scale, scores);
    else if (dim == 128)
      head_128(q, kk, vv, o, at + 1, g, scale, scores);
    else
      head_any(q, kk, vv, o, at + 1, g, dim, scale, scores);
  }
}
