// ndtrain: the CPU threads and the BLAS behind the CPU kernels.
//
//   int main(int argc, char** argv) {
//     ndt::use_cpu_defaults(argv);     // first thing in a program's main (may re-exec)
//     ndt::set_num_threads(2);         // 0: every core
//   }
#pragma once

#include <string>

namespace ndt {

void set_num_threads(int n);
int num_threads();

// The OpenBLAS kernel in use ("SkylakeX", "Haswell", "Prescott", ...).
std::string blas_core();

// Two settings that OpenBLAS and OpenMP read only when they load, so this sets them and
// re-executes the program with the same arguments (once; otherwise it returns at once):
// - GOMP_SPINCOUNT=300 when neither it nor OMP_WAIT_POLICY is set: idle OpenMP workers spin
//   a few microseconds, not libgomp's default 300000 turns, before they sleep, so that a
//   run on a shared machine does not crawl (a 2-3x slower step beside one busy process
//   instead of 5-6x) at no measurable cost on an idle one;
// - OPENBLAS_CORETYPE=SkylakeX (or Haswell) when it is unset, the kernel is generic and the
//   CPU has AVX-512 (or AVX2): Debian 12's OpenBLAS (0.3.21) does not recognize recent
//   Intel CPUs (Sapphire and Emerald Rapids) and falls back to its SSE3 kernels, 3-5x slower.
// NDT_NO_BLAS_REEXEC=1 turns both off (the program keeps what it was started with).
void use_cpu_defaults(char** argv);

}  // namespace ndt
