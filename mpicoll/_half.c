/* Optional accelerator for float16 reductions: numpy converts float16 <-> float32 one element at a
 * time (2-5 ns per element on the machines we measured), which dominates every float16 reduction.
 * These loops use the CPU's F16C conversions when it has them (runtime dispatch) and the
 * compiler's _Float16 otherwise; both round to nearest even, as numpy does, so results are
 * bit-identical to the numpy path. If this file does not compile, mpicoll falls back to numpy.
 *
 *   reduce_f16(parts, out, nrows, op)  out[i] = float16(op-reduce over rows r of float32(parts[r][i]))
 *                                      in row order, accumulated in float32; op 0 sum 1 prod 2 max 3 min
 *   reduce_bf16(parts, out, nrows, op)  the same for bfloat16
 *   f16_to_f32(src, dst), f32_to_f16(src, dst)
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <math.h>
#include <stdint.h>
#include <string.h>

#define TILE 1024

/* numpy's np.maximum / np.minimum exactly (NaN propagates; on ties, +0 vs -0, the second operand) */
static inline float maxf_nan(float a, float b) { return (a > b || a != a) ? a : b; }
static inline float minf_nan(float a, float b) { return (a < b || a != a) ? a : b; }

#define DEFINE_KERNELS(SUFFIX, ATTR)                                                              \
    ATTR static void h2f_##SUFFIX(const _Float16 *s, float *d, Py_ssize_t n) {                      \
        for (Py_ssize_t i = 0; i < n; i++) d[i] = (float)s[i];                                      \
    }                                                                                              \
    ATTR static void f2h_##SUFFIX(const float *s, _Float16 *d, Py_ssize_t n) {                      \
        for (Py_ssize_t i = 0; i < n; i++) d[i] = (_Float16)s[i];                                   \
    }                                                                                              \
    ATTR static void reduce_##SUFFIX(const _Float16 *p, _Float16 *out, Py_ssize_t rows,              \
                                     Py_ssize_t stride, Py_ssize_t c, int op) {                    \
        float acc[TILE];                                                                           \
        for (Py_ssize_t s = 0; s < c; s += TILE) {                                                  \
            Py_ssize_t m = c - s < TILE ? c - s : TILE;                                            \
            const _Float16 *r0 = p + s;                                                            \
            for (Py_ssize_t i = 0; i < m; i++) acc[i] = (float)r0[i];                              \
            for (Py_ssize_t r = 1; r < rows; r++) {                                                \
                const _Float16 *q = p + r * stride + s;                                            \
                switch (op) {                                                                      \
                case 0: for (Py_ssize_t i = 0; i < m; i++) acc[i] += (float)q[i]; break;           \
                case 1: for (Py_ssize_t i = 0; i < m; i++) acc[i] *= (float)q[i]; break;           \
                case 2: for (Py_ssize_t i = 0; i < m; i++) acc[i] = maxf_nan(acc[i], (float)q[i]); break; \
                default: for (Py_ssize_t i = 0; i < m; i++) acc[i] = minf_nan(acc[i], (float)q[i]); break; \
                }                                                                                  \
            }                                                                                      \
            for (Py_ssize_t i = 0; i < m; i++) out[s + i] = (_Float16)acc[i];                      \
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

F16C_ATTR static void reduce_f16c(const _Float16 *p, _Float16 *out, Py_ssize_t rows, Py_ssize_t c, int op) {
    Py_ssize_t i = 0;
    for (; i + 8 <= c; i += 8) {      /* 8 lanes at a time, the rows in order, the sum in a register */
        __m256 acc = _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(p + i)));
        for (Py_ssize_t r = 1; r < rows; r++)
            acc = vop(acc, _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(p + r * c + i))), op);
        _mm_storeu_si128((__m128i *)(out + i), _mm256_cvtps_ph(acc, _MM_FROUND_TO_NEAREST_INT));
    }
    if (i < c) reduce_generic(p + i, out + i, rows, c, c - i, op);
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

#define DEFINE_BF16(SUFFIX, ATTR)                                                                 \
    ATTR static void reduce_bf16_##SUFFIX(const uint16_t *p, uint16_t *out, Py_ssize_t rows,         \
                                          Py_ssize_t c, int op) {                                  \
        float acc[TILE];                                                                           \
        for (Py_ssize_t s = 0; s < c; s += TILE) {                                                  \
            Py_ssize_t m = c - s < TILE ? c - s : TILE;                                            \
            for (Py_ssize_t i = 0; i < m; i++) acc[i] = bf2f(p[s + i]);                            \
            for (Py_ssize_t r = 1; r < rows; r++) {                                                \
                const uint16_t *q = p + r * c + s;                                                 \
                switch (op) {                                                                      \
                case 0: for (Py_ssize_t i = 0; i < m; i++) acc[i] += bf2f(q[i]); break;            \
                case 1: for (Py_ssize_t i = 0; i < m; i++) acc[i] *= bf2f(q[i]); break;            \
                case 2: for (Py_ssize_t i = 0; i < m; i++) acc[i] = maxf_nan(acc[i], bf2f(q[i])); break; \
                default: for (Py_ssize_t i = 0; i < m; i++) acc[i] = minf_nan(acc[i], bf2f(q[i])); break; \
                }                                                                                  \
            }                                                                                      \
            for (Py_ssize_t i = 0; i < m; i++) out[s + i] = f2bf(acc[i]);                          \
        }                                                                                          \
    }

DEFINE_BF16(generic, )
#ifdef HAVE_F16C_VARIANT
DEFINE_BF16(avx2, __attribute__((target("avx2"))))
#endif

static int use_f16c = 0;

static PyObject *py_f16_to_f32(PyObject *self, PyObject *args) {
    Py_buffer s, d;
    if (!PyArg_ParseTuple(args, "y*w*", &s, &d)) return NULL;
    Py_ssize_t n = s.len / 2;
    if (d.len < n * 4) {
        PyBuffer_Release(&s); PyBuffer_Release(&d);
        return PyErr_Format(PyExc_ValueError, "f16_to_f32: destination holds %zd bytes, needs %zd", d.len, n * 4);
    }
    Py_BEGIN_ALLOW_THREADS
#ifdef HAVE_F16C_VARIANT
    if (use_f16c) h2f_f16c(s.buf, d.buf, n); else
#endif
    h2f_generic(s.buf, d.buf, n);
    Py_END_ALLOW_THREADS
    PyBuffer_Release(&s); PyBuffer_Release(&d);
    Py_RETURN_NONE;
}

static PyObject *py_f32_to_f16(PyObject *self, PyObject *args) {
    Py_buffer s, d;
    if (!PyArg_ParseTuple(args, "y*w*", &s, &d)) return NULL;
    Py_ssize_t n = s.len / 4;
    if (d.len < n * 2) {
        PyBuffer_Release(&s); PyBuffer_Release(&d);
        return PyErr_Format(PyExc_ValueError, "f32_to_f16: destination holds %zd bytes, needs %zd", d.len, n * 2);
    }
    Py_BEGIN_ALLOW_THREADS
#ifdef HAVE_F16C_VARIANT
    if (use_f16c) f2h_f16c(s.buf, d.buf, n); else
#endif
    f2h_generic(s.buf, d.buf, n);
    Py_END_ALLOW_THREADS
    PyBuffer_Release(&s); PyBuffer_Release(&d);
    Py_RETURN_NONE;
}

/* reduce_f16 / reduce_bf16: parse (parts, out, rows, op), check the sizes, run without the GIL */
static PyObject *reduce_rows(PyObject *args, int bf16) {
    Py_buffer s, d;
    Py_ssize_t rows;
    int op;
    if (!PyArg_ParseTuple(args, "y*w*ni", &s, &d, &rows, &op)) return NULL;
    Py_ssize_t c = d.len / 2;
    if (rows < 1 || s.len < rows * c * 2 || op < 0 || op > 3) {
        PyBuffer_Release(&s); PyBuffer_Release(&d);
        return PyErr_Format(PyExc_ValueError, "reduce: bad shape or op (rows=%zd, op=%d)", rows, op);
    }
    Py_BEGIN_ALLOW_THREADS
    if (bf16) {
#ifdef HAVE_F16C_VARIANT
        if (use_f16c) reduce_bf16_avx2(s.buf, d.buf, rows, c, op); else
#endif
        reduce_bf16_generic(s.buf, d.buf, rows, c, op);
    } else {
#ifdef HAVE_F16C_VARIANT
        if (use_f16c) reduce_f16c(s.buf, d.buf, rows, c, op); else
#endif
        reduce_generic(s.buf, d.buf, rows, c, c, op);
    }
    Py_END_ALLOW_THREADS
    PyBuffer_Release(&s); PyBuffer_Release(&d);
    Py_RETURN_NONE;
}

static PyObject *py_reduce_f16(PyObject *self, PyObject *args) { return reduce_rows(args, 0); }
static PyObject *py_reduce_bf16(PyObject *self, PyObject *args) { return reduce_rows(args, 1); }

static PyMethodDef methods[] = {
    {"reduce_bf16", py_reduce_bf16, METH_VARARGS,
     "reduce_bf16(parts, out, rows, op): float32-accumulated row reduction of bfloat16, rounded once"},
    {"f16_to_f32", py_f16_to_f32, METH_VARARGS, "f16_to_f32(src, dst): float16 buffer -> float32 buffer"},
    {"f32_to_f16", py_f32_to_f16, METH_VARARGS, "f32_to_f16(src, dst): float32 -> float16, round to nearest even"},
    {"reduce_f16", py_reduce_f16, METH_VARARGS,
     "reduce_f16(parts, out, rows, op): float32-accumulated row reduction of float16, rounded once"},
    {NULL, NULL, 0, NULL}};

static struct PyModuleDef module = {PyModuleDef_HEAD_INIT, "_half", "float16 kernels (optional)", -1, methods};

PyMODINIT_FUNC PyInit__half(void) {
    PyObject *m = PyModule_Create(&module);
    if (!m) return NULL;
#ifdef HAVE_F16C_VARIANT
    __builtin_cpu_init();
    use_f16c = __builtin_cpu_supports("f16c") && __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma");
#endif
    PyModule_AddIntConstant(m, "F16C", use_f16c);
    return m;
}
