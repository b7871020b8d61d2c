//===- OpSignatureTest.cpp - the runtime's op table against the dialect ----===//
//
// The runtime checks every instruction of a program file against a table of
// its own (Program.cpp: operand and result counts, then each kernel's shape
// rules), since it links no MLIR. This test keeps that table from drifting
// from the dialect: every op the runtime accepts is a registered ernie op
// with the same operand and result counts as its ODS definition, and every
// registered ernie op is either run by the runtime or one the compiler
// never leaves in a per-rank program.
//
//===----------------------------------------------------------------------===//

#include "ernie/InitAll.h"
#include "ernie/runtime/Program.h"

#include "mlir/IR/DialectRegistry.h"
#include "mlir/IR/MLIRContext.h"
#include "mlir/IR/OpDefinition.h"
#include "mlir/IR/OperationSupport.h"

#include <gtest/gtest.h>

#include <optional>
#include <set>
#include <string>

using namespace mlir;

namespace {

/// ODS's count of operands (or results) of `name`: a fixed N, or -1 for
/// "one or more" (variadic / at least N); nullopt when the traits say
/// neither (none of ernie's ops).
template <bool Results> std::optional<int> odsCount(RegisteredOperationName name) {
  if constexpr (Results) {
    if (name.hasTrait<OpTrait::ZeroResults>()) return 0;
    if (name.hasTrait<OpTrait::OneResult>()) return 1;
    if (name.hasTrait<OpTrait::NResults<2>::Impl>()) return 2;
    if (name.hasTrait<OpTrait::NResults<3>::Impl>()) return 3;
    if (name.hasTrait<OpTrait::NResults<4>::Impl>()) return 4;
    if (name.hasTrait<OpTrait::VariadicResults>() ||
        name.hasTrait<OpTrait::AtLeastNResults<1>::Impl>())
      return -1;
  } else {
    if (name.hasTrait<OpTrait::ZeroOperands>()) return 0;
    if (name.hasTrait<OpTrait::OneOperand>()) return 1;
    if (name.hasTrait<OpTrait::NOperands<2>::Impl>()) return 2;
    if (name.hasTrait<OpTrait::NOperands<3>::Impl>()) return 3;
    if (name.hasTrait<OpTrait::NOperands<4>::Impl>()) return 4;
    if (name.hasTrait<OpTrait::NOperands<5>::Impl>()) return 5;
    if (name.hasTrait<OpTrait::NOperands<6>::Impl>()) return 6;
    if (name.hasTrait<OpTrait::VariadicOperands>() ||
        name.hasTrait<OpTrait::AtLeastNOperands<1>::Impl>())
      return -1;
  }
  return std::nullopt;
}

/// The ernie ops the compiler never leaves in a partitioned, scheduled
/// program: sharding annotations partition removes, pipeline markers the
/// schedule replaces, the fused region's terminator (a fused region is
/// written as its own instruction kind), and ops lowered before export.
const std::set<std::string> kCompilerOnly = {
    "ernie.mesh", "ernie.sharding_constraint", "ernie.reshard",
    "ernie.split_point", "ernie.yield", "ernie.fused",
    "ernie.learning_rate", "ernie.step", "ernie.micro_batch_max",
    "ernie.micro_batch_sum", "ernie.fp8_amax",
};

class OpSignature : public ::testing::Test {
protected:
  OpSignature() {
    DialectRegistry registry;
    mlir::ernie::registerAllDialects(registry);
    ctx.appendDialectRegistry(registry);
    ctx.loadAllAvailableDialects();
  }
  MLIRContext ctx;
};

TEST_F(OpSignature, EveryRuntimeOpMatchesItsDefinition) {
  for (const ::ernie::runtime::RuntimeOp &op : ::ernie::runtime::runtimeOps()) {
    SCOPED_TRACE(op.op);
    std::optional<RegisteredOperationName> name =
        RegisteredOperationName::lookup(op.op, &ctx);
    ASSERT_TRUE(name) << op.op << " is not an op of the dialect";
    EXPECT_EQ(odsCount<false>(*name), std::optional<int>(op.operands))
        << "operands of " << op.op;
    EXPECT_EQ(odsCount<true>(*name), std::optional<int>(op.results))
        << "results of " << op.op;
  }
}

TEST_F(OpSignature, EveryDialectOpIsRunOrNeverExported) {
  std::set<std::string> run;
  for (const ::ernie::runtime::RuntimeOp &op : ::ernie::runtime::runtimeOps())
    run.insert(op.op);
  std::set<std::string> neither, both;
  for (RegisteredOperationName name : ctx.getRegisteredOperations()) {
    std::string op = name.getStringRef().str();
    if (name.getDialectNamespace() != "ernie")
      continue;
    if (!run.count(op) && !kCompilerOnly.count(op))
      neither.insert(op);
    if (run.count(op) && kCompilerOnly.count(op))
      both.insert(op);
  }
  EXPECT_TRUE(neither.empty())
      << "ernie ops the runtime cannot run, not listed as compiler-only: "
      << ::testing::PrintToString(neither);
  EXPECT_TRUE(both.empty()) << "listed as compiler-only but run: "
                            << ::testing::PrintToString(both);
}

} // namespace
