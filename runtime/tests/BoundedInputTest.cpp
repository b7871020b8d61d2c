//===- BoundedInputTest.cpp - bounded JSON, regular files, checksums ------===//

#include "ernie/runtime/BoundedInput.h"
#include "ernie/runtime/Checksum.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <sys/stat.h>

#include <cstdio>
#include <stdexcept>
#include <string>
#include <unistd.h>
#include <vector>

using namespace ernie::runtime;
using ::testing::HasSubstr;

namespace {

std::string errorOf(const std::function<void()> &f) {
  try {
    f();
  } catch (const std::runtime_error &e) {
    return e.what();
  }
  ADD_FAILURE() << "no error";
  return "";
}

/// The test buffer of xxHash's own sanity check (cli/xsum_sanity_check.c):
/// a 64-bit generator's top bytes.
std::vector<unsigned char> xxhashTestBuffer(size_t n) {
  std::vector<unsigned char> buffer(n);
  uint64_t gen = 2654435761u;
  for (auto &b : buffer) {
    b = static_cast<unsigned char>(gen >> 56);
    gen *= 11400714785074694797ull;
  }
  return buffer;
}

} // namespace

TEST(CheckpointChecksum, IsXxh3Of64BitsWithSeedZero) {
  // xxHash's published XXH3_64bits vectors (seed 0) over its test buffer,
  // one per code path of the hash: a manifest's "xxh3" must mean the same
  // to any other reader of it.
  const std::vector<std::pair<size_t, uint64_t>> vectors = {
      {0, 0x2D06800538D394C2ull},    {1, 0xC44BDFF4074EECDBull},
      {6, 0x27B56A84CD2D7325ull},    {12, 0xA713DAF0DFBB77E7ull},
      {24, 0xA3FE70BF9D3510EBull},   {48, 0x397DA259ECBA1F11ull},
      {80, 0xBCDEFBBB2C47C90Aull},   {195, 0xCD94217EE362EC3Aull},
      {403, 0xCDEB804D65C6DEA4ull},  {512, 0x617E49599013CB6Bull},
      {2048, 0xDD59E2C3A5F038E0ull}, {2240, 0x6E73A90539CF2948ull},
      {2367, 0xCB37AEB9E5D361EDull}};
  std::vector<unsigned char> buffer = xxhashTestBuffer(2367);
  for (auto [n, want] : vectors)
    EXPECT_EQ(xxh3(buffer.data(), n), want) << n << " bytes";
}

TEST(BoundedJson, DepthCountsAndSizeAreRefusedWhileParsing) {
  EXPECT_EQ(parseBoundedJson(R"({"a":[1,{"b":[[]]}]})", "x")["a"][0], 1);
  // 200 000 levels: refused at the limit, no stack overflow.
  std::string deep = std::string(200000, '[') + std::string(200000, ']');
  EXPECT_THAT(
      errorOf([&] { parseBoundedJson(deep, "deep.json"); }),
      HasSubstr("deep.json: refused JSON: nested deeper than 64 levels"));
  JsonLimits limits;
  limits.maxDepth = 2;
  EXPECT_NO_THROW(parseBoundedJson("[[1]]", "x", limits));
  EXPECT_THAT(errorOf([&] { parseBoundedJson("[[[1]]]", "x", limits); }),
              HasSubstr("nested deeper than 2"));
  limits.maxItems = 3;
  EXPECT_NO_THROW(
      parseBoundedJson(R"({"a":1,"b":2,"c":[1,2,3]})", "x", limits));
  EXPECT_THAT(errorOf([&] { parseBoundedJson("[1,2,3,4]", "x", limits); }),
              HasSubstr("more than 3 items"));
  EXPECT_THAT(errorOf([&] {
                parseBoundedJson(R"({"a":1,"b":2,"c":3,"d":4})", "x", limits);
              }),
              HasSubstr("more than 3 items"));
  limits.maxBytes = 4;
  EXPECT_THAT(errorOf([&] { parseBoundedJson("[1, 2]", "x", limits); }),
              HasSubstr("over the limit of 4"));
  EXPECT_THAT(errorOf([&] { parseBoundedJson("[1,", "bad.json"); }),
              HasSubstr("bad.json: not valid JSON"));
  EXPECT_EQ(briefJson(nlohmann::json::array({1, 2})), "a list of 2 items");
  EXPECT_EQ(briefJson(std::string(200, 'x')).size(), 83u);
}

TEST(RegularFile, FifosDevicesAndDirectoriesAreRefusedUpFront) {
  std::string fifo =
      ::testing::TempDir() + "bounded-" + std::to_string(::getpid());
  ASSERT_EQ(::mkfifo(fifo.c_str(), 0600), 0);
  // Would block forever if opened for reading: refused by its kind.
  EXPECT_THAT(errorOf([&] { RegularFile f(fifo); }),
              HasSubstr(fifo + ": is a FIFO, not a regular file"));
  EXPECT_THAT(errorOf([&] { readBoundedJson(fifo); }), HasSubstr("is a FIFO"));
  std::remove(fifo.c_str());
  EXPECT_THAT(errorOf([] { RegularFile f("/dev/zero"); }),
              HasSubstr("is a device"));
  EXPECT_THAT(errorOf([] { RegularFile f("/"); }), HasSubstr("is a directory"));
  EXPECT_THAT(errorOf([] { RegularFile f("/nonexistent/x"); }),
              HasSubstr("cannot open"));
}
