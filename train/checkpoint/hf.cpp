// The GPT family to and from Hugging Face model folders (see hf.h). Legend: C n_embd, NH
// heads, NKV key/value heads, G = NH/NKV, HS head size, I intermediate size, V vocab, Vp padded.
#include "train/checkpoint/hf.h"

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <functional>
#include <map>
#include <set>
#include <sstream>

#include "models/family.h"
#include "tensor/kernels.h"
#include "train/checkpoint/checkpoint.h"
#include "train/families/family_tools.h"

namespace fs = std::filesystem;

namespace ndt::ckpt {

bool is_hf_folder(const std::string& path) {
  std::error_code ec;
  return fs::is_directory(path, ec) && fs::is_regular_file(fs::path(path) / "config.json", ec);
}

models::GPTConfig model_config(const io::HfConfig& hf) {
  const train::FamilyTools& tools = train::tools_for_model_type(hf.model_type);
  models::GPTConfig c;
  c.arch = tools.arch;
  c.n_layer = hf.num_hidden_layers;
  c.n_head = hf.num_attention_heads;
  c.n_embd = hf.hidden_size;
  c.vocab_size = hf.vocab_size;
  c.block_size = hf.max_position_embeddings;
  c.norm_eps = hf.norm_eps;
  tools.from_hf(hf, c);
  return c;
}

io::HfConfig hf_config(const models::GPTConfig& c, DType dtype) {
  io::HfConfig hf;
  hf.vocab_size = c.vocab_size;
  hf.hidden_size = c.n_embd;
  hf.num_hidden_layers = c.n_layer;
  hf.num_attention_heads = c.n_head;
  hf.num_key_value_heads = c.kv_heads();
  hf.head_dim = c.head_dim();
  hf.max_position_embeddings = c.block_size;
  hf.norm_eps = c.norm_eps;
  hf.intermediate_size = c.mlp_hidden();
  hf.torch_dtype = dtype == DType::bf16 ? "bfloat16" : dtype == DType::f64 ? "float64" : "float32";
  train::family_tools(c.arch).to_hf(c, hf);
  return hf;
}

namespace {

using Source = train::HfSource;

// The folder's shapes of a source, given our whole shape `ours`: renamed ones are ours (wte
// and lm_head without their padded rows), transposed ones swapped, packed ones q (NH HS, ..),
// k and v (NKV HS, ..) with C after them for weights.
std::vector<Shape> hf_shapes(const models::GPTConfig& c, const std::string& name, const Source& s,
                             Shape ours) {
  if (name == "wte.weight" || name == "lm_head.weight") ours[0] = c.vocab_size;
  if (s.kind == Source::renamed) return {ours};
  if (s.kind == Source::transposed) return {{ours[1], ours[0]}};
  if (s.kind == Source::experts)
    return std::vector<Shape>(static_cast<size_t>(ours[0]), Shape{ours[2], ours[1]});
  const int64_t HS = c.head_dim(), q = c.n_head * HS, kv = c.kv_heads() * HS;
  if (ours.size() == 1) return {{q}, {kv}, {kv}};
  return {{q, c.n_embd}, {kv, c.n_embd}, {kv, c.n_embd}};
}

// For every column block of c_attn (our packed layout, see nn::GroupedQueryAttention):
// fn(our first column, which source (0 q, 1 k, 2 v), its first row there), HS columns each.
void for_each_qkv_block(const models::GPTConfig& c, const std::function<void(int64_t, int, int64_t)>& fn) {
  const int64_t NKV = c.kv_heads(), G = c.n_head / NKV, HS = c.head_dim();
  for (int64_t g = 0; g < NKV; ++g)
    for (int64_t s = 0; s < G + 2; ++s) {
      const int64_t col = (g * (G + 2) + s) * HS;
      if (s < G)
        fn(col, 0, (g * G + s) * HS);  // query head g G + s
      else
        fn(col, static_cast<int>(s - G + 1), g * HS);  // k_g, v_g
    }
}

// Our whole parameter (CPU, `dtype`) from transposed or packed sources, read whole.
// ours (in, out_features) = theirs (out_features, in)^T, or back (to_theirs)
template <typename T>
void transpose_into(T* ours, T* theirs, int64_t rows, int64_t cols, bool to_theirs) {
  for (int64_t r = 0; r < rows; ++r)
    for (int64_t k = 0; k < cols; ++k) {
      if (to_theirs)
        theirs[r * cols + k] = ours[k * rows + r];
      else
        ours[k * rows + r] = theirs[r * cols + k];
    }
}

// transposed: our one matrix; experts: expert e's (E, in, out)[e] <-> its (out, in) tensor
template <typename T>
void transpose_all(const Tensor& ours, const std::vector<Tensor>& theirs, bool to_theirs) {
  const int64_t rows = theirs[0].size(0), cols = theirs[0].size(1);
  for (size_t e = 0; e < theirs.size(); ++e)
    transpose_into(ours.data<T>() + static_cast<int64_t>(e) * rows * cols, theirs[e].data<T>(), rows, cols,
                   to_theirs);
}

template <typename T>
void assemble(const models::GPTConfig& c, const Source& s, const std::vector<Tensor>& src,
              const Tensor& out) {
  T* o = out.data<T>();
  if (s.kind == Source::transposed || s.kind == Source::experts) return transpose_all<T>(out, src, false);
  const int64_t HS = c.head_dim();
  if (out.dim() == 1) {  // biases: out (NKV (G+2) HS) from q (NH HS), k, v (NKV HS)
    for_each_qkv_block(c, [&](int64_t col, int which, int64_t row) {
      for (int64_t d = 0; d < HS; ++d) o[col + d] = src[which].data<T>()[row + d];
    });
    return;
  }
  // out (C, NKV (G+2) HS): column col + d is row `row + d` of its source (.., C)
  const int64_t C = out.size(0), W = out.size(1);
  for_each_qkv_block(c, [&](int64_t col, int which, int64_t row) {
    const T* a = src[which].data<T>();
    for (int64_t d = 0; d < HS; ++d)
      for (int64_t i = 0; i < C; ++i) o[i * W + col + d] = a[(row + d) * C + i];
  });
}

// The inverse, for export: our whole parameter -> its folder tensors (same shapes as hf_shapes)
template <typename T>
void disassemble(const models::GPTConfig& c, const Source& s, const Tensor& ours,
                 const std::vector<Tensor>& dst) {
  const T* o = ours.data<T>();
  if (s.kind == Source::transposed || s.kind == Source::experts) return transpose_all<T>(ours, dst, true);
  const int64_t HS = c.head_dim();
  if (ours.dim() == 1) {
    for_each_qkv_block(c, [&](int64_t col, int which, int64_t row) {
      for (int64_t d = 0; d < HS; ++d) dst[which].data<T>()[row + d] = o[col + d];
    });
    return;
  }
  const int64_t C = ours.size(0), W = ours.size(1);
  for_each_qkv_block(c, [&](int64_t col, int which, int64_t row) {
    T* a = dst[which].data<T>();
    for (int64_t d = 0; d < HS; ++d)
      for (int64_t i = 0; i < C; ++i) a[(row + d) * C + i] = o[i * W + col + d];
  });
}

void check_finite(const Tensor& t, const std::string& dir, const std::string& name) {
  if (const char* kind = non_finite_kind(t))
    NDT_FAIL("model folder ", dir, ": tensor ", name, " holds ", kind,
             " values; the folder is damaged or was saved from a diverged run");
}

std::string join(const std::vector<std::string>& v) {
  std::string s;
  for (size_t i = 0; i < v.size() && i < 6; ++i) s += (i ? ", " : "") + v[i];
  if (v.size() > 6) s += ", ... (" + std::to_string(v.size()) + " in all)";
  return s;
}

// The sources of c's parameters under the folder's names: with or without the family's
// optional prefix ("transformer." on GPT-2's: both are seen on the Hub)
std::map<std::string, Source> folder_sources(const io::HfFolder& f, const models::GPTConfig& c) {
  const train::FamilyTools& tools = train::family_tools(c.arch);
  std::map<std::string, Source> src = tools.sources(c);
  const std::string prefix = tools.optional_prefix;
  if (prefix.empty()) return src;
  for (auto& [ours, s] : src)
    for (std::string& prefixed : s.names) {
      if (!prefixed.starts_with(prefix)) continue;
      const std::string bare = prefixed.substr(prefix.size());
      NDT_CHECK(!(f.has(prefixed) && f.has(bare)), "model folder ", f.dir(), ": holds both ", bare, " and ",
                prefixed, ", which name the same parameter; keep one of them");
      if (f.has(bare)) prefixed = bare;
    }
  return src;
}

// An experts parameter p (E, in, out) from its E folder tensors (out, in), this rank's runs
// of it only: an expert is read (whole, then transposed) when one of the runs touches its
// elements [e in out, (e + 1) in out), so an expert-parallel rank reads its own experts only.
void load_experts(const io::HfFolder& f, const Source& s, const nn::FlatUnit& u, const nn::FlatParam& p) {
  const Shape g = p.spec.global_shape();  // (E, in, out)
  const int64_t per = g[1] * g[2];
  struct Run {
    int64_t dst, global, len;
  };
  std::vector<Run> runs;
  nn::for_each_shard_run(u, p, [&](int64_t dst, int64_t gl, int64_t len) { runs.push_back({dst, gl, len}); });
  const DType dt = u.data.dtype();
  const Tensor ours = Tensor::empty({g[1], g[2]}, dt);  // (in, out): expert e of ours
  const Tensor flat = ours.view({per});
  for (int64_t e = 0; e < g[0]; ++e) {
    const int64_t lo = e * per, hi = lo + per;
    bool read = false;
    for (const Run& r : runs) {
      const int64_t a = std::max(r.global, lo), b = std::min(r.global + r.len, hi);
      if (a >= b) continue;  // this run holds none of expert e
      if (!read) {
        const std::string& name = s.names[static_cast<size_t>(e)];
        const Tensor theirs = f.get(name, dt);  // (out, in)
        check_finite(theirs, f.dir(), name);
        if (dt == DType::f64)
          transpose_all<double>(ours, {theirs}, false);
        else
          transpose_all<float>(ours, {theirs}, false);
        read = true;
      }
      u.data.narrow(0, r.dst + (a - r.global), b - a).copy_(flat.narrow(0, a - lo, b - a));
    }
  }
}

}  // namespace

void check_hf_folder(const io::HfFolder& f, const models::GPT& gpt) {
  const models::GPTConfig& c = gpt.cfg;
  const std::map<std::string, Source> src = folder_sources(f, c);
  // every tensor present and of its shape, nothing left over, before any value is read: the
  // whole model's (a pipeline stage reads only its own, but the folder is checked whole)
  std::set<std::string> used;
  std::vector<std::string> missing, problems;
  const models::GPT whole(c);  // described only
  for (const nn::ParamSpec& spec : (gpt.part().whole() ? gpt : whole).parameters()) {
    const Source& s = src.at(spec.name);
    const std::vector<Shape> want = hf_shapes(c, spec.name, s, spec.global_shape());
    for (size_t k = 0; k < s.names.size(); ++k) {
      used.insert(s.names[k]);
      if (!f.has(s.names[k])) {
        missing.push_back(s.names[k]);
      } else if (f.entry(s.names[k]).shape != want[k]) {
        problems.push_back(s.names[k] + " has shape " + shape_str(f.entry(s.names[k]).shape) +
                           ", the model needs " + shape_str(want[k]));
      }
    }
  }
  std::vector<std::string> extra;
  for (const std::string& n : f.names()) {
    const bool buffer = n.find("rotary_emb.inv_freq") != std::string::npos || n.ends_with(".attn.bias") ||
                        n.ends_with(".attn.masked_bias");      // buffers, not parameters
    const bool tied_head = n == "lm_head.weight" && c.tied();  // the same values as the embeddings
    if (!used.count(n) && !buffer && !tied_head) extra.push_back(n);
  }
  const std::string model = "; the model is " + c.str();
  NDT_CHECK(missing.empty(), "model folder ", f.dir(), ": missing tensors: ", join(missing), model);
  NDT_CHECK(problems.empty(), "model folder ", f.dir(), ": ", join(problems), model);
  NDT_CHECK(extra.empty(), "model folder ", f.dir(), ": unexpected tensors: ", join(extra),
            " (ndtrain does not know what they are for)", model);
  // a tied folder may still store lm_head.weight: read only when it is wte's values, else the
  // logits would silently come from another matrix than the folder's head
  if (c.tied() && f.has("lm_head.weight")) {
    const std::string& wte = src.at("wte.weight").names[0];
    NDT_CHECK(f.entry("lm_head.weight").shape == f.entry(wte).shape &&
                  f.get("lm_head.weight", DType::f64).to_vector<double>() ==
                      f.get(wte, DType::f64).to_vector<double>(),
              "model folder ", f.dir(), ": lm_head.weight differs from ", wte,
              ", but the model ties its head to ", "the embeddings (",
              c.family().always_tied ? "ndtrain's " + std::string(c.family().title) + " always does"
                                     : std::string("config.json: tie_word_embeddings = true"),
              "); remove lm_head.weight or make it equal to ", wte);
  }
}

void load_hf_local(const io::HfFolder& f, const models::GPT& gpt, const nn::FlatParams& params) {
  check_hf_folder(f, gpt);  // before any value is read
  const models::GPTConfig& c = gpt.cfg;
  const std::map<std::string, Source> src = folder_sources(f, c);
  const DType dt = params.units.empty() ? DType::f32 : params.units[0].data.dtype();
  for (const nn::FlatUnit& u : params.units) kernels::fill(u.data, 0.0);  // padding and gaps stay zero
  constexpr int64_t kPiece = int64_t(1) << 18;  // renamed tensors: a few MiB at a time
  Tensor piece = Tensor::empty({kPiece}, dt);
  for (const nn::FlatUnit& u : params.units)
    for (const nn::FlatParam& p : u.params) {
      const Source& s = src.at(p.spec.name);
      if (s.kind == Source::renamed) {
        const std::string& name = s.names[0];
        const int64_t live_numel = numel_of(f.entry(name).shape);  // wte, lm_head: without padding rows
        nn::for_each_shard_run(u, p, [&](int64_t dst, int64_t g, int64_t len) {
          const int64_t live = std::clamp<int64_t>(live_numel - g, 0, len);
          for (int64_t k = 0; k < live; k += kPiece) {
            const int64_t n = std::min(kPiece, live - k);
            Tensor part = piece.narrow(0, 0, n);
            f.read_range(name, g + k, part);
            check_finite(part, f.dir(), name);
            u.data.narrow(0, dst + k, n).copy_(part);
          }
        });
        continue;
      }
      if (s.kind == Source::experts) {
        load_experts(f, s, u, p);
        continue;
      }
      std::vector<Tensor> in;  // the folder's tensors, whole, in our dtype
      for (const std::string& n : s.names) {
        in.push_back(f.get(n, dt));
        check_finite(in.back(), f.dir(), n);
      }
      Tensor whole = Tensor::empty(p.spec.global_shape(), dt);
      if (dt == DType::f64)
        assemble<double>(c, s, in, whole);
      else
        assemble<float>(c, s, in, whole);
      const Tensor flat = whole.view({whole.numel()});
      nn::for_each_shard_run(u, p, [&](int64_t dst, int64_t g, int64_t len) {
        u.data.narrow(0, dst, len).copy_(flat.narrow(0, g, len));
      });
    }
}

std::vector<std::pair<std::string, Tensor>> hf_tensors(
    const models::GPT& gpt, const std::function<Tensor(const std::string&)>& whole) {
  const models::GPTConfig& c = gpt.cfg;
  const std::map<std::string, Source> src = train::family_tools(c.arch).sources(c);
  std::vector<std::pair<std::string, Tensor>> out;
  for (const nn::ParamSpec& spec : gpt.parameters()) {  // the model's order: embeddings, blocks, head
    const Tensor value = whole(spec.name).to(Device::cpu()).to(DType::f64).contiguous();
    NDT_CHECK(value.shape() == spec.global_shape(), "export: ", spec.name, " is ", value.shape_str(),
              ", not the whole ", shape_str(spec.global_shape()));
    const Source& s = src.at(spec.name);
    const std::vector<Shape> shapes = hf_shapes(c, spec.name, s, spec.global_shape());
    if (s.kind == Source::renamed) {
      out.emplace_back(s.names[0], value.narrow(0, 0, shapes[0][0]).contiguous());  // without padded rows
      continue;
    }
    std::vector<Tensor> parts;
    for (const Shape& sh : shapes) parts.push_back(Tensor::empty(sh, DType::f64));
    disassemble<double>(c, s, value, parts);
    for (size_t k = 0; k < parts.size(); ++k) out.emplace_back(s.names[k], parts[k]);
  }
  return out;
}

void export_hf(const std::string& dir, const models::GPT& gpt, const nn::FlatParams& params, DType dtype,
               int64_t max_shard_bytes) {
  std::ostringstream none;
  export_hf(dir, gpt, params, dtype, TokenizerFiles{}, none, max_shard_bytes);
}

void export_hf(const std::string& dir, const models::GPT& gpt, const nn::FlatParams& params, DType dtype,
               const TokenizerFiles& tokenizer, std::ostream& note, int64_t max_shard_bytes) {
  NDT_CHECK(dtype == DType::f32 || dtype == DType::bf16 || dtype == DType::f64,
            "export: a Hugging Face folder in float32, bfloat16 or float64");
  io::HfFolderWriter w;
  for (auto& [name, t] : hf_tensors(gpt, [&](const std::string& n) {
         const nn::FlatParam* p = params.find(n);
         NDT_CHECK(p && p->value.defined(), "export: no value of ", n);
         return p->value;
       }))
    w.add(name, t.to(dtype));
  io::HfConfig config = hf_config(gpt.cfg, dtype);
  export_tokenizer(tokenizer, w, config, note);  // an empty one writes nothing but the note
  w.write(dir, config, max_shard_bytes);
}

}  // namespace ndt::ckpt
