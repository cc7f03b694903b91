/* mpicoll's optional numeric kernels: they move bytes and do arithmetic, nothing else (every
 * decision about which MPI call to make lives in Python). numpy converts float16 <-> float32 one
 * element at a time (2-5 ns per element on the machines we measured), which dominates every float16
 * reduction and quantization. These loops use the CPU's F16C conversions when it has them (runtime
 * dispatch) and the compiler's _Float16 otherwise; both round to nearest even, as numpy does, so
 * results are bit-identical to the numpy path. If this file does not compile, mpicoll uses numpy.
 *
 *   reduce_f16(rows, out, op)          out[i] = float16(op-reduce over r of float32(rows[r][i])): rows is a
 *                                      sequence of buffers (anywhere: a private array, a shared window),
 *                                      reduced in the tree's order (TREE, below), accumulated in float32;
 *                                      op 0 sum 1 prod 2 max 3 min
 *   reduce_bf16(rows, out, op)         the same for bfloat16
 *   reduce_f32(rows, out, op), reduce_f64(rows, out, op)   float32 / float64 rows summed or multiplied in
 *                                      the tree's order, in their own precision (no floating-point state to set)
 *   f16_to_f32(src, dst), f32_to_f16(src, dst), bf16_to_f32(src, dst), f32_to_bf16(src, dst)
 *   stream_copy(src, dst)              a copy with non-temporal stores (data another process reads next)
 *   use_avx512(on) -> previous          switch the AVX-512 reductions off (tests of the AVX2 ones)
 *   dequant_sum, dequant_sum_quantize, quantize_i8   int8 quantization kernels of mpicoll._numeric (below)
 *   use_simd(on) -> previous             switch the F16C/AVX2 loops off (tests of the portable loops)
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <limits.h>
#include <math.h>
#include <stdint.h>
#include <string.h>

#define TILE 1024

/* numpy's np.maximum / np.minimum exactly (NaN propagates; on ties, +0 vs -0, the second operand) */
static inline float maxf_nan(float a, float b) { return (a > b || a != a) ? a : b; }
static inline float minf_nan(float a, float b) { return (a < b || a != a) ? a : b; }

/* THE order of every float reduction here (docs/reproducibility.md, "The order"): rows 0 .. n-1
 * combine as the tree T(lo, hi) = T(lo, mid) op T(mid, hi), mid = lo + the largest power of two
 * below hi - lo: n = 4 is (x0 op x1) op (x2 op x3), n = 5 ((x0 op x1) op (x2 op x3)) op x4. In one
 * pass over the rows it is a binary counter: row r goes onto a stack of partials, whose top two
 * then combine ctz(r + 1) times, the lower ranks the left operand; at the end the stack folds from
 * the right. At most bit_length(n) partials are live (TREE_SLOTS: any n). */
#define TREE_SLOTS 64
#define TREE_MERGES(r) __builtin_ctzll((unsigned long long)(r) + 1ull)

/* RESULT = the tree over rows 0 .. ROWS - 1 of LOAD (an expression of r_, of type V) under OP(a, b):
 * for one vector of lanes, the partials in registers (or L1). The leaves' pairs (rows 2j, 2j + 1)
 * combine first, then pair j goes onto the stack and meets ctz(j + 1) partials; an odd last row
 * goes on alone: the same tree, with half the stack traffic. */
#define TREE(V, ROWS, LOAD, OP, RESULT)                                                            \
    do {                                                                                           \
        V st_[TREE_SLOTS];                                                                         \
        int sp_ = 0;                                                                               \
        Py_ssize_t r_ = 0;                                                                         \
        for (; r_ + 1 < (ROWS); r_ += 2) {                                                         \
            V v_ = LOAD;                                                                           \
            r_++;                                                                                  \
            v_ = OP(v_, LOAD);                                                                     \
            r_--;                                                                                  \
            for (int k_ = TREE_MERGES(r_ >> 1); k_ > 0; k_--) { sp_--; v_ = OP(st_[sp_], v_); }    \
            st_[sp_++] = v_;                                                                       \
        }                                                                                          \
        if (r_ < (ROWS)) st_[sp_++] = LOAD;                                                        \
        V a_ = st_[--sp_];                                                                         \
        while (sp_ > 0) { sp_--; a_ = OP(st_[sp_], a_); }                                          \
        RESULT = a_;                                                                               \
    } while (0)

/* The same tree over tiles: S[j] is partial j's tile (S[0] may be the output). PUSH(d, r) writes
 * row r's tile into d; FOLD(d, r) combines it into d (d = d op row r: an odd row meets its
 * left neighbour, straight from the row); COMBINE(a, b) is a = a op b. */
#define TREE_TILES(S, ROWS, PUSH, FOLD, COMBINE)                                                   \
    do {                                                                                           \
        int sp_ = 0;                                                                               \
        for (Py_ssize_t r_ = 0; r_ < (ROWS); r_++) {                                               \
            int k_ = TREE_MERGES(r_);                                                              \
            if (k_ == 0) { PUSH(S[sp_], r_); sp_++; continue; }                                    \
            FOLD(S[sp_ - 1], r_);                                                                  \
            while (--k_ > 0) { sp_--; COMBINE(S[sp_ - 1], S[sp_]); }                               \
        }                                                                                          \
        while (sp_ > 1) { sp_--; COMBINE(S[sp_ - 1], S[sp_]); }                                    \
    } while (0)

/* the partials a tree over rows needs (bit_length(rows), at least 1) */
static int tree_depth(Py_ssize_t rows) { int d = 1; while (d < TREE_SLOTS && ((Py_ssize_t)1 << d) <= rows) d++; return d; }

/* float32 tiles: a[i] = a[i] op b[i], numpy's rules */
static inline void tile_op(float *a, const float *b, Py_ssize_t m, int op) {
    switch (op) {
    case 0: for (Py_ssize_t i = 0; i < m; i++) a[i] += b[i]; break;
    case 1: for (Py_ssize_t i = 0; i < m; i++) a[i] *= b[i]; break;
    case 2: for (Py_ssize_t i = 0; i < m; i++) a[i] = maxf_nan(a[i], b[i]); break;
    default: for (Py_ssize_t i = 0; i < m; i++) a[i] = minf_nan(a[i], b[i]); break;
    }
}

/* the 16-bit portable loops: tile by tile, the partials in float32 tiles (slots: tree_depth(rows) + 1
 * of TILE floats), rounded once */
#define H_PUSH(d, r) do { const _Float16 *q_ = p[r] + s; for (Py_ssize_t i = 0; i < m; i++) (d)[i] = (float)q_[i]; } while (0)
#define H_FOLD(d, r) do { H_PUSH(tmp, r); tile_op((d), tmp, m, op); } while (0)
#define T_COMBINE(a, b) tile_op((a), (b), m, op)

#define DEFINE_KERNELS(SUFFIX, ATTR)                                                              \
    ATTR static void h2f_##SUFFIX(const _Float16 *s, float *d, Py_ssize_t n) {                      \
        for (Py_ssize_t i = 0; i < n; i++) d[i] = (float)s[i];                                      \
    }                                                                                              \
    ATTR static void f2h_##SUFFIX(const float *s, _Float16 *d, Py_ssize_t n) {                      \
        for (Py_ssize_t i = 0; i < n; i++) d[i] = (_Float16)s[i];                                   \
    }                                                                                              \
    ATTR static void reduce_##SUFFIX(const _Float16 *const *p, _Float16 *out, Py_ssize_t rows,       \
                                     Py_ssize_t c, int op, float *slots) {                         \
        float *S[TREE_SLOTS], *tmp = slots;                                                        \
        for (int j = 0; j < tree_depth(rows); j++) S[j] = slots + (Py_ssize_t)(j + 1) * TILE;      \
        for (Py_ssize_t s = 0; s < c; s += TILE) {                                                  \
            Py_ssize_t m = c - s < TILE ? c - s : TILE;                                            \
            TREE_TILES(S, rows, H_PUSH, H_FOLD, T_COMBINE);                                        \
            for (Py_ssize_t i = 0; i < m; i++) out[s + i] = (_Float16)S[0][i];                     \
        }                                                                                          \
    }

DEFINE_KERNELS(generic, )

#if defined(__x86_64__) && defined(__GNUC__)
#include <immintrin.h>
#define HAVE_F16C_VARIANT 1
#define F16C_ATTR __attribute__((target("avx2,f16c")))

F16C_ATTR static void h2f_f16c(const _Float16 *s, float *d, Py_ssize_t n) {
    Py_ssize_t i = 0;
    for (; i + 8 <= n; i += 8) _mm256_storeu_ps(d + i, _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(s + i))));
    for (; i < n; i++) d[i] = (float)s[i];
}

F16C_ATTR static void f2h_f16c(const float *s, _Float16 *d, Py_ssize_t n) {
    Py_ssize_t i = 0;
    for (; i + 8 <= n; i += 8)
        _mm_storeu_si128((__m128i *)(d + i), _mm256_cvtps_ph(_mm256_loadu_ps(s + i), _MM_FROUND_TO_NEAREST_INT));
    for (; i < n; i++) d[i] = (_Float16)s[i];
}

F16C_ATTR static inline __m256 vop(__m256 a, __m256 b, int op) {
    switch (op) {
    case 0: return _mm256_add_ps(a, b);
    case 1: return _mm256_mul_ps(a, b);
    case 2: return _mm256_blendv_ps(b, a, _mm256_or_ps(_mm256_cmp_ps(a, b, _CMP_GT_OQ), _mm256_cmp_ps(a, a, _CMP_UNORD_Q)));
    default: return _mm256_blendv_ps(b, a, _mm256_or_ps(_mm256_cmp_ps(a, b, _CMP_LT_OQ), _mm256_cmp_ps(a, a, _CMP_UNORD_Q)));
    }
}

/* 8 lanes at a time, the rows in the tree's order, the partials in registers; returns how many
 * elements it did (the tail, < 8, is left to the portable loop: reduce_rows) */
F16C_ATTR static Py_ssize_t reduce_f16c(const _Float16 *const *p, _Float16 *out, Py_ssize_t rows, Py_ssize_t c,
                                        int op) {
    Py_ssize_t i = 0;
#define VOP8(a, b) vop((a), (b), op)
    for (; i + 8 <= c; i += 8) {
        __m256 acc;
        TREE(__m256, rows, _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(p[r_] + i))), VOP8, acc);
        _mm_storeu_si128((__m128i *)(out + i), _mm256_cvtps_ph(acc, _MM_FROUND_TO_NEAREST_INT));
    }
    return i;
}
#endif

/* bfloat16: float32's top half. To float32 is a shift; from float32 rounds to nearest even and
 * turns NaN into the quiet NaN 0x7fc0 / 0xffc0, as ml_dtypes (Eigen) does, so the results equal
 * the numpy + ml_dtypes path bit for bit. */
static inline float bf2f(uint16_t h) { uint32_t b = (uint32_t)h << 16; float f; memcpy(&f, &b, 4); return f; }
static inline uint16_t f2bf(float f) {
    uint32_t b;
    memcpy(&b, &f, 4);
    if ((b & 0x7fffffffu) > 0x7f800000u) return (b & 0x80000000u) ? 0xffc0 : 0x7fc0;
    return (uint16_t)((b + 0x7fffu + ((b >> 16) & 1u)) >> 16);
}

#define B_PUSH(d, r) do { const uint16_t *q_ = p[r] + s; for (Py_ssize_t i = 0; i < m; i++) (d)[i] = bf2f(q_[i]); } while (0)
#define B_FOLD(d, r) do { B_PUSH(tmp, r); tile_op((d), tmp, m, op); } while (0)

#define DEFINE_BF16(SUFFIX, ATTR)                                                                 \
    ATTR static void reduce_bf16_##SUFFIX(const uint16_t *const *p, uint16_t *out, Py_ssize_t rows,  \
                                          Py_ssize_t c, int op, float *slots) {                    \
        float *S[TREE_SLOTS], *tmp = slots;                                                        \
        for (int j = 0; j < tree_depth(rows); j++) S[j] = slots + (Py_ssize_t)(j + 1) * TILE;      \
        for (Py_ssize_t s = 0; s < c; s += TILE) {                                                  \
            Py_ssize_t m = c - s < TILE ? c - s : TILE;                                            \
            TREE_TILES(S, rows, B_PUSH, B_FOLD, T_COMBINE);                                        \
            for (Py_ssize_t i = 0; i < m; i++) out[s + i] = f2bf(S[0][i]);                         \
        }                                                                                          \
    }

DEFINE_BF16(generic, )

#ifdef HAVE_F16C_VARIANT
/* bfloat16 <-> float32, 16 lanes as two vectors, in-lane (as the 32-lane loop below explains) */
F16C_ATTR static inline __m256 bf16x8_lo(__m256i x) { return _mm256_castsi256_ps(_mm256_unpacklo_epi16(_mm256_setzero_si256(), x)); }
F16C_ATTR static inline __m256 bf16x8_hi(__m256i x) { return _mm256_castsi256_ps(_mm256_unpackhi_epi16(_mm256_setzero_si256(), x)); }

F16C_ATTR static inline __m256i bf16x8_round(__m256 v) {     /* f2bf, lane for lane, in each lane's low half */
    __m256i b = _mm256_castps_si256(v), t = _mm256_srli_epi32(b, 16);
    __m256i r = _mm256_srli_epi32(_mm256_add_epi32(_mm256_add_epi32(b, _mm256_set1_epi32(0x7fff)),
                                                   _mm256_and_si256(t, _mm256_set1_epi32(1))), 16);
    __m256i quiet = _mm256_or_si256(_mm256_and_si256(t, _mm256_set1_epi32(0x8000)), _mm256_set1_epi32(0x7fc0));
    return _mm256_blendv_epi8(r, quiet, _mm256_castps_si256(_mm256_cmp_ps(v, v, _CMP_UNORD_Q)));
}

/* float32 -> bfloat16, 16 at a time (packus interleaves the two halves' 64-bit quarters; the
 * permute puts them back in order); returns how many it did */
F16C_ATTR static Py_ssize_t f2bf_avx2(const float *s, uint16_t *d, Py_ssize_t n) {
    Py_ssize_t i = 0;
    for (; i + 16 <= n; i += 16) {
        __m256i r = _mm256_packus_epi32(bf16x8_round(_mm256_loadu_ps(s + i)), bf16x8_round(_mm256_loadu_ps(s + i + 8)));
        _mm256_storeu_si256((__m256i *)(d + i), _mm256_permute4x64_epi64(r, 0xD8));
    }
    return i;
}

/* two vectors of 8 lanes (16 bfloat16 lanes, in-lane order) as one value of the tree */
typedef struct { __m256 lo, hi; } f32x16;
F16C_ATTR static inline f32x16 bf16x16_load(const uint16_t *q) {
    __m256i x = _mm256_loadu_si256((const __m256i *)q);
    f32x16 v = {bf16x8_lo(x), bf16x8_hi(x)};
    return v;
}
F16C_ATTR static inline f32x16 vop16x2(f32x16 a, f32x16 b, int op) {
    f32x16 v = {vop(a.lo, b.lo, op), vop(a.hi, b.hi, op)};
    return v;
}

/* the same for bfloat16: the bulk 16 lanes at a time, returns how many it did */
F16C_ATTR static Py_ssize_t reduce_bf16_avx2(const uint16_t *const *p, uint16_t *out, Py_ssize_t rows,
                                             Py_ssize_t c, int op) {
    Py_ssize_t i = 0;
#define VOP16X2(a, b) vop16x2((a), (b), op)
    for (; i + 16 <= c; i += 16) {
        f32x16 acc;
        TREE(f32x16, rows, bf16x16_load(p[r_] + i), VOP16X2, acc);
        _mm256_storeu_si256((__m256i *)(out + i), _mm256_packus_epi32(bf16x8_round(acc.lo), bf16x8_round(acc.hi)));
    }
    return i;
}
#endif

static int use_f16c = 0;
static int use_avx512 = 0;   /* the AVX-512 (F and BW) reductions, when the CPU has them and use_f16c is on */

#ifdef HAVE_F16C_VARIANT
#define AVX512_ATTR __attribute__((target("avx512f,avx512bw,avx2,f16c")))

AVX512_ATTR static inline __m512 vop16(__m512 a, __m512 b, int op) {
    switch (op) {
    case 0: return _mm512_add_ps(a, b);
    case 1: return _mm512_mul_ps(a, b);
    case 2: return _mm512_mask_blend_ps(_mm512_cmp_ps_mask(a, b, _CMP_GT_OQ) | _mm512_cmp_ps_mask(a, a, _CMP_UNORD_Q), b, a);
    default: return _mm512_mask_blend_ps(_mm512_cmp_ps_mask(a, b, _CMP_LT_OQ) | _mm512_cmp_ps_mask(a, a, _CMP_UNORD_Q), b, a);
    }
}

/* bfloat16 <-> float32, 32 lanes as two vectors: unpacking a 16-bit word under a zero word is the
 * shift, and it takes each 128-bit lane's low (high) 4 words; packing takes them back in the same
 * in-lane order, so no lane ever crosses and the order never matters. bf16_round is f2bf, lane
 * for lane, its 16 bits in the low half of each 32-bit lane. */
AVX512_ATTR static inline __m512 bf16_lo(__m512i x) { return _mm512_castsi512_ps(_mm512_unpacklo_epi16(_mm512_setzero_si512(), x)); }
AVX512_ATTR static inline __m512 bf16_hi(__m512i x) { return _mm512_castsi512_ps(_mm512_unpackhi_epi16(_mm512_setzero_si512(), x)); }

AVX512_ATTR static inline __m512i bf16_round(__m512 v) {
    __m512i b = _mm512_castps_si512(v), t = _mm512_srli_epi32(b, 16);
    __m512i r = _mm512_srli_epi32(_mm512_add_epi32(_mm512_add_epi32(b, _mm512_set1_epi32(0x7fff)),
                                                   _mm512_and_si512(t, _mm512_set1_epi32(1))), 16);
    return _mm512_mask_or_epi32(r, _mm512_cmp_ps_mask(v, v, _CMP_UNORD_Q),        /* NaN: the quiet NaN, its sign */
                                _mm512_and_si512(t, _mm512_set1_epi32(0x8000)), _mm512_set1_epi32(0x7fc0));
}

typedef struct { __m512 lo, hi; } f32x32;
AVX512_ATTR static inline f32x32 bf16x32_load(const uint16_t *q) {
    __m512i x = _mm512_loadu_si512(q);
    f32x32 v = {bf16_lo(x), bf16_hi(x)};
    return v;
}
AVX512_ATTR static inline f32x32 vop32x2(f32x32 a, f32x32 b, int op) {
    f32x32 v = {vop16(a.lo, b.lo, op), vop16(a.hi, b.hi, op)};
    return v;
}

/* 32 lanes at a time, the rows in the tree's order; returns how many it did (the rest: the narrower loops) */
AVX512_ATTR static Py_ssize_t reduce_bf16_avx512(const uint16_t *const *p, uint16_t *out, Py_ssize_t rows,
                                                 Py_ssize_t c, int op) {
    Py_ssize_t i = 0;
#define VOP32X2(a, b) vop32x2((a), (b), op)
    for (; i + 32 <= c; i += 32) {
        f32x32 acc;
        TREE(f32x32, rows, bf16x32_load(p[r_] + i), VOP32X2, acc);
        _mm512_storeu_si512(out + i, _mm512_packus_epi32(bf16_round(acc.lo), bf16_round(acc.hi)));
    }
    return i;
}

AVX512_ATTR static inline f32x32 f16x32_load(const _Float16 *q) {
    f32x32 v = {_mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)q)),
                _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)(q + 16)))};
    return v;
}

/* float16: 32 lanes a step as two vectors (the tree's bookkeeping spread over more lanes) */
AVX512_ATTR static Py_ssize_t reduce_f16_avx512(const _Float16 *const *p, _Float16 *out, Py_ssize_t rows,
                                                Py_ssize_t c, int op) {
    Py_ssize_t i = 0;
    for (; i + 32 <= c; i += 32) {
        f32x32 acc;
        TREE(f32x32, rows, f16x32_load(p[r_] + i), VOP32X2, acc);
        _mm256_storeu_si256((__m256i *)(out + i), _mm512_cvtps_ph(acc.lo, _MM_FROUND_TO_NEAREST_INT));
        _mm256_storeu_si256((__m256i *)(out + i + 16), _mm512_cvtps_ph(acc.hi, _MM_FROUND_TO_NEAREST_INT));
    }
    return i;
}

/* float32 SUM / PROD (op 0 / 1), 32 lanes a step in registers (out may be p[0]: a step reads every
 * row's lanes before it stores); returns how many it did */
AVX512_ATTR static inline f32x32 f32x32_load(const float *q) {
    f32x32 v = {_mm512_loadu_ps(q), _mm512_loadu_ps(q + 16)};
    return v;
}
AVX512_ATTR static Py_ssize_t reduce_f32_avx512(const float *const *p, float *out, Py_ssize_t rows, Py_ssize_t c,
                                                int op) {
    Py_ssize_t i = 0;
    for (; i + 32 <= c; i += 32) {
        f32x32 acc;
        TREE(f32x32, rows, f32x32_load(p[r_] + i), VOP32X2, acc);
        _mm512_storeu_ps(out + i, acc.lo);
        _mm512_storeu_ps(out + i + 16, acc.hi);
    }
    return i;
}

/* the same, 16 lanes a step (AVX2) */
F16C_ATTR static inline f32x16 f32x16_load(const float *q) {
    f32x16 v = {_mm256_loadu_ps(q), _mm256_loadu_ps(q + 8)};
    return v;
}
F16C_ATTR static Py_ssize_t reduce_f32_avx2(const float *const *p, float *out, Py_ssize_t rows, Py_ssize_t c, int op) {
    Py_ssize_t i = 0;
    for (; i + 16 <= c; i += 16) {
        f32x16 acc;
        TREE(f32x16, rows, f32x16_load(p[r_] + i), VOP16X2, acc);
        _mm256_storeu_ps(out + i, acc.lo);
        _mm256_storeu_ps(out + i + 8, acc.hi);
    }
    return i;
}
#endif

/* the widest float32 loop the CPU has, over the first elements; returns how many it did (the rest:
 * the tile loop of DEFINE_NATIVE_REDUCE) */
static Py_ssize_t reduce_f32_simd(const void *const *p, float *out, Py_ssize_t rows, Py_ssize_t c, int op) {
#ifdef HAVE_F16C_VARIANT
    if (use_f16c && use_avx512) return reduce_f32_avx512((const float *const *)p, out, rows, c, op);
    if (use_f16c) return reduce_f32_avx2((const float *const *)p, out, rows, c, op);
#endif
    (void)p; (void)out; (void)rows; (void)c; (void)op;
    return 0;
}

static Py_ssize_t reduce_f64_simd(const void *const *p, double *out, Py_ssize_t rows, Py_ssize_t c, int op) {
    (void)p; (void)out; (void)rows; (void)c; (void)op;
    return 0;                                 /* (float64: the tile loop, which the compiler vectorises) */
}

static void bf2f_loop(const uint16_t *s, float *d, Py_ssize_t n) { for (Py_ssize_t i = 0; i < n; i++) d[i] = bf2f(s[i]); }
static void f2bf_loop(const float *s, uint16_t *d, Py_ssize_t n) { for (Py_ssize_t i = 0; i < n; i++) d[i] = f2bf(s[i]); }

/* f16_to_f32, f32_to_f16, bf16_to_f32, f32_to_bf16: parse (src, dst), check dst's size, convert
 * without the GIL (``narrow``: float32 -> the 16-bit dtype) */
static PyObject *convert(PyObject *args, const char *name, int bf16, int narrow) {
    Py_buffer s, d;
    if (!PyArg_ParseTuple(args, "y*w*", &s, &d)) return NULL;
    Py_ssize_t n = s.len / (narrow ? 4 : 2), need = n * (narrow ? 2 : 4);
    if (d.len < need) {
        PyBuffer_Release(&s); PyBuffer_Release(&d);
        return PyErr_Format(PyExc_ValueError, "%s: destination holds %zd bytes, needs %zd", name, d.len, need);
    }
    Py_BEGIN_ALLOW_THREADS
    if (bf16 && narrow) {
        Py_ssize_t k = 0;
#ifdef HAVE_F16C_VARIANT
        if (use_f16c) k = f2bf_avx2(s.buf, d.buf, n);
#endif
        f2bf_loop((const float *)s.buf + k, (uint16_t *)d.buf + k, n - k);
    } else if (bf16) {
        bf2f_loop(s.buf, d.buf, n);
    } else if (narrow) {
#ifdef HAVE_F16C_VARIANT
        if (use_f16c) f2h_f16c(s.buf, d.buf, n); else
#endif
        f2h_generic(s.buf, d.buf, n);
    } else {
#ifdef HAVE_F16C_VARIANT
        if (use_f16c) h2f_f16c(s.buf, d.buf, n); else
#endif
        h2f_generic(s.buf, d.buf, n);
    }
    Py_END_ALLOW_THREADS
    PyBuffer_Release(&s); PyBuffer_Release(&d);
    Py_RETURN_NONE;
}

static PyObject *py_f16_to_f32(PyObject *self, PyObject *args) { return convert(args, "f16_to_f32", 0, 0); }
static PyObject *py_f32_to_f16(PyObject *self, PyObject *args) { return convert(args, "f32_to_f16", 0, 1); }
static PyObject *py_bf16_to_f32(PyObject *self, PyObject *args) { return convert(args, "bf16_to_f32", 1, 0); }
static PyObject *py_f32_to_bf16(PyObject *self, PyObject *args) { return convert(args, "f32_to_bf16", 1, 1); }

/* move every row pointer past k 16-bit elements; returns k */
static Py_ssize_t past(const void **ptrs, Py_ssize_t rows, Py_ssize_t k) {
    for (Py_ssize_t r = 0; r < rows; r++) ptrs[r] = (const char *)ptrs[r] + 2 * k;
    return k;
}

/* reduce_f16 / reduce_bf16: parse (rows, out, op), check every row's size, run without the GIL */
static PyObject *reduce_rows(PyObject *args, int bf16) {
    PyObject *seq, *fast;
    Py_buffer d;
    int op;
    if (!PyArg_ParseTuple(args, "Ow*i", &seq, &d, &op)) return NULL;
    Py_ssize_t c = d.len / 2;
    if (!(fast = PySequence_Fast(seq, "reduce: rows must be a sequence of buffers"))) { PyBuffer_Release(&d); return NULL; }
    Py_ssize_t rows = PySequence_Fast_GET_SIZE(fast), got = 0;
    Py_buffer *bufs = PyMem_Calloc(rows ? rows : 1, sizeof(Py_buffer));
    const void **ptrs = PyMem_Calloc(rows ? rows : 1, sizeof(void *));
    float *slots = PyMem_Malloc((size_t)(tree_depth(rows) + 1) * TILE * sizeof(float));   /* the portable loops' partials */
    PyObject *result = NULL;
    if (!bufs || !ptrs || !slots) { PyErr_NoMemory(); goto done; }
    if (rows < 1 || op < 0 || op > 3) {
        PyErr_Format(PyExc_ValueError, "reduce: bad rows or op (rows=%zd, op=%d)", rows, op);
        goto done;
    }
    for (; got < rows; got++) {
        if (PyObject_GetBuffer(PySequence_Fast_GET_ITEM(fast, got), &bufs[got], PyBUF_SIMPLE) < 0) goto done;
        if (bufs[got].len < c * 2) {
            PyErr_Format(PyExc_ValueError, "reduce: row %zd has %zd bytes, out needs %zd", got, bufs[got].len, c * 2);
            got++;
            goto done;
        }
        ptrs[got] = bufs[got].buf;
    }
    Py_BEGIN_ALLOW_THREADS
    /* the widest loops the CPU has first, each leaving its tail to the next (AVX-512, AVX2, the
     * portable loop); the row pointers move past what is done */
    Py_ssize_t done = 0;
    const void *const *rp = ptrs;
#ifdef HAVE_F16C_VARIANT
    if (use_f16c && use_avx512)
        done += past(ptrs, rows, bf16 ? reduce_bf16_avx512((const uint16_t *const *)rp, (uint16_t *)d.buf, rows, c, op)
                                      : reduce_f16_avx512((const _Float16 *const *)rp, (_Float16 *)d.buf, rows, c, op));
    if (use_f16c)
        done += past(ptrs, rows, bf16 ? reduce_bf16_avx2((const uint16_t *const *)rp, (uint16_t *)d.buf + done, rows,
                                                         c - done, op)
                                      : reduce_f16c((const _Float16 *const *)rp, (_Float16 *)d.buf + done, rows,
                                                    c - done, op));
#endif
    if (bf16)
        reduce_bf16_generic((const uint16_t *const *)rp, (uint16_t *)d.buf + done, rows, c - done, op, slots);
    else
        reduce_generic((const _Float16 *const *)rp, (_Float16 *)d.buf + done, rows, c - done, op, slots);
    Py_END_ALLOW_THREADS
    result = Py_None;
    Py_INCREF(result);
done:
    for (Py_ssize_t i = 0; i < got; i++) PyBuffer_Release(&bufs[i]);
    PyMem_Free(bufs);
    PyMem_Free(ptrs);
    PyMem_Free(slots);
    Py_DECREF(fast);
    PyBuffer_Release(&d);
    return result;
}

static PyObject *py_reduce_f16(PyObject *self, PyObject *args) { return reduce_rows(args, 0); }
static PyObject *py_reduce_bf16(PyObject *self, PyObject *args) { return reduce_rows(args, 1); }

#define N_ROW(r) ((const elem_ *)bufs[r].buf + s)
#define N_PUSH(d, r) do { if ((d) != N_ROW(r)) memcpy((d), N_ROW(r), (size_t)m * sizeof(elem_)); } while (0)
#define N_APPLY(a, b) do { elem_ *a_ = (a); const elem_ *b_ = (b);                                            \
        if (op == 0) for (Py_ssize_t i = 0; i < m; i++) a_[i] += b_[i];                                 \
        else for (Py_ssize_t i = 0; i < m; i++) a_[i] *= b_[i]; } while (0)
#define N_FOLD(d, r) N_APPLY((d), N_ROW(r))
#define N_COMBINE(a, b) N_APPLY((a), (b))
/* reduce_f32 / reduce_f64(rows, out, op): out[i] = the tree over rows r of rows[r][i] (TREE), in
 * the rows' own precision, one IEEE operation per step as numpy's np.add / np.multiply do it (op 0 sum,
 * 1 prod; MAX and MIN stay with numpy, whose NaN and signed-zero rules they would have to copy), tile
 * by tile. No floating-point state to set: IEEE gives inf and NaN, as MPI does. out may be rows[0]. */
#define DEFINE_NATIVE_REDUCE(NAME, T, SIMD)                                                                 \
    static PyObject *NAME(PyObject *self, PyObject *args) {                                             \
        typedef T elem_;                       /* (the element type, for the N_ macros) */             \
        PyObject *seq, *fast;                                                                          \
        Py_buffer d;                                                                                   \
        int op;                                                                                        \
        if (!PyArg_ParseTuple(args, "Ow*i", &seq, &d, &op)) return NULL;                               \
        Py_ssize_t c = d.len / (Py_ssize_t)sizeof(T);                                                  \
        if (!(fast = PySequence_Fast(seq, #NAME ": rows must be a sequence of buffers"))) {            \
            PyBuffer_Release(&d);                                                                      \
            return NULL;                                                                               \
        }                                                                                              \
        Py_ssize_t rows = PySequence_Fast_GET_SIZE(fast), got = 0;                                     \
        Py_buffer *bufs = PyMem_Calloc(rows ? rows : 1, sizeof(Py_buffer));                            \
        const void **ptrs = PyMem_Calloc(rows ? rows : 1, sizeof(void *));                             \
        T *slots = PyMem_Malloc((size_t)tree_depth(rows) * TILE * sizeof(T));  /* partials 1.. */       \
        PyObject *result = NULL;                                                                       \
        if (!bufs || !ptrs || !slots) { PyErr_NoMemory(); goto done; }                                 \
        if (rows < 1 || op < 0 || op > 1) {                                                            \
            PyErr_Format(PyExc_ValueError, #NAME ": bad rows or op (rows=%zd, op=%d)", rows, op);       \
            goto done;                                                                                 \
        }                                                                                              \
        for (; got < rows; got++) {                                                                    \
            if (PyObject_GetBuffer(PySequence_Fast_GET_ITEM(fast, got), &bufs[got], PyBUF_SIMPLE) < 0) \
                goto done;                                                                             \
            if (bufs[got].len < c * (Py_ssize_t)sizeof(T)) {                                           \
                PyErr_Format(PyExc_ValueError, #NAME ": row %zd has %zd bytes, out needs %zd", got,     \
                             bufs[got].len, c * (Py_ssize_t)sizeof(T));                                \
                got++;                                                                                 \
                goto done;                                                                             \
            }                                                                                          \
            ptrs[got] = bufs[got].buf;                                                                 \
        }                                                                                              \
        Py_BEGIN_ALLOW_THREADS                                                                         \
        T *out = (T *)d.buf, *S[TREE_SLOTS];                                                           \
        for (Py_ssize_t s = SIMD(ptrs, out, rows, c, op); s < c; s += TILE) {                          \
            Py_ssize_t m = c - s < TILE ? c - s : TILE;                                                \
            S[0] = out + s;                    /* partial 0 is the output's tile (out may be rows[0]) */ \
            for (int j = 1; j < tree_depth(rows); j++) S[j] = slots + (Py_ssize_t)(j - 1) * TILE;      \
            TREE_TILES(S, rows, N_PUSH, N_FOLD, N_COMBINE);                                            \
        }                                                                                              \
        Py_END_ALLOW_THREADS                                                                           \
        result = Py_None;                                                                              \
        Py_INCREF(result);                                                                             \
    done:                                                                                              \
        for (Py_ssize_t i = 0; i < got; i++) PyBuffer_Release(&bufs[i]);                               \
        PyMem_Free(bufs);                                                                              \
        PyMem_Free(ptrs);                                                                              \
        PyMem_Free(slots);                                                                             \
        Py_DECREF(fast);                                                                               \
        PyBuffer_Release(&d);                                                                          \
        return result;                                                                                 \
    }

DEFINE_NATIVE_REDUCE(py_reduce_f32, float, reduce_f32_simd)
DEFINE_NATIVE_REDUCE(py_reduce_f64, double, reduce_f64_simd)

/* ------------------------------------------------------------------------------------------------
 * int8 quantization kernels (mpicoll._numeric), bit-identical to its numpy path:
 *
 *   dequant_sum(q, scales, out, rows, block, out_itemsize)
 *       out[i] = float16 or float32 of  sum over rows r, in the tree's order (TREE), of
 *       float32(q[r][i]) * s(r, i), accumulated in float32 and rounded once; s(r, i) = scales[r * nsc + i // block], or
 *       scales[r] when block is 0 (nsc = ceil(c / block), or 1). Every product is rounded to
 *       float32 before it is added (no fused multiply-add), as numpy does.
 *   dequant_sum_quantize(q, scales, qout, sout, rows, block, qblock)
 *       quantize_i8 (per block of qblock) of dequant_sum's float32 result, without storing it
 *   quantize_i8(src, q, scales, block, src_itemsize)
 *       symmetric absmax per block of float32 or float16 src: scale = absmax / 127 (NaN when the
 *       block holds a NaN, inf for an inf), inv = 1 / scale (0 unless scale is finite and > 0),
 *       q = clip(nan_to_num(rint(x * inv)), -127, 127); x / scale instead of x * inv where inv
 *       overflows to inf (a subnormal scale).
 */
#if defined(__GNUC__) && !defined(__clang__)
#define NO_CONTRACT __attribute__((optimize("fp-contract=off")))   /* keep a*b + c two roundings */
#else
#define NO_CONTRACT
#endif
#define QTILE 4096

static inline uint32_t f2u(float f) { uint32_t b; memcpy(&b, &f, 4); return b; }
static inline float u2f(uint32_t b) { float f; memcpy(&f, &b, 4); return f; }

static inline int8_t q_of(float v) {   /* v = x * inv: rint, NaN -> 0, clip to [-127, 127] */
    v = rintf(v);
    if (v != v) return 0;
    return (int8_t)(v > 127.0f ? 127.0f : (v < -127.0f ? -127.0f : v));
}

static inline float scale_inv(float s) { return (s > 0.0f && s <= 3.4028234663852886e38f) ? 1.0f / s : 0.0f; }

/* the scale of element gi of row r and the end (exclusive, < limit) of its run of equal scales */
static inline float run_scale(const float *sr, Py_ssize_t block, Py_ssize_t gi, Py_ssize_t limit, Py_ssize_t *end) {
    if (block == 0) { *end = limit; return sr[0]; }
    Py_ssize_t b = gi / block, e = (b + 1) * block;
    *end = e < limit ? e : limit;
    return sr[b];
}

/* d[0..m) = float32(q[r * stride + s0 + i]) * s(r, s0 + i) (add: d + that, the product rounded first) */
NO_CONTRACT static void dqs_row_generic(const int8_t *q, Py_ssize_t stride, const float *sc, Py_ssize_t nsc,
                                        Py_ssize_t r, Py_ssize_t block, Py_ssize_t s0, Py_ssize_t m, float *d, int add) {
    const int8_t *qr = q + r * stride + s0;
    for (Py_ssize_t i = 0, end; i < m; i = end) {
        float f = run_scale(sc + r * nsc, block, s0 + i, s0 + m, &end);
        end -= s0;
        if (!add) for (Py_ssize_t k = i; k < end; k++) d[k] = (float)qr[k] * f;
        else for (Py_ssize_t k = i; k < end; k++) { float p = (float)qr[k] * f; d[k] = d[k] + p; }
    }
}

#define DQ_PUSH_generic(d, r) dqs_row_generic(q, stride, sc, nsc, r, block, s0, m, (d), 0)
#define DQ_FOLD_generic(d, r) dqs_row_generic(q, stride, sc, nsc, r, block, s0, m, (d), 1)
#define DQ_COMBINE(a, b) tile_op((a), (b), m, 0)

/* S[0][0..m) = the tree over rows r (TREE_TILES) of the rows' products; S[1..]: tiles of m floats */
static void dqs_tile_generic(const int8_t *q, Py_ssize_t stride, const float *sc, Py_ssize_t nsc,
                             Py_ssize_t rows, Py_ssize_t block, Py_ssize_t s0, Py_ssize_t m, float *const *S) {
    TREE_TILES(S, rows, DQ_PUSH_generic, DQ_FOLD_generic, DQ_COMBINE);
}

/* S: tree_depth(rows) tiles of QTILE floats (the partials) */
static void dequant_sum_generic(const int8_t *q, const float *sc, void *out, Py_ssize_t rows, Py_ssize_t c,
                                Py_ssize_t nsc, Py_ssize_t block, int f16, float *const *S) {
    for (Py_ssize_t s0 = 0; s0 < c; s0 += QTILE) {
        Py_ssize_t m = c - s0 < QTILE ? c - s0 : QTILE;
        dqs_tile_generic(q, c, sc, nsc, rows, block, s0, m, S);
        if (f16) { _Float16 *o = (_Float16 *)out + s0; for (Py_ssize_t i = 0; i < m; i++) o[i] = (_Float16)S[0][i]; }
        else memcpy((float *)out + s0, S[0], (size_t)m * 4);
    }
}

NO_CONTRACT static void quantize_generic(const void *src, int f16, int8_t *q, float *sc, Py_ssize_t n, Py_ssize_t block) {
    for (Py_ssize_t b = 0, s0 = 0; s0 < n; b++, s0 += block) {
        Py_ssize_t m = n - s0 < block ? n - s0 : block;
        uint32_t mx = 0;      /* absmax as bits: NaN patterns sort above inf, so a NaN wins, as np.max */
        for (Py_ssize_t i = 0; i < m; i++) {
            float x = f16 ? (float)((const _Float16 *)src)[s0 + i] : ((const float *)src)[s0 + i];
            uint32_t u = f2u(x) & 0x7fffffffu;
            if (u > mx) mx = u;
        }
        float s = u2f(mx) / 127.0f, inv = scale_inv(s);
        sc[b] = s;
        for (Py_ssize_t i = 0; i < m; i++) {
            float x = f16 ? (float)((const _Float16 *)src)[s0 + i] : ((const float *)src)[s0 + i];
            q[s0 + i] = q_of(inv > 3.4028234663852886e38f ? x / s : x * inv);
        }
    }
}

#ifdef HAVE_F16C_VARIANT
F16C_ATTR static inline __m256 i8x8_to_ps(const int8_t *p) {
    return _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(_mm_loadl_epi64((const __m128i *)p)));
}

F16C_ATTR static inline __m256 load8(const void *src, int f16, Py_ssize_t i) {
    return f16 ? _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)((const _Float16 *)src + i)))
               : _mm256_loadu_ps((const float *)src + i);
}

F16C_ATTR NO_CONTRACT static void dqs_row_avx2(const int8_t *q, Py_ssize_t stride, const float *sc, Py_ssize_t nsc,
                                               Py_ssize_t r, Py_ssize_t block, Py_ssize_t s0, Py_ssize_t m, float *d,
                                               int add) {
    const int8_t *qr = q + r * stride + s0;
    for (Py_ssize_t i = 0, end; i < m; i = end) {
        float f = run_scale(sc + r * nsc, block, s0 + i, s0 + m, &end);
        end -= s0;
        __m256 vf = _mm256_set1_ps(f);
        Py_ssize_t k = i;
        if (!add) {
            for (; k + 8 <= end; k += 8) _mm256_storeu_ps(d + k, _mm256_mul_ps(i8x8_to_ps(qr + k), vf));
            for (; k < end; k++) d[k] = (float)qr[k] * f;
        } else {
            for (; k + 8 <= end; k += 8)
                _mm256_storeu_ps(d + k, _mm256_add_ps(_mm256_loadu_ps(d + k), _mm256_mul_ps(i8x8_to_ps(qr + k), vf)));
            for (; k < end; k++) { float p = (float)qr[k] * f; d[k] = d[k] + p; }
        }
    }
}

#define DQ_PUSH_avx2(d, r) dqs_row_avx2(q, stride, sc, nsc, r, block, s0, m, (d), 0)
#define DQ_FOLD_avx2(d, r) dqs_row_avx2(q, stride, sc, nsc, r, block, s0, m, (d), 1)

F16C_ATTR static void dqs_tile_avx2(const int8_t *q, Py_ssize_t stride, const float *sc, Py_ssize_t nsc,
                                    Py_ssize_t rows, Py_ssize_t block, Py_ssize_t s0, Py_ssize_t m, float *const *S) {
    TREE_TILES(S, rows, DQ_PUSH_avx2, DQ_FOLD_avx2, DQ_COMBINE);
}

F16C_ATTR static void dequant_sum_avx2(const int8_t *q, const float *sc, void *out, Py_ssize_t rows, Py_ssize_t c,
                                       Py_ssize_t nsc, Py_ssize_t block, int f16, float *const *S) {
    for (Py_ssize_t s0 = 0; s0 < c; s0 += QTILE) {
        Py_ssize_t m = c - s0 < QTILE ? c - s0 : QTILE;
        dqs_tile_avx2(q, c, sc, nsc, rows, block, s0, m, S);
        if (f16) f2h_f16c(S[0], (_Float16 *)out + s0, m);
        else memcpy((float *)out + s0, S[0], (size_t)m * 4);
    }
}

/* absmax bits of 8 lanes -> one (the lanes hold |x| as int32, so NaN > inf > finite, as np.max) */
F16C_ATTR static inline uint32_t hmax_epi32(__m256i v) {
    __m128i m = _mm_max_epi32(_mm256_castsi256_si128(v), _mm256_extracti128_si256(v, 1));
    m = _mm_max_epi32(m, _mm_shuffle_epi32(m, _MM_SHUFFLE(1, 0, 3, 2)));
    m = _mm_max_epi32(m, _mm_shuffle_epi32(m, _MM_SHUFFLE(2, 3, 0, 1)));
    return (uint32_t)_mm_cvtsi128_si32(m);
}

/* rint(x * inv) of 8 lanes as int32: cvtps rounds in the current mode (nearest even), as rint */
F16C_ATTR static inline __m256i q8_lanes(const void *src, int f16, Py_ssize_t i, __m256 vinv) {
    return _mm256_cvtps_epi32(_mm256_mul_ps(load8(src, f16, i), vinv));
}

F16C_ATTR NO_CONTRACT static void quantize_avx2(const void *src, int f16, int8_t *q, float *sc, Py_ssize_t n,
                                                Py_ssize_t block) {
    const __m256i absmask = _mm256_set1_epi32(0x7fffffff), order = _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7);
    const __m256i lo32 = _mm256_set1_epi8(-127);
    const __m128i lo16 = _mm_set1_epi8(-127);
    for (Py_ssize_t b = 0, s0 = 0; s0 < n; b++, s0 += block) {
        Py_ssize_t m = n - s0 < block ? n - s0 : block, i = 0;
        __m256i vmx = _mm256_setzero_si256();
        for (; i + 8 <= m; i += 8)
            vmx = _mm256_max_epi32(vmx, _mm256_and_si256(_mm256_castps_si256(load8(src, f16, s0 + i)), absmask));
        uint32_t mx = hmax_epi32(vmx);
        for (; i < m; i++) {
            float x = f16 ? (float)((const _Float16 *)src)[s0 + i] : ((const float *)src)[s0 + i];
            uint32_t u = f2u(x) & 0x7fffffffu;
            if (u > mx) mx = u;
        }
        float s = u2f(mx) / 127.0f, inv = scale_inv(s);
        sc[b] = s;
        int8_t *qb = q + s0;
        if (inv == 0.0f) {            /* all-zero block, or one holding inf/NaN: x * 0 is 0 or NaN -> 0 */
            memset(qb, 0, (size_t)m);
            continue;
        }
        if (inv > 3.4028234663852886e38f) {   /* 1 / (a subnormal scale) overflows: divide instead */
            for (i = 0; i < m; i++) {
                float x = f16 ? (float)((const _Float16 *)src)[s0 + i] : ((const float *)src)[s0 + i];
                qb[i] = q_of(x / s);
            }
            continue;
        }
        /* finite x, finite inv: |x * inv| <= ~127, no NaN; packs saturate at -128, hence the max */
        __m256 vinv = _mm256_set1_ps(inv);
        for (i = 0; i + 32 <= m; i += 32) {
            __m256i a = _mm256_packs_epi32(q8_lanes(src, f16, s0 + i, vinv), q8_lanes(src, f16, s0 + i + 8, vinv));
            __m256i c = _mm256_packs_epi32(q8_lanes(src, f16, s0 + i + 16, vinv), q8_lanes(src, f16, s0 + i + 24, vinv));
            __m256i p = _mm256_permutevar8x32_epi32(_mm256_packs_epi16(a, c), order);
            _mm256_storeu_si256((__m256i *)(qb + i), _mm256_max_epi8(p, lo32));
        }
        for (; i + 8 <= m; i += 8) {
            __m256i k = q8_lanes(src, f16, s0 + i, vinv);
            __m128i w = _mm_packs_epi32(_mm256_castsi256_si128(k), _mm256_extracti128_si256(k, 1));
            _mm_storel_epi64((__m128i *)(qb + i), _mm_max_epi8(_mm_packs_epi16(w, w), lo16));
        }
        for (; i < m; i++) {
            float x = f16 ? (float)((const _Float16 *)src)[s0 + i] : ((const float *)src)[s0 + i];
            qb[i] = q_of(x * inv);
        }
    }
}
#endif

static PyObject *py_dequant_sum(PyObject *self, PyObject *args) {
    Py_buffer qb, sb, ob;
    Py_ssize_t rows, block;
    int osize;
    if (!PyArg_ParseTuple(args, "y*y*w*nni", &qb, &sb, &ob, &rows, &block, &osize)) return NULL;
    Py_ssize_t c = (osize == 2 || osize == 4) ? ob.len / osize : 0;
    Py_ssize_t nsc = block > 0 ? (c + block - 1) / block : 1;
    if (rows < 1 || block < 0 || (osize != 2 && osize != 4) || qb.len < rows * c || sb.len < rows * nsc * 4) {
        PyBuffer_Release(&qb); PyBuffer_Release(&sb); PyBuffer_Release(&ob);
        return PyErr_Format(PyExc_ValueError, "dequant_sum: bad sizes (rows=%zd, block=%zd, out_itemsize=%d, "
                            "q %zd bytes, scales %zd bytes, out %zd bytes)", rows, block, osize, qb.len, sb.len, ob.len);
    }
    float *slots = PyMem_Malloc((size_t)tree_depth(rows) * QTILE * sizeof(float)), *S[TREE_SLOTS];
    if (!slots) { PyBuffer_Release(&qb); PyBuffer_Release(&sb); PyBuffer_Release(&ob); return PyErr_NoMemory(); }
    for (int j = 0; j < tree_depth(rows); j++) S[j] = slots + (Py_ssize_t)j * QTILE;
    Py_BEGIN_ALLOW_THREADS
#ifdef HAVE_F16C_VARIANT
    if (use_f16c) dequant_sum_avx2(qb.buf, sb.buf, ob.buf, rows, c, nsc, block, osize == 2, S); else
#endif
    dequant_sum_generic(qb.buf, sb.buf, ob.buf, rows, c, nsc, block, osize == 2, S);
    Py_END_ALLOW_THREADS
    PyMem_Free(slots);
    PyBuffer_Release(&qb); PyBuffer_Release(&sb); PyBuffer_Release(&ob);
    Py_RETURN_NONE;
}

/* dequant_sum into float32 and quantize_i8 of the result per block of qblock, tile by tile (whole
 * blocks per tile), so that the float32 sums stay in cache instead of making a round trip to memory */
static int dequant_sum_quantize(const int8_t *q, const float *sc, int8_t *qout, float *sout, Py_ssize_t rows,
                                Py_ssize_t c, Py_ssize_t nsc, Py_ssize_t block, Py_ssize_t qblock) {
    Py_ssize_t tile = (QTILE / qblock > 1 ? QTILE / qblock : 1) * qblock;
    float *slots = (float *)malloc((size_t)tree_depth(rows) * (size_t)tile * sizeof(float)), *S[TREE_SLOTS];
    if (!slots) return -1;
    for (int j = 0; j < tree_depth(rows); j++) S[j] = slots + (Py_ssize_t)j * tile;
    for (Py_ssize_t s0 = 0; s0 < c; s0 += tile) {
        Py_ssize_t m = c - s0 < tile ? c - s0 : tile;
#ifdef HAVE_F16C_VARIANT
        if (use_f16c) {
            dqs_tile_avx2(q, c, sc, nsc, rows, block, s0, m, S);
            quantize_avx2(S[0], 0, qout + s0, sout + s0 / qblock, m, qblock);
            continue;
        }
#endif
        dqs_tile_generic(q, c, sc, nsc, rows, block, s0, m, S);
        quantize_generic(S[0], 0, qout + s0, sout + s0 / qblock, m, qblock);
    }
    free(slots);
    return 0;
}

static PyObject *py_dequant_sum_quantize(PyObject *self, PyObject *args) {
    Py_buffer qb, sb, qo, so;
    Py_ssize_t rows, block, qblock;
    if (!PyArg_ParseTuple(args, "y*y*w*w*nnn", &qb, &sb, &qo, &so, &rows, &block, &qblock)) return NULL;
    Py_ssize_t c = qo.len, nsc = block > 0 ? (c + block - 1) / block : 1;
    int bad = rows < 1 || block < 0 || qblock < 1 || qb.len < rows * c || sb.len < rows * nsc * 4 ||
              so.len < (c + qblock - 1) / qblock * 4, rc = 0;
    if (!bad) {
        Py_BEGIN_ALLOW_THREADS
        rc = dequant_sum_quantize(qb.buf, sb.buf, qo.buf, so.buf, rows, c, nsc, block, qblock);
        Py_END_ALLOW_THREADS
    }
    PyBuffer_Release(&qb); PyBuffer_Release(&sb); PyBuffer_Release(&qo); PyBuffer_Release(&so);
    if (bad)
        return PyErr_Format(PyExc_ValueError, "dequant_sum_quantize: bad sizes (rows=%zd, block=%zd, qblock=%zd)",
                            rows, block, qblock);
    if (rc) return PyErr_NoMemory();
    Py_RETURN_NONE;
}

static PyObject *py_quantize_i8(PyObject *self, PyObject *args) {
    Py_buffer xb, qb, sb;
    Py_ssize_t block;
    int isize;
    if (!PyArg_ParseTuple(args, "y*w*w*ni", &xb, &qb, &sb, &block, &isize)) return NULL;
    Py_ssize_t n = qb.len;
    if (block < 1 || (isize != 2 && isize != 4) || xb.len < n * isize || sb.len < (n + block - 1) / block * 4) {
        PyBuffer_Release(&xb); PyBuffer_Release(&qb); PyBuffer_Release(&sb);
        return PyErr_Format(PyExc_ValueError, "quantize_i8: bad sizes (block=%zd, src_itemsize=%d, src %zd bytes, "
                            "q %zd bytes, scales %zd bytes)", block, isize, xb.len, qb.len, sb.len);
    }
    Py_BEGIN_ALLOW_THREADS
#ifdef HAVE_F16C_VARIANT
    if (use_f16c) quantize_avx2(xb.buf, isize == 2, qb.buf, sb.buf, n, block); else
#endif
    quantize_generic(xb.buf, isize == 2, qb.buf, sb.buf, n, block);
    Py_END_ALLOW_THREADS
    PyBuffer_Release(&xb); PyBuffer_Release(&qb); PyBuffer_Release(&sb);
    Py_RETURN_NONE;
}

static int have_f16c = 0;   /* what the CPU offers; use_f16c may be switched off for tests */
static int have_avx512 = 0;

/* stream_copy: a copy whose stores bypass the cache (non-temporal), for data another process reads
 * next from shared memory. An ordinary store to a line that a peer core has cached must first fetch
 * the line and invalidate the peer's copy; on a virtual machine whose cores sit on different dies
 * that made copies into mpicoll's shared window 7-10x slower for seconds at a time. */
#ifdef HAVE_F16C_VARIANT
__attribute__((target("avx2"))) static void stream_avx2(const char *s, char *d, Py_ssize_t n) {
    Py_ssize_t i = 0;
    while (i < n && ((uintptr_t)(d + i) & 31)) { d[i] = s[i]; i++; }
    for (; i + 128 <= n; i += 128) {
        __m256i a = _mm256_loadu_si256((const __m256i *)(s + i)), b = _mm256_loadu_si256((const __m256i *)(s + i + 32));
        __m256i c = _mm256_loadu_si256((const __m256i *)(s + i + 64)), e = _mm256_loadu_si256((const __m256i *)(s + i + 96));
        _mm256_stream_si256((__m256i *)(d + i), a);
        _mm256_stream_si256((__m256i *)(d + i + 32), b);
        _mm256_stream_si256((__m256i *)(d + i + 64), c);
        _mm256_stream_si256((__m256i *)(d + i + 96), e);
    }
    for (; i + 32 <= n; i += 32) _mm256_stream_si256((__m256i *)(d + i), _mm256_loadu_si256((const __m256i *)(s + i)));
    for (; i < n; i++) d[i] = s[i];
    _mm_sfence();               /* the streamed stores are ordered before whatever the caller does next */
}
#endif

static PyObject *py_stream_copy(PyObject *self, PyObject *args) {
    Py_buffer s, d;
    if (!PyArg_ParseTuple(args, "y*w*", &s, &d)) return NULL;
    if (s.len != d.len) {
        PyBuffer_Release(&s); PyBuffer_Release(&d);
        return PyErr_Format(PyExc_ValueError, "stream_copy: %zd bytes into %zd", s.len, d.len);
    }
    Py_BEGIN_ALLOW_THREADS
#ifdef HAVE_F16C_VARIANT
    if (use_f16c) stream_avx2(s.buf, d.buf, s.len); else
#endif
    memcpy(d.buf, s.buf, (size_t)s.len);
    Py_END_ALLOW_THREADS
    PyBuffer_Release(&s); PyBuffer_Release(&d);
    Py_RETURN_NONE;
}

static PyObject *py_use_simd(PyObject *self, PyObject *args) {
    int on;
    if (!PyArg_ParseTuple(args, "p", &on)) return NULL;
    int before = use_f16c;
    use_f16c = on && have_f16c;
    return PyBool_FromLong(before);
}

static PyObject *py_use_avx512(PyObject *self, PyObject *args) {
    int on;
    if (!PyArg_ParseTuple(args, "p", &on)) return NULL;
    int before = use_avx512;
    use_avx512 = on && have_avx512;
    return PyBool_FromLong(before);
}

static PyMethodDef methods[] = {
    {"reduce_bf16", py_reduce_bf16, METH_VARARGS,
     "reduce_bf16(rows, out, op): float32-accumulated reduction of bfloat16 rows (buffers), rounded once"},
    {"f16_to_f32", py_f16_to_f32, METH_VARARGS, "f16_to_f32(src, dst): float16 buffer -> float32 buffer"},
    {"f32_to_f16", py_f32_to_f16, METH_VARARGS, "f32_to_f16(src, dst): float32 -> float16, round to nearest even"},
    {"bf16_to_f32", py_bf16_to_f32, METH_VARARGS, "bf16_to_f32(src, dst): bfloat16 buffer -> float32 buffer"},
    {"f32_to_bf16", py_f32_to_bf16, METH_VARARGS,
     "f32_to_bf16(src, dst): float32 -> bfloat16, round to nearest even, NaN -> the quiet NaN (as ml_dtypes)"},
    {"reduce_f32", py_reduce_f32, METH_VARARGS,
     "reduce_f32(rows, out, op): float32 rows (buffers) summed (op 0) or multiplied (op 1) in the tree order"},
    {"reduce_f64", py_reduce_f64, METH_VARARGS,
     "reduce_f64(rows, out, op): float64 rows (buffers) summed (op 0) or multiplied (op 1) in the tree order"},
    {"reduce_f16", py_reduce_f16, METH_VARARGS,
     "reduce_f16(rows, out, op): float32-accumulated reduction of float16 rows (buffers), rounded once"},
    {"dequant_sum", py_dequant_sum, METH_VARARGS,
     "dequant_sum(q, scales, out, rows, block, out_itemsize): float32 sum over int8 rows times their scales, rounded once"},
    {"dequant_sum_quantize", py_dequant_sum_quantize, METH_VARARGS,
     "dequant_sum_quantize(q, scales, qout, sout, rows, block, qblock): dequant_sum into float32, then "
     "quantize_i8 of it per qblock, fused"},
    {"quantize_i8", py_quantize_i8, METH_VARARGS,
     "quantize_i8(src, q, scales, block, src_itemsize): symmetric absmax int8 quantization per block"},
    {"stream_copy", py_stream_copy, METH_VARARGS,
     "stream_copy(src, dst): copy bytes with non-temporal stores (AVX2), or memcpy"},
    {"use_avx512", py_use_avx512, METH_VARARGS,
     "use_avx512(on) -> bool: use the AVX-512 float16/bfloat16 reductions (when the CPU has AVX-512F/BW and use_simd "
     "is on) or the AVX2 ones; returns the previous setting (for tests)"},
    {"use_simd", py_use_simd, METH_VARARGS,
     "use_simd(on) -> bool: use the F16C/AVX2 loops (when the CPU has them) or the portable C ones; returns the "
     "previous setting (for tests)"},
    {NULL, NULL, 0, NULL}};

static struct PyModuleDef module = {PyModuleDef_HEAD_INIT, "_kernels", "numeric kernels: float16/bfloat16 conversion and reduction, int8 quantization (optional)", -1, methods};

PyMODINIT_FUNC PyInit__kernels(void) {
    PyObject *m = PyModule_Create(&module);
    if (!m) return NULL;
#ifdef HAVE_F16C_VARIANT
    __builtin_cpu_init();
    use_f16c = __builtin_cpu_supports("f16c") && __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma");
    use_avx512 = use_f16c && __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw");
#endif
    have_f16c = use_f16c;
    have_avx512 = use_avx512;
    PyModule_AddIntConstant(m, "F16C", use_f16c);
    PyModule_AddIntConstant(m, "AVX512", use_avx512);
    return m;
}
