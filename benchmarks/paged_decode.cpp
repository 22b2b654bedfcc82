// A fused paged-decode attention kernel for the CPU, for benchmarks/bench_decode_attention.py only.
//
// What tformer.inference.paged_cache.paged_decode_attention computes (one new query per sequence over
// its cached keys and values, read where they lie in the block pool), in one call: for each sequence and
// key/value head, its query heads' scores block by block, the softmax, then the probability-weighted
// value rows, with the next blocks prefetched while the current one is read. The package's version
// needs ten operations per layer (two embedding_bag calls among them); this one needs one. It exists
// to measure how much of a decoding step that difference is worth; the engine does not use it.
//
// Layouts (one layer of a BlockPool): q (B, H, D) float32; k (N, Hkv, D, BS); v (N, Hkv, BS, D), both
// float32 or bfloat16; table (B, NB) int64 block ids; lengths (B,) int64 tokens cached (>= 1).
#include <torch/extension.h>
#include <ATen/Parallel.h>
#include <ATen/cpu/vec/vec.h>

#include <algorithm>
#include <cmath>
#include <limits>
#include <type_traits>
#include <vector>

using Vec = at::vec::Vectorized<float>;
constexpr int64_t W = 2 * Vec::size();   // elements per chunk: two float vectors (one bf16 vector)
constexpr int64_t AHEAD = 2;             // prefetch the key block this many blocks ahead (1-8: no difference)

inline void load2(const float* p, Vec& a, Vec& b) { a = Vec::loadu(p); b = Vec::loadu(p + Vec::size()); }
#if defined(CPU_CAPABILITY_AVX512)
// bf16 -> float is a 16-bit shift: the even elements of 32 are one shift, the odd ones one mask. Their
// order (evens, then odds) is undone once per block (scores) or per head (output) by store2.
constexpr bool kSplit = true;
inline void load2(const c10::BFloat16* p, Vec& even, Vec& odd) {
  const __m512i x = _mm512_loadu_si512(p);
  even = _mm512_castsi512_ps(_mm512_slli_epi32(x, 16));
  odd = _mm512_castsi512_ps(_mm512_and_si512(x, _mm512_set1_epi32(static_cast<int>(0xFFFF0000u))));
}
#else
constexpr bool kSplit = false;
inline void load2(const c10::BFloat16* p, Vec& a, Vec& b) {
  std::tie(a, b) = at::vec::convert_bfloat16_float(at::vec::Vectorized<c10::BFloat16>::loadu(p, W));
}
#endif

template <typename T>
inline void store2(Vec a, Vec b, float* out) {             // a chunk in natural order
  if (std::is_same_v<T, c10::BFloat16> && kSplit) std::tie(a, b) = at::vec::interleave2<float>(a, b);
  a.store(out);
  b.store(out + Vec::size());
}

template <typename T>
inline void prefetch_block(const T* p, int64_t n) {      // a block's n elements, one cache line at a time
  const char* c = reinterpret_cast<const char*>(p);
  for (int64_t o = 0; o < n * (int64_t)sizeof(T); o += 64) __builtin_prefetch(c + o);
}

template <typename T, int64_t BS, int64_t D>
void attend(const float* q, const T* k, const T* v, const int64_t* table, const int64_t* lengths, float* out,
            int64_t B, int64_t H, int64_t Hkv, int64_t NB) {
  // Sizes known at compile time keep the partial sums in registers.
  constexpr int64_t blk = D * BS, KV = BS / Vec::size(), VV = D / Vec::size();
  constexpr int64_t lines = blk * (int64_t)sizeof(T) / 64, per_row = (lines + D - 1) / D;
  const int64_t G = H / Hkv;
  const float scale = 1.0f / std::sqrt((float)D);
  at::parallel_for(0, B * Hkv, 1, [&](int64_t begin, int64_t end) {
    std::vector<float> s(G * NB * BS);
    for (int64_t i = begin; i < end; ++i) {
      const int64_t b = i / Hkv, kh = i % Hkv, n = lengths[b], nblk = (n + BS - 1) / BS;
      const int64_t* ids = table + b * NB;
      auto kblock = [&](int64_t j) { return k + (ids[j] * Hkv + kh) * blk; };   // (D, BS)
      auto vblock = [&](int64_t j) { return v + (ids[j] * Hkv + kh) * blk; };   // (BS, D)
      for (int64_t j = 0; j < std::min(AHEAD, nblk); ++j) prefetch_block(kblock(j), blk);
      for (int64_t j = 0; j < nblk; ++j) {                // scores: each key block read once for G heads
        // prefetch, spread over the feature rows (a few lines per row, keeping fill buffers free): the key
        // block AHEAD blocks on, and this value block, in cache by the time the output pass reads it
        const char* kn = reinterpret_cast<const char*>(kblock(std::min(j + AHEAD, nblk - 1)));
        const char* vn = reinterpret_cast<const char*>(vblock(j));
        const T* kb = kblock(j);
        for (int64_t g = 0; g < G; ++g) {
          const float* qv = q + (b * H + kh * G + g) * D;
          Vec acc[4][KV];                                 // 4 partial sums over d: independent FMA chains
          for (int64_t r = 0; r < 4; ++r)
            for (int64_t c = 0; c < KV; ++c) acc[r][c] = Vec(0.f);
          for (int64_t d = 0; d < D; d += 4) {
            if (g == 0)
              for (int64_t l = d * per_row; l < std::min(lines, (d + 4) * per_row); ++l) {
                __builtin_prefetch(kn + 64 * l);
                __builtin_prefetch(vn + 64 * l);
              }
#pragma GCC unroll 4
            for (int64_t r = 0; r < 4; ++r) {
              const Vec qd(qv[d + r] * scale);
#pragma GCC unroll 8
              for (int64_t c = 0; c < BS / W; ++c) {
                Vec x, y;
                load2(kb + (d + r) * BS + c * W, x, y);
                acc[r][2 * c] = at::vec::fmadd(x, qd, acc[r][2 * c]);
                acc[r][2 * c + 1] = at::vec::fmadd(y, qd, acc[r][2 * c + 1]);
              }
            }
          }
          float* sb = s.data() + g * NB * BS + j * BS;
          for (int64_t c = 0; c < BS / W; ++c)
            store2<T>((acc[0][2 * c] + acc[1][2 * c]) + (acc[2][2 * c] + acc[3][2 * c]),
                      (acc[0][2 * c + 1] + acc[1][2 * c + 1]) + (acc[2][2 * c + 1] + acc[3][2 * c + 1]), sb + c * W);
        }
      }
      for (int64_t g = 0; g < G; ++g) {
        float* sg = s.data() + g * NB * BS;               // softmax over the n cached positions
        const float m = *std::max_element(sg, sg + n);
        Vec vsum(0.f);
        int64_t t = 0;
        for (; t + Vec::size() <= n; t += Vec::size()) {
          const Vec e = (Vec::loadu(sg + t) - Vec(m)).exp_u20();
          e.store(sg + t);
          vsum = vsum + e;
        }
        float lanes[Vec::size()];
        vsum.store(lanes);
        float sum = 0.f;
        for (int64_t z = 0; z < Vec::size(); ++z) sum += lanes[z];
        for (; t < n; ++t) sum += (sg[t] = std::exp(sg[t] - m));
        Vec acc[2][VV];                                   // 2 partial sums over positions
        for (int64_t r = 0; r < 2; ++r)
          for (int64_t c = 0; c < VV; ++c) acc[r][c] = Vec(0.f);
        auto add_row = [&](Vec* a, const T* row, float pt) {
          const Vec p(pt);
#pragma GCC unroll 8
          for (int64_t c = 0; c < D / W; ++c) {
            Vec x, y;
            load2(row + c * W, x, y);
            a[2 * c] = at::vec::fmadd(x, p, a[2 * c]);
            a[2 * c + 1] = at::vec::fmadd(y, p, a[2 * c + 1]);
          }
        };
        for (int64_t j = 0; j < nblk; ++j) {              // output: the probability-weighted value rows
          const T* vb = vblock(j);
          const float* pj = sg + j * BS;
          const int64_t tn = std::min(BS, n - j * BS);
          int64_t u = 0;
          for (; u + 1 < tn; u += 2) {
            add_row(acc[0], vb + u * D, pj[u]);
            add_row(acc[1], vb + (u + 1) * D, pj[u + 1]);
          }
          if (u < tn) add_row(acc[0], vb + u * D, pj[u]);
        }
        float* o = out + (b * H + kh * G + g) * D;
        const Vec inv(1.f / sum);
        for (int64_t c = 0; c < D / W; ++c)
          store2<T>((acc[0][2 * c] + acc[1][2 * c]) * inv, (acc[0][2 * c + 1] + acc[1][2 * c + 1]) * inv, o + c * W);
      }
    }
  });
}

template <typename T>
bool dispatch(const float* q, const T* k, const T* v, const int64_t* table, const int64_t* lengths, float* out,
              int64_t B, int64_t H, int64_t Hkv, int64_t D, int64_t BS, int64_t NB) {
#define TFORMER_CASE(bs, d) \
  if (BS == bs && D == d && bs % W == 0 && d % W == 0) { attend<T, bs, d>(q, k, v, table, lengths, out, B, H, Hkv, NB); return true; }
  TFORMER_CASE(16, 32) TFORMER_CASE(16, 64) TFORMER_CASE(16, 128)
  TFORMER_CASE(32, 32) TFORMER_CASE(32, 64) TFORMER_CASE(32, 128)
  TFORMER_CASE(64, 32) TFORMER_CASE(64, 64) TFORMER_CASE(64, 128)
#undef TFORMER_CASE
  return false;
}

at::Tensor paged_decode(at::Tensor q, at::Tensor k, at::Tensor v, at::Tensor table, at::Tensor lengths) {
  TORCH_CHECK(q.dim() == 3 && k.dim() == 4 && v.dim() == 4, "paged_decode: expected q (B, H, D), k (N, Hkv, D, BS), "
              "v (N, Hkv, BS, D)");
  const int64_t B = q.size(0), H = q.size(1), D = q.size(2), Hkv = k.size(1), BS = k.size(3), NB = table.size(1);
  TORCH_CHECK(k.size(2) == D && v.size(3) == D && v.size(2) == BS && H % Hkv == 0, "paged_decode: shapes disagree");
  TORCH_CHECK(k.scalar_type() == v.scalar_type() && k.is_contiguous() && v.is_contiguous(),
              "paged_decode: expected contiguous k and v of one dtype");
  auto qf = q.to(at::kFloat).contiguous();
  auto tb = table.to(at::kLong).contiguous(), ln = lengths.to(at::kLong).contiguous();
  auto out = at::empty(qf.sizes(), qf.options());
  bool done;
  if (k.scalar_type() == at::kBFloat16) {
    done = dispatch(qf.data_ptr<float>(), k.data_ptr<c10::BFloat16>(), v.data_ptr<c10::BFloat16>(),
                    tb.data_ptr<int64_t>(), ln.data_ptr<int64_t>(), out.data_ptr<float>(), B, H, Hkv, D, BS, NB);
  } else {
    TORCH_CHECK(k.scalar_type() == at::kFloat, "paged_decode: expected float32 or bfloat16 k and v");
    done = dispatch(qf.data_ptr<float>(), k.data_ptr<float>(), v.data_ptr<float>(), tb.data_ptr<int64_t>(),
                    ln.data_ptr<int64_t>(), out.data_ptr<float>(), B, H, Hkv, D, BS, NB);
  }
  TORCH_CHECK(done, "paged_decode: built for block sizes 16/32/64 and head dims 32/64/128 (multiples of ", W,
              "), got block size ", BS, " and head dim ", D);
  return out.to(q.scalar_type());
}

PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) { m.def("paged_decode", &paged_decode); }
