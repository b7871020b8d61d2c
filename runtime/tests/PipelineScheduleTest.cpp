//===- PipelineScheduleTest.cpp - schedules built, checked and timed
//--------===//
//
// Steps are written compactly: "F3" is the forward of micro-batch 3 on the
// rank's only chunk, "B3c5" the backward of micro-batch 3 on chunk 5 (the
// chunk is spelled out whenever the rank holds several, or for a chunk that
// is not the rank's own).
//
//===----------------------------------------------------------------------===//

#include "ernie/runtime/PipelineSchedule.h"

#include <gtest/gtest.h>

#include <sstream>

using namespace ernie::runtime;

namespace {

std::string render(const std::vector<PipelineStep> &steps,
                   const PipelineShape &shape, int64_t rank) {
  std::string out;
  for (const PipelineStep &s : steps) {
    out += out.empty() ? "" : " ";
    out += s.action == PipelineAction::Forward ? 'F' : 'B';
    out += std::to_string(s.microBatch);
    if (shape.virtualStages > 1 || s.chunk != rank)
      out += "c" + std::to_string(s.chunk);
  }
  return out;
}

/// The inverse of render: one rank's steps.
std::vector<PipelineStep> parse(const std::string &text, int64_t rank) {
  std::vector<PipelineStep> steps;
  std::istringstream in(text);
  for (std::string word; in >> word;) {
    PipelineStep s{word[0] == 'F' ? PipelineAction::Forward
                                  : PipelineAction::Backward,
                   rank, 0};
    size_t c = word.find('c');
    s.microBatch = std::stoll(word.substr(1, c - 1));
    if (c != std::string::npos)
      s.chunk = std::stoll(word.substr(c + 1));
    steps.push_back(s);
  }
  return steps;
}

PipelineSchedule parse(const std::vector<std::string> &ranks) {
  PipelineSchedule schedule;
  for (size_t r = 0; r < ranks.size(); ++r)
    schedule.push_back(parse(ranks[r], int64_t(r)));
  return schedule;
}

PipelineSchedule build(ScheduleKind kind, PipelineShape shape) {
  PipelineSchedule schedule;
  std::string err = buildSchedule(kind, shape, schedule);
  EXPECT_EQ(err, "");
  return schedule;
}

void expectOrder(ScheduleKind kind, PipelineShape shape,
                 const std::vector<std::string> &expected) {
  PipelineSchedule schedule = build(kind, shape);
  ASSERT_EQ(schedule.size(), expected.size());
  for (size_t r = 0; r < expected.size(); ++r)
    EXPECT_EQ(render(schedule[r], shape, int64_t(r)), expected[r])
        << scheduleKindName(kind) << ", pipeline rank " << r;
}

ScheduleTimeline simulate(ScheduleKind kind, PipelineShape shape,
                          double forwardCost, double backwardCost) {
  ScheduleTimeline timeline;
  EXPECT_EQ(simulateSchedule(build(kind, shape), shape, forwardCost,
                             backwardCost, timeline),
            "");
  return timeline;
}

TEST(PipelineSchedule, KindNames) {
  const std::pair<const char *, ScheduleKind> names[] = {
      {"FThenB", ScheduleKind::FThenB},
      {"fthenb", ScheduleKind::FThenB},
      {"gpipe", ScheduleKind::FThenB},
      {"1F1B", ScheduleKind::OneFOneB},
      {"1f1b", ScheduleKind::OneFOneB},
      {"interleaved", ScheduleKind::Interleaved},
      {"Interleaved", ScheduleKind::Interleaved},
      {"vpp", ScheduleKind::Interleaved}};
  for (const auto &[name, expected] : names) {
    ScheduleKind kind = ScheduleKind::FThenB;
    EXPECT_TRUE(parseScheduleKind(name, kind)) << name;
    EXPECT_EQ(kind, expected) << name;
  }
  EXPECT_STREQ(scheduleKindName(ScheduleKind::FThenB), "FThenB");
  EXPECT_STREQ(scheduleKindName(ScheduleKind::OneFOneB), "1F1B");
  EXPECT_STREQ(scheduleKindName(ScheduleKind::Interleaved), "interleaved");

  ScheduleKind kind = ScheduleKind::OneFOneB;
  for (const char *bad : {"", "GPipe", "1f1b ", "zero-bubble", "VPP"})
    EXPECT_FALSE(parseScheduleKind(bad, kind)) << bad;
  EXPECT_EQ(kind, ScheduleKind::OneFOneB);
}

TEST(PipelineSchedule, FThenBOrder) {
  const char *everyRank = "F0 F1 F2 F3 F4 F5 F6 F7 B0 B1 B2 B3 B4 B5 B6 B7";
  expectOrder(ScheduleKind::FThenB, {4, 1, 8},
              {everyRank, everyRank, everyRank, everyRank});
}

TEST(PipelineSchedule, OneFOneBOrder) {
  expectOrder(ScheduleKind::OneFOneB, {4, 1, 8},
              {"F0 F1 F2 F3 B0 F4 B1 F5 B2 F6 B3 F7 B4 B5 B6 B7",
               "F0 F1 F2 B0 F3 B1 F4 B2 F5 B3 F6 B4 F7 B5 B6 B7",
               "F0 F1 B0 F2 B1 F3 B2 F4 B3 F5 B4 F6 B5 F7 B6 B7",
               "F0 B0 F1 B1 F2 B2 F3 B3 F4 B4 F5 B5 F6 B6 F7 B7"});
  // Fewer micro-batches than warm-up slots: all forwards, then backwards.
  expectOrder(ScheduleKind::OneFOneB, {4, 1, 2},
              {"F0 F1 B0 B1", "F0 F1 B0 B1", "F0 F1 B0 B1", "F0 B0 F1 B1"});
}

// p = 4, v = 2, m = 8: rank r holds chunks r and r + 4. Forwards take
// micro-batches in groups of 4 through chunk r, then chunk r + 4; backwards
// take the chunks the other way round. Rank 0 warms up with
// (4 - 0 - 1) * 2 + (2 - 1) * 4 = 10 forwards, rank 3 with 4; then
// forward 10 + i alternates with backward i.
TEST(PipelineSchedule, InterleavedOrder) {
  expectOrder(ScheduleKind::Interleaved, {4, 2, 8},
              {"F0c0 F1c0 F2c0 F3c0 F0c4 F1c4 F2c4 F3c4 F4c0 F5c0 "
               "F6c0 B0c4 F7c0 B1c4 F4c4 B2c4 F5c4 B3c4 F6c4 B0c0 F7c4 B1c0 "
               "B2c0 B3c0 B4c4 B5c4 B6c4 B7c4 B4c0 B5c0 B6c0 B7c0",
               "F0c1 F1c1 F2c1 F3c1 F0c5 F1c5 F2c5 F3c5 "
               "F4c1 B0c5 F5c1 B1c5 F6c1 B2c5 F7c1 B3c5 "
               "F4c5 B0c1 F5c5 B1c1 F6c5 B2c1 F7c5 B3c1 "
               "B4c5 B5c5 B6c5 B7c5 B4c1 B5c1 B6c1 B7c1",
               "F0c2 F1c2 F2c2 F3c2 F0c6 F1c6 "
               "F2c6 B0c6 F3c6 B1c6 F4c2 B2c6 F5c2 B3c6 F6c2 B0c2 F7c2 B1c2 "
               "F4c6 B2c2 F5c6 B3c2 F6c6 B4c6 F7c6 B5c6 "
               "B6c6 B7c6 B4c2 B5c2 B6c2 B7c2",
               "F0c3 F1c3 F2c3 F3c3 "
               "F0c7 B0c7 F1c7 B1c7 F2c7 B2c7 F3c7 B3c7 "
               "F4c3 B0c3 F5c3 B1c3 F6c3 B2c3 F7c3 B3c3 "
               "F4c7 B4c7 F5c7 B5c7 F6c7 B6c7 F7c7 B7c7 "
               "B4c3 B5c3 B6c3 B7c3"});
  // m == p: every forward first, as Megatron does.
  expectOrder(ScheduleKind::Interleaved, {2, 2, 2},
              {"F0c0 F1c0 F0c2 F1c2 B0c2 B1c2 B0c0 B1c0",
               "F0c1 F1c1 F0c3 F1c3 B0c3 B1c3 B0c1 B1c1"});
}

TEST(PipelineSchedule, BuiltSchedulesPassTheCheck) {
  for (int64_t p = 1; p <= 5; ++p) {
    for (int64_t m = 1; m <= 12; ++m) {
      std::vector<std::pair<ScheduleKind, PipelineShape>> cases = {
          {ScheduleKind::FThenB, {p, 1, m}},
          {ScheduleKind::OneFOneB, {p, 1, m}}};
      if (m % p == 0)
        for (int64_t v = 2; v <= 3; ++v)
          cases.push_back({ScheduleKind::Interleaved, {p, v, m}});
      for (const auto &[kind, shape] : cases)
        EXPECT_EQ(checkSchedule(build(kind, shape), shape), "")
            << scheduleKindName(kind) << " p=" << p
            << " v=" << shape.virtualStages << " m=" << m;
    }
  }
}

TEST(PipelineSchedule, BuildRejectsBadShapes) {
  struct Case {
    ScheduleKind kind;
    PipelineShape shape;
    const char *error;
  } cases[] = {
      {ScheduleKind::OneFOneB,
       {0, 1, 4},
       "a pipeline needs stages >= 1, not 0"},
      {ScheduleKind::FThenB,
       {2, 0, 4},
       "a pipeline needs virtual_stages >= 1, not 0"},
      {ScheduleKind::Interleaved,
       {2, 2, -1},
       "a pipeline needs micro-batches >= 1, not -1"},
      {ScheduleKind::FThenB,
       {2, 2, 4},
       "FThenB schedule needs virtual_stages = 1, not 2; use interleaved"},
      {ScheduleKind::OneFOneB,
       {4, 3, 8},
       "1F1B schedule needs virtual_stages = 1, not 3; use interleaved"},
      {ScheduleKind::Interleaved,
       {4, 1, 8},
       "interleaved schedule needs virtual_stages >= 2, not 1"},
      {ScheduleKind::Interleaved,
       {4, 2, 6},
       "interleaved schedule needs micro-batches (6) divisible by stages (4)"},
  };
  for (const Case &c : cases) {
    PipelineSchedule schedule;
    EXPECT_EQ(buildSchedule(c.kind, c.shape, schedule), c.error);
  }
}

// 1F1B, p = 2, m = 2, forward 1, backward 2: every interval by hand.
TEST(ScheduleSimulation, TimesEveryStep) {
  PipelineShape shape{2, 1, 2};
  ScheduleTimeline t = simulate(ScheduleKind::OneFOneB, shape, 1, 2);
  auto intervals = [&](int64_t r) {
    std::string out;
    for (const TimedStep &s : t.ranks[r])
      out += render({s.step}, shape, r) + "@" + std::to_string(int(s.start)) +
             "-" + std::to_string(int(s.end)) + " ";
    return out;
  };
  ASSERT_EQ(t.ranks.size(), 2u);
  EXPECT_EQ(intervals(0), "F0@0-1 F1@1-2 B0@4-6 B1@7-9 ");
  EXPECT_EQ(intervals(1), "F0@1-2 B0@2-4 F1@4-5 B1@5-7 ");
  EXPECT_EQ(t.makespan, 9);
  EXPECT_EQ(t.busy, 12);
  EXPECT_DOUBLE_EQ(t.bubbleFraction, 1.0 / 3);
}

// The cost model's form: per-chunk costs and a transfer on every
// dependency that crosses pipeline ranks. 1F1B, p = 2, m = 2, forward 1,
// backward 2, transfer 0.5, by hand: rank 1's F0 waits for rank 0's F0
// (1) plus the transfer, rank 0's B0 for rank 1's B0 (4.5) plus it.
TEST(ScheduleSimulation, TransfersDelayCrossRankDependencies) {
  PipelineShape shape{2, 1, 2};
  PipelineSchedule schedule;
  ASSERT_EQ(buildSchedule(ScheduleKind::OneFOneB, shape, schedule), "");
  ScheduleTimeline t;
  ASSERT_EQ(simulateSchedule(schedule, shape, StepCosts{{1, 1}, {2, 2}, 0.5}, t),
            "");
  auto starts = [&](int64_t r) {
    std::vector<double> out;
    for (const TimedStep &s : t.ranks[r])
      out.push_back(s.start);
    return out;
  };
  EXPECT_EQ(starts(0), (std::vector<double>{0, 1, 5, 8}));
  EXPECT_EQ(starts(1), (std::vector<double>{1.5, 2.5, 4.5, 5.5}));
  EXPECT_EQ(t.makespan, 10);
}

// Ranks on shared processors (StepCosts::speedup): a step runs twice as
// fast while the other rank idles. 1F1B, p = 2, m = 2, forward 1, backward
// 2, no transfer, by hand: F0:0 alone [0, 0.5]; F0:1 and F1:0 together
// [0.5, 1.5]; B1:0 alone [1.5, 2.5]; B0:0 [2.5, 4.5] beside F1:1
// [2.5, 3.5] and half of B1:1, whose other half runs alone [4.5, 5];
// B0:1 alone [5, 6]. A speed-up of 1 is the plain simulation.
TEST(ScheduleSimulation, SharedProcessorsSpeedUpStepsWhileOthersIdle) {
  PipelineShape shape{2, 1, 2};
  PipelineSchedule schedule;
  ASSERT_EQ(buildSchedule(ScheduleKind::OneFOneB, shape, schedule), "");
  ScheduleTimeline plain, same, shared;
  StepCosts costs{{1, 1}, {2, 2}, 0.5};
  ASSERT_EQ(simulateSchedule(schedule, shape, costs, plain), "");
  costs.speedup = [](int64_t) { return 1.0; };
  ASSERT_EQ(simulateSchedule(schedule, shape, costs, same), "");
  EXPECT_DOUBLE_EQ(same.makespan, plain.makespan);
  EXPECT_DOUBLE_EQ(same.busy, plain.busy);

  costs = StepCosts{{1, 1}, {2, 2}, 0};
  costs.speedup = [](int64_t busy) { return busy == 1 ? 2.0 : 1.0; };
  ASSERT_EQ(simulateSchedule(schedule, shape, costs, shared), "");
  auto spans = [&](int64_t r) {
    std::vector<std::pair<double, double>> out;
    for (const TimedStep &s : shared.ranks[r])
      out.emplace_back(s.start, s.end);
    return out;
  };
  using Spans = std::vector<std::pair<double, double>>;
  EXPECT_EQ(spans(0), (Spans{{0, 0.5}, {0.5, 1.5}, {2.5, 4.5}, {5, 6}}));
  EXPECT_EQ(spans(1), (Spans{{0.5, 1.5}, {1.5, 2.5}, {2.5, 3.5}, {3.5, 5}}));
  EXPECT_DOUBLE_EQ(shared.makespan, 6);
}

// Chunks of different costs (the last stage's head and loss): the slower
// chunk sets the steady state. FThenB, p = 2, m = 3, chunk 1 twice chunk 0.
TEST(ScheduleSimulation, PerChunkCosts) {
  PipelineShape shape{2, 1, 3};
  PipelineSchedule schedule;
  ASSERT_EQ(buildSchedule(ScheduleKind::FThenB, shape, schedule), "");
  ScheduleTimeline t;
  ASSERT_EQ(simulateSchedule(schedule, shape, StepCosts{{1, 2}, {1, 2}, 0}, t),
            "");
  // Rank 1: F at 1, 3, 5 (each 2), B at 7, 9, 11 (each 2); rank 0's B
  // follow at 9, 11, 13.
  EXPECT_EQ(t.makespan, 14);
  EXPECT_EQ(t.busy, 3 * (1 + 1) + 3 * (2 + 2));
}

TEST(ScheduleSimulation, PerChunkCostsMustMatchTheChunks) {
  PipelineShape shape{2, 2, 4};
  PipelineSchedule schedule;
  ASSERT_EQ(buildSchedule(ScheduleKind::Interleaved, shape, schedule), "");
  ScheduleTimeline t;
  EXPECT_EQ(simulateSchedule(schedule, shape, StepCosts{{1, 1}, {2, 2}, 0}, t),
            "step costs are given for 2 forward and 2 backward chunks but the "
            "pipeline has 4");
  EXPECT_EQ(simulateSchedule(schedule, shape,
                             StepCosts{{1, 1, 1, 1}, {2, 2, 2, 2}, -1}, t),
            "step costs must be finite and non-negative");
}

// With forward 1 and backward 2, FThenB and 1F1B both idle (p - 1) * 3 of
// every rank's (m + p - 1) * 3.
TEST(ScheduleSimulation, FThenBAnd1F1BBubble) {
  const std::pair<int64_t, int64_t> shapes[] = {
      {1, 1}, {1, 5}, {2, 1}, {2, 4}, {3, 7}, {4, 3}, {4, 8}, {5, 12}, {4, 32}};
  for (ScheduleKind kind : {ScheduleKind::FThenB, ScheduleKind::OneFOneB}) {
    for (auto [p, m] : shapes) {
      SCOPED_TRACE(::testing::Message()
                   << scheduleKindName(kind) << " p=" << p << " m=" << m);
      ScheduleTimeline t = simulate(kind, {p, 1, m}, 1, 2);
      EXPECT_EQ(t.makespan, 3.0 * (m + p - 1));
      EXPECT_EQ(t.busy, 3.0 * m * p);
      EXPECT_NEAR(t.bubbleFraction, double(p - 1) / double(m + p - 1), 1e-12);
    }
  }
}

// With every chunk costing 1/v of a stage, interleaving divides 1F1B's
// bubble time (p - 1) * (tf + tb) by v.
TEST(ScheduleSimulation, InterleavedDividesTheBubbleByVirtualStages) {
  const double tf = 1, tb = 2;
  const PipelineShape shapes[] = {{4, 2, 8}, {4, 2, 4},  {4, 2, 16}, {2, 3, 6},
                                  {3, 2, 9}, {4, 4, 12}, {5, 3, 10}, {1, 2, 3}};
  for (const PipelineShape &shape : shapes) {
    const int64_t p = shape.stages, v = shape.virtualStages,
                  m = shape.microBatches;
    SCOPED_TRACE(::testing::Message() << "p=" << p << " v=" << v << " m=" << m);
    ScheduleTimeline t =
        simulate(ScheduleKind::Interleaved, shape, tf / v, tb / v);
    EXPECT_NEAR(t.makespan - m * (tf + tb), (p - 1) * (tf + tb) / v, 1e-12);
    EXPECT_NEAR(t.busy, p * m * (tf + tb), 1e-12);
  }
}

// Rank 0 waits for micro-batch 0's gradient before sending micro-batch 1's
// activation, which rank 1 wants first.
TEST(ScheduleCheck, NamesEveryRankOfADeadlock) {
  PipelineShape shape{2, 1, 2};
  PipelineSchedule schedule = parse({"F0 B0 F1 B1", "F0 F1 B0 B1"});
  const std::string expected =
      "schedule deadlocks: pipeline rank 0 waits at its step 1 (backward of "
      "chunk 0, micro-batch 0) for the backward of chunk 1, micro-batch 0 on "
      "pipeline rank 1, which waits at its step 1; pipeline rank 1 waits at "
      "its step 1 (forward of chunk 1, micro-batch 1) for the forward of "
      "chunk 0, micro-batch 1 on pipeline rank 0, which waits at its step 1";
  EXPECT_EQ(checkSchedule(schedule, shape), expected);
  ScheduleTimeline t;
  EXPECT_EQ(simulateSchedule(schedule, shape, 1, 2, t), expected);
}

TEST(ScheduleCheck, BackwardBeforeItsForwardDeadlocks) {
  EXPECT_EQ(checkSchedule(parse({"F0 B1 F1 B0"}), {1, 1, 2}),
            "schedule deadlocks: pipeline rank 0 waits at its step 1 "
            "(backward of chunk 0, micro-batch 1) for the forward of chunk 0, "
            "micro-batch 1, its own step 2");
}

TEST(ScheduleCheck, RejectsMalformedSchedules) {
  PipelineShape shape{2, 1, 2};
  const char *rank1 = "F0 B0 F1 B1";
  struct Case {
    std::vector<std::string> ranks;
    const char *error;
  } cases[] = {
      {{rank1}, "the schedule lists 1 pipeline ranks but the pipeline has 2"},
      {{"F0 F1 B0", rank1},
       "pipeline rank 0 never runs the backward of chunk 0, micro-batch 1"},
      {{"F0 F1", "F0 B0 F1"},
       "pipeline rank 0 never runs the backward of chunk 0, micro-batch 0 "
       "(and 2 more steps are missing)"},
      {{"F0 F1 B0 F1 B1", rank1},
       "pipeline rank 0, step 3: the forward of chunk 0, micro-batch 1 is "
       "listed again (first at step 1)"},
      {{"F0 F1 B0c1 B1", rank1},
       "pipeline rank 0, step 2: chunk 1 runs on pipeline rank 1"},
      {{"F0 F1 B0 B1c2", rank1},
       "pipeline rank 0, step 3: chunk 2 is out of range (2 chunks)"},
      {{"F0 F1 B0 B1", "F0 B0 F2 B1"},
       "pipeline rank 1, step 2: micro-batch 2 is out of range (2 "
       "micro-batches)"},
  };
  for (const Case &c : cases)
    EXPECT_EQ(checkSchedule(parse(c.ranks), shape), c.error);
  EXPECT_EQ(checkSchedule(parse({rank1}), {0, 1, 2}),
            "a pipeline needs stages >= 1, not 0");
  ScheduleTimeline t;
  EXPECT_EQ(simulateSchedule(parse({rank1, rank1}), shape, 1, -2, t),
            "step costs must be finite and non-negative");
}

} // namespace
