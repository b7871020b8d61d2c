//===- DTypeTest.cpp - element types of runtime buffers ---------------------===//

#include "ernie/runtime/DType.h"

#include <gtest/gtest.h>

using namespace ernie::runtime;

TEST(DType, SizesMatchStorage) {
  EXPECT_EQ(byteSize(DType::F64), 8u);
  EXPECT_EQ(byteSize(DType::F32), 4u);
  EXPECT_EQ(byteSize(DType::BF16), 2u);
  EXPECT_EQ(byteSize(DType::F16), 2u);
  EXPECT_EQ(byteSize(DType::F8E4M3FN), 1u);
  EXPECT_EQ(byteSize(DType::F8E5M2), 1u);
  EXPECT_EQ(byteSize(DType::I64), 8u);
  EXPECT_EQ(byteSize(DType::I32), 4u);
  EXPECT_EQ(byteSize(DType::I1), 1u);
}

TEST(DType, NamesRoundTrip) {
  for (DType t : {DType::F64, DType::F32, DType::F16, DType::BF16,
                  DType::F8E4M3FN, DType::F8E5M2, DType::I64, DType::I32,
                  DType::I1}) {
    auto parsed = parseDType(name(t));
    ASSERT_TRUE(parsed.has_value()) << name(t);
    EXPECT_EQ(*parsed, t);
  }
  EXPECT_FALSE(parseDType("f128").has_value());
  EXPECT_FALSE(parseDType("").has_value());
}

TEST(DType, FloatClassification) {
  EXPECT_TRUE(isFloat(DType::BF16));
  EXPECT_TRUE(isFloat(DType::F8E5M2));
  EXPECT_FALSE(isFloat(DType::I64));
  EXPECT_FALSE(isFloat(DType::I1));
}
