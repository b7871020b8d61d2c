//===- BoundedInputTest.cpp - bounded JSON, regular files, CRC-32C ---------===//
//---------===//

#include "ernie/runtime/BoundedInput.h"
#include "ernie/runtime/Checksum.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <sys/stat.h>

#include <cstdio>
#include <random>
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

/// The bitwise definition of CRC-32C.
uint32_t slowCrc32c(const unsigned char *p, size_t n) {
  uint32_t c = ~0u;
  while (n--) {
    c ^= *p++;
    for (int k = 0; k < 8; ++k)
      c = c & 1 ? (c >> 1) ^ 0x82F63B78u : c >> 1;
  }
  return ~c;
}

} // namespace

TEST(Checksum, Crc32cIsTheCastagnoliCrc) {
  EXPECT_EQ(crc32c(0, "123456789", 9), 0xE3069283u); // the check value
  std::mt19937 rng(7);
  std::vector<unsigned char> data(100000);
  for (auto &b : data)
    b = static_cast<unsigned char>(rng());
  // Lengths around the three-stream rounds, and unaligned starts.
  for (size_t n : {0, 1, 7, 8, 12287, 12288, 12289, 40000, 99990})
    for (size_t at : {0, 3})
      EXPECT_EQ(crc32c(0, data.data() + at, n), slowCrc32c(data.data() + at, n))
          << n << " bytes at " << at;
  // Continuing from a CRC is the CRC of the concatenation.
  EXPECT_EQ(crc32c(crc32c(0, data.data(), 1000), data.data() + 1000, 50001),
            crc32c(0, data.data(), 51001));
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
