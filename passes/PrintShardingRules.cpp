//===- PrintShardingRules.cpp - sharding rules as remarks --------------------===//

#include "ernie/Dialect/Ernie/IR/ErnieOps.h"
#include "ernie/Passes/Passes.h"

#define DEBUG_TYPE "ernie-print-sharding-rules"

namespace mlir::ernie {
#define GEN_PASS_DEF_PRINTSHARDINGRULESPASS
#include "ernie/Passes/Passes.h.inc"
} // namespace mlir::ernie

using namespace mlir;
using namespace mlir::ernie;

namespace {

std::string factorName(int64_t id) {
  std::string name(1, static_cast<char>('i' + id % 18));
  if (id >= 18)
    name += std::to_string(id / 18);
  return name;
}

void printTensors(llvm::raw_ostream &os, ArrayRef<TensorFactors> tensors) {
  os << '(';
  llvm::interleaveComma(tensors, os, [&](const TensorFactors &tensor) {
    os << '[';
    llvm::interleaveComma(tensor, os, [&](const DimFactors &dim) {
      if (dim.empty())
        os << '_';
      for (int64_t id : dim)
        os << factorName(id);
    });
    os << ']';
  });
  os << ')';
}

struct PrintShardingRulesPass
    : ernie::impl::PrintShardingRulesPassBase<PrintShardingRulesPass> {
  void runOnOperation() override {
    getOperation()->walk([](ShardingRuleOpInterface op) {
      OpShardingRule rule = op.getShardingRule();
      std::string text;
      llvm::raw_string_ostream os(text);
      os << "sharding rule ";
      printTensors(os, rule.operands);
      os << " -> ";
      printTensors(os, rule.results);
      for (auto [id, factor] : llvm::enumerate(rule.factors)) {
        if (factor.kind == FactorKind::Parallel)
          continue;
        os << ' ' << factorName(id) << ':';
        if (factor.kind == FactorKind::NeedReplication)
          os << "replicated";
        else
          os << "reduction(" << stringifyReduceKind(factor.reduceKind) << ')';
      }
      op->emitRemark(text);
    });
  }
};

} // namespace
