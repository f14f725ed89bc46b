// Device selection: on a machine without a GPU, --device auto runs on the CPU, --device cuda is refused with an
// actionable message, and GPU kernel backends are refused on the CPU naming the valid choices.
#include <gtest/gtest.h>

#include "core/error.h"
#include "launch/launch.h"

using namespace moeserve;

TEST(Launch, AutoPicksCpuWithoutAGpuAndCudaIsRefused) {
  if (cuda_device_available()) GTEST_SKIP() << "a GPU is visible: this checks machines without one";
  EXPECT_EQ(resolve_device("auto"), "cpu");
  EXPECT_EQ(resolve_device("cpu"), "cpu");
  try {
    resolve_device("cuda");
    FAIL() << "--device cuda without a GPU must be refused";
  } catch (const UserError& e) {
    const std::string what = e.what();
    EXPECT_NE(what.find("--device cuda"), std::string::npos) << what;
  }
  EXPECT_THROW(resolve_device("tpu"), UserError);
}

// The UserError message of make_runner on the CPU with `lo`'s backend choices; "" (and a failure) if it ran.
std::string cpu_refusal(LaunchOptions lo, const char* what_for) {
  lo.model_path = "/nonexistent";  // refused before the model is read
  lo.device = "cpu";
  try {
    make_runner(lo);
  } catch (const UserError& e) {
    return e.what();
  }
  ADD_FAILURE() << what_for << " on the CPU must be refused";
  return "";
}

TEST(Launch, GpuBackendOnTheCpuIsRefused) {
  if (cuda_device_available()) GTEST_SKIP() << "a GPU is visible: this checks machines without one";
  LaunchOptions lo;
  lo.moe_backend = "fused_sm90";
  const std::string what = cpu_refusal(lo, "a GPU MoE backend");
  EXPECT_NE(what.find("--moe-runner-backend fused_sm90"), std::string::npos) << what;
  EXPECT_NE(what.find("auto, cpu"), std::string::npos) << what;
}

TEST(Launch, GpuGemmBackendOnTheCpuIsRefused) {
  if (cuda_device_available()) GTEST_SKIP() << "a GPU is visible: this checks machines without one";
  LaunchOptions lo;
  lo.gemm_backend = "gemv";
  const std::string what = cpu_refusal(lo, "a GPU GEMM backend");
  EXPECT_NE(what.find("--gemm-backend gemv"), std::string::npos) << what;
  EXPECT_NE(what.find("Valid here: auto"), std::string::npos) << what;
}

TEST(Launch, BackendReportWithoutAGpuSaysSo) {
  if (cuda_device_available()) GTEST_SKIP() << "a GPU is visible";
  const std::string r = backends_report("");
  EXPECT_NE(r.find("CPU"), std::string::npos) << r;
}
