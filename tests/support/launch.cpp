#include "support/launch.h"

#include <sys/wait.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>

#include "tensor/error.h"

namespace ndt::testing {

std::string reference_python() {
  const char* v = std::getenv("NDT_REF_VENV");
  const std::string dir =
      v ? v : std::string(std::getenv("HOME") ? std::getenv("HOME") : "/root") + "/.cache/ndtrain/ref-venv";
  return dir + "/bin/python";
}

ShellResult run_shell(const std::string& cmd) {
  const auto t0 = std::chrono::steady_clock::now();
  std::FILE* p = ::popen((cmd + " 2>&1").c_str(), "r");
  NDT_CHECK(p != nullptr, "popen failed: ", cmd);
  std::string out;
  char buf[4096];
  size_t n;
  while ((n = std::fread(buf, 1, sizeof(buf), p)) > 0) out.append(buf, n);
  const int st = ::pclose(p);
  const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  return {WIFEXITED(st) ? WEXITSTATUS(st) : 128 + WTERMSIG(st), out, s};
}

std::string mpirun(int np) {
  return std::string(NDT_MPIRUN) +
         " --allow-run-as-root --oversubscribe --bind-to none --mca btl_vader_single_copy_mechanism none "
         "-np " +
         std::to_string(np) + " ";
}

std::string Layout::args() const {
  return " --parallel.dp_replicate_size " + std::to_string(replicate) + " --parallel.dp_shard_size " +
         std::to_string(shard) + " --parallel.cp_size " + std::to_string(cp) + " --parallel.tp_size " +
         std::to_string(tp) + (pp > 1 ? " --parallel.pp_size " + std::to_string(pp) : std::string()) +
         (sp > 1 ? " --parallel.sp_size " + std::to_string(sp) : std::string()) + " " + extra;
}

}  // namespace ndt::testing
