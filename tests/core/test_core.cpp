// dtype conversions against known bit patterns, the thread pool, the flags parser, environment switches.
#include <gtest/gtest.h>

#include <atomic>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <string>

#include "cli/flags.h"
#include "core/dtype.h"
#include "core/env.h"
#include "core/error.h"
#include "core/json_depth.h"
#include "core/threadpool.h"

using namespace moeserve;

TEST(DType, Bf16RoundsToNearestEven) {
  EXPECT_EQ(f32_to_bf16(1.0f), 0x3f80);
  EXPECT_EQ(bf16_to_f32(0x3f80), 1.0f);
  // 1 + 2^-8 is exactly halfway between two bf16 values: ties to even (down); a bit more rounds up.
  EXPECT_EQ(f32_to_bf16(1.0f + std::ldexp(1.0f, -8)), 0x3f80);
  EXPECT_EQ(f32_to_bf16(1.0f + std::ldexp(1.0f, -8) + std::ldexp(1.0f, -20)), 0x3f81);
  EXPECT_EQ(f32_to_bf16(-2.5f), 0xc020);
  EXPECT_TRUE(std::isnan(bf16_to_f32(f32_to_bf16(std::nanf("")))));
}

TEST(DType, Fp16KnownValues) {
  EXPECT_EQ(f32_to_f16(1.0f), 0x3c00);
  EXPECT_EQ(f32_to_f16(-2.0f), 0xc000);
  EXPECT_EQ(f32_to_f16(65504.0f), 0x7bff);
  EXPECT_EQ(f32_to_f16(1e6f), 0x7c00);
  EXPECT_EQ(f16_to_f32(0x0001), std::ldexp(1.0f, -24));  // smallest subnormal
  EXPECT_EQ(f16_to_f32(0x3555), 0.333251953125f);
  for (uint16_t h = 0; h < 0x7c00; h += 7) EXPECT_EQ(f32_to_f16(f16_to_f32(h)), h);
}

TEST(DType, Fp8E4M3KnownValues) {
  EXPECT_EQ(fp8e4m3_to_f32(0x38), 1.0f);
  EXPECT_EQ(fp8e4m3_to_f32(0x7e), 448.0f);
  EXPECT_EQ(fp8e4m3_to_f32(0x01), std::ldexp(1.0f, -9));
  EXPECT_EQ(fp8e4m3_to_f32(0xb8), -1.0f);
  EXPECT_TRUE(std::isnan(fp8e4m3_to_f32(0x7f)));
  EXPECT_EQ(f32_to_fp8e4m3(1000.0f), 0x7e);
  for (int c = 0; c < 0x7f; ++c) EXPECT_EQ(f32_to_fp8e4m3(fp8e4m3_to_f32(uint8_t(c))), c);
  EXPECT_EQ(dtype_from_safetensors("F8_E4M3"), DType::F8E4M3);
  EXPECT_FALSE(dtype_from_safetensors("F9").has_value());
}

TEST(ThreadPool, CoversEveryIndexOnceAndRepeats) {
  ThreadPool pool(3);
  for (int64_t n : {1, 2, 17, 1000, 12345}) {
    std::vector<std::atomic<int>> hits(n);
    for (int rep = 0; rep < 5; ++rep)
      pool.parallel_for(n, 3, [&](int64_t b, int64_t e) {
        for (int64_t i = b; i < e; ++i) hits[i]++;
      });
    for (int64_t i = 0; i < n; ++i) ASSERT_EQ(hits[i].load(), 5) << "n=" << n << " i=" << i;
  }
}

TEST(Flags, ParsesAndRejectsClearly) {
  std::string s = "x", choice = "a";
  int64_t i = 0;
  double d = 0;
  bool b = false;
  std::vector<int64_t> ids;
  cli::FlagSet f("test", "t");
  f.add_string("name", &s, "");
  f.add_string("mode", &choice, "", {"a", "b"});
  f.add_int("count", &i, "", 0, 10);
  f.add_double("temp", &d, "", 0, 2);
  f.add_bool("flag", &b, "");
  f.add_int_list("input-ids", &ids, "");
  f.alias("n", "name");
  EXPECT_TRUE(f.parse({"--n", "y", "--mode=b", "--count", "3", "--temp", "0.5", "--flag", "--input-ids", "1,2", "3"}));
  EXPECT_EQ(s, "y");
  EXPECT_EQ(choice, "b");
  EXPECT_EQ(i, 3);
  EXPECT_EQ(d, 0.5);
  EXPECT_TRUE(b);
  EXPECT_EQ(ids, (std::vector<int64_t>{1, 2, 3}));
  EXPECT_TRUE(f.was_set("count"));
  auto msg = [&](std::vector<std::string> a) {
    try {
      f.parse(a);
    } catch (const UserError& e) {
      return std::string(e.what());
    }
    return std::string();
  };
  EXPECT_NE(msg({"--mode", "c"}).find("valid: a, b"), std::string::npos);
  EXPECT_NE(msg({"--count", "11"}).find("between 0 and 10"), std::string::npos);
  EXPECT_NE(msg({"--count", "x"}).find("expected an integer"), std::string::npos);
  EXPECT_NE(msg({"--cuont", "1"}).find("did you mean --count"), std::string::npos);
  EXPECT_NE(msg({"--name"}).find("needs a value"), std::string::npos);
  EXPECT_NE(msg({"stray"}).find("unexpected argument"), std::string::npos);
  // A bounded list checks every element.
  std::vector<int64_t> sizes;
  f.add_int_list("sizes", &sizes, "", 1, 64);
  EXPECT_TRUE(f.parse({"--sizes", "1,64", "8"}));
  EXPECT_EQ(sizes, (std::vector<int64_t>{1, 64, 8}));
  EXPECT_NE(msg({"--sizes", "4,0"}).find("--sizes: must be between 1 and 64, got 0"), std::string::npos);
  EXPECT_NE(msg({"--sizes", "65"}).find("between 1 and 64"), std::string::npos);
  EXPECT_NE(msg({"--sizes", "4294967297"}).find("between 1 and 64"), std::string::npos);
  // --help shows each default once: the stored value, unless the help text says its own.
  int64_t ctx = 0;
  f.add_int("context", &ctx, "maximum context (default: the model's)");
  const std::string h = f.help();
  EXPECT_NE(h.find("maximum context (default: the model's)\n"), std::string::npos) << h;
  EXPECT_NE(h.find("(default: 0)"), std::string::npos) << h;  // --count's
}

TEST(Env, SwitchValuesParseOrAreRejected) {
  for (const char* v : {"1", "true", "TRUE", "On", "yes"}) EXPECT_EQ(parse_env_flag(v), std::optional<bool>(true)) << v;
  for (const char* v : {"0", "false", "off", "NO"}) EXPECT_EQ(parse_env_flag(v), std::optional<bool>(false)) << v;
  for (const char* v : {"", "2", "enable", " 1", "1 ", "o"}) EXPECT_EQ(parse_env_flag(v), std::nullopt) << v;
  EXPECT_EQ(parse_env_int("128", 1, 1024), std::optional<long>(128));
  EXPECT_EQ(parse_env_int("-3", -5, 5), std::optional<long>(-3));
  for (const char* v : {"", "x", "12x", " 12", "0x10", "2000", "0", "99999999999999999999"})
    EXPECT_EQ(parse_env_int(v, 1, 1024), std::nullopt) << v;
}

TEST(Env, UnsetEmptyAndBadValuesFallBack) {
  const char* name = "MOESERVE_TEST_ENV_SWITCH";
  ::unsetenv(name);
  EXPECT_TRUE(env_flag(name, true));
  EXPECT_FALSE(env_flag(name, false));
  EXPECT_EQ(env_int(name, 7, 0, 10), 7);
  ::setenv(name, "", 1);
  EXPECT_TRUE(env_flag(name, true));
  EXPECT_EQ(env_int(name, 7, 0, 10), 7);
  ::setenv(name, "off", 1);
  EXPECT_FALSE(env_flag(name, true));
  EXPECT_EQ(env_int(name, 7, 0, 10), 7);  // not an integer: the default, with a warning
  ::setenv(name, "3", 1);
  EXPECT_EQ(env_int(name, 7, 0, 10), 3);
  EXPECT_FALSE(env_flag(name, false));  // "3" is no switch value: the default, either way
  EXPECT_TRUE(env_flag(name, true));
  ::setenv(name, "11", 1);
  EXPECT_EQ(env_int(name, 7, 0, 10), 7);  // out of range
  ::unsetenv(name);
}

// The nesting guard in front of every parse of outside JSON: brackets inside strings (escaped quotes included) do
// not count, the limit itself is accepted, one level more is not.
TEST(JsonDepth, CountsNestingOutsideStrings) {
  const auto nest = [](int n) { return std::string(size_t(n), '[') + std::string(size_t(n), ']'); };
  EXPECT_FALSE(json_nesting_exceeds("{}", 1));
  EXPECT_TRUE(json_nesting_exceeds("{\"a\": []}", 1));
  EXPECT_FALSE(json_nesting_exceeds(nest(kMaxJsonDepth)));
  EXPECT_TRUE(json_nesting_exceeds(nest(kMaxJsonDepth + 1)));
  EXPECT_TRUE(json_nesting_exceeds(nest(1000000)));
  EXPECT_FALSE(json_nesting_exceeds("[\"[[[[\", \"\\\"[[[[\", {\"k\\\\\": \"]]]\"}]", 2));
  EXPECT_TRUE(json_nesting_exceeds("[\"\\\\\", [[]]]", 2));  // a string ending in an escaped backslash
  EXPECT_FALSE(json_nesting_exceeds("]]]]][", 1));             // unbalanced: the parser rejects it, no crash here
}
