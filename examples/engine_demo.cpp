// ndtrain engine demo: a byte-bigram model trained with plain SGD on the fortunes text,
// then a float64 gradient check of the same model. Runs on CPU in a few seconds.
//
//   engine_demo [--corpus PATH] [--steps 1000] [--batch 512] [--hidden 64] [--lr 2.0] [--seed 1]
//   engine_demo --help
//
// The model predicts the next byte from the previous one:
//   x (N,V) one-hot -> linear(w1 (V,H), b1 (H)) -> gelu -> linear(w2 (H,V), b2 (V)) -> logits (N,V)
//   loss = cross_entropy(logits, next byte)
// Legend: N byte pairs per step, V = 256 byte values, H hidden units.
//
// As in the GPT trainer (nn/flat.h; docs/design.md, decision 1), the parameters live in
// one flat buffer and their gradients in a twin buffer: each parameter is a view into the
// first, its .grad a view into the second, so the SGD step and zeroing the gradients are
// one kernel call each. PATH is a text file or a folder of them (default: the fortunes that
// scripts/setup.sh installs, /usr/share/games/fortunes).
#include <algorithm>
#include <charconv>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <random>
#include <sstream>
#include <string>
#include <vector>

#include "autograd/engine.h"
#include "autograd/gradcheck.h"
#include "autograd/node.h"
#include "autograd/ops.h"
#include "tensor/kernels.h"
#include "tensor/threads.h"

using namespace ndt;
namespace fs = std::filesystem;

namespace {

constexpr int64_t V = 256;

constexpr const char* kUsage =
    "usage: engine_demo [--corpus PATH] [--steps 1000] [--batch 512] [--hidden 64] [--lr 2.0] [--seed 1]\n"
    "  trains a byte-bigram model with SGD on PATH (a text file or a folder of them; default the fortunes\n"
    "  in /usr/share/games/fortunes), then checks its gradients against finite differences in float64\n";

struct Options {
  bool help = false;
  std::string corpus = "/usr/share/games/fortunes";
  int steps = 1000;
  int64_t batch = 512;
  int64_t hidden = 64;
  double lr = 2.0;
  uint64_t seed = 1;
};

// The value of option `a`: all of `s` as a T (std::stoi would take "2x" as 2 and say only
// "stoi" for "x").
template <typename T>
T number(const std::string& a, const std::string& s) {
  T v{};
  const auto [end, ec] = std::from_chars(s.data(), s.data() + s.size(), v);
  NDT_CHECK(ec == std::errc() && end == s.data() + s.size() && !s.empty(), a, " takes a number, got '", s,
            "'");
  return v;
}

Options parse(int argc, char** argv) {
  Options o;
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    auto next = [&]() -> std::string {
      NDT_CHECK(i + 1 < argc, a, " needs a value (see --help)");
      return argv[++i];
    };
    if (a == "--help" || a == "-h")
      o.help = true;
    else if (a == "--corpus")
      o.corpus = next();
    else if (a == "--steps")
      o.steps = number<int>(a, next());
    else if (a == "--batch")
      o.batch = number<int64_t>(a, next());
    else if (a == "--hidden")
      o.hidden = number<int64_t>(a, next());
    else if (a == "--lr")
      o.lr = number<double>(a, next());
    else if (a == "--seed")
      o.seed = number<uint64_t>(a, next());
    else
      NDT_FAIL("unknown option '", a,
               "' (options: --corpus --steps --batch --hidden --lr --seed; see --help)");
  }
  NDT_CHECK(o.steps >= 0 && o.batch > 0 && o.hidden > 0 && o.lr > 0,
            "--steps must be >= 0 and --batch, --hidden, --lr > 0, got ", o.steps, ", ", o.batch, ", ",
            o.hidden, ", ", o.lr);
  return o;
}

// One text file, or every plain file without an extension in a folder (the fortunes
// folder also holds .dat indexes and .u8 links), in name order. Lines holding only "%"
// (the separators between fortunes) are dropped.
std::string load_corpus(const std::string& path) {
  std::vector<fs::path> files;
  if (fs::is_directory(path)) {
    for (const auto& e : fs::directory_iterator(path))
      if (e.is_regular_file() && !e.is_symlink() && !e.path().has_extension()) files.push_back(e.path());
    std::sort(files.begin(), files.end());
  } else if (fs::is_regular_file(path)) {
    files.push_back(path);
  }
  NDT_CHECK(!files.empty(), "no text at ", path,
            ": run scripts/setup.sh (it installs the fortunes packages) or pass --corpus FILE");
  std::string text, line;
  for (const auto& f : files) {
    std::ifstream in(f, std::ios::binary);
    while (std::getline(in, line))
      if (line != "%") text += line + '\n';
  }
  NDT_CHECK(text.size() > 1000, "corpus ", path, " has only ", text.size(), " bytes");
  return text;
}

// The parameters, as views into one flat buffer, and their gradients, views into a twin.
struct Model {
  Tensor data, grad;  // (P) flat buffers
  Tensor w1, b1, w2, b2;

  Model(int64_t H, DType dt) {
    const Shape shapes[4] = {{V, H}, {H}, {H, V}, {V}};
    int64_t total = 0;
    for (const Shape& s : shapes) total += numel_of(s);
    data = Tensor::zeros({total}, dt);
    grad = Tensor::zeros({total}, dt);
    Tensor* slots[4] = {&w1, &b1, &w2, &b2};
    const char* names[4] = {"w1", "b1", "w2", "b2"};
    int64_t off = 0;
    for (int i = 0; i < 4; ++i) {
      *slots[i] = data.view_at(off, shapes[i]).set_requires_grad(true).set_name(names[i]);
      slots[i]->set_grad(grad.view_at(off, shapes[i]));  // backward accumulates here
      off += numel_of(shapes[i]);
    }
  }
  std::vector<Tensor> params() const { return {w1, b1, w2, b2}; }
};

// x (N,V) one-hot, w1 (V,H), b1 (H), w2 (H,V), b2 (V) -> logits (N,V)
Tensor forward(const Tensor& x, const Tensor& w1, const Tensor& b1, const Tensor& w2, const Tensor& b2) {
  return ndt::linear(ndt::gelu(ndt::linear(x, w1, b1)), w2, b2);
}

// Byte pairs starting at `pos` -> x (N,V) one-hot of text[pos], targets (N) = text[pos+1]
std::pair<Tensor, Tensor> make_batch(const std::string& text, const std::vector<int64_t>& pos, DType dt) {
  const int64_t N = static_cast<int64_t>(pos.size());
  std::vector<float> x(N * V, 0.0f);
  std::vector<int32_t> y(N);
  for (int64_t n = 0; n < N; ++n) {
    x[n * V + static_cast<unsigned char>(text[pos[n]])] = 1.0f;
    y[n] = static_cast<unsigned char>(text[pos[n] + 1]);
  }
  return {Tensor::from_vector(x, {N, V}).to(dt), Tensor::from_vector(y, {N})};
}

double seconds_since(std::chrono::steady_clock::time_point t0) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}

}  // namespace

int main(int argc, char** argv) try {
  ndt::use_cpu_defaults(argv);  // may re-execute with OpenMP's and OpenBLAS's settings (tensor/threads.h)
  const Options opt = parse(argc, argv);
  if (opt.help) {
    std::printf("%s", kUsage);
    return 0;
  }
  const std::string text = load_corpus(opt.corpus);
  const int64_t split = static_cast<int64_t>(text.size() * 0.9);  // last 10% held out
  std::printf("cpu: %d threads, OpenBLAS kernel %s\n", ndt::num_threads(), ndt::blas_core().c_str());
  std::printf("corpus: %zu bytes from %s (train %lld, validation %lld)\n", text.size(), opt.corpus.c_str(),
              static_cast<long long>(split), static_cast<long long>(text.size() - split));

  // ---- model: flat buffers, counter-based init ------------------------------------------
  Model m(opt.hidden, DType::f32);
  kernels::fill_normal(m.w1, opt.seed, /*stream=*/0, 0, 0.0f, 1.0f);  // one-hot rows: O(1) pre-activations
  kernels::fill_normal(m.w2, opt.seed, /*stream=*/1, 0, 0.0f,
                       static_cast<float>(1.0 / std::sqrt(opt.hidden)));
  std::printf(
      "model: one-hot(%lld) -> linear -> gelu(%lld) -> linear -> %lld logits, %lld parameters in one flat "
      "buffer\n",
      static_cast<long long>(V), static_cast<long long>(opt.hidden), static_cast<long long>(V),
      static_cast<long long>(m.data.numel()));

  // A fixed validation batch: 8192 evenly spaced pairs of the held-out text.
  std::vector<int64_t> vpos;
  for (int64_t i = 0; i < 8192; ++i)
    vpos.push_back(split + i * (static_cast<int64_t>(text.size()) - split - 1) / 8192);
  const auto [vx, vy] = make_batch(text, vpos, DType::f32);
  auto val_loss = [&] {
    autograd::NoGradGuard no_grad;
    return ndt::cross_entropy(forward(vx, m.w1, m.b1, m.w2, m.b2), vy).item();
  };

  // ---- training: plain SGD ------------------------------------------------------------
  std::mt19937_64 rng(opt.seed);
  std::uniform_int_distribution<int64_t> pick(0, split - 2);
  const double initial = val_loss();
  std::printf("step %4d  val loss %.4f  (uniform guess: ln 256 = %.4f)\n", 0, initial, std::log(256.0));
  const auto t0 = std::chrono::steady_clock::now();
  const int every = std::max(1, opt.steps / 10);  // ten progress lines
  double train_sum = 0;
  int train_count = 0;
  double final_val = initial;
  for (int step = 1; step <= opt.steps; ++step) {
    std::vector<int64_t> pos(opt.batch);
    for (auto& p : pos) p = pick(rng);
    const auto [x, y] = make_batch(text, pos, DType::f32);
    Tensor loss = ndt::cross_entropy(forward(x, m.w1, m.b1, m.w2, m.b2), y);
    ndt::backward(loss);                     // grads accumulate into m.grad
    kernels::add_(m.data, m.grad, -opt.lr);  // SGD: p -= lr * g, the whole buffer at once
    kernels::fill(m.grad, 0.0);              // zero_grad
    train_sum += loss.item();
    train_count++;
    if (step % every == 0 || step == opt.steps) {
      final_val = val_loss();
      std::printf("step %4d  train loss %.4f  val loss %.4f  (%.2f bits/byte)  %.2f s\n", step,
                  train_sum / train_count, final_val, final_val / std::log(2.0), seconds_since(t0));
      train_sum = 0;
      train_count = 0;
    }
  }

  // ---- a sample: 240 bytes, each drawn from the model's next-byte distribution ----------
  {
    autograd::NoGradGuard no_grad;
    std::string sample;
    int prev = '\n';
    std::uniform_real_distribution<double> u(0.0, 1.0);
    for (int i = 0; i < 240; ++i) {
      std::vector<float> x(V, 0.0f);
      x[prev] = 1.0f;
      const Tensor logits = forward(Tensor::from_vector(x, {1, V}), m.w1, m.b1, m.w2, m.b2);
      const std::vector<float> p = ndt::softmax(logits).to_vector<float>();
      double r = u(rng), c = 0;
      int next = V - 1;
      for (int v = 0; v < V; ++v)
        if ((c += p[v]) >= r) {
          next = v;
          break;
        }
      sample += (next == '\n' || (next >= 32 && next < 127)) ? static_cast<char>(next) : '?';
      prev = next;
    }
    std::printf("sample (a bigram model, so only locally plausible):\n----\n%s\n----\n", sample.c_str());
  }

  // ---- float64 gradient check of the trained model on a small batch ---------------------
  Model m64(opt.hidden, DType::f64);
  m64.data.copy_(m.data);  // f32 -> f64
  std::vector<int64_t> gpos = {0, 100, 2000, 30000};
  const auto [gx32, gy] = make_batch(text, gpos, DType::f32);
  const Tensor gx = gx32.to(DType::f64);
  const Tensor targets = gy;
  auto f = [&targets](const std::vector<Tensor>& in) {  // in = {x, w1, b1, w2, b2}
    return std::vector<Tensor>{ndt::cross_entropy(forward(in[0], in[1], in[2], in[3], in[4]), targets)};
  };
  const auto tg = std::chrono::steady_clock::now();
  const autograd::GradcheckResult r = autograd::gradcheck(f, {gx, m64.w1, m64.b1, m64.w2, m64.b2});
  std::printf(
      "gradcheck (float64, finite differences vs autograd): %s, %lld elements, max abs err %.2e, %.1f s\n",
      r.ok ? "passed" : ("FAILED: " + r.message).c_str(), static_cast<long long>(r.checked), r.max_abs_err,
      seconds_since(tg));

  const MemoryStats ms = memory_stats(Device::cpu());
  std::printf("peak CPU tensor memory %.1f MiB\n", ms.peak / 1048576.0);
  const bool learned = opt.steps == 0 || final_val < initial - 1.0;
  if (!learned) std::printf("FAILED: validation loss went from %.4f to only %.4f\n", initial, final_val);
  return r.ok && learned ? 0 : 1;
} catch (const std::exception& e) {
  std::fprintf(stderr, "engine_demo: error: %s\n", e.what());
  return 2;
}
