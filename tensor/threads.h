// ndtrain: the CPU threads and the BLAS behind the CPU kernels.
//
//   int main(int argc, char** argv) {
//     ndt::use_optimized_blas(argv);   // first thing in a program's main (may re-exec)
//     ndt::set_num_threads(2);         // 0: every core
//   }
#pragma once

#include <string>

namespace ndt {

void set_num_threads(int n);
int num_threads();

// The OpenBLAS kernel in use ("SkylakeX", "Haswell", "Prescott", ...).
std::string blas_core();

// Debian 12's OpenBLAS (0.3.21) does not recognize recent Intel CPUs (Sapphire and
// Emerald Rapids) and falls back to its generic SSE3 kernels, 3-5x slower. OpenBLAS reads
// OPENBLAS_CORETYPE only when it loads, so when that variable is unset, the kernel is
// generic and the CPU has AVX-512 (or AVX2), this sets it to SkylakeX (or Haswell) and
// re-executes the program with the same arguments. Otherwise it returns at once.
void use_optimized_blas(char** argv);

}  // namespace ndt
