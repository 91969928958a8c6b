#include "ops/cpu/moe.h"

#include <algorithm>
#include <atomic>
#include <cmath>
#include <cstring>

#include "core/error.h"
#include "ops/cpu/quant_dot.h"

namespace qwenrt::ops::cpu {

void moe_route(const float* logits, int64_t n, int n_expert, int k, int32_t* ids, float* weights) {
  for (int64_t t = 0; t < n; ++t) {
    const float* l = logits + t * n_expert;
    const double mx = *std::max_element(l, l + n_expert);
    double sum = 0;
    for (int e = 0; e < n_expert; ++e) sum += std::exp(double(l[e]) - mx);
    // Selection by repeated arg-max with a strict '>' keeps the lower id on ties, as ref's
    // stable sort does; k <= n_expert is small (8 of 256), so k passes beat a sort.
    int32_t* id = ids + t * k;
    double p[64];  // k <= 64, checked by moe_ffn
    double picked = 0;
    for (int j = 0; j < k; ++j) {
      int best = -1;
      float best_l = 0;
      for (int e = 0; e < n_expert; ++e) {
        if (std::find(id, id + j, e) != id + j) continue;
        if (best < 0 || l[e] > best_l) best = e, best_l = l[e];
      }
      id[j] = best;
      p[j] = std::exp(double(best_l) - mx) / sum;
      picked += p[j];
    }
    picked = std::max(picked, 6.103515625e-5);
    for (int j = 0; j < k; ++j) weights[t * k + j] = static_cast<float>(p[j] / picked);
  }
}

namespace {

float sigmoid(float v) {
  return 1.0f / (1.0f + std::exp(-v));
}
float silu(float v) {
  return v / (1.0f + std::exp(-v));
}

// Rows (or output columns) per task of the gate/up and down passes: a multiple of kRowAlign.
constexpr int64_t kRowChunk = 64;
// Groups one pass of steps 4-6 takes (a round's task order lives on the stack).
constexpr int kMaxGroupsPerRound = 1024;

TensorView rows_of(const TensorView& v, int64_t first, int64_t count) {
  TensorView r = v;
  r.ne[1] = count;
  r.data = v.row(first);
  return r;
}

// One expert's work: its gate, up and down matrices and the rows of the gathered inputs it
// reads (first_row .. first_row + count), each with its token and mixing weight.
struct Group {
  TensorView gate, up, down;
  int64_t first_row, count;
  bool shared;    // the shared expert (its inputs may be in another format)
  int slot = -1;  // its expert cache slot (streamed experts), whose bytes may still be loading
};

// Expert e's matrices, from w (resident) or from a cache entry (streamed).
template <class Source>
void set_views_from(Group& g, const Source& src, bool fused, int64_t ff) {
  if (fused) {
    g.gate = rows_of(src.gate_up, 0, ff);
    g.up = rows_of(src.gate_up, ff, ff);
  } else {
    g.gate = src.gate;
    g.up = src.up;
  }
  g.down = src.down;
}

struct ResidentExpert {
  TensorView gate, up, gate_up, down;
};

void set_views(Group& g, const MoeWeights& w, int e, bool fused, int64_t ff) {
  ResidentExpert r;
  if (fused) {
    r.gate_up = w.gate_up_exps.expert_view(e);
  } else {
    r.gate = w.gate_exps.expert_view(e);
    r.up = w.up_exps.expert_view(e);
  }
  r.down = w.down_exps.expert_view(e);
  set_views_from(g, r, fused, ff);
  g.slot = -1;
}

}  // namespace

void moe_ffn(const MoeWeights& w, const float* x, float* out, int64_t n, int n_expert, int k,
             Context& ctx, ExpertCache* cache) {
  if (n <= 0) return;
  const bool fused = w.gate_up_exps.present();
  const TensorView& gu = fused ? w.gate_up_exps.view : w.gate_exps.view;
  const int64_t dim = w.down_exps.view.ne[1], ff = w.down_exps.view.ne[0];
  const int64_t sff = w.shared_down.view.ne[0];
  const bool has_shared = w.shared_down.present();
  if (k < 1 || k > 64 || k > n_expert || gu.ne[0] != dim) {
    fail("cpu moe_ffn: k = {} of {} experts with input dim {} (gate/up take {})", k, n_expert, dim,
         gu.ne[0]);
  }
  Scratch& s = ctx.scratch;
  ThreadPool& pool = ctx.pool;
  const int n_threads = pool.size();
  s.reserve_threads(n_threads);

  // 1. Routing, and the shared expert's scalar gate (two small fp32 matmuls, then serial work).
  auto* logits = s.moe_logits.get<float>(n * (n_expert + 1));
  float* shared_logit = logits + n * n_expert;
  matmul(w.router.view, x, logits, n, ctx);
  if (has_shared) matmul(w.shared_gate_inp.view, x, shared_logit, n, ctx);
  auto* route = s.moe_route.get<uint8_t>(n * k * 8);
  auto* ids = reinterpret_cast<int32_t*>(route);
  auto* weights = reinterpret_cast<float*>(route + n * k * 4);
  moe_route(logits, n, n_expert, k, ids, weights);

  // 2. Group (token, weight) entries by expert: expert e's entries are rows offsets[e] ..
  // offsets[e + 1] of the gathered inputs; the shared expert's n rows come last.
  const int64_t n_entries = n * k, total_rows = n_entries + (has_shared ? n : 0);
  auto* groups_mem = s.moe_groups.get<uint8_t>((n_expert + 1) * 8 + total_rows * 8 +
                                               (n_expert + 1) * sizeof(Group) + n_expert * 8);
  auto* offsets = reinterpret_cast<int64_t*>(groups_mem);
  auto* entry_token = reinterpret_cast<int32_t*>(groups_mem + (n_expert + 1) * 8);
  auto* entry_weight = reinterpret_cast<float*>(entry_token + total_rows);
  auto* groups = reinterpret_cast<Group*>(entry_weight + total_rows);
  std::fill(offsets, offsets + n_expert + 1, 0);
  for (int64_t i = 0; i < n_entries; ++i) offsets[ids[i] + 1]++;
  for (int e = 0; e < n_expert; ++e) offsets[e + 1] += offsets[e];
  // A second pass in token order keeps each expert's rows sorted by token.
  int64_t* cursor = reinterpret_cast<int64_t*>(groups + n_expert + 1);
  std::copy(offsets, offsets + n_expert, cursor);
  for (int64_t i = 0; i < n_entries; ++i) {
    const int64_t row = cursor[ids[i]]++;
    entry_token[row] = static_cast<int32_t>(i / k);
    entry_weight[row] = weights[i];
  }
  int n_groups = 0;
  // Expert parallelism: this backend holds experts [base, base + ne[2]) of the n_expert.
  const int base = w.expert_base, held = static_cast<int>(w.down_exps.view.ne[2]);
  if (cache && (base != 0 || held != n_expert))
    fail("cpu moe_ffn: streamed experts with expert parallelism are not supported");
  for (int e = base; e < std::min(n_expert, base + held); ++e) {
    const int64_t count = offsets[e + 1] - offsets[e];
    if (count == 0) continue;
    Group& g = groups[n_groups++];
    g = Group{.first_row = offsets[e], .count = count, .shared = false, .slot = e};
    if (!cache) set_views(g, w, e - base, fused, ff);
  }
  if (has_shared) {
    for (int64_t t = 0; t < n; ++t) {
      entry_token[n_entries + t] = static_cast<int32_t>(t);
      entry_weight[n_entries + t] = sigmoid(shared_logit[t]);
    }
    groups[n_groups++] =
        Group{w.shared_gate.view, w.shared_up.view, w.shared_down.view, n_entries, n, true, -1};
  }
  if (n_groups == 0) {  // none of this backend's experts was picked, and no shared expert
    std::fill(out, out + n * dim, 0.0f);
    return;
  }

  // 3. Quantise x once per token, then gather each expert's input rows (the shared expert reads
  // its own format if its type differs).
  const DType expert_type = gu.dtype;
  const DType shared_type = has_shared ? w.shared_gate.view.dtype : expert_type;
  const int64_t rb = prepared_row_bytes(expert_type, dim);
  const int64_t rb_shared = prepared_row_bytes(shared_type, dim);
  auto* act_x = s.moe_act_x.get<uint8_t>(n * rb);
  auto* gathered = s.moe_act_gathered.get<uint8_t>(n_entries * rb + n * rb_shared);
  pool.run(n >= 4 ? n_threads : 1, [&](int p, int np) {
    const int64_t t0 = n * p / np, t1 = n * (p + 1) / np;
    prepare_act_rows(expert_type, x + t0 * dim, dim, dim, t1 - t0, act_x + t0 * rb);
    if (has_shared) {
      if (shared_type == expert_type) {
        std::memcpy(gathered + n_entries * rb + t0 * rb, act_x + t0 * rb, (t1 - t0) * rb);
      } else {
        prepare_act_rows(shared_type, x + t0 * dim, dim, dim, t1 - t0,
                         gathered + n_entries * rb + t0 * rb_shared);
      }
    }
  });
  pool.run(n_entries >= 8 ? n_threads : 1, [&](int p, int np) {
    const int64_t i0 = n_entries * p / np, i1 = n_entries * (p + 1) / np;
    for (int64_t i = i0; i < i1; ++i)
      std::memcpy(gathered + i * rb, act_x + int64_t{entry_token[i]} * rb, rb);
  });

  // 4-6 run over groups [g0, g1) at a time: all at once for resident experts; for streamed ones
  // in rounds of as many experts as the cache holds, pinned for the round, the shared expert in
  // the last. Rounds keep the group order of the down pass's sums, so the output is bit for bit
  // that of resident experts.
  const int64_t hs = std::max(ff, has_shared ? sff : 0);
  auto* hidden = s.moe_hidden.get<float>(total_rows * hs);
  auto act_rows = [&](const Group& g) {
    return g.shared ? PreparedAct{gathered + n_entries * rb, rb_shared, g.count}
                    : PreparedAct{gathered + g.first_row * rb, rb, g.count};
  };
  const DType down_type = w.down_exps.view.dtype;
  const DType sdown_type = has_shared ? w.shared_down.view.dtype : down_type;
  const int64_t rbh = prepared_row_bytes(down_type, ff);
  const int64_t rbh_shared = has_shared ? prepared_row_bytes(sdown_type, sff) : 0;
  auto* act_h = s.moe_act_h.get<uint8_t>(n_entries * rbh + n * rbh_shared);
  auto wait = [&](const Group& g) {
    if (g.slot >= 0) cache->wait(g.slot);
  };
  auto run_groups = [&](int g0, int g1, bool first) {
    // 4. Gate and up, in tasks of kRowChunk rows, then h = silu(gate) * up into hidden
    // [total_rows, max(ff, sff)]. Streamed experts already in take the first tasks.
    // Each group's readiness is read once: a load that ends between two reads would otherwise
    // leave its group out of both passes (its rows never computed).
    int order[kMaxGroupsPerRound + 1];  // + 1: the last round's shared expert
    bool in[kMaxGroupsPerRound + 1];
    for (int gi = g0; gi < g1; ++gi)
      in[gi - g0] = groups[gi].slot < 0 || cache->ready(groups[gi].slot);
    int n_order = 0;
    for (int pass = 0; pass < 2; ++pass) {
      for (int gi = g0; gi < g1; ++gi)
        if (in[gi - g0] == (pass == 0)) order[n_order++] = gi;
    }
    int64_t n_tasks = 0;
    for (int oi = 0; oi < n_order; ++oi)
      n_tasks += (groups[order[oi]].gate.ne[1] + kRowChunk - 1) / kRowChunk;
    // Tasks from a shared counter: one core's share of the bandwidth moves from moment to moment,
    // so fixed halves finish apart.
    std::atomic<int64_t> next{0};
    pool.run(n_threads, [&](int p, int) {
      int oi = 0;
      int64_t group_first = 0;  // the first task of group order[oi]
      for (int64_t task; (task = next.fetch_add(1, std::memory_order_relaxed)) < n_tasks;) {
        // Tasks come in increasing order per thread, so the group only moves forward.
        for (;;) {
          const int64_t in_group = (groups[order[oi]].gate.ne[1] + kRowChunk - 1) / kRowChunk;
          if (task < group_first + in_group) break;
          group_first += in_group;
          ++oi;
        }
        const Group& g = groups[order[oi]];
        wait(g);
        const int64_t r0 = (task - group_first) * kRowChunk;
        const int64_t r1 = std::min(g.gate.ne[1], r0 + kRowChunk);
        const int64_t width = r1 - r0;
        float* tile = s.moe_per_thread[p].get<float>(2 * g.count * width);
        const PreparedAct a = act_rows(g);
        matmul_rows(g.gate, r0, r1, a, tile, width, s.per_thread[p]);
        matmul_rows(g.up, r0, r1, a, tile + g.count * width, width, s.per_thread[p]);
        for (int64_t i = 0; i < g.count; ++i) {
          float* h = hidden + (g.first_row + i) * hs + r0;
          const float* gt = tile + i * width;
          const float* ut = tile + (g.count + i) * width;
          for (int64_t c = 0; c < width; ++c) h[c] = silu(gt[c]) * ut[c];
        }
      }
    });

    // 5. Quantise the hidden rows of these groups for their down matrices.
    const int64_t row0 = groups[g0].first_row,
                  row1 = groups[g1 - 1].first_row + groups[g1 - 1].count, rows = row1 - row0;
    pool.run(rows >= 8 ? n_threads : 1, [&](int p, int np) {
      const int64_t i0 = row0 + rows * p / np, i1 = row0 + rows * (p + 1) / np;
      for (int64_t i = i0; i < i1; ++i) {
        if (i < n_entries) {
          prepare_act_rows(down_type, hidden + i * hs, hs, ff, 1, act_h + i * rbh);
        } else {
          prepare_act_rows(sdown_type, hidden + i * hs, hs, sff, 1,
                           act_h + n_entries * rbh + (i - n_entries) * rbh_shared);
        }
      }
    });

    // 6. Down: each task owns kRowChunk output columns for every token (over the groups), so the
    // weighted sum needs no synchronisation; tasks from a shared counter, as for gate/up.
    const int64_t n_col_tasks = (dim + kRowChunk - 1) / kRowChunk;
    std::atomic<int64_t> next_col{0};
    pool.run(n_threads, [&](int p, int) {
      for (int64_t task; (task = next_col.fetch_add(1, std::memory_order_relaxed)) < n_col_tasks;) {
        const int64_t c0 = task * kRowChunk, c1 = std::min(dim, c0 + kRowChunk);
        const int64_t width = c1 - c0;
        if (first) {
          for (int64_t t = 0; t < n; ++t) std::fill(out + t * dim + c0, out + t * dim + c1, 0.0f);
        }
        for (int gi = g0; gi < g1; ++gi) {
          const Group& g = groups[gi];
          const PreparedAct a{g.shared ? act_h + n_entries * rbh : act_h + g.first_row * rbh,
                              g.shared ? rbh_shared : rbh, g.count};
          float* tile = s.moe_per_thread[p].get<float>(g.count * width);
          matmul_rows(g.down, c0, c1, a, tile, width, s.per_thread[p]);
          for (int64_t i = 0; i < g.count; ++i) {
            const int64_t row = g.first_row + i;
            const float wt = entry_weight[row];
            float* o = out + int64_t{entry_token[row]} * dim + c0;
            const float* y = tile + i * width;
            for (int64_t c = 0; c < width; ++c) o[c] += wt * y[c];
          }
        }
      }
    });
  };

  if (!cache) {
    for (int g0 = 0; g0 < n_groups; g0 += kMaxGroupsPerRound)
      run_groups(g0, std::min(n_groups, g0 + kMaxGroupsPerRound), g0 == 0);
    return;
  }
  const int n_routed = n_groups - (has_shared ? 1 : 0);
  const int per_round = std::min(cache->capacity(), kMaxGroupsPerRound);
  for (int g0 = 0; g0 < n_routed || g0 == 0; g0 += per_round) {
    const int g1 = std::min(n_routed, g0 + per_round);
    for (int gi = g0; gi < g1; ++gi) {
      const int e = groups[gi].slot;  // the expert id until pinned
      const ExpertCache::Entry entry = cache->pin(w, e);
      set_views_from(groups[gi], entry, fused, ff);
      groups[gi].slot = entry.slot;
    }
    const bool last = g1 == n_routed;
    run_groups(g0, last ? n_groups : g1, g0 == 0);
    for (int gi = g0; gi < g1; ++gi) cache->unpin(groups[gi].slot);
    if (last) break;
  }
}

}  // namespace qwenrt::ops::cpu
