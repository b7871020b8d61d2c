//===- PipelineSchedule.h - pipeline schedules, checked and timed -*- C++ -*-===//
//
// A pipelined program runs C = stages * virtualStages model chunks (virtual
// stages); chunk c lives on pipeline rank (stage-axis coordinate) c % stages.
// A schedule is, per pipeline rank, the order of its steps: the forward or
// the backward of one of its chunks on one micro-batch.
//
// The data dependencies are those of the model: F(c, k) needs F(c-1, k) (its
// input activation), B(c, k) needs F(c, k) (its residuals) and B(c+1, k)
// (its output gradient; the last chunk's backward starts from its own
// loss). Sends are eager (a sender never waits for its receiver) and every
// transfer is tagged by its micro-batch, so a schedule runs exactly when
// every rank can reach its end in this dependency order; checkSchedule
// simulates that and says where a schedule would wait forever.
//
// The compiler (no exceptions) and the runtime share this code: errors are
// returned as messages.
//
//===----------------------------------------------------------------------===//

#ifndef ERNIE_RUNTIME_PIPELINESCHEDULE_H
#define ERNIE_RUNTIME_PIPELINESCHEDULE_H

#include <cstdint>
#include <functional>
#include <string>
#include <vector>

namespace ernie::runtime {

enum class PipelineAction : uint8_t { Forward, Backward };

struct PipelineStep {
  PipelineAction action;
  int64_t chunk;      // the virtual stage, in [0, stages * virtualStages)
  int64_t microBatch; // in [0, microBatches)
  bool operator==(const PipelineStep &o) const {
    return action == o.action && chunk == o.chunk && microBatch == o.microBatch;
  }
};

struct PipelineShape {
  int64_t stages = 1;        // pipeline ranks (the stage axis' size)
  int64_t virtualStages = 1; // chunks per pipeline rank
  int64_t microBatches = 1;
  int64_t chunks() const { return stages * virtualStages; }
};

/// Per pipeline rank, its steps in order.
using PipelineSchedule = std::vector<std::vector<PipelineStep>>;

enum class ScheduleKind {
  FThenB,     // GPipe: every forward, then every backward
  OneFOneB,   // 1F1B: p - r - 1 warm-up forwards, then alternate
  Interleaved // Megatron's interleaved 1F1B over virtualStages chunks
};

/// "FThenB", "1F1B", "interleaved" (also accepted: "gpipe", "fthenb",
/// "1f1b", "vpp"); false for anything else.
bool parseScheduleKind(const std::string &name, ScheduleKind &kind);
const char *scheduleKindName(ScheduleKind kind);

/// Builds the schedule. Returns an error message (empty on success) when
/// the shape does not suit the kind: sizes below 1; FThenB and 1F1B need
/// virtualStages == 1; interleaved needs virtualStages >= 2 and
/// microBatches a multiple of stages.
std::string buildSchedule(ScheduleKind kind, const PipelineShape &shape,
                          PipelineSchedule &schedule);

/// Checks that `schedule` has one list per pipeline rank, that every step
/// names a chunk of that rank and a micro-batch in range, that each of the
/// 2 * chunks * microBatches steps appears exactly once, and that it cannot
/// deadlock. Returns an error message saying where (empty if it is good).
std::string checkSchedule(const PipelineSchedule &schedule,
                          const PipelineShape &shape);

/// One rank's steps as text, "F0:0 F0:1 B0:0 ..." (action, chunk, ':',
/// micro-batch): the form the compiler records on the module.
std::string formatSteps(const std::vector<PipelineStep> &steps);
/// Reads formatSteps' form; returns an error message (empty on success).
std::string parseSteps(const std::string &text,
                       std::vector<PipelineStep> &steps);

/// One step's interval on its rank's timeline.
struct TimedStep {
  PipelineStep step;
  double start = 0, end = 0;
};

struct ScheduleTimeline {
  std::vector<std::vector<TimedStep>> ranks; // per pipeline rank, in order
  double makespan = 0;                       // the last step's end
  double busy = 0;                           // the sum of every step's cost
  /// Idle share of every rank's time: 1 - busy / (stages * makespan).
  double bubbleFraction = 0;
};

/// Simulates the schedule with zero-cost transfers: each step starts when
/// its rank is free and its dependencies have ended; a chunk's forward
/// costs `forwardCost`, its backward `backwardCost`. Returns an error
/// message if checkSchedule would.
std::string simulateSchedule(const PipelineSchedule &schedule,
                             const PipelineShape &shape, double forwardCost,
                             double backwardCost, ScheduleTimeline &timeline);

/// What each step of a schedule costs: per chunk its forward and its
/// backward, and the transfer a dependency on another pipeline rank waits
/// for (the activation or its gradient crossing stages).
struct StepCosts {
  std::vector<double> forward, backward; // indexed by chunk
  double transfer = 0;
  /// Optional: how much faster than its cost a step runs while `busy`
  /// pipeline ranks (1..stages) are running steps — ranks time-sliced onto
  /// shared processors take the idle ranks' share (costs are then those
  /// of every rank busy, and the speed-up of `stages` is 1). The
  /// simulation is then event by event: each running step advances at the
  /// speed-up of the moment.
  std::function<double(int64_t busy)> speedup;
};

/// simulateSchedule with per-chunk costs and transfers: what the cost model
/// runs. Returns an error message for a cost list that does not have one
/// entry per chunk or a negative or non-finite cost.
std::string simulateSchedule(const PipelineSchedule &schedule,
                             const PipelineShape &shape,
                             const StepCosts &costs,
                             ScheduleTimeline &timeline);

} // namespace ernie::runtime

#endif // ERNIE_RUNTIME_PIPELINESCHEDULE_H
