// The sequence scheduler's lifecycle on the dense fixture: cancel frees the slot, the queue
// fills and refuses, shutdown with and without drain, run() idle, a failed step, request
// validation, the context filling up, and concurrent submitters while it runs.

#include <gtest/gtest.h>
#include <pthread.h>

#include <chrono>
#include <condition_variable>
#include <ctime>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "gen/scheduler.h"
#include "ops/cpu/isa.h"
#include "support/isa_cap.h"
#include "support/scheduler_fixture.h"

namespace qwenrt::gen {
namespace {

// tests/support/scheduler_fixture.h
using testing_support::collect;
using testing_support::Outcome;
using testing_support::run_until_idle;
using testing_support::SchedulerTest;
using testing_support::WatchedOps;

using testing_support::MatmulIsaCap;  // tests/support/isa_cap.h says why it is there

// --- cancel, queue, shutdown -------------------------------------------------------------------

TEST_F(SchedulerTest, CancelFreesTheSlot) {
  auto e = load({}, 2);
  Scheduler s(*e, *tokenizer_);
  Outcome a, b, c;
  const uint64_t ia = s.submit(greedy(prompt(0), 200), collect(a));
  const uint64_t ib = s.submit(greedy(prompt(1), 200), collect(b));
  const uint64_t ic = s.submit(greedy(prompt(2), 200), collect(c));  // queued: two slots
  for (int i = 0; i < 3; ++i) ASSERT_TRUE(s.step());
  EXPECT_EQ(s.stats().running, 2);
  EXPECT_EQ(s.stats().queued, 1);
  EXPECT_GT(s.stats().kv_pages_in_use, 0);
  s.cancel(ic);  // still queued
  ASSERT_TRUE(s.step());
  EXPECT_EQ(c.dones, 1);
  EXPECT_EQ(c.last.finish, FinishReason::kCancelled);
  EXPECT_EQ(c.last.n_generated, 0);
  EXPECT_TRUE(c.tokens.empty());
  s.cancel(ia);
  const size_t b_before = b.tokens.size();
  ASSERT_TRUE(s.step());
  EXPECT_EQ(a.dones, 1);
  EXPECT_EQ(a.last.finish, FinishReason::kCancelled);
  EXPECT_EQ(a.last.n_generated, int64_t(a.tokens.size()));
  EXPECT_EQ(b.tokens.size(), b_before + 1) << "the other sequence goes on";
  EXPECT_EQ(s.stats().running, 1);
  s.cancel(ib);
  s.cancel(ia);     // already finished: ignored
  s.cancel(12345);  // unknown: ignored
  ASSERT_TRUE(s.step());
  EXPECT_EQ(b.dones, 1);
  EXPECT_EQ(b.last.finish, FinishReason::kCancelled);
  const auto st = s.stats();
  EXPECT_EQ(st.running, 0);
  EXPECT_EQ(st.queued, 0);
  EXPECT_EQ(st.kv_pages_in_use, 0);
  EXPECT_EQ(st.cancelled, 3u);
  EXPECT_EQ(st.finished, 3u);
  EXPECT_FALSE(s.step());
  for (const Outcome* o : {&a, &b, &c}) EXPECT_FALSE(o->update_after_done);
}

TEST_F(SchedulerTest, QueueFullAndShuttingDown) {
  // One slot, max_queue 2: while the slot is free, three may wait (the one about to take it and
  // two more); once it is taken, two.
  Scheduler s(*engine_, *tokenizer_, {.max_queue = 2});
  Outcome o[3];
  s.submit(greedy(prompt(0), 2), collect(o[0]));
  s.submit(greedy(prompt(1), 2), collect(o[1]));
  EXPECT_EQ(s.stats().queued, 2);
  ASSERT_TRUE(s.step());  // one admitted (the slot is taken): room for one more in the queue
  EXPECT_EQ(s.stats().queued, 1);
  s.submit(greedy(prompt(2), 2), collect(o[2]));
  EXPECT_THROW(s.submit(greedy(prompt(3), 2), nullptr), QueueFull);
  s.shutdown(true);
  EXPECT_THROW(s.submit(greedy(prompt(3), 2), nullptr), ShuttingDown);
  s.run();  // drains, then returns
  for (const auto& x : o) {
    EXPECT_EQ(x.dones, 1);
    EXPECT_EQ(x.last.finish, FinishReason::kLength);
    EXPECT_EQ(x.tokens.size(), 2u);
    EXPECT_EQ(x.last.n_generated, 2);
    EXPECT_EQ(x.last.n_prompt, int64_t(prompt(int(&x - o)).size()));
    EXPECT_GT(x.last.prompt_seconds, 0.0);
    EXPECT_GT(x.last.generate_seconds, 0.0);
  }
  // One slot: the second waited in the queue for the whole of the first.
  EXPECT_GE(o[1].last.queue_seconds, o[0].last.prompt_seconds + o[0].last.generate_seconds);
  EXPECT_GE(o[2].last.queue_seconds, o[1].last.prompt_seconds + o[1].last.generate_seconds);
  EXPECT_EQ(s.stats().submitted, 3u);
}

// A burst at an idle scheduler: max_queue counts the sequences waiting beyond the free slots, so
// slots + max_queue are taken before the first step admits any (none refused while a slot is
// free), and the next one is refused.
TEST_F(SchedulerTest, ABurstFillsTheFreeSlotsAndTheQueue) {
  auto e = load({}, 4);
  Scheduler s(*e, *tokenizer_, {.max_queue = 3});
  std::vector<Outcome> o(7);
  for (int i = 0; i < 7; ++i) s.submit(greedy(prompt(i % 4), 2), collect(o[i]));
  EXPECT_THROW(s.submit(greedy(prompt(0), 2), nullptr), QueueFull);
  ASSERT_TRUE(s.step());
  EXPECT_EQ(s.stats().running, 4);
  EXPECT_EQ(s.stats().queued, 3);
  EXPECT_THROW(s.submit(greedy(prompt(0), 2), nullptr), QueueFull);
  while (s.step()) {
  }
  for (const auto& x : o) EXPECT_EQ(x.dones, 1);
  EXPECT_EQ(s.stats().finished, 7u);
}

TEST_F(SchedulerTest, ShutdownDrainFinishesEverything) {
  auto e = load({}, 2);
  Scheduler s(*e, *tokenizer_);
  std::vector<Outcome> o(5);
  for (int i = 0; i < 5; ++i) s.submit(greedy(prompt(i), 5), collect(o[i]));
  std::thread runner([&] { s.run(); });
  s.shutdown(true);
  runner.join();
  for (const auto& x : o) {
    EXPECT_EQ(x.dones, 1);
    EXPECT_EQ(x.last.finish, FinishReason::kLength);
    EXPECT_EQ(x.tokens.size(), 5u);
  }
  EXPECT_EQ(s.stats().finished, 5u);
  EXPECT_EQ(s.stats().cancelled, 0u);
  EXPECT_EQ(s.stats().kv_pages_in_use, 0);
}

TEST_F(SchedulerTest, ShutdownWithoutDrainCancels) {
  auto e = load({}, 2);
  Scheduler s(*e, *tokenizer_);
  std::vector<Outcome> o(5);
  std::mutex m;
  std::condition_variable cv;
  bool started = false;
  for (int i = 0; i < 5; ++i) {
    s.submit(greedy(prompt(i), 400), [&, inner = collect(o[i])](SequenceUpdate&& u) mutable {
      inner(std::move(u));
      std::lock_guard lock(m);
      started = true;
      cv.notify_all();
    });
  }
  std::thread runner([&] { s.run(); });
  {
    std::unique_lock lock(m);
    cv.wait(lock, [&] { return started; });
  }
  s.shutdown(false);
  runner.join();
  for (const auto& x : o) {
    EXPECT_EQ(x.dones, 1);
    EXPECT_EQ(x.last.finish, FinishReason::kCancelled);
    EXPECT_LT(x.tokens.size(), 400u);
  }
  const auto st = s.stats();
  EXPECT_EQ(st.cancelled, 5u);
  EXPECT_EQ(st.running, 0);
  EXPECT_EQ(st.queued, 0);
  EXPECT_EQ(st.kv_pages_in_use, 0);
}

TEST_F(SchedulerTest, RunSleepsWhileIdleAndWakesForASubmit) {
  Scheduler s(*engine_, *tokenizer_);
  std::thread runner([&] { s.run(); });
  std::this_thread::sleep_for(std::chrono::milliseconds(300));
  clockid_t clock;
  ASSERT_EQ(pthread_getcpuclockid(runner.native_handle(), &clock), 0);
  timespec used{};
  ASSERT_EQ(clock_gettime(clock, &used), 0);
  EXPECT_LT(used.tv_sec + used.tv_nsec * 1e-9, 0.05) << "run() spun while idle";
  std::mutex m;
  std::condition_variable cv;
  bool done = false;
  Outcome o;
  s.submit(greedy(prompt(0), 3), [&, inner = collect(o)](SequenceUpdate&& u) mutable {
    std::lock_guard lock(m);
    done |= u.done;
    inner(std::move(u));
    cv.notify_all();
  });
  {
    std::unique_lock lock(m);
    EXPECT_TRUE(cv.wait_for(lock, std::chrono::seconds(60), [&] { return done; }));
  }
  s.shutdown(true);
  runner.join();
  EXPECT_EQ(o.dones, 1);
  EXPECT_EQ(o.tokens.size(), 3u);
}

TEST_F(SchedulerTest, AFailedStepEndsItsSequencesAndTheSchedulerGoesOn) {
  WatchedOps::Log log;
  auto e = load(
      {.make_backend = [&] { return std::make_unique<WatchedOps>(ops::make_cpu_ops(0), &log); }},
      2);
  Scheduler s(*e, *tokenizer_);
  Outcome a, b, c;
  s.submit(greedy(prompt(0), 50), collect(a));
  s.submit(greedy(prompt(1), 50), collect(b));
  ASSERT_TRUE(s.step());
  log.fail_next_step = true;
  ASSERT_TRUE(s.step());
  for (const Outcome* o : {&a, &b}) {
    EXPECT_EQ(o->dones, 1);
    EXPECT_EQ(o->last.finish, FinishReason::kError);
    EXPECT_NE(o->last.error.find("injected backend failure"), std::string::npos) << o->last.error;
  }
  EXPECT_EQ(s.stats().running, 0);
  EXPECT_EQ(s.stats().kv_pages_in_use, 0);
  s.submit(greedy(prompt(2), 3), collect(c));
  run_until_idle(s);
  EXPECT_EQ(c.last.finish, FinishReason::kLength);
  EXPECT_EQ(c.tokens.size(), 3u);
}

// --- validation --------------------------------------------------------------------------------

TEST_F(SchedulerTest, InvalidRequestsAreErrorsNamingTheProblem) {
  auto small = load({}, 1, 16);
  Scheduler s(*small, *tokenizer_);
  auto expect_error = [&](SequenceParams p, const std::string& needle) {
    try {
      s.submit(std::move(p), nullptr);
      ADD_FAILURE() << "expected an error containing '" << needle << "'";
    } catch (const QueueFull&) {
      ADD_FAILURE() << "QueueFull instead of a validation error";
    } catch (const Error& e) {
      EXPECT_NE(std::string(e.what()).find(needle), std::string::npos) << e.what();
    }
  };
  expect_error(greedy({}, 4), "empty");
  expect_error(greedy(std::vector<int32_t>(16, 5), 4), "16 tokens");
  auto p = greedy({5, 6, 7}, 4);
  p.stop = {"ok", ""};
  expect_error(p, "stop string 1 is empty");
  p = greedy({5, 6, 7}, 4);
  p.top_logprobs = 21;
  expect_error(p, "top_logprobs");
  p.top_logprobs = -2;
  expect_error(p, "top_logprobs");
  expect_error(greedy({5, -1}, 4), "outside the vocabulary");
  expect_error(greedy({5, 6}, 0), "max_tokens");
  EXPECT_EQ(s.stats().submitted, 0u);
  // The boundary: 15 prompt tokens fit a 16-token context, leaving one generated token.
  Outcome o;
  s.submit(greedy(std::vector<int32_t>(15, 5), 10), collect(o));
  run_until_idle(s);
  EXPECT_EQ(o.last.finish, FinishReason::kLength);
  EXPECT_EQ(o.last.n_generated, 1);
}

TEST_F(SchedulerTest, TheContextFillingUpFinishesAsLength) {
  auto e = load({}, 2, 40);
  Scheduler s(*e, *tokenizer_);
  Outcome o;
  const auto p = prompt(0);
  ASSERT_LT(p.size(), 40u);
  s.submit(greedy(p, 1000), collect(o));
  run_until_idle(s);
  EXPECT_EQ(o.last.finish, FinishReason::kLength);
  EXPECT_EQ(o.last.n_prompt + o.last.n_generated, 40) << "prompt + generated fill the context";
}

// --- threads -----------------------------------------------------------------------------------

TEST_F(SchedulerTest, ConcurrentSubmittersWhileRunning) {
  const MatmulIsaCap cap(ops::cpu::Isa::kAvx2);  // bit-equal batches (see MatmulIsaCap)
  auto e = load({}, 4);
  const int kThreads = 4, kEach = 6;
  // What each gives alone (one at a time), to compare with the concurrent run.
  std::vector<Outcome> alone(kThreads * kEach);
  {
    Scheduler s(*e, *tokenizer_);
    for (int i = 0; i < kThreads * kEach; ++i) {
      s.submit(greedy(prompt(i), 4 + i % 3), collect(alone[i]));
      run_until_idle(s);
    }
  }
  Scheduler s(*e, *tokenizer_, {.max_queue = kThreads * kEach});
  std::thread runner([&] { s.run(); });
  std::vector<Outcome> out(kThreads * kEach);
  std::mutex m;  // guards `out` (the sinks run on the scheduler's thread, the test reads here)
  std::condition_variable cv;
  int done = 0;
  std::vector<std::thread> submitters;
  for (int t = 0; t < kThreads; ++t) {
    submitters.emplace_back([&, t] {
      for (int k = 0; k < kEach; ++k) {
        const int i = t * kEach + k;
        // The last thread cancels every other sequence of its own as soon as it is in.
        const bool cancel = t == kThreads - 1 && k % 2 == 1;
        const uint64_t id = s.submit(greedy(prompt(i), cancel ? 300 : 4 + i % 3),
                                     [&, inner = collect(out[i])](SequenceUpdate&& u) mutable {
                                       std::lock_guard lock(m);
                                       const bool last = u.done;
                                       inner(std::move(u));
                                       if (last) ++done;
                                       cv.notify_all();
                                     });
        if (cancel) s.cancel(id);
        std::this_thread::sleep_for(std::chrono::milliseconds(k % 2));
      }
    });
  }
  for (auto& th : submitters) th.join();
  {
    std::unique_lock lock(m);
    ASSERT_TRUE(
        cv.wait_for(lock, std::chrono::seconds(120), [&] { return done == kThreads * kEach; }));
  }
  s.shutdown(true);
  runner.join();
  int cancelled = 0;
  for (int i = 0; i < kThreads * kEach; ++i) {
    EXPECT_EQ(out[i].dones, 1) << i;
    EXPECT_FALSE(out[i].update_after_done) << i;
    if (i / kEach == kThreads - 1 && i % 2 == 1) {
      EXPECT_EQ(out[i].last.finish, FinishReason::kCancelled) << i;
      EXPECT_LT(out[i].tokens.size(), 300u);
      ++cancelled;
      continue;
    }
    EXPECT_EQ(out[i].last.finish, FinishReason::kLength) << i;
    EXPECT_EQ(out[i].tokens, alone[i].tokens) << i;
    EXPECT_EQ(out[i].text, alone[i].text) << i;
  }
  const auto st = s.stats();
  EXPECT_EQ(st.submitted, uint64_t(kThreads * kEach));
  EXPECT_EQ(st.finished, uint64_t(kThreads * kEach));
  EXPECT_EQ(st.cancelled, uint64_t(cancelled));
  EXPECT_EQ(st.kv_pages_in_use, 0);
}

}  // namespace
}  // namespace qwenrt::gen
