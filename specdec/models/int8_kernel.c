/* specdec's int8 product, compiled on the machine that runs it (specdec/models/native.py).

   out[m, n] = sum_k x[m, k] * w[n, k], exact (int32 sums), as float32, for any int8 weight in [-127, 127]. The weight
   is packed once as [N/16][K/4][16][4] int8 (N padded to 16, K to 64): each 64-byte vector holds 4 consecutive k of
   16 outputs, the layout of a VNNI dot-product step and of an AMX B tile. The rows arrive shifted into uint8,
   xu = x + 128 (VNNI and AMX multiply u8 by s8); bias128[n] = 128 * sum_k w[n, k] takes the shift back out.

   The paths, compiled for the CPU at hand (-march=native):
   - AVX512-VNNI: each weight vector read once for up to 11 rows, the blocks of 16 outputs one after another (one
     sequential stream), or two at a time from 7 rows on; from 12 rows on, 16 rows at a time in one vector, each
     weight's inputs broadcast (a prompt's rows).
   - AMX tiles, 16 rows at a time, where the compiler targets them and the OS grants them (the caller passes `tiles`
     from the row count its timing found them faster from).
   - AVX2 without VNNI: each half vector (8 outputs x 4 k) read once for up to 4 rows. Its pair product
     (vpmaddubsw, u8 x s8 summed in 16 bits) saturates on x + 128 for 8-bit weights (2 * 255 * 127 > 32767), which
     is why fbgemm there is exact only for 7-bit weights; here it multiplies |x| by w with x's sign instead, whose
     pairs stay within 2 * 127 * 127 < 2^15, so the sums are exact for 8-bit weights: the int8 model has the same
     weights and the same integer sums as on any other CPU.
   Every path gives the same exact sums, so which one ran never changes a bit; whether this kernel runs at all is
   measured (specdec.models.quant). A CPU with neither gets no build: plain code, exact by widening to 16 bits, took
   3.8 ms for one row of a [17920, 1536] weight on the Xeon of docs/performance.md (the VNNI path 1.0). */
#include <float.h>
#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <immintrin.h>

#if defined(__AVX512VNNI__) && defined(__AVX512BW__)
#define MB_MAX 12   /* rows one VNNI pass reads each weight vector for */
#define PAIRED 7   /* rows from which a pass reads two blocks at a time (each row's broadcast then serves two) */
#define PREFETCH 4096  /* bytes ahead in a block's weights each step asks the cache for (the hardware prefetcher
   alone left several rows' products 5-15% under the one-row read speed, docs/performance.md); past a block's end,
   in the same block of the next pass */

/* NB blocks of 16 outputs for MB rows: NB x MB accumulators of 16 int32 */
static inline __attribute__((always_inline)) void tile(const uint8_t *xu, int64_t K, const int8_t *w,
        const int32_t *bias128, int64_t blk, int64_t N, float *out, int64_t ldo, const int NB, const int MB) {
    const int64_t K4 = K / 4;
    __m512i acc[2][MB_MAX];
    #pragma GCC unroll 2
    for (int i = 0; i < NB; i++)
        #pragma GCC unroll 12
        for (int j = 0; j < MB; j++) acc[i][j] = _mm512_setzero_si512();
    const int8_t *wb = w + blk * K4 * 64;
    for (int64_t g = 0; g < K4; g++) {
        #pragma GCC unroll 2
        for (int i = 0; i < NB; i++) {
            const int64_t ahead = g * 64 + PREFETCH < K4 * 64 ? PREFETCH : PREFETCH + (NB - 1) * K4 * 64;
            _mm_prefetch((const char *)(wb + (i * K4 + g) * 64 + ahead), _MM_HINT_T0);
            __m512i v = _mm512_loadu_si512(wb + (i * K4 + g) * 64);
            #pragma GCC unroll 12
            for (int j = 0; j < MB; j++)
                acc[i][j] = _mm512_dpbusd_epi32(acc[i][j], _mm512_set1_epi32(*(const int32_t *)(xu + j * K + 4 * g)), v);
        }
    }
    #pragma GCC unroll 2
    for (int i = 0; i < NB; i++) {
        const int64_t n = (blk + i) * 16;
        const __mmask16 keep = N - n >= 16 ? 0xFFFF : (__mmask16)((1u << (N - n)) - 1);
        const __m512i shift = _mm512_maskz_loadu_epi32(keep, bias128 + n);
        #pragma GCC unroll 12
        for (int j = 0; j < MB; j++)
            _mm512_mask_storeu_ps(out + j * ldo + n, keep, _mm512_cvtepi32_ps(_mm512_sub_epi32(acc[i][j], shift)));
    }
}
#define TILE(nb, mb) tile(xu + m * K, K, w, bias128, blk, N, out + m * ldo, ldo, nb, mb)
static void vector_blocks(const uint8_t *xu, int64_t M, int64_t K, const int8_t *w, const int32_t *bias128,
                        int64_t b0, int64_t b1, int64_t N, float *out, int64_t ldo) {
    for (int64_t m = 0; m < M; m += MB_MAX) {
        const int mb = M - m >= MB_MAX ? MB_MAX : (int)(M - m);
        int64_t blk = b0;
        if (mb >= PAIRED)  /* at most 2 x 12 accumulators */
            for (; blk + 2 <= b1; blk += 2)
                switch (mb) {
                    case 7: TILE(2, 7); break; case 8: TILE(2, 8); break; case 9: TILE(2, 9); break;
                    case 10: TILE(2, 10); break; case 11: TILE(2, 11); break; default: TILE(2, 12); break;
                }
        for (; blk < b1; blk++)
            switch (mb) {
                case 1: TILE(1, 1); break; case 2: TILE(1, 2); break; case 3: TILE(1, 3); break;
                case 4: TILE(1, 4); break; case 5: TILE(1, 5); break; case 6: TILE(1, 6); break;
                case 7: TILE(1, 7); break; case 8: TILE(1, 8); break; case 9: TILE(1, 9); break;
                case 10: TILE(1, 10); break; case 11: TILE(1, 11); break; default: TILE(1, 12); break;
            }
    }
}

/* Many rows (a prompt, or a verification of 11 drafts or more), 16 at a time: the 16 rows' inputs in one vector and
   each weight's 4 inputs broadcast, so a step is one load of the rows and 16 dot products, one per output of a block.
   The pass above, made for few rows, runs at half the dot-product rate on 12 rows or more (a Zen 4: 1.7 G dot
   products a second on a core against 3.5 here, and a prompt's product 1.7-1.9x as long, docs/performance.md). The
   rows are laid out as [groups][K/4][16][4]: 4 consecutive inputs of 16 rows per vector, rows past M as x = 0 (128);
   from PROMPT_ROWS rows on, whole groups of 16 take this path, and a last part of PROMPT_ROWS rows or more is padded
   to a group, a smaller one takes the pass above on the same blocks while they are in the cache. */
#define PROMPT_ROWS 12  /* rows from which a product takes this path (faster from 12 rows on, docs/performance.md) */
static void rows_by_16(const uint8_t *xu, int64_t M, int64_t groups, int64_t K, uint8_t *xp) {
    const int64_t K4 = K / 4;
    for (int64_t grp = 0; grp < groups; grp++)
        for (int64_t r = 0; r < 16; r++) {
            int32_t *to = (int32_t *)(xp + grp * K4 * 64) + r;
            const int32_t *row = (const int32_t *)(xu + (grp * 16 + r) * K);
            for (int64_t g = 0; g < K4; g++) to[g * 16] = grp * 16 + r < M ? row[g] : (int32_t)0x80808080;
        }
}
#define PROMPT_DOT(n) c##n = _mm512_dpbusd_epi32(c##n, a, _mm512_set1_epi32(*(const int32_t *)(wg + 4 * n)));
#define PROMPT_STORE(n) _mm512_store_si512(sums + 16 * n, c##n);
/* one block of 16 outputs (wb: [K/4][16][4]) for one group of 16 rows (xg: [K/4][16][4]): sums[n][row] */
static inline void prompt_tile(const uint8_t *xg, const int8_t *wb, int64_t K4, int32_t *sums) {
    __m512i c0 = _mm512_setzero_si512(), c1 = c0, c2 = c0, c3 = c0, c4 = c0, c5 = c0, c6 = c0, c7 = c0, c8 = c0,
            c9 = c0, c10 = c0, c11 = c0, c12 = c0, c13 = c0, c14 = c0, c15 = c0;
    for (int64_t g = 0; g < K4; g++) {
        _mm_prefetch((const char *)(wb + g * 64 + PREFETCH), _MM_HINT_T0);
        const __m512i a = _mm512_loadu_si512(xg + g * 64);
        const int8_t *wg = wb + g * 64;
        PROMPT_DOT(0) PROMPT_DOT(1) PROMPT_DOT(2) PROMPT_DOT(3) PROMPT_DOT(4) PROMPT_DOT(5) PROMPT_DOT(6)
        PROMPT_DOT(7) PROMPT_DOT(8) PROMPT_DOT(9) PROMPT_DOT(10) PROMPT_DOT(11) PROMPT_DOT(12) PROMPT_DOT(13)
        PROMPT_DOT(14) PROMPT_DOT(15)
    }
    PROMPT_STORE(0) PROMPT_STORE(1) PROMPT_STORE(2) PROMPT_STORE(3) PROMPT_STORE(4) PROMPT_STORE(5) PROMPT_STORE(6)
    PROMPT_STORE(7) PROMPT_STORE(8) PROMPT_STORE(9) PROMPT_STORE(10) PROMPT_STORE(11) PROMPT_STORE(12) PROMPT_STORE(13)
    PROMPT_STORE(14) PROMPT_STORE(15)
}
static void prompt_blocks(const uint8_t *xp, int64_t M, int64_t groups, int64_t K, const int8_t *w,
                          const int32_t *bias128, int64_t b0, int64_t b1, int64_t N, float *out, int64_t ldo) {
    const int64_t K4 = K / 4;
    int32_t sums[256] __attribute__((aligned(64)));
    for (int64_t blk = b0; blk < b1; blk++) {
        const int64_t n0 = blk * 16, width = N - n0 < 16 ? N - n0 : 16;
        for (int64_t grp = 0; grp < groups; grp++) {
            prompt_tile(xp + grp * K4 * 64, w + blk * K4 * 64, K4, sums);
            for (int64_t n = 0; n < width; n++)
                for (int64_t r = 0; r < 16 && grp * 16 + r < M; r++)
                    out[(grp * 16 + r) * ldo + n0 + n] = (float)(sums[n * 16 + r] - bias128[n0 + n]);
        }
    }
}
#elif defined(__AVX2__)
#define MB_MAX 4   /* rows one AVX2 pass reads each half vector for (16 registers: sums, rows, the weight) */

/* lanes below `left` of 8 on, as a mask for maskload/maskstore */
static inline __m256i lanes(int64_t left) {
    return _mm256_cmpgt_epi32(_mm256_set1_epi32(left > 8 ? 8 : (int)left), _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7));
}

/* NB blocks of 16 outputs (2 NB halves of 8) for MB rows: 2 NB x MB accumulators of 8 int32. x * w = |x| * (w with
   x's sign), and pairs of those are within 2 * 127 * 127 < 2^15: vpmaddubsw sums them exactly for any int8 weight,
   then vpmaddwd adds the pairs in 32 bits. */
static inline __attribute__((always_inline)) void tile(const uint8_t *xu, int64_t K, const int8_t *w,
        int64_t blk, int64_t N, float *out, int64_t ldo, const int NB, const int MB) {
    const int64_t K4 = K / 4;
    const __m256i ones = _mm256_set1_epi16(1), flip = _mm256_set1_epi8((char)0x80);
    __m256i acc[4][MB_MAX];
    #pragma GCC unroll 4
    for (int i = 0; i < 2 * NB; i++)
        #pragma GCC unroll 4
        for (int j = 0; j < MB; j++) acc[i][j] = _mm256_setzero_si256();
    const int8_t *wb = w + blk * K4 * 64;
    for (int64_t g = 0; g < K4; g++) {
        __m256i x[MB_MAX], xa[MB_MAX];  /* 4 k of each row, broadcast: x (xu ^ 0x80, as int8) and |x| */
        #pragma GCC unroll 4
        for (int j = 0; j < MB; j++) {
            x[j] = _mm256_xor_si256(_mm256_set1_epi32(*(const int32_t *)(xu + j * K + 4 * g)), flip);
            xa[j] = _mm256_abs_epi8(x[j]);
        }
        #pragma GCC unroll 4
        for (int i = 0; i < 2 * NB; i++) {
            const __m256i v = _mm256_loadu_si256((const __m256i *)(wb + ((i / 2) * K4 + g) * 64 + (i % 2) * 32));
            #pragma GCC unroll 4
            for (int j = 0; j < MB; j++)
                acc[i][j] = _mm256_add_epi32(
                    acc[i][j], _mm256_madd_epi16(_mm256_maddubs_epi16(xa[j], _mm256_sign_epi8(v, x[j])), ones));
        }
    }
    #pragma GCC unroll 4
    for (int i = 0; i < 2 * NB; i++) {
        const int64_t n = (blk + i / 2) * 16 + (i % 2) * 8;
        if (n >= N) continue;
        const __m256i keep = lanes(N - n);
        #pragma GCC unroll 4
        for (int j = 0; j < MB; j++) _mm256_maskstore_ps(out + j * ldo + n, keep, _mm256_cvtepi32_ps(acc[i][j]));
    }
}
#define TILE(nb, mb) tile(xu + m * K, K, w, blk, N, out + m * ldo, ldo, nb, mb)
/* one or two blocks of 16 outputs at a time (two for one or two rows), every group of up to 4 rows over them while
   they are in the cache */
static void vector_blocks(const uint8_t *xu, int64_t M, int64_t K, const int8_t *w, const int32_t *bias128,
                          int64_t b0, int64_t b1, int64_t N, float *out, int64_t ldo) {
    (void)bias128;  /* the sums are x * w itself: no shift to take out */
    int64_t blk = b0;
    if (M <= 2)
        for (; blk + 2 <= b1; blk += 2) {
            const int64_t m = 0;
            if (M == 1) TILE(2, 1); else TILE(2, 2);
        }
    for (; blk < b1; blk++)
        for (int64_t m = 0; m < M; m += MB_MAX)
            switch (M - m >= MB_MAX ? MB_MAX : (int)(M - m)) {
                case 1: TILE(1, 1); break; case 2: TILE(1, 2); break; case 3: TILE(1, 3); break;
                default: TILE(1, 4); break;
            }
}
#else
#error "the int8 product is written for AVX512-VNNI or AVX2: the compiler's plain code is slower than fbgemm"
#endif

/* A row's int8 scale, max(max|x| / 127, FLT_MIN) (NaN kept), and a value's code under it: round-half-even(x / scale)
   clamped to [-127, 127]; torch's float operations, one rounding each (an int8 Linear's, specdec.models.quant). */
static inline float row_scale(const float *row, int64_t K) {
    __m256 lanes = _mm256_setzero_ps();  /* a max is exact in any order: 8 lanes, then across them */
    int64_t k = 0;
    for (; k + 8 <= K; k += 8) lanes = _mm256_max_ps(lanes, _mm256_andnot_ps(_mm256_set1_ps(-0.0f), _mm256_loadu_ps(row + k)));
    float part[8], amax = 0.0f;
    _mm256_storeu_ps(part, lanes);
    for (int i = 0; i < 8; i++) amax = fmaxf(amax, part[i]);
    for (; k < K; k++) amax = fmaxf(amax, fabsf(row[k]));
    const float scale = amax / 127.0f;
    return scale >= FLT_MIN ? scale : scale != scale ? scale : FLT_MIN;
}
static inline float code_of(float x, float scale) {
    const float v = nearbyintf(x / scale);
    return v < -127.0f ? -127.0f : v > 127.0f ? 127.0f : v;
}
/* A row's codes shifted into uint8, code_of(x, scale) + 128, 8 at a time: the same division, round-half-even and
   clamp (the compiler leaves the scalar loop unvectorized). */
static void shifted_codes(const float *row, int64_t K, float scale, uint8_t *q) {
    const __m256 s = _mm256_set1_ps(scale), lo = _mm256_set1_ps(-127.0f), hi = _mm256_set1_ps(127.0f);
    int64_t k = 0;
    for (; k + 8 <= K; k += 8) {
        __m256 v = _mm256_round_ps(_mm256_div_ps(_mm256_loadu_ps(row + k), s), _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
        __m256i codes = _mm256_cvtps_epi32(_mm256_add_ps(_mm256_min_ps(_mm256_max_ps(v, lo), hi), _mm256_set1_ps(128.0f)));
        __m128i words = _mm_packus_epi32(_mm256_castsi256_si128(codes), _mm256_extracti128_si256(codes, 1));
        _mm_storel_epi64((__m128i *)(q + k), _mm_packus_epi16(words, words));
    }
    for (; k < K; k++) q[k] = (uint8_t)(int32_t)(code_of(row[k], scale) + 128.0f);
}

/* The 4-bit product of a draft (specdec.models.quant4.Int4DynamicLinear): w[n, k] = code * scale[n, g] - offset[n, g]
   with code in 0..15 over groups g of G4 inputs. Packed as [N/16][K/8][16][4] bytes, a byte of output o holding
   code[k] in its low nibble and code[k + 4] in its high one, so one 64-byte vector is two VNNI steps of 16 outputs
   (u8 codes times s8 inputs); scales [N/16][K/G4][2][16] fp16, the 16 scales then the 16 offsets of a block and
   group. Each row of x is quantized alone to int8 (symmetric, as in int8_linear); a group's exact int32 sums are
   scaled in float32: y = x_scale * sum_g (scale * sum(code * x_q) - offset * sum(x_q)). Rows never meet. */
#define G4 32
/* bytes ahead in the codes, and in the scales, each step asks the cache for: without them one row read the 4-bit
   weights at 20 GB/s where the int8 product reads 28 (docs/performance.md) */
#define PREFETCH4 8192
#define PREFETCH4_SCALES 2048
#if defined(__AVX512VNNI__) && defined(__AVX512BW__)
#define MB4 12   /* rows one pass reads each weight vector for at most (the caller's `mb`, timed per machine: with
   4, the draft's products over 8 rows took 25.5 ms and over 16 rows 38.5 on a Zen 4, with 8, 18.8 and 35.4; 12 rows a
   pass made a Xeon's 9-row target forward 1.37 one-token steps where 8 made it 1.57: docs/performance.md) */
/* one block of 16 outputs for MB rows: the blocks are read one after another, one sequential stream (two blocks at
   a time, two streams, read the 4-bit weights 13% slower for one row, docs/performance.md) */
static inline __attribute__((always_inline)) void tile4(const int8_t *xq, const float *xsum, int64_t K,
        const uint8_t *w, const uint16_t *sz, int64_t blk, int64_t N, float *out, int64_t ldo, const int MB) {
    const int64_t K8 = K / 8, G = K / G4;
    const __m512i low = _mm512_set1_epi8(0x0F);
    __m512 acc[MB4];
    #pragma GCC unroll 12
    for (int j = 0; j < MB; j++) acc[j] = _mm512_setzero_ps();
    for (int64_t g = 0; g < G; g++) {
        __m512i dot[MB4];
        #pragma GCC unroll 12
        for (int j = 0; j < MB; j++) dot[j] = _mm512_setzero_si512();
        #pragma GCC unroll 8
        for (int p = g * (G4 / 8); p < (g + 1) * (G4 / 8); p++) {
            _mm_prefetch((const char *)(w + (blk * K8 + p) * 64 + PREFETCH4), _MM_HINT_T0);
            const __m512i v = _mm512_loadu_si512(w + (blk * K8 + p) * 64);
            const __m512i lo = _mm512_and_si512(v, low), hi = _mm512_and_si512(_mm512_srli_epi16(v, 4), low);
            #pragma GCC unroll 12
            for (int j = 0; j < MB; j++) {
                const int8_t *x = xq + j * K + 8 * p;
                dot[j] = _mm512_dpbusd_epi32(dot[j], lo, _mm512_set1_epi32(*(const int32_t *)x));
                dot[j] = _mm512_dpbusd_epi32(dot[j], hi, _mm512_set1_epi32(*(const int32_t *)(x + 4)));
            }
        }
        const uint16_t *s = sz + (blk * G + g) * 32;
        _mm_prefetch((const char *)(s + PREFETCH4_SCALES / 2), _MM_HINT_T0);
        const __m512 scale = _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)s));
        const __m512 offset = _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)(s + 16)));
        #pragma GCC unroll 12
        for (int j = 0; j < MB; j++)
            acc[j] = _mm512_sub_ps(_mm512_add_ps(acc[j], _mm512_mul_ps(scale, _mm512_cvtepi32_ps(dot[j]))),
                                   _mm512_mul_ps(offset, _mm512_set1_ps(xsum[j * G + g])));
    }
    const int64_t n = blk * 16;
    const __mmask16 keep = N - n >= 16 ? 0xFFFF : (__mmask16)((1u << (N - n)) - 1);
    #pragma GCC unroll 12
    for (int j = 0; j < MB; j++) _mm512_mask_storeu_ps(out + j * ldo + n, keep, acc[j]);
}
#else
#define MB4 4   /* rows one pass reads each half vector for (16 registers) */
/* AVX2: each half vector (8 outputs) at a time; vpmaddubsw's pairs of code * x stay within 2 * 15 * 127 < 2^15 */
static inline __attribute__((always_inline)) void tile4(const int8_t *xq, const float *xsum, int64_t K,
        const uint8_t *w, const uint16_t *sz, int64_t blk, int64_t N, float *out, int64_t ldo, const int MB) {
    const int64_t K8 = K / 8, G = K / G4;
    const __m256i low = _mm256_set1_epi8(0x0F), ones = _mm256_set1_epi16(1);
    for (int h = 0; h < 2; h++) {
        const int64_t n = blk * 16 + h * 8;
        if (n >= N) break;
        __m256 acc[MB4];
        #pragma GCC unroll 4
        for (int j = 0; j < MB; j++) acc[j] = _mm256_setzero_ps();
        for (int64_t g = 0; g < G; g++) {
            __m256i dot[MB4];
            #pragma GCC unroll 4
            for (int j = 0; j < MB; j++) dot[j] = _mm256_setzero_si256();
            #pragma GCC unroll 4
            for (int p = g * (G4 / 8); p < (g + 1) * (G4 / 8); p++) {
                const __m256i v = _mm256_loadu_si256((const __m256i *)(w + (blk * K8 + p) * 64 + h * 32));
                const __m256i lo = _mm256_and_si256(v, low), hi = _mm256_and_si256(_mm256_srli_epi16(v, 4), low);
                #pragma GCC unroll 4
                for (int j = 0; j < MB; j++) {
                    const int8_t *x = xq + j * K + 8 * p;
                    const __m256i pairs = _mm256_add_epi16(
                        _mm256_maddubs_epi16(lo, _mm256_set1_epi32(*(const int32_t *)x)),
                        _mm256_maddubs_epi16(hi, _mm256_set1_epi32(*(const int32_t *)(x + 4))));
                    dot[j] = _mm256_add_epi32(dot[j], _mm256_madd_epi16(pairs, ones));
                }
            }
            const uint16_t *s = sz + (blk * G + g) * 32 + h * 8;
            const __m256 scale = _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)s));
            const __m256 offset = _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(s + 16)));
            #pragma GCC unroll 4
            for (int j = 0; j < MB; j++)
                acc[j] = _mm256_sub_ps(_mm256_add_ps(acc[j], _mm256_mul_ps(scale, _mm256_cvtepi32_ps(dot[j]))),
                                       _mm256_mul_ps(offset, _mm256_set1_ps(xsum[j * G + g])));
        }
        const __m256i keep = lanes(N - n);
        #pragma GCC unroll 4
        for (int j = 0; j < MB; j++) _mm256_maskstore_ps(out + j * ldo + n, keep, acc[j]);
    }
}
#endif
#define TILE4(mb) tile4(xq + m * K, xsum + m * G, K, w, sz, blk, N, out + m * ldo, ldo, mb)
static void blocks4(const int8_t *xq, const float *xsum, int64_t M, int64_t K, const uint8_t *w, const uint16_t *sz,
                    int64_t b0, int64_t b1, int64_t N, float *out, int64_t ldo, int mb) {
    const int64_t G = K / G4;
    for (int64_t m = 0; m < M; m += mb)
        for (int64_t blk = b0; blk < b1; blk++)
            switch (M - m >= mb ? mb : (int)(M - m)) {
                case 1: TILE4(1); break; case 2: TILE4(2); break; case 3: TILE4(3); break;
#if MB4 > 4
                case 4: TILE4(4); break; case 5: TILE4(5); break; case 6: TILE4(6); break; case 7: TILE4(7); break;
                case 8: TILE4(8); break; case 9: TILE4(9); break; case 10: TILE4(10); break; case 11: TILE4(11); break;
#endif
                default: TILE4(MB4);
            }
}

/* A draft's 4-bit Linear: y = x W.T (+ bias) as above, x [M][K] float32 with K a multiple of G4, out [M][N], the
   rows `mb` at a time (1..MB4; each row's operations are the same whatever `mb`). Returns 0, or -1 where its scratch
   (the rows' scales, group sums and codes) could not be had. */
int int4_linear(const float *x, int64_t M, int64_t K, const uint8_t *w, const uint16_t *sz, int64_t N,
                const float *bias, float *out, int mb, int threads) {
    mb = mb < 1 ? 1 : mb > MB4 ? MB4 : mb;
    const int64_t G = K / G4;
    float *xscale = malloc(M * sizeof(float) * (1 + G) + M * K);
    if (!xscale) return -1;
    float *xsum = xscale + M;
    int8_t *xq = (int8_t *)(xsum + M * G);
    for (int64_t m = 0; m < M; m++) {
        const float *row = x + m * K, scale = row_scale(row, K);
        xscale[m] = scale;
        for (int64_t g = 0; g < G; g++) {
            int32_t sum = 0;
            for (int64_t k = g * G4; k < (g + 1) * G4; k++) {
                const float v = code_of(row[k], scale);
                xq[m * K + k] = (int8_t)v;
                sum += (int32_t)v;
            }
            xsum[m * G + g] = (float)sum;
        }
    }
    const int64_t blocks = (N + 15) / 16, chunk = 4;
    #pragma omp parallel for schedule(static) num_threads(threads)
    for (int64_t b0 = 0; b0 < blocks; b0 += chunk)
        blocks4(xq, xsum, M, K, w, sz, b0, b0 + chunk < blocks ? b0 + chunk : blocks, N, out, N, mb);
    for (int64_t m = 0; m < M; m++) {
        float *y = out + m * N;
        const float s = xscale[m];
        if (bias) for (int64_t n = 0; n < N; n++) y[n] = y[n] * s + bias[n];
        else for (int64_t n = 0; n < N; n++) y[n] = y[n] * s;
    }
    free(xscale);
    return 0;
}

#if defined(__AMX_INT8__) && defined(__AMX_TILE__)
#include <sys/syscall.h>
#include <unistd.h>
#define ARCH_REQ_XCOMP_PERM 0x1023
#define XFEATURE_XTILEDATA 18
struct tile_config { uint8_t palette, start; uint8_t reserved[14]; uint16_t colsb[16]; uint8_t rows[16]; };
int amx(void) {  /* whether this process may use AMX tiles (the OS grants them on request) */
    static int granted = -1;
    if (granted < 0) granted = syscall(SYS_arch_prctl, ARCH_REQ_XCOMP_PERM, XFEATURE_XTILEDATA) == 0;
    return granted;
}
static void amx_store(int64_t m0, int64_t n, int64_t N, const int32_t *c, const int32_t *bias128, float *out,
                      int64_t ldo) {
    for (int r = 0; r < 16; r++)
        for (int j = 0; j < 16 && n + j < N; j++)
            out[(m0 + r) * ldo + n + j] = (float)(c[r * 16 + j] - bias128[n + j]);
}
/* rows in tiles of 16 (M padded to 16 by the caller); 4 blocks of 16 outputs at a time: C tiles 0-3 += A (tile 4:
   16 rows x 64 u8, read once for the 4) . B (tiles 5-7, 16 K-groups x 64 s8 each) */
static void amx_blocks(const uint8_t *xu, int64_t M, int64_t K, const int8_t *w, const int32_t *bias128,
                       int64_t b0, int64_t b1, int64_t N, float *out, int64_t ldo) {
    struct tile_config config = {0};
    config.palette = 1;
    for (int t = 0; t < 8; t++) { config.rows[t] = 16; config.colsb[t] = 64; }
    _tile_loadconfig(&config);
    const int64_t K4 = K / 4;
    int32_t c[16 * 16];
    for (int64_t m0 = 0; m0 < M; m0 += 16) {
        int64_t blk = b0;
        for (; blk + 4 <= b1; blk += 4) {
            const int8_t *wb = w + blk * K4 * 64;
            _tile_zero(0); _tile_zero(1); _tile_zero(2); _tile_zero(3);
            for (int64_t k0 = 0; k0 < K; k0 += 64) {
                _tile_loadd(4, xu + m0 * K + k0, K);
                _tile_loadd(5, wb + (k0 / 4) * 64, 64);
                _tile_dpbusd(0, 4, 5);
                _tile_loadd(6, wb + (K4 + k0 / 4) * 64, 64);
                _tile_dpbusd(1, 4, 6);
                _tile_loadd(7, wb + (2 * K4 + k0 / 4) * 64, 64);
                _tile_dpbusd(2, 4, 7);
                _tile_loadd(5, wb + (3 * K4 + k0 / 4) * 64, 64);
                _tile_dpbusd(3, 4, 5);
            }
            _tile_stored(0, c, 64); amx_store(m0, blk * 16, N, c, bias128, out, ldo);
            _tile_stored(1, c, 64); amx_store(m0, (blk + 1) * 16, N, c, bias128, out, ldo);
            _tile_stored(2, c, 64); amx_store(m0, (blk + 2) * 16, N, c, bias128, out, ldo);
            _tile_stored(3, c, 64); amx_store(m0, (blk + 3) * 16, N, c, bias128, out, ldo);
        }
        for (; blk < b1; blk++) {
            const int8_t *wb = w + blk * K4 * 64;
            _tile_zero(0);
            for (int64_t k0 = 0; k0 < K; k0 += 64) {
                _tile_loadd(4, xu + m0 * K + k0, K);
                _tile_loadd(5, wb + (k0 / 4) * 64, 64);
                _tile_dpbusd(0, 4, 5);
            }
            _tile_stored(0, c, 64); amx_store(m0, blk * 16, N, c, bias128, out, ldo);
        }
    }
    _tile_release();
}
#else
int amx(void) { return 0; }
static void amx_blocks(const uint8_t *xu, int64_t M, int64_t K, const int8_t *w, const int32_t *bias128,
                       int64_t b0, int64_t b1, int64_t N, float *out, int64_t ldo) {}
#endif

/* The row sums of an int8 weight w [N][K] (what the shifted rows' sums take back out, x 128): out [N]. */
void row_sums(const int8_t *w, int64_t N, int64_t K, int32_t *out, int threads) {
    #pragma omp parallel for schedule(static) num_threads(threads)
    for (int64_t n = 0; n < N; n++) {
        int32_t sum = 0;
        for (int64_t k = 0; k < K; k++) sum += w[n * K + k];
        out[n] = sum;
    }
}

/* The product of M rows: xu [M][K] (M a multiple of 16 where tiles), w packed, out [M][N]: the exact sums. */
void int8_product(const uint8_t *xu, int64_t M, int64_t K, const int8_t *w, const int32_t *bias128, int64_t N,
                  float *out, int tiles, int threads) {
    const int64_t blocks = (N + 15) / 16, chunk = 4;
#ifdef PROMPT_ROWS  /* groups of 16 rows for the prompt path: whole ones, and a last part of PROMPT_ROWS or more */
    const int64_t whole = M / 16, groups = !tiles && M >= PROMPT_ROWS ? whole + (M - 16 * whole >= PROMPT_ROWS) : 0;
#else
    const int64_t groups = 0;  /* AVX2: its pass takes every row */
#endif
    uint8_t *xp = groups ? malloc(16 * groups * K) : NULL;  /* without it, every row takes the vector pass */
    const int64_t first = xp ? (16 * groups < M ? 16 * groups : M) : 0;  /* the rows past the groups: the pass */
#ifdef PROMPT_ROWS
    if (xp) rows_by_16(xu, M, groups, K, xp);
#endif
    #pragma omp parallel for schedule(static) num_threads(threads)
    for (int64_t b0 = 0; b0 < blocks; b0 += chunk) {
        const int64_t b1 = b0 + chunk < blocks ? b0 + chunk : blocks;
        if (tiles) {
            amx_blocks(xu, M, K, w, bias128, b0, b1, N, out, N);
            continue;
        }
#ifdef PROMPT_ROWS
        if (xp) prompt_blocks(xp, M, groups, K, w, bias128, b0, b1, N, out, N);
#endif
        if (M > first) vector_blocks(xu + first * K, M - first, K, w, bias128, b0, b1, N, out + first * N, N);
    }
    free(xp);
}

/* A row-invariant int8 Linear, what specdec.models.quant.Int8Linear computes with torch ops, the same operations
   in the same order (built with -ffp-contract=off: no fused multiply-adds), so the same bits: each row quantized
   alone, scale = max(max|x| / 127, FLT_MIN), q = round-half-even(x / scale) clamped to [-127, 127]; then
   y = sums * wscale[n] * scale[m] (+ bias[n]). x [M][K] float32; out [rows][N] (rows = M, or M padded to 16 where
   tiles). Returns 0, or -1 where its scratch (the rows' scales and their codes, [rows][Kp]) could not be had. */
int int8_linear(const float *x, int64_t M, int64_t K, int64_t rows, int64_t Kp, const int8_t *w,
                const int32_t *bias128, int64_t N, const float *wscale, const float *bias, float *out, int tiles,
                int threads) {
    float *xscale = malloc(M * sizeof(float) + rows * Kp);
    if (!xscale) return -1;
    uint8_t *xu = (uint8_t *)(xscale + M);
    for (int64_t m = 0; m < M; m++) {
        const float *row = x + m * K, scale = row_scale(row, K);
        xscale[m] = scale;
        uint8_t *q = xu + m * Kp;
        shifted_codes(row, K, scale, q);
        for (int64_t k = K; k < Kp; k++) q[k] = 128;
    }
    memset(xu + M * Kp, 128, (rows - M) * Kp);  /* rows padding a tile: zeros (x + 128), their sums unread */
    int8_product(xu, rows, Kp, w, bias128, N, out, tiles, threads);
    for (int64_t m = 0; m < M; m++) {
        float *y = out + m * N;
        const float s = xscale[m];
        if (bias) for (int64_t n = 0; n < N; n++) y[n] = y[n] * wscale[n] * s + bias[n];
        else for (int64_t n = 0; n < N; n++) y[n] = y[n] * wscale[n] * s;
    }
    free(xscale);
    return 0;
}

/* A draft's one-token attention step (specdec.models.int8_forward, the draft forms only: its bits are not sdpa's):
   the new token's q and k rotated (x * cos + rotate_half(x) * sin, as transformers), its key and value written at
   position `past` of the layer's storage [H_kv][capacity][D], then each query head's softmax attention over
   positions 0..past of its key/value head (H / H_kv query heads a key/value head). qkv [(H + 2 H_kv) D] (q, k, v
   heads in that order), cos and sin [D], out [H][D]. Returns 0, or -1 where its scratch could not be had. */
#define LANES 16  /* partial sums kept apart, so the compiler vectorizes a dot product without reordering it */
static inline float dot(const float *a, const float *b, int64_t D) {
    float acc[LANES] = {0};
    int64_t d = 0;
    for (; d + LANES <= D; d += LANES)
        for (int l = 0; l < LANES; l++) acc[l] += a[d + l] * b[d + l];
    float sum = 0.0f;
    for (int l = 0; l < LANES; l++) sum += acc[l];
    for (; d < D; d++) sum += a[d] * b[d];
    return sum;
}
static inline void rotated(const float *x, const float *cos, const float *sin, int64_t D, float *out) {
    const int64_t half = D / 2;
    for (int64_t i = 0; i < half; i++) {
        out[i] = x[i] * cos[i] - x[i + half] * sin[i];
        out[i + half] = x[i + half] * cos[i + half] + x[i] * sin[i + half];
    }
}
/* e^x by the same operations for every element, written so that the compiler vectorizes a loop of it (libm's expf
   is a call per element): Cephes' expf, x = k ln2 + f with |f| <= ln2 / 2, a degree-5 polynomial in f, times 2^k
   made in the exponent's bits; 0 below -87, infinity above 88.7, within 2 ulp of expf between. */
static inline float exp_approx(float x) {
    const float y = x < -87.0f ? -87.0f : (x > 88.0f ? 88.0f : x);
    const float k = rintf(y * 1.44269504088896341f);
    const float f = (y - k * 0.693359375f) - k * -2.12194440e-4f;
    float p = 1.9875691500e-4f;
    p = p * f + 1.3981999507e-3f;
    p = p * f + 8.3334519073e-3f;
    p = p * f + 4.1665795894e-2f;
    p = p * f + 1.6666665459e-1f;
    p = p * f + 5.0000001201e-1f;
    p = p * (f * f) + f + 1.0f;
    const int32_t bits = ((int32_t)k + 127) << 23;
    float two_k;
    memcpy(&two_k, &bits, sizeof two_k);
    return x < -87.0f ? 0.0f : (x > 88.7f ? INFINITY : p * two_k);
}
/* One query head's softmax attention over L positions of its key/value head (K, V: rows D floats apart): rows
   0..L-2, then row `last` (L-1 for a causal slice; a draft tree's leaf: its own, further on): o [D]. score [L] is
   scratch. The same operations in the same order wherever it is called from and wherever the last row lies. Each
   pass but the scores and the weighted sum is a loop the compiler vectorizes: the largest score and the total in
   LANES partial results (the largest is exact in any order), e^x as exp_approx, the weights divided out in a pass
   of their own. */
static void attend_head(const float *q, const float *K, const float *V, int64_t L, int64_t last, int64_t D,
                        float scaling, float *restrict score, float *restrict o) {
    for (int64_t p = 0; p < L; p++) score[p] = dot(q, K + (p == L - 1 ? last : p) * D, D) * scaling;
    float tops[LANES], sums[LANES];
    for (int l = 0; l < LANES; l++) tops[l] = -INFINITY, sums[l] = 0.0f;
    int64_t p = 0;
    for (; p + LANES <= L; p += LANES)
        for (int l = 0; l < LANES; l++) tops[l] = score[p + l] > tops[l] ? score[p + l] : tops[l];
    float top = -INFINITY;
    for (int l = 0; l < LANES; l++) top = tops[l] > top ? tops[l] : top;
    for (; p < L; p++) top = score[p] > top ? score[p] : top;
    for (p = 0; p < L; p++) score[p] = exp_approx(score[p] - top);
    for (p = 0; p + LANES <= L; p += LANES)
        for (int l = 0; l < LANES; l++) sums[l] += score[p + l];
    float total = 0.0f;
    for (int l = 0; l < LANES; l++) total += sums[l];
    for (; p < L; p++) total += score[p];
    for (p = 0; p < L; p++) score[p] = score[p] / total;
    for (int64_t d = 0; d < D; d++) o[d] = 0.0f;
    for (p = 0; p < L; p++) {
        const float w = score[p], *restrict v = V + (p == L - 1 ? last : p) * D;
        for (int64_t d = 0; d < D; d++) o[d] += w * v[d];
    }
}
int attend_one(const float *qkv, const float *cos, const float *sin, float *keys, float *values, int64_t capacity,
               int64_t past, int64_t H, int64_t Hkv, int64_t D, float scaling, float *out, int threads) {
    const int64_t L = past + 1, group = H / Hkv;
    for (int64_t g = 0; g < Hkv; g++) {
        rotated(qkv + (H + g) * D, cos, sin, D, keys + (g * capacity + past) * D);
        memcpy(values + (g * capacity + past) * D, qkv + (H + Hkv + g) * D, D * sizeof(float));
    }
    float *scratch = malloc(sizeof(float) * H * (L + D));
    if (!scratch) return -1;
    #pragma omp parallel for schedule(static) num_threads(threads)
    for (int64_t h = 0; h < H; h++) {
        const int64_t g = h / group;
        float *q = scratch + h * (L + D);
        rotated(qkv + h * D, cos, sin, D, q);
        attend_head(q, keys + g * capacity * D, values + g * capacity * D, L, L - 1, D, scaling, q + D, out + h * D);
    }
    free(scratch);
    return 0;
}

/* The target's attention, each query row alone (specdec.models.quant.rowwise_attention): row i of n attends to
   positions 0..L - n + i of its key/value head (H / H_kv query heads a key/value head), or, where `seen` and `last`
   are given (a draft tree, one sequence), to positions 0..seen[i] - 2 and then last[i]. q [B][H][n][D] and
   keys/values [B][H_kv][..][D] by their batch, head and row strides (a row's D floats contiguous); out [B][n][H][D].
   Each (batch, row, head) is attend_head's alone, whatever n and whatever else runs beside it, so a row's bits are
   those of a one-row call over the same positions: a verification row, a leaf's too, is bitwise its one-token
   step. Returns 0, or -1 where its scratch could not be had. */
int attend_rows(const float *q, int64_t B, int64_t H, int64_t n, int64_t D, int64_t qb, int64_t qh, int64_t qi,
                const float *keys, const float *values, int64_t kb, int64_t kh, int64_t vb, int64_t vh, int64_t Hkv,
                int64_t L, const int64_t *seen, const int64_t *last, float scaling, float *out, int threads) {
    const int64_t group = H / Hkv, tasks = B * n * H;
    float *scratch = malloc(sizeof(float) * tasks * L);
    if (!scratch) return -1;
    #pragma omp parallel for schedule(static) num_threads(threads)
    for (int64_t t = 0; t < tasks; t++) {
        const int64_t b = t / (n * H), i = t / H % n, h = t % H, g = h / group;
        const int64_t length = seen ? seen[i] : L - n + i + 1, final = last ? last[i] : length - 1;
        attend_head(q + b * qb + h * qh + i * qi, keys + b * kb + g * kh, values + b * vb + g * vh, length, final,
                    D, scaling, scratch + t * L, out + t * D);
    }
    free(scratch);
    return 0;
}

/* A draft's RMSNorm of rows x [M][K]: w * (x / sqrt(mean(x^2) + eps)) (transformers' formula; the sum in LANES
   partial sums, so not torch's bits: a draft's form only). */
void rms_norm_rows(const float *x, int64_t M, int64_t K, const float *w, float eps, float *out) {
    for (int64_t m = 0; m < M; m++) {
        const float *row = x + m * K;
        float *y = out + m * K;
        const float inverse = 1.0f / sqrtf(dot(row, row, K) / (float)K + eps);
        for (int64_t k = 0; k < K; k++) y[k] = w[k] * (row[k] * inverse);
    }
}

/* A draft's SiLU-gated product of gate_up rows [M][2I] (gate columns, then up): silu(gate) * up, out [M][I], e^x as
   exp_approx (a loop the compiler vectorizes). */
void silu_mul_rows(const float *gate_up, int64_t M, int64_t I, float *out) {
    for (int64_t m = 0; m < M; m++)
        for (int64_t i = 0; i < I; i++) {
            const float g = gate_up[m * 2 * I + i];
            out[m * I + i] = g / (1.0f + exp_approx(-g)) * gate_up[m * 2 * I + I + i];
        }
}

/* A 4-bit weight as draft_layer reads it: int4_linear's blocks and scales, its bias (or NULL), out x in. */
struct weight4 { const uint8_t *blocks; const uint16_t *scales; const float *bias; int64_t out, in; };

/* A draft's step of M tokens through one decoder layer whose four products are 4-bit, in one call: hidden [M][d]
   updated in place with what specdec.models.int8_forward's fused step computes for one token, the same calls in the
   same order (rms_norm_rows, int4_linear, attend_one, silu_mul_rows, float adds), so the same bits, without a dozen
   calls from Python around them; row i's key and value are written at position past + i and it attends to 0..past
   + i (attend_one a row at a time), cos and sin [M][D]; the products take the rows `mb` at a time. Returns 0, or
   -1 where a scratch could not be had. */
int draft_layer(float *hidden, int64_t M, int64_t d, const float *norm, float eps, const float *post_norm,
                float post_eps, const struct weight4 *qkv, const struct weight4 *o, const struct weight4 *gate_up,
                const struct weight4 *down, const float *cos, const float *sin, float *keys, float *values,
                int64_t capacity, int64_t past, int64_t H, int64_t Hkv, int64_t D, float scaling, int mb,
                int threads) {
    const int64_t I = gate_up->out / 2, Q = qkv->out;
    float *normed = malloc(sizeof(float) * M * (d + Q + H * D + d + gate_up->out + I));
    if (!normed) return -1;
    float *q = normed + M * d, *attended = q + M * Q, *added = attended + M * H * D, *gu = added + M * d,
          *act = gu + M * 2 * I;
    int failed = 0;
    rms_norm_rows(hidden, M, d, norm, eps, normed);
    failed |= int4_linear(normed, M, d, qkv->blocks, qkv->scales, Q, qkv->bias, q, mb, threads);
    for (int64_t i = 0; i < M; i++)
        failed |= attend_one(q + i * Q, cos + i * D, sin + i * D, keys, values, capacity, past + i, H, Hkv, D,
                             scaling, attended + i * H * D, threads);
    failed |= int4_linear(attended, M, H * D, o->blocks, o->scales, o->out, o->bias, added, mb, threads);
    for (int64_t i = 0; i < M * d; i++) hidden[i] = hidden[i] + added[i];
    rms_norm_rows(hidden, M, d, post_norm, post_eps, normed);
    failed |= int4_linear(normed, M, d, gate_up->blocks, gate_up->scales, gate_up->out, gate_up->bias, gu, mb,
                          threads);
    silu_mul_rows(gu, M, I, act);
    failed |= int4_linear(act, M, I, down->blocks, down->scales, down->out, down->bias, added, mb, threads);
    for (int64_t i = 0; i < M * d; i++) hidden[i] = hidden[i] + added[i];
    free(normed);
    return failed ? -1 : 0;
}
