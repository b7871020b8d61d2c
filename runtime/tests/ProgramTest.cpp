//===- ProgramTest.cpp - loading and validating program files ---------------===//
//
// Program files built in memory (ProgramBuilder.h), valid and broken one way
// at a time: every rejection names the file and its cause.
//
//===----------------------------------------------------------------------===//

#include "ProgramBuilder.h"

#include "ernie/runtime/Program.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <cstdio>
#include <fstream>

using namespace ernie::runtime;
using namespace ernie::runtime::testing;
using ::testing::HasSubstr;

namespace {

/// A small valid program on mesh x=2: a row-sharded input, gathered, then a
/// kernel. Buffers: 0 = a f32[2, 3], 1 = g f32[4, 3], 2 = r f32[4, 3].
ProgramBuilder validProgram() {
  ProgramBuilder pb({"x"}, {2});
  FunctionBuilder &f = pb.function("main");
  uint32_t a = f.buffer(DType::F32, {2, 3});
  uint32_t g = f.buffer(DType::F32, {4, 3});
  uint32_t r = f.buffer(DType::F32, {4, 3});
  f.arg(a, Tensor().named("a").split({{"x"}, {}}))
      .op("ernie.all_gather", {a}, {g}, {{"dim", int64_t(0)}}, {"x"},
          "model.mlir:3:7")
      .op("ernie.relu", {g}, {r})
      .ret(r, Tensor().as(Role::Loss));
  return pb;
}

/// The message of the ProgramError `parse` throws; fails the test if none.
template <typename Fn> std::string errorOf(Fn parse) {
  try {
    parse();
  } catch (const ProgramError &e) {
    return e.what();
  } catch (const std::exception &e) {
    ADD_FAILURE() << "not a ProgramError: " << e.what();
    return "";
  }
  ADD_FAILURE() << "the program was accepted";
  return "";
}

std::string errorOf(const ProgramBuilder &pb) {
  return errorOf([&] { pb.parse("broken.ernie"); });
}

std::string errorOfBytes(const std::vector<uint8_t> &file) {
  return errorOf([&] { ProgramBuilder::parseBytes(file, "broken.ernie"); });
}

/// Where the nested program's bytes lie in the file: [begin, end).
std::pair<size_t, size_t> payloadRange(const std::vector<uint8_t> &file) {
  const auto *env = fbs::GetProgramFile(file.data());
  size_t begin = env->program()->data() - file.data();
  return {begin, begin + env->program()->size()};
}

std::string tempPath(const std::string &name) {
  return ::testing::TempDir() + "ernie-program-test-" + name;
}

} // namespace

TEST(Program, LoadsWhatTheBuilderWrote) {
  Program p = validProgram().parse("good.ernie");
  EXPECT_EQ(p.source(), "good.ernie");
  EXPECT_EQ(p.producer(), "ProgramBuilder");
  EXPECT_EQ(p.mesh().axisNames(), (std::vector<std::string>{"x"}));
  EXPECT_EQ(p.mesh().axisSizes(), (std::vector<int64_t>{2}));
  EXPECT_EQ(p.numStages(), 1);
  EXPECT_EQ(p.stageOf(0), 0);
  EXPECT_EQ(p.stageOf(1), 0);
  EXPECT_EQ(p.function(0, "nope"), nullptr);
  const Function *f = p.function(0, "main");
  ASSERT_NE(f, nullptr);
  ASSERT_EQ(f->buffers.size(), 3u);
  // Packed at 64-byte steps: 24 bytes, then 48, then 48.
  EXPECT_EQ(f->buffers[0].offset, 0u);
  EXPECT_EQ(f->buffers[0].bytes, 24u);
  EXPECT_EQ(f->buffers[1].offset, 64u);
  EXPECT_EQ(f->buffers[2].offset, 128u);
  EXPECT_EQ(f->buffers[2].bytes, 48u);
  EXPECT_EQ(f->arenaBytes, 176u);
  ASSERT_EQ(f->arguments.size(), 1u);
  const TensorSpec &a = f->arguments[0];
  EXPECT_EQ(a.name, "a");
  EXPECT_EQ(a.role, Role::Input);
  EXPECT_EQ(a.type, DType::F32);
  EXPECT_EQ(a.localShape, (std::vector<int64_t>{2, 3}));
  EXPECT_EQ(a.globalShape, (std::vector<int64_t>{4, 3}));
  ASSERT_EQ(a.sharding.dims.size(), 2u);
  EXPECT_EQ(a.sharding.dims[0], (Axes{"x"}));
  EXPECT_TRUE(a.sharding.dims[1].empty());
  EXPECT_FALSE(a.sharding.isReplicated());
  ASSERT_EQ(f->results.size(), 1u);
  EXPECT_EQ(f->results[0].role, Role::Loss);
  EXPECT_EQ(f->results[0].buffer, 2u);
  EXPECT_TRUE(f->results[0].sharding.isReplicated());
  ASSERT_EQ(f->instructions.size(), 2u);
  const Instruction &gather = f->instructions[0];
  EXPECT_EQ(gather.op, "ernie.all_gather");
  EXPECT_EQ(gather.kernel, nullptr);
  EXPECT_EQ(gather.axes, (Axes{"x"}));
  EXPECT_EQ(gather.attrs.getInt("dim"), 0);
  EXPECT_EQ(gather.location, "model.mlir:3:7");
  EXPECT_EQ(gather.operands, (std::vector<uint32_t>{0}));
  EXPECT_EQ(gather.results, (std::vector<uint32_t>{1}));
  EXPECT_NE(f->instructions[1].kernel, nullptr);
  EXPECT_EQ(f->instructions[1].kernel, findCpuKernel("ernie.relu"));
}

TEST(Program, DecodesEveryAttributeKindAndPartials) {
  ProgramBuilder pb({"x", "y", "z"}, {2, 3, 2});
  FunctionBuilder &f = pb.function("main");
  uint32_t a = f.buffer(DType::BF16, {4, 2});
  uint32_t b = f.buffer(DType::BF16, {4, 2});
  f.arg(a, Tensor().named("w").as(Role::Parameter).split({{}, {"y", "x"}})
               .partial("z", ReduceOp::Max))
      .op("ernie.gelu", {a}, {b},
          {{"z_ints", std::vector<int64_t>{3, -1}},
           {"approximate", true},
           {"scale", 0.5},
           {"kind", std::string("max")},
           {"count", int64_t(-7)}})
      .ret(b, Tensor().updating("w"));
  Program p = pb.parse();
  const Function &fn = *p.function(0, "main");
  const TensorSpec &w = fn.arguments[0];
  EXPECT_EQ(w.role, Role::Parameter);
  EXPECT_EQ(w.type, DType::BF16);
  EXPECT_EQ(w.globalShape, (std::vector<int64_t>{4, 12}));
  EXPECT_EQ(w.sharding.dims[1], (Axes{"y", "x"}));
  ASSERT_EQ(w.sharding.partials.size(), 1u);
  EXPECT_EQ(w.sharding.partials[0].first, "z");
  EXPECT_EQ(w.sharding.partials[0].second, ReduceOp::Max);
  EXPECT_EQ(fn.results[0].updates, "w");
  const Attrs &attrs = fn.instructions[0].attrs;
  EXPECT_EQ(attrs.getInts("z_ints"), (std::vector<int64_t>{3, -1}));
  EXPECT_TRUE(attrs.getBool("approximate"));
  EXPECT_EQ(attrs.getFloat("scale", 0), 0.5);
  EXPECT_EQ(attrs.getString("kind", ""), "max");
  EXPECT_EQ(attrs.getInt("count"), -7);
}

TEST(Program, StagesFollowTheStageAxis) {
  ProgramBuilder pb({"pp", "dp"}, {2, 2});
  pb.stageAxis("pp");
  for (size_t stage = 0; stage < 2; ++stage) {
    FunctionBuilder &f = pb.function(stage == 0 ? "first" : "second", stage);
    uint32_t a = f.buffer(DType::F32, {1});
    f.arg(a).ret(a);
  }
  Program p = pb.parse();
  EXPECT_EQ(p.numStages(), 2);
  // Ranks (pp, dp): 0 = (0, 0), 1 = (0, 1), 2 = (1, 0), 3 = (1, 1).
  EXPECT_EQ(p.stageOf(0), 0);
  EXPECT_EQ(p.stageOf(1), 0);
  EXPECT_EQ(p.stageOf(2), 1);
  EXPECT_EQ(p.stageOf(3), 1);
  EXPECT_NE(p.function(0, "first"), nullptr);
  EXPECT_EQ(p.function(0, "second"), nullptr);
  EXPECT_NE(p.function(1, "second"), nullptr);
}

//===----------------------------------------------------------------------===//
// The envelope
//===----------------------------------------------------------------------===//

TEST(ProgramRejects, TruncatedFiles) {
  std::vector<uint8_t> file = validProgram().bytes();
  auto [begin, end] = payloadRange(file);
  ASSERT_GT(begin, 8u);
  ASSERT_LE(end, file.size());
  for (size_t cut : {size_t(0), size_t(1), size_t(4), size_t(7)}) {
    SCOPED_TRACE(cut);
    std::string message =
        errorOfBytes(std::vector<uint8_t>(file.begin(), file.begin() + cut));
    EXPECT_THAT(message, HasSubstr("broken.ernie: "));
    EXPECT_THAT(message, HasSubstr("is truncated: " + std::to_string(cut) +
                                   " bytes"));
  }
  // From 8 bytes on the identifier is there; the structure no longer fits.
  for (size_t cut : {size_t(8), size_t(12), begin - 1, begin + 1,
                     (begin + end) / 2, end - 1}) {
    SCOPED_TRACE(cut);
    std::string message =
        errorOfBytes(std::vector<uint8_t>(file.begin(), file.begin() + cut));
    EXPECT_THAT(message, HasSubstr("broken.ernie: "));
    EXPECT_THAT(message, HasSubstr("truncated"));
  }
}

TEST(ProgramRejects, AFlippedPayloadByte) {
  // The envelope does not walk the payload: whatever byte of the program is
  // damaged, the checksum is what catches it.
  std::vector<uint8_t> file = validProgram().bytes();
  auto [begin, end] = payloadRange(file);
  for (size_t i = begin; i < end; ++i) {
    SCOPED_TRACE(i);
    std::vector<uint8_t> bad = file;
    bad[i] ^= uint8_t(1u << (i % 8));
    std::string message = errorOfBytes(bad);
    EXPECT_THAT(message, HasSubstr("broken.ernie: "));
    EXPECT_THAT(message, HasSubstr("is corrupted: the checksum does not match"));
    if (::testing::Test::HasFailure())
      break;
  }
  // A stored checksum that is simply wrong.
  ProgramBuilder pb = validProgram();
  pb.checksum = 12345;
  EXPECT_THAT(errorOf(pb), HasSubstr("checksum does not match"));
}

TEST(ProgramRejects, AWrongIdentifier) {
  std::vector<uint8_t> file = validProgram().bytes();
  std::memcpy(file.data() + 4, "ERNX", 4);
  std::string message = errorOfBytes(file);
  EXPECT_THAT(message, HasSubstr("broken.ernie: "));
  EXPECT_THAT(message, HasSubstr("not an ernie program file"));
  EXPECT_THAT(message, HasSubstr("ERNP"));
}

TEST(ProgramRejects, AnotherFormatVersion) {
  for (uint32_t version : {::ernie::program::kFormatVersion + 1, 0u}) {
    ProgramBuilder pb = validProgram();
    pb.formatVersion = version;
    std::string message = errorOf(pb);
    EXPECT_THAT(message, HasSubstr("broken.ernie: "));
    EXPECT_THAT(message, HasSubstr("format version " + std::to_string(version)));
    EXPECT_THAT(message, HasSubstr("reads version " +
                                   std::to_string(::ernie::program::kFormatVersion)));
  }
}

//===----------------------------------------------------------------------===//
// The program's consistency
//===----------------------------------------------------------------------===//

TEST(ProgramRejects, BufferIndicesOutOfRange) {
  {
    ProgramBuilder pb = validProgram();
    pb.function("bad").arg(7);
    std::string message = errorOf(pb);
    EXPECT_THAT(message, HasSubstr("broken.ernie: "));
    EXPECT_THAT(message, HasSubstr("function @bad, argument 0: buffer 7 does not exist"));
  }
  {
    ProgramBuilder pb = validProgram();
    FunctionBuilder &f = pb.function("bad");
    uint32_t a = f.buffer(DType::F32, {2});
    f.arg(a).ret(3);
    EXPECT_THAT(errorOf(pb), HasSubstr("result 0: buffer 3 does not exist"));
  }
  {
    ProgramBuilder pb = validProgram();
    FunctionBuilder &f = pb.function("bad");
    uint32_t a = f.buffer(DType::F32, {2});
    f.arg(a).op("ernie.relu", {9}, {a}).ret(a);
    EXPECT_THAT(errorOf(pb),
                HasSubstr("instruction #0 (ernie.relu): operand buffer 9 does not exist"));
  }
  {
    ProgramBuilder pb = validProgram();
    FunctionBuilder &f = pb.function("bad");
    uint32_t a = f.buffer(DType::F32, {2});
    f.arg(a).op("ernie.relu", {a}, {a}).op("ernie.neg", {a}, {4}).ret(a);
    EXPECT_THAT(errorOf(pb),
                HasSubstr("instruction #1 (ernie.neg): result buffer 4 does not exist"));
  }
}

TEST(ProgramRejects, ABufferOutsideTheArena) {
  {
    ProgramBuilder pb = validProgram();
    FunctionBuilder &f = pb.function("bad");
    f.buffer(DType::F32, {4});   // [0, 16)
    f.buffer(DType::F32, {8});   // [64, 96)
    f.arenaBytes = 80;
    std::string message = errorOf(pb);
    EXPECT_THAT(message, HasSubstr("broken.ernie: "));
    EXPECT_THAT(message,
                HasSubstr("function @bad, buffer 1: lies outside the arena of 80 bytes"));
  }
  {
    // An offset past the arena's end (and one whose end would wrap).
    for (uint64_t offset : {uint64_t(1024), ~uint64_t(63)}) {
      ProgramBuilder pb = validProgram();
      FunctionBuilder &f = pb.function("bad");
      f.buffer(DType::F32, {4});
      f.buffers[0].offset = offset;
      f.arenaBytes = 64;
      EXPECT_THAT(errorOf(pb), HasSubstr("buffer 0: lies outside the arena"));
    }
  }
}

TEST(ProgramRejects, AMisalignedOffset) {
  ProgramBuilder pb = validProgram();
  FunctionBuilder &f = pb.function("bad");
  f.buffer(DType::F32, {4});
  f.buffer(DType::F32, {4});
  f.buffers[1].offset = 68;
  f.arenaBytes = 256;
  std::string message = errorOf(pb);
  EXPECT_THAT(message, HasSubstr("broken.ernie: "));
  EXPECT_THAT(message, HasSubstr("function @bad, buffer 1: offset is not aligned"));
}

TEST(ProgramRejects, BytesNotMatchingShapeAndType) {
  ProgramBuilder pb = validProgram();
  FunctionBuilder &f = pb.function("bad");
  f.buffer(DType::BF16, {2, 3});
  f.buffers[0].bytes = 24; // f32's size, not bf16's 12
  std::string message = errorOf(pb);
  EXPECT_THAT(message, HasSubstr("broken.ernie: "));
  EXPECT_THAT(message, HasSubstr("buffer 0: 24 bytes do not hold [2, 3]xbf16"));
}

TEST(ProgramRejects, PipelineRolesWithoutAPipeline) {
  // What the runtime combines over micro-batches (gradients, maxima, sums)
  // has no meaning in a program that has none.
  for (Role role : {Role::Gradient, Role::MicroBatchMax, Role::MicroBatchSum}) {
    ProgramBuilder pb = validProgram();
    FunctionBuilder &f = pb.get("main");
    f.arg(f.buffer(DType::F32, {3}), Tensor().as(role).named("sum.0"));
    EXPECT_THAT(errorOf(pb), HasSubstr("function @main, argument 1: the role " +
                                       std::string(roleName(role)) +
                                       " belongs to pipelined programs"));
  }
}

TEST(ProgramRejects, AMetricThatIsNotANamedFloatScalarResult) {
  {
    ProgramBuilder pb = validProgram();
    FunctionBuilder &f = pb.get("main");
    f.arg(f.buffer(DType::F32, {}), Tensor().as(Role::Metric).named("grad_norm"));
    EXPECT_THAT(errorOf(pb), HasSubstr("function @main, argument 1: a metric is a "
                                       "result, not an argument"));
  }
  for (auto [type, shape, name] :
       {std::tuple{DType::F32, std::vector<int64_t>{3}, "grad_norm"},
        std::tuple{DType::I64, std::vector<int64_t>{}, "grad_norm"},
        std::tuple{DType::F32, std::vector<int64_t>{}, ""}}) {
    ProgramBuilder pb = validProgram();
    FunctionBuilder &f = pb.get("main");
    f.ret(f.buffer(type, shape), Tensor().as(Role::Metric).named(name));
    EXPECT_THAT(errorOf(pb), HasSubstr("a metric must be a named float scalar"));
  }
}

TEST(ProgramRejects, AnOpWithoutACpuKernel) {
  ProgramBuilder pb = validProgram();
  FunctionBuilder &f = pb.function("bad");
  uint32_t a = f.buffer(DType::F32, {2});
  f.arg(a).op("ernie.frobnicate", {a}, {a}).ret(a);
  std::string message = errorOf(pb);
  EXPECT_THAT(message, HasSubstr("broken.ernie: "));
  EXPECT_THAT(message, HasSubstr("instruction #0 (ernie.frobnicate)"));
  EXPECT_THAT(message, HasSubstr("no kernel for 'ernie.frobnicate'"));
}

TEST(ProgramRejects, ACollectiveOnAnUnknownAxis) {
  ProgramBuilder pb = validProgram();
  pb.get("main").instructions[0].axes = {"tp"};
  std::string message = errorOf(pb);
  EXPECT_THAT(message, HasSubstr("broken.ernie: "));
  EXPECT_THAT(message, HasSubstr("function @main, instruction #0 (ernie.all_gather)"));
  EXPECT_THAT(message, HasSubstr("names axis 'tp', which the mesh does not have"));
}

TEST(ProgramRejects, ACollectiveWithoutAxesOrWithTheWrongArity) {
  {
    ProgramBuilder pb = validProgram();
    pb.get("main").instructions[0].axes = {};
    EXPECT_THAT(errorOf(pb), HasSubstr("a collective needs mesh axes"));
  }
  {
    ProgramBuilder pb = validProgram();
    pb.get("main").instructions[0].operands = {0, 0};
    EXPECT_THAT(errorOf(pb), HasSubstr("wrong number of operands or results"));
  }
}

TEST(ProgramRejects, ACollectiveWhoseShapesDoNotFit) {
  // The executor writes a collective's result from these shapes: a result
  // too small for the gathered rows would be written past its buffer.
  auto broken = [](auto change) {
    ProgramBuilder pb = validProgram();
    change(pb.get("main"));
    return errorOf(pb);
  };
  std::string message = broken([](FunctionBuilder &f) { f.buffers[1].shape = {2, 3}; });
  EXPECT_THAT(message, HasSubstr("broken.ernie: function @main, instruction #0 "
                                 "(ernie.all_gather): the result must be [4, 3], "
                                 "not [2, 3]"));
  EXPECT_THAT(broken([](FunctionBuilder &f) { f.buffers[1].type = DType::F64; }),
              HasSubstr("keep the operand's rank and element type"));
  EXPECT_THAT(broken([](FunctionBuilder &f) {
                f.instructions[0].attrs = {{"dim", int64_t(2)}};
              }),
              HasSubstr("'dim' is missing or out of range"));
  EXPECT_THAT(broken([](FunctionBuilder &f) { f.instructions[0].attrs = {}; }),
              HasSubstr("'dim' is missing or out of range"));
  EXPECT_THAT(broken([](FunctionBuilder &f) {
                f.instructions[0].attrs = {{"dim", 0.0}};
              }),
              HasSubstr("'dim' is missing or out of range"));
  EXPECT_THAT(broken([](FunctionBuilder &f) {
                // [4, 3] scattered over 2 is [2, 3]; the result says [4, 3].
                f.instructions[0].op = "ernie.reduce_scatter";
                f.instructions[0].operands = {1};
                f.instructions[0].results = {2};
                f.instructions[1].operands = {2};
              }),
              HasSubstr("(ernie.reduce_scatter): the result must be [2, 3], not [4, 3]"));
  EXPECT_THAT(broken([](FunctionBuilder &f) {
                // 3 columns do not split over 2 ranks.
                f.instructions[0].op = "ernie.shard_slice";
                f.instructions[0].attrs = {{"dim", int64_t(1)}};
              }),
              HasSubstr("dimension 1 does not divide over 2 ranks"));
  EXPECT_THAT(broken([](FunctionBuilder &f) {
                f.instructions[0].op = "ernie.all_reduce";
                f.instructions[0].attrs = {{"kind", std::string("sum")}};
              }),
              HasSubstr("(ernie.all_reduce): the result must be [2, 3], not [4, 3]"));
  EXPECT_THAT(broken([](FunctionBuilder &f) {
                // [2, 3] split on 0, concatenated on 1 is [1, 6].
                f.instructions[0].op = "ernie.all_to_all";
                f.instructions[0].attrs = {{"split_dim", int64_t(0)},
                                           {"concat_dim", int64_t(1)}};
              }),
              HasSubstr("(ernie.all_to_all): the result must be [1, 6], not [4, 3]"));
  EXPECT_THAT(broken([](FunctionBuilder &f) {
                f.instructions[0].op = "ernie.all_to_all";
                f.instructions[0].attrs = {{"split_dim", int64_t(1)},
                                           {"concat_dim", int64_t(0)}};
              }),
              HasSubstr("split_dim 1 does not divide over 2 ranks"));
  EXPECT_THAT(broken([](FunctionBuilder &f) {
                uint32_t index = f.buffer(DType::I32, {});
                f.op("ernie.axis_index", {}, {index}, {}, {"x"});
              }),
              HasSubstr("(ernie.axis_index): the result must be one i64"));
}

TEST(ProgramRejects, AConstantThatDoesNotFillItsBuffer) {
  ProgramBuilder pb = validProgram();
  FunctionBuilder &f = pb.function("bad");
  uint32_t c = f.buffer(DType::F32, {3});
  f.constant(c, std::vector<float>{1, 2}).ret(c);
  EXPECT_THAT(errorOf(pb),
              HasSubstr("instruction #0 (ernie.constant): the constant's data "
                        "does not fill its buffer"));
}

TEST(ProgramRejects, ShardingsInconsistentWithTheShapes) {
  {
    // Global 5 rows cannot be 2 local rows split in 2.
    ProgramBuilder pb = validProgram();
    pb.get("main").arguments[0].second.global({5, 3});
    std::string message = errorOf(pb);
    EXPECT_THAT(message, HasSubstr("broken.ernie: "));
    EXPECT_THAT(message, HasSubstr("function @main, argument 0: global [5, 3] "
                                   "split by its sharding is not local [2, 3] "
                                   "(a dimension split n ways holds "
                                   "ceil(global / n))"));
  }
  {
    // Replicated, yet global differs from local.
    ProgramBuilder pb = validProgram();
    pb.get("main").results[0].second.global({8, 3});
    EXPECT_THAT(errorOf(pb), HasSubstr("result 0: global [8, 3] split by its "
                                       "sharding is not local [4, 3]"));
  }
  {
    ProgramBuilder pb = validProgram();
    pb.get("main").arguments[0].second.split({{"x"}}).global({4, 3});
    EXPECT_THAT(errorOf(pb),
                HasSubstr("the sharding has the wrong number of dimensions"));
  }
  {
    ProgramBuilder pb = validProgram();
    pb.get("main").arguments[0].second.split({{"x"}, {"y"}});
    EXPECT_THAT(errorOf(pb),
                HasSubstr("sharding names axis 'y', which the mesh does not have"));
  }
  {
    ProgramBuilder pb = validProgram();
    pb.get("main").arguments[0].second.partial("q", ReduceOp::Sum);
    EXPECT_THAT(errorOf(pb), HasSubstr("names axis 'q'"));
  }
  {
    // The local shape must be its buffer's.
    ProgramBuilder pb = validProgram();
    pb.get("main").arguments[0].second.local({3, 2}).global({6, 2});
    EXPECT_THAT(errorOf(pb), HasSubstr("argument 0: local [3, 2]xf32 does not "
                                       "match its buffer [2, 3]xf32"));
  }
  {
    // So must its element type: the message says which differs.
    ProgramBuilder pb = validProgram();
    pb.get("main").arguments[0].second.typed(DType::BF16);
    EXPECT_THAT(errorOf(pb), HasSubstr("argument 0: local [2, 3]xbf16 does not "
                                       "match its buffer [2, 3]xf32"));
  }
}

TEST(ProgramRejects, AStageCountNotMatchingTheStageAxis) {
  {
    ProgramBuilder pb = validProgram();
    pb.stageAxis("x"); // two stages needed, one written
    std::string message = errorOf(pb);
    EXPECT_THAT(message, HasSubstr("broken.ernie: "));
    EXPECT_THAT(message, HasSubstr("has 1 stages; its mesh needs 2"));
  }
  {
    ProgramBuilder pb = validProgram();
    pb.stages(3); // no stage axis: exactly one stage
    EXPECT_THAT(errorOf(pb), HasSubstr("has 3 stages; its mesh needs 1"));
  }
  {
    ProgramBuilder pb = validProgram();
    pb.stageAxis("pp");
    EXPECT_THAT(errorOf(pb),
                HasSubstr("names stage axis 'pp', which the mesh does not have"));
  }
}

TEST(ProgramRejects, BadMeshes) {
  EXPECT_THAT(errorOf(ProgramBuilder({}, {})), HasSubstr("has a mesh without axes"));
  ProgramBuilder zero({"x"}, {0});
  EXPECT_THAT(errorOf(zero), HasSubstr("broken.ernie: mesh axis 'x' must have a "
                                       "positive size"));
}

//===----------------------------------------------------------------------===//
// Files on disk
//===----------------------------------------------------------------------===//

TEST(ProgramLoad, ReadsAFileAndNamesItInErrors) {
  std::string good = tempPath("good.ernie");
  validProgram().write(good);
  Program p = Program::load(good);
  EXPECT_EQ(p.source(), good);
  EXPECT_NE(p.function(0, "main"), nullptr);

  std::string cut = tempPath("cut.ernie");
  {
    std::vector<uint8_t> file = validProgram().bytes();
    std::ofstream out(cut, std::ios::binary);
    out.write(reinterpret_cast<const char *>(file.data()), file.size() / 2);
  }
  std::string message = errorOf([&] { Program::load(cut); });
  EXPECT_THAT(message, HasSubstr(cut + ": "));
  EXPECT_THAT(message, HasSubstr("truncated"));

  std::string empty = tempPath("empty.ernie");
  { std::ofstream out(empty, std::ios::binary); }
  EXPECT_THAT(errorOf([&] { Program::load(empty); }),
              HasSubstr(empty + ": is truncated: 0 bytes"));
  std::remove(good.c_str());
  std::remove(cut.c_str());
  std::remove(empty.c_str());
}

TEST(ProgramLoad, AMissingPath) {
  std::string missing = tempPath("does-not-exist.ernie");
  std::string message = errorOf([&] { Program::load(missing); });
  EXPECT_THAT(message, HasSubstr(missing));
  EXPECT_THAT(message, HasSubstr("cannot open"));
}

namespace {

/// A valid overlapped step on mesh x=2: a piece sent one member along while
/// a kernel runs, then written into an accumulator. Buffers: 0 = a f32[2, 3],
/// 1 = r (the start's), 2 = n (neg of a), 3 = acc f32[4, 3].
/// Instructions: #0 start, #1 neg, #2 wait, #3 shard_insert, #4 shard_slice.
ProgramBuilder overlapProgram() {
  ProgramBuilder pb({"x"}, {2});
  FunctionBuilder &f = pb.function("main");
  uint32_t a = f.buffer(DType::F32, {2, 3}), r = f.buffer(DType::F32, {2, 3}),
           n = f.buffer(DType::F32, {2, 3}), acc = f.buffer(DType::F32, {4, 3});
  f.arg(a)
      .arg(acc)
      .op("ernie.collective_permute_start", {a}, {r}, {{"shift", int64_t(1)}},
          {"x"})
      .op("ernie.neg", {a}, {n})
      .op("ernie.wait", {r}, {r})
      .op("ernie.shard_insert", {r, acc}, {acc},
          {{"dim", int64_t(0)}, {"shift", int64_t(-1)}}, {"x"})
      .op("ernie.shard_slice", {acc}, {n},
          {{"dim", int64_t(0)}, {"shift", int64_t(1)}}, {"x"})
      .ret(acc)
      .ret(n);
  return pb;
}

std::string
brokenOverlap(const std::function<void(FunctionBuilder &)> &change) {
  ProgramBuilder pb = overlapProgram();
  change(pb.get("main"));
  return errorOf(pb);
}

} // namespace

TEST(Program, LoadsStartsWaitsAndShardInserts) {
  Program p = overlapProgram().parse();
  const Function &f = *p.function(0, "main");
  for (size_t i : {0, 2, 3, 4}) {
    EXPECT_TRUE(isExecutorOp(f.instructions[i].op)) << f.instructions[i].op;
    EXPECT_EQ(f.instructions[i].kernel, nullptr);
  }
  EXPECT_EQ(f.instructions[0].attrs.getInt("shift"), 1);
  EXPECT_EQ(f.instructions[3].attrs.getInt("shift"), -1);
  // A wait needs no axes: it names its start's buffer.
  EXPECT_TRUE(f.instructions[2].axes.empty());
}

TEST(ProgramRejects, AWaitOnABufferNoStartIsFilling) {
  std::string message = brokenOverlap([](FunctionBuilder &f) {
    f.instructions[2].operands = {2}; // the neg's result
    f.instructions[2].results = {2};
  });
  EXPECT_THAT(message, HasSubstr("broken.ernie: function @main, instruction #2 "
                                 "(ernie.wait): its operand (buffer 2) is not "
                                 "the result of an earlier started "
                                 "collective (ernie.*_start) awaiting its "
                                 "wait"));
  // Nor one whose start is already waited for.
  EXPECT_THAT(
      brokenOverlap([](FunctionBuilder &f) { f.op("ernie.wait", {1}, {1}); }),
      HasSubstr("instruction #5 (ernie.wait): its operand (buffer 1) "
                "is not the result"));
  // Nor a wait before its start.
  EXPECT_THAT(brokenOverlap([](FunctionBuilder &f) {
                std::swap(f.instructions[0], f.instructions[2]);
              }),
              HasSubstr("instruction #0 (ernie.wait): its operand (buffer 1)"));
}

namespace {

/// A bucket on mesh dp=2: buffers 0 = a f32[4], 1 = b f32[2, 2] (the
/// gradients), 2 and 3 their futures. Instructions: #0 the start, then the
/// waits (a test may put a writer between them).
ProgramBuilder bucketProgram(bool writeAfterFirstWait = false) {
  ProgramBuilder pb({"dp"}, {2});
  FunctionBuilder &f = pb.function("main");
  uint32_t a = f.buffer(DType::F32, {4}), b = f.buffer(DType::F32, {2, 2}),
           ra = f.buffer(DType::F32, {4}), rb = f.buffer(DType::F32, {2, 2});
  f.arg(a).arg(b).op("ernie.all_reduce_start", {a, b}, {ra, rb},
                     {{"kind", std::string("sum")}}, {"dp"});
  f.op("ernie.wait", {ra}, {ra});
  if (writeAfterFirstWait) { // the transfer is over: a's memory is free
    uint32_t over = f.buffer(DType::F32, {4});
    f.buffers[over].offset = 0; // a's bytes (a buffer of its own: a's is
                                // an argument's, written only in place)
    f.op("ernie.neg", {ra}, {over});
  }
  f.op("ernie.wait", {rb}, {rb}).ret(ra).ret(rb);
  return pb;
}

std::string brokenBucket(const std::function<void(FunctionBuilder &)> &change) {
  ProgramBuilder pb = bucketProgram();
  change(pb.get("main"));
  return errorOf(pb);
}

} // namespace

TEST(Program, LoadsABucketAndFreesItsInputsAtTheFirstWait) {
  Program p = bucketProgram().parse();
  EXPECT_TRUE(isExecutorOp(p.function(0, "main")->instructions[0].op));
  EXPECT_NO_THROW(bucketProgram(/*writeAfterFirstWait=*/true).parse());
}

// A reshape into a view of an input (the memory plan's views: the same
// offset) moves no bytes, so it may run while the bucket reads that input;
// a reshape into other bytes overlapping it may not.
TEST(Program, AViewOfABucketInputIsNoWrite) {
  // Buffers 0 (a, f32[4]) and 1 (b, f32[2, 2]) are packed at 0 and 64;
  // the reshape writes a new buffer at offset 0.
  auto withReshape = [](uint32_t from) {
    ProgramBuilder pb = bucketProgram();
    FunctionBuilder &f = pb.get("main");
    uint32_t to = f.buffer(DType::F32, from == 0 ? std::vector<int64_t>{2, 2}
                                                 : std::vector<int64_t>{4});
    f.buffers[to].offset = 0;
    f.instructions.insert(f.instructions.begin() + 1,
                          {"ernie.reshape", {from}, {to}});
    return pb;
  };
  EXPECT_NO_THROW(withReshape(0).parse()); // a's view
  EXPECT_THAT(errorOf(withReshape(1)),     // b's bytes copied over a
              HasSubstr("instruction #1 (ernie.reshape): writes buffer 4, "
                        "whose memory overlaps buffer 0, the operand of the "
                        "ernie.all_reduce_start"));
}

TEST(ProgramRejects, MalformedBuckets) {
  EXPECT_THAT(brokenBucket([](FunctionBuilder &f) {
                f.instructions[0].results = {2}; // one future for two inputs
              }),
              HasSubstr("(ernie.all_reduce_start): wrong number of operands "
                        "or results"));
  EXPECT_THAT(brokenBucket([](FunctionBuilder &f) {
                f.instructions[0].results = {3, 2}; // futures swapped
              }),
              HasSubstr("(ernie.all_reduce_start): operand 0: "));
  EXPECT_THAT(brokenBucket([](FunctionBuilder &f) {
                f.instructions[0].attrs = {{"accumulate", std::string("f16")},
                                           {"kind", std::string("sum")}};
              }),
              HasSubstr("accumulates in 'f16'"));
  EXPECT_THAT(brokenBucket([](FunctionBuilder &f) {
                f.instructions[0].attrs = {{"kind", std::string("product")}};
              }),
              HasSubstr("unknown reduce kind 'product'"));
  // Before the first wait the communication thread reads every input.
  EXPECT_THAT(brokenBucket([](FunctionBuilder &f) {
                f.instructions.insert(f.instructions.begin() + 1,
                                      {"ernie.neg", {1}, {1}});
              }),
              HasSubstr("instruction #1 (ernie.neg): writes buffer 1, whose "
                        "memory overlaps buffer 1, the operand of the "
                        "ernie.all_reduce_start at instruction #0"));
  EXPECT_THAT(brokenBucket([](FunctionBuilder &f) {
                f.instructions.pop_back(); // the second wait
              }),
              HasSubstr("(ernie.all_reduce_start): no later ernie.wait takes "
                        "its result (buffer 3)"));
}

// Buckets of reduce-scatters and all-gathers: each operand and its future
// as the blocking collective takes them.
TEST(ProgramRejects, MalformedScatterAndGatherBuckets) {
  auto bucket = [](const std::string &op, std::vector<int64_t> piece,
                   AttrList attrs) {
    ProgramBuilder pb({"dp"}, {2});
    FunctionBuilder &f = pb.function("main");
    uint32_t a = f.buffer(DType::F32, {4, 6}), b = f.buffer(DType::F32, {2}),
             ra = f.buffer(DType::F32, piece),
             rb = f.buffer(DType::F32, {op == "ernie.all_gather_start" ? 4 : 1});
    f.arg(a).arg(b).op(op, {a, b}, {ra, rb}, attrs, {"dp"});
    f.op("ernie.wait", {ra}, {ra}).op("ernie.wait", {rb}, {rb}).ret(ra).ret(rb);
    return pb;
  };
  AttrList dim1 = {{"dim", int64_t(1)}, {"kind", std::string("sum")}};
  AttrList dim0 = {{"dim", int64_t(0)}, {"kind", std::string("sum")}};
  EXPECT_NO_THROW(bucket("ernie.reduce_scatter_start", {2, 6}, dim0).parse());
  EXPECT_NO_THROW(bucket("ernie.all_gather_start", {8, 6}, dim0).parse());
  EXPECT_THAT(errorOf(bucket("ernie.reduce_scatter_start", {4, 6}, dim0)),
              HasSubstr("(ernie.reduce_scatter_start): operand 0: "));
  // The second operand has rank 1: dim 1 is out of its range.
  EXPECT_THAT(errorOf(bucket("ernie.reduce_scatter_start", {4, 3}, dim1)),
              HasSubstr("operand 1: 'dim' is missing or out of range"));
  EXPECT_THAT(errorOf(bucket("ernie.all_gather_start", {4, 6}, dim0)),
              HasSubstr("(ernie.all_gather_start): operand 0: "));
  EXPECT_THAT(errorOf(bucket("ernie.reduce_scatter_start", {2, 6},
                             {{"dim", int64_t(0)},
                              {"kind", std::string("sum")},
                              {"accumulate", std::string("f64")}})),
              HasSubstr("accumulates in 'f64'"));
}

TEST(ProgramRejects, AStartWithoutItsWait) {
  std::string message = brokenOverlap([](FunctionBuilder &f) {
    f.instructions.erase(f.instructions.begin() + 2);
    f.instructions[2].operands = {2, 3}; // inserts the neg instead
  });
  EXPECT_THAT(message, HasSubstr("broken.ernie: function @main, instruction #0 "
                                 "(ernie.collective_permute_start): no later "
                                 "ernie.wait takes its result (buffer 1)"));
  EXPECT_THAT(brokenOverlap([](FunctionBuilder &f) {
                // A second start into the same buffer before the wait.
                f.instructions.insert(f.instructions.begin() + 1,
                                      f.instructions[0]);
              }),
              HasSubstr("instruction #1 (ernie.collective_permute_start): its "
                        "result (buffer 1) is still in flight from "
                        "instruction #0"));
}

TEST(ProgramRejects, AStartWithoutAShiftOrWithTheWrongShape) {
  EXPECT_THAT(
      brokenOverlap([](FunctionBuilder &f) { f.instructions[0].attrs = {}; }),
      HasSubstr("instruction #0 (ernie.collective_permute_start): "
                "'shift' is missing or not an integer"));
  EXPECT_THAT(brokenOverlap([](FunctionBuilder &f) {
                f.instructions[4].attrs = {{"dim", int64_t(0)}, {"shift", 1.5}};
              }),
              HasSubstr("instruction #4 (ernie.shard_slice): 'shift' is "
                        "missing or not an integer"));
  EXPECT_THAT(
      brokenOverlap([](FunctionBuilder &f) { f.instructions[0].axes = {}; }),
      HasSubstr("instruction #0 (ernie.collective_permute_start): a "
                "collective needs mesh axes"));
  EXPECT_THAT(brokenOverlap([](FunctionBuilder &f) {
                f.buffers[1].shape = {3, 2};
              }),
              HasSubstr("instruction #0 (ernie.collective_permute_start): the "
                        "result must be [2, 3], not [3, 2]"));
  EXPECT_THAT(brokenOverlap([](FunctionBuilder &f) {
                f.instructions[2].results = {3}; // acc: f32[4, 3]
              }),
              HasSubstr("instruction #2 (ernie.wait): the result must be "
                        "[2, 3], not [4, 3]"));
}

TEST(ProgramRejects, AShardInsertWhoseShapesDoNotFit) {
  std::string message = brokenOverlap([](FunctionBuilder &f) {
    f.instructions[3].results = {2}; // f32[2, 3], not the destination's type
  });
  EXPECT_THAT(message, HasSubstr("broken.ernie: function @main, instruction #3 "
                                 "(ernie.shard_insert): the result must be "
                                 "[4, 3], not [2, 3]"));
  EXPECT_THAT(
      brokenOverlap([](FunctionBuilder &f) {
        f.instructions[3].operands = {1, 1}; // a piece as the destination
      }),
      HasSubstr("(ernie.shard_insert): the piece must be [1, 3]xf32 "
                "(the destination [2, 3] split 2 ways along dimension "
                "0), not [2, 3]xf32"));
  EXPECT_THAT(brokenOverlap([](FunctionBuilder &f) {
                f.buffers[1].shape = {1, 3}; // the piece
                f.buffers[0].shape = {1, 3};
                f.buffers[2].shape = {1, 3};
              }),
              HasSubstr("instruction #3 (ernie.shard_insert): the piece must "
                        "be [2, 3]xf32 (the destination [4, 3] split 2 ways "
                        "along dimension 0), not [1, 3]xf32"));
  EXPECT_THAT(brokenOverlap([](FunctionBuilder &f) {
                f.instructions[3].attrs = {{"dim", int64_t(1)}};
              }),
              HasSubstr("(ernie.shard_insert): dimension 1 does not divide "
                        "over 2 ranks"));
  EXPECT_THAT(
      brokenOverlap([](FunctionBuilder &f) {
        f.instructions[3].attrs = {{"dim", int64_t(2)}};
      }),
      HasSubstr("(ernie.shard_insert): 'dim' is missing or out of range"));
  EXPECT_THAT(brokenOverlap(
                  [](FunctionBuilder &f) { f.instructions[3].operands = {1}; }),
              HasSubstr("(ernie.shard_insert): wrong number of operands or "
                        "results"));
}

// Between a start and its wait the communication thread reads the operand
// and writes the result: memory the plan gave either to another value then
// is a race, refused at load.
TEST(ProgramRejects, MemoryInUseByATransferInFlight) {
  EXPECT_THAT(brokenOverlap([](FunctionBuilder &f) {
                f.buffers[2].offset = 0; // the neg writes over the operand
              }),
              HasSubstr("instruction #1 (ernie.neg): writes buffer 2, whose "
                        "memory overlaps buffer 0, the operand of the "
                        "ernie.collective_permute_start at instruction #0, "
                        "which is in flight until its ernie.wait"));
  EXPECT_THAT(brokenOverlap([](FunctionBuilder &f) {
                f.buffers[2].offset = 64; // ... or over the result
              }),
              HasSubstr("instruction #1 (ernie.neg): writes buffer 2, whose "
                        "memory overlaps buffer 1, the result of"));
  EXPECT_THAT(brokenOverlap([](FunctionBuilder &f) {
                f.instructions[1].operands = {1}; // reads the result early
              }),
              HasSubstr("instruction #1 (ernie.neg): reads buffer 1, whose "
                        "memory overlaps buffer 1, the result of"));
}
