// hvd::row_linear(x, w, b): y = x w^T + b for float32 CPU tensors, one output row at a time.
//
// Built for verification forwards: a few rows (the last token plus a draft) against
// weights far larger than any cache. The weight is streamed from memory once per call
// whatever the number of rows, so verifying a short draft costs little more than one
// token. Every output element is summed in the same order whatever the number of rows
// (8 lanes along k, then the lanes, then the tail, then the bias), so a row's result is
// bitwise the same alone or among others, whichever tile shape computed it.
//
// Compiled at first use by hvd_agents/native_linear.py (AVX2 + FMA on x86-64).
#include <ATen/ATen.h>
#include <ATen/Parallel.h>
#include <torch/library.h>
#include <immintrin.h>

#include "lanes.h"

namespace {

using hvd_lanes::hsum;

// NR weight rows against MR input rows: 12 accumulators at most, so all stay in registers.
template <int NR, int MR>
inline void tile(const float* x, const float* w, const float* b, float* y, int64_t N, int64_t K) {
  const int64_t K8 = K - K % 8;
  __m256 acc[MR][NR];
  for (int i = 0; i < MR; ++i)
    for (int j = 0; j < NR; ++j) acc[i][j] = _mm256_setzero_ps();
  for (int64_t k = 0; k < K8; k += 8) {
    __m256 wv[NR];
    for (int j = 0; j < NR; ++j) wv[j] = _mm256_loadu_ps(w + j * K + k);
    for (int i = 0; i < MR; ++i) {
      const __m256 xv = _mm256_loadu_ps(x + i * K + k);
      for (int j = 0; j < NR; ++j) acc[i][j] = _mm256_fmadd_ps(xv, wv[j], acc[i][j]);
    }
  }
  float sum[MR][NR];
  for (int i = 0; i < MR; ++i)
    for (int j = 0; j < NR; ++j) sum[i][j] = hsum(acc[i][j]);
  if (K8 < K) {
    for (int i = 0; i < MR; ++i)
      for (int j = 0; j < NR; ++j) {
        float tail = 0.0f;
        for (int64_t k = K8; k < K; ++k) tail += x[i * K + k] * w[j * K + k];
        sum[i][j] += tail;
      }
  }
  for (int i = 0; i < MR; ++i)
    for (int j = 0; j < NR; ++j) y[i * N + j] = b ? sum[i][j] + b[j] : sum[i][j];
}

template <int NR>
inline void column(const float* x, const float* w, const float* b, float* y, int64_t M, int64_t N, int64_t K) {
  int64_t m = 0;
  for (; m + 4 <= M; m += 4) tile<NR, 4>(x + m * K, w, b, y + m * N, N, K);
  switch (M - m) {
    case 3: tile<NR, 3>(x + m * K, w, b, y + m * N, N, K); break;
    case 2: tile<NR, 2>(x + m * K, w, b, y + m * N, N, K); break;
    case 1: tile<NR, 1>(x + m * K, w, b, y + m * N, N, K); break;
    default: break;
  }
}

// Up to 8 input rows: one weight row against all of them in a single pass (M + 2 registers).
// Streaming one weight row per tile keeps one sequential read per thread, and no input row
// makes a second pass over the weights. Over SmolLM2-135M's linear layers on a 2-core AVX2
// EPYC, 2 to 8 rows cost 10-30% less than with the 4 x 3 tiles below, which are as fast from
// 9 rows and faster from 12 (the input rows outgrow L1, and each weight load serves 4 of them).
constexpr int64_t kOnePassRows = 8;

inline void one_pass(const float* x, const float* w, const float* b, float* y, int64_t M, int64_t N, int64_t K) {
  switch (M) {
    case 1: tile<1, 1>(x, w, b, y, N, K); break;
    case 2: tile<1, 2>(x, w, b, y, N, K); break;
    case 3: tile<1, 3>(x, w, b, y, N, K); break;
    case 4: tile<1, 4>(x, w, b, y, N, K); break;
    case 5: tile<1, 5>(x, w, b, y, N, K); break;
    case 6: tile<1, 6>(x, w, b, y, N, K); break;
    case 7: tile<1, 7>(x, w, b, y, N, K); break;
    case 8: tile<1, 8>(x, w, b, y, N, K); break;
    default: break;
  }
}

at::Tensor row_linear(const at::Tensor& x, const at::Tensor& w, const c10::optional<at::Tensor>& bias) {
  TORCH_CHECK(x.device().is_cpu() && w.device().is_cpu(), "row_linear takes CPU tensors");
  TORCH_CHECK(x.scalar_type() == at::kFloat && w.scalar_type() == at::kFloat, "row_linear takes float32 tensors");
  TORCH_CHECK(w.dim() == 2 && w.is_contiguous(), "row_linear takes a contiguous 2-D weight");
  const int64_t N = w.size(0), K = w.size(1);
  TORCH_CHECK(x.dim() >= 1 && x.size(-1) == K, "row_linear: input's last dimension ", x.size(-1), " is not the weight's ", K);
  const float* bp = nullptr;
  at::Tensor b;
  if (bias.has_value() && bias->defined()) {
    b = bias->contiguous();
    TORCH_CHECK(b.scalar_type() == at::kFloat && b.numel() == N, "row_linear: bias must be float32 with ", N, " values");
    bp = b.data_ptr<float>();
  }
  const at::Tensor xs = x.contiguous();
  const int64_t M = K ? xs.numel() / K : 0;
  std::vector<int64_t> sizes = x.sizes().vec();
  sizes.back() = N;
  at::Tensor y = at::empty(sizes, x.options());
  if (M == 0 || N == 0) return y;
  const float* xp = xs.data_ptr<float>();
  const float* wp = w.data_ptr<float>();
  float* yp = y.data_ptr<float>();
  if (M <= kOnePassRows) {  // a draft: every input row against one weight row at a time, in one pass
    at::parallel_for(0, N, 24, [&](int64_t begin, int64_t end) {
      for (int64_t n = begin; n < end; ++n) one_pass(xp, wp + n * K, bp ? bp + n : nullptr, yp + n, M, N, K);
    });
    return y;
  }
  constexpr int NR = 3;
  const int64_t blocks = N / NR;
  at::parallel_for(0, blocks, 8, [&](int64_t begin, int64_t end) {
    for (int64_t blk = begin; blk < end; ++blk) {
      const int64_t n = blk * NR;
      column<NR>(xp, wp + n * K, bp ? bp + n : nullptr, yp + n, M, N, K);
    }
  });
  for (int64_t n = blocks * NR; n < N; ++n) column<1>(xp, wp + n * K, bp ? bp + n : nullptr, yp + n, M, N, K);
  return y;
}

}  // namespace

TORCH_LIBRARY(hvd, m) { m.def("row_linear(Tensor x, Tensor w, Tensor? bias) -> Tensor"); }
TORCH_LIBRARY_IMPL(hvd, CPU, m) { m.impl("row_linear", &row_linear); }
