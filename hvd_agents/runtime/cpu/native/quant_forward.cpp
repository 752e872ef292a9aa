// hvd_quant: a decoder forward over quantized weights, for any number of new tokens.
//
// The decoders of llama (Llama 2/3, Mistral), qwen2 (query/key/value biases), qwen3 (query/key norms per head),
// gemma3 (sliding-window layers with their own rope, norms after attention and MLP, gelu-tanh, a scaled
// embedding) and phi3 (its fused projections split at load): each layer is a pre-norm attention and gated MLP,
// with the options each family adds (see Layer). A sliding-window layer's row attends to the last W positions
// of what it sees (by position), so rollback and compaction of the cache keep every window exact.
//
// One forward computes every position: a decode step, a draft or a tree to verify, a prefill or a chunk of
// one, and several requests' rows batched. The whole forward runs in one call and one parallel region
// (team.h), so a step pays no per-layer Python work. Linear layers read their weights in GGUF's own blocks
// (Q4_1, Q8_0; Q4_0 and Q4_K are converted to these exactly at load), held in tiles (tile_linear.h), or in
// float32; quantized layers take their inputs quantized per block of 32 (int8 with a float scale, as
// llama.cpp's Q8 activations), so a block's dot product runs on integers.
//
// Invariance, the property that keeps speculative decoding exactly the plain decode and makes a position's
// KV the same however it was reached: every output element (a linear layer's, an attention row's, a norm's)
// is computed by one thread, in one fixed order that depends only on its own inputs, never on how many rows
// share the call, which tile holds it, which thread runs it or which instruction set this build uses
// (isa.h). So a token's logits and KV are bitwise the same decoded alone, verified in a draft or a tree,
// prefilled whole or in chunks of any size, batched with other requests, on AVX2, AVX-512 or AMX.
//
// Compiled at first use by hvd_agents/runtime/cpu/native_forward.py, once per instruction-set path.
#include <torch/extension.h>
#include <ATen/Parallel.h>
#include <immintrin.h>

#include <cmath>
#include <cstdint>
#include <algorithm>
#include <cstring>
#include <limits>
#include <stdexcept>
#include <string>
#include <vector>

#include "amx.h"
#include "attention.h"
#include "cpu_paths.h"
#include "isa.h"
#include "lanes.h"
#include "logit_rows.h"
#include "row_ops.h"
#include "team.h"
#include "tile_linear.h"

namespace {

using namespace hvd_tiles;
using namespace hvd_attention;
using namespace hvd_rows;

constexpr int64_t kMaxRows = 1024;  // rows per call (a longer prefill is several calls)
constexpr int64_t kBlockRows = 16;  // rows of a sequence per attention job, at most

// An attention job: rows [r0, r1) of one sequence, query heads [h0, h1) of kv head g (one attend() call).
struct AttentionJob {
  int64_t r0, r1, h0, h1, g;
};

// The jobs of a forward: per sequence and kv head, blocks of rows with all the group's query heads, or, where a
// sequence has too few rows to give the team two jobs per thread, single rows with some of the heads each. A
// job's queries share each key's and value's conversion; how queries are grouped changes no result (attend()).
std::vector<AttentionJob> attention_jobs(const std::vector<int64_t>& starts, int64_t nkv, int64_t group, int nt) {
  const int64_t B = static_cast<int64_t>(starts.size()) - 1;
  const int64_t parts = std::max<int64_t>(1, (2 * nt + B * nkv - 1) / (B * nkv));  // jobs per (sequence, kv head)
  std::vector<AttentionJob> jobs;
  for (int64_t b = 0; b < B; ++b) {
    const int64_t s0 = starts[b], s1 = starts[b + 1], R = s1 - s0;
    int64_t rows = 1, heads = group;
    if (R >= parts) {
      rows = std::min(kBlockRows, (R + parts - 1) / parts);
    } else {
      const int64_t split = std::min(group, (parts + R - 1) / R);
      heads = (group + split - 1) / split;
    }
    heads = std::min(heads, kMaxQueries / rows);
    for (int64_t r0 = s0; r0 < s1; r0 += rows)
      for (int64_t g = 0; g < nkv; ++g)
        for (int64_t h0 = g * group; h0 < (g + 1) * group; h0 += heads)
          jobs.push_back({r0, std::min(s1, r0 + rows), h0, std::min((g + 1) * group, h0 + heads), g});
  }
  return jobs;
}

// ---------------------------------------------------------------- weights

Matrix make_matrix(int64_t fmt, int64_t N, int64_t K, at::Tensor data, c10::optional<at::Tensor> bias) {
  TORCH_CHECK(fmt >= F32 && fmt <= LAST_FORMAT, "unknown weight format ", fmt);
  Matrix m;
  m.fmt = static_cast<int>(fmt);
  m.N = N;
  m.K = K;
  TORCH_CHECK(N > 0 && K > 0, "a weight needs rows and columns");
  const int64_t record = QK * record_of(m.fmt).blocks;
  if (!is_float(m.fmt)) TORCH_CHECK(K % record == 0, "this format needs columns in blocks of ", record, ", not ", K);
  const at::Tensor src = data.contiguous();
  if (m.fmt == F32) {
    TORCH_CHECK(src.scalar_type() == at::kFloat && src.numel() == N * K, "float32 weight must hold N * K values");
    m.data = src;
  } else if (is_float(m.fmt)) {  // F16, BF16: the values' 2 bytes each, rows of K
    TORCH_CHECK(src.scalar_type() == at::kByte && src.numel() == 2 * N * K, "a 16-bit float weight must hold ",
                2 * N * K, " bytes, not ", src.numel());
    m.data = src;
  } else {
    TORCH_CHECK(src.scalar_type() == at::kByte && src.numel() == m.source_bytes(),
                "quantized weight must hold ", m.source_bytes(), " bytes, not ", src.numel());
    m.data = pack_tiles(m.fmt, N, K, src);
  }
  if (bias.has_value() && bias->defined()) {
    TORCH_CHECK(bias->scalar_type() == at::kFloat && bias->numel() == N, "bias must be float32 with N values");
    m.bias = bias->contiguous();
  }
  return m;
}

// ---------------------------------------------------------------- the model

// A layer's norms are float32 multipliers (a family's offset, gemma's 1 + w, is in them); an undefined or
// empty tensor is a norm the layer does not have.
struct Layer {
  at::Tensor attn_norm, ffn_norm;            // before attention, before the MLP
  at::Tensor q_norm, k_norm;                 // per head, on queries and keys before rope (qwen3, gemma3)
  at::Tensor post_attn_norm, post_ffn_norm;  // on the attention's and the MLP's outputs (gemma3)
  Matrix q, k, v, o, gate, up, down;
  int64_t window;  // a row sees the positions p - window < t <= p of what it sees (0: all of them)
  int64_t rope;    // the rope table the layer uses
};

// A call's team: `threads` when given, else ATen's count on the calling thread.
inline int team_size(int64_t threads) {
  return threads > 0 ? static_cast<int>(threads) : std::max(1, at::get_num_threads());
}

inline bool has(const at::Tensor& t) { return t.defined() && t.numel() > 0; }
inline const float* fp(const at::Tensor& t) { return has(t) ? t.data_ptr<float>() : nullptr; }

class QuantModel {
 public:
  // act: SILU or GELU_TANH; the embedding's rows are multiplied by embed_scale (when not 1); attention scores
  // by attn_scale; cos[i], sin[i]: rope table i, [positions, rotary dims / 2] (the rotary dims may be fewer
  // than head_dim: the rest of a head passes unrotated).
  QuantModel(int64_t hidden, int64_t heads, int64_t kv_heads, int64_t head_dim, int64_t intermediate, double eps,
             int64_t act, double embed_scale, double attn_scale, std::vector<at::Tensor> cos,
             std::vector<at::Tensor> sin, Matrix embed, at::Tensor final_norm, Matrix output)
      : H_(hidden), nh_(heads), nkv_(kv_heads), hd_(head_dim), I_(intermediate), eps_(static_cast<float>(eps)),
        act_(static_cast<int>(act)), embed_scale_(static_cast<float>(embed_scale)),
        attn_scale_(static_cast<float>(attn_scale)), embed_(std::move(embed)), norm_(final_norm.contiguous()),
        out_(std::move(output)) {
    TORCH_CHECK(hd_ % 8 == 0 && hd_ <= kMaxHeadDim, "head_dim must be a multiple of 8 up to ", kMaxHeadDim, ", not ", hd_);
    TORCH_CHECK(nh_ % nkv_ == 0, "attention heads must be a multiple of kv heads");
    TORCH_CHECK(act_ == SILU || act_ == GELU_TANH, "unknown activation ", act);
    TORCH_CHECK(!cos.empty() && cos.size() == sin.size(), "one sin table per cos table");
    for (size_t i = 0; i < cos.size(); ++i) {
      cos_.push_back(cos[i].contiguous());
      sin_.push_back(sin[i].contiguous());
      TORCH_CHECK(cos_[i].dim() == 2 && cos_[i].size(1) >= 1 && 2 * cos_[i].size(1) <= hd_ &&
                  sin_[i].sizes() == cos_[i].sizes() && cos_[i].size(0) == cos_[0].size(0),
                  "rope tables must be [positions, rotary dims / 2] with rotary dims up to head_dim");
    }
    TORCH_CHECK(embed_.K == H_ && out_.K == H_, "embedding and output weights must have hidden-size columns");
  }

  void add_layer(at::Tensor attn_norm, at::Tensor ffn_norm, at::Tensor q_norm, at::Tensor k_norm,
                 at::Tensor post_attn_norm, at::Tensor post_ffn_norm, Matrix q, Matrix k, Matrix v, Matrix o,
                 Matrix gate, Matrix up, Matrix down, int64_t window, int64_t rope) {
    TORCH_CHECK(q.K == H_ && k.K == H_ && v.K == H_ && gate.K == H_ && up.K == H_, "layer weights must read hidden-size inputs");
    TORCH_CHECK(q.N == nh_ * hd_ && k.N == nkv_ * hd_ && v.N == nkv_ * hd_ && o.K == nh_ * hd_ && o.N == H_, "attention shapes disagree with the heads");
    TORCH_CHECK(gate.N == I_ && up.N == I_ && down.K == I_ && down.N == H_, "MLP shapes disagree with the intermediate size");
    TORCH_CHECK(attn_norm.numel() == H_ && ffn_norm.numel() == H_, "norms must have hidden-size weights");
    TORCH_CHECK((!has(q_norm) || q_norm.numel() == hd_) && (!has(k_norm) || k_norm.numel() == hd_), "query and key norms must have head_dim weights");
    TORCH_CHECK((!has(post_attn_norm) || post_attn_norm.numel() == H_) && (!has(post_ffn_norm) || post_ffn_norm.numel() == H_), "output norms must have hidden-size weights");
    TORCH_CHECK(window >= 0, "a window must be positive (0: none)");
    TORCH_CHECK(rope >= 0 && rope < static_cast<int64_t>(cos_.size()), "rope table ", rope, " does not exist");
    auto own = [](const at::Tensor& t) { return has(t) ? t.to(at::kFloat).contiguous() : at::Tensor(); };
    layers_.push_back(Layer{own(attn_norm), own(ffn_norm), own(q_norm), own(k_norm), own(post_attn_norm),
                            own(post_ffn_norm), std::move(q), std::move(k), std::move(v), std::move(o),
                            std::move(gate), std::move(up), std::move(down), window, rope});
  }

  int64_t num_layers() const { return static_cast<int64_t>(layers_.size()); }
  int64_t vocab() const { return out_.N; }

  // The layers whose input (the residual stream the previous layers made, before the layer's norm) a forward
  // asked for hidden states returns beside the normed last-layer state: hidden rows become
  // [normed | input of taps[0] | input of taps[1] | ...], (1 + taps) x hidden wide. Empty: the normed state alone.
  void set_taps(std::vector<int64_t> taps) {
    for (int64_t l : taps) TORCH_CHECK(l >= 0 && l < num_layers(), "layer ", l, " is not in 0..", num_layers() - 1);
    taps_ = std::move(taps);
  }
  std::vector<int64_t> taps() const { return taps_; }

  // tokens, positions: int64 [M]; visible: bool [M, M] (row i sees new row j) or an empty tensor for a chain;
  // kc, vc: float16 [layers, kv_heads, cap, head_dim], positions [0, past) filled; rows are written at past + i.
  // Returns (logits of the last `keep` rows [keep, vocab], normed hidden states [M, hidden] (with the tapped
  // layers' inputs beside them: set_taps) or empty).
  // threads: the team's size (0: ATen's thread count on the calling thread).
  std::vector<at::Tensor> forward(const at::Tensor& tokens, const at::Tensor& positions, const at::Tensor& visible,
                                  at::Tensor kc, at::Tensor vc, int64_t past, int64_t keep, bool want_hidden,
                                  int64_t threads) {
    const int64_t M = tokens.numel();
    return forward_batch(tokens, positions, visible, {0, M}, {kc}, {vc}, {past}, keep, want_hidden, threads);
  }

  // Several sequences in one forward: sequence b owns rows [starts[b], starts[b + 1]) and its own cache
  // (kcs[b], vcs[b], with pasts[b] positions filled); its rows see its cached positions and, among the new
  // rows, only its own (visible, when given, is [M, M] and read within each sequence's block). Every row's
  // arithmetic is the one it has alone, so a sequence's logits do not depend on the others in the call.
  // keep counts the last rows of the whole call whose logits are returned.
  std::vector<at::Tensor> forward_batch(const at::Tensor& tokens, const at::Tensor& positions,
                                        const at::Tensor& visible, std::vector<int64_t> starts,
                                        std::vector<at::Tensor> kcs, std::vector<at::Tensor> vcs,
                                        std::vector<int64_t> pasts, int64_t keep, bool want_hidden, int64_t threads) {
    const int64_t M = tokens.numel();
    TORCH_CHECK(threads >= 0, "threads must be 0 (ATen's count) or more, not ", threads);
    TORCH_CHECK(M >= 1 && M <= kMaxRows, "this path takes 1 to ", kMaxRows, " tokens, not ", M);
    TORCH_CHECK(keep >= 1 && keep <= M, "keep must be in 1..", M);
    const int64_t B = static_cast<int64_t>(kcs.size());
    TORCH_CHECK(B >= 1 && static_cast<int64_t>(vcs.size()) == B && static_cast<int64_t>(pasts.size()) == B &&
                static_cast<int64_t>(starts.size()) == B + 1, "one cache, one length and one row range per sequence");
    TORCH_CHECK(starts[0] == 0 && starts[B] == M, "sequence rows must cover the call's rows");
    std::vector<int64_t> seq_of(M), caps(B);
    std::vector<at::Half*> kbases(B), vbases(B);
    for (int64_t b = 0; b < B; ++b) {
      const at::Tensor& kc = kcs[b];
      const at::Tensor& vc = vcs[b];
      TORCH_CHECK(starts[b + 1] > starts[b], "sequence ", b, " has no rows");
      TORCH_CHECK(kc.scalar_type() == at::kHalf && vc.scalar_type() == at::kHalf && kc.is_contiguous() && vc.is_contiguous(), "KV must be contiguous float16");
      TORCH_CHECK(kc.dim() == 4 && kc.size(0) == num_layers() && kc.size(1) == nkv_ && kc.size(3) == hd_ && vc.sizes() == kc.sizes(), "KV shape disagrees with the model");
      caps[b] = kc.size(2);
      const int64_t rows = starts[b + 1] - starts[b];
      TORCH_CHECK(pasts[b] >= 0 && pasts[b] + rows <= caps[b], "KV has room for ", caps[b], " positions, not ", pasts[b] + rows);
      for (int64_t r = starts[b]; r < starts[b + 1]; ++r) seq_of[r] = b;
      kbases[b] = kc.data_ptr<at::Half>();
      vbases[b] = vc.data_ptr<at::Half>();
    }
    const at::Tensor tok = tokens.to(at::kLong).contiguous(), pos = positions.to(at::kLong).contiguous();
    const int64_t* tp = tok.data_ptr<int64_t>();
    const int64_t* pp = pos.data_ptr<int64_t>();
    for (int64_t i = 0; i < M; ++i) {
      TORCH_CHECK(tp[i] >= 0 && tp[i] < embed_.N, "token id ", tp[i], " is outside the vocabulary");
      TORCH_CHECK(pp[i] >= 0 && pp[i] < cos_[0].size(0), "position ", pp[i], " is outside the rope table");
    }
    // visible slots per row: its sequence's cached positions, then the new rows of its sequence it sees
    std::vector<std::vector<int32_t>> slots(M);
    const bool tree = visible.defined() && visible.numel() > 0;
    at::Tensor vis;
    if (tree) {
      vis = visible.to(at::kBool).contiguous();
      TORCH_CHECK(vis.dim() == 2 && vis.size(0) == M && vis.size(1) == M, "visible must be [M, M]");
    }
    int64_t longest = 0;
    for (int64_t r = 0; r < M; ++r) {
      const int64_t b = seq_of[r], s0 = starts[b], past = pasts[b], i = r - s0;
      slots[r].reserve(past + i + 1);
      for (int64_t t = 0; t < past; ++t) slots[r].push_back(static_cast<int32_t>(t));
      for (int64_t j = 0; j <= i; ++j)
        if (!tree || j == i || vis.data_ptr<bool>()[r * M + s0 + j]) slots[r].push_back(static_cast<int32_t>(past + j));
      longest = std::max(longest, static_cast<int64_t>(slots[r].size()));
    }
    const std::vector<std::vector<int64_t>> firsts = window_starts(slots, seq_of, starts, pasts, pp);
    const int64_t H = H_, qd = nh_ * hd_, kd = nkv_ * hd_, I = I_;
    std::vector<float> x(M * H), xn(M * H), qkv(M * (qd + 2 * kd)), att(M * qd), tmp(M * H), gu(M * 2 * I), act(M * I);
    const int nt = team_size(threads);
    QRows qx, qa, qf, qo;
    qx.resize(M, H);
    qo.resize(keep, H);
    qa.resize(M, qd);
    qf.resize(M, I);
    at::Tensor logits = at::empty({keep, out_.N}, at::kFloat);
    const std::vector<int64_t> taps = taps_;
    const int64_t FW = H * (1 + static_cast<int64_t>(taps.size()));  // a hidden row's width
    std::vector<int64_t> tap_slot(layers_.size(), -1);
    for (size_t j = 0; j < taps.size(); ++j) tap_slot[taps[j]] = static_cast<int64_t>(j);
    at::Tensor hidden = want_hidden ? at::empty({M, FW}, at::kFloat) : at::Tensor();
    const float scale = attn_scale_;
    const int64_t group = nh_ / nkv_;

    const bool attn_blocks = hd_ % QK == 0;  // an attention head's output is whole blocks: its job quantizes them
    const int64_t qkv_ld = qd + 2 * kd;

    const std::vector<AttentionJob> jobs = attention_jobs(starts, nkv_, group, nt);
    int64_t most = 1;  // queries of the largest job
    for (const AttentionJob& job : jobs) most = std::max(most, (job.r1 - job.r0) * (job.h1 - job.h0));
    std::vector<Scratch> scratch(nt);
    for (Scratch& s : scratch) s.reserve(most, hd_, longest);

    // Seven phases a layer, one barrier each; every output element is computed by one thread.
    hvd_team::team().run(nt, [&](hvd_team::Ctx& c) {
      c.for_static(M, [&](int64_t r) { embed_row(tp[r], x.data() + r * H); });
      for (size_t l = 0; l < layers_.size(); ++l) {
        const Layer& L = layers_[l];
        const bool qin = L.q.quantized() || L.k.quantized() || L.v.quantized();
        const std::vector<int64_t>& first = firsts[window_index(L.window)];
        const float* cos = cos_[L.rope].data_ptr<float>();
        const float* sin = sin_[L.rope].data_ptr<float>();
        const int64_t half = cos_[L.rope].size(1);
        // 1. norm (after the previous layer's MLP residual) and the inputs' blocks
        c.for_static(M, [&](int64_t r) {
          if (l > 0) add_residual(x.data() + r * H, tmp.data() + r * H, fp(layers_[l - 1].post_ffn_norm));
          if (want_hidden && tap_slot[l] >= 0)
            std::memcpy(hidden.data_ptr<float>() + r * FW + H * (1 + tap_slot[l]), x.data() + r * H, H * sizeof(float));
          rmsnorm(x.data() + r * H, L.attn_norm.data_ptr<float>(), eps_, H, xn.data() + r * H);
          if (qin) quantize_row(xn.data() + r * H, H, qx, r);
        });
        // 2. query, key and value heads, one head a job: project, rope, and write keys and values to the cache
        c.for_static(nh_ + 2 * nkv_, [&](int64_t job) {
          const Matrix& W = job < nh_ ? L.q : (job < nh_ + nkv_ ? L.k : L.v);
          const int64_t head = job < nh_ ? job : (job < nh_ + nkv_ ? job - nh_ : job - nh_ - nkv_);
          const int64_t col0 = job < nh_ ? 0 : (job < nh_ + nkv_ ? qd : qd + kd);
          rows_block(W, head * hd_, (head + 1) * hd_, qx, xn.data(), M, qkv.data(), qkv_ld, col0);
          for (int64_t r = 0; r < M; ++r) {
            float* v = qkv.data() + r * qkv_ld + col0 + head * hd_;
            const float* head_norm = job < nh_ ? fp(L.q_norm) : (job < nh_ + nkv_ ? fp(L.k_norm) : nullptr);
            if (head_norm) rmsnorm(v, head_norm, eps_, hd_, v);
            if (job < nh_ + nkv_) rope(v, half, cos + pp[r] * half, sin + pp[r] * half);
            if (job >= nh_) {
              const int64_t b = seq_of[r], cap = caps[b];
              const int64_t lbase = static_cast<int64_t>(l) * nkv_ * cap * hd_;
              at::Half* dst = (job < nh_ + nkv_ ? kbases[b] : vbases[b]) + lbase + (head * cap + pasts[b] + r - starts[b]) * hd_;
              for (int64_t i = 0; i < hd_; ++i) dst[i] = static_cast<at::Half>(v[i]);
            }
          }
        });
        // 3. attention, a job per (rows, query heads of one kv head), each quantizing its own output blocks. Row r
        // sees its slots from first[r] (its window) on: a chain's are one run of the cache, a tree's the cached
        // run and then its ancestors.
        c.for_dynamic(static_cast<int64_t>(jobs.size()), [&](int64_t j) {
          const AttentionJob& job = jobs[j];
          const int64_t b = seq_of[job.r0], cap = caps[b], past = pasts[b];
          const int64_t lbase = static_cast<int64_t>(l) * nkv_ * cap * hd_;
          Query queries[kMaxQueries];
          int64_t Q = 0;
          for (int64_t r = job.r0; r < job.r1; ++r) {
            const std::vector<int32_t>& seen = slots[r];
            const int64_t from = first[r], n = static_cast<int64_t>(seen.size());
            int64_t lo = from, hi = n, extra = n;  // a chain's slot i is position i
            if (tree) {
              lo = std::min(from, past);
              hi = past;
              extra = std::max(from, past);
            }
            for (int64_t h = job.h0; h < job.h1; ++h)
              queries[Q++] = Query{qkv.data() + r * qkv_ld + h * hd_, att.data() + r * qd + h * hd_, lo, hi,
                                   seen.data() + extra, n - extra};
          }
          attend(queries, Q, kbases[b] + lbase + job.g * cap * hd_, vbases[b] + lbase + job.g * cap * hd_, hd_, scale,
                 scratch[c.tid]);
          if (L.o.quantized() && attn_blocks)
            for (int64_t r = job.r0; r < job.r1; ++r)
              for (int64_t h = job.h0; h < job.h1; ++h) quantize_row(att.data() + r * qd + h * hd_, hd_, qa, r, h * hd_ / QK);
        });
        if (L.o.quantized() && !attn_blocks)
          c.for_static(M, [&](int64_t r) { quantize_row(att.data() + r * qd, qd, qa, r); });
        // 4. output projection
        multi_linear(c, L.o, qa, att.data(), M, tmp.data(), H);
        // 5. residual, norm, the MLP inputs' blocks
        const bool gin = L.gate.quantized() || L.up.quantized();
        c.for_static(M, [&](int64_t r) {
          add_residual(x.data() + r * H, tmp.data() + r * H, fp(L.post_attn_norm));
          rmsnorm(x.data() + r * H, L.ffn_norm.data_ptr<float>(), eps_, H, xn.data() + r * H);
          if (gin) quantize_row(xn.data() + r * H, H, qx, r);
        });
        // 6. gate and up, 32 columns a job, then silu(gate) * up and its blocks
        const bool din = L.down.quantized() && I % QK == 0;
        c.for_static((I + QK - 1) / QK, [&](int64_t b) {
          const int64_t c0 = b * QK, c1 = std::min(I, c0 + QK);
          rows_block(L.gate, c0, c1, qx, xn.data(), M, gu.data(), 2 * I, 0);
          rows_block(L.up, c0, c1, qx, xn.data(), M, gu.data(), 2 * I, I);
          for (int64_t r = 0; r < M; ++r) {
            gated(act_, gu.data() + r * 2 * I + c0, gu.data() + r * 2 * I + I + c0, c1 - c0, act.data() + r * I + c0);
            if (din) quantize_block(act.data() + r * I + c0, qf, r, b);
          }
        });
        if (L.down.quantized() && !din)
          c.for_static(M, [&](int64_t r) { quantize_row(act.data() + r * I, I, qf, r); });
        // 7. down projection (its residual is added in the next layer's first phase)
        multi_linear(c, L.down, qf, act.data(), M, tmp.data(), H);
      }
      const int64_t first = M - keep;
      c.for_static(M, [&](int64_t r) {
        add_residual(x.data() + r * H, tmp.data() + r * H, fp(layers_.back().post_ffn_norm));
        rmsnorm(x.data() + r * H, norm_.data_ptr<float>(), eps_, H, xn.data() + r * H);
        if (want_hidden) std::memcpy(hidden.data_ptr<float>() + r * FW, xn.data() + r * H, H * sizeof(float));
        if (out_.quantized() && r >= first)
          quantize_row(xn.data() + r * H, H, qo, r - first);
      });
      multi_linear(c, out_, qo, xn.data() + first * H, keep, logits.data_ptr<float>(), out_.N);
    });
    return {logits, want_hidden ? hidden : at::empty({0}, at::kFloat)};
  }

  void embed_row(int64_t t, float* y) const {
    dequantize_row(embed_, t, y);
    if (embed_scale_ != 1.0f)
      for (int64_t k = 0; k < H_; ++k) y[k] *= embed_scale_;
  }

 private:
  // x += out, out first normed by `post` when the layer has that norm (in place: out is scratch)
  void add_residual(float* x, float* out, const float* post) const {
    if (post) rmsnorm(out, post, eps_, H_, out);
    for (int64_t k = 0; k < H_; ++k) x[k] += out[k];
  }

  // The distinct windows of the layers, 0 (none) first.
  int64_t window_index(int64_t window) const {
    int64_t i = 0;
    for (int64_t w : windows()) {
      if (w == window) return i;
      ++i;
    }
    return 0;
  }
  std::vector<int64_t> windows() const {
    std::vector<int64_t> out{0};
    for (const Layer& L : layers_)
      if (std::find(out.begin(), out.end(), L.window) == out.end()) out.push_back(L.window);
    return out;
  }

  std::vector<std::vector<int64_t>> window_starts(const std::vector<std::vector<int32_t>>& slots,
                                                  const std::vector<int64_t>& seq_of, const std::vector<int64_t>& starts,
                                                  const std::vector<int64_t>& pasts, const int64_t* pp) const {
    const std::vector<int64_t> ws = windows();
    std::vector<std::vector<int64_t>> out(ws.size(), std::vector<int64_t>(slots.size(), 0));
    for (size_t w = 1; w < ws.size(); ++w)
      for (size_t r = 0; r < slots.size(); ++r)
        out[w][r] = window_first(slots[r], pasts[seq_of[r]], pp + starts[seq_of[r]], pp[r], ws[w]);
    return out;
  }

  int64_t H_, nh_, nkv_, hd_, I_;
  float eps_;
  int act_;
  float embed_scale_, attn_scale_;
  std::vector<at::Tensor> cos_, sin_;
  Matrix embed_;
  at::Tensor norm_;
  Matrix out_;
  std::vector<Layer> layers_;
  std::vector<int64_t> taps_;  // set_taps
};

// y = x W^T (+ bias) for 1..64 float32 rows on the kernel the forward uses (inputs quantized per block
// for quantized weights): what the batch-invariance tests call directly.
at::Tensor linear(const Matrix& W, const at::Tensor& x, int64_t threads) {
  TORCH_CHECK(x.scalar_type() == at::kFloat && x.dim() == 2 && x.size(1) == W.K, "x must be float32 [M, ", W.K, "]");
  const at::Tensor xs = x.contiguous();
  const int64_t M = xs.size(0);
  TORCH_CHECK(M >= 1 && M <= kMaxRows, "linear takes 1 to ", kMaxRows, " rows, not ", M);
#if defined(HVD_MUTATE_CRASH)  // for the tests only: calls of 8 rows or more fault (SIGILL), as a bad instruction would
  if (M >= 8) __builtin_trap();
#endif
  at::Tensor y = at::empty({M, W.N}, at::kFloat);
  QRows q;
  if (W.quantized()) {
    q.resize(M, W.K);
    for (int64_t r = 0; r < M; ++r)
      quantize_row(xs.data_ptr<float>() + r * W.K, W.K, q, r);
  }
  TORCH_CHECK(threads >= 0, "threads must be 0 (ATen's count) or more, not ", threads);
  const int nt = team_size(threads);
  hvd_team::team().run(nt, [&](hvd_team::Ctx& c) { multi_linear(c, W, q, xs.data_ptr<float>(), M, y.data_ptr<float>(), W.N); });
  return y;
}

// A draft head's step (hvd_agents/draft_head/model.py DraftHead.step, its five layers and its projection on this
// kernel) in one call, so a drafted token costs its products and not a PyTorch operation for every norm, rotation
// and residual around them. mats: fc [d, 2d], qkv [3d, d], o [d, d], gate_up [2I, d], down [d, I], the projection
// [V', d]; norms: feature, embedding, attention, MLP, output ([d]). The n new indices' features and embeddings
// ([n, d]) at `positions` give their rotated keys and values, written at slots index..index+n-1 of keys / values
// ([heads, capacity, head_dim] float32); with `attend`, the last index attends over slots [first, index+n-1] and
// runs through the MLP and the projection: returns (its predicted feature [1, d], its logits [V']), else nothing.
// Every row's key and value is computed alone, so it is the same bits whatever rows share the call.
std::vector<at::Tensor> head_step(const std::vector<Matrix>& mats, const std::vector<at::Tensor>& norms,
                                  const at::Tensor& features, const at::Tensor& embedded, const at::Tensor& inv_freq,
                                  const std::vector<int64_t>& positions, at::Tensor keys, at::Tensor values,
                                  int64_t index, int64_t first, bool attend, double eps, int64_t threads) {
  TORCH_CHECK(mats.size() == 6 && norms.size() == 5, "a head step takes 6 matrices and 5 norms");
  const Matrix &fc = mats[0], &wqkv = mats[1], &wo = mats[2], &wgu = mats[3], &wdown = mats[4], &wlm = mats[5];
  const int64_t d = fc.N, I = wdown.K, n = static_cast<int64_t>(positions.size());
  TORCH_CHECK(fc.K == 2 * d && wqkv.N == 3 * d && wqkv.K == d && wo.N == d && wo.K == d && wgu.N == 2 * I &&
              wgu.K == d && wdown.N == d && wlm.K == d, "the head's matrices disagree in shape");
  TORCH_CHECK(n >= 1 && n <= kMaxRows, "a head step takes 1 to ", kMaxRows, " indices, not ", n);
  TORCH_CHECK(keys.scalar_type() == at::kFloat && keys.is_contiguous() && keys.dim() == 3 &&
              values.sizes() == keys.sizes() && values.scalar_type() == at::kFloat && values.is_contiguous(),
              "keys and values must be contiguous float32 [heads, capacity, head_dim] of one shape");
  const int64_t H = keys.size(0), cap = keys.size(1), hd = keys.size(2), half = hd / 2, last = index + n - 1;
  TORCH_CHECK(H * hd == d && hd % 2 == 0, "heads x head_dim must be the hidden size, with an even head_dim");
  TORCH_CHECK(0 <= index && last < cap && 0 <= first && first <= last, "slots must satisfy 0 <= first <= index + n - 1 < capacity");
  for (const int64_t p : positions) TORCH_CHECK(p >= 0, "positions must be >= 0");
  for (const at::Tensor* t : {&features, &embedded})
    TORCH_CHECK(t->scalar_type() == at::kFloat && t->is_contiguous() && t->dim() == 2 && t->size(0) == n && t->size(1) == d,
                "features and embeddings must be float32 [n, d]");
  for (const at::Tensor& w : norms)
    TORCH_CHECK(w.scalar_type() == at::kFloat && w.is_contiguous() && w.numel() == d, "norms must be float32 [d]");
  TORCH_CHECK(inv_freq.scalar_type() == at::kFloat && inv_freq.is_contiguous() && inv_freq.numel() == half,
              "inv_freq must be float32 [head_dim / 2]");
  TORCH_CHECK(threads >= 0, "threads must be 0 (ATen's count) or more, not ", threads);
  const float e = static_cast<float>(eps), scale = 1.0f / std::sqrt(static_cast<float>(hd));
  const int64_t seen = last - first + 1;
  std::vector<float> in(n * 2 * d), x(n * d), xn(n * d), qkv(n * 3 * d), att(d), tmp(d), gu(2 * I), act(I), scores(H * seen);
  at::Tensor predicted = at::empty({1, d}, at::kFloat), logits = at::empty({wlm.N}, at::kFloat);
  float* pred = predicted.data_ptr<float>();
  float *kp = keys.data_ptr<float>(), *vp = values.data_ptr<float>();
  const float *inv = inv_freq.data_ptr<float>(), *fp_in = features.data_ptr<float>(), *ep_in = embedded.data_ptr<float>();
  auto w = [&](int64_t i) { return norms[i].data_ptr<float>(); };
  QRows q2, q1, qa, qi;
  q2.resize(n, 2 * d);
  q1.resize(n, d);
  qa.resize(1, d);
  qi.resize(1, I);
  auto blocks = [](const Matrix& W, const float* row, int64_t K, QRows& q, int64_t r) {
    if (W.quantized()) quantize_row(row, K, q, r);
  };
  auto rotate = [&](float* v, int64_t position) {
    for (int64_t i = 0; i < half; ++i) {
      const float angle = static_cast<float>(position) * inv[i], cs = std::cos(angle), sn = std::sin(angle);
      const float a = v[i], b = v[i + half];
      v[i] = a * cs - b * sn;
      v[i + half] = b * cs + a * sn;
    }
  };
  const float* xl = x.data() + (n - 1) * d;  // the last index's residual stream
  hvd_team::team().run(team_size(threads), [&](hvd_team::Ctx& c) {
    c.for_static(n, [&](int64_t r) {
      rmsnorm(fp_in + r * d, w(0), e, d, in.data() + r * 2 * d);
      rmsnorm(ep_in + r * d, w(1), e, d, in.data() + r * 2 * d + d);
      blocks(fc, in.data() + r * 2 * d, 2 * d, q2, r);
    });
    multi_linear(c, fc, q2, in.data(), n, x.data(), d);
    c.for_static(n, [&](int64_t r) {
      rmsnorm(x.data() + r * d, w(2), e, d, xn.data() + r * d);
      blocks(wqkv, xn.data() + r * d, d, q1, r);
    });
    multi_linear(c, wqkv, q1, xn.data(), n, qkv.data(), 3 * d);
    c.for_static(n * H, [&](int64_t job) {  // rotate each row's key (and the last row's query), cache key and value
      const int64_t r = job / H, h = job % H;
      float* row = qkv.data() + r * 3 * d;
      if (r == n - 1) rotate(row + h * hd, positions[r]);
      rotate(row + d + h * hd, positions[r]);
      std::memcpy(kp + (h * cap + index + r) * hd, row + d + h * hd, hd * sizeof(float));
      std::memcpy(vp + (h * cap + index + r) * hd, row + 2 * d + h * hd, hd * sizeof(float));
    });
    if (!attend) return;
    c.for_static(H, [&](int64_t h) {  // the last index attends over its window
      const float* q = qkv.data() + (n - 1) * 3 * d + h * hd;
      float* s = scores.data() + h * seen;
      float top = -std::numeric_limits<float>::infinity(), total = 0.0f;
      for (int64_t j = 0; j < seen; ++j) {
        const float* kj = kp + (h * cap + first + j) * hd;
        float dot = 0.0f;
        for (int64_t i = 0; i < hd; ++i) dot += q[i] * kj[i];
        s[j] = dot * scale;
        top = std::max(top, s[j]);
      }
      for (int64_t j = 0; j < seen; ++j) total += (s[j] = std::exp(s[j] - top));
      float* out = att.data() + h * hd;
      std::fill(out, out + hd, 0.0f);
      for (int64_t j = 0; j < seen; ++j) {
        const float* vj = vp + (h * cap + first + j) * hd;
        const float p = s[j] / total;
        for (int64_t i = 0; i < hd; ++i) out[i] += p * vj[i];
      }
    });
    c.single([&] { blocks(wo, att.data(), d, qa, 0); });
    multi_linear(c, wo, qa, att.data(), 1, tmp.data(), d);
    c.single([&] {
      for (int64_t i = 0; i < d; ++i) tmp[i] += xl[i];  // tmp: the residual stream after attention
      rmsnorm(tmp.data(), w(3), e, d, att.data());       // att: its MLP input
      blocks(wgu, att.data(), d, qa, 0);
    });
    multi_linear(c, wgu, qa, att.data(), 1, gu.data(), 2 * I);
    c.single([&] {
      for (int64_t i = 0; i < I; ++i) act[i] = gu[i] / (1.0f + std::exp(-gu[i])) * gu[I + i];
      blocks(wdown, act.data(), I, qi, 0);
    });
    multi_linear(c, wdown, qi, act.data(), 1, pred, d);
    c.single([&] {
      for (int64_t i = 0; i < d; ++i) tmp[i] += pred[i];
      rmsnorm(tmp.data(), w(4), e, d, pred);
      blocks(wlm, pred, d, qa, 0);
    });
    multi_linear(c, wlm, qa, pred, 1, logits.data_ptr<float>(), wlm.N);
  });
  if (!attend) return {};
  return {predicted, logits};
}

// Attention of queries q [Q, hd] (float32) over one kv head's keys and values k, v [T, hd] (float16): query u sees
// the slots [lo[u], hi[u]), all of them in one attend() call (the path's passes over several queries), or each in
// a call of its own when `alone`. For the tests and the paths' self-check: a query's result must not depend on
// the queries beside it, nor on the path.
at::Tensor attention(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v, const std::vector<int64_t>& lo,
                     const std::vector<int64_t>& hi, double scale, bool alone) {
  TORCH_CHECK(q.scalar_type() == at::kFloat && q.dim() == 2, "q must be float32 [Q, head_dim]");
  const int64_t Q = q.size(0), hd = q.size(1);
  TORCH_CHECK(Q >= 1 && Q <= kMaxQueries, "attention takes 1 to ", kMaxQueries, " queries, not ", Q);
  TORCH_CHECK(hd % 8 == 0 && hd <= kMaxHeadDim, "head_dim must be a multiple of 8 up to ", kMaxHeadDim, ", not ", hd);
  TORCH_CHECK(k.scalar_type() == at::kHalf && v.scalar_type() == at::kHalf && k.dim() == 2 && k.sizes() == v.sizes() &&
                  k.size(1) == hd, "k and v must be float16 [T, head_dim]");
  const int64_t T = k.size(0);
  TORCH_CHECK(static_cast<int64_t>(lo.size()) == Q && static_cast<int64_t>(hi.size()) == Q, "a run per query");
  for (int64_t u = 0; u < Q; ++u)
    TORCH_CHECK(0 <= lo[u] && lo[u] < hi[u] && hi[u] <= T, "query ", u, " sees [", lo[u], ", ", hi[u], ") of ", T, " slots");
  const at::Tensor qs = q.contiguous(), ks = k.contiguous(), vs = v.contiguous();
  at::Tensor out = at::empty({Q, hd}, at::kFloat);
  std::vector<Query> queries(Q);
  for (int64_t u = 0; u < Q; ++u)
    queries[u] = Query{qs.data_ptr<float>() + u * hd, out.data_ptr<float>() + u * hd, lo[u], hi[u], nullptr, 0};
  Scratch scratch;
  scratch.reserve(Q, hd, T);
  const at::Half* K = ks.data_ptr<at::Half>();
  const at::Half* V = vs.data_ptr<at::Half>();
  if (alone) {
    for (int64_t u = 0; u < Q; ++u) attend(&queries[u], 1, K, V, hd, static_cast<float>(scale), scratch);
  } else {
    attend(queries.data(), Q, K, V, hd, static_cast<float>(scale), scratch);
  }
  return out;
}

// The rope tables [positions, len(inv_freq)] in float32: cos and sin of p * inv_freq in double (the C library's,
// not a vectorized approximation that differs between instruction sets), times the attention scaling.
std::vector<at::Tensor> rope_table(const at::Tensor& inv_freq, int64_t positions, double scaling) {
  const at::Tensor f = inv_freq.to(at::kDouble).contiguous();
  const int64_t half = f.numel();
  at::Tensor cos = at::empty({positions, half}, at::kFloat), sin = at::empty({positions, half}, at::kFloat);
  const double* fp = f.data_ptr<double>();
  float* c = cos.data_ptr<float>();
  float* s = sin.data_ptr<float>();
  at::parallel_for(0, positions, 256, [&](int64_t a, int64_t b) {
    for (int64_t p = a; p < b; ++p)
      for (int64_t i = 0; i < half; ++i) {
        const double angle = static_cast<double>(p) * fp[i];
        c[p * half + i] = static_cast<float>(std::cos(angle) * scaling);
        s[p * half + i] = static_cast<float>(std::sin(angle) * scaling);
      }
  });
  return {cos, sin};
}

// The weight as float32 [N, K] (prefill runs dense products on it).
at::Tensor dequantize(const Matrix& W) {
  at::Tensor y = at::empty({W.N, W.K}, at::kFloat);
  float* yp = y.data_ptr<float>();
  at::parallel_for(0, W.N, 64, [&](int64_t a, int64_t b) {
    for (int64_t n = a; n < b; ++n) dequantize_row(W, n, yp + n * W.K);
  });
  return y;
}

// Each row's argmax (-1 for a row holding a NaN), logits float32 [rows, vocab].
std::vector<int64_t> argmax_rows(const at::Tensor& logits) {
  TORCH_CHECK(logits.scalar_type() == at::kFloat && logits.dim() == 2, "logits must be float32 [rows, vocab]");
  const at::Tensor x = logits.contiguous();
  const int64_t rows = x.size(0), n = x.size(1);
  TORCH_CHECK(n > 0, "logits must have a vocabulary");
  std::vector<int64_t> out(rows);
  const float* p = x.data_ptr<float>();
  for (int64_t r = 0; r < rows; ++r) out[r] = hvd_logits::argmax_row(p + r * n, n);
  return out;
}

// (log p(token), entropy) of row `row` of logits float32 [rows, vocab].
std::pair<float, float> token_signal(const at::Tensor& logits, int64_t row, int64_t token) {
  TORCH_CHECK(logits.scalar_type() == at::kFloat && logits.dim() == 2, "logits must be float32 [rows, vocab]");
  TORCH_CHECK(row >= 0 && row < logits.size(0) && token >= 0 && token < logits.size(1), "row or token out of range");
  const at::Tensor x = logits[row].contiguous();
  return hvd_logits::token_signal(x.data_ptr<float>(), x.size(0), token);
}

// The k largest values of logits float32 [vocab] (largest first, the lower index first among ties) and their softmax
// probabilities; empty lists if the row holds a NaN or no finite value.
std::pair<std::vector<int64_t>, std::vector<float>> top_probs(const at::Tensor& logits, int64_t k) {
  TORCH_CHECK(logits.scalar_type() == at::kFloat && logits.dim() == 1, "logits must be float32 [vocab]");
  TORCH_CHECK(k >= 1 && k <= hvd_logits::kMaxTop && k <= logits.size(0), "k must be 1 to 8 and at most the vocabulary");
  const at::Tensor x = logits.contiguous();
  std::vector<int64_t> index(k);
  std::vector<float> prob(k);
  if (!hvd_logits::top_probs(x.data_ptr<float>(), x.size(0), static_cast<int>(k), index.data(), prob.data())) return {};
  return {index, prob};
}

#if defined(HVD_AMX)
// c + a b on one tile product, a [M, K] and b [K / 4, 4 N] bytes (VNNI layout) read signed or not as asked, c [M, N]
// int32 (M, N <= 16, K <= 64 a multiple of 4). For the tests: the tile instructions against their definition.
at::Tensor tile_product(const at::Tensor& c, const at::Tensor& a, const at::Tensor& b, bool a_signed, bool b_signed) {
  TORCH_CHECK(c.scalar_type() == at::kInt && c.dim() == 2, "c must be int32 [M, N]");
  TORCH_CHECK(a.scalar_type() == at::kByte && b.scalar_type() == at::kByte && a.dim() == 2 && b.dim() == 2,
              "a and b must be bytes (uint8) [M, K] and [K / 4, 4 N]");
  const int64_t M = c.size(0), N = c.size(1), K = a.size(1);
  TORCH_CHECK(M >= 1 && M <= 16 && N >= 1 && N <= 16 && K >= 4 && K <= 64 && K % 4 == 0,
              "a tile product takes 1 to 16 rows and columns and K a multiple of 4 up to 64");
  TORCH_CHECK(a.size(0) == M && b.size(0) == K / 4 && b.size(1) == 4 * N, "a, b and c do not make a product");
  at::Tensor out = c.contiguous().clone();
  const at::Tensor as = a.contiguous(), bs = b.contiguous();
  hvd_amx::product(out.data_ptr<int32_t>(), as.data_ptr<uint8_t>(), bs.data_ptr<uint8_t>(), M, K, N, a_signed,
                   b_signed);
  return out;
}
#endif

}  // namespace

PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) {
  py::class_<Matrix>(m, "Matrix", py::module_local())
      .def(py::init(&make_matrix), py::arg("fmt"), py::arg("rows"), py::arg("cols"), py::arg("data"), py::arg("bias") = py::none())
      .def_property_readonly("fmt", [](const Matrix& w) { return w.fmt; })
      .def_property_readonly("rows", [](const Matrix& w) { return w.N; })
      .def_property_readonly("cols", [](const Matrix& w) { return w.K; })
      .def_property_readonly("nbytes", [](const Matrix& w) { return w.data.numel() * w.data.element_size(); });
  py::class_<QuantModel>(m, "QuantModel", py::module_local())
      .def(py::init<int64_t, int64_t, int64_t, int64_t, int64_t, double, int64_t, double, double, std::vector<at::Tensor>,
                    std::vector<at::Tensor>, Matrix, at::Tensor, Matrix>())
      .def("add_layer", &QuantModel::add_layer)
      .def("forward", &QuantModel::forward, py::arg("tokens"), py::arg("positions"), py::arg("visible"), py::arg("kc"),
           py::arg("vc"), py::arg("past"), py::arg("keep"), py::arg("want_hidden"), py::arg("threads") = 0,
           py::call_guard<py::gil_scoped_release>())
      .def("forward_batch", &QuantModel::forward_batch, py::arg("tokens"), py::arg("positions"), py::arg("visible"),
           py::arg("starts"), py::arg("kcs"), py::arg("vcs"), py::arg("pasts"), py::arg("keep"), py::arg("want_hidden"),
           py::arg("threads") = 0, py::call_guard<py::gil_scoped_release>())
      .def("set_taps", &QuantModel::set_taps, py::arg("taps"))
      .def_property_readonly("taps", &QuantModel::taps)
      .def_property_readonly("num_layers", &QuantModel::num_layers)
      .def_property_readonly("vocab", &QuantModel::vocab);
  m.def("linear", &linear, py::arg("weight"), py::arg("x"), py::arg("threads") = 0, py::call_guard<py::gil_scoped_release>());
  m.def("head_step", &head_step, py::arg("mats"), py::arg("norms"), py::arg("features"), py::arg("embedded"),
        py::arg("inv_freq"), py::arg("positions"), py::arg("keys"), py::arg("values"), py::arg("index"), py::arg("first"),
        py::arg("attend"), py::arg("eps"), py::arg("threads") = 0, py::call_guard<py::gil_scoped_release>());
  m.def("attention", &attention, py::arg("q"), py::arg("k"), py::arg("v"), py::arg("lo"), py::arg("hi"), py::arg("scale"),
        py::arg("alone") = false, py::call_guard<py::gil_scoped_release>());
  m.def("argmax_rows", &argmax_rows, py::arg("logits"));
  m.def("token_signal", &token_signal, py::arg("logits"), py::arg("row"), py::arg("token"));
  m.def("top_probs", &top_probs, py::arg("logits"), py::arg("k"));
  m.def("rope_table", &rope_table, py::call_guard<py::gil_scoped_release>());
  m.def("dequantize", &dequantize, py::call_guard<py::gil_scoped_release>());
  m.attr("MAX_ROWS") = kMaxRows;
  m.attr("MAX_HEAD_DIM") = kMaxHeadDim;
  m.attr("ISA") = hvd_isa::kName;
  // what this CPU can run: the loader asks the AVX2 build before it builds another
  m.def("cpu_refusal", &hvd_cpu::cpu_refusal, py::arg("path"));
  m.def("cpu_supports", [](const std::string& path) { return hvd_cpu::cpu_refusal(path).empty(); }, py::arg("path"));
  m.attr("TILE_MIN_ROWS") = hvd_amx::MIN_ROWS;  // the fewest rows of a pass on AMX tiles (0: no tiles in this build)
#if defined(HVD_AMX)
  m.def("tile_product", &tile_product, py::arg("c"), py::arg("a"), py::arg("b"), py::arg("a_signed"),
        py::arg("b_signed"), py::call_guard<py::gil_scoped_release>());
#endif
#if defined(HVD_AMX) && !defined(HVD_AMX_EMULATE)
  {  // an amx build loaded where the tiles cannot run says why, rather than faulting at its first product
    const std::string why = hvd_cpu::cpu_refusal("amx");
    if (!why.empty()) throw std::runtime_error("the amx path cannot run on this machine: " + why);
  }
#endif
}
