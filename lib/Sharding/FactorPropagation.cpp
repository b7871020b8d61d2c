//===- FactorPropagation.cpp - shardings through one op's rule ---------------===//

#include "ernie/Sharding/FactorPropagation.h"

#include "ernie/Dialect/Ernie/IR/Sharding.h"
#include "ernie/Sharding/Resharding.h"
#include "llvm/ADT/StringSet.h"

#include <cmath>

using namespace mlir;
using namespace mlir::ernie;

MeshShape MeshShape::get(MeshOp mesh) {
  MeshShape shape;
  shape.name = FlatSymbolRefAttr::get(mesh.getSymNameAttr());
  for (Attribute axis : mesh.getAxisNames())
    shape.axes.push_back(cast<StringAttr>(axis).getValue());
  llvm::append_range(shape.sizes, mesh.getAxisSizes());
  shape.allowUneven = !mesh->hasAttr(kEvenSplitsAttrName);
  return shape;
}

int64_t MeshShape::axisSize(StringRef axis) const {
  for (auto [name, size] : llvm::zip(axes, sizes))
    if (name == axis)
      return size;
  return 1;
}

double MeshShape::costOf(const ReshardStep &step) const {
  return stepCost ? stepCost(step) : double(step.bytes);
}

int64_t MeshShape::product(ArrayRef<StringRef> names) const {
  int64_t total = 1;
  for (StringRef axis : names)
    total *= axisSize(axis);
  return total;
}

FactorAxes mlir::ernie::readFactorAxes(const OpShardingRule &rule,
                                       const TensorFactors &dims,
                                       ShardingAttr sharding,
                                       const MeshShape &mesh) {
  FactorAxes result(rule.factors.size());
  if (!sharding)
    return result;
  for (auto [d, factors] : llvm::enumerate(dims)) {
    if (static_cast<int64_t>(d) >= sharding.getRank())
      break;
    SmallVector<StringRef> axes = sharding.getDimAxes(d);
    // A dimension that is one factor takes its axes whole, dividing or not
    // (an uneven split, padded); legalizeFactorAxes drops the split if the
    // factor shares a dimension elsewhere.
    if (factors.size() == 1 && mesh.allowUneven) {
      llvm::append_range(result[factors.front()], axes);
      continue;
    }
    size_t next = 0;
    for (int64_t factor : factors) {
      int64_t size = rule.factors[factor].size, taken = 1;
      while (next < axes.size() &&
             size % (taken * mesh.axisSize(axes[next])) == 0) {
        taken *= mesh.axisSize(axes[next]);
        result[factor].push_back(axes[next++]);
      }
      // A minor factor is reached only once the major one is fully split:
      // blocks of the dimension must align with the factor's blocks.
      if (taken != size)
        break;
    }
  }
  return result;
}

ShardingAttr mlir::ernie::projectSharding(MLIRContext *context,
                                          const OpShardingRule &rule,
                                          const TensorFactors &dims,
                                          const FactorAxes &factorAxes,
                                          const MeshShape &mesh,
                                          bool isResult) {
  SmallVector<SmallVector<StringRef>> dimAxes;
  llvm::SmallDenseSet<int64_t> present;
  for (const DimFactors &factors : dims) {
    SmallVector<StringRef> &axes = dimAxes.emplace_back();
    for (int64_t factor : factors) {
      present.insert(factor);
      llvm::append_range(axes, factorAxes[factor]);
    }
  }
  SmallVector<std::pair<StringRef, ReduceKind>> partial;
  if (isResult) {
    for (auto [id, factor] : llvm::enumerate(rule.factors))
      if (factor.kind == FactorKind::Reduction && !present.contains(id))
        for (StringRef axis : factorAxes[id])
          partial.emplace_back(axis, factor.reduceKind);
  }
  return ShardingAttr::get(context, mesh.name, dimAxes, partial);
}

double mlir::ernie::reshardCost(ShardingAttr from, ShardingAttr to,
                                RankedTensorType type, const MeshShape &mesh) {
  if (!from || !to || from == to)
    return 0;
  MeshShape::CostKey key{from, to, type};
  auto it = mesh.costCache->find(key);
  if (it != mesh.costCache->end())
    return it->second;
  double cost = kUnreachableCost;
  if (FailureOr<SmallVector<ReshardStep>> plan =
          planReshard(from, to, type, mesh);
      succeeded(plan)) {
    cost = 0;
    for (const ReshardStep &step : *plan)
      cost += mesh.costOf(step);
  }
  (*mesh.costCache)[key] = cost;
  return cost;
}

double mlir::ernie::movedCost(const OpShardings &choice,
                              ArrayRef<ShardingAttr> operands,
                              ArrayRef<ShardingAttr> results,
                              ArrayRef<RankedTensorType> operandTypes,
                              ArrayRef<RankedTensorType> resultTypes,
                              const MeshShape &mesh) {
  double cost = 0;
  for (auto [i, have] : llvm::enumerate(operands))
    if (have && i < choice.operands.size())
      cost += reshardCost(have, choice.operands[i], operandTypes[i], mesh);
  // A result's known sharding is what its users want: reshard after.
  for (auto [i, want] : llvm::enumerate(results))
    if (want && i < choice.results.size())
      cost += reshardCost(choice.results[i], want, resultTypes[i], mesh);
  return cost;
}

double mlir::ernie::localIterations(const OpShardingRule &rule,
                                    const FactorAxes &axes,
                                    const MeshShape &mesh) {
  double points = 1;
  for (auto [id, factor] : llvm::enumerate(rule.factors)) {
    SmallVector<StringRef> names(axes[id].begin(), axes[id].end());
    points *= std::ceil(double(factor.size) / double(mesh.product(names)));
  }
  return points;
}

/// Blocks of a dimension made of several factors line up with a minor
/// factor's blocks only when every more major factor in it is fully split:
/// otherwise a rank's piece would be strided, which no sharding says. Such
/// minor factors lose their axes (in every tensor, so the op's local form
/// stays consistent), until nothing changes.
static void legalizeFactorAxes(const OpShardingRule &rule, FactorAxes &axes,
                               const MeshShape &mesh) {
  auto product = [&](int64_t factor) {
    SmallVector<StringRef> names(axes[factor].begin(), axes[factor].end());
    return mesh.product(names);
  };
  auto fullySplit = [&](int64_t factor) {
    return product(factor) == rule.factors[factor].size;
  };
  // An uneven split pads the factor's pieces; that is a tensor's padding
  // only where the factor is a whole dimension. In a dimension of several
  // factors the pieces would be strided, so such a factor stays whole.
  for (const auto *tensors : {&rule.operands, &rule.results})
    for (const TensorFactors &dims : *tensors)
      for (const DimFactors &factors : dims)
        if (factors.size() > 1)
          for (int64_t factor : factors)
            if (rule.factors[factor].size % product(factor) != 0)
              axes[factor].clear();
  bool changed = true;
  while (changed) {
    changed = false;
    for (const auto *tensors : {&rule.operands, &rule.results})
      for (const TensorFactors &dims : *tensors)
        for (const DimFactors &factors : dims) {
          bool majorFull = true;
          for (int64_t factor : factors) {
            if (!majorFull && !axes[factor].empty()) {
              axes[factor].clear();
              changed = true;
            }
            majorFull = majorFull && fullySplit(factor);
          }
        }
  }
}

/// The factor choice seeded by tensor `seed` (an index into `known`),
/// before legalizeFactorAxes.
static FactorAxes chooseFactors(const OpShardingRule &rule,
                                ArrayRef<FactorAxes> known, size_t seed) {
  FactorAxes chosen(rule.factors.size());
  llvm::StringSet<> used;
  auto offer = [&](const FactorAxes &candidate) {
    for (auto [id, axes] : llvm::enumerate(candidate)) {
      if (axes.empty() || !chosen[id].empty() ||
          rule.factors[id].kind == FactorKind::NeedReplication)
        continue;
      // Take the longest prefix whose axes are still free.
      SmallVector<StringRef, 2> take;
      for (StringRef axis : axes) {
        if (used.contains(axis))
          break;
        take.push_back(axis);
      }
      for (StringRef axis : take)
        used.insert(axis);
      chosen[id] = std::move(take);
    }
  };
  offer(known[seed]);
  for (auto [i, candidate] : llvm::enumerate(known))
    if (i != seed)
      offer(candidate);
  return chosen;
}

OpShardings mlir::ernie::projectFactors(MLIRContext *context,
                                        const OpShardingRule &rule,
                                        FactorAxes factorAxes,
                                        const MeshShape &mesh) {
  legalizeFactorAxes(rule, factorAxes, mesh);
  OpShardings out;
  for (const TensorFactors &dims : rule.operands)
    out.operands.push_back(projectSharding(context, rule, dims, factorAxes,
                                           mesh, /*isResult=*/false));
  for (const TensorFactors &dims : rule.results)
    out.results.push_back(projectSharding(context, rule, dims, factorAxes, mesh,
                                          /*isResult=*/true));
  out.factorAxes = std::move(factorAxes);
  return out;
}

OpShardings mlir::ernie::resolveShardings(
    MLIRContext *context, const OpShardingRule &rule,
    ArrayRef<ShardingAttr> operands, ArrayRef<ShardingAttr> results,
    ArrayRef<RankedTensorType> operandTypes,
    ArrayRef<RankedTensorType> resultTypes, const MeshShape &mesh) {
  // Every tensor's own reading of the factors, operands first.
  SmallVector<FactorAxes> known;
  SmallVector<std::pair<bool, unsigned>> knownTensor; // (isResult, index)
  for (auto [i, sharding] : llvm::enumerate(operands))
    if (sharding) {
      known.push_back(readFactorAxes(rule, rule.operands[i], sharding, mesh));
      knownTensor.emplace_back(false, i);
    }
  for (auto [i, sharding] : llvm::enumerate(results))
    if (sharding) {
      known.push_back(readFactorAxes(rule, rule.results[i], sharding, mesh));
      knownTensor.emplace_back(true, i);
    }

  auto project = [&](FactorAxes factors) {
    return projectFactors(context, rule, std::move(factors), mesh);
  };
  if (known.empty())
    return project(FactorAxes(rule.factors.size()));

  // The cost of a choice: bringing every known tensor to it, plus half the
  // all-reduce a Partial result will need.
  auto cost = [&](const OpShardings &choice) {
    double total =
        movedCost(choice, operands, results, operandTypes, resultTypes, mesh);
    for (auto [index, sharding] : llvm::enumerate(choice.results))
      if (sharding.isPartial() && !results[index])
        total +=
            reshardCost(sharding,
                        ShardingAttr::get(context, mesh.name,
                                          SmallVector<SmallVector<StringRef>>(
                                              resultTypes[index].getRank())),
                        resultTypes[index], mesh) /
            2;
    return total;
  };

  SmallVector<OpShardings> choices;
  for (size_t seed = 0; seed < known.size(); ++seed)
    choices.push_back(project(chooseFactors(rule, known, seed)));

  // A tensor nothing has laid out yet is not free: a choice that leaves it
  // whole where another choice splits it makes its producer compute (or
  // gather) the whole. Charged as gathering it from the most split layout
  // any choice gives it. (A weight gradient whose result one user wants
  // split over dp otherwise pulled the batch-split loss gradient whole:
  // ZeRO-3 computed the cross-entropy gradient on the global batch.)
  auto localElements = [&](ShardingAttr s, RankedTensorType type) {
    int64_t parts = 1;
    for (int64_t d = 0; d < s.getRank(); ++d)
      parts *= mesh.product(s.getDimAxes(d));
    return type.getNumElements() / std::max<int64_t>(parts, 1);
  };
  auto mostSplit = [&](bool isResult, unsigned index) {
    ShardingAttr most;
    RankedTensorType type =
        isResult ? resultTypes[index] : operandTypes[index];
    for (const OpShardings &choice : choices) {
      ShardingAttr s =
          isResult ? choice.results[index] : choice.operands[index];
      if (!most || localElements(s, type) < localElements(most, type))
        most = s;
    }
    return most.withoutPartials();
  };
  auto unknownCost = [&](const OpShardings &choice) {
    double total = 0;
    auto charge = [&](bool isResult, unsigned i, ShardingAttr mine,
                      RankedTensorType type) {
      ShardingAttr most = mostSplit(isResult, i);
      // Only a choice that leaves it less split pays: another split of the
      // same size is the producer's to choose.
      if (localElements(mine, type) > localElements(most, type))
        total += reshardCost(most, mine.withoutPartials(), type, mesh);
    };
    for (auto [i, s] : llvm::enumerate(operands))
      if (!s && i < choice.operands.size() && operandTypes[i])
        charge(false, i, choice.operands[i], operandTypes[i]);
    for (auto [i, s] : llvm::enumerate(results))
      if (!s && i < choice.results.size() && resultTypes[i])
        charge(true, i, choice.results[i], resultTypes[i]);
    return total;
  };

  size_t best = 0;
  double bestCost = std::numeric_limits<double>::max();
  for (auto [i, choice] : llvm::enumerate(choices)) {
    double c = cost(choice) + (choices.size() > 1 ? unknownCost(choice) : 0);
    if (isCheaper(c, bestCost)) {
      bestCost = c;
      best = i;
    }
  }
  return std::move(choices[best]);
}
