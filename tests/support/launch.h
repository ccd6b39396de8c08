// Launching programs from a test: a shell command with its exit code, output and time;
// the mpirun command line for N ranks; and a layout of train_gpt's ranks as its
// --parallel.* arguments.
//
//   const Layout L{"hsdp2x2", 2, 2};  // 2 replicas x 2 shards, cp 1, tp 1: 4 ranks
//   ShellResult r = run_shell(mpirun(L.np()) + NDT_TRAIN_GPT_BIN + L.args());
//   ASSERT_EQ(r.rc, 0) << r.out;
#pragma once

#include <ostream>
#include <string>

namespace ndt::testing {

// A shell command's exit code (128 + the signal when a signal ended it), output and
// errors together, and its wall time.
struct ShellResult {
  int rc;
  std::string out;
  double seconds;
};
ShellResult run_shell(const std::string& cmd);

// The reference venv's python (scripts/setup.sh --reference): $NDT_REF_VENV/bin/python, by
// default ~/.cache/ndtrain/ref-venv/bin/python. The tests against transformers and tokenizers
// run their scripts with it, and skip naming it when it is not there.
std::string reference_python();

// "<mpirun> --allow-run-as-root --oversubscribe ... -np N ": what the tests launch ranks
// with (the mpirun CMake found).
std::string mpirun(int np);

// How train_gpt's ranks are laid out: the sizes of the mesh's four dimensions
// (dist/mesh.h), and any other arguments the run takes.
struct Layout {
  const char* name;
  int replicate = 1, shard = 1, cp = 1, tp = 1;
  const char* extra = "";
  int pp = 1;  // pipeline stages (outermost)
  int sp = 1;  // Ulysses sequence parallelism (between cp and tp)
  int np() const { return pp * replicate * shard * cp * sp * tp; }
  int dp() const { return replicate * shard; }
  // " --parallel.dp_replicate_size R --parallel.dp_shard_size S --parallel.cp_size C
  // --parallel.tp_size T" (and " --parallel.pp_size P" when P > 1, " --parallel.sp_size U" when
  // U > 1), then extra
  std::string args() const;
};
// Its name, where gtest prints a Layout parameter (ctest's test names then stay the same
// from one build to the next, rather than showing the struct's bytes and pointers).
inline void PrintTo(const Layout& L, std::ostream* os) { *os << L.name; }

}  // namespace ndt::testing
