//===- Autodiff.cpp - reverse-mode AD of a loss function --------------------===//
//
// Clones the loss function, walks it backwards from the loss, and asks each
// op on the way for its vector-Jacobian product. Only "active" ops are
// differentiated: those fed by a parameter (forward closure) that also feed
// the loss (backward closure).
//
//===----------------------------------------------------------------------===//

#include "ernie/Dialect/Ernie/IR/ErnieOps.h"
#include "ernie/Passes/Passes.h"

#include "mlir/Dialect/Func/IR/FuncOps.h"
#include "mlir/IR/Builders.h"
#include "mlir/IR/BuiltinOps.h"
#include "mlir/IR/IRMapping.h"
#include "mlir/Pass/PassManager.h"
#include "mlir/Transforms/Passes.h"
#include "llvm/ADT/DenseSet.h"

#define DEBUG_TYPE "ernie-autodiff"

namespace mlir::ernie {
#define GEN_PASS_DEF_AUTODIFFPASS
#include "ernie/Passes/Passes.h.inc"
} // namespace mlir::ernie

using namespace mlir;
using namespace mlir::ernie;

namespace {

constexpr StringLiteral kGradOfAttrName = "ernie.grad_of";

bool isFloatTensor(Type type) {
  auto t = dyn_cast<RankedTensorType>(type);
  return t && isa<FloatType>(t.getElementType());
}

/// Builds `@<name>_grad` next to `forward`.
FailureOr<func::FuncOp> buildGradientFunction(func::FuncOp forward) {
  if (forward.isDeclaration())
    return forward.emitError("cannot differentiate a declaration");
  if (!forward.getBody().hasOneBlock())
    return forward.emitError("autodiff handles single-block functions");
  if (forward.getNumResults() != 1 ||
      !isFloatTensor(forward.getResultTypes()[0]) ||
      cast<RankedTensorType>(forward.getResultTypes()[0]).getRank() != 0)
    return forward.emitError("the loss function must return one scalar "
                             "float tensor (tensor<f32>), got ")
           << forward.getFunctionType();

  // The gradient function starts as a clone of the forward.
  OpBuilder builder(forward);
  builder.setInsertionPointAfter(forward);
  auto gradFn = cast<func::FuncOp>(builder.clone(*forward));
  gradFn.setSymName((forward.getSymName() + "_grad").str());
  Block &body = gradFn.getBody().front();
  auto ret = cast<func::ReturnOp>(body.getTerminator());
  Value loss = ret.getOperand(0);

  // Parameters, in argument order.
  SmallVector<BlockArgument> params;
  SmallVector<StringAttr> names;
  for (BlockArgument arg : body.getArguments()) {
    auto name = gradFn.getArgAttrOfType<StringAttr>(
        arg.getArgNumber(), ErnieDialect::kParamAttrName);
    if (!name)
      continue;
    if (!isFloatTensor(arg.getType())) {
      Type type = arg.getType();
      gradFn.erase();
      return forward.emitError("parameter '")
             << name.getValue() << "' is not a floating-point tensor: "
             << type;
    }
    params.push_back(arg);
    names.push_back(name);
  }

  // Active values: fed by a parameter and (below) feeding the loss.
  llvm::DenseSet<Value> varied(params.begin(), params.end());
  for (Operation &op : body.without_terminator()) {
    if (isa<StopGradientOp>(op))
      continue;
    if (llvm::any_of(op.getOperands(),
                     [&](Value v) { return varied.contains(v); }))
      for (Value r : op.getResults())
        if (isFloatTensor(r.getType()))
          varied.insert(r);
  }
  llvm::DenseSet<Value> useful{loss};
  for (Operation &op : llvm::reverse(body.without_terminator()))
    if (llvm::any_of(op.getResults(),
                     [&](Value v) { return useful.contains(v); }))
      for (Value v : op.getOperands())
        useful.insert(v);

  // The reverse sweep, emitted before the return.
  builder.setInsertionPoint(ret);
  llvm::DenseMap<Value, Value> grads;
  grads[loss] = FullOp::create(builder, ret.getLoc(),
                               cast<RankedTensorType>(loss.getType()), 1.0);
  auto accumulate = [&](Value v, Value g) {
    if (!g || !varied.contains(v))
      return;
    auto [it, inserted] = grads.try_emplace(v, g);
    if (!inserted)
      it->second = AddOp::create(builder, g.getLoc(), it->second, g);
  };
  SmallVector<Operation *> forwardOps;
  for (Operation &op : body.without_terminator())
    forwardOps.push_back(&op);
  for (Operation *op : llvm::reverse(forwardOps)) {
    bool active =
        llvm::any_of(op->getResults(),
                     [&](Value v) {
                       return varied.contains(v) && useful.contains(v) &&
                              grads.count(v);
                     });
    if (!active)
      continue;
    auto rule = dyn_cast<GradientOpInterface>(op);
    if (!rule) {
      op->emitError() << "'" << op->getName()
                      << "' has no gradient rule, but lies between a "
                         "parameter and the loss";
      gradFn.erase();
      return failure();
    }
    SmallVector<Value> resultGrads;
    for (Value r : op->getResults())
      resultGrads.push_back(grads.lookup(r));
    SmallVector<Value> operandGrads;
    if (failed(rule.buildGradient(builder, resultGrads, operandGrads))) {
      gradFn.erase();
      return failure();
    }
    if (operandGrads.size() != op->getNumOperands()) {
      op->emitError("gradient rule returned ")
          << operandGrads.size() << " gradients for " << op->getNumOperands()
          << " operands";
      gradFn.erase();
      return failure();
    }
    for (auto [operand, g] : llvm::zip(op->getOperands(), operandGrads))
      accumulate(operand, g);
  }

  // Loss, then one gradient per parameter (zeros where the loss is blind).
  SmallVector<Value> results{loss};
  for (BlockArgument p : params) {
    Value g = grads.lookup(p);
    if (!g)
      g = FullOp::create(builder, ret.getLoc(),
                         cast<RankedTensorType>(p.getType()), 0.0);
    results.push_back(g);
  }
  func::ReturnOp::create(builder, ret.getLoc(), results);
  ret.erase();
  SmallVector<Type> resultTypes;
  for (Value v : results)
    resultTypes.push_back(v.getType());
  gradFn.setType(FunctionType::get(gradFn.getContext(),
                                   body.getArgumentTypes(), resultTypes));
  gradFn.removeResAttrsAttr(); // The forward's result attributes do not apply.
  for (auto [i, name] : llvm::enumerate(names))
    gradFn.setResultAttr(i + 1, kGradOfAttrName, name);
  return gradFn;
}

struct AutodiffPass : ernie::impl::AutodiffPassBase<AutodiffPass> {
  using AutodiffPassBase::AutodiffPassBase;

  void runOnOperation() override {
    ModuleOp module = getOperation();
    auto forward = module.lookupSymbol<func::FuncOp>(function);
    if (!forward) {
      module.emitError() << "no function @" << function
                         << " to differentiate";
      return signalPassFailure();
    }
    // AD sees the whole computation: inline every call first.
    OpPassManager inliner(ModuleOp::getOperationName());
    inliner.addPass(createInlinerPass());
    if (failed(runPipeline(inliner, module)))
      return signalPassFailure();
    if (failed(buildGradientFunction(forward)))
      return signalPassFailure();
  }
};

} // namespace
