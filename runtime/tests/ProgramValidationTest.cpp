//===- ProgramValidationTest.cpp - kernel signatures and bounds at load ----===//
//
// Program::load checks every kernel instruction against its op's rule
// (kernelSignatureProblem), every shape for zero, negative and overflowing
// sizes, uneven shards as ceil(global / parts), and buffers read before
// anything wrote them — so no kernel reads or writes past a buffer.
//
//===----------------------------------------------------------------------===//

#include "ProgramBuilder.h"

#include "ernie/runtime/HostTensor.h"
#include "ernie/runtime/Session.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

using namespace ernie::runtime;
using namespace ernie::runtime::testing;
using ::testing::HasSubstr;

namespace {

std::string errorOf(const ProgramBuilder &pb) {
  try {
    pb.parse("broken.ernie");
  } catch (const ProgramError &e) {
    return e.what();
  }
  ADD_FAILURE() << "the program was accepted";
  return "";
}

/// One function on mesh x=2 whose single instruction `op` reads `in` and
/// writes `out` (buffer shapes), all f32 unless `types` says otherwise.
ProgramBuilder oneOp(const std::string &op,
                     const std::vector<std::vector<int64_t>> &in,
                     const std::vector<std::vector<int64_t>> &out,
                     AttrList attrs = {}, std::vector<DType> inTypes = {},
                     std::vector<DType> outTypes = {}) {
  ProgramBuilder pb({"x"}, {2});
  FunctionBuilder &f = pb.function("main");
  std::vector<uint32_t> ins, outs;
  for (size_t i = 0; i < in.size(); ++i) {
    ins.push_back(f.buffer(i < inTypes.size() ? inTypes[i] : DType::F32, in[i]));
    f.arg(ins.back());
  }
  for (size_t i = 0; i < out.size(); ++i)
    outs.push_back(
        f.buffer(i < outTypes.size() ? outTypes[i] : DType::F32, out[i]));
  f.op(op, ins, outs, attrs);
  for (uint32_t o : outs)
    f.ret(o);
  return pb;
}

} // namespace

TEST(KernelSignatures, EveryCpuKernelHasOne) {
  // A kernel without a signature would run unchecked: load refuses it, so
  // a new kernel fails here until its rule is written.
  Instruction inst;
  Function fn;
  for (const std::string &op : cpuKernelNames()) {
    inst.op = op;
    EXPECT_THAT(kernelSignatureProblem(inst, fn),
                ::testing::Not(HasSubstr("no signature check")))
        << op;
  }
}

TEST(KernelSignatures, MatmulFollowsTransposesAndBatches) {
  EXPECT_NO_THROW(oneOp("ernie.matmul", {{4, 8}, {8, 6}}, {{4, 6}}).parse());
  EXPECT_NO_THROW(oneOp("ernie.matmul", {{8, 4}, {6, 8}}, {{4, 6}},
                        {{"transpose_a", true}, {"transpose_b", true}})
                      .parse());
  EXPECT_NO_THROW(
      oneOp("ernie.matmul", {{3, 4, 8}, {8, 6}}, {{3, 4, 6}}).parse());
  EXPECT_THAT(errorOf(oneOp("ernie.matmul", {{4, 8}, {8, 6}}, {{4, 6}},
                            {{"transpose_a", true}})),
              HasSubstr("instruction #0 (ernie.matmul): the contraction sizes "
                        "differ: [4, 8]xf32 (transposed) by [8, 6]xf32"));
  EXPECT_THAT(errorOf(oneOp("ernie.matmul", {{2, 4, 8}, {3, 8, 6}}, {{2, 4, 6}})),
              HasSubstr("the batch dimensions differ"));
  // The case: a 4x8 by 8x64 product out of a 2-element buffer.
  EXPECT_THAT(errorOf(oneOp("ernie.matmul", {{4, 8}, {2}}, {{4, 64}})),
              HasSubstr("matmul operands need rank >= 2, got [4, 8]xf32 and "
                        "[2]xf32"));
  EXPECT_THAT(errorOf(oneOp("ernie.matmul", {{4, 8}, {8, 6}}, {{4, 5}})),
              HasSubstr("the result must be [4, 6]xf32, not [4, 5]xf32"));
  EXPECT_THAT(errorOf(oneOp("ernie.matmul", {{4, 8}, {8, 6}}, {{4, 6}},
                            {{"transpose_a", int64_t(1)}})),
              HasSubstr("attribute 'transpose_a': attribute 'transpose_a' is "
                        "not a flag"));
}

TEST(KernelSignatures, CountsTypesAndShapes) {
  EXPECT_THAT(errorOf(oneOp("ernie.add", {{4}, {4}}, {})),
              HasSubstr("(ernie.add): takes 1 result, not 0"));
  EXPECT_THAT(errorOf(oneOp("ernie.add", {{4}}, {{4}})),
              HasSubstr("(ernie.add): takes 2 operands, not 1"));
  EXPECT_THAT(errorOf(oneOp("ernie.add", {{4}, {2}}, {{4}})),
              HasSubstr("operand 1 ([2]xf32) must be [4]xf32 like operand 0"));
  EXPECT_THAT(errorOf(oneOp("ernie.exp", {{4}}, {{4}}, {}, {DType::I64},
                            {DType::I64})),
              HasSubstr("operand 0 is [4]xi64; it must hold floats"));
  EXPECT_THAT(errorOf(oneOp("ernie.reduce_sum", {{4, 5}}, {{4}},
                            {{"axes", std::vector<int64_t>{1}},
                             {"keepdim", true}})),
              HasSubstr("the result must be [4, 1]xf32, not [4]xf32"));
  EXPECT_THAT(errorOf(oneOp("ernie.reduce_sum", {{4, 5}}, {{1}},
                            {{"axes", std::vector<int64_t>{1, 0}}})),
              HasSubstr("the axes must be sorted and distinct"));
  EXPECT_THAT(errorOf(oneOp("ernie.softmax", {{4, 5}}, {{4, 5}},
                            {{"axis", int64_t(2)}})),
              HasSubstr("'axis' = 2 is not a dimension of a rank-2 operand"));
  EXPECT_THAT(errorOf(oneOp("ernie.transpose", {{2, 3}}, {{2, 3}},
                            {{"perm", std::vector<int64_t>{0, 0}}})),
              HasSubstr("perm [0, 0] is not a permutation of 2 dimensions"));
  EXPECT_THAT(errorOf(oneOp("ernie.gather", {{5, 3}, {4}}, {{4, 3}},
                            {{"axis", int64_t(0)}}, {DType::F32, DType::F32})),
              HasSubstr("the indices is [4]xf32; it must hold indices"));
  EXPECT_THAT(errorOf(oneOp("ernie.cross_entropy", {{4, 10}, {4}}, {{}},
                            {{"reduction", std::string("median")}},
                            {DType::F32, DType::I64})),
              HasSubstr("unknown reduction 'median'"));
  EXPECT_THAT(errorOf(oneOp("ernie.slice", {{4}}, {{3}},
                            {{"start", std::vector<int64_t>{2}},
                             {"limit", std::vector<int64_t>{5}},
                             {"step", std::vector<int64_t>{1}}})),
              HasSubstr("the range 2:5:1 does not fit dimension 0"));
  EXPECT_THAT(errorOf(oneOp("ernie.concat", {{2, 3}, {2, 4}}, {{2, 8}},
                            {{"axis", int64_t(1)}})),
              HasSubstr("the inputs along axis 1 add up to 7, not to the 8"));
  EXPECT_THAT(
      errorOf(oneOp("ernie.attention", {{1, 4, 3, 8}, {1, 4, 2, 8}, {1, 4, 2, 8}},
                    {{1, 4, 3, 8}})),
      HasSubstr("query heads must be a multiple of key/value heads"));
  EXPECT_THAT(errorOf(oneOp("ernie.sgd_update", {{4}, {4}, {3}, {}}, {{4}, {3}})),
              HasSubstr("must have the shape [4] of the parameter"));
}

TEST(ProgramBounds, ZeroNegativeAndOverflowingShapes) {
  EXPECT_THAT(errorOf(oneOp("ernie.relu", {{4, 0}}, {{4, 0}})),
              HasSubstr("buffer 0: dimension 1 of [4, 0] is 0 (dimensions are "
                        "at least 1)"));
  ProgramBuilder pb = oneOp("ernie.relu", {{4}}, {{4}});
  pb.get("main").buffers[0].shape = {int64_t(1) << 40, int64_t(1) << 30};
  EXPECT_THAT(errorOf(pb), HasSubstr("the element count of [1099511627776, "
                                     "1073741824] overflows 64 bits"));
}

TEST(ProgramBounds, UnevenShardsHoldTheCeiling) {
  // 5 rows over 2 ranks: 3 each, the last piece padded.
  ProgramBuilder pb({"x"}, {2});
  FunctionBuilder &f = pb.function("main");
  uint32_t a = f.buffer(DType::F32, {3, 2}), r = f.buffer(DType::F32, {3, 2});
  f.arg(a, Tensor().split({{"x"}, {}}).global({5, 2}))
      .op("ernie.relu", {a}, {r})
      .ret(r, Tensor().split({{"x"}, {}}).global({5, 2}));
  Program p = pb.parse();
  EXPECT_EQ(p.function(0, "main")->arguments[0].globalShape,
            (std::vector<int64_t>{5, 2}));
  pb.get("main").arguments[0].second.global({7, 2});
  EXPECT_THAT(errorOf(pb), HasSubstr("argument 0: global [7, 2] split by its "
                                     "sharding is not local [3, 2]"));
}

TEST(ProgramBounds, RepeatedAxesAndUnwrittenBuffers) {
  ProgramBuilder pb({"x"}, {2});
  FunctionBuilder &f = pb.function("main");
  uint32_t a = f.buffer(DType::F32, {4}), r = f.buffer(DType::F32, {4});
  f.arg(a).op("ernie.all_reduce", {a}, {r}, {{"kind", std::string("sum")}},
              {"x", "x"});
  f.ret(r);
  EXPECT_THAT(errorOf(pb), HasSubstr("(ernie.all_reduce): names a mesh axis "
                                     "twice"));
  ProgramBuilder unread = oneOp("ernie.relu", {{4}}, {{4}});
  FunctionBuilder &g = unread.get("main");
  uint32_t stale = g.buffer(DType::F32, {4});
  g.instructions[0].operands[0] = stale;
  EXPECT_THAT(errorOf(unread), HasSubstr("(ernie.relu): reads buffer 2, which "
                                         "no argument or earlier instruction "
                                         "wrote"));
}

// The executor binds an argument's buffer to the caller's tensor: no two
// arguments share one, and only an in-place result (an instruction reading
// it) may write it, or a caller's tensor could be written through another.
TEST(ProgramBounds, ArgumentBuffersAreTheirsAlone) {
  ProgramBuilder shared = oneOp("ernie.add", {{4}, {4}}, {{4}});
  FunctionBuilder &f = shared.get("main");
  f.arguments[1].first = f.arguments[0].first;
  EXPECT_THAT(errorOf(shared), HasSubstr("argument 1: buffer 0 is an earlier "
                                         "argument's"));
  ProgramBuilder over = oneOp("ernie.add", {{4}, {4}}, {{4}});
  FunctionBuilder &g = over.get("main");
  uint32_t y = g.arguments[1].first;
  g.op("ernie.relu", {g.arguments[0].first}, {y});
  EXPECT_THAT(errorOf(over),
              HasSubstr("instruction #1 (ernie.relu): writes argument buffer " +
                        std::to_string(y) + " without reading it"));
  // In place is fine.
  ProgramBuilder inPlace = oneOp("ernie.add", {{4}, {4}}, {{4}});
  FunctionBuilder &h = inPlace.get("main");
  h.op("ernie.relu", {h.arguments[1].first}, {h.arguments[1].first});
  EXPECT_NO_THROW(inPlace.parse("in-place.ernie"));
  // So is a value the function returns in the argument's place (the state
  // it replaces, which a caller donates).
  ProgramBuilder replaced = oneOp("ernie.add", {{4}, {4}}, {{4}});
  FunctionBuilder &k = replaced.get("main");
  k.op("ernie.relu", {k.results[0].first}, {k.arguments[1].first})
      .ret(k.arguments[1].first);
  EXPECT_NO_THROW(replaced.parse("replaced.ernie"));
}

// The arguments' region (after the arena) has no memory of its own: every
// buffer there must be an argument's, or a view of one, which a call binds.
TEST(ProgramBounds, TheArgumentsRegionHoldsOnlyArguments) {
  auto build = [](bool stray) {
    ProgramBuilder pb({"world"}, {1});
    FunctionBuilder &f = pb.function("main");
    uint32_t a = f.buffer(DType::F32, {16}), v = f.buffer(DType::F32, {4, 4}),
             r = f.buffer(DType::F32, {4, 4});
    f.buffers[a].offset = 64; // the region: [64, 128)
    f.buffers[v].offset = 64; // a's view
    f.buffers[r].offset = stray ? 64 : 0;
    f.arenaBytes = 64;
    f.argumentBytes = 64;
    f.arg(a)
        .op("ernie.reshape", {a}, {v})
        .op("ernie.relu", {v}, {r})
        .ret(r);
    return pb;
  };
  ProgramBuilder good = build(false);
  EXPECT_NO_THROW(good.parse("region.ernie"));
  ProgramBuilder stray = build(true);
  // The relu's result sits at the argument's offset without being its view.
  EXPECT_THAT(errorOf(stray), HasSubstr("buffer 2 lies in the arguments' region "
                                        "but is no argument's buffer nor a view "
                                        "of one"));
  ProgramBuilder outside = build(false);
  outside.get("main").argumentBytes = 32;
  EXPECT_THAT(errorOf(outside), HasSubstr("buffer 0: lies outside the arena of 64 "
                                          "bytes and the arguments' region of 32"));
}

TEST(ProgramBounds, RankCountsAreBounded) {
  EXPECT_THROW((Mesh{{"a", "b"}, {int64_t(1) << 32, int64_t(1) << 32}}),
               std::invalid_argument);
  EXPECT_THROW((Mesh{{"a"}, {kMaxRanks + 1}}), std::invalid_argument);
  EXPECT_NO_THROW((Mesh{{"a", "b"}, {1024, 1024}}));
  EXPECT_THROW((Mesh{{""}, {2}}), std::invalid_argument);
  // The thread backend starts a thread per rank: it stops at its bound.
  ProgramBuilder pb({"x"}, {2048});
  FunctionBuilder &f = pb.function("main");
  uint32_t a = f.buffer(DType::F32, {4}), r = f.buffer(DType::F32, {4});
  f.arg(a).op("ernie.relu", {a}, {r}).ret(r);
  try {
    Session session(pb.parse());
    ADD_FAILURE() << "a 2048-rank session started";
  } catch (const std::invalid_argument &e) {
    EXPECT_THAT(e.what(), HasSubstr("the thread backend runs at most 1024 ranks "
                                    "in one process; this mesh has 2048"));
  }
}
