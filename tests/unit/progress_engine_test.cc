// The progress engine (core/progress_engine.hpp) against sources that record what it asks of
// them: the waiter protocol (attend, pollBegin/pollEnd, waiting) hands a source back exactly when
// the last thread leaves it or one goes to sleep, keeps its counts where writers read them, and
// wakes a wake-word engine only for work; a wake-word engine's thread sleeps on its word and
// runs its start and exit hooks on itself.
#include "core/progress_engine.hpp"

#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <thread>

#include "core/futex.hpp"
#include "loom/loom.hpp"

namespace loom {
namespace {

class Recorder : public ProgressSource {
 public:
  bool progress() noexcept override {
    progressed.fetch_add(1);
    if (work.load() > 0) {
      work.fetch_sub(1);
      return true;
    }
    return false;
  }
  bool needsEngine() const noexcept override { return !polled() && engineWork.load(); }
  bool hasWork() const noexcept override { return work.load() > 0 || engineWork.load(); }
  void maintain() noexcept override { maintained.fetch_add(1); }
  void resume(bool sleeper) noexcept override { (sleeper ? resumedForSleeper : resumedAfterPoll).fetch_add(1); }

  std::atomic<int> work{0};  // units progress() takes, one per call
  std::atomic<bool> engineWork{false};
  std::atomic<int> progressed{0};
  std::atomic<int> maintained{0};
  std::atomic<int> resumedForSleeper{0};
  std::atomic<int> resumedAfterPoll{0};
};

// What a wake word lives in: memory a peer would share.
struct Word {
  std::atomic<uint32_t> word{0}, sleepers{0}, attending{0}, waiters{0};
  WakeWord wake() { return WakeWord{&word, &sleepers, &attending, &waiters}; }
};

bool eventually(const std::function<bool()>& cond) {
  const auto until = std::chrono::steady_clock::now() + std::chrono::seconds(10);
  while (!cond()) {
    if (std::chrono::steady_clock::now() > until) return false;
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
  }
  return true;
}

TEST(ProgressEngine, LastPollerOutHandsTheSourceBack) {
  ProgressEngine engine(0);
  Recorder a, b;
  engine.add(&a);
  engine.add(&b);
  engine.seal();
  EXPECT_EQ(a.engine(), &engine);
  engine.pollBegin(a, true);
  engine.pollBegin(a, false);
  EXPECT_TRUE(a.polled());
  EXPECT_FALSE(b.polled());
  engine.pollEnd(a, false);
  EXPECT_TRUE(a.polled());
  EXPECT_EQ(a.resumedAfterPoll.load(), 0) << "handed back while a thread still polls it";
  engine.pollEnd(a, true);
  EXPECT_FALSE(a.polled());
  EXPECT_EQ(a.resumedAfterPoll.load(), 1);
  EXPECT_EQ(b.resumedAfterPoll.load(), 0) << "only the source polled is handed back";
  EXPECT_EQ(a.resumedForSleeper.load() + b.resumedForSleeper.load(), 0);
}

TEST(ProgressEngine, ASleepingWaiterResumesEverySource) {
  ProgressEngine engine(0);
  Recorder a, b;
  engine.add(&a);
  engine.add(&b);
  engine.seal();
  EXPECT_EQ(engine.waitersAsleep(), 0u);
  engine.waiting(true);
  EXPECT_EQ(engine.waitersAsleep(), 1u);
  EXPECT_EQ(a.resumedForSleeper.load(), 1);
  EXPECT_EQ(b.resumedForSleeper.load(), 1);
  engine.waiting(true);
  EXPECT_EQ(engine.waitersAsleep(), 2u);
  engine.waiting(false);
  engine.waiting(false);
  EXPECT_EQ(engine.waitersAsleep(), 0u);
  // Descriptors need no hand-over when an attending thread leaves: the kernel keeps readiness.
  engine.attend(true);
  engine.attend(false);
  EXPECT_EQ(a.progressed.load(), 0);
}

TEST(ProgressEngine, AttendingCountsLiveInTheWordsMemory) {
  Word w;
  ProgressEngine engine(0, w.wake());
  Recorder a;
  engine.add(&a);
  engine.seal();
  engine.attend(true);
  engine.pollBegin(a, true);  // a thread outside any attended operation counts too
  EXPECT_EQ(w.attending.load(), 2u);
  engine.pollEnd(a, true);
  engine.attend(false);
  EXPECT_EQ(w.attending.load(), 0u);
  engine.waiting(true);
  EXPECT_EQ(w.waiters.load(), 1u);
  engine.waiting(false);
  EXPECT_EQ(w.waiters.load(), 0u);
}

TEST(ProgressEngine, LastAttendingThreadOutTakesInWorkAndWakesForTheRest) {
  Word w;
  ProgressEngine engine(0, w.wake());  // not started: only the hand-over runs
  Recorder idle, busy;
  engine.add(&idle);
  engine.add(&busy);
  engine.seal();
  engine.attend(true);
  engine.attend(true);
  busy.work = 3;
  engine.attend(false);
  EXPECT_EQ(busy.progressed.load(), 0) << "handed over while another thread still attends";
  engine.attend(false);
  EXPECT_EQ(busy.progressed.load(), 1) << "the leaving thread takes in what is there";
  EXPECT_EQ(idle.progressed.load(), 0) << "a source with nothing to move is not polled";
  EXPECT_EQ(w.word.load(), 0u) << "woke the engine for work no one but the engine must do";
  busy.engineWork = true;
  engine.attend(true);
  engine.attend(false);
  EXPECT_EQ(w.word.load(), 1u) << "left work only the engine does without ringing";
}

TEST(ProgressEngine, ASleepingWaiterWakesAWordEngineOnlyForWork) {
  Word w;
  ProgressEngine engine(0, w.wake());
  Recorder a;
  engine.add(&a);
  engine.seal();
  engine.waiting(true);
  engine.waiting(false);
  EXPECT_EQ(w.word.load(), 0u);
  a.work = 1;
  engine.waiting(true);
  EXPECT_EQ(w.word.load(), 1u);
  engine.waiting(false);
  // Another thread attending will hand over itself: no ring meanwhile.
  engine.attend(true);
  engine.waiting(true);
  EXPECT_EQ(w.word.load(), 1u);
  engine.waiting(false);
  engine.attend(false);
}

TEST(ProgressEngine, WordEngineSleepsOnItsWordAndRunsItsHooksOnItsThread) {
  Word w;
  ProgressEngine engine(0, w.wake());
  Recorder a;
  engine.add(&a);
  std::atomic<std::thread::id> startedOn{}, exitedOn{};
  engine.start([&] { startedOn = std::this_thread::get_id(); }, [&] { exitedOn = std::this_thread::get_id(); });
  EXPECT_NE(startedOn.load(), std::thread::id{}) << "start() returned before the start hook ran";
  EXPECT_NE(startedOn.load(), std::this_thread::get_id());
  ASSERT_TRUE(eventually([&] { return w.sleepers.load() == 1; })) << "the engine never slept on its word";
  const int before = a.progressed.load();
  a.work = 5;
  w.word.fetch_add(1);
  futexWakeAll(&w.word);
  ASSERT_TRUE(eventually([&] { return a.work.load() == 0; })) << "a ring did not wake the engine";
  EXPECT_GE(a.progressed.load() - before, 5);
  ASSERT_TRUE(eventually([&] { return a.maintained.load() > 0; })) << "no maintenance while asleep";
  engine.stop();
  engine.stop();  // idempotent
  EXPECT_EQ(exitedOn.load(), startedOn.load());
}

TEST(ProgressEngine, SourcesAreFixedOnceSealed) {
  ProgressEngine engine(0);
  Recorder a;
  engine.seal();
  EXPECT_THROW(engine.add(&a), Error);
}

}  // namespace
}  // namespace loom
