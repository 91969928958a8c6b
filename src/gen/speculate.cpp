// Speculative decoding in the scheduler: each decode step's drafts (n-gram lookup or the MTP
// chain), the MTP block's rows after a step, checking a step's drafts, and whether checks pay.
#include <algorithm>
#include <exception>

#include "core/log.h"
#include "gen/scheduler_impl.h"

namespace qwenrt::gen {

int32_t Scheduler::Impl::make_drafts(Sequence& seq, int64_t other_rows) {
  seq.drafts.clear();
  if (!seq.forced.empty()) return 0;
  int depth = seq.controller.depth();
  // Room: the drafts and the token after them must fit max_tokens and the context.
  const int64_t left_tokens = seq.params.max_tokens - static_cast<int64_t>(seq.generated.size());
  const int64_t left_ctx = engine.states().n_ctx() - (seq.position + 1) - 1;
  depth = static_cast<int>(std::min<int64_t>({depth, left_tokens - 1, left_ctx}));
  if (depth <= 0) return 0;
  // A draft may not run into a thinking budget's forced close (the close replaces what follows).
  if (seq.thinking && seq.params.thinking_budget) {
    depth = std::min(depth, *seq.params.thinking_budget - seq.thinking_tokens - 1);
    if (depth <= 0) return 0;
  }
  bool probe = false;
  if (options.draft.pause_when_slower) {
    const bool explore = static_cast<int64_t>(seq.generated.size()) >= options.draft.explore_after;
    const int chosen = draft_cost.depth(depth, seq.controller.acceptance(), other_rows, explore);
    // Plain for kProbeSteps steps in a row: one draft, whatever the model says, so that the
    // acceptance keeping it plain is measured again (pending until a draft is there to check).
    probe = chosen == 0 && seq.plain_steps >= kProbeSteps;
    depth = probe ? 1 : chosen;
    seq.cost_paused = depth == 0;
    if (depth == 0) {
      ++seq.plain_steps;
      return 0;
    }
    if (!probe) seq.plain_steps = 0;
  }
  const DraftOptions& o = options.draft;
  if (o.kind == DraftKind::kMtp) {
    if (seq.mtp_first) {
      seq.drafts.push_back(*seq.mtp_first);
      seq.draft_depth = depth;
    }
  } else {
    draft_ngram(seq.params.prompt, seq.generated, o.ngram_min, o.ngram_max, depth, seq.drafts);
  }
  if (probe && !seq.drafts.empty()) seq.plain_steps = 0;
  return static_cast<int32_t>(seq.drafts.size());
}

void Scheduler::Impl::chain_mtp_drafts() {
  const int64_t e = engine.config().n_embd;
  for (Sequence* s : order) s->mtp_base = engine.states().n_mtp_tokens(s->slot);
  try {
    for (size_t j = 1;; ++j) {  // each chained row drafts the (j + 1)-th token
      mtp_batch.clear();
      mtp_rows_of.clear();
      for (Sequence* s : order) {
        if (s->drafts.size() != j || s->draft_depth <= static_cast<int>(j)) continue;
        mtp_batch.add(s->slot, s->drafts.back(),
                      static_cast<int32_t>(engine.states().n_mtp_tokens(s->slot)), s->mtp_hidden,
                      true);
        mtp_rows_of.push_back(s);
      }
      if (mtp_rows_of.empty()) break;
      engine.mtp_draft(mtp_batch, mtp_drafts, mtp_out);
      for (size_t i = 0; i < mtp_rows_of.size(); ++i) {
        mtp_rows_of[i]->drafts.push_back(mtp_drafts[i]);
        mtp_rows_of[i]->mtp_hidden.assign(mtp_out.begin() + i * e, mtp_out.begin() + (i + 1) * e);
      }
    }
  } catch (const std::exception& ex) {  // drafts are optional: this step runs plain
    log(LogLevel::kWarn, "scheduler: an MTP draft step failed: {}", ex.what());
    for (Sequence* s : order) s->drafts.clear();
  }
  // Those rows paired drafts with the MTP block's own states: the positions the check accepts
  // are fed again from the trunk's hidden states after the step (feed_mtp).
  for (Sequence* s : order) {
    if (engine.states().n_mtp_tokens(s->slot) > s->mtp_base)
      engine.truncate_mtp(s->slot, s->mtp_base);
  }
}

void Scheduler::Impl::feed_mtp() {
  const int64_t e = engine.config().n_embd;
  mtp_batch.clear();
  mtp_rows_of.clear();
  for (const Entry& en : entries) {
    Sequence& s = *en.seq;
    if (en.hidden_row < 0 || s.slot < 0) continue;  // not drafting with the MTP block, or ended
    s.mtp_first.reset();
    // Rows p < end: the trunk holds p (its hidden state came from this step, or is held) and the
    // token at p + 1 is known (the one to feed next, for the last).
    const int64_t text = static_cast<int64_t>(s.params.prompt.size() + s.generated.size());
    const int64_t end = std::min(engine.states().n_tokens(s.slot), text - 1);
    auto held_rows = static_cast<int64_t>(s.mtp_held.size()) / e;
    // Held rows must run up to this step's first row; otherwise (not after admit, or after a
    // rollback) they are dropped and the rows go on from this step's.
    if (held_rows > 0 && s.mtp_next + held_rows != en.first_position) {
      s.mtp_held.clear();
      held_rows = 0;
    }
    if (held_rows == 0 && s.mtp_next < en.first_position) s.mtp_next = en.first_position;
    if (s.mtp_next >= end) continue;
    // The next step may draft: the last row's logits give its first draft.
    const bool first = !s.prefilling() && s.feed.size() == 1 && s.forced.empty() &&
                       !s.cost_paused && s.controller.drafts_next();
    const auto hidden_at = [&](int64_t p) {
      return p < en.first_position ? s.mtp_held.data() + (p - s.mtp_next) * e
                                   : hidden.data() + (en.hidden_row + p - en.first_position) * e;
    };
    // Under the cost model, before the sequence's first chosen draft: no MTP forward. The rows
    // past the last kMtpHeldRows are dropped (never fed: the MTP track starts with the window,
    // which only makes its drafts a little worse; the trunk checks them), the rest held.
    if (options.draft.pause_when_slower && !s.mtp_started && !first) {
      const int64_t keep_from = std::max(s.mtp_next, end - kMtpHeldRows);
      const int64_t drop = std::min(held_rows, keep_from - s.mtp_next);
      s.mtp_held.erase(s.mtp_held.begin(), s.mtp_held.begin() + drop * e);
      held_rows -= drop;
      s.mtp_next = held_rows > 0 ? s.mtp_next + drop : keep_from;
      for (int64_t p = s.mtp_next + held_rows; p < end; ++p) {
        const float* h = hidden_at(p);
        s.mtp_held.insert(s.mtp_held.end(), h, h + e);
      }
      continue;
    }
    s.mtp_started = true;
    // Drafting paused while decoding (prompt rows always go in: snapshots hold them): hold.
    if (!first && !s.prefilling() && !s.snapshot_due &&
        std::max(end, en.first_position) - s.mtp_next <= kMtpHeldRows) {
      for (int64_t p = s.mtp_next + held_rows; p < end; ++p) {
        const float* h = hidden_at(p);
        s.mtp_held.insert(s.mtp_held.end(), h, h + e);
      }
      continue;
    }
    auto position = static_cast<int32_t>(engine.states().n_mtp_tokens(s.slot));
    for (int64_t p = s.mtp_next; p < end; ++p)
      mtp_batch.add(s.slot, token_at(s, p + 1), position++, std::span(hidden_at(p), e),
                    first && p + 1 == end);
    s.mtp_held.clear();  // (the batch holds copies of the rows)
    s.mtp_next = end;
    if (first) mtp_rows_of.push_back(&s);
  }
  if (mtp_batch.size() != 0) {
    engine.mtp_draft(mtp_batch, mtp_drafts, mtp_out);
    for (size_t i = 0; i < mtp_rows_of.size(); ++i) {
      mtp_rows_of[i]->mtp_first = mtp_drafts[i];
      mtp_rows_of[i]->mtp_hidden.assign(mtp_out.begin() + i * e, mtp_out.begin() + (i + 1) * e);
    }
  }
}

void Scheduler::Impl::flush_mtp_held(Sequence& s) {
  const int64_t e = engine.config().n_embd;
  const auto held_rows = static_cast<int64_t>(s.mtp_held.size()) / e;
  if (held_rows == 0 || s.slot < 0) return;
  engine::MtpBatch batch;
  auto position = static_cast<int32_t>(engine.states().n_mtp_tokens(s.slot));
  // (Held rows end before the text does: feed_mtp held only rows whose next token was known.)
  for (int64_t i = 0; i < held_rows; ++i) {
    batch.add(s.slot, token_at(s, s.mtp_next + i + 1), position++,
              std::span(s.mtp_held.data() + i * e, e), false);
  }
  s.mtp_held.clear();
  std::vector<int32_t> drafts;
  std::vector<float> out;
  try {
    engine.mtp_draft(batch, drafts, out);
    s.mtp_next += static_cast<int64_t>(batch.size());
  } catch (const std::exception& ex) {  // the reply is done; its snapshot only drafts worse
    log(LogLevel::kWarn, "scheduler: an MTP step failed: {}", ex.what());
  }
}

void Scheduler::Impl::check_drafts(Sequence& seq, const Entry& e, size_t first) {
  seq.checking = true;
  seq.feed.clear();
  seq.position += 1;  // the fed token
  int used = 0, accepted = 0;
  for (int32_t i = 0; i <= e.n_drafts; ++i) {
    const ops::SampledToken& t = sampled.at(first + i);
    ++used;
    take(seq, t.id, &t);
    if (seq.update.done) break;
    // The next row fed drafts[i]: it holds only if that is the token taken, with nothing forced
    // after it.
    if (i == e.n_drafts || seq.drafts[i] != t.id || seq.feed.size() != 1) break;
    seq.feed.clear();
    seq.position += 1;
    ++accepted;
  }
  ++seq.n_checks;
  seq.n_drafted += e.n_drafts;
  seq.n_accepted += accepted;
  seq.controller.record(e.n_drafts, accepted);
  seq.sampler.set_rng_state(seq.rng_marks.at(used));
  if (seq.checking) {  // (finish rolled back already when a token ended the sequence)
    engine.rollback(seq.slot, seq.position);
    seq.checking = false;
  }
}

}  // namespace qwenrt::gen
