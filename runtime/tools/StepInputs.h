//===- StepInputs.h - one step's function and batch, generated ---*- C++ -*-===//
//
// What one step of a program takes when nobody supplies its batch: the
// function (train_step if there is one — a pipeline always — else the only
// one) and its batch inputs (a pipeline's whole batches), small floats and
// zero indices. The program fuzzer runs it on every accepted mutant; the
// device tests train the seed programs with it.
//
//===----------------------------------------------------------------------===//

#ifndef ERNIE_RUNTIME_TOOLS_STEPINPUTS_H
#define ERNIE_RUNTIME_TOOLS_STEPINPUTS_H

#include "ernie/runtime/HostTensor.h"
#include "ernie/runtime/Program.h"

#include <string>
#include <vector>

namespace ernie::runtime {

/// The function to step and its generated batch inputs, in argument order;
/// an empty name when the program has neither train_step nor exactly one
/// function.
inline std::string stepInputs(const Program &program,
                              std::vector<HostTensor> &inputs) {
  std::string name = "train_step";
  std::vector<TensorSpec> specs;
  if (program.isPipelined()) {
    for (TensorSpec spec : program.pipeline()->inputs) {
      spec.globalShape[0] *= program.pipeline()->microBatches;
      specs.push_back(spec);
    }
  } else {
    const Function *fn = program.function(0, name);
    if (!fn && program.functions(0).size() == 1)
      fn = &program.functions(0)[0];
    if (!fn)
      return "";
    name = fn->name;
    for (const TensorSpec &arg : fn->arguments)
      if (arg.role == Role::Input || arg.role == Role::Loss)
        specs.push_back(arg);
  }
  inputs.clear();
  for (const TensorSpec &spec : specs) {
    HostTensor t(spec.type, spec.globalShape);
    if (isFloat(spec.type)) {
      HostTensor wide(DType::F64, spec.globalShape);
      for (int64_t j = 0; j < wide.numElements(); ++j)
        wide.as<double>()[j] = double(j % 7) / 8.0 - 0.375;
      t = convert(wide, spec.type);
    }
    inputs.push_back(std::move(t));
  }
  return name;
}

} // namespace ernie::runtime

#endif // ERNIE_RUNTIME_TOOLS_STEPINPUTS_H
