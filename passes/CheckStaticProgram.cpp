//===- CheckStaticProgram.cpp - the program contract of ernie passes --------===//
//
// Reports every value that is not a statically shaped tensor or scalar, and
// every op outside the ernie/func/arith-constant vocabulary.
//
//===----------------------------------------------------------------------===//

#include "ernie/Dialect/Ernie/IR/ErnieOps.h"
#include "ernie/Passes/Passes.h"

#include "mlir/Dialect/Arith/IR/Arith.h"
#include "mlir/Dialect/Func/IR/FuncOps.h"
#include "mlir/IR/BuiltinOps.h"
#include "llvm/ADT/StringMap.h"

#define DEBUG_TYPE "ernie-check-static-program"

namespace mlir::ernie {
#define GEN_PASS_DEF_CHECKSTATICPROGRAMPASS
#include "ernie/Passes/Passes.h.inc"
} // namespace mlir::ernie

using namespace mlir;
using namespace mlir::ernie;

namespace {

/// The element types ernie computes on (ErnieBase.td's Ernie_Element).
bool isProgramElement(Type type) {
  return isa<Float64Type, Float32Type, Float16Type, BFloat16Type,
             Float8E4M3FNType, Float8E5M2Type>(type) ||
         type.isSignlessInteger(64) || type.isSignlessInteger(32) ||
         type.isSignlessInteger(1);
}

bool isProgramType(Type type) {
  if (auto shaped = dyn_cast<RankedTensorType>(type))
    return isProgramElement(shaped.getElementType()) &&
           hasAddressableSize(shaped);
  return isProgramElement(type);
}

bool isProgramOp(Operation *op) {
  return isa<ErnieDialect>(op->getDialect()) ||
         isa<ModuleOp, func::FuncOp, func::ReturnOp, func::CallOp,
             arith::ConstantOp>(op);
}

struct CheckStaticProgramPass
    : ernie::impl::CheckStaticProgramPassBase<CheckStaticProgramPass> {
  void runOnOperation() override {
    bool ok = true;
    getOperation()->walk([&](func::FuncOp func) {
      // Declarations have no block arguments: check their signatures.
      if (func.isDeclaration()) {
        for (Type type : llvm::concat<const Type>(func.getArgumentTypes(),
                                                  func.getResultTypes()))
          if (!isProgramType(type)) {
            func.emitError() << "signature type " << type
                             << " is not a statically shaped ernie tensor "
                                "or scalar";
            ok = false;
          }
      }
      llvm::StringMap<unsigned> seen;
      for (unsigned i = 0, e = func.getNumArguments(); i < e; ++i) {
        auto name = func.getArgAttrOfType<StringAttr>(
            i, ErnieDialect::kParamAttrName);
        if (!name)
          continue;
        // Replicas of a shared parameter (--ernie-shared-weight-dedup) share
        // its name, one per pipeline stage.
        std::string key = name.getValue().str();
        if (auto rank = func.getArgAttrOfType<IntegerAttr>(
                i, ErnieDialect::kPipelineRankAttrName))
          key += "@" + std::to_string(rank.getInt());
        auto [it, inserted] = seen.try_emplace(key, i);
        if (!inserted) {
          func.emitError() << "parameter '" << name.getValue()
                           << "' names arguments #" << it->second << " and #"
                           << i << "; tie shared weights with '"
                           << ErnieDialect::kTiedAttrName << "' instead";
          ok = false;
        }
      }
    });
    getOperation()->walk([&](Operation *op) {
      if (!isProgramOp(op)) {
        op->emitError() << "'" << op->getName()
                        << "' op is not part of an ernie program";
        ok = false;
        return;
      }
      for (Region &region : op->getRegions())
        for (Block &block : region)
          for (BlockArgument arg : block.getArguments())
            if (!isProgramType(arg.getType())) {
              op->emitError() << "block argument #" << arg.getArgNumber()
                              << " has type " << arg.getType()
                              << "; ernie programs need statically shaped "
                                 "ernie tensors or scalars";
              ok = false;
            }
      for (OpResult result : op->getResults())
        if (!isProgramType(result.getType())) {
          op->emitError() << "result #" << result.getResultNumber()
                          << " has type " << result.getType()
                          << "; ernie programs need statically shaped "
                             "ernie tensors or scalars";
          ok = false;
        }
    });
    if (!ok)
      signalPassFailure();
  }
};

} // namespace
