//===- PipelineExecutionTest.cpp - pipelined programs, run ------------------===//
//
// Pipelined programs built by hand (ProgramBuilder.h) on a [dp, pp] mesh and
// run through a Session (threads), through RankRunners on threads, and on
// Gloo. The model: C chunks, chunk c multiplies its input rows elementwise by
// a parameter vector w<c> (and, with `tied`, chunks 0 and C-1 also by a
// parameter "tied" both stages hold); the loss of a micro-batch is
// sum(h_C * y). Gradients go back through ernie.send / ernie.recv, are
// summed over the data-parallel axis inside each backward, over micro-batches
// by the runtime, and over the tied copies by ernie.stage_all_reduce; the
// update is SGD with momentum. Expectations come from a plain double-precision
// forward and backward written here; values are dyadic and small, so every
// sum is exact whatever its order and schedules must agree bit for bit.
//
//===----------------------------------------------------------------------===//

#include "CollectiveChecks.h"
#include "ProgramBuilder.h"

#include "ernie/runtime/Executor.h"
#include "ernie/runtime/GlooCommunicator.h"
#include "ernie/runtime/HostTensor.h"
#include "ernie/runtime/PipelineSchedule.h"
#include "ernie/runtime/Session.h"
#include "ernie/runtime/ThreadCommunicator.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <map>
#include <unistd.h>

using namespace ernie::runtime;
using namespace ernie::runtime::testing;
using ::testing::HasSubstr;
using Shape = std::vector<int64_t>;

namespace {

constexpr int64_t kFeatures = 2; // d
constexpr int64_t kRows = 4;     // a micro-batch's rows (global)
constexpr int64_t kDp = 2;
constexpr double kMomentum = 0.5;

struct Model {
  int64_t stages = 2, virtualStages = 1, microBatches = 4;
  ScheduleKind kind = ScheduleKind::OneFOneB;
  bool tied = false;
  /// The backward of this chunk fails (an integer division by zero) after
  /// it received its gradient.
  int64_t failingChunk = -1;
  int64_t chunks() const { return stages * virtualStages; }
  bool isTied(int64_t c) const {
    return tied && (c == 0 || c == chunks() - 1);
  }
};

std::string weight(int64_t c) { return "w" + std::to_string(c); }

PipelineSchedule scheduleOf(const Model &model) {
  PipelineShape shape;
  shape.stages = model.stages;
  shape.virtualStages = model.virtualStages;
  shape.microBatches = model.microBatches;
  PipelineSchedule schedule;
  std::string error = buildSchedule(model.kind, shape, schedule);
  EXPECT_EQ(error, "");
  return schedule;
}

/// The model's program; `edit` may change the builder before it is written.
ProgramBuilder modelBuilder(const Model &model) {
  const int64_t S = model.stages, C = model.chunks(), m = model.microBatches;
  const int64_t rows = kRows / kDp, d = kFeatures;
  const DType f32 = DType::F32;
  ProgramBuilder pb({"dp", "pp"}, {kDp, S});
  pb.stageAxis("pp").pipeline(m, model.virtualStages,
                              scheduleKindName(model.kind));
  PipelineSchedule schedule = scheduleOf(model);
  for (int64_t s = 0; s < S; ++s)
    pb.schedule(s, schedule[s]);
  const Tensor split = Tensor().split({{"dp"}, {}});
  const int64_t tiedChannel = 2 * C, initChannel = 2 * C + 1;
  const std::vector<int64_t> tiedStages = {0, S - 1};

  // w (and the tied parameter): their buffers and the multiplier v.
  struct Weights {
    uint32_t w, t = 0, v;
  };
  auto weights = [&](FunctionBuilder &f, int64_t c) {
    Weights out;
    out.w = f.buffer(f32, {d});
    f.arg(out.w, Tensor().named(weight(c)).as(Role::Parameter));
    out.v = out.w;
    if (model.isTied(c)) {
      out.t = f.buffer(f32, {d});
      f.arg(out.t, Tensor().named("tied").as(Role::Parameter));
      out.v = f.buffer(f32, {d});
      f.op("ernie.mul", {out.w, out.t}, {out.v});
    }
    return out;
  };
  auto rowsTimes = [&](FunctionBuilder &f, uint32_t x, uint32_t v) {
    uint32_t vb = f.buffer(f32, {rows, d}), y = f.buffer(f32, {rows, d});
    f.op("ernie.broadcast", {v}, {vb}, {{"dims", std::vector<int64_t>{1}}});
    f.op("ernie.mul", {x, vb}, {y});
    return y;
  };

  for (int64_t c = 0; c < C; ++c) {
    const int64_t s = c % S;
    for (bool train : {true, false}) {
      FunctionBuilder &f = pb.function(
          pipelineFunction(train ? "train_forward" : "eval_forward", c), s);
      Weights w = weights(f, c);
      uint32_t h = f.buffer(f32, {rows, d});
      if (c == 0)
        f.arg(h, Tensor(split).named("input.0"));
      else
        f.op("ernie.recv", {}, {h}, {{"peer", c - 1}, {"channel", c}});
      uint32_t next = rowsTimes(f, h, w.v);
      if (c < C - 1) {
        f.op("ernie.send", {next}, {}, {{"peer", c + 1}, {"channel", c + 1}});
      } else {
        uint32_t y = f.buffer(f32, {rows, d}), p = f.buffer(f32, {rows, d}),
                 local = f.buffer(f32, {}), loss = f.buffer(f32, {});
        f.arg(y, Tensor(split).named("input.1"))
            .op("ernie.mul", {next, y}, {p})
            .op("ernie.reduce_sum", {p}, {local},
                {{"axes", std::vector<int64_t>{0, 1}}})
            .op("ernie.all_reduce", {local}, {loss}, {{"kind", std::string("sum")}},
                {"dp"})
            .ret(loss, Tensor().as(Role::Loss));
      }
      if (train)
        f.ret(h, Tensor(split).named("residual.0").as(Role::Residual));
    }

    FunctionBuilder &b = pb.function(pipelineFunction("train_backward", c), s);
    Weights w = weights(b, c);
    uint32_t h = b.buffer(f32, {rows, d}), g = b.buffer(f32, {rows, d});
    b.arg(h, Tensor(split).named("residual.0").as(Role::Residual));
    if (c == C - 1)
      b.arg(g, Tensor(split).named("input.1"));
    else
      b.op("ernie.recv", {}, {g}, {{"peer", c + 1}, {"channel", C + c}});
    if (c == model.failingChunk) {
      uint32_t one = b.buffer(DType::I64, {}), zero = b.buffer(DType::I64, {}),
               q = b.buffer(DType::I64, {});
      b.constant(one, std::vector<int64_t>{1})
          .constant(zero, std::vector<int64_t>{0})
          .op("ernie.div", {one, zero}, {q}, {}, {}, "model.py:7:3");
    }
    uint32_t gh = b.buffer(f32, {rows, d}), local = b.buffer(f32, {d}),
             sum = b.buffer(f32, {d});
    b.op("ernie.mul", {g, h}, {gh})
        .op("ernie.reduce_sum", {gh}, {local}, {{"axes", std::vector<int64_t>{0}}})
        .op("ernie.all_reduce", {local}, {sum}, {{"kind", std::string("sum")}},
            {"dp"});
    if (model.isTied(c)) {
      uint32_t gw = b.buffer(f32, {d}), gt = b.buffer(f32, {d});
      b.op("ernie.mul", {sum, w.t}, {gw})
          .op("ernie.mul", {sum, w.w}, {gt})
          .ret(gw, Tensor().named(weight(c)).as(Role::Gradient))
          .ret(gt, Tensor().named("tied").as(Role::Gradient));
    } else {
      b.ret(sum, Tensor().named(weight(c)).as(Role::Gradient));
    }
    if (c > 0)
      b.op("ernie.send", {rowsTimes(b, g, w.v)}, {},
           {{"peer", c - 1}, {"channel", C + c - 1}});
  }

  for (int64_t s = 0; s < S; ++s) {
    FunctionBuilder &u = pb.function(pipelineFunction("train_update", s), s);
    uint32_t lr = u.buffer(f32, {}), step = u.buffer(DType::I64, {});
    u.arg(lr, Tensor().as(Role::LearningRate)).arg(step, Tensor().as(Role::Step));
    uint32_t count = u.buffer(f32, {d});
    u.constant(count, std::vector<float>(d, float(m)));
    // SGD with momentum on the mean gradient of `name`, from `g`.
    auto sgd = [&](const std::string &name, uint32_t g) {
      uint32_t w = u.buffer(f32, {d}), mom = u.buffer(f32, {d}),
               mean = u.buffer(f32, {d}), w2 = u.buffer(f32, {d}),
               mom2 = u.buffer(f32, {d});
      u.arg(w, Tensor().named(name).as(Role::Parameter))
          .arg(mom, Tensor().named(name + ":momentum").as(Role::OptimizerState))
          .op("ernie.div", {g, count}, {mean})
          .op("ernie.sgd_update", {w, mean, mom, lr}, {w2, mom2},
              {{"momentum", kMomentum}})
          .ret(w2, Tensor().updating(name))
          .ret(mom2, Tensor().updating(name + ":momentum"));
    };
    for (int64_t c = s; c < C; c += S) {
      uint32_t g = u.buffer(f32, {d});
      u.arg(g, Tensor().named(weight(c)).as(Role::Gradient));
      sgd(weight(c), g);
    }
    if (model.tied && (s == 0 || s == S - 1)) {
      uint32_t g = u.buffer(f32, {d}), all = u.buffer(f32, {d});
      u.arg(g, Tensor().named("tied").as(Role::Gradient))
          .op("ernie.stage_all_reduce", {g}, {all},
              {{"stages", tiedStages}, {"channel", tiedChannel}});
      sgd("tied", all);

      FunctionBuilder &init = pb.function(pipelineFunction("init", s), s);
      uint32_t t = init.buffer(f32, {d}), out = init.buffer(f32, {d});
      init.arg(t, Tensor().named("tied").as(Role::Parameter))
          .op("ernie.stage_broadcast", {t}, {out},
              {{"stages", tiedStages}, {"channel", initChannel}})
          .ret(out, Tensor().as(Role::Parameter).updating("tied"));
    }
  }
  return pb;
}

Program modelProgram(const Model &model) { return modelBuilder(model).parse(); }

//===----------------------------------------------------------------------===//
// The reference
//===----------------------------------------------------------------------===//

using Values = std::vector<double>;

/// A batch: x and y, each [m * kRows, kFeatures] of small integers.
struct Batch {
  Values x, y;
  int64_t rows;
};

Batch batchOf(int64_t microBatches, int seed) {
  Batch b;
  b.rows = microBatches * kRows;
  for (int64_t i = 0; i < b.rows * kFeatures; ++i) {
    b.x.push_back(double((i * 7 + seed * 3) % 5) - 2.0);  // -2 .. 2
    b.y.push_back(double((i * 5 + seed + 1) % 3) - 1.0);  // -1 .. 1
  }
  return b;
}

HostTensor tensorOf(const Values &v, const Shape &shape) {
  HostTensor t(DType::F32, shape);
  for (size_t i = 0; i < v.size(); ++i)
    t.as<float>()[i] = float(v[i]);
  return t;
}

std::vector<HostTensor> inputsOf(const Batch &b) {
  return {tensorOf(b.x, {b.rows, kFeatures}), tensorOf(b.y, {b.rows, kFeatures})};
}

/// The model's state by name, and one step of it in f64.
struct Reference {
  Model model;
  std::map<std::string, Values> state;

  explicit Reference(const Model &m) : model(m) {
    for (int64_t c = 0; c < m.chunks(); ++c) {
      state[weight(c)] = initialWeight(c);
      state[weight(c) + ":momentum"] = Values(kFeatures, 0.0);
    }
    if (m.tied) {
      state["tied"] = initialTied();
      state["tied:momentum"] = Values(kFeatures, 0.0);
    }
  }
  static Values initialWeight(int64_t c) {
    static const double choices[] = {0.5, -1.0, 2.0, 1.0, -0.5, 0.25};
    return {choices[c % 6], choices[(c + 3) % 6]};
  }
  static Values initialTied() { return {2.0, -0.5}; }

  Values multiplier(int64_t c) const {
    Values v = state.at(weight(c));
    if (model.isTied(c))
      for (int64_t j = 0; j < kFeatures; ++j)
        v[j] *= state.at("tied")[j];
    return v;
  }

  /// Micro-batch k's loss; adds its gradients to `grads` when given.
  double microBatch(const Batch &b, int64_t k,
                    std::map<std::string, Values> *grads) const {
    const int64_t C = model.chunks();
    std::vector<Values> h(C + 1);
    h[0].assign(b.x.begin() + k * kRows * kFeatures,
                b.x.begin() + (k + 1) * kRows * kFeatures);
    Values y(b.y.begin() + k * kRows * kFeatures,
             b.y.begin() + (k + 1) * kRows * kFeatures);
    for (int64_t c = 0; c < C; ++c) {
      Values v = multiplier(c);
      h[c + 1] = h[c];
      for (size_t i = 0; i < h[c + 1].size(); ++i)
        h[c + 1][i] *= v[i % kFeatures];
    }
    double loss = 0;
    for (size_t i = 0; i < y.size(); ++i)
      loss += h[C][i] * y[i];
    if (!grads)
      return loss;
    Values g = y;
    for (int64_t c = C - 1; c >= 0; --c) {
      Values gh(kFeatures, 0.0);
      for (size_t i = 0; i < g.size(); ++i)
        gh[i % kFeatures] += g[i] * h[c][i];
      Values &gw = (*grads)[weight(c)];
      gw.resize(kFeatures, 0.0);
      for (int64_t j = 0; j < kFeatures; ++j)
        gw[j] += model.isTied(c) ? gh[j] * state.at("tied")[j] : gh[j];
      if (model.isTied(c)) {
        Values &gt = (*grads)["tied"];
        gt.resize(kFeatures, 0.0);
        for (int64_t j = 0; j < kFeatures; ++j)
          gt[j] += gh[j] * state.at(weight(c))[j];
      }
      Values v = multiplier(c);
      for (size_t i = 0; i < g.size(); ++i)
        g[i] *= v[i % kFeatures];
    }
    return loss;
  }

  double train(const Batch &b, double lr) {
    std::map<std::string, Values> grads;
    double sum = 0;
    for (int64_t k = 0; k < model.microBatches; ++k)
      sum += microBatch(b, k, &grads);
    for (const auto &[name, g] : grads) {
      Values &w = state[name], &mom = state[name + ":momentum"];
      for (int64_t j = 0; j < kFeatures; ++j) {
        double mean = g[j] / double(model.microBatches);
        double step = kMomentum * mom[j] + mean;
        mom[j] = step;
        w[j] -= double(float(lr)) * step;
      }
    }
    return sum / double(model.microBatches);
  }

  double eval(const Batch &b) const {
    double sum = 0;
    for (int64_t k = 0; k < model.microBatches; ++k)
      sum += microBatch(b, k, nullptr);
    return sum / double(model.microBatches);
  }
};

/// The reference's initial values, as a StateSource.
StateSource referenceSource(const Model &model) {
  return [model](const TensorSpec &spec) -> std::optional<HostTensor> {
    Reference ref(model);
    auto it = ref.state.find(spec.name);
    if (it == ref.state.end() || spec.role != Role::Parameter)
      return std::nullopt;
    return tensorOf(it->second, {kFeatures});
  };
}

/// `got` equals the f64 `want` rounded once, and the rounding is exact (the
/// test's values are meant to keep every sum exact).
::testing::AssertionResult exactly(const HostTensor &got, const Values &want) {
  if (got.type != DType::F32 || got.numElements() != int64_t(want.size()))
    return ::testing::AssertionFailure() << "wrong type or size";
  for (size_t i = 0; i < want.size(); ++i) {
    if (double(float(want[i])) != want[i])
      return ::testing::AssertionFailure()
             << "the reference " << want[i] << " is not exact in f32";
    if (got.as<float>()[i] != float(want[i]))
      return ::testing::AssertionFailure()
             << "element " << i << ": got " << got.as<float>()[i] << ", want "
             << want[i];
  }
  return ::testing::AssertionSuccess();
}

float lossOf(const std::vector<HostTensor> &results) {
  EXPECT_EQ(results.size(), 1u);
  EXPECT_EQ(results[0].type, DType::F32);
  EXPECT_EQ(results[0].shape, Shape{});
  return results[0].as<float>()[0];
}

SessionOptions quick() {
  SessionOptions options;
  options.timeout = std::chrono::seconds(10);
  return options;
}

/// Runs `steps` training steps in a Session; checks losses and every state
/// against the reference after each; returns the final state and losses.
struct TrainRun {
  std::vector<float> losses;
  std::map<std::string, HostTensor> state;
  float evalLoss = 0;
};

TrainRun trainAndCheck(const Model &model, int64_t steps = 2) {
  Session session(modelProgram(model), quick());
  session.initState("train_step", referenceSource(model));
  Reference ref(model);
  TrainRun run;
  // Evaluation first, while every value has few bits (exact).
  Batch first = batchOf(model.microBatches, 8);
  EXPECT_EQ(lossOf(session.call("eval_step", inputsOf(first))),
            float(ref.eval(first)));
  for (int64_t step = 1; step <= steps; ++step) {
    Batch batch = batchOf(model.microBatches, int(step));
    double lr = 0.25;
    float loss = lossOf(session.call("train_step", inputsOf(batch), lr, step));
    double want = ref.train(batch, lr);
    EXPECT_EQ(loss, float(want)) << "step " << step;
    EXPECT_EQ(double(float(want)), want);
    run.losses.push_back(loss);
    for (const auto &[name, value] : ref.state)
      EXPECT_TRUE(exactly(session.state("train_step", name), value))
          << name << " after step " << step;
  }
  Batch batch = batchOf(model.microBatches, 9);
  run.evalLoss = lossOf(session.call("eval_step", inputsOf(batch)));
  // Trained weights have more bits: products of every chunk's round in f32.
  EXPECT_NEAR(run.evalLoss, ref.eval(batch), 1e-4);
  for (const auto &entry : ref.state)
    run.state[entry.first] = session.state("eval_step", entry.first);
  return run;
}

std::string loadError(const ProgramBuilder &pb) {
  try {
    pb.parse("pipe.ernie");
  } catch (const ProgramError &e) {
    return e.what();
  }
  ADD_FAILURE() << "the program loaded";
  return "";
}

} // namespace

//===----------------------------------------------------------------------===//
// Training and evaluation against the reference
//===----------------------------------------------------------------------===//

TEST(PipelineExecution, OneFOneBTrainsLikeTheReference) {
  Model model;
  Program program = modelProgram(model);
  ASSERT_TRUE(program.isPipelined());
  EXPECT_EQ(program.numChunks(), 2);
  ASSERT_EQ(program.pipeline()->inputs.size(), 2u);
  EXPECT_EQ(program.pipeline()->inputs[1].globalShape, (Shape{kRows, kFeatures}));
  trainAndCheck(model, 3);
}

TEST(PipelineExecution, FThenBTrainsLikeTheReference) {
  Model model;
  model.kind = ScheduleKind::FThenB;
  model.stages = 3;
  model.microBatches = 8;
  trainAndCheck(model);
}

TEST(PipelineExecution, OneStageIsGradientAccumulation) {
  Model model;
  model.stages = 1;
  model.kind = ScheduleKind::FThenB;
  trainAndCheck(model);
}

TEST(PipelineExecution, EverySchedulesGivesTheSameBits) {
  // Four chunks with a tied parameter: 4 stages (FThenB, 1F1B) or 2 stages
  // of 2 virtual stages (interleaved).
  Model fthenb, onefoneb, interleaved;
  for (Model *m : {&fthenb, &onefoneb, &interleaved}) {
    m->tied = true;
    m->microBatches = 4;
  }
  fthenb.stages = onefoneb.stages = 4;
  fthenb.kind = ScheduleKind::FThenB;
  interleaved.stages = 2;
  interleaved.virtualStages = 2;
  interleaved.kind = ScheduleKind::Interleaved;
  TrainRun a = trainAndCheck(fthenb), b = trainAndCheck(onefoneb),
      c = trainAndCheck(interleaved);
  EXPECT_EQ(a.losses, b.losses);
  EXPECT_EQ(a.losses, c.losses);
  EXPECT_EQ(a.evalLoss, c.evalLoss);
  ASSERT_EQ(a.state.size(), c.state.size());
  for (const auto &[name, value] : a.state) {
    EXPECT_EQ(value.bytes, b.state.at(name).bytes) << name;
    EXPECT_EQ(value.bytes, c.state.at(name).bytes) << name;
  }
}

TEST(PipelineExecution, AChunkMayKeepNoResiduals) {
  // Chunk 0's input is the batch: its backward reads input.0 again instead
  // of a residual, and its forward keeps nothing.
  Model model;
  model.stages = 3;
  ProgramBuilder pb = modelBuilder(model);
  auto &results = pb.get("train_forward.0").results;
  results.erase(std::remove_if(results.begin(), results.end(),
                               [](const auto &r) {
                                 return r.second.role == Role::Residual;
                               }),
                results.end());
  for (auto &arg : pb.get("train_backward.0").arguments)
    if (arg.second.role == Role::Residual)
      arg.second = Tensor().split({{"dp"}, {}}).named("input.0");
  Session session(pb.parse(), quick());
  session.initState("train_step", referenceSource(model));
  Reference ref(model);
  Batch batch = batchOf(model.microBatches, 1);
  EXPECT_EQ(lossOf(session.call("train_step", inputsOf(batch), 0.25, 1)),
            float(ref.train(batch, 0.25)));
  for (const auto &[name, value] : ref.state)
    EXPECT_TRUE(exactly(session.state("train_step", name), value)) << name;
}

//===----------------------------------------------------------------------===//
// Shared parameters: stage_broadcast and stage_all_reduce, rank by rank
//===----------------------------------------------------------------------===//

namespace {

/// Runs `body` with a RankRunner per rank, on threads over a ThreadWorld.
void onRunners(const Program &program,
               const std::function<void(RankRunner &, int64_t)> &body,
               ExecutorOptions options = {}) {
  ThreadWorld world(program.mesh(), std::chrono::seconds(10));
  std::vector<std::unique_ptr<Communicator>> comms;
  for (int64_t r = 0; r < program.mesh().numRanks(); ++r)
    comms.push_back(world.communicator(r));
  onThreads(program.mesh().numRanks(), [&](int64_t r) {
    RankRunner runner(program, *comms[r], options);
    body(runner, r);
  });
}

} // namespace

TEST(PipelineExecution, SharedParametersStartAsTheFirstStagesAndStayEqual) {
  Model model;
  model.tied = true;
  model.stages = 3;
  Program program = modelProgram(model);
  // Each stage's source gives "tied" another value; @init.<s> broadcasts
  // stage 0's. Values that round (thirds) make the all-reduce's order show.
  auto tiedOf = [](int64_t stage) {
    return tensorOf({1.0 / 3.0 + double(stage), -2.0 / 3.0 - double(stage)},
                    {kFeatures});
  };
  std::vector<HostTensor> before(program.mesh().numRanks()),
      after(program.mesh().numRanks()), grads(program.mesh().numRanks());
  std::vector<float> losses(program.mesh().numRanks());
  Batch batch = batchOf(model.microBatches, 1);
  onRunners(program, [&](RankRunner &runner, int64_t r) {
    int64_t stage = program.stageOf(r);
    StateSource base = referenceSource(model);
    runner.initState("train_step", [&](const TensorSpec &spec) {
      if (spec.name == "tied")
        return std::optional<HostTensor>(tiedOf(stage));
      return base(spec);
    });
    if (runner.holdsState("tied"))
      before[r] = runner.localState("tied");
    losses[r] = lossOf(runner.call("train_step", inputsOf(batch), 0.25, 1));
    if (runner.holdsState("tied")) {
      after[r] = runner.localState("tied");
      grads[r] = runner.localState("tied:momentum"); // = the mean gradient
    }
  });
  Reference ref(model);
  ref.state["tied"] = {double(tiedOf(0).as<float>()[0]),
                       double(tiedOf(0).as<float>()[1])};
  double want = ref.train(batch, 0.25);
  for (int64_t r = 0; r < program.mesh().numRanks(); ++r) {
    SCOPED_TRACE("rank " + std::to_string(r));
    // Every rank returns the loss, which only the last stage computes.
    EXPECT_NEAR(losses[r], want, 1e-5);
    EXPECT_EQ(losses[r], losses[0]);
    int64_t stage = program.stageOf(r);
    if (stage == 1) {
      EXPECT_TRUE(before[r].bytes.empty()) << "stage 1 holds no tied copy";
      continue;
    }
    EXPECT_EQ(before[r].bytes, tiedOf(0).bytes);
    // Bitwise the same on both stages (and every dp rank), near the sum.
    EXPECT_EQ(after[r].bytes, after[0].bytes);
    EXPECT_EQ(grads[r].bytes, grads[0].bytes);
    for (int64_t j = 0; j < kFeatures; ++j) {
      EXPECT_NEAR(grads[r].as<float>()[j], ref.state["tied:momentum"][j], 1e-4);
      EXPECT_NEAR(after[r].as<float>()[j], ref.state["tied"][j], 1e-5);
    }
  }
}

//===----------------------------------------------------------------------===//
// Errors
//===----------------------------------------------------------------------===//

TEST(PipelineExecution, WrongBatchesAreInvalidArgumentsAndTheSessionGoesOn) {
  Model model;
  Session session(modelProgram(model), quick());
  session.initState("train_step", referenceSource(model));
  auto callError = [&](const std::string &fn, const std::vector<HostTensor> &in) {
    try {
      session.call(fn, in, 0.25, 1);
    } catch (const std::invalid_argument &e) {
      return std::string(e.what());
    }
    ADD_FAILURE() << "accepted";
    return std::string();
  };
  HostTensor x = tensorOf(Values(12 * kFeatures, 1.0), {12, kFeatures});
  EXPECT_THAT(callError("train_step", {x, x}),
              HasSubstr("@train_step input 0 ('input.0') must have shape "
                        "[16, 2] (4 micro-batches of [4, 2]), not [12, 2]"));
  EXPECT_THAT(callError("train_step", {x}),
              HasSubstr("takes 2 batch inputs, not 1"));
  EXPECT_THAT(callError("forward", {}),
              HasSubstr("a pipelined program runs train_step and eval_step, "
                        "not 'forward'"));
  EXPECT_THROW(session.state("forward_grad", "w0"), std::invalid_argument);
  EXPECT_THROW(session.state("train_step", "nope"), std::invalid_argument);
  // Nothing ran: the session still trains like the reference.
  Reference ref(model);
  Batch batch = batchOf(model.microBatches, 1);
  EXPECT_EQ(lossOf(session.call("train_step", inputsOf(batch), 0.25, 1)),
            float(ref.train(batch, 0.25)));
}

TEST(PipelineExecution, CallingBeforeInitStateIsAnError) {
  Session session(modelProgram(Model{}), quick());
  try {
    session.call("train_step", inputsOf(batchOf(4, 1)), 0.25, 1);
    FAIL() << "accepted";
  } catch (const std::invalid_argument &e) {
    EXPECT_THAT(e.what(), HasSubstr("initState first"));
  }
}

TEST(PipelineExecution, SetStateReachesEveryStageHoldingIt) {
  Model model;
  model.tied = true;
  model.stages = 3;
  Session session(modelProgram(model), quick());
  session.initState("train_step", referenceSource(model));
  Reference ref(model);
  ref.state["tied"] = {0.5, 4.0};
  ref.state["w1"] = {-2.0, 0.25};
  session.setState("train_step", "tied", tensorOf(ref.state["tied"], {kFeatures}));
  session.setState("eval_step", "w1", tensorOf(ref.state["w1"], {kFeatures}));
  EXPECT_THROW(session.setState("train_step", "nope", HostTensor(DType::F32, {2})),
               std::invalid_argument);
  Batch batch = batchOf(model.microBatches, 2);
  EXPECT_EQ(lossOf(session.call("train_step", inputsOf(batch), 0.25, 1)),
            float(ref.train(batch, 0.25)));
  for (const auto &[name, value] : ref.state)
    EXPECT_TRUE(exactly(session.state("train_step", name), value)) << name;
}

TEST(PipelineExecution, AFailureMidPipelineStopsEveryRankWithItsCause) {
  Model model;
  model.stages = 3;
  model.failingChunk = 1; // stage 1's backward, after stage 2 sent to it
  Session session(modelProgram(model), quick());
  session.initState("train_step", referenceSource(model));
  auto start = std::chrono::steady_clock::now();
  try {
    session.call("train_step", inputsOf(batchOf(model.microBatches, 1)), 0.25, 1);
    FAIL() << "expected the failure";
  } catch (const ExecutionError &e) {
    EXPECT_FALSE(e.inCollective);
    EXPECT_THAT(e.what(), HasSubstr("@train_backward.1 instruction #"));
    EXPECT_THAT(e.what(), HasSubstr("'ernie.div' at model.py:7:3: integer "
                                    "division by zero"));
  }
  EXPECT_LT(std::chrono::steady_clock::now() - start, std::chrono::seconds(5));
}

TEST(PipelineLoad, ABadScheduleIsRejectedWithTheCheckersMessage) {
  Model model;
  ProgramBuilder pb = modelBuilder(model);
  PipelineSchedule schedule = scheduleOf(model);
  // Stage 1 runs its first backward before its first forward.
  std::swap(schedule[1][0], schedule[1][1]);
  pb.schedule(1, schedule[1]);
  PipelineShape shape;
  shape.stages = 2;
  shape.microBatches = model.microBatches;
  std::string why = checkSchedule(schedule, shape);
  ASSERT_NE(why, "");
  EXPECT_THAT(loadError(pb), HasSubstr("pipe.ernie: has a pipeline schedule "
                                       "(1F1B) that cannot run: " + why));
  // A missing step too.
  schedule = scheduleOf(model);
  schedule[0].pop_back();
  pb.schedule(0, schedule[0]);
  pb.schedule(1, scheduleOf(model)[1]);
  EXPECT_THAT(loadError(pb), HasSubstr("that cannot run: " +
                                       checkSchedule(schedule, shape)));
}

TEST(PipelineLoad, PipelineFieldsAndFunctionsAreChecked) {
  Model model;
  {
    ProgramBuilder pb = modelBuilder(model);
    pb.pipeline(0, 1, "1F1B");
    EXPECT_THAT(loadError(pb), HasSubstr("0 micro-batches; it needs at least 1"));
    pb.pipeline(4, 0, "1F1B");
    EXPECT_THAT(loadError(pb), HasSubstr("0 virtual stages"));
  }
  {
    ProgramBuilder pb = modelBuilder(model);
    pb.get("eval_forward.1").name = "eval.1";
    EXPECT_THAT(loadError(pb),
                HasSubstr("stage 1 has no @eval_forward.1, which its pipeline "
                          "needs"));
  }
  {
    ProgramBuilder pb = modelBuilder(model);
    pb.get("train_update.0").name = "update.0";
    EXPECT_THAT(loadError(pb), HasSubstr("stage 0 has no @train_update.0"));
  }
  {
    // A residual the forward does not make.
    ProgramBuilder pb = modelBuilder(model);
    pb.get("train_backward.0").arguments[1].second.name = "residual.7";
    EXPECT_THAT(loadError(pb),
                HasSubstr("@train_forward.0 has no residual named 'residual.7'"));
  }
  {
    // A gradient no backward makes.
    ProgramBuilder pb = modelBuilder(model);
    FunctionBuilder &u = pb.get("train_update.1");
    for (auto &arg : u.arguments)
      if (arg.second.role == Role::Gradient)
        arg.second.name = "w9";
    EXPECT_THAT(loadError(pb), HasSubstr("no forward or backward of stage 1 "
                                         "makes the gradient 'w9'"));
  }
  {
    // A backward's running sum (a gradient argument) replaces a gradient
    // result of its name and type.
    ProgramBuilder pb = modelBuilder(model);
    FunctionBuilder &b = pb.get("train_backward.1");
    const Tensor *gradient = nullptr;
    uint32_t gradientBuffer = 0;
    for (auto &res : b.results)
      if (res.second.role == Role::Gradient)
        gradient = &res.second, gradientBuffer = res.first;
    ASSERT_NE(gradient, nullptr);
    std::string name = gradient->name;
    uint32_t sum = b.buffer(DType::F32, {3});
    b.arg(sum, Tensor().as(Role::Gradient).named("w9"));
    EXPECT_THAT(loadError(pb),
                HasSubstr("takes the running sum of gradient 'w9' but returns "
                          "no gradient of that name"));
    b.arguments.back().second.named(name);
    EXPECT_THAT(loadError(pb), HasSubstr("the running sum '" + name +
                                         "' is [3]xf32 but the gradient it "
                                         "sums is"));
    const BufferDesc &like = b.buffers[gradientBuffer];
    b.arguments.back().first = b.buffer(like.type, like.shape);
    b.arg(b.buffer(like.type, like.shape), Tensor().as(Role::Gradient).named(name));
    EXPECT_THAT(loadError(pb),
                HasSubstr("a second running sum of gradient '" + name + "'"));
  }
  for (Role role : {Role::MicroBatchMax, Role::MicroBatchSum}) {
    // A gradient taken as a maximum or a batch sum: the roles must agree
    // (the runtime would combine it over micro-batches by max, or add them
    // up without averaging).
    ProgramBuilder pb = modelBuilder(model);
    FunctionBuilder &u = pb.get("train_update.1");
    std::string name;
    for (auto &arg : u.arguments)
      if (arg.second.role == Role::Gradient) {
        arg.second.role = role;
        name = arg.second.name;
      }
    EXPECT_THAT(loadError(pb),
                HasSubstr("no forward or backward of stage 1 makes the " +
                          std::string(roleName(role)) + " '" + name + "'"));
  }
  {
    // A loss anywhere but the last chunk's forward.
    ProgramBuilder pb = modelBuilder(model);
    FunctionBuilder &f = pb.get("train_forward.0");
    uint32_t loss = f.buffer(DType::F32, {});
    f.op("ernie.full", {}, {loss}, {{"value", 0.0}})
        .ret(loss, Tensor().as(Role::Loss));
    EXPECT_THAT(loadError(pb), HasSubstr("only the last chunk's (1) forward "
                                         "has a loss"));
  }
  {
    // Batch inputs are numbered without gaps, each with one micro-batch shape.
    ProgramBuilder pb = modelBuilder(model);
    auto rename = [&](const std::string &from, const std::string &to) {
      for (const char *fn : {"train_forward.1", "train_backward.1", "eval_forward.1"})
        for (auto &arg : pb.get(fn).arguments)
          if (arg.second.name == from)
            arg.second.name = to;
    };
    rename("input.1", "input.2");
    EXPECT_THAT(loadError(pb), HasSubstr("has no function taking batch input "
                                         "input.1 (inputs are numbered from 0 "
                                         "without gaps)"));
    rename("input.2", "labels");
    EXPECT_THAT(loadError(pb), HasSubstr("a batch input is named input.<k>, "
                                         "not 'labels'"));
    rename("labels", "input.1");
    pb.get("train_backward.1").arguments.back().second.dims.reset();
    EXPECT_THAT(loadError(pb), HasSubstr("micro-batch [2, 2] of input.1 differs "
                                         "from function @train_forward.1 (stage "
                                         "1), argument 1's [4, 2]"));
  }
}

TEST(PipelineLoad, StageOpsAreChecked) {
  Model model;
  model.stages = 3;
  model.tied = true;
  auto edit = [&](const std::string &fn, const std::string &op,
                  const std::string &attr, Attrs::Value value) {
    ProgramBuilder pb = modelBuilder(model);
    for (InstDesc &inst : pb.get(fn).instructions)
      if (inst.op == op)
        for (auto &a : inst.attrs)
          if (a.first == attr)
            a.second = value;
    return loadError(pb);
  };
  EXPECT_THAT(edit("train_forward.1", "ernie.send", "peer", int64_t(4)),
              HasSubstr("peer chunk 4 is not one of the 3 chunks"));
  EXPECT_THAT(edit("train_forward.1", "ernie.send", "peer", int64_t(1)),
              HasSubstr("function @train_forward.1 (stage 1), instruction #"));
  EXPECT_THAT(edit("train_forward.1", "ernie.recv", "peer", int64_t(1)),
              HasSubstr("peer chunk 1 is on this stage"));
  EXPECT_THAT(edit("train_forward.1", "ernie.recv", "channel", int64_t(-1)),
              HasSubstr("'channel' is negative"));
  // Sends and receives pair up by chunks and channel, with equal sizes.
  EXPECT_THAT(edit("train_backward.1", "ernie.recv", "channel", int64_t(9)),
              HasSubstr("function @train_backward.2 (stage 2), instruction #"));
  EXPECT_THAT(edit("train_backward.1", "ernie.recv", "channel", int64_t(9)),
              HasSubstr("(ernie.send): no ernie.recv in chunk 1's functions "
                        "matches it (chunk 2 to chunk 1, channel 4)"));
  {
    ProgramBuilder pb = modelBuilder(model);
    FunctionBuilder &f = pb.get("eval_forward.1");
    f.op("ernie.recv", {}, {f.buffer(DType::F32, {2})},
         {{"peer", int64_t(0)}, {"channel", int64_t(9)}});
    EXPECT_THAT(loadError(pb),
                HasSubstr("(ernie.recv): no ernie.send in chunk 0's functions "
                          "matches it (chunk 0 to chunk 1, channel 9)"));
  }
  EXPECT_THAT(edit("train_forward.0", "ernie.send", "channel", int64_t(9)),
              HasSubstr("(ernie.send): no ernie.recv in chunk 1's functions "
                        "matches it (chunk 0 to chunk 1, channel 9)"));
  {
    // The receive fills a [1, 2] buffer that a broadcast widens, so the
    // function itself stays consistent and only the transfer differs.
    ProgramBuilder pb = modelBuilder(model);
    FunctionBuilder &f = pb.get("eval_forward.2");
    for (size_t i = 0; i < f.instructions.size(); ++i)
      if (f.instructions[i].op == "ernie.recv") {
        uint32_t whole = f.instructions[i].results[0];
        uint32_t row = f.buffer(DType::F32, {1, 2});
        f.instructions[i].results[0] = row;
        f.instructions.insert(
            f.instructions.begin() + i + 1,
            InstDesc{"ernie.broadcast", {row}, {whole},
                     {{"dims", std::vector<int64_t>{0, 1}}}, {}, std::nullopt, ""});
        break;
      }
    EXPECT_THAT(loadError(pb), HasSubstr("moves 16 bytes on channel 2, but "
                                         "function @eval_forward.2 (stage 2), "
                                         "instruction #"));
  }
  EXPECT_THAT(edit("train_update.0", "ernie.stage_all_reduce", "stages",
                   std::vector<int64_t>{2, 0}),
              HasSubstr("'stages' must be distinct stages in [0, 3), ascending"));
  EXPECT_THAT(edit("init.2", "ernie.stage_broadcast", "stages",
                   std::vector<int64_t>{0, 1}),
              HasSubstr("'stages' does not hold this stage"));
  EXPECT_THAT(edit("init.2", "ernie.stage_broadcast", "channel", 2.5),
              HasSubstr("'channel' is missing or not an integer"));
  {
    // No collective over the stage axis, no sharding along it.
    ProgramBuilder pb = modelBuilder(model);
    for (InstDesc &inst : pb.get("train_backward.0").instructions)
      if (inst.op == "ernie.all_reduce")
        inst.axes = {"pp"};
    EXPECT_THAT(loadError(pb), HasSubstr("a collective over the stage axis 'pp'"));
  }
  {
    // A program without a pipeline has no stage ops.
    ProgramBuilder pb({"x"}, {2});
    FunctionBuilder &f = pb.function("f");
    uint32_t a = f.buffer(DType::F32, {2});
    f.arg(a).op("ernie.send", {a}, {}, {{"peer", int64_t(1)}, {"channel", int64_t(0)}});
    EXPECT_THAT(loadError(pb), HasSubstr("only pipelined programs talk between "
                                         "stages"));
  }
}

//===----------------------------------------------------------------------===//
// Traces
//===----------------------------------------------------------------------===//

TEST(PipelineExecution, EveryScheduleStepIsASpanOnTheComputeTrack) {
  Model model;
  SessionOptions options = quick();
  options.executor.trace = true;
  Session session(modelProgram(model), options);
  session.initState("train_step", referenceSource(model));
  session.call("train_step", inputsOf(batchOf(model.microBatches, 1)), 0.25, 1);
  std::vector<std::vector<TraceEvent>> events = session.traceEvents();
  PipelineSchedule schedule = scheduleOf(model);
  for (int64_t r = 0; r < session.numRanks(); ++r) {
    std::vector<std::string> spans;
    bool sends = false;
    for (const TraceEvent &e : events[r]) {
      if (!e.collective && (e.name[0] == 'F' || e.name[0] == 'B' ||
                            e.name == "update"))
        spans.push_back(e.name);
      sends |= e.collective && (e.name == "ernie.send" || e.name == "ernie.recv");
    }
    std::vector<std::string> want;
    for (const PipelineStep &step : schedule[session.program().stageOf(r)])
      want.push_back((step.action == PipelineAction::Forward ? "F" : "B") +
                     std::to_string(step.chunk) + " mb" +
                     std::to_string(step.microBatch));
    want.push_back("update");
    EXPECT_EQ(spans, want) << "rank " << r;
    EXPECT_TRUE(sends);
  }
}

//===----------------------------------------------------------------------===//
// Gloo
//===----------------------------------------------------------------------===//

namespace {

std::string freshStore(const std::string &name) {
  auto dir = std::filesystem::temp_directory_path() /
             ("ernie-pipe-" + name + "-" + std::to_string(::getpid()));
  std::filesystem::remove_all(dir);
  std::filesystem::create_directories(dir);
  return dir.string();
}

} // namespace

TEST(PipelineGloo, OneFOneBAndInterleavedTrainLikeTheThreadEngine) {
  for (bool interleave : {false, true}) {
    Model model;
    model.tied = true;
    model.stages = interleave ? 2 : 3;
    model.virtualStages = interleave ? 2 : 1;
    model.kind = interleave ? ScheduleKind::Interleaved : ScheduleKind::OneFOneB;
    SCOPED_TRACE(scheduleKindName(model.kind));
    Program program = modelProgram(model);
    TrainRun threads = trainAndCheck(model);
    std::string store = freshStore(interleave ? "vpp" : "1f1b");
    GlooOptions options;
    options.storePath = store;
    options.timeout = std::chrono::seconds(20);
    int64_t n = program.mesh().numRanks();
    std::vector<std::vector<float>> losses(n);
    std::vector<std::map<std::string, HostTensor>> state(n);
    onThreads(n, [&](int64_t r) {
      auto comm = createGlooCommunicator(program.mesh(), r, options);
      RankRunner runner(program, *comm);
      runner.initState("train_step", referenceSource(model));
      for (int64_t step = 1; step <= 2; ++step)
        losses[r].push_back(lossOf(runner.call(
            "train_step", inputsOf(batchOf(model.microBatches, int(step))), 0.25,
            step)));
      for (const std::string &name : runner.stateNames())
        state[r][name] = runner.gatherInStage(runner.stateSpec(name),
                                              runner.localState(name));
      comm->barrier(program.mesh().axisNames());
    });
    std::filesystem::remove_all(store);
    for (int64_t r = 0; r < n; ++r) {
      EXPECT_EQ(losses[r], threads.losses) << "rank " << r;
      for (const auto &[name, value] : state[r])
        EXPECT_EQ(value.bytes, threads.state.at(name).bytes)
            << "rank " << r << " " << name;
    }
  }
}

TEST(PipelineGloo, AFailureMidPipelineStopsEveryRankWithoutATimeout) {
  Model model;
  model.stages = 3;
  model.failingChunk = 1;
  Program program = modelProgram(model);
  std::string store = freshStore("fail");
  GlooOptions options;
  options.storePath = store;
  options.timeout = std::chrono::seconds(30);
  int64_t n = program.mesh().numRanks();
  std::vector<std::string> errors(n);
  auto start = std::chrono::steady_clock::now();
  onThreads(n, [&](int64_t r) {
    auto comm = createGlooCommunicator(program.mesh(), r, options);
    RankRunner runner(program, *comm);
    runner.initState("train_step", referenceSource(model));
    try {
      runner.call("train_step", inputsOf(batchOf(model.microBatches, 1)), 0.25, 1);
    } catch (const ExecutionError &e) {
      errors[r] = e.what();
    }
  });
  std::filesystem::remove_all(store);
  EXPECT_LT(std::chrono::steady_clock::now() - start, std::chrono::seconds(15));
  // Every rank stops; the cause is reported by a stage-1 rank (its peer in
  // the stage may see the others leave before it reaches the division).
  int64_t causes = 0;
  for (int64_t r = 0; r < n; ++r) {
    EXPECT_NE(errors[r], "") << "rank " << r;
    std::string own = "rank " + std::to_string(r) + ": @train_backward.1 ";
    if (errors[r].rfind(own, 0) == 0 &&
        errors[r].find("'ernie.div' at model.py:7:3: integer division by "
                       "zero") != std::string::npos)
      ++causes;
  }
  EXPECT_GE(causes, 1);
}

//===----------------------------------------------------------------------===//
// ernie-run
//===----------------------------------------------------------------------===//

TEST(PipelineErnieRun, ThreadsAndGlooTrainLikeTheReference) {
  Model model;
  model.tied = true;
  model.stages = 3;
  namespace fs = std::filesystem;
  fs::path dir = fs::temp_directory_path() /
                 ("ernie-pipe-run-" + std::to_string(::getpid()));
  fs::remove_all(dir);
  fs::create_directories(dir / "in");
  modelBuilder(model).write((dir / "pipe.ernie").string());
  Batch batch = batchOf(model.microBatches, 3);
  std::vector<HostTensor> inputs = inputsOf(batch);
  writeNpy((dir / "in" / "input0.npy").string(), inputs[0]);
  writeNpy((dir / "in" / "input.1.npy").string(), inputs[1]);
  Reference ref(model);
  for (const auto &[name, value] : ref.state)
    if (name.find(':') == std::string::npos)
      writeNpy((dir / "in" / (name + ".npy")).string(),
               tensorOf(value, {kFeatures}));
  std::vector<double> want;
  for (int step = 0; step < 2; ++step)
    want.push_back(double(float(ref.train(batch, 0.25))));
  // The second step's values carry more bits than f32 holds: the backends
  // must agree bit for bit, and with the reference closely.
  std::map<std::string, HostTensor> first;
  for (std::string backend : {"threads", "gloo"}) {
    SCOPED_TRACE(backend);
    fs::path out = dir / backend;
    std::string command = std::string(ERNIE_RUN_PATH) + " " +
                          (dir / "pipe.ernie").string() + " --backend " +
                          backend + " --steps 2 --lr 0.25 --timeout 20 --quiet" +
                          " --inputs " + (dir / "in").string() + " --outputs " +
                          out.string() + " > " + (dir / "log").string() + " 2>&1";
    int status = std::system(command.c_str());
    std::ifstream log(dir / "log");
    std::string text((std::istreambuf_iterator<char>(log)), {});
    ASSERT_EQ(status, 0) << text;
    HostTensor losses = readNpy((out / "losses.npy").string(), DType::F64);
    ASSERT_EQ(losses.numElements(), 2);
    EXPECT_EQ(losses.as<double>()[0], want[0]);
    EXPECT_NEAR(losses.as<double>()[1], want[1], 1e-5);
    HostTensor loss = readNpy((out / "result0.npy").string(), DType::F32);
    EXPECT_EQ(double(loss.as<float>()[0]), losses.as<double>()[1]);
    for (const auto &[name, value] : ref.state) {
      HostTensor got = readNpy((out / (name + ".npy")).string(), DType::F32);
      ASSERT_EQ(got.numElements(), kFeatures) << name;
      for (int64_t j = 0; j < kFeatures; ++j)
        EXPECT_NEAR(got.as<float>()[j], value[j], 1e-5) << name;
      if (first.count(name))
        EXPECT_EQ(got.bytes, first[name].bytes) << name;
      first[name] = got;
    }
    if (first.count("losses"))
      EXPECT_EQ(losses.bytes, first["losses"].bytes);
    first["losses"] = losses;
  }
  if (!::testing::Test::HasFailure())
    fs::remove_all(dir);
}
