// main() of the ordinary test programs (tests/test_*.cpp; the test_mpi_* programs have
// tests/dist/dist_main.cpp). Like train_gpt's main, it first sets the CPU defaults
// (ndt::use_cpu_defaults, which may re-execute the program), so that a test computing in
// this process and the train_gpt it launches run the same GEMM kernels: their losses can
// then be compared bit for bit, whatever OPENBLAS_CORETYPE the environment sets or not.
#include <gtest/gtest.h>

#include "tensor/threads.h"

int main(int argc, char** argv) {
  ndt::use_cpu_defaults(argv);
  ::testing::InitGoogleTest(&argc, argv);
  return RUN_ALL_TESTS();
}
