//===- ExecutorTest.cpp - host tensors, the executor, sessions --------------===//
//
// Programs built in memory (ProgramBuilder.h) and run on the thread engine.
// Expectations are computed here from the definitions — groups from
// row-major coordinates, pieces from offsets, collectives index by index —
// never through the Mesh or HostTensor code under test.
//
//===----------------------------------------------------------------------===//

#include "CollectiveChecks.h"
#include "ProgramBuilder.h"

#include "ernie/runtime/Executor.h"
#include "ernie/runtime/HostTensor.h"
#include "ernie/runtime/Session.h"
#include "ernie/runtime/ThreadCommunicator.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <sys/stat.h>

#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <functional>
#include <limits>
#include <optional>

using namespace ernie::runtime;
using namespace ernie::runtime::testing;
using ::testing::HasSubstr;
using Clock = std::chrono::steady_clock;
using Shape = std::vector<int64_t>;

namespace {

//===----------------------------------------------------------------------===//
// Independent references
//===----------------------------------------------------------------------===//

int64_t product(const Shape &shape) {
  int64_t n = 1;
  for (int64_t d : shape)
    n *= d;
  return n;
}

int64_t flatIndex(const Shape &shape, const Shape &index) {
  int64_t flat = 0;
  for (size_t d = 0; d < shape.size(); ++d)
    flat = flat * shape[d] + index[d];
  return flat;
}

/// Calls fn(index) for every index of `shape`, row-major.
void forEachIndex(const Shape &shape, const std::function<void(const Shape &)> &fn) {
  if (product(shape) == 0)
    return;
  Shape index(shape.size(), 0);
  while (true) {
    fn(index);
    int64_t d = static_cast<int64_t>(shape.size()) - 1;
    for (; d >= 0; --d) {
      if (++index[d] < shape[d])
        break;
      index[d] = 0;
    }
    if (d < 0)
      return;
  }
}

/// A mesh as plain data: names and sizes.
struct MeshShape {
  std::vector<std::string> names;
  Shape sizes;

  int64_t ranks() const { return product(sizes); }
  Shape coords(int64_t rank) const {
    Shape c(sizes.size());
    for (size_t i = sizes.size(); i-- > 0;) {
      c[i] = rank % sizes[i];
      rank /= sizes[i];
    }
    return c;
  }
  size_t axis(const std::string &name) const {
    return std::find(names.begin(), names.end(), name) - names.begin();
  }
  /// The linear coordinate of `rank` over `axes`, major to minor.
  int64_t indexOver(int64_t rank, const Axes &axes) const {
    Shape c = coords(rank);
    int64_t index = 0;
    for (const std::string &a : axes)
      index = index * sizes[axis(a)] + c[axis(a)];
    return index;
  }
  /// Every rank differing from `rank` only along `axes`, by indexOver.
  std::vector<int64_t> group(int64_t rank, const Axes &axes) const {
    Shape mine = coords(rank);
    std::vector<int64_t> members;
    for (int64_t q = 0; q < ranks(); ++q) {
      Shape theirs = coords(q);
      bool same = true;
      for (size_t i = 0; i < sizes.size(); ++i)
        if (std::find(axes.begin(), axes.end(), names[i]) == axes.end())
          same &= theirs[i] == mine[i];
      if (same)
        members.push_back(q);
    }
    std::sort(members.begin(), members.end(), [&](int64_t a, int64_t b) {
      return indexOver(a, axes) < indexOver(b, axes);
    });
    return members;
  }
  int64_t axesSize(const Axes &axes) const {
    int64_t n = 1;
    for (const std::string &a : axes)
      n *= sizes[axis(a)];
    return n;
  }
  Mesh mesh() const { return Mesh(names, sizes); }
};

template <typename T>
HostTensor filled(DType type, const Shape &shape,
                  const std::function<T(int64_t)> &value) {
  HostTensor t(type, shape);
  for (int64_t i = 0; i < t.numElements(); ++i)
    t.as<T>()[i] = value(i);
  return t;
}

HostTensor f32(const Shape &shape, const std::function<float(int64_t)> &value) {
  return filled<float>(DType::F32, shape, value);
}

HostTensor f32(const Shape &shape, std::vector<float> values) {
  HostTensor t(DType::F32, shape);
  EXPECT_EQ(values.size(), size_t(t.numElements()));
  std::memcpy(t.bytes.data(), values.data(), t.bytes.size());
  return t;
}

::testing::AssertionResult sameTensor(const HostTensor &got,
                                      const HostTensor &want) {
  if (got.type != want.type || got.shape != want.shape)
    return ::testing::AssertionFailure()
           << "got " << name(got.type) << "[" << ::testing::PrintToString(got.shape)
           << "], want " << name(want.type) << "["
           << ::testing::PrintToString(want.shape) << "]";
  if (got.bytes != want.bytes) {
    size_t width = byteSize(got.type);
    for (size_t i = 0; i < got.bytes.size(); i += width)
      if (std::memcmp(&got.bytes[i], &want.bytes[i], width) != 0) {
        auto result = ::testing::AssertionFailure()
                      << "element " << i / width << " differs";
        if (got.type == DType::F32)
          result << ": got " << got.as<float>()[i / width] << ", want "
                 << want.as<float>()[i / width];
        return result;
      }
  }
  return ::testing::AssertionSuccess();
}

/// Runs `fn` of `program` on every rank (threads), each with its own inputs;
/// returns every rank's results (and, when `events` is given, every rank's
/// trace).
std::vector<std::vector<HostTensor>>
runOnEveryRank(const Program &program, const std::string &fn,
               const std::function<std::vector<HostTensor>(int64_t)> &inputs,
               ExecutorOptions options = {},
               std::vector<std::vector<TraceEvent>> *events = nullptr) {
  int64_t n = program.mesh().numRanks();
  ThreadWorld world(program.mesh(), std::chrono::seconds(10));
  std::vector<std::unique_ptr<Communicator>> comms;
  for (int64_t r = 0; r < n; ++r)
    comms.push_back(world.communicator(r));
  std::vector<std::vector<HostTensor>> results(n);
  if (events)
    events->resize(n);
  onThreads(n, [&](int64_t r) {
    Executor executor(program, *comms[r], options);
    results[r] = executor.run(fn, inputs(r));
    if (events)
      (*events)[r] = executor.traceEvents();
  });
  return results;
}

std::string tempPath(const std::string &name) {
  return ::testing::TempDir() + "ernie-executor-test-" + name;
}

template <typename Fn> double secondsOf(Fn fn) {
  auto start = Clock::now();
  fn();
  return std::chrono::duration<double>(Clock::now() - start).count();
}

/// Options for sessions whose collectives should never wait long.
SessionOptions quick() {
  SessionOptions options;
  options.timeout = std::chrono::seconds(10);
  return options;
}

const MeshShape kMesh2{{"x"}, {2}};
const MeshShape kMesh22{{"x", "y"}, {2, 2}};
const MeshShape kMesh24{{"x", "y"}, {2, 4}};

} // namespace

//===----------------------------------------------------------------------===//
// HostTensor: blocks, pieces, assembly
//===----------------------------------------------------------------------===//

TEST(HostTensor, ExtractAndInsertBlocksOfRankZeroToFour) {
  const Shape arrayFull{5, 4, 6, 3}, blockFull{2, 3, 2, 2}, offsetFull{1, 1, 3, 1};
  for (size_t rank = 0; rank <= 4; ++rank)
    for (size_t width : {size_t(1), size_t(2), size_t(4), size_t(8)}) {
      SCOPED_TRACE(::testing::Message() << "rank " << rank << ", width " << width);
      Shape array(arrayFull.begin(), arrayFull.begin() + rank),
          block(blockFull.begin(), blockFull.begin() + rank),
          offsets(offsetFull.begin(), offsetFull.begin() + rank);
      // Element i of the array: its index in every byte (mod 251).
      std::vector<uint8_t> src(product(array) * width);
      for (size_t i = 0; i < src.size(); ++i)
        src[i] = static_cast<uint8_t>((i / width * 7 + i % width) % 251);
      std::vector<uint8_t> got(product(block) * width, 0xee);
      extractBlock(src.data(), array, offsets, got.data(), block, width);
      std::vector<uint8_t> want(got.size());
      forEachIndex(block, [&](const Shape &idx) {
        Shape at = idx;
        for (size_t d = 0; d < rank; ++d)
          at[d] += offsets[d];
        std::memcpy(&want[flatIndex(block, idx) * width],
                    &src[flatIndex(array, at) * width], width);
      });
      EXPECT_EQ(got, want);

      // Inserting it into zeros puts it back where it was, nowhere else.
      std::vector<uint8_t> dst(src.size(), 0);
      insertBlock(got.data(), block, dst.data(), array, offsets, width);
      std::vector<uint8_t> expected(src.size(), 0);
      forEachIndex(block, [&](const Shape &idx) {
        Shape at = idx;
        for (size_t d = 0; d < rank; ++d)
          at[d] += offsets[d];
        std::memcpy(&expected[flatIndex(array, at) * width],
                    &src[flatIndex(array, at) * width], width);
      });
      EXPECT_EQ(dst, expected);
    }
  // An empty block copies nothing.
  std::vector<uint8_t> array(12, 1), none;
  insertBlock(none.data(), {0, 3}, array.data(), {4, 3}, {2, 0}, 1);
  EXPECT_EQ(array, std::vector<uint8_t>(12, 1));
}

namespace {

/// A spec of global [8, 8] f32 split by `dims` on `mesh`.
TensorSpec specOf(const MeshShape &mesh, const std::vector<Axes> &dims,
                  DType type = DType::F32, Shape global = {8, 8}) {
  TensorSpec spec;
  spec.type = type;
  spec.globalShape = global;
  spec.localShape = global;
  spec.sharding.dims = dims;
  for (size_t d = 0; d < dims.size(); ++d)
    spec.localShape[d] /= mesh.axesSize(dims[d]);
  return spec;
}

} // namespace

TEST(HostTensor, PiecesFollowTheShardingAndAssembleBack) {
  struct Case {
    MeshShape mesh;
    std::vector<Axes> dims;
  };
  std::vector<Case> cases;
  for (const MeshShape &mesh : {kMesh2, kMesh22, kMesh24}) {
    cases.push_back({mesh, {}});
    cases.push_back({mesh, {{}, {}}});
    cases.push_back({mesh, {{"x"}, {}}});
    cases.push_back({mesh, {{}, {"x"}}});
    if (mesh.names.size() == 2) {
      cases.push_back({mesh, {{"x"}, {"y"}}});
      cases.push_back({mesh, {{"y"}, {"x"}}});
      cases.push_back({mesh, {{"x", "y"}, {}}});
      cases.push_back({mesh, {{"y", "x"}, {}}});
      cases.push_back({mesh, {{}, {"x", "y"}}});
      cases.push_back({mesh, {{}, {"y", "x"}}});
      cases.push_back({mesh, {{"y"}, {}}});
    }
  }
  for (const Case &c : cases) {
    SCOPED_TRACE(::testing::Message()
                 << "mesh " << ::testing::PrintToString(c.mesh.sizes) << ", dims "
                 << ::testing::PrintToString(c.dims));
    TensorSpec spec = specOf(c.mesh, c.dims);
    Mesh mesh = c.mesh.mesh();
    HostTensor global = f32({8, 8}, [](int64_t i) { return float(i); });
    std::vector<HostTensor> pieces;
    for (int64_t r = 0; r < c.mesh.ranks(); ++r) {
      HostTensor piece = pieceOf(global, spec, mesh, r);
      ASSERT_EQ(piece.shape, spec.localShape);
      Shape offsets(2, 0);
      for (size_t d = 0; d < c.dims.size(); ++d)
        offsets[d] = c.mesh.indexOver(r, c.dims[d]) * spec.localShape[d];
      HostTensor want = f32(spec.localShape, [&](int64_t i) {
        int64_t row = i / spec.localShape[1], col = i % spec.localShape[1];
        return float((offsets[0] + row) * 8 + offsets[1] + col);
      });
      EXPECT_TRUE(sameTensor(piece, want)) << "rank " << r;
      pieces.push_back(piece);
    }
    EXPECT_TRUE(sameTensor(assemble(pieces, spec, mesh), global));
  }
}

TEST(HostTensor, PendingSumsLiveOnTheFirstMemberAndAssembleBySumming) {
  Mesh mesh = kMesh22.mesh();
  // Rows split over y, a pending sum over x.
  TensorSpec spec = specOf(kMesh22, {{"y"}, {}}, DType::F32, {4, 2});
  spec.sharding.partials = {{"x", ReduceOp::Sum}};
  HostTensor global = f32({4, 2}, [](int64_t i) { return float(i + 1); });
  for (int64_t r = 0; r < 4; ++r) {
    HostTensor piece = pieceOf(global, spec, mesh, r);
    int64_t x = kMesh22.coords(r)[0], y = kMesh22.coords(r)[1];
    HostTensor want = x == 0 ? f32({2, 2}, [&](int64_t i) {
      return float(y * 4 + i + 1);
    })
                             : HostTensor(DType::F32, {2, 2});
    EXPECT_TRUE(sameTensor(piece, want)) << "rank " << r;
  }
  // Pieces all different: rows (y) come from the sum over x's members.
  std::vector<HostTensor> pieces;
  for (int64_t r = 0; r < 4; ++r)
    pieces.push_back(f32({2, 2}, [&](int64_t i) { return float(10 * r + i); }));
  HostTensor want = f32({4, 2}, [&](int64_t i) {
    int64_t y = i / 4, local = i % 4;
    float sum = 0;
    for (int64_t x = 0; x < 2; ++x)
      sum += float(10 * (x * 2 + y) + local);
    return sum;
  });
  EXPECT_TRUE(sameTensor(assemble(pieces, spec, mesh), want));

  // A pending sum over both axes: one holder, four addends.
  TensorSpec both = specOf(kMesh22, {}, DType::F32, {2, 2});
  both.sharding.partials = {{"x", ReduceOp::Sum}, {"y", ReduceOp::Sum}};
  HostTensor value = f32({2, 2}, {1.5f, -2, 3, 4});
  for (int64_t r = 0; r < 4; ++r)
    EXPECT_TRUE(sameTensor(pieceOf(value, both, mesh, r),
                           r == 0 ? value : HostTensor(DType::F32, {2, 2})));
  HostTensor sum = f32({2, 2}, [&](int64_t i) {
    return float(0 + i) + float(10 + i) + float(20 + i) + float(30 + i);
  });
  EXPECT_TRUE(sameTensor(assemble(pieces, both, mesh), sum));
}

TEST(HostTensor, PendingMaxIsHeldByEveryMemberAndAssemblesByMax) {
  Mesh mesh = kMesh24.mesh();
  TensorSpec spec = specOf(kMesh24, {{}, {"x"}}, DType::F32, {3, 4});
  spec.sharding.partials = {{"y", ReduceOp::Max}};
  HostTensor global = f32({3, 4}, [](int64_t i) { return float(i) - 5.5f; });
  std::vector<HostTensor> pieces;
  for (int64_t r = 0; r < 8; ++r) {
    HostTensor piece = pieceOf(global, spec, mesh, r);
    int64_t x = kMesh24.coords(r)[0];
    HostTensor want = f32({3, 2}, [&](int64_t i) {
      return float((i / 2) * 4 + x * 2 + i % 2) - 5.5f;
    });
    EXPECT_TRUE(sameTensor(piece, want)) << "rank " << r;
    pieces.push_back(piece);
  }
  EXPECT_TRUE(sameTensor(assemble(pieces, spec, mesh), global));
  // Different holders: the maximum over y's members, element by element.
  for (int64_t r = 0; r < 8; ++r)
    pieces[r] = f32({3, 2}, [&](int64_t i) {
      return float(((r * 5 + i * 3) % 7) - 3);
    });
  HostTensor want = f32({3, 4}, [&](int64_t i) {
    int64_t row = i / 4, col = i % 4, x = col / 2, local = row * 2 + col % 2;
    float best = -1e30f;
    for (int64_t y = 0; y < 4; ++y)
      best = std::max(best, float(((x * 4 + y) * 5 + local * 3) % 7 - 3));
    return best;
  });
  EXPECT_TRUE(sameTensor(assemble(pieces, spec, mesh), want));
}

TEST(HostTensor, PiecesRejectWrongShapes) {
  Mesh mesh = kMesh2.mesh();
  TensorSpec spec = specOf(kMesh2, {{"x"}, {}});
  spec.name = "w";
  try {
    pieceOf(HostTensor(DType::F32, {4, 8}), spec, mesh, 0);
    FAIL() << "expected an error";
  } catch (const std::invalid_argument &e) {
    EXPECT_THAT(e.what(), HasSubstr("'w' must be f32[8, 8], not f32[4, 8]"));
  }
  EXPECT_THROW(assemble({HostTensor(DType::F32, {4, 8})}, spec, mesh),
               std::invalid_argument);
}

//===----------------------------------------------------------------------===//
// HostTensor: .npy files
//===----------------------------------------------------------------------===//

namespace {

void writeRaw(const std::string &path, const std::string &header,
              const std::vector<uint8_t> &data, int version = 1) {
  std::ofstream out(path, std::ios::binary);
  out.write("\x93NUMPY", 6);
  out.put(char(version));
  out.put(0);
  uint32_t len = header.size();
  if (version == 1) {
    out.put(char(len & 0xff));
    out.put(char(len >> 8));
  } else {
    for (int i = 0; i < 4; ++i)
      out.put(char((len >> (8 * i)) & 0xff));
  }
  out.write(header.data(), header.size());
  out.write(reinterpret_cast<const char *>(data.data()), data.size());
}

std::string fileText(const std::string &path) {
  std::ifstream in(path, std::ios::binary);
  return std::string(std::istreambuf_iterator<char>(in), {});
}

/// f32 to bf16, round to nearest even (finite values).
uint16_t bf16Of(float x) {
  uint32_t bits;
  std::memcpy(&bits, &x, 4);
  return static_cast<uint16_t>((bits + 0x7fff + ((bits >> 16) & 1)) >> 16);
}

std::string npyError(const std::string &path, DType want) {
  try {
    readNpy(path, want);
  } catch (const std::exception &e) {
    return e.what();
  }
  ADD_FAILURE() << path << " was read";
  return "";
}

} // namespace

TEST(Npy, EveryTypeRoundTripsBitForBit) {
  const std::pair<DType, const char *> types[] = {
      {DType::F64, "<f8"}, {DType::F32, "<f4"},      {DType::F16, "<f2"},
      {DType::BF16, "<u2"}, {DType::F8E4M3FN, "|u1"}, {DType::F8E5M2, "|u1"},
      {DType::I64, "<i8"}, {DType::I32, "<i4"},      {DType::I1, "|b1"}};
  for (const Shape &shape : {Shape{2, 3}, Shape{}, Shape{5}, Shape{2, 1, 3}, Shape{0, 3}})
    for (auto [type, descr] : types) {
      SCOPED_TRACE(::testing::Message() << name(type) << " "
                                        << ::testing::PrintToString(shape));
      HostTensor t(type, shape);
      for (size_t i = 0; i < t.bytes.size(); ++i)
        t.bytes[i] = type == DType::I1 ? i % 2 : static_cast<uint8_t>(i * 37 + 11);
      std::string path = tempPath("roundtrip.npy");
      writeNpy(path, t);
      std::string text = fileText(path);
      ASSERT_GE(text.size(), 10u);
      EXPECT_EQ(text.substr(0, 8), std::string("\x93NUMPY\x01\x00", 8));
      size_t headerLength = uint8_t(text[8]) | (uint8_t(text[9]) << 8);
      EXPECT_EQ((10 + headerLength) % 64, 0u) << "data not 64-byte aligned";
      std::string header = text.substr(10, headerLength);
      EXPECT_THAT(header, HasSubstr(std::string("'descr': '") + descr + "'"));
      EXPECT_THAT(header, HasSubstr("'fortran_order': False"));
      EXPECT_EQ(header.back(), '\n');
      EXPECT_EQ(text.size(), 10 + headerLength + t.bytes.size());
      HostTensor back = readNpy(path, type);
      EXPECT_TRUE(sameTensor(back, t));
      std::remove(path.c_str());
    }
}

TEST(Npy, ShapesAreWrittenAsPythonTuples) {
  std::string path = tempPath("shape.npy");
  writeNpy(path, HostTensor(DType::F32, {7}));
  EXPECT_THAT(fileText(path), HasSubstr("'shape': (7,)"));
  writeNpy(path, HostTensor(DType::F32, {}));
  EXPECT_THAT(fileText(path), HasSubstr("'shape': ()"));
  writeNpy(path, HostTensor(DType::F32, {2, 3}));
  EXPECT_THAT(fileText(path), HasSubstr("'shape': (2,3)"));
  std::remove(path.c_str());
}

TEST(Npy, AnF32FileFeedsABf16TensorRoundingOnce) {
  const std::vector<float> values = {
      1.0f,
      1.0f + 0x1p-8f,              // a tie: to even, down
      1.0f + 3 * 0x1p-8f,          // a tie: to even, up
      1.0f + 0x1p-8f + 0x1p-20f,   // just above the tie: up
      -3.3f, 65504.0f, 1e-40f,     // a subnormal
      3.0e38f};
  std::string path = tempPath("f32.npy");
  writeNpy(path, f32({2, 4}, values));
  HostTensor t = readNpy(path, DType::BF16);
  ASSERT_EQ(t.type, DType::BF16);
  ASSERT_EQ(t.shape, (Shape{2, 4}));
  for (size_t i = 0; i < values.size(); ++i)
    EXPECT_EQ(t.as<uint16_t>()[i], bf16Of(values[i])) << values[i];
  EXPECT_EQ(t.as<uint16_t>()[1], 0x3f80);
  EXPECT_EQ(t.as<uint16_t>()[2], 0x3f82);
  EXPECT_EQ(t.as<uint16_t>()[3], 0x3f81);

  // Wider: f32 into f64 is exact; i32 into i64 too.
  HostTensor wide = readNpy(path, DType::F64);
  for (size_t i = 0; i < values.size(); ++i)
    EXPECT_EQ(wide.as<double>()[i], double(values[i]));
  writeNpy(path, filled<int32_t>(DType::I32, {3}, [](int64_t i) {
             return int32_t(i * 1000 - 7);
           }));
  HostTensor ints = readNpy(path, DType::I64);
  EXPECT_EQ(ints.as<int64_t>()[2], 1993);
  std::remove(path.c_str());
}

TEST(Npy, ReadsVersion2Headers) {
  std::string path = tempPath("v2.npy");
  writeRaw(path, "{'descr': '<i4', 'fortran_order': False, 'shape': (2, 2), }\n",
           bytesOf(std::vector<int32_t>{1, -2, 3, 4}), 2);
  HostTensor t = readNpy(path, DType::I32);
  EXPECT_EQ(t.shape, (Shape{2, 2}));
  EXPECT_EQ(t.as<int32_t>()[1], -2);
  std::remove(path.c_str());
}

TEST(Npy, BadFilesAreErrors) {
  std::string path = tempPath("bad.npy");
  std::remove(path.c_str());
  EXPECT_THAT(npyError(path, DType::F32), HasSubstr(path + ": cannot open"));

  { std::ofstream(path) << "P5 2 2 255\n...."; }
  EXPECT_THAT(npyError(path, DType::F32), HasSubstr("not a .npy file"));

  { std::ofstream(path, std::ios::binary).write("\x93NUMPY\x01\x00\x40\x00{'de", 14); }
  EXPECT_THAT(npyError(path, DType::F32), HasSubstr("truncated .npy header"));

  const std::string f32Header =
      "{'descr': '<f4', 'fortran_order': False, 'shape': (2, 3), }\n";
  writeRaw(path, f32Header, std::vector<uint8_t>(20)); // 24 needed
  EXPECT_THAT(npyError(path, DType::F32), HasSubstr("truncated data"));

  writeRaw(path, "{'descr': '<f4', 'fortran_order': True, 'shape': (2, 3), }\n",
           std::vector<uint8_t>(24));
  EXPECT_THAT(npyError(path, DType::F32), HasSubstr("Fortran-ordered"));

  writeRaw(path, f32Header, std::vector<uint8_t>(24));
  EXPECT_THAT(npyError(path, DType::I64), HasSubstr("holds f32, expected i64"));

  writeRaw(path, "{'descr': '<c8', 'fortran_order': False, 'shape': (1,), }\n",
           std::vector<uint8_t>(8));
  EXPECT_THAT(npyError(path, DType::F32), HasSubstr("dtype '<c8' cannot hold f32"));

  // Raw bits only for a type of their width.
  writeRaw(path, "{'descr': '<u2', 'fortran_order': False, 'shape': (1,), }\n",
           std::vector<uint8_t>(2));
  EXPECT_THAT(npyError(path, DType::F32), HasSubstr("cannot hold f32"));

  writeRaw(path, "{'fortran_order': False, 'shape': (1,), }\n",
           std::vector<uint8_t>(4));
  EXPECT_THAT(npyError(path, DType::F32), HasSubstr("no 'descr'"));
  std::remove(path.c_str());
}

TEST(Npy, SizesAreCheckedAgainstTheFileBeforeAllocating) {
  std::string path = tempPath("bounds.npy");
  // A version-2 header length of 4 GB in a 20-byte file.
  {
    std::ofstream out(path, std::ios::binary);
    out.write("\x93NUMPY\x02\x00\xff\xff\xff\xff{'descr'", 20);
  }
  EXPECT_THAT(npyError(path, DType::F32),
              HasSubstr("header length 4294967295 is over the limit"));
  // A shape of 3 G elements over 8 data bytes: refused, nothing allocated.
  writeRaw(path, "{'descr': '<f4', 'fortran_order': False, 'shape': (1000000, 3000), }\n",
           std::vector<uint8_t>(8));
  EXPECT_THAT(npyError(path, DType::F32), HasSubstr("truncated data (the shape"));
  // Sizes whose product overflows 64 bits.
  writeRaw(path,
           "{'descr': '<f4', 'fortran_order': False, 'shape': "
           "(4294967296, 4294967296, 16), }\n",
           std::vector<uint8_t>(8));
  EXPECT_THAT(npyError(path, DType::F32), HasSubstr("truncated data"));
  // Negative dimensions are not read as positive ones.
  writeRaw(path, "{'descr': '<f4', 'fortran_order': False, 'shape': (-2, -8), }\n",
           std::vector<uint8_t>(64));
  EXPECT_THAT(npyError(path, DType::F32), HasSubstr("not a non-negative integer"));
  writeRaw(path, "{'descr': '<f4', 'fortran_order': False, 'shape': (2 8), }\n",
           std::vector<uint8_t>(64));
  EXPECT_THAT(npyError(path, DType::F32), HasSubstr("not a non-negative integer"));
  writeRaw(path, "{'descr': '<f4', 'fortran_order': False, 'shape': 7, }\n",
           std::vector<uint8_t>(64));
  EXPECT_THAT(npyError(path, DType::F32), HasSubstr("malformed"));
  // Scalars and one-dimensional shapes still read.
  writeRaw(path, "{'descr': '<f4', 'fortran_order': False, 'shape': (), }\n",
           std::vector<uint8_t>(4));
  EXPECT_EQ(readNpy(path, DType::F32).shape, std::vector<int64_t>{});
  writeRaw(path, "{'descr': '<f4', 'fortran_order': False, 'shape': (3,), }\n",
           std::vector<uint8_t>(12));
  EXPECT_EQ(readNpy(path, DType::F32).shape, std::vector<int64_t>{3});
  std::remove(path.c_str());
  // A FIFO would block: refused before the open.
  ASSERT_EQ(::mkfifo(path.c_str(), 0600), 0);
  EXPECT_THAT(npyError(path, DType::F32), HasSubstr("is a FIFO, not a regular file"));
  std::remove(path.c_str());
}

//===----------------------------------------------------------------------===//
// Collectives through the executor
//===----------------------------------------------------------------------===//

namespace {

/// One collective of the sweep: its op, attrs, local shapes (g = group size)
/// and the reference for an output element on a rank.
struct CollectiveCase {
  std::string label, op;
  AttrList attrs;
  Shape in, out;
  DType outType = DType::F32;
};

/// Rank r's input of case c, element i: distinct per rank, signs mixed so
/// neither the first nor the last member always holds the maximum.
float inputValue(int64_t c, int64_t r, int64_t i) {
  return float((r * 37 + i * 11 + c * 5) % 97 - 48) + 0.5f * float(r);
}

std::vector<CollectiveCase> collectiveCases(int64_t g) {
  auto kind = [](const char *k) { return std::string(k); };
  return {
      {"all_reduce sum", "ernie.all_reduce", {{"kind", kind("sum")}}, {2, 3}, {2, 3}},
      {"all_reduce max", "ernie.all_reduce", {{"kind", kind("max")}}, {2, 3}, {2, 3}},
      {"all_reduce avg", "ernie.all_reduce", {{"kind", kind("avg")}}, {2, 3}, {2, 3}},
      {"all_gather dim 0", "ernie.all_gather", {{"dim", int64_t(0)}}, {2, 3}, {2 * g, 3}},
      {"all_gather dim 1", "ernie.all_gather", {{"dim", int64_t(1)}}, {2, 3, 2}, {2, 3 * g, 2}},
      {"all_gather dim 2", "ernie.all_gather", {{"dim", int64_t(2)}}, {2, 3, 1}, {2, 3, g}},
      {"reduce_scatter dim 0", "ernie.reduce_scatter",
       {{"dim", int64_t(0)}, {"kind", kind("sum")}}, {2 * g, 3}, {2, 3}},
      {"reduce_scatter dim 1", "ernie.reduce_scatter",
       {{"dim", int64_t(1)}, {"kind", kind("sum")}}, {2, 2 * g, 3}, {2, 2, 3}},
      {"reduce_scatter dim 2 max", "ernie.reduce_scatter",
       {{"dim", int64_t(2)}, {"kind", kind("max")}}, {2, 3, 2 * g}, {2, 3, 2}},
      {"all_to_all split 0 concat 1", "ernie.all_to_all",
       {{"split_dim", int64_t(0)}, {"concat_dim", int64_t(1)}}, {2 * g, 3}, {2, 3 * g}},
      {"all_to_all split 1 concat 0", "ernie.all_to_all",
       {{"split_dim", int64_t(1)}, {"concat_dim", int64_t(0)}}, {2, 3 * g}, {2 * g, 3}},
      {"all_to_all split 2 concat 1", "ernie.all_to_all",
       {{"split_dim", int64_t(2)}, {"concat_dim", int64_t(1)}}, {2, 3, 2 * g}, {2, 3 * g, 2}},
      {"shard_slice dim 0", "ernie.shard_slice", {{"dim", int64_t(0)}}, {2 * g, 3}, {2, 3}},
      {"shard_slice dim 1", "ernie.shard_slice", {{"dim", int64_t(1)}}, {2, 3 * g}, {2, 3}},
      {"partial_init sum", "ernie.partial_init", {{"kind", kind("sum")}}, {2, 3}, {2, 3}},
      {"partial_init max", "ernie.partial_init", {{"kind", kind("max")}}, {2, 3}, {2, 3}},
      {"axis_index", "ernie.axis_index", {}, {}, {}, DType::I64},
  };
}

/// What output element `idx` of case `c` is on `rank`, from the definitions.
double expectedElement(const CollectiveCase &c, int64_t caseIndex,
                       const MeshShape &mesh, const Axes &axes, int64_t rank,
                       const Shape &idx) {
  std::vector<int64_t> members = mesh.group(rank, axes);
  int64_t g = members.size(), me = mesh.indexOver(rank, axes);
  auto in = [&](int64_t member, const Shape &at) {
    return double(inputValue(caseIndex, member, flatIndex(c.in, at)));
  };
  auto reduce = [&](const std::string &kind, const Shape &at) {
    double sum = 0, best = -1e300;
    for (int64_t m : members) {
      sum += in(m, at);
      best = std::max(best, in(m, at));
    }
    return kind == "max" ? best : kind == "avg" ? double(float(sum) / float(g)) : sum;
  };
  auto attr = [&](const std::string &key) -> const Attrs::Value & {
    for (const auto &[k, v] : c.attrs)
      if (k == key)
        return v;
    throw std::logic_error("no attr " + key);
  };
  auto intAttr = [&](const std::string &key) { return std::get<int64_t>(attr(key)); };
  auto kindAttr = [&] { return std::get<std::string>(attr("kind")); };

  if (c.op == "ernie.all_reduce")
    return reduce(kindAttr(), idx);
  if (c.op == "ernie.all_gather") {
    int64_t d = intAttr("dim");
    Shape at = idx;
    at[d] %= c.in[d];
    return in(members[idx[d] / c.in[d]], at);
  }
  if (c.op == "ernie.reduce_scatter") {
    int64_t d = intAttr("dim");
    Shape at = idx;
    at[d] += me * c.out[d];
    return reduce(kindAttr(), at);
  }
  if (c.op == "ernie.all_to_all") {
    int64_t split = intAttr("split_dim"), concat = intAttr("concat_dim");
    Shape at = idx;
    at[concat] %= c.in[concat];
    at[split] += me * c.out[split];
    return in(members[idx[concat] / c.in[concat]], at);
  }
  if (c.op == "ernie.shard_slice") {
    int64_t d = intAttr("dim");
    Shape at = idx;
    at[d] += me * c.out[d];
    return in(rank, at);
  }
  if (c.op == "ernie.partial_init")
    return kindAttr() == "sum" && me != 0 ? 0.0 : in(rank, idx);
  if (c.op == "ernie.axis_index")
    return double(me);
  throw std::logic_error("unknown case " + c.op);
}

void checkCollectives(const MeshShape &meshShape, const Axes &axes) {
  SCOPED_TRACE(::testing::Message()
               << "mesh " << ::testing::PrintToString(meshShape.sizes)
               << " over " << describeAxes(axes));
  int64_t g = meshShape.axesSize(axes);
  std::vector<CollectiveCase> cases = collectiveCases(g);
  ProgramBuilder pb(meshShape.names, meshShape.sizes);
  FunctionBuilder &f = pb.function("sweep");
  for (const CollectiveCase &c : cases) {
    uint32_t out = f.buffer(c.outType, c.out);
    if (c.op == "ernie.axis_index") {
      f.op(c.op, {}, {out}, c.attrs, axes).ret(out);
      continue;
    }
    uint32_t in = f.buffer(DType::F32, c.in);
    f.arg(in).op(c.op, {in}, {out}, c.attrs, axes).ret(out);
  }
  Program program = pb.parse();
  auto results = runOnEveryRank(program, "sweep", [&](int64_t r) {
    std::vector<HostTensor> inputs;
    for (size_t c = 0; c < cases.size(); ++c)
      if (cases[c].op != "ernie.axis_index")
        inputs.push_back(f32(cases[c].in, [&](int64_t i) {
          return inputValue(int64_t(c), r, i);
        }));
    return inputs;
  });
  for (int64_t r = 0; r < meshShape.ranks(); ++r)
    for (size_t c = 0; c < cases.size(); ++c) {
      SCOPED_TRACE(::testing::Message() << cases[c].label << ", rank " << r);
      const HostTensor &got = results[r][c];
      ASSERT_EQ(got.shape, cases[c].out);
      ASSERT_EQ(got.type, cases[c].outType);
      int mismatches = 0;
      forEachIndex(cases[c].out, [&](const Shape &idx) {
        double want = expectedElement(cases[c], c, meshShape, axes, r, idx);
        int64_t i = flatIndex(cases[c].out, idx);
        double have = got.type == DType::I64 ? double(got.as<int64_t>()[i])
                                             : double(got.as<float>()[i]);
        if (have != want && mismatches++ < 3)
          ADD_FAILURE() << "element " << ::testing::PrintToString(idx) << ": got "
                        << have << ", want " << want;
      });
    }
}

} // namespace

TEST(ExecutorCollectives, EveryCollectiveOnMesh2) {
  for (const Axes &axes : axisSubsets(kMesh2.mesh()))
    checkCollectives(kMesh2, axes);
}

TEST(ExecutorCollectives, EveryCollectiveOnMesh2x2OverEveryAxisSubset) {
  for (const Axes &axes : axisSubsets(kMesh22.mesh()))
    checkCollectives(kMesh22, axes);
}

TEST(ExecutorCollectives, AxisIndexWithoutAxesIsZero) {
  ProgramBuilder pb(kMesh22.names, kMesh22.sizes);
  FunctionBuilder &f = pb.function("f");
  uint32_t out = f.buffer(DType::I64, {});
  f.op("ernie.axis_index", {}, {out}).ret(out);
  Program program = pb.parse();
  auto results = runOnEveryRank(program, "f", [](int64_t) {
    return std::vector<HostTensor>{};
  });
  for (const auto &r : results)
    EXPECT_EQ(r[0].as<int64_t>()[0], 0);
}

/// Through a Session, speaking in global tensors: a collective that only
/// changes the layout leaves the global value as it was.
TEST(ExecutorCollectives, LayoutChangesKeepTheGlobalValueThroughASession) {
  for (const Axes &axes : axisSubsets(kMesh22.mesh())) {
    SCOPED_TRACE(describeAxes(axes));
    int64_t g = kMesh22.axesSize(axes);
    ProgramBuilder pb(kMesh22.names, kMesh22.sizes);
    FunctionBuilder &f = pb.function("f");
    auto add = [&](const std::string &op, AttrList attrs, Shape in, Shape out,
                   Tensor inSpec, Tensor outSpec) {
      uint32_t a = f.buffer(DType::F32, in), b = f.buffer(DType::F32, out);
      f.arg(a, inSpec).op(op, {a}, {b}, attrs, axes).ret(b, outSpec);
    };
    Tensor partialSum, partialMax;
    for (const std::string &a : axes) {
      partialSum.partial(a, ReduceOp::Sum);
      partialMax.partial(a, ReduceOp::Max);
    }
    // Gathered on dim 1: sharded columns become whole.
    add("ernie.all_gather", {{"dim", int64_t(1)}}, {2, 3}, {2, 3 * g},
        Tensor().split({{}, axes}), Tensor());
    // all_to_all: columns sharded -> rows sharded.
    add("ernie.all_to_all", {{"split_dim", int64_t(0)}, {"concat_dim", int64_t(1)}},
        {2 * g, 3}, {2, 3 * g}, Tensor().split({{}, axes}),
        Tensor().split({axes, {}}));
    // Replicated -> rows sharded.
    add("ernie.shard_slice", {{"dim", int64_t(0)}}, {2 * g, 3}, {2, 3}, Tensor(),
        Tensor().split({axes, {}}));
    // A pending sum -> rows sharded.
    add("ernie.reduce_scatter", {{"dim", int64_t(0)}, {"kind", std::string("sum")}},
        {2 * g, 3}, {2, 3}, partialSum, Tensor().split({axes, {}}));
    // A pending sum / max -> replicated.
    add("ernie.all_reduce", {{"kind", std::string("sum")}}, {2, 3}, {2, 3},
        partialSum, Tensor());
    add("ernie.all_reduce", {{"kind", std::string("max")}}, {2, 3}, {2, 3},
        partialMax, Tensor());
    // Replicated -> a pending sum / max.
    add("ernie.partial_init", {{"kind", std::string("sum")}}, {2, 3}, {2, 3},
        Tensor(), partialSum);
    add("ernie.partial_init", {{"kind", std::string("max")}}, {2, 3}, {2, 3},
        Tensor(), partialMax);

    Program program = pb.parse();
    const Function &fn = *program.function(0, "f");
    std::vector<HostTensor> inputs;
    for (size_t i = 0; i < fn.arguments.size(); ++i)
      inputs.push_back(f32(fn.arguments[i].globalShape, [&](int64_t e) {
        return float(e) * 0.5f - float(i) + 0.25f;
      }));
    Session session(program, quick());
    std::vector<HostTensor> results = session.call("f", inputs);
    ASSERT_EQ(results.size(), inputs.size());
    for (size_t i = 0; i < results.size(); ++i)
      EXPECT_TRUE(sameTensor(results[i], inputs[i]))
          << program.function(0, "f")->instructions[i].op;
  }
}

//===----------------------------------------------------------------------===//
// Kernels, constants, memory
//===----------------------------------------------------------------------===//

TEST(Executor, AColumnParallelMatmulThenAddMatchesANaiveLoop) {
  // y = x @ w + b with w and b split by columns over x=2; y written over its
  // own buffer by the add.
  ProgramBuilder pb({"x"}, {2});
  FunctionBuilder &f = pb.function("f");
  uint32_t x = f.buffer(DType::F32, {3, 5}), w = f.buffer(DType::F32, {5, 2}),
           b = f.buffer(DType::F32, {3, 2}), y = f.buffer(DType::F32, {3, 2});
  f.arg(x, Tensor().named("x"))
      .arg(w, Tensor().named("w").as(Role::Parameter).split({{}, {"x"}}))
      .arg(b, Tensor().named("b").split({{}, {"x"}}))
      .op("ernie.matmul", {x, w}, {y})
      .op("ernie.add", {y, b}, {y})
      .ret(y, Tensor().split({{}, {"x"}}));
  Program program = pb.parse();
  HostTensor X = f32({3, 5}, [](int64_t i) { return float(i % 7) * 0.25f - 1; });
  HostTensor W = f32({5, 4}, [](int64_t i) { return float((i * 3) % 11) * 0.125f - 0.5f; });
  HostTensor B = f32({3, 4}, [](int64_t i) { return float(i) - 6; });
  Session session(program, quick());
  session.setState("f", "w", W);
  std::vector<HostTensor> out = session.call("f", {X, B});
  ASSERT_EQ(out.size(), 1u);
  ASSERT_EQ(out[0].shape, (Shape{3, 4}));
  for (int64_t i = 0; i < 3; ++i)
    for (int64_t j = 0; j < 4; ++j) {
      double acc = 0;
      for (int64_t k = 0; k < 5; ++k)
        acc += double(X.as<float>()[i * 5 + k]) * W.as<float>()[k * 4 + j];
      acc += B.as<float>()[i * 4 + j];
      EXPECT_NEAR(out[0].as<float>()[i * 4 + j], acc, 1e-5) << i << "," << j;
    }
}

TEST(Executor, ConstantsAreWrittenOnEveryCall) {
  ProgramBuilder pb({"world"}, {1});
  FunctionBuilder &f = pb.function("f");
  uint32_t x = f.buffer(DType::F32, {2, 2}), c = f.buffer(DType::F32, {2, 2}),
           ints = f.buffer(DType::I64, {3}), pi = f.buffer(DType::F64, {}),
           half = f.buffer(DType::BF16, {2});
  f.arg(x)
      .constant(c, std::vector<float>{1.5f, -2, 3, 4.25f})
      .constant(ints, std::vector<int64_t>{-1, 0, int64_t(1) << 40})
      .constant(pi, std::vector<double>{3.14159})
      .constant(half, std::vector<uint16_t>{0x3f80, 0xc000})
      // The sum is written over the constant's own buffer.
      .op("ernie.add", {x, c}, {c})
      .ret(c)
      .ret(ints)
      .ret(pi)
      .ret(half);
  Program program = pb.parse();
  ThreadWorld world(program.mesh(), std::chrono::seconds(5));
  auto comm = world.communicator(0);
  Executor executor(program, *comm);
  for (float shift : {0.0f, 10.0f}) {
    HostTensor in = f32({2, 2}, [&](int64_t i) { return float(i) + shift; });
    std::vector<HostTensor> out = executor.run("f", {in});
    ASSERT_EQ(out.size(), 4u);
    EXPECT_TRUE(sameTensor(out[0], f32({2, 2}, {1.5f + shift, -1 + shift,
                                                5 + shift, 7.25f + shift})));
    EXPECT_EQ(out[1].shape, (Shape{3}));
    EXPECT_EQ(out[1].as<int64_t>()[0], -1);
    EXPECT_EQ(out[1].as<int64_t>()[2], int64_t(1) << 40);
    EXPECT_EQ(out[2].shape, Shape{});
    EXPECT_EQ(out[2].as<double>()[0], 3.14159);
    EXPECT_EQ(out[3].as<uint16_t>()[0], 0x3f80);
    EXPECT_EQ(out[3].as<uint16_t>()[1], 0xc000);
  }
}

/// Runs @f of the two tests below twice on fresh inputs a and s: u = a^2 - s
/// and s - u subtracted from -a, with the caller's inputs untouched.
static void expectSharedMemoryResults(const Program &program) {
  ThreadWorld world(program.mesh(), std::chrono::seconds(5));
  auto comm = world.communicator(0);
  Executor executor(program, *comm);
  for (int call = 0; call < 2; ++call) {
    HostTensor A = f32({4}, [&](int64_t i) { return float(i + call) - 1.5f; });
    HostTensor S = f32({4}, [&](int64_t i) { return float(3 * i) + 0.25f; });
    std::vector<HostTensor> out = executor.run("f", {A, S});
    for (int64_t i = 0; i < 4; ++i) {
      float av = A.as<float>()[i], sv = S.as<float>()[i];
      float uv = av * av - sv;
      EXPECT_EQ(out[0].as<float>()[i], uv);
      EXPECT_EQ(out[1].as<float>()[i], -av - (sv - uv));
    }
    EXPECT_EQ(A.as<float>()[0], float(call) - 1.5f);
    EXPECT_EQ(S.as<float>()[1], 3.25f);
  }
}

TEST(Executor, BuffersSharingMemoryStayCorrect) {
  // Planned like the compiler's arena: u reuses a's memory once a is dead;
  // the subs write over an operand (the first, then the second).
  ProgramBuilder pb({"world"}, {1});
  FunctionBuilder &f = pb.function("f");
  uint32_t a = f.buffer(DType::F32, {4}), t = f.buffer(DType::F32, {4}),
           u = f.buffer(DType::F32, {4}), s = f.buffer(DType::F32, {4});
  f.buffers[a].offset = 0;
  f.buffers[t].offset = 64;
  f.buffers[u].offset = 0;
  f.buffers[s].offset = 128;
  f.arg(a)
      .arg(s)
      .op("ernie.neg", {a}, {t})      // t = -a
      .op("ernie.mul", {t, t}, {u})   // u = a^2, over a
      .op("ernie.sub", {u, s}, {u})   // u = a^2 - s, over the first operand
      .op("ernie.sub", {s, u}, {s})   // s = s - u, over the first operand
      .op("ernie.sub", {t, s}, {s})   // s = t - s, over the second operand
      .ret(u)
      .ret(s);
  expectSharedMemoryResults(pb.parse());
}

TEST(Executor, ArgumentsOutsideTheArenaAreStagedFromTheHost) {
  // Planned as the compiler plans now: the arena holds t and u, the
  // arguments lie after it (the region the executor binds per call, here
  // to copies of the host inputs), and s is updated in place and returned.
  ProgramBuilder pb({"world"}, {1});
  FunctionBuilder &f = pb.function("f");
  uint32_t a = f.buffer(DType::F32, {4}), t = f.buffer(DType::F32, {4}),
           u = f.buffer(DType::F32, {4}), s = f.buffer(DType::F32, {4});
  f.buffers[t].offset = 0;
  f.buffers[u].offset = 64;
  f.buffers[a].offset = 128;
  f.buffers[s].offset = 192;
  f.arenaBytes = 128;
  f.argumentBytes = 128;
  f.arg(a)
      .arg(s)
      .op("ernie.neg", {a}, {t})    // t = -a
      .op("ernie.mul", {t, t}, {u}) // u = a^2
      .op("ernie.sub", {u, s}, {u}) // u = a^2 - s
      .op("ernie.sub", {s, u}, {s}) // s = s - u, over the argument
      .op("ernie.sub", {t, s}, {s}) // s = t - s, over it again
      .ret(u)
      .ret(s);
  Program program = pb.parse();
  EXPECT_EQ(largestArena(program, 0), 128u);
  expectSharedMemoryResults(program);
}

TEST(Executor, AResultMayBeAnArgumentsBuffer) {
  ProgramBuilder pb({"world"}, {1});
  FunctionBuilder &f = pb.function("id");
  uint32_t a = f.buffer(DType::I32, {3});
  f.arg(a).ret(a).ret(a);
  Program program = pb.parse();
  ThreadWorld world(program.mesh(), std::chrono::seconds(5));
  auto comm = world.communicator(0);
  Executor executor(program, *comm);
  HostTensor in = filled<int32_t>(DType::I32, {3}, [](int64_t i) { return int32_t(i * 9); });
  std::vector<HostTensor> out = executor.run("id", {in});
  ASSERT_EQ(out.size(), 2u);
  EXPECT_TRUE(sameTensor(out[0], in));
  EXPECT_TRUE(sameTensor(out[1], in));
}

//===----------------------------------------------------------------------===//
// Started collectives: collective_permute_start, wait, shard_insert
//===----------------------------------------------------------------------===//

namespace {

const MeshShape kRing4{{"sp"}, {4}};

/// Rank r's piece of the ring tests' input, element i: distinct integers,
/// so sums are exact in any order.
float ringValue(int64_t r, int64_t i) { return float(100 * r + i); }

struct TracedRun {
  std::vector<std::vector<HostTensor>> results; // by rank
  std::vector<std::vector<TraceEvent>> events;  // by rank
};

/// runOnEveryRank with tracing on.
TracedRun
runTraced(const Program &program, const std::string &fn,
          const std::function<std::vector<HostTensor>(int64_t)> &inputs) {
  ExecutorOptions options;
  options.trace = true;
  TracedRun run;
  run.results = runOnEveryRank(program, fn, inputs, options, &run.events);
  return run;
}

/// The all_gather -> matmul decomposition as the overlap pass writes it, a
/// neg standing in for the matmul: the pieces go around the ring (shift 1,
/// spelled 1, 5 and -3), each negated while the next travels and inserted
/// at its source's place (shift -k, spelled -1, 2, -3). The last wait writes
/// another buffer than its start's (the executor copies). Then the gathered
/// value is sliced with shift 2.
Program ringGatherProgram() {
  ProgramBuilder pb(kRing4.names, kRing4.sizes);
  FunctionBuilder &f = pb.function("gather");
  Shape piece{2, 3}, whole{8, 3};
  uint32_t x = f.buffer(DType::F32, piece);
  uint32_t gathered = f.buffer(DType::F32, whole),
           products = f.buffer(DType::F32, whole);
  Axes sp{"sp"};
  f.arg(x, Tensor().named("x").split({sp, {}}))
      .constant(gathered, std::vector<float>(24, 0.0f))
      .constant(products, std::vector<float>(24, 0.0f));
  auto insert = [&](uint32_t part, uint32_t into, int64_t shift) {
    f.op("ernie.shard_insert", {part, into}, {into},
         {{"dim", int64_t(0)}, {"shift", shift}}, sp);
  };
  const int64_t sendShifts[] = {1, 5, -3};
  const int64_t insertShifts[] = {0, -1, 2, -3};
  uint32_t current = x;
  for (int step = 0; step < 4; ++step) {
    uint32_t received = 0;
    if (step < 3) {
      received = f.buffer(DType::F32, piece);
      f.op("ernie.collective_permute_start", {current}, {received},
           {{"shift", sendShifts[step]}}, sp);
    }
    uint32_t product = f.buffer(DType::F32, piece);
    f.op("ernie.neg", {current}, {product});
    insert(product, products, insertShifts[step]);
    insert(current, gathered, insertShifts[step]);
    if (step < 3) {
      uint32_t next = received;
      if (step == 2) {
        next = f.buffer(DType::F32, piece);
      }
      f.op("ernie.wait", {received}, {next}, {}, {},
           "ring.mlir:" + std::to_string(step));
      current = next;
    }
  }
  uint32_t sliced = f.buffer(DType::F32, piece);
  f.op("ernie.shard_slice", {gathered}, {sliced},
       {{"dim", int64_t(0)}, {"shift", int64_t(2)}}, sp)
      .ret(gathered)
      .ret(products)
      .ret(sliced);
  return pb.parse();
}

/// The matmul -> reduce_scatter decomposition as the overlap pass writes it
/// (a neg for the matmul): at step k member i sends its partial for member
/// i + k (shard_slice shift k) with shift k, two transfers in flight at a
/// time, and places each received partial at its source (shift -k).
Program ringScatterProgram() {
  ProgramBuilder pb(kRing4.names, kRing4.sizes);
  FunctionBuilder &f = pb.function("scatter");
  Shape piece{2, 3}, whole{8, 3};
  Axes sp{"sp"};
  uint32_t z = f.buffer(DType::F32, whole),
           bySource = f.buffer(DType::F32, whole);
  f.arg(z, Tensor().named("z").partial("sp", ReduceOp::Sum))
      .constant(bySource, std::vector<float>(24, 0.0f));
  auto partialOf = [&](int64_t step) {
    uint32_t slice = f.buffer(DType::F32, piece),
             partial = f.buffer(DType::F32, piece);
    f.op("ernie.shard_slice", {z}, {slice},
         {{"dim", int64_t(0)}, {"shift", step}}, sp)
        .op("ernie.neg", {slice}, {partial});
    return partial;
  };
  auto place = [&](uint32_t partial, int64_t step) {
    f.op("ernie.shard_insert", {partial, bySource}, {bySource},
         {{"dim", int64_t(0)}, {"shift", -step}}, sp);
  };
  std::optional<uint32_t> inFlight;
  for (int64_t step = 1; step < 4; ++step) {
    uint32_t sent = f.buffer(DType::F32, piece);
    f.op("ernie.collective_permute_start", {partialOf(step)}, {sent},
         {{"shift", step}}, sp);
    if (inFlight) {
      f.op("ernie.wait", {*inFlight}, {*inFlight});
      place(*inFlight, step - 1);
    }
    inFlight = sent;
  }
  place(partialOf(0), 0);
  f.op("ernie.wait", {*inFlight}, {*inFlight});
  place(*inFlight, 3);
  f.ret(bySource);
  return pb.parse();
}

} // namespace

TEST(StartedCollectives, ARingOfPermutesGathersLikeAllGather) {
  Program program = ringGatherProgram();
  auto results = runOnEveryRank(program, "gather", [](int64_t r) {
    return std::vector<HostTensor>{
        f32({2, 3}, [&](int64_t i) { return ringValue(r, i); })};
  });
  // Row j of the whole is row j % 2 of rank j / 2's piece.
  HostTensor whole =
      f32({8, 3}, [](int64_t i) { return ringValue(i / 6, i % 6); });
  HostTensor negated =
      f32({8, 3}, [](int64_t i) { return -ringValue(i / 6, i % 6); });
  for (int64_t r = 0; r < 4; ++r) {
    SCOPED_TRACE(::testing::Message() << "rank " << r);
    ASSERT_EQ(results[r].size(), 3u);
    EXPECT_TRUE(sameTensor(results[r][0], whole));
    EXPECT_TRUE(sameTensor(results[r][1], negated));
    // shard_slice shift 2: rank r keeps piece (r + 2) mod 4.
    EXPECT_TRUE(sameTensor(results[r][2], f32({2, 3}, [&](int64_t i) {
                             return ringValue((r + 2) % 4, i);
                           })));
  }
}

TEST(StartedCollectives, PartialsSentToTheirOwnersLandAtTheirSource) {
  Program program = ringScatterProgram();
  // Rank m's z: element (row, col) = 1000 m + 3 row + col.
  auto zOf = [](int64_t m) {
    return f32({8, 3}, [&](int64_t i) { return float(1000 * m + i); });
  };
  auto results = runOnEveryRank(program, "scatter", [&](int64_t r) {
    return std::vector<HostTensor>{zOf(r)};
  });
  for (int64_t r = 0; r < 4; ++r) {
    SCOPED_TRACE(::testing::Message() << "rank " << r);
    // Block m (rows 2m, 2m + 1) is -(rank m's rows 2r, 2r + 1).
    EXPECT_TRUE(sameTensor(results[r][0], f32({8, 3}, [&](int64_t i) {
                             int64_t row = i / 3, col = i % 3, m = row / 2;
                             return -float(1000 * m + 3 * (2 * r + row % 2) +
                                           col);
                           })));
  }
}

TEST(StartedCollectives, TheTransferIsTracedOnTheCommunicationThread) {
  // A start, a kernel chain long enough to overlap with it, the wait.
  ProgramBuilder pb(kMesh2.names, kMesh2.sizes);
  FunctionBuilder &f = pb.function("overlap");
  const int64_t n = 1 << 16;
  uint32_t x = f.buffer(DType::F32, {n}), r = f.buffer(DType::F32, {n}),
           a = f.buffer(DType::F32, {n}), b = f.buffer(DType::F32, {n});
  f.arg(x).op("ernie.collective_permute_start", {x}, {r},
              {{"shift", int64_t(1)}}, {"x"});
  f.op("ernie.mul", {x, x}, {a});
  for (int i = 0; i < 8; ++i)
    f.op("ernie.tanh", {a}, {b}).op("ernie.mul", {b, x}, {a});
  f.op("ernie.wait", {r}, {r}).ret(r).ret(a);
  Program program = pb.parse();
  TracedRun run = runTraced(program, "overlap", [&](int64_t rank) {
    return std::vector<HostTensor>{
        f32({n}, [&](int64_t i) { return float(rank * n + i); })};
  });
  std::string path = tempPath("overlap.json");
  writeChromeTrace(path, run.events);
  std::string json = fileText(path);
  std::remove(path.c_str());
  for (int64_t rank = 0; rank < 2; ++rank) {
    SCOPED_TRACE(::testing::Message() << "rank " << rank);
    EXPECT_TRUE(sameTensor(run.results[rank][0], f32({n}, [&](int64_t i) {
                             return float((1 - rank) * n + i);
                           })));
    const TraceEvent *issued = nullptr, *transfer = nullptr, *waited = nullptr;
    for (const TraceEvent &e : run.events[rank]) {
      EXPECT_EQ(e.function, "overlap");
      if (e.name == "ernie.collective_permute_start")
        (e.collective ? transfer : issued) = &e;
      else if (e.name == "ernie.wait")
        waited = &e;
      else
        EXPECT_FALSE(e.collective) << e.name << " is compute";
    }
    ASSERT_TRUE(issued && transfer && waited);
    EXPECT_FALSE(waited->collective); // the time compute was blocked
    EXPECT_GE(transfer->startMicros, issued->startMicros);
    EXPECT_LE(transfer->startMicros + transfer->durationMicros,
              waited->startMicros + waited->durationMicros);
    EXPECT_THAT(json, HasSubstr("{\"ph\": \"X\", \"name\": "
                                "\"ernie.collective_permute_start\", \"cat\": "
                                "\"collective\", \"pid\": " +
                                std::to_string(rank) + ", \"tid\": 1, "));
    EXPECT_THAT(json, HasSubstr("{\"ph\": \"X\", \"name\": \"ernie.wait\", "
                                "\"cat\": \"compute\", \"pid\": " +
                                std::to_string(rank) + ", \"tid\": 0, "));
  }
}

// Engines pair a group's collectives by order: a blocking collective while
// a transfer is pending waits for it first (traced as compute time).
TEST(StartedCollectives, ABlockingCollectiveWaitsForStartedTransfersFirst) {
  ProgramBuilder pb(kMesh22.names, kMesh22.sizes);
  FunctionBuilder &f = pb.function("mixed");
  uint32_t x = f.buffer(DType::F32, {3}), r = f.buffer(DType::F32, {3}),
           s = f.buffer(DType::F32, {3}), y = f.buffer(DType::F32, {3});
  f.arg(x)
      .op("ernie.collective_permute_start", {x}, {r}, {{"shift", int64_t(-1)}},
          {"y"})
      .op("ernie.all_reduce", {x}, {s}, {{"kind", std::string("sum")}}, {"y"})
      .op("ernie.wait", {r}, {y})
      .ret(s)
      .ret(y);
  Program program = pb.parse();
  TracedRun run = runTraced(program, "mixed", [](int64_t rank) {
    return std::vector<HostTensor>{
        f32({3}, [&](int64_t i) { return float(10 * rank + i); })};
  });
  for (int64_t rank = 0; rank < 4; ++rank) {
    SCOPED_TRACE(::testing::Message() << "rank " << rank);
    // Groups over y are {0, 1} and {2, 3}: the peer is rank ^ 1.
    int64_t peer = rank ^ 1;
    EXPECT_TRUE(sameTensor(run.results[rank][0], f32({3}, [&](int64_t i) {
                             return float(10 * rank + i + 10 * peer + i);
                           })));
    EXPECT_TRUE(sameTensor(run.results[rank][1], f32({3}, [&](int64_t i) {
                             return float(10 * peer + i);
                           })));
    std::vector<std::string> names;
    for (const TraceEvent &e : run.events[rank])
      names.push_back(e.name + (e.collective ? "@1" : "@0"));
    EXPECT_THAT(names, ::testing::IsSupersetOf(
                           {"ernie.wait (before ernie.all_reduce)@0",
                            "ernie.all_reduce@1", "ernie.wait@0",
                            "ernie.collective_permute_start@1"}));
  }
}

TEST(StartedCollectives, ShardInsertCopiesItsDestinationWhenNotInPlace) {
  ProgramBuilder pb(kMesh24.names, kMesh24.sizes);
  FunctionBuilder &f = pb.function("insert");
  uint32_t dest = f.buffer(DType::I32, {2, 8}),
           piece = f.buffer(DType::I32, {2, 2}),
           out = f.buffer(DType::I32, {2, 8});
  f.arg(dest)
      .arg(piece)
      .op("ernie.shard_insert", {piece, dest}, {out},
          {{"dim", int64_t(1)}, {"shift", int64_t(-5)}}, {"y"})
      .ret(out)
      .ret(dest);
  Program program = pb.parse();
  auto results = runOnEveryRank(program, "insert", [](int64_t r) {
    return std::vector<HostTensor>{
        filled<int32_t>(DType::I32, {2, 8},
                        [](int64_t i) { return int32_t(i); }),
        filled<int32_t>(DType::I32, {2, 2},
                        [&](int64_t i) { return int32_t(-100 * r - i - 1); })};
  });
  for (int64_t r = 0; r < 8; ++r) {
    int64_t me = r % 4, at = ((me - 5) % 4 + 4) % 4; // columns 2 at .. 2 at + 1
    for (int64_t i = 0; i < 16; ++i) {
      int64_t row = i / 8, col = i % 8;
      int32_t want = col / 2 == at ? int32_t(-100 * r - (row * 2 + col % 2) - 1)
                                   : int32_t(i);
      EXPECT_EQ(results[r][0].as<int32_t>()[i], want)
          << "rank " << r << " element " << i;
      EXPECT_EQ(results[r][1].as<int32_t>()[i], int32_t(i))
          << "dest is untouched";
    }
  }
}

//===----------------------------------------------------------------------===//
// Faults
//===----------------------------------------------------------------------===//

namespace {

/// mesh x=2: token ids split over x, looked up in a replicated table, the
/// rows gathered back.
Program embeddingProgram() {
  ProgramBuilder pb({"x"}, {2});
  FunctionBuilder &f = pb.function("lookup");
  uint32_t ids = f.buffer(DType::I64, {2}), table = f.buffer(DType::F32, {4, 3}),
           rows = f.buffer(DType::F32, {2, 3}), all = f.buffer(DType::F32, {4, 3});
  f.arg(ids, Tensor().named("ids").split({{"x"}}))
      .arg(table, Tensor().named("table"))
      .op("ernie.embedding", {ids, table}, {rows}, {}, {}, "model.mlir:7:5")
      .op("ernie.all_gather", {rows}, {all}, {{"dim", int64_t(0)}}, {"x"})
      .ret(all);
  return pb.parse();
}

HostTensor ids(std::vector<int64_t> values) {
  HostTensor t(DType::I64, {int64_t(values.size())});
  std::memcpy(t.bytes.data(), values.data(), t.bytes.size());
  return t;
}

} // namespace

TEST(ExecutorFaults, AKernelErrorOnOneRankStopsEveryRankPromptly) {
  HostTensor table = f32({4, 3}, [](int64_t i) { return float(i); });
  {
    // Valid ids first: the program itself works.
    Session session(embeddingProgram(), quick());
    std::vector<HostTensor> out = session.call("lookup", {ids({3, 0, 2, 1}), table});
    EXPECT_EQ(out[0].as<float>()[0], 9.0f);
    EXPECT_EQ(out[0].as<float>()[11], 5.0f);
  }
  SessionOptions options;
  options.timeout = std::chrono::seconds(30);
  Session session(embeddingProgram(), options);
  // Rank 0 gets ids {0, 3}, rank 1 gets {1, 9}: only rank 1 is out of range.
  std::string message;
  bool inCollective = true;
  double seconds = secondsOf([&] {
    try {
      session.call("lookup", {ids({0, 3, 1, 9}), table});
    } catch (const ExecutionError &e) {
      message = e.what();
      inCollective = e.inCollective;
    }
  });
  EXPECT_LT(seconds, 5.0);
  ASSERT_FALSE(message.empty()) << "expected an ExecutionError";
  EXPECT_FALSE(inCollective);
  EXPECT_THAT(message, HasSubstr("rank 1: @lookup instruction #0 'ernie.embedding'"));
  EXPECT_THAT(message, HasSubstr("at model.mlir:7:5"));
  EXPECT_THAT(message, HasSubstr("embedding index 9 is outside the vocabulary of 4"));
}

namespace {

/// How each of two ranks' runs of @lookup ended: the failure message and
/// whether the cause was a collective (-1: it did not fail), and how long.
struct TwoRankFailure {
  std::vector<std::string> messages = std::vector<std::string>(2);
  std::vector<int> collective = std::vector<int>(2, -1);
  double seconds = 0;
};

/// Runs @lookup of `program` on two thread ranks over the same 4x3 table,
/// rank r looking up `tokens[r]`.
TwoRankFailure runLookupOnTwoRanks(const Program &program,
                                   std::vector<HostTensor> tokens) {
  ThreadWorld world(program.mesh(), std::chrono::seconds(30));
  std::vector<std::unique_ptr<Communicator>> comms;
  for (int64_t r = 0; r < 2; ++r)
    comms.push_back(world.communicator(r));
  HostTensor table = f32({4, 3}, [](int64_t i) { return float(i); });
  TwoRankFailure out;
  out.seconds = secondsOf([&] {
    onThreads(2, [&](int64_t r) {
      Executor executor(program, *comms[r]);
      try {
        executor.run("lookup", {tokens[r], table});
      } catch (const ExecutionError &e) {
        out.messages[r] = e.what();
        out.collective[r] = e.inCollective;
      }
    });
  });
  return out;
}

} // namespace

TEST(ExecutorFaults, PeersWaitingInACollectiveFailWithTheRootCause) {
  Program program = embeddingProgram();
  TwoRankFailure run = runLookupOnTwoRanks(program, {ids({0, 3}), ids({1, -1})});
  const std::vector<std::string> &messages = run.messages;
  const std::vector<int> &collective = run.collective;
  EXPECT_LT(run.seconds, 5.0);
  EXPECT_EQ(collective[1], 0);
  EXPECT_THAT(messages[1], HasSubstr("rank 1: @lookup instruction #0"));
  EXPECT_THAT(messages[1], HasSubstr("index -1"));
  // Rank 0 failed in the all_gather, because rank 1 aborted.
  EXPECT_EQ(collective[0], 1);
  EXPECT_THAT(messages[0], HasSubstr("rank 0: @lookup instruction #1 'ernie.all_gather'"));
  EXPECT_THAT(messages[0], HasSubstr("aborted"));
  EXPECT_THAT(messages[0], HasSubstr("rank 1"));
}

// Rank 1 fails before its start; rank 0's transfer cannot complete, and its
// wait reports the abort at the wait, with the root cause.
TEST(ExecutorFaults, AWaitForAFailedTransferReportsTheRootCause) {
  ProgramBuilder pb({"x"}, {2});
  FunctionBuilder &f = pb.function("lookup");
  uint32_t tokens = f.buffer(DType::I64, {2}),
           vocab = f.buffer(DType::F32, {4, 3}),
           rows = f.buffer(DType::F32, {2, 3}),
           got = f.buffer(DType::F32, {2, 3});
  f.arg(tokens)
      .arg(vocab)
      .op("ernie.embedding", {tokens, vocab}, {rows}, {}, {}, "model.mlir:7:5")
      .op("ernie.collective_permute_start", {rows}, {got},
          {{"shift", int64_t(1)}}, {"x"}, "model.mlir:8:5")
      .op("ernie.wait", {got}, {got}, {}, {}, "model.mlir:9:5")
      .ret(got);
  Program program = pb.parse();
  TwoRankFailure run = runLookupOnTwoRanks(program, {ids({0, 3}), ids({1, 7})});
  const std::vector<std::string> &messages = run.messages;
  const std::vector<int> &collective = run.collective;
  EXPECT_LT(run.seconds, 5.0);
  EXPECT_EQ(collective[1], 0);
  EXPECT_THAT(messages[1], HasSubstr("rank 1: @lookup instruction #0"));
  EXPECT_EQ(collective[0], 1);
  EXPECT_THAT(messages[0], HasSubstr("rank 0: @lookup instruction #2 "
                                     "'ernie.wait' at model.mlir:9:5: "));
  EXPECT_THAT(messages[0], HasSubstr("permute over [x]"));
  EXPECT_THAT(messages[0], HasSubstr("aborted: rank 1"));
  EXPECT_THAT(messages[0],
              HasSubstr("embedding index 7 is outside the vocabulary"));
}

namespace {

Program lossProgram(DType type) {
  ProgramBuilder pb({"x"}, {2});
  FunctionBuilder &f = pb.function("step");
  uint32_t x = f.buffer(type, {3}), loss = f.buffer(type, {});
  f.arg(x)
      .op("ernie.reduce_sum", {x}, {loss}, {{"axes", std::vector<int64_t>{0}}})
      .ret(loss, Tensor().named("loss").as(Role::Loss));
  return pb.parse();
}

} // namespace

TEST(ExecutorFaults, ANonFiniteLossFailsOnlyWhenChecked) {
  const float inf = std::numeric_limits<float>::infinity();
  const float nan = std::numeric_limits<float>::quiet_NaN();
  for (DType type : {DType::F32, DType::BF16})
    for (float bad : {inf, nan}) {
      SCOPED_TRACE(::testing::Message() << name(type) << " " << bad);
      HostTensor x = convert(f32({3}, {1.0f, bad, 2.0f}), type);
      SessionOptions checked = quick();
      checked.executor.checkFinite = FiniteCheck::Results;
      {
        Session session(lossProgram(type), checked);
        try {
          session.call("step", {x});
          ADD_FAILURE() << "a non-finite loss passed the check";
        } catch (const ExecutionError &e) {
          EXPECT_FALSE(e.inCollective);
          EXPECT_THAT(e.what(), HasSubstr("@step result 0 (the loss) is not finite"));
        }
        // A finite loss passes the check.
        Session fine(lossProgram(type), checked);
        std::vector<HostTensor> out =
            fine.call("step", {convert(f32({3}, {1, 2, 3.5f}), type)});
        EXPECT_EQ(convert(out[0], DType::F32).as<float>()[0], 6.5f);
      }
      Session unchecked(lossProgram(type), quick());
      std::vector<HostTensor> out = unchecked.call("step", {x});
      float loss = convert(out[0], DType::F32).as<float>()[0];
      EXPECT_FALSE(std::isfinite(loss));
    }
}

TEST(ExecutorFaults, CheckingTensorsNamesTheFirstInstructionThatWritesANaN) {
  // x -> exp (overflows at 100) -> sum: the loss, and a "grad_norm" metric.
  ProgramBuilder pb({"x"}, {2});
  FunctionBuilder &f = pb.function("step");
  uint32_t x = f.buffer(DType::F32, {3}), y = f.buffer(DType::F32, {3}),
           loss = f.buffer(DType::F32, {}), norm = f.buffer(DType::F32, {});
  f.arg(x)
      .op("ernie.exp", {x}, {y})
      .op("ernie.reduce_sum", {y}, {loss}, {{"axes", std::vector<int64_t>{0}}})
      .op("ernie.reduce_sum", {x}, {norm}, {{"axes", std::vector<int64_t>{0}}})
      .ret(loss, Tensor().named("loss").as(Role::Loss))
      .ret(norm, Tensor().named("grad_norm").as(Role::Metric));
  Program program = pb.parse();
  HostTensor overflows = f32({3}, {1.0f, 100.0f, 2.0f});

  // Unchecked, the call passes; from the next call on, every tensor is.
  Session session(program, quick());
  session.call("step", {overflows});
  session.setFiniteCheck(FiniteCheck::Tensors);
  try {
    session.call("step", {overflows});
    ADD_FAILURE() << "an overflow passed the tensor check";
  } catch (const ExecutionError &e) {
    EXPECT_THAT(e.what(), HasSubstr("@step instruction #0 'ernie.exp'"));
    EXPECT_THAT(e.what(), HasSubstr("result 0 ([3]xf32) is the first tensor of the "
                                    "call that is not finite"));
  }
  // The results check sees the loss only after the call.
  SessionOptions results = quick();
  results.executor.checkFinite = FiniteCheck::Results;
  Session late(program, results);
  EXPECT_THROW(
      {
        try {
          late.call("step", {overflows});
        } catch (const ExecutionError &e) {
          EXPECT_THAT(e.what(), HasSubstr("@step result 0 (the loss) is not finite"));
          throw;
        }
      },
      ExecutionError);
  // A finite loss with a non-finite metric: the metric is named.
  Session metric(program, results);
  HostTensor nanOnlyInNorm = f32({3}, {-std::numeric_limits<float>::infinity(), 0.0f, 1.0f});
  try {
    metric.call("step", {nanOnlyInNorm});
    ADD_FAILURE() << "a non-finite metric passed the check";
  } catch (const ExecutionError &e) {
    EXPECT_THAT(e.what(), HasSubstr("(the metric 'grad_norm') is not finite"));
  }
  EXPECT_EQ(parseFiniteCheck("tensors"), FiniteCheck::Tensors);
  EXPECT_THROW(parseFiniteCheck("sometimes"), std::invalid_argument);
}

TEST(ExecutorFaults, APeerThatNeverArrivesIsATimeoutNotAHang) {
  ProgramBuilder pb({"x"}, {2});
  FunctionBuilder &f = pb.function("f");
  uint32_t a = f.buffer(DType::F32, {2}), b = f.buffer(DType::F32, {2});
  f.arg(a)
      .op("ernie.all_reduce", {a}, {b}, {{"kind", std::string("sum")}}, {"x"})
      .ret(b);
  Program program = pb.parse();
  ThreadWorld world(program.mesh(), std::chrono::milliseconds(300));
  auto comm0 = world.communicator(0);
  auto comm1 = world.communicator(1); // rank 1 never runs
  RankRunner rank0(program, *comm0);
  std::string message;
  bool inCollective = false;
  double seconds = secondsOf([&] {
    try {
      rank0.call("f", {f32({2}, {1, 2})});
    } catch (const ExecutionError &e) {
      message = e.what();
      inCollective = e.inCollective;
    }
  });
  EXPECT_LT(seconds, 5.0);
  EXPECT_TRUE(inCollective);
  EXPECT_THAT(message, HasSubstr("rank 0: @f instruction #0 'ernie.all_reduce'"));
  EXPECT_THAT(message, HasSubstr("timed out"));
}

TEST(ExecutorFaults, WrongInputsAreInvalidArguments) {
  ProgramBuilder pb({"x"}, {2});
  FunctionBuilder &f = pb.function("f");
  uint32_t a = f.buffer(DType::F32, {2, 3}), b = f.buffer(DType::F32, {2, 3});
  f.arg(a, Tensor().named("x").split({{"x"}, {}}))
      .op("ernie.relu", {a}, {b})
      .ret(b, Tensor().split({{"x"}, {}}));
  Program program = pb.parse();

  ThreadWorld world(program.mesh(), std::chrono::seconds(5));
  auto comm = world.communicator(0);
  Executor executor(program, *comm);
  auto runError = [&](const std::string &fn, const std::vector<HostTensor> &in) {
    try {
      executor.run(fn, in);
    } catch (const std::invalid_argument &e) {
      return std::string(e.what());
    }
    ADD_FAILURE() << "accepted";
    return std::string();
  };
  EXPECT_THAT(runError("f", {}), HasSubstr("@f takes 1 arguments, not 0"));
  HostTensor good(DType::F32, {2, 3});
  EXPECT_THAT(runError("f", {good, good}), HasSubstr("@f takes 1 arguments, not 2"));
  std::string shape = runError("f", {HostTensor(DType::F32, {4, 3})});
  EXPECT_THAT(shape, HasSubstr("@f argument 0 ('x')"));
  EXPECT_THAT(shape, HasSubstr("local f32 tensor"));
  EXPECT_THAT(runError("f", {HostTensor(DType::F64, {2, 3})}),
              HasSubstr("argument 0 ('x') must be a local f32"));
  std::string missing = runError("g", {good});
  EXPECT_THAT(missing, HasSubstr("no function @g"));
  EXPECT_THAT(missing, HasSubstr("@f"));
  EXPECT_NO_THROW(executor.run("f", {good}));

  // The executor's communicator must be on the program's mesh.
  ThreadWorld other(Mesh({"x"}, {4}), std::chrono::seconds(5));
  auto wrong = other.communicator(0);
  EXPECT_THROW((Executor{program, *wrong}), std::invalid_argument);

  Session session(program, quick());
  auto callError = [&](const std::vector<HostTensor> &in) {
    try {
      session.call("f", in);
    } catch (const std::invalid_argument &e) {
      return std::string(e.what());
    }
    ADD_FAILURE() << "accepted";
    return std::string();
  };
  HostTensor global = f32({4, 3}, [](int64_t i) { return float(i) - 5; });
  EXPECT_THAT(callError({}), HasSubstr("@f takes 1 batch inputs, not 0"));
  EXPECT_THAT(callError({global, global}),
              HasSubstr("@f takes 1 batch inputs, not 2"));
  EXPECT_THAT(callError({HostTensor(DType::F32, {2, 3})}),
              HasSubstr("@f input 0 ('x') must have shape [4, 3], not [2, 3]"));
  // Exact element types (ids are never floats), a finite learning rate and
  // a step from 1, checked before any rank runs.
  EXPECT_THAT(callError({HostTensor(DType::I64, {4, 3})}),
              HasSubstr("@f input 0 ('x') must be f32, not i64 (integers and "
                        "floats are not converted into each other)"));
  EXPECT_THAT(callError({HostTensor(DType::F64, {4, 3})}),
              HasSubstr("must be f32, not f64"));
  auto callWith = [&](double lr, int64_t step) {
    try {
      session.call("f", {global}, lr, step);
    } catch (const std::invalid_argument &e) {
      return std::string(e.what());
    }
    return std::string("accepted");
  };
  EXPECT_THAT(callWith(std::nan(""), 1),
              HasSubstr("@f: the learning rate must be finite, not nan"));
  EXPECT_THAT(callWith(INFINITY, 1), HasSubstr("must be finite"));
  EXPECT_THAT(callWith(0.1, -5), HasSubstr("@f: the step is counted from 1, "
                                           "not -5"));
  EXPECT_THAT(callWith(0.1, 0), HasSubstr("not 0"));
  // Nothing was started: the session still works.
  std::vector<HostTensor> out = session.call("f", {global});
  EXPECT_EQ(out[0].as<float>()[0], 0.0f);
  EXPECT_EQ(out[0].as<float>()[11], 6.0f);
}

//===----------------------------------------------------------------------===//
// Session state
//===----------------------------------------------------------------------===//

namespace {

/// Parameters w [4, 8] and v [8], on `mesh` split as given.
Program parameterProgram(const MeshShape &mesh, std::vector<Axes> wDims,
                         std::vector<Axes> vDims) {
  ProgramBuilder pb(mesh.names, mesh.sizes);
  FunctionBuilder &f = pb.function("f");
  Shape wLocal{4, 8}, vLocal{8};
  for (size_t d = 0; d < wDims.size(); ++d)
    wLocal[d] /= mesh.axesSize(wDims[d]);
  for (size_t d = 0; d < vDims.size(); ++d)
    vLocal[d] /= mesh.axesSize(vDims[d]);
  uint32_t w = f.buffer(DType::F32, wLocal), v = f.buffer(DType::F32, vLocal);
  f.arg(w, Tensor().named("layer.w").as(Role::Parameter).split(wDims))
      .arg(v, Tensor().named("layer.v").as(Role::Parameter).split(vDims))
      .ret(w);
  return pb.parse();
}

} // namespace

TEST(SessionState, DefaultParametersAreDeterministicAndMeshIndependent) {
  Session one(parameterProgram({{"world"}, {1}}, {}, {}), quick());
  Session four(parameterProgram(kMesh22, {{"x"}, {"y"}}, {{"y"}}), quick());
  Session fourOther(parameterProgram(kMesh22, {{}, {"y", "x"}}, {{"x", "y"}}), quick());
  for (Session *s : {&one, &four, &fourOther})
    s->initState("f", nullptr, 7);
  HostTensor w = one.state("f", "layer.w");
  ASSERT_EQ(w.shape, (Shape{4, 8}));
  EXPECT_TRUE(sameTensor(four.state("f", "layer.w"), w));
  EXPECT_TRUE(sameTensor(fourOther.state("f", "layer.w"), w));
  EXPECT_TRUE(sameTensor(four.state("f", "layer.v"), one.state("f", "layer.v")));
  // Uniform in +-1/sqrt(fan-in = 4), not constant; vectors are ones.
  float lo = 1, hi = -1;
  for (int64_t i = 0; i < 32; ++i) {
    lo = std::min(lo, w.as<float>()[i]);
    hi = std::max(hi, w.as<float>()[i]);
  }
  EXPECT_GE(lo, -0.5f);
  EXPECT_LE(hi, 0.5f);
  EXPECT_LT(lo, hi);
  EXPECT_TRUE(sameTensor(one.state("f", "layer.v"), f32({8}, [](int64_t) { return 1.0f; })));
  // The same values again from a fresh session; others from another seed.
  Session again(parameterProgram({{"world"}, {1}}, {}, {}), quick());
  again.initState("f", nullptr, 7);
  EXPECT_TRUE(sameTensor(again.state("f", "layer.w"), w));
  Session seeded(parameterProgram({{"world"}, {1}}, {}, {}), quick());
  seeded.initState("f", nullptr, 8);
  EXPECT_NE(seeded.state("f", "layer.w").bytes, w.bytes);
  // initState keeps values already there.
  four.setState("f", "layer.v", f32({8}, [](int64_t i) { return float(i); }));
  four.initState("f", nullptr, 9);
  EXPECT_EQ(four.state("f", "layer.v").as<float>()[5], 5.0f);
  EXPECT_EQ(four.state("f", "layer.v").as<float>()[7], 7.0f);
  EXPECT_TRUE(sameTensor(four.state("f", "layer.w"), w));
}

TEST(SessionState, MasterWeightsStartAsTheirParameterAndSlotsAtZero) {
  ProgramBuilder pb({"x"}, {2});
  FunctionBuilder &f = pb.function("f");
  uint32_t w = f.buffer(DType::BF16, {2, 4}), master = f.buffer(DType::F32, {2, 4}),
           m = f.buffer(DType::F32, {2, 4});
  f.arg(w, Tensor().named("w").as(Role::Parameter).split({{"x"}, {}}))
      .arg(master, Tensor().named("w:master").as(Role::OptimizerState).split({{"x"}, {}}))
      .arg(m, Tensor().named("w:m").as(Role::OptimizerState).split({{"x"}, {}}))
      .ret(w);
  Program program = pb.parse();
  {
    Session session(program, quick());
    session.initState("f", nullptr, 3);
    HostTensor param = session.state("f", "w");
    EXPECT_EQ(param.type, DType::BF16);
    EXPECT_TRUE(sameTensor(session.state("f", "w:master"), convert(param, DType::F32)));
    EXPECT_TRUE(sameTensor(session.state("f", "w:m"), HostTensor(DType::F32, {4, 4})));
  }
  {
    // From a source: the master follows the parameter's source value.
    HostTensor given = f32({4, 4}, [](int64_t i) { return float(i) * 0.5f - 2; });
    Session session(program, quick());
    session.initState("f", [&](const TensorSpec &spec) -> std::optional<HostTensor> {
      if (spec.name == "w")
        return given;
      return std::nullopt;
    });
    EXPECT_TRUE(sameTensor(session.state("f", "w"), convert(given, DType::BF16)));
    EXPECT_TRUE(sameTensor(session.state("f", "w:master"), given));
    EXPECT_TRUE(sameTensor(session.state("f", "w:m"), HostTensor(DType::F32, {4, 4})));
  }
}

TEST(SessionState, ResultsMarkedUpdatesReplaceTheStateForTheNextCall) {
  // SGD with momentum: w, its momentum slot, a gradient input, the lr; the
  // step number comes back as a result.
  ProgramBuilder pb({"x"}, {2});
  FunctionBuilder &f = pb.function("train_step");
  Tensor rows = Tensor().split({{"x"}, {}});
  uint32_t w = f.buffer(DType::F32, {2, 3}), mom = f.buffer(DType::F32, {2, 3}),
           g = f.buffer(DType::F32, {2, 3}), lr = f.buffer(DType::F32, {}),
           step = f.buffer(DType::I64, {}), w2 = f.buffer(DType::F32, {2, 3}),
           mom2 = f.buffer(DType::F32, {2, 3});
  f.arg(w, Tensor(rows).named("w").as(Role::Parameter))
      .arg(mom, Tensor(rows).named("w:momentum").as(Role::OptimizerState))
      .arg(g, Tensor(rows).named("grad"))
      .arg(lr, Tensor().as(Role::LearningRate))
      .arg(step, Tensor().as(Role::Step))
      .op("ernie.sgd_update", {w, g, mom, lr}, {w2, mom2}, {{"momentum", 0.5}})
      .ret(w2, Tensor(rows).updating("w"))
      .ret(mom2, Tensor(rows).updating("w:momentum"))
      .ret(step);
  Program program = pb.parse();
  // Results::ExceptUpdates (a training loop's call) leaves the updates out
  // of the results and moves them into the state: the same state.
  for (Results wanted : {Results::All, Results::ExceptUpdates}) {
    SCOPED_TRACE(wanted == Results::All ? "all results" : "except updates");
    Session session(program, quick());
    HostTensor w0 = f32({4, 3}, [](int64_t i) { return float(i) - 4; });
    session.initState("train_step",
                      [&](const TensorSpec &spec) -> std::optional<HostTensor> {
                        if (spec.name == "w")
                          return w0;
                        return std::nullopt;
                      });
    HostTensor grad = f32({4, 3}, [](int64_t i) { return float(i % 3) + 0.5f; });
    std::vector<double> wRef(12), mRef(12, 0.0);
    for (int64_t i = 0; i < 12; ++i)
      wRef[i] = w0.as<float>()[i];
    for (int64_t s = 1; s <= 3; ++s) {
      double rate = 0.25 / double(s);
      std::vector<HostTensor> out =
          session.call("train_step", {grad}, rate, s, wanted);
      ASSERT_EQ(out.size(), 3u);
      EXPECT_EQ(out[2].as<int64_t>()[0], s);
      // As the kernel computes: in f64, each result rounded once.
      for (int64_t i = 0; i < 12; ++i) {
        double b = 0.5 * mRef[i] + double(grad.as<float>()[i]);
        mRef[i] = float(b);
        wRef[i] = float(wRef[i] - double(float(rate)) * b);
      }
      HostTensor wNow = session.state("train_step", "w"),
                 mNow = session.state("train_step", "w:momentum");
      for (int64_t i = 0; i < 12; ++i) {
        EXPECT_EQ(wNow.as<float>()[i], float(wRef[i])) << "step " << s << " w " << i;
        EXPECT_EQ(mNow.as<float>()[i], float(mRef[i])) << "step " << s << " m " << i;
      }
      if (wanted == Results::All) {
        EXPECT_TRUE(sameTensor(out[0], wNow));
      } else {
        EXPECT_TRUE(out[0].bytes.empty() && out[0].shape.empty());
        EXPECT_TRUE(out[1].bytes.empty() && out[1].shape.empty());
      }
    }
    EXPECT_THROW(session.state("train_step", "grad"), std::invalid_argument);
    EXPECT_THROW(session.setState("train_step", "nope", w0), std::invalid_argument);
  }
}

TEST(SessionState, ASessionRunsOneStage) {
  // Results are assembled as if every rank ran the same function: a
  // pipelined program (ranks running different functions) is refused.
  ProgramBuilder pb({"pp"}, {2});
  pb.stageAxis("pp");
  for (size_t stage = 0; stage < 2; ++stage) {
    FunctionBuilder &f = pb.function("f", stage);
    uint32_t a = f.buffer(DType::F32, {2});
    f.arg(a).ret(a);
    if (stage == 0)
      f.ret(a);
  }
  try {
    Session session(pb.parse("pipe.ernie"), quick());
    FAIL() << "expected an error";
  } catch (const std::invalid_argument &e) {
    EXPECT_THAT(e.what(), HasSubstr("pipe.ernie: a Session runs one stage; "
                                    "this program has 2"));
  }
}

TEST(SessionState, CallingBeforeInitStateIsAnError) {
  Session session(parameterProgram(kMesh2, {{"x"}, {}}, {}), quick());
  try {
    session.call("f", {});
    FAIL() << "expected an error";
  } catch (const std::invalid_argument &e) {
    EXPECT_THAT(e.what(), HasSubstr("state 'layer.w' has no value yet"));
  }
}
