#include "tensor/threads.h"

#include <cblas.h>
#include <omp.h>
#include <unistd.h>

#include <cctype>
#include <cstdlib>
#include <string>
#include <thread>
#include <vector>

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

namespace {

// OpenMP's idle workers spin before they sleep: libgomp's default is 300000 turns of its wait
// loop after each parallel region when OMP_WAIT_POLICY is unset. On an idle machine that
// saves a wake-up; on a shared one the spinning workers take the cores from the threads that
// have work. Measured with one busy-looping process beside a 2-thread step (docs/
// PERFORMANCE.md, "A shared machine"): config S 1496 ms at the default, 532 at 300 turns
// (262 and 272 alone, within the noise); M 7856 and 3162 (1680 and 1818 alone).
constexpr const char* kSpinCount = "300";

// The OpenBLAS kernel for a CPU that Debian's OpenBLAS 0.3.21 takes for a generic one, or
// null when its choice stands.
const char* better_blas_core() {
  std::string core = blas_core();
  for (char& ch : core) ch = static_cast<char>(std::tolower(static_cast<unsigned char>(ch)));
  const bool generic = core == "prescott" || core == "core2" || core == "nehalem" || core == "penryn" ||
                       core == "dunnington" || core == "atom" || core == "unknown";
  if (!generic) return nullptr;
#if defined(__x86_64__)
  __builtin_cpu_init();
  return __builtin_cpu_supports("avx512f") ? "SkylakeX"
         : __builtin_cpu_supports("avx2")  ? "Haswell"
                                           : nullptr;
#else
  return nullptr;
#endif
}

}  // namespace

void use_cpu_defaults(char** argv) {
  if (std::getenv("NDT_NO_BLAS_REEXEC")) return;
  // OpenBLAS and libgomp read their variables once, when they load, before main: a value
  // set here reaches them only in a new process image of the same program.
  std::vector<const char*> set;
  if (!std::getenv("OMP_WAIT_POLICY") && !std::getenv("GOMP_SPINCOUNT")) {
    ::setenv("GOMP_SPINCOUNT", kSpinCount, 1);
    set.push_back("GOMP_SPINCOUNT");
  }
  if (!std::getenv("OPENBLAS_CORETYPE")) {
    if (const char* better = better_blas_core()) {
      ::setenv("OPENBLAS_CORETYPE", better, 1);
      set.push_back("OPENBLAS_CORETYPE");
    }
  }
  if (set.empty()) return;
  ::execv("/proc/self/exe", argv);  // returns only on failure: carry on as loaded
  for (const char* name : set) ::unsetenv(name);
}

}  // namespace ndt
