//===- Spmd.cpp - Paddle's infer_spmd ------------------------------------===//

#include "Extension.h"

#include "ernie/Dialect/Ernie/IR/ErnieOps.h"
#include "ernie/Sharding/InferSpmd.h"

#include <optional>

#include <pybind11/numpy.h>
#include <pybind11/stl.h>

namespace ernie_py {

//===----------------------------------------------------------------------===//
// infer_spmd
//===----------------------------------------------------------------------===//

ec::MeshShape meshShape(const std::vector<std::string> &axes,
                           const std::vector<int64_t> &sizes) {
  ec::MeshShape mesh;
  mesh.name = FlatSymbolRefAttr::get(&context(), "mesh");
  for (const std::string &a : axes)
    mesh.axes.push_back(StringAttr::get(&context(), a).getValue());
  mesh.sizes.assign(sizes.begin(), sizes.end());
  return mesh;
}

using SpmdMapping = std::pair<std::vector<int64_t>, std::vector<int64_t>>;
using SpmdType = std::pair<std::vector<int64_t>, std::string>;

/// Shardings from (dims_mapping, partial_dims) pairs, one per tensor of
/// `types` (None: all unknown, Paddle's forward or backward alone).
SmallVector<ec::ShardingAttr>
spmdShardings(const std::string &op, const std::string &what,
              const std::optional<std::vector<SpmdMapping>> &mappings,
              ArrayRef<std::vector<int64_t>> shapes, const ec::MeshShape &mesh) {
  SmallVector<ec::ShardingAttr> shardings;
  if (!mappings)
    return shardings;
  if (!shapes.empty() && mappings->size() != shapes.size())
    throw py::value_error("infer_spmd('" + op + "'): " + std::to_string(mappings->size()) +
                          " " + what + " dims_mappings for " + std::to_string(shapes.size()) +
                          " " + what + "s");
  for (auto [i, mapping] : llvm::enumerate(*mappings)) {
    std::string name = what + " " + std::to_string(i);
    if (!shapes.empty() && mapping.first.size() != shapes[i].size())
      throw py::value_error("infer_spmd('" + op + "'): the dims_mapping of " + name + " has " +
                            std::to_string(mapping.first.size()) +
                            " entries for a tensor of rank " + std::to_string(shapes[i].size()));
    for (int64_t d : mapping.first)
      if (d < -1 || d >= static_cast<int64_t>(mesh.axes.size()))
        throw py::value_error("infer_spmd('" + op + "'): the dims_mapping of " + name +
                              " names mesh dimension " + std::to_string(d) + " of a mesh of " +
                              std::to_string(mesh.axes.size()));
    ec::DimsMapping dm{SmallVector<int64_t>(mapping.first.begin(), mapping.first.end()),
                       SmallVector<int64_t>(mapping.second.begin(), mapping.second.end())};
    FailureOr<ec::ShardingAttr> s = ec::shardingFromDimsMapping(&context(), mesh, dm);
    if (failed(s))
      throw py::value_error("infer_spmd('" + op + "'): invalid dims_mapping/partial_dims for " +
                            name + " (a mesh dimension out of range or used twice)");
    shardings.push_back(*s);
  }
  return shardings;
}

/// One op's rule on (dims_mapping, partial_dims) pairs, as Paddle's
/// infer_spmd (known inputs) and infer_backward (known outputs) take them;
/// returns per input (dims_mapping, partial_dims) and per output
/// (dims_mapping, partial_dims, {mesh_dim: reduce type}).
py::tuple inferSpmd(const std::string &op, const std::vector<SpmdType> &inputTypes,
                    const std::optional<std::vector<SpmdMapping>> &mappings,
                    const std::vector<std::string> &axes,
                    const std::vector<int64_t> &sizes, py::dict attrs,
                    const std::optional<std::vector<SpmdMapping>> &outputMappings) {
  MLIRContext *ctx = &context();
  std::string prefix = "infer_spmd('" + op + "'): ";
  if (axes.size() != sizes.size() || axes.empty())
    throw py::value_error(prefix + "a mesh needs one size per axis name");
  for (const std::string &a : axes)
    if (a.empty())
      throw py::value_error(prefix + "mesh axis names must be non-empty");
  ec::MeshShape mesh = meshShape(axes, sizes);
  SmallVector<RankedTensorType> types;
  std::vector<std::vector<int64_t>> shapes;
  for (const SpmdType &type : inputTypes) {
    try {
      types.push_back(tensorType(ctx, type.first, type.second));
    } catch (py::error_already_set &) {
      throw;
    } catch (const std::exception &e) {
      throw py::value_error(prefix + e.what());
    }
    shapes.push_back(type.first);
  }
  SmallVector<ec::ShardingAttr> shardings =
      spmdShardings(op, "input", mappings, shapes, mesh);
  SmallVector<ec::ShardingAttr> outShardings =
      spmdShardings(op, "output", outputMappings, {}, mesh);
  SmallVector<NamedAttribute> named;
  Builder b(ctx);
  for (auto [key, v] : attrs) {
    std::string k = key.cast<std::string>();
    Attribute a;
    try {
      a = toAttribute(ctx, k, v, Type());
    } catch (const std::exception &e) {
      throw py::value_error(prefix + "attribute '" + k + "': " + e.what());
    }
    if (a)
      named.push_back(b.getNamedAttr(k, a));
  }
  std::string error;
  FailureOr<ec::SpmdResult> result =
      ec::inferSpmd(ctx, op, types, shardings, b.getDictionaryAttr(named),
                    mesh, error, {}, outShardings);
  if (failed(result)) {
    // Every message names the op.
    std::string name = op.rfind("ernie.", 0) == 0 ? op : "ernie." + op;
    if (error.empty())
      error = "failed";
    throw py::value_error(error.find("'" + name + "'") == std::string::npos
                              ? prefix + error
                              : error);
  }
  auto convert = [&](ArrayRef<ec::ShardingAttr> list, bool withKinds) {
    py::list out;
    for (ec::ShardingAttr s : list) {
      FailureOr<ec::DimsMapping> dm = ec::dimsMappingFromSharding(s, mesh);
      if (failed(dm))
        throw py::value_error(prefix + "a result sharding has no dims_mapping form");
      std::vector<int64_t> dims(dm->dims.begin(), dm->dims.end());
      std::vector<int64_t> partial(dm->partialDims.begin(), dm->partialDims.end());
      if (!withKinds) {
        out.append(py::make_tuple(dims, partial));
        continue;
      }
      py::dict kinds;
      auto partials = s.getPartials();
      for (auto [meshDim, entry] : llvm::zip(partial, partials))
        kinds[py::int_(meshDim)] = ec::stringifyReduceKind(entry.second).str();
      out.append(py::make_tuple(dims, partial, kinds));
    }
    return out;
  };
  return py::make_tuple(convert(result->inputs, false), convert(result->outputs, true));
}

/// Every registered ernie op, with whether it has a sharding rule (what
/// infer_spmd can run): the sweep tests enumerate the dialect with it.
std::vector<std::pair<std::string, bool>> spmdOps() {
  std::vector<std::pair<std::string, bool>> ops;
  for (RegisteredOperationName name : context().getRegisteredOperations())
    if (name.getDialectNamespace() == ec::ErnieDialect::getDialectNamespace())
      ops.emplace_back(name.getStringRef().str(),
                       name.hasInterface<ec::ShardingRuleOpInterface>());
  return ops;
}

void bindSpmd(py::module_ &m) {
  m.def("infer_spmd", &inferSpmd, py::arg("op"), py::arg("input_types"),
        py::arg("dims_mappings"), py::arg("mesh_axes"), py::arg("mesh_sizes"),
        py::arg("attrs") = py::dict(),
        py::arg("output_dims_mappings") = py::none());
  m.def("spmd_ops", &spmdOps,
        "(name, has a sharding rule) for every registered ernie op");
}

} // namespace ernie_py
