//===- InferSpmdFuzzTest.cpp - random and hostile inferSpmd calls ---------===//
//
// Random ops, shapes, dims_mappings, meshes and attributes through inferSpmd
// and inferSpmdReverse, half of them mutations of the valid cases of
// SpmdCases.h (so deep paths are reached), the rest random; hostile values
// included (negative, huge, wrong counts, wrong kinds, dynamic and zero
// dimensions). Every call must return; every success must give one
// sharding per tensor, of its rank, that verifies against the mesh.
//
// A fixed-seed short run is part of the suite; ERNIE_FUZZ_ITERATIONS (and
// ERNIE_FUZZ_SEED) run longer. A crash prints the call it died in.
//
//===----------------------------------------------------------------------===//

#include "SpmdCases.h"

#include "ernie/Dialect/Ernie/IR/Sharding.h"
#include "ernie/InitAll.h"
#include "ernie/Sharding/InferSpmd.h"

#include "mlir/AsmParser/AsmParser.h"
#include "mlir/IR/Builders.h"
#include "mlir/IR/BuiltinOps.h"
#include "mlir/IR/DialectRegistry.h"
#include "mlir/IR/MLIRContext.h"

#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <csignal>
#include <cstdlib>
#include <cstring>
#include <random>
#include <thread>
#include <unistd.h>

using namespace mlir;
using namespace mlir::ernie;

namespace {

/// The call in flight, for the crash and hang reports.
char currentCall[8192];
std::atomic<int64_t> callStartedMs{0};

int64_t nowMs() {
  return std::chrono::duration_cast<std::chrono::milliseconds>(
             std::chrono::steady_clock::now().time_since_epoch())
      .count();
}

void reportAndDie(int sig) {
  const char head[] = "\n*** inferSpmd fuzz: died in ";
  (void)!write(2, head, sizeof(head) - 1);
  (void)!write(2, currentCall, strnlen(currentCall, sizeof(currentCall)));
  (void)!write(2, "\n", 1);
  std::signal(sig, SIG_DFL);
  std::raise(sig);
}

int64_t envInt(const char *name, int64_t fallback) {
  const char *value = std::getenv(name);
  return value && *value ? std::strtoll(value, nullptr, 10) : fallback;
}

class Fuzzer {
public:
  explicit Fuzzer(uint64_t seed) : rng(seed), b(&context) {
    DialectRegistry registry;
    registerAllDialects(registry);
    context.appendDialectRegistry(registry);
    context.loadAllAvailableDialects();
    context.disableMultithreading();
    for (RegisteredOperationName name : context.getRegisteredOperations())
      if (name.getDialectNamespace() == "ernie")
        ops.push_back(name.getStringRef().str());
    for (const ernie_test::SpmdCase &c : ernie_test::spmdCases())
      cases.push_back(&c);
  }

  /// One call; returns whether it succeeded. Fails the test on a success
  /// that does not hold up.
  bool runOne() {
    SmallVector<int64_t> sizes;
    SmallVector<std::string> axisNames;
    randomMesh(axisNames, sizes);
    MeshShape mesh;
    mesh.name = FlatSymbolRefAttr::get(&context, "mesh");
    for (const std::string &a : axisNames)
      mesh.axes.push_back(StringAttr::get(&context, a).getValue());
    mesh.sizes = sizes;

    std::string op;
    SmallVector<RankedTensorType> types;
    SmallVector<SmallVector<int64_t>> mappings;
    NamedAttrList attrs;
    if (coin(0.5))
      mutatedCase(op, types, mappings, attrs);
    else
      randomCall(op, types, mappings, attrs);
    DictionaryAttr dict = attrs.getDictionary(&context);

    std::snprintf(currentCall, sizeof(currentCall),
                  "building the shardings of a %s call", op.c_str());
    // Shardings from the mappings where they are valid dims_mappings;
    // sometimes unknown, sometimes the wrong count.
    SmallVector<ShardingAttr> shardings;
    for (auto [i, mapping] : llvm::enumerate(mappings)) {
      if (coin(0.1)) {
        shardings.push_back(nullptr);
        continue;
      }
      SmallVector<int64_t> partial;
      if (coin(0.1))
        partial.push_back(pick(-1, static_cast<int64_t>(sizes.size())));
      FailureOr<ShardingAttr> s =
          shardingFromDimsMapping(&context, mesh, {mapping, partial});
      shardings.push_back(succeeded(s) ? *s : nullptr);
    }
    if (coin(0.03) && !shardings.empty())
      shardings.pop_back();
    bool reverse = coin(0.3);
    SmallVector<ShardingAttr> outShardings;
    if (reverse) {
      int64_t count = pick(0, 3);
      for (int64_t i = 0; i < count; ++i) {
        SmallVector<int64_t> mapping;
        for (int64_t d = 0, rank = pick(0, 4); d < rank; ++d)
          mapping.push_back(pick(-1, static_cast<int64_t>(sizes.size()) - 1));
        FailureOr<ShardingAttr> s =
            shardingFromDimsMapping(&context, mesh, {mapping, {}});
        outShardings.push_back(succeeded(s) ? *s : nullptr);
      }
    }

    describe(op, types, shardings, outShardings, dict, mesh, reverse);
    callStartedMs = nowMs();
    std::string error;
    FailureOr<SpmdResult> result =
        reverse ? inferSpmdReverse(&context, op, types, outShardings, dict,
                                   mesh, error)
                : inferSpmd(&context, op, types, shardings, dict, mesh, error);
    callStartedMs = 0;
    if (failed(result)) {
      EXPECT_FALSE(error.empty()) << currentCall;
      return false;
    }
    check(op, types, dict, mesh, *result);
    return true;
  }

private:
  bool coin(double p) {
    return std::uniform_real_distribution<>(0, 1)(rng) < p;
  }
  int64_t pick(int64_t lo, int64_t hi) {
    return std::uniform_int_distribution<int64_t>(lo, hi)(rng);
  }
  template <typename T> const T &choose(ArrayRef<T> list) {
    return list[pick(0, list.size() - 1)];
  }

  int64_t randomInt() {
    static const int64_t hostile[] = {
        0,    -1,      -2,        1,         2,         3,
        -100, 1 << 20, INT32_MAX, INT64_MAX, INT64_MIN, (int64_t(1) << 40),
        -7,   64,      5};
    if (coin(0.6))
      return pick(-3, 4);
    return choose(ArrayRef<int64_t>(hostile));
  }

  int64_t randomDim() {
    static const int64_t dims[] = {1, 2, 3, 4, 6, 8, 12, 16, 5, 7};
    if (coin(0.03))
      return choose(ArrayRef<int64_t>(
          {0, int64_t(1) << 40, 50257, ShapedType::kDynamic}));
    return choose(ArrayRef<int64_t>(dims));
  }

  Type randomElement() {
    switch (pick(0, 9)) {
    case 0:
      return b.getI64Type();
    case 1:
      return b.getI1Type();
    case 2:
      return b.getBF16Type();
    case 3:
      return b.getType<Float8E4M3FNType>();
    case 4:
      return b.getI32Type();
    default:
      return b.getF32Type();
    }
  }

  RankedTensorType randomType(int64_t rank) {
    SmallVector<int64_t> shape;
    for (int64_t d = 0; d < rank; ++d)
      shape.push_back(randomDim());
    return RankedTensorType::get(shape,
                                 coin(0.7) ? b.getF32Type() : randomElement());
  }

  void randomMesh(SmallVectorImpl<std::string> &names,
                  SmallVectorImpl<int64_t> &sizes) {
    static const char *axisNames[] = {"x", "y", "z"};
    int64_t rank = pick(1, 3);
    for (int64_t i = 0; i < rank; ++i) {
      names.push_back(axisNames[i]);
      sizes.push_back(choose(ArrayRef<int64_t>({1, 2, 3, 4, 8})));
    }
    if (coin(0.02))
      sizes[0] = choose(ArrayRef<int64_t>({0, -1, int64_t(1) << 32}));
    if (coin(0.01))
      names[0] = coin(0.5) ? "" : names.back();
    if (coin(0.01))
      sizes.pop_back();
  }

  Attribute randomAttr() {
    switch (pick(0, 11)) {
    case 0:
      return b.getBoolAttr(coin(0.5));
    case 1:
      return b.getUnitAttr();
    case 2:
      return b.getF64FloatAttr(choose(ArrayRef<double>(
          {0.5, -1.0, 1e300, std::numeric_limits<double>::quiet_NaN(),
           std::numeric_limits<double>::infinity()})));
    case 3:
      return b.getStringAttr(choose(ArrayRef<const char *>(
          {"none", "mean", "sum", "max", "lt", "f32", "bf16", "", "x"})));
    case 4:
    case 5: {
      SmallVector<int64_t> list;
      for (int64_t i = 0, n = pick(0, 5); i < n; ++i)
        list.push_back(randomInt());
      return b.getDenseI64ArrayAttr(list);
    }
    case 6: {
      SmallVector<Attribute> list;
      for (int64_t i = 0, n = pick(0, 3); i < n; ++i)
        list.push_back(coin(0.8) ? Attribute(b.getI64IntegerAttr(randomInt()))
                                 : b.getStringAttr("a"));
      return b.getArrayAttr(list);
    }
    case 7:
      return b.getI32IntegerAttr(static_cast<int32_t>(randomInt()));
    case 8:
      return DenseElementsAttr::get(
          RankedTensorType::get({pick(0, 3), 2}, b.getF32Type()), 1.0f);
    default:
      return b.getI64IntegerAttr(randomInt());
    }
  }

  std::string randomKey(StringRef op) {
    static const char *keys[] = {"axis",
                                 "axes",
                                 "keepdim",
                                 "keep_dim",
                                 "perm",
                                 "shape",
                                 "dtype",
                                 "sizes",
                                 "num",
                                 "num_or_sections",
                                 "trans_x",
                                 "trans_y",
                                 "transpose_a",
                                 "transpose_b",
                                 "value",
                                 "dims",
                                 "start",
                                 "limit",
                                 "step",
                                 "low",
                                 "high",
                                 "interior",
                                 "k",
                                 "largest",
                                 "epsilon",
                                 "reduction",
                                 "ignore_index",
                                 "causal",
                                 "scale",
                                 "dimension",
                                 "padding_idx",
                                 "begin_norm_axis",
                                 "soft_label",
                                 "direction",
                                 "stages",
                                 "channel",
                                 "momentum",
                                 "approximate",
                                 "bogus"};
    std::optional<RegisteredOperationName> name =
        RegisteredOperationName::lookup(op, &context);
    if (name && !name->getAttributeNames().empty() && coin(0.6))
      return choose(name->getAttributeNames()).getValue().str();
    return choose(ArrayRef<const char *>(keys));
  }

  void randomCall(std::string &op, SmallVectorImpl<RankedTensorType> &types,
                  SmallVectorImpl<SmallVector<int64_t>> &mappings,
                  NamedAttrList &attrs) {
    op = coin(0.98) ? choose(ArrayRef<std::string>(ops)) : "ernie.bogus";
    int64_t count = pick(0, 4);
    int64_t rank = pick(0, 4);
    for (int64_t i = 0; i < count; ++i) {
      types.push_back(randomType(coin(0.7) ? rank : pick(0, 4)));
      SmallVector<int64_t> &mapping = mappings.emplace_back();
      for (int64_t d = 0; d < types.back().getRank(); ++d)
        mapping.push_back(pick(-1, 2));
    }
    for (int64_t i = 0, n = pick(0, 4); i < n; ++i)
      attrs.set(randomKey(op), randomAttr());
  }

  void mutatedCase(std::string &op, SmallVectorImpl<RankedTensorType> &types,
                   SmallVectorImpl<SmallVector<int64_t>> &mappings,
                   NamedAttrList &attrs) {
    const ernie_test::SpmdCase &c = *choose(ArrayRef(cases));
    op = c.op;
    for (const char *text : c.types)
      types.push_back(cast<RankedTensorType>(parseType(text, &context)));
    for (const auto &m : c.mappings)
      mappings.emplace_back(m.begin(), m.end());
    for (NamedAttribute attr :
         cast<DictionaryAttr>(parseAttribute(c.attrs, &context)))
      attrs.push_back(attr);
    for (int64_t n = pick(1, 3); n > 0; --n) {
      switch (pick(0, 7)) {
      case 0: // a dimension
        if (!types.empty()) {
          int64_t i = pick(0, types.size() - 1);
          SmallVector<int64_t> shape(types[i].getShape());
          if (!shape.empty())
            shape[pick(0, shape.size() - 1)] = randomDim();
          types[i] = RankedTensorType::get(shape, types[i].getElementType());
        }
        break;
      case 1: // a rank
        if (!types.empty()) {
          int64_t i = pick(0, types.size() - 1);
          types[i] = randomType(pick(0, 4));
          mappings[i].assign(types[i].getRank(), -1);
        }
        break;
      case 2: // a mapping entry
        if (!mappings.empty()) {
          auto &m = mappings[pick(0, mappings.size() - 1)];
          if (!m.empty())
            m[pick(0, m.size() - 1)] = pick(-2, 3);
        }
        break;
      case 3: // an input too many or too few
        if (coin(0.5) && !types.empty()) {
          types.pop_back();
          mappings.pop_back();
        } else {
          types.push_back(randomType(pick(0, 3)));
          mappings.emplace_back(types.back().getRank(), -1);
        }
        break;
      case 4: // an element type
        if (!types.empty()) {
          int64_t i = pick(0, types.size() - 1);
          types[i] =
              RankedTensorType::get(types[i].getShape(), randomElement());
        }
        break;
      case 5: // an attribute dropped
        if (!attrs.empty())
          attrs.erase(attrs.begin()[pick(0, attrs.end() - attrs.begin() - 1)]
                          .getName());
        break;
      default: // an attribute's value, or a new one
        attrs.set(randomKey(op), randomAttr());
        break;
      }
    }
  }

  void describe(StringRef op, ArrayRef<RankedTensorType> types,
                ArrayRef<ShardingAttr> shardings,
                ArrayRef<ShardingAttr> outShardings, DictionaryAttr attrs,
                const MeshShape &mesh, bool reverse) {
    std::string s;
    llvm::raw_string_ostream os(s);
    os << (reverse ? "inferSpmdReverse " : "inferSpmd ") << op << " mesh[";
    for (auto [i, axis] : llvm::enumerate(mesh.axes))
      os << (i ? ", " : "") << axis << "="
         << (i < mesh.sizes.size() ? mesh.sizes[i] : -999);
    os << "] inputs(";
    for (auto [i, t] : llvm::enumerate(types))
      os << (i ? ", " : "") << t;
    os << ") shardings(";
    for (auto [i, sh] : llvm::enumerate(reverse ? outShardings : shardings)) {
      os << (i ? ", " : "");
      if (sh)
        os << sh;
      else
        os << "?";
    }
    os << ") attrs " << attrs;
    size_t n = std::min(s.size(), sizeof(currentCall) - 1);
    memcpy(currentCall, s.data(), n);
    currentCall[n] = 0;
  }

  void check(StringRef op, ArrayRef<RankedTensorType> types,
             DictionaryAttr attrs, const MeshShape &mesh,
             const SpmdResult &result) {
    ASSERT_EQ(result.inputs.size(), types.size()) << currentCall;
    std::string error;
    FailureOr<SmallVector<RankedTensorType>> outTypes =
        inferSpmdResultTypes(&context, op, types, attrs, error);
    ASSERT_TRUE(succeeded(outTypes)) << currentCall << "\n" << error;
    ASSERT_EQ(result.outputs.size(), outTypes->size()) << currentCall;
    // Each sharding verifies against the mesh as a program's would.
    OpBuilder builder(&context);
    OwningOpRef<ModuleOp> module = ModuleOp::create(builder.getUnknownLoc());
    builder.setInsertionPointToEnd(module->getBody());
    auto meshOp = MeshOp::create(builder, builder.getUnknownLoc(), "mesh",
                                 builder.getStrArrayAttr(mesh.axes),
                                 builder.getDenseI64ArrayAttr(mesh.sizes));
    std::string diagnostics;
    ScopedDiagnosticHandler handler(&context, [&](Diagnostic &d) {
      diagnostics += d.str() + "\n";
      return success();
    });
    auto verifyAll = [&](ArrayRef<ShardingAttr> shardings,
                         ArrayRef<RankedTensorType> tensorTypes,
                         StringRef what) {
      for (auto [sharding, type] : llvm::zip(shardings, tensorTypes)) {
        ASSERT_TRUE(sharding) << currentCall;
        EXPECT_TRUE(succeeded(
            verifySharding([&] { return emitError(builder.getUnknownLoc()); },
                           sharding, meshOp, type, what)))
            << currentCall << "\n"
            << diagnostics;
      }
    };
    verifyAll(result.inputs, types, "input");
    verifyAll(result.outputs, *outTypes, "output");
  }

  std::mt19937_64 rng;
  MLIRContext context;
  Builder b;
  std::vector<std::string> ops;
  std::vector<const ernie_test::SpmdCase *> cases;
};

TEST(InferSpmdFuzz, RandomAndHostileCallsNeverCrash) {
  uint64_t seed = envInt("ERNIE_FUZZ_SEED", 20261203);
  int64_t iterations = envInt("ERNIE_FUZZ_ITERATIONS", 500000);
  for (int sig : {SIGSEGV, SIGFPE, SIGABRT, SIGBUS, SIGILL})
    std::signal(sig, reportAndDie);
  // A call that does not return within a minute is a hang: report it.
  std::atomic<bool> done{false};
  std::thread watchdog([&] {
    while (!done) {
      std::this_thread::sleep_for(std::chrono::milliseconds(200));
      int64_t started = callStartedMs;
      if (started && nowMs() - started > 60000) {
        const char msg[] = "\n*** inferSpmd fuzz: hang in ";
        (void)!write(2, msg, sizeof(msg) - 1);
        (void)!write(2, currentCall, strnlen(currentCall, sizeof(currentCall)));
        std::_Exit(3);
      }
    }
  });
  Fuzzer fuzzer(seed);
  int64_t successes = 0;
  for (int64_t i = 0; i < iterations && !::testing::Test::HasFatalFailure();
       ++i)
    successes += fuzzer.runOne();
  done = true;
  watchdog.join();
  for (int sig : {SIGSEGV, SIGFPE, SIGABRT, SIGBUS, SIGILL})
    std::signal(sig, SIG_DFL);
  std::printf("inferSpmd fuzz: %lld calls (seed %llu), %lld succeeded\n",
              static_cast<long long>(iterations),
              static_cast<unsigned long long>(seed),
              static_cast<long long>(successes));
  // The mutations keep enough calls valid to reach the rules.
  EXPECT_GT(successes, iterations / 20);
}

} // namespace
