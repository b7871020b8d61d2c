//===- PipelineDecoding.cpp - a pipelined program's stages, checked -------===//
//
// Decodes a pipelined program's pipeline table and checks what runs across
// its stages: each chunk's functions, the hand-offs between them, the
// micro-batch inputs and reductions, and the schedule of every stage.
//
//===----------------------------------------------------------------------===//

#include "ProgramDecoding.h"

#include "ernie/runtime/HostTensor.h"
#include "ernie/runtime/PipelineSchedule.h"

#include "ernie/program/program_generated.h"
#include "ernie/runtime/ProgramFormat.h"

#include <zlib.h>

#include <algorithm>
#include <cmath>
#include <fstream>
#include <iterator>
#include <map>
#include <set>
#include <sstream>

namespace ernie::runtime::loader {

namespace {

/// k for an input named "input.<k>" (decimal, no sign, no leading zeros),
/// else -1.
int64_t batchInputIndex(const std::string &name) {
  const std::string prefix = "input.";
  if (name.size() <= prefix.size() || name.compare(0, prefix.size(), prefix))
    return -1;
  std::string digits = name.substr(prefix.size());
  if (digits.size() > 9 || (digits.size() > 1 && digits[0] == '0') ||
      !std::all_of(digits.begin(), digits.end(),
                   [](char c) { return c >= '0' && c <= '9'; }))
    return -1;
  return std::stoll(digits);
}

/// A program without a Pipeline table has no pipeline roles or ops.
} // namespace

void checkNotPipelined(const std::vector<std::vector<Function>> &stages,
                       const Checker &check) {
  for (size_t s = 0; s < stages.size(); ++s)
    for (const Function &fn : stages[s]) {
      const std::string at = "function @" + fn.name;
      auto roles = [&](const std::vector<TensorSpec> &specs, const char *what) {
        for (size_t i = 0; i < specs.size(); ++i)
          check.require(specs[i].role != Role::Residual &&
                            specs[i].role != Role::Gradient &&
                            !isMicroBatchReduced(specs[i].role),
                        at + ", " + what + " " + std::to_string(i) +
                            ": the role " + roleName(specs[i].role) +
                            " belongs to pipelined programs (this one has "
                            "no pipeline)");
      };
      roles(fn.arguments, "argument");
      roles(fn.results, "result");
      for (size_t i = 0; i < fn.instructions.size(); ++i)
        check.require(!isStageOp(fn.instructions[i].op),
                      at + ", instruction #" + std::to_string(i) + " (" +
                          fn.instructions[i].op +
                          "): only pipelined programs talk between stages");
    }
}

/// Decodes and checks the Pipeline table and everything a pipelined
/// program's stages must hold (Program.h, program.fbs).
PipelineSpec decodePipeline(const fb::Program *p,
                            const std::vector<std::vector<Function>> &stages,
                            const std::string &stageAxis,
                            const Checker &check) {
  const fb::Pipeline *fp = p->pipeline();
  PipelineSpec spec;
  spec.microBatches = fp->micro_batches();
  spec.virtualStages = fp->virtual_stages();
  spec.schedule = str(fp->schedule());
  constexpr int64_t kLimit = int64_t(1) << 30;
  check.require(spec.microBatches >= 1 && spec.microBatches <= kLimit,
                "has a pipeline of " + std::to_string(spec.microBatches) +
                    " micro-batches; it needs at least 1");
  check.require(spec.virtualStages >= 1 && spec.virtualStages <= kLimit,
                "has a pipeline of " + std::to_string(spec.virtualStages) +
                    " virtual stages per stage; it needs at least 1");
  const int64_t S = static_cast<int64_t>(stages.size());
  const int64_t C = S * spec.virtualStages;

  // The schedule: one list per stage, then the schedule checker.
  for (int64_t s = 0; s < S; ++s) {
    const fb::Stage *stage = p->stages()->Get(static_cast<flatbuffers::uoffset_t>(s));
    std::vector<PipelineStep> steps;
    if (stage->schedule())
      for (const fb::PipelineStep *step : *stage->schedule()) {
        PipelineAction action;
        switch (step->action()) {
        case fb::PipelineAction::Forward: action = PipelineAction::Forward; break;
        case fb::PipelineAction::Backward: action = PipelineAction::Backward; break;
        default:
          check.fail("stage " + std::to_string(s) +
                     "'s schedule has an unknown action code " +
                     std::to_string(int(step->action())));
        }
        steps.push_back({action, step->chunk(), step->micro_batch()});
      }
    spec.steps.push_back(std::move(steps));
  }
  PipelineShape shape;
  shape.stages = S;
  shape.virtualStages = spec.virtualStages;
  shape.microBatches = spec.microBatches;
  std::string problem = checkSchedule(spec.steps, shape);
  check.require(problem.empty(), "has a pipeline schedule (" + spec.schedule +
                                     ") that cannot run: " + problem);

  std::map<int64_t, const TensorSpec *> inputs; // k -> first spec seen
  std::map<int64_t, std::string> inputWhere;
  for (int64_t s = 0; s < S; ++s) {
    const std::vector<Function> &fns = stages[s];
    const std::string inStage = " (stage " + std::to_string(s) + ")";
    auto find = [&](const std::string &name) -> const Function * {
      for (const Function &fn : fns)
        if (fn.name == name)
          return &fn;
      return nullptr;
    };
    auto need = [&](const std::string &name) -> const Function & {
      const Function *fn = find(name);
      if (!fn)
        check.fail("stage " + std::to_string(s) + " has no @" + name +
                   ", which its pipeline needs");
      return *fn;
    };
    auto at = [&](const Function &fn) { return "function @" + fn.name + inStage; };
    auto argAt = [&](const Function &fn, size_t i, const char *what) {
      return at(fn) + ", " + what + " " + std::to_string(i);
    };
    /// Argument or result `i` of `fn` (`spec`) has one of the `allowed` roles.
    auto requireRole = [&](const Function &fn, size_t i, const TensorSpec &spec,
                           std::initializer_list<Role> allowed, const char *what) {
      check.require(std::find(allowed.begin(), allowed.end(), spec.role) !=
                        allowed.end(),
                    argAt(fn, i, what) + ": a " + roleName(spec.role) + " " +
                        what + " has no place here");
    };
    /// Every argument's role is one of `allowed`.
    auto argRoles = [&](const Function &fn, std::initializer_list<Role> allowed) {
      for (size_t i = 0; i < fn.arguments.size(); ++i) {
        const TensorSpec &arg = fn.arguments[i];
        requireRole(fn, i, arg, allowed, "argument");
        if (arg.role == Role::Parameter || arg.role == Role::OptimizerState ||
            arg.role == Role::Residual || arg.role == Role::Gradient ||
            isMicroBatchReduced(arg.role))
          check.require(!arg.name.empty(), argAt(fn, i, "argument") +
                                               ": a " + roleName(arg.role) +
                                               " needs a name");
        if (arg.role == Role::Input) {
          int64_t k = batchInputIndex(arg.name);
          check.require(k >= 0, argAt(fn, i, "argument") + ": a batch input "
                                                           "is named input.<k>, "
                                                           "not '" +
                                    arg.name + "'");
          check.require(!arg.globalShape.empty(),
                        argAt(fn, i, "argument") +
                            ": a batch input needs a dimension 0 to split "
                            "into micro-batches");
          auto [it, fresh] = inputs.emplace(k, &arg);
          if (fresh)
            inputWhere[k] = argAt(fn, i, "argument");
          else
            check.require(it->second->globalShape == arg.globalShape,
                          argAt(fn, i, "argument") + ": micro-batch " +
                              shapeString(arg.globalShape) + " of " + arg.name +
                              " differs from " + inputWhere[k] + "'s " +
                              shapeString(it->second->globalShape));
        }
      }
    };
    /// The number of `role` results; each is a replicated scalar if a loss.
    auto countResults = [&](const Function &fn, Role role) {
      int64_t n = 0;
      for (size_t i = 0; i < fn.results.size(); ++i) {
        const TensorSpec &res = fn.results[i];
        if (res.role != role)
          continue;
        ++n;
        if (role == Role::Loss)
          check.require(elementCount(res.localShape) == 1 &&
                            elementCount(res.globalShape) == 1 &&
                            res.sharding.partials.empty(),
                        argAt(fn, i, "result") +
                            ": a pipelined loss must be a replicated scalar "
                            "(no pending reduction)");
      }
      return n;
    };
    auto onlyResults = [&](const Function &fn, std::initializer_list<Role> allowed) {
      for (size_t i = 0; i < fn.results.size(); ++i)
        requireRole(fn, i, fn.results[i], allowed, "result");
    };
    auto sameLocal = [](const TensorSpec &a, const TensorSpec &b) {
      return a.type == b.type && a.localShape == b.localShape;
    };
    auto typeString = [](const TensorSpec &t) {
      return shapeString(t.localShape) + "x" + std::string(name(t.type));
    };

    // What this stage's forwards and backwards hand to its update: gradients
    // (summed over micro-batches), maxima and batch sums, by name.
    std::map<std::string, const TensorSpec *> handed;
    auto hand = [&](const Function &fn, size_t i,
                    std::set<std::string> &own) {
      const TensorSpec &res = fn.results[i];
      const std::string what = roleName(res.role);
      check.require(!res.name.empty(),
                    argAt(fn, i, "result") + ": a " + what + " needs a name");
      check.require(own.insert(res.name).second,
                    argAt(fn, i, "result") + ": a second " + what + " '" +
                        res.name + "'");
      auto [it, fresh] = handed.emplace(res.name, &res);
      check.require(fresh || (it->second->role == res.role &&
                              sameLocal(*it->second, res)),
                    argAt(fn, i, "result") + ": the " + what + " '" +
                        res.name + "' is " + typeString(res) + " here but a " +
                        roleName(it->second->role) + " of " +
                        typeString(*it->second) +
                        " in another chunk of the stage");
    };
    for (int64_t c = s; c < C; c += S) {
      const bool last = c == C - 1;
      const Function &fwd = need(pipelineFunction("train_forward", c));
      const Function &bwd = need(pipelineFunction("train_backward", c));
      const Function &ev = need(pipelineFunction("eval_forward", c));
      // State the chunks read (fp8 amax histories) is updated once per
      // step, by the update.
      argRoles(fwd, {Role::Parameter, Role::OptimizerState, Role::Input});
      onlyResults(fwd, {Role::Residual, Role::Loss, Role::MicroBatchMax,
                        Role::MicroBatchSum});
      std::set<std::string> fwdOwn;
      for (size_t i = 0; i < fwd.results.size(); ++i)
        if (isMicroBatchReduced(fwd.results[i].role))
          hand(fwd, i, fwdOwn);
      int64_t losses = countResults(fwd, Role::Loss);
      if (last)
        check.require(losses == 1, at(fwd) + ": the last chunk's forward "
                                             "needs exactly one loss result, "
                                             "not " + std::to_string(losses));
      else
        check.require(losses == 0, at(fwd) + ": only the last chunk's (" +
                                       std::to_string(C - 1) +
                                       ") forward has a loss");
      std::map<std::string, const TensorSpec *> residuals;
      for (size_t i = 0; i < fwd.results.size(); ++i) {
        const TensorSpec &res = fwd.results[i];
        if (res.role != Role::Residual)
          continue;
        check.require(!res.name.empty(), argAt(fwd, i, "result") +
                                             ": a residual needs a name");
        check.require(residuals.emplace(res.name, &res).second,
                      argAt(fwd, i, "result") + ": a second residual named '" +
                          res.name + "'");
      }
      argRoles(bwd, {Role::Parameter, Role::OptimizerState, Role::Input,
                     Role::Residual, Role::Gradient});
      std::set<std::string> sums;
      for (size_t i = 0; i < bwd.arguments.size(); ++i) {
        const TensorSpec &arg = bwd.arguments[i];
        if (arg.role == Role::Gradient) {
          check.require(sums.insert(arg.name).second,
                        argAt(bwd, i, "argument") +
                            ": a second running sum of gradient '" + arg.name +
                            "'");
          // The running sum the backward adds its micro-batch into and
          // returns as the result of the same name.
          auto res = std::find_if(
              bwd.results.begin(), bwd.results.end(), [&](const TensorSpec &r) {
                return r.role == Role::Gradient && r.name == arg.name;
              });
          check.require(res != bwd.results.end(),
                        argAt(bwd, i, "argument") + ": @" + bwd.name +
                            " takes the running sum of gradient '" + arg.name +
                            "' but returns no gradient of that name");
          check.require(sameLocal(*res, arg),
                        argAt(bwd, i, "argument") + ": the running sum '" +
                            arg.name + "' is " + typeString(arg) +
                            " but the gradient it sums is " +
                            typeString(*res));
          continue;
        }
        if (arg.role != Role::Residual)
          continue;
        auto it = residuals.find(arg.name);
        check.require(it != residuals.end(),
                      argAt(bwd, i, "argument") + ": @" + fwd.name +
                          " has no residual named '" + arg.name + "'");
        check.require(sameLocal(*it->second, arg),
                      argAt(bwd, i, "argument") + ": residual '" + arg.name +
                          "' is " + typeString(arg) + " here but @" + fwd.name +
                          " makes it " + typeString(*it->second));
      }
      onlyResults(bwd,
                  {Role::Gradient, Role::MicroBatchMax, Role::MicroBatchSum});
      std::set<std::string> bwdOwn;
      for (size_t i = 0; i < bwd.results.size(); ++i)
        hand(bwd, i, bwdOwn);
      // It reads state too (MoE routing's selection bias), updating none.
      argRoles(ev, {Role::Parameter, Role::OptimizerState, Role::Input});
      int64_t evalLosses = countResults(ev, Role::Loss);
      if (last)
        check.require(evalLosses == 1, at(ev) + ": the last chunk's eval "
                                                "forward needs exactly one "
                                                "loss result, not " +
                                           std::to_string(evalLosses));
    }
    const Function &update = need(pipelineFunction("train_update", s));
    argRoles(update, {Role::Parameter, Role::Gradient, Role::MicroBatchMax,
                      Role::MicroBatchSum, Role::OptimizerState,
                      Role::LearningRate, Role::Step});
    for (size_t i = 0; i < update.arguments.size(); ++i) {
      const TensorSpec &arg = update.arguments[i];
      if (arg.role != Role::Gradient && !isMicroBatchReduced(arg.role))
        continue;
      auto it = handed.find(arg.name);
      check.require(it != handed.end() && it->second->role == arg.role,
                    argAt(update, i, "argument") + ": no forward or backward "
                        "of stage " + std::to_string(s) + " makes the " +
                        roleName(arg.role) + " '" + arg.name + "'");
      check.require(sameLocal(*it->second, arg),
                    argAt(update, i, "argument") + ": the " +
                        roleName(arg.role) + " '" + arg.name + "' is " +
                        typeString(arg) + " here but the stage makes " +
                        typeString(*it->second));
    }
    if (const Function *init = find(pipelineFunction("init", s)))
      argRoles(*init, {Role::Parameter});

    // Across stages only through the pipeline's own ops: no sharding or
    // collective names the stage axis; peers and members are other stages.
    for (const Function &fn : fns) {
      auto noStageAxis = [&](const std::vector<TensorSpec> &specs,
                             const char *what) {
        if (stageAxis.empty())
          return;
        for (size_t i = 0; i < specs.size(); ++i) {
          bool named = false;
          for (const Axes &axes : specs[i].sharding.dims)
            named |= std::find(axes.begin(), axes.end(), stageAxis) != axes.end();
          for (const auto &partial : specs[i].sharding.partials)
            named |= partial.first == stageAxis;
          check.require(!named, argAt(fn, i, what) +
                                    ": its sharding names the stage axis '" +
                                    stageAxis + "'");
        }
      };
      noStageAxis(fn.arguments, "argument");
      noStageAxis(fn.results, "result");
      for (size_t i = 0; i < fn.instructions.size(); ++i) {
        const Instruction &inst = fn.instructions[i];
        const std::string where = at(fn) + ", instruction #" +
                                  std::to_string(i) + " (" + inst.op + ")";
        check.require(stageAxis.empty() ||
                          std::find(inst.axes.begin(), inst.axes.end(),
                                    stageAxis) == inst.axes.end(),
                      where + ": a collective over the stage axis '" +
                          stageAxis + "' (stages talk through ernie.send, "
                                      "ernie.recv and the stage collectives)");
        if (inst.op == "ernie.send" || inst.op == "ernie.recv") {
          int64_t peer = inst.attrs.getInt("peer");
          check.require(peer >= 0 && peer < C,
                        where + ": peer chunk " + std::to_string(peer) +
                            " is not one of the " + std::to_string(C) +
                            " chunks");
          check.require(peer % S != s, where + ": peer chunk " +
                                           std::to_string(peer) +
                                           " is on this stage");
        } else if (inst.op == "ernie.stage_all_reduce" ||
                   inst.op == "ernie.stage_broadcast") {
          std::vector<int64_t> members = inst.attrs.getInts("stages");
          bool sorted = true;
          for (size_t j = 1; j < members.size(); ++j)
            sorted &= members[j - 1] < members[j];
          check.require(sorted && !members.empty() && members.front() >= 0 &&
                            members.back() < S,
                        where + ": 'stages' must be distinct stages in [0, " +
                            std::to_string(S) + "), ascending");
          check.require(std::find(members.begin(), members.end(), s) !=
                            members.end(),
                        where + ": 'stages' does not hold this stage");
        }
      }
    }
  }
  // Every send meets exactly one receive on the peer's stage (and the other
  // way round) in the same part of the step, on the same channel, with as
  // many bytes; every stage collective meets its twin on each member stage.
  // A mismatch would otherwise wait out a timeout, or fail one side. The
  // executor finds a peer by its stage (peer mod stages), so that is what
  // pairs; a chunk's functions name chunks, the update and init name stages.
  enum Phase { Train, Eval, Init };
  struct Place {
    Phase phase;
    int64_t chunk; // -1: the stage's update or init, run once per step
  };
  auto placeOf = [&](const Function &fn, int64_t s) -> std::optional<Place> {
    for (int64_t c = s; c < C; c += S) {
      if (fn.name == pipelineFunction("train_forward", c) ||
          fn.name == pipelineFunction("train_backward", c))
        return Place{Train, c};
      if (fn.name == pipelineFunction("eval_forward", c))
        return Place{Eval, c};
    }
    if (fn.name == pipelineFunction("train_update", s))
      return Place{Train, -1};
    if (fn.name == pipelineFunction("init", s))
      return Place{Init, -1};
    return std::nullopt;
  };
  struct Transfer {
    Phase phase;
    int64_t from, to, fromStage, toStage, channel;
    bool perMicroBatch; // in a chunk's function: once per micro-batch
    uint64_t bytes;
    std::string where;
  };
  struct StageCollective {
    Phase phase;
    int64_t stage, channel;
    std::string op;
    std::vector<int64_t> members;
    uint64_t bytes;
    std::string where;
  };
  std::vector<Transfer> sends, recvs;
  std::vector<StageCollective> stageCollectives;
  for (int64_t s = 0; s < S; ++s)
    for (const Function &fn : stages[s]) {
      std::optional<Place> place = placeOf(fn, s);
      for (size_t i = 0; i < fn.instructions.size(); ++i) {
        const Instruction &inst = fn.instructions[i];
        if (!isStageOp(inst.op))
          continue;
        std::string where = "function @" + fn.name + " (stage " +
                            std::to_string(s) + "), instruction #" +
                            std::to_string(i) + " (" + inst.op + ")";
        check.require(place.has_value(),
                      where + ": only a chunk's functions, the update and "
                              "init talk between stages");
        int64_t self = place->chunk >= 0 ? place->chunk : s;
        int64_t channel = inst.attrs.getInt("channel");
        bool perMicroBatch = place->chunk >= 0;
        if (inst.op == "ernie.send") {
          int64_t peer = inst.attrs.getInt("peer");
          sends.push_back({place->phase, self, peer, s, peer % S, channel,
                           perMicroBatch, fn.buffers[inst.operands[0]].bytes,
                           where});
        } else if (inst.op == "ernie.recv") {
          int64_t peer = inst.attrs.getInt("peer");
          recvs.push_back({place->phase, peer, self, peer % S, s, channel,
                           perMicroBatch, fn.buffers[inst.results[0]].bytes,
                           where});
        } else {
          stageCollectives.push_back({place->phase, s, channel, inst.op,
                                      inst.attrs.getInts("stages"),
                                      fn.buffers[inst.operands[0]].bytes,
                                      where});
        }
      }
    }
  auto match = [&](const std::vector<Transfer> &mine,
                   const std::vector<Transfer> &theirs, const char *other,
                   bool sending) {
    for (const Transfer &t : mine) {
      const Transfer *partner = nullptr;
      for (const Transfer &u : theirs) {
        if (u.phase != t.phase || u.fromStage != t.fromStage ||
            u.toStage != t.toStage || u.channel != t.channel)
          continue;
        if (partner)
          check.fail(t.where + ": both " + partner->where + " and " + u.where +
                     " match it");
        partner = &u;
        check.require(u.bytes == t.bytes,
                      t.where + ": moves " + std::to_string(t.bytes) +
                          " bytes on channel " + std::to_string(t.channel) +
                          ", but " + u.where + " " + std::to_string(u.bytes));
      }
      check.require(partner != nullptr,
                    t.where + ": no " + other + " in chunk " +
                        std::to_string(sending ? t.to : t.from) +
                        "'s functions matches it (chunk " +
                        std::to_string(t.from) + " to chunk " +
                        std::to_string(t.to) + ", channel " +
                        std::to_string(t.channel) + ")");
      // A receive per micro-batch fed by one send per step would wait for
      // the micro-batches after the first.
      const Transfer &recv = sending ? *partner : t, &send = sending ? t : *partner;
      check.require(!recv.perMicroBatch || send.perMicroBatch,
                    recv.where + ": receives once per micro-batch, but " +
                        send.where + " sends once per step");
    }
  };
  match(sends, recvs, "ernie.recv", true);
  match(recvs, sends, "ernie.send", false);
  for (const StageCollective &c : stageCollectives)
    for (int64_t t : c.members) {
      if (t == c.stage)
        continue;
      int64_t twins = 0;
      for (const StageCollective &d : stageCollectives)
        if (d.stage == t && d.phase == c.phase && d.channel == c.channel) {
          ++twins;
          check.require(d.op == c.op && d.members == c.members &&
                            d.bytes == c.bytes,
                        c.where + ": " + d.where + " on channel " +
                            std::to_string(c.channel) +
                            " differs in its op, stages or bytes");
        }
      check.require(twins == 1, c.where + ": member stage " +
                                    std::to_string(t) + " has " +
                                    std::to_string(twins) +
                                    " stage collectives on channel " +
                                    std::to_string(c.channel) + ", not one");
    }

  for (const auto &[k, first] : inputs) {
    check.require(k == static_cast<int64_t>(spec.inputs.size()),
                  "has no function taking batch input input." +
                      std::to_string(spec.inputs.size()) +
                      " (inputs are numbered from 0 without gaps)");
    spec.inputs.push_back(*first);
  }
  return spec;
}

} // namespace ernie::runtime::loader
