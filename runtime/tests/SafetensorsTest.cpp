//===- SafetensorsTest.cpp - safetensors files, written and read back ------===//
//
// The byte layout against the format's definition (written out by hand here:
// 8-byte little-endian header length, JSON, raw data), a round trip of
// every dtype, positioned reads, and every kind of damaged file rejected
// with a message naming the file and the tensor. The Python tests read and
// write the same files with the `safetensors` package.
//
//===----------------------------------------------------------------------===//

#include "ernie/runtime/Safetensors.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <sys/stat.h>

#include <cstring>
#include <filesystem>
#include <fstream>

using namespace ernie::runtime;
using ::testing::HasSubstr;

namespace {

std::string tempPath(const std::string &name) {
  return (std::filesystem::temp_directory_path() /
          ("ernie-safetensors-" + std::to_string(::getpid()) + "-" + name))
      .string();
}

std::string readFile(const std::string &path) {
  std::ifstream in(path, std::ios::binary);
  return std::string(std::istreambuf_iterator<char>(in), {});
}

void writeFile(const std::string &path, const std::string &bytes) {
  std::ofstream(path, std::ios::binary) << bytes;
}

/// A file by the format's definition: header length, JSON, data.
std::string handMade(const std::string &json, const std::string &data) {
  std::string out(8, '\0');
  uint64_t n = json.size();
  for (int i = 0; i < 8; ++i)
    out[i] = static_cast<char>(n >> (8 * i));
  return out + json + data;
}

std::string errorOf(const std::string &path) {
  try {
    SafetensorsFile file(path);
  } catch (const std::runtime_error &e) {
    return e.what();
  }
  return "";
}

TEST(SafetensorsTest, LayoutIsTheFormats) {
  HostTensor a(DType::F32, {2});
  float values[2] = {1.5f, -2.0f};
  std::memcpy(a.bytes.data(), values, sizeof values);
  HostTensor b(DType::I64, {});
  int64_t seven = 7;
  std::memcpy(b.bytes.data(), &seven, 8);
  std::string path = tempPath("layout");
  writeSafetensors(path, {{"a", &a}, {"b", &b}}, {{"format", "pt"}});
  std::string bytes = readFile(path);
  uint64_t n = 0;
  for (int i = 7; i >= 0; --i)
    n = (n << 8) | static_cast<unsigned char>(bytes[i]);
  EXPECT_EQ(n % 8, 0u); // padded so that the data starts aligned
  ASSERT_EQ(bytes.size(), 8 + n + 16);
  std::string json = bytes.substr(8, n);
  EXPECT_THAT(json, HasSubstr("\"__metadata__\":{\"format\":\"pt\"}"));
  EXPECT_THAT(json, HasSubstr("\"a\":{\"dtype\":\"F32\",\"shape\":[2],"
                              "\"data_offsets\":[0,8]}"));
  EXPECT_THAT(json, HasSubstr("\"b\":{\"dtype\":\"I64\",\"shape\":[],"
                              "\"data_offsets\":[8,16]}"));
  EXPECT_EQ(std::memcmp(bytes.data() + 8 + n, values, 8), 0);
  EXPECT_EQ(std::memcmp(bytes.data() + 8 + n + 8, &seven, 8), 0);
  std::remove(path.c_str());
}

TEST(SafetensorsTest, EveryDtypeRoundTripsAndReadsByRange) {
  std::vector<HostTensor> tensors;
  std::vector<std::pair<std::string, const HostTensor *>> named;
  DType types[] = {DType::F64, DType::F32, DType::F16, DType::BF16,
                   DType::F8E4M3FN, DType::F8E5M2, DType::I64, DType::I32,
                   DType::I1};
  for (DType t : types) {
    HostTensor x(t, {3, 5});
    for (size_t i = 0; i < x.bytes.size(); ++i)
      x.bytes[i] = static_cast<uint8_t>(t == DType::I1 ? i % 2 : i * 37 + 11);
    tensors.push_back(std::move(x));
  }
  for (size_t i = 0; i < tensors.size(); ++i)
    named.emplace_back(std::string(safetensorsDtype(types[i])), &tensors[i]);
  std::string path = tempPath("dtypes");
  writeSafetensors(path, named);
  SafetensorsFile file(path);
  ASSERT_EQ(file.tensors().size(), tensors.size());
  for (size_t i = 0; i < tensors.size(); ++i) {
    HostTensor back = file.read(named[i].first);
    EXPECT_EQ(back.type, types[i]);
    EXPECT_EQ(back.shape, (std::vector<int64_t>{3, 5}));
    EXPECT_EQ(back.bytes, tensors[i].bytes) << named[i].first;
  }
  // Row 1 of the f32 tensor alone.
  std::vector<uint8_t> row(5 * 4);
  file.readBytes("F32", 5 * 4, row.size(), row.data());
  EXPECT_TRUE(std::equal(row.begin(), row.end(), tensors[1].bytes.begin() + 20));
  EXPECT_THROW(file.readBytes("F32", 50, 20, row.data()), std::runtime_error);
  EXPECT_THROW(file.read("nothing"), std::runtime_error);
  std::remove(path.c_str());
}

TEST(SafetensorsTest, DamagedFilesAreNamedErrors) {
  std::string path = tempPath("damaged");
  struct Case {
    std::string bytes, message;
  };
  std::string good = R"({"w":{"dtype":"F32","shape":[2],"data_offsets":[0,8]}})";
  std::string sixtyFourOnes; // with the one before: 65 dimensions
  for (int i = 0; i < 64; ++i)
    sixtyFourOnes += ",1";
  std::vector<Case> cases = {
      {"abc", "too short"},
      {std::string("\xff\xff\xff\xff\xff\xff\xff\x7f", 8) + "{}",
       "does not fit the file"},
      {handMade("{not json", ""), "the header: not valid JSON"},
      {handMade("[1]", ""), "the header is not a JSON object"},
      // Nesting deeper than the format's three levels is refused while
      // parsing (copying or printing a deep value would overflow the stack).
      {handMade(R"({"w":{"dtype":)" + std::string(100000, '[') +
                    std::string(100000, ']') + "}}",
                ""),
       "nested deeper than 3 levels"},
      {handMade(R"({"w":{"dtype":"F32","shape":[1)" + sixtyFourOnes +
                    R"(],"data_offsets":[0,4]}})",
                std::string(4, '\0')),
       "not a list of at most 64 sizes"},
      {handMade(good, std::string(4, '\0')), "outside the 4 data bytes"},
      {handMade(good, std::string(12, '\0')), "4 bytes after the last"},
      {handMade(R"({"w":{"dtype":"Q7","shape":[2],"data_offsets":[0,8]}})",
                std::string(8, '\0')),
       "tensor 'w' has dtype \"Q7\""},
      {handMade(R"({"w":{"dtype":"F32","shape":[3],"data_offsets":[0,8]}})",
                std::string(8, '\0')),
       "tensor 'w' holds 8 bytes, not the 12"},
      {handMade(R"({"w":{"dtype":"F32","shape":[-2],"data_offsets":[0,8]}})",
                std::string(8, '\0')),
       "not a size"},
      {handMade(R"({"w":{"dtype":"F32","shape":[1],"data_offsets":[4,8]},)"
                R"("v":{"dtype":"F32","shape":[1],"data_offsets":[4,8]}})",
                std::string(8, '\0')),
       "starts at 4, not at 0"},
      {handMade(R"({"w":{"dtype":"F32","shape":[2]}})", std::string(8, '\0')),
       "tensor 'w' needs dtype, shape and data_offsets"},
      {handMade(R"({"__metadata__":{"a":1}})", ""), "is not a string"},
  };
  for (const Case &c : cases) {
    writeFile(path, c.bytes);
    std::string error = errorOf(path);
    EXPECT_THAT(error, HasSubstr(path)) << c.message;
    EXPECT_THAT(error, HasSubstr(c.message));
  }
  EXPECT_THAT(errorOf(path + ".missing"), HasSubstr("cannot open"));
  // A FIFO would block the open: refused before it.
  std::string fifo = path + ".fifo";
  std::remove(fifo.c_str());
  ASSERT_EQ(::mkfifo(fifo.c_str(), 0600), 0);
  EXPECT_THAT(errorOf(fifo), HasSubstr(fifo + ": is a FIFO, not a regular file"));
  std::remove(fifo.c_str());
  std::remove(path.c_str());
}

} // namespace
