//===- PipelineSchedule.cpp - pipeline schedules, checked and timed
//--------===//
//
// No exceptions here: the compiler links this library with -fno-exceptions.
// Step indices in messages count from 0.
//
//===----------------------------------------------------------------------===//

#include "ernie/runtime/PipelineSchedule.h"

#include <algorithm>
#include <cmath>
#include <optional>
#include <sstream>

namespace ernie::runtime {

bool parseScheduleKind(const std::string &name, ScheduleKind &kind) {
  if (name == "FThenB" || name == "fthenb" || name == "gpipe")
    kind = ScheduleKind::FThenB;
  else if (name == "1F1B" || name == "1f1b")
    kind = ScheduleKind::OneFOneB;
  else if (name == "interleaved" || name == "Interleaved" || name == "vpp")
    kind = ScheduleKind::Interleaved;
  else
    return false;
  return true;
}

const char *scheduleKindName(ScheduleKind kind) {
  switch (kind) {
  case ScheduleKind::FThenB:
    return "FThenB";
  case ScheduleKind::OneFOneB:
    return "1F1B";
  case ScheduleKind::Interleaved:
    return "interleaved";
  }
  return "unknown";
}

namespace {

template <typename Int> std::string str(Int n) { return std::to_string(n); }

std::string checkSizes(const PipelineShape &shape) {
  const std::pair<const char *, int64_t> sizes[] = {
      {"stages", shape.stages},
      {"virtual_stages", shape.virtualStages},
      {"micro-batches", shape.microBatches}};
  for (const auto &[name, size] : sizes)
    if (size < 1)
      return std::string("a pipeline needs ") + name + " >= 1, not " +
             str(size);
  return "";
}

std::string checkShape(ScheduleKind kind, const PipelineShape &shape) {
  if (std::string err = checkSizes(shape); !err.empty())
    return err;
  const int64_t p = shape.stages, v = shape.virtualStages,
                m = shape.microBatches;
  if (kind != ScheduleKind::Interleaved && v != 1)
    return std::string(scheduleKindName(kind)) +
           " schedule needs virtual_stages = 1, not " + str(v) +
           "; use interleaved";
  if (kind == ScheduleKind::Interleaved && v < 2)
    return "interleaved schedule needs virtual_stages >= 2, not " + str(v);
  // Micro-batches go through a rank's chunks in groups of p (see below).
  if (kind == ScheduleKind::Interleaved && m % p != 0)
    return "interleaved schedule needs micro-batches (" + str(m) +
           ") divisible by stages (" + str(p) + ")";
  return "";
}

/// The forwards a rank runs before its first backward. The rest of every
/// schedule is the same: alternate one forward and one backward, then run
/// the backwards left over.
int64_t warmupForwards(ScheduleKind kind, const PipelineShape &shape,
                       int64_t rank) {
  const int64_t p = shape.stages, v = shape.virtualStages,
                m = shape.microBatches, units = m * v;
  switch (kind) {
  case ScheduleKind::FThenB:
    return units;
  case ScheduleKind::OneFOneB:
    // Enough forwards in flight that the first backward finds the
    // gradient from the next rank ready.
    return std::min(p - rank - 1, m);
  case ScheduleKind::Interleaved:
    // Megatron-LM's counts (schedules.py, interleaved 1F1B). With the
    // eager, zero-cost transfers simulated here, (p - rank - 1) + (v - 1) * p
    // already gives the same makespan; the doubled term is Megatron's slack
    // for real transfers. m == p running every forward first is Megatron's
    // rule too (newer versions only clamp to the total). We keep its order
    // so that a compiled program runs the reference schedule.
    if (m == p)
      return units;
    return std::min((p - rank - 1) * 2 + (v - 1) * p, units);
  }
  return units;
}

/// A rank's i-th forward (or backward) unit. Units walk the rank's local
/// chunks in groups of p micro-batches: p micro-batches through local chunk
/// 0, the same p through chunk 1, ..., then the next p micro-batches. The
/// backwards walk the local chunks last to first. With v == 1 unit i is
/// simply micro-batch i on the rank's only chunk.
PipelineStep unit(PipelineAction action, const PipelineShape &shape,
                  int64_t rank, int64_t i) {
  const int64_t p = shape.stages, v = shape.virtualStages;
  int64_t local = (i / p) % v;
  if (action == PipelineAction::Backward)
    local = v - 1 - local;
  return {action, local * p + rank, (i / (p * v)) * p + i % p};
}

std::string describe(const PipelineStep &s) {
  return std::string(s.action == PipelineAction::Forward ? "forward"
                                                         : "backward") +
         " of chunk " + str(s.chunk) + ", micro-batch " + str(s.microBatch);
}

/// Steps as dense indices into per-step tables.
struct StepIds {
  int64_t chunks, microBatches;
  size_t size() const { return size_t(2 * chunks * microBatches); }
  size_t operator()(const PipelineStep &s) const {
    int64_t a = s.action == PipelineAction::Backward;
    return size_t((a * chunks + s.chunk) * microBatches + s.microBatch);
  }
  PipelineStep step(size_t id) const {
    int64_t mb = int64_t(id) % microBatches, rest = int64_t(id) / microBatches;
    return {rest >= chunks ? PipelineAction::Backward : PipelineAction::Forward,
            rest % chunks, mb};
  }
};

/// The steps `s` waits for (at most two).
std::vector<PipelineStep> dependencies(const PipelineStep &s, int64_t chunks) {
  if (s.action == PipelineAction::Forward) {
    if (s.chunk == 0)
      return {};
    return {{PipelineAction::Forward, s.chunk - 1, s.microBatch}};
  }
  std::vector<PipelineStep> deps = {
      {PipelineAction::Forward, s.chunk, s.microBatch}};
  if (s.chunk + 1 < chunks)
    deps.push_back({PipelineAction::Backward, s.chunk + 1, s.microBatch});
  return deps;
}

/// Everything but deadlock: the list per rank, ranges, and each step
/// exactly once. Fills `position` with each step's index in its rank's list.
std::string checkSteps(const PipelineSchedule &schedule,
                       const PipelineShape &shape, const StepIds &ids,
                       std::vector<int64_t> &position) {
  const int64_t p = shape.stages, chunks = shape.chunks(),
                m = shape.microBatches;
  if (int64_t(schedule.size()) != p)
    return "the schedule lists " + str(schedule.size()) +
           " pipeline ranks but the pipeline has " + str(p);
  position.assign(ids.size(), -1);
  for (int64_t r = 0; r < p; ++r) {
    for (int64_t i = 0; i < int64_t(schedule[r].size()); ++i) {
      const PipelineStep &s = schedule[r][i];
      std::string at = "pipeline rank " + str(r) + ", step " + str(i) + ": ";
      if (s.chunk < 0 || s.chunk >= chunks)
        return at + "chunk " + str(s.chunk) + " is out of range (" +
               str(chunks) + " chunks)";
      if (s.chunk % p != r)
        return at + "chunk " + str(s.chunk) + " runs on pipeline rank " +
               str(s.chunk % p);
      if (s.microBatch < 0 || s.microBatch >= m)
        return at + "micro-batch " + str(s.microBatch) + " is out of range (" +
               str(m) + " micro-batches)";
      int64_t &pos = position[ids(s)];
      if (pos >= 0)
        return at + "the " + describe(s) + " is listed again (first at step " +
               str(pos) + ")";
      pos = i;
    }
  }
  // Every listed step is distinct and valid, so a short list misses some.
  auto missing = std::find(position.begin(), position.end(), -1);
  if (missing != position.end()) {
    PipelineStep s = ids.step(size_t(missing - position.begin()));
    int64_t others = std::count(missing + 1, position.end(), -1);
    return "pipeline rank " + str(s.chunk % p) + " never runs the " +
           describe(s) +
           (others ? " (and " + str(others) + " more steps are missing)"
                   : std::string());
  }
  return "";
}

/// Runs the schedule: every rank advances while its next step's
/// dependencies have run. Sweeping the ranks until none advances visits the
/// steps in a topological order, which is all the times need.
std::string runSchedule(const PipelineSchedule &schedule,
                        const PipelineShape &shape, const StepCosts &costs,
                        ScheduleTimeline &timeline) {
  const StepIds ids{shape.chunks(), shape.microBatches};
  std::vector<int64_t> position;
  if (std::string err = checkSteps(schedule, shape, ids, position);
      !err.empty())
    return err;

  const int64_t p = shape.stages;
  std::vector<double> end(ids.size());
  std::vector<bool> done(ids.size());
  std::vector<size_t> next(p, 0);
  timeline = ScheduleTimeline();
  timeline.ranks.resize(p);
  auto unmet = [&](const PipelineStep &s) -> std::optional<PipelineStep> {
    for (const PipelineStep &d : dependencies(s, shape.chunks()))
      if (!done[ids(d)])
        return d;
    return std::nullopt;
  };
  for (bool advanced = true; advanced;) {
    advanced = false;
    for (int64_t r = 0; r < p; ++r) {
      std::vector<TimedStep> &line = timeline.ranks[r];
      for (; next[r] < schedule[r].size(); ++next[r]) {
        const PipelineStep &s = schedule[r][next[r]];
        if (unmet(s))
          break;
        double start = line.empty() ? 0 : line.back().end;
        // A dependency on another rank arrives a transfer later.
        for (const PipelineStep &d : dependencies(s, shape.chunks()))
          start = std::max(start, end[ids(d)] + (d.chunk % p != r
                                                     ? costs.transfer
                                                     : 0.0));
        double cost = s.action == PipelineAction::Forward
                          ? costs.forward[s.chunk]
                          : costs.backward[s.chunk];
        line.push_back({s, start, start + cost});
        end[ids(s)] = start + cost;
        done[ids(s)] = true;
        timeline.makespan = std::max(timeline.makespan, start + cost);
        timeline.busy += cost;
        advanced = true;
      }
    }
  }

  std::string blocked;
  for (int64_t r = 0; r < p; ++r) {
    if (next[r] == schedule[r].size())
      continue;
    const PipelineStep &s = schedule[r][next[r]];
    const PipelineStep d = *unmet(s);
    int64_t owner = d.chunk % p;
    blocked += (blocked.empty() ? "" : "; ") + std::string("pipeline rank ") +
               str(r) + " waits at its step " + str(next[r]) + " (" +
               describe(s) + ") for the " + describe(d);
    // A dependency on the waiting rank itself is listed later in its list.
    blocked += owner == r ? ", its own step " + str(position[ids(d)])
                          : " on pipeline rank " + str(owner) +
                                ", which waits at its step " + str(next[owner]);
  }
  if (!blocked.empty())
    return "schedule deadlocks: " + blocked;
  if (timeline.makespan > 0)
    timeline.bubbleFraction =
        1 - timeline.busy / (double(p) * timeline.makespan);
  return "";
}

/// runSchedule's timeline again, event by event, for steps whose speed
/// depends on how many ranks are running (costs.speedup). The schedule
/// has passed runSchedule: it is valid and does not deadlock.
void runShared(const PipelineSchedule &schedule, const PipelineShape &shape,
               const StepCosts &costs, ScheduleTimeline &timeline) {
  const StepIds ids{shape.chunks(), shape.microBatches};
  const int64_t p = shape.stages;
  std::vector<double> end(ids.size());
  std::vector<bool> done(ids.size());
  std::vector<size_t> next(p, 0);
  std::vector<double> remaining(p, -1), started(p, 0);
  timeline = ScheduleTimeline();
  timeline.ranks.resize(p);
  double now = 0;
  for (;;) {
    // Start every step whose inputs have arrived; note the next arrival.
    double arrival = INFINITY;
    int64_t busy = 0;
    for (int64_t r = 0; r < p; ++r) {
      if (remaining[r] < 0 && next[r] < schedule[r].size()) {
        const PipelineStep &s = schedule[r][next[r]];
        double ready =
            timeline.ranks[r].empty() ? 0 : timeline.ranks[r].back().end;
        bool met = true;
        for (const PipelineStep &d : dependencies(s, shape.chunks())) {
          met = met && done[ids(d)];
          if (met)
            ready = std::max(ready, end[ids(d)] + (d.chunk % p != r
                                                       ? costs.transfer
                                                       : 0.0));
        }
        if (met && ready <= now) {
          remaining[r] = s.action == PipelineAction::Forward
                             ? costs.forward[s.chunk]
                             : costs.backward[s.chunk];
          started[r] = now;
        } else if (met) {
          arrival = std::min(arrival, ready);
        }
      }
      busy += remaining[r] >= 0;
    }
    if (busy == 0 && arrival == INFINITY)
      break;
    const double speed = busy ? std::max(costs.speedup(busy), 1e-12) : 1;
    double step = arrival - now;
    for (int64_t r = 0; r < p; ++r)
      if (remaining[r] >= 0)
        step = std::min(step, remaining[r] / speed);
    now += step;
    for (int64_t r = 0; r < p; ++r) {
      if (remaining[r] < 0)
        continue;
      remaining[r] -= step * speed;
      if (remaining[r] > 1e-12 * (1 + now))
        continue;
      const PipelineStep &s = schedule[r][next[r]++];
      timeline.ranks[r].push_back({s, started[r], now});
      timeline.busy += now - started[r];
      end[ids(s)] = now;
      done[ids(s)] = true;
      remaining[r] = -1;
    }
  }
  timeline.makespan = now;
  if (now > 0)
    timeline.bubbleFraction = 1 - timeline.busy / (double(p) * now);
}

} // namespace

std::string buildSchedule(ScheduleKind kind, const PipelineShape &shape,
                          PipelineSchedule &schedule) {
  if (std::string err = checkShape(kind, shape); !err.empty())
    return err;
  const int64_t units = shape.microBatches * shape.virtualStages;
  schedule.assign(shape.stages, {});
  for (int64_t r = 0; r < shape.stages; ++r) {
    auto forward = [&](int64_t i) {
      return unit(PipelineAction::Forward, shape, r, i);
    };
    auto backward = [&](int64_t i) {
      return unit(PipelineAction::Backward, shape, r, i);
    };
    const int64_t warmup = warmupForwards(kind, shape, r);
    std::vector<PipelineStep> &steps = schedule[r];
    for (int64_t i = 0; i < warmup; ++i)
      steps.push_back(forward(i));
    for (int64_t i = 0; i < units - warmup; ++i) {
      steps.push_back(forward(warmup + i));
      steps.push_back(backward(i));
    }
    for (int64_t i = units - warmup; i < units; ++i)
      steps.push_back(backward(i));
  }
  return "";
}

std::string checkSchedule(const PipelineSchedule &schedule,
                          const PipelineShape &shape) {
  ScheduleTimeline unused;
  return simulateSchedule(schedule, shape, 1, 1, unused);
}

std::string simulateSchedule(const PipelineSchedule &schedule,
                             const PipelineShape &shape,
                             const StepCosts &costs,
                             ScheduleTimeline &timeline) {
  if (std::string err = checkSizes(shape); !err.empty())
    return err;
  const size_t chunks = size_t(shape.chunks());
  if (costs.forward.size() != chunks || costs.backward.size() != chunks)
    return "step costs are given for " + str(costs.forward.size()) +
           " forward and " + str(costs.backward.size()) +
           " backward chunks but the pipeline has " + str(chunks);
  auto good = [](double c) { return std::isfinite(c) && c >= 0; };
  if (!std::all_of(costs.forward.begin(), costs.forward.end(), good) ||
      !std::all_of(costs.backward.begin(), costs.backward.end(), good) ||
      !good(costs.transfer))
    return "step costs must be finite and non-negative";
  if (std::string err = runSchedule(schedule, shape, costs, timeline);
      !err.empty() || !costs.speedup)
    return err;
  runShared(schedule, shape, costs, timeline);
  return "";
}

std::string simulateSchedule(const PipelineSchedule &schedule,
                             const PipelineShape &shape, double forwardCost,
                             double backwardCost, ScheduleTimeline &timeline) {
  if (std::string err = checkSizes(shape); !err.empty())
    return err;
  if (!(std::isfinite(forwardCost) && forwardCost >= 0 &&
        std::isfinite(backwardCost) && backwardCost >= 0))
    return "step costs must be finite and non-negative";
  const size_t chunks = size_t(shape.chunks());
  StepCosts costs{std::vector<double>(chunks, forwardCost),
                  std::vector<double>(chunks, backwardCost), 0.0};
  return runSchedule(schedule, shape, costs, timeline);
}

} // namespace ernie::runtime

namespace ernie::runtime {

std::string formatSteps(const std::vector<PipelineStep> &steps) {
  std::string text;
  for (const PipelineStep &s : steps) {
    if (!text.empty())
      text += ' ';
    text += s.action == PipelineAction::Forward ? 'F' : 'B';
    text += std::to_string(s.chunk) + ":" + std::to_string(s.microBatch);
  }
  return text;
}

std::string parseSteps(const std::string &text,
                       std::vector<PipelineStep> &steps) {
  std::istringstream words(text);
  std::string word;
  while (words >> word) {
    PipelineStep step{PipelineAction::Forward, 0, 0};
    char action = word[0];
    size_t colon = word.find(':');
    auto isNumber = [](const std::string &s) {
      return !s.empty() && s.size() < 18 &&
             std::all_of(s.begin(), s.end(),
                         [](char c) { return c >= '0' && c <= '9'; });
    };
    std::string chunk = colon == std::string::npos ? "" : word.substr(1, colon - 1);
    std::string mb = colon == std::string::npos ? "" : word.substr(colon + 1);
    if ((action != 'F' && action != 'B') || !isNumber(chunk) || !isNumber(mb))
      return "schedule step '" + word +
             "' is not F<chunk>:<micro-batch> or B<chunk>:<micro-batch>";
    step.action =
        action == 'F' ? PipelineAction::Forward : PipelineAction::Backward;
    step.chunk = std::stoll(chunk);
    step.microBatch = std::stoll(mb);
    steps.push_back(step);
  }
  return "";
}

} // namespace ernie::runtime
