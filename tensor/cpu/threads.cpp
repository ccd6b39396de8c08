#include "tensor/threads.h"

#include <cblas.h>
#include <omp.h>
#include <unistd.h>

#include <cctype>
#include <cstdlib>
#include <thread>

namespace ndt {

void set_num_threads(int n) {
  if (n <= 0) n = static_cast<int>(std::thread::hardware_concurrency());
  if (n <= 0) n = 1;
  omp_set_num_threads(n);
  openblas_set_num_threads(n);
}

int num_threads() { return omp_get_max_threads(); }

std::string blas_core() {
  const char* c = openblas_get_corename();
  return c ? c : "unknown";
}

void use_optimized_blas(char** argv) {
  if (std::getenv("OPENBLAS_CORETYPE") || std::getenv("NDT_NO_BLAS_REEXEC")) return;
  std::string core = blas_core();
  for (char& ch : core) ch = static_cast<char>(std::tolower(static_cast<unsigned char>(ch)));
  const bool generic = core == "prescott" || core == "core2" || core == "nehalem" || core == "penryn" ||
                       core == "dunnington" || core == "atom" || core == "unknown";
  if (!generic) return;
#if defined(__x86_64__)
  __builtin_cpu_init();
  const char* better = __builtin_cpu_supports("avx512f") ? "SkylakeX"
                       : __builtin_cpu_supports("avx2")  ? "Haswell"
                                                         : nullptr;
  if (!better) return;
  ::setenv("OPENBLAS_CORETYPE", better, 1);
  ::execv("/proc/self/exe", argv);  // returns only on failure: carry on with the generic kernels
  ::unsetenv("OPENBLAS_CORETYPE");
#else
  (void)argv;
#endif
}

}  // namespace ndt
