#include "train/checkpoint/lora.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <functional>
#include <nlohmann/json.hpp>
#include <set>

#include "tensor/kernels.h"
#include "train/checkpoint/checkpoint.h"
#include "train/checkpoint/hf.h"
#include "train/checkpoint/load.h"
#include "train/io/files.h"
#include "train/io/hf_config.h"
#include "train/io/safetensors.h"

namespace fs = std::filesystem;

namespace ndt::ckpt {
namespace {

std::string leaf(const std::string& name) { return name.substr(name.rfind('.') + 1); }

// lora.targets as PEFT's target_modules: as given, all-linear as the names it selects (PEFT's
// own all-linear rule need not agree on every family), PEFT's default when none were given
std::vector<std::string> target_modules(const models::GPT& gpt) {
  const std::vector<nn::LinearSite> sites = gpt.h.front()->linear_sites();
  const nn::LoraConfig& c = gpt.lora_config;
  std::vector<std::string> given = c.targets.empty() ? nn::default_lora_targets(sites) : c.targets, out;
  for (const std::string& t : given) {
    if (t != "all-linear") {
      out.push_back(t);
      continue;
    }
    for (const nn::LinearSite& s : sites)
      if (std::find(out.begin(), out.end(), leaf(s.name)) == out.end()) out.push_back(leaf(s.name));
  }
  return out;
}

std::string meta(const std::map<std::string, std::string>& m, const std::string& key,
                 const std::string& where) {
  const auto it = m.find(key);
  NDT_CHECK(it != m.end(), "checkpoint ", where, ": its state lacks '", key,
            "' (a LoRA run's checkpoint has it)");
  return it->second;
}

// ndtrain's name of an adapter's tensor -> PEFT's: h.3.self_attn.q_proj.lora_A ->
// base_model.model.model.layers.3.self_attn.q_proj.lora_A.weight (GPT-2: ...transformer.h.3...)
std::string peft_name(const std::string& name, const std::string& arch) {
  NDT_CHECK(name.rfind("h.", 0) == 0, "LoRA checkpoint: unexpected adapter name ", name);
  return "base_model.model." + std::string(arch == "gpt2" ? "transformer.h." : "model.layers.") +
         name.substr(2) + ".weight";
}

// The state's metadata and the step folder of a checkpoint (or a checkpoint.dir's latest).
std::string step_folder(const std::string& path) {
  NDT_CHECK(fs::exists(path), "checkpoint ", path,
            " does not exist: give a checkpoint's step folder or the checkpoint.dir");
  if (fs::exists(fs::path(path) / "checkpoint.json")) return path;
  const std::optional<std::string> latest = latest_checkpoint(path);
  NDT_CHECK(latest.has_value(), path, " is neither a checkpoint nor a checkpoint.dir");
  return *latest;
}

std::vector<std::string> split_commas(const std::string& s) {
  std::vector<std::string> out;
  size_t at = 0;
  while (at <= s.size()) {
    const size_t comma = std::min(s.find(',', at), s.size());
    if (comma > at) out.push_back(s.substr(at, comma - at));
    at = comma + 1;
  }
  return out;
}

double number(const std::map<std::string, std::string>& m, const std::string& key, const std::string& where) {
  const std::string v = meta(m, key, where);
  try {
    return std::stod(v);
  } catch (...) {
    NDT_FAIL("checkpoint ", where, ": '", key, "' is not a number: ", v);
  }
}

nn::LoraConfig lora_config(const std::map<std::string, std::string>& m, const std::string& where) {
  nn::LoraConfig c;
  c.rank = static_cast<int64_t>(number(m, "lora.rank", where));
  c.alpha = number(m, "lora.alpha", where);
  c.dropout = number(m, "lora.dropout", where);
  c.rslora = meta(m, "lora.rslora", where) == "true";
  c.targets = split_commas(meta(m, "lora.targets", where));
  return c;
}

// out.tmp written whole, then renamed to out (an existing out only when it is a PEFT folder)
void write_peft_folder(const std::string& out, const std::map<std::string, std::string>& m,
                       const io::SafeTensorsReader& adapters, const std::string& where) {
  const std::string arch = meta(m, "lora.arch", where), base = meta(m, "lora.base", where);
  const nn::LoraConfig c = lora_config(m, where);
  const nlohmann::json config = {
      {"peft_type", "LORA"},
      {"task_type", "CAUSAL_LM"},
      {"r", c.rank},
      {"lora_alpha", c.alpha},
      {"lora_dropout", c.dropout},
      {"use_rslora", c.rslora},
      {"target_modules", c.targets},
      {"base_model_name_or_path", base.empty() ? nlohmann::json() : nlohmann::json(base)},
      {"fan_in_fan_out", arch == "gpt2"},  // GPT-2's Conv1D linears
      {"bias", "none"},
      {"use_dora", false},
      {"init_lora_weights", true},
      {"inference_mode", true},
      {"modules_to_save", nlohmann::json()}};
  io::SafeTensorsWriter w;
  for (const auto& [name, e] : adapters.entries()) w.add(peft_name(name, arch), adapters.get(name));
  w.metadata["format"] = "pt";
  std::error_code ec;
  NDT_CHECK(!fs::exists(out, ec) || fs::exists(fs::path(out) / "adapter_config.json", ec), "export to ", out,
            " refused: it exists and is not a PEFT adapter folder; give a new path");
  const fs::path tmp = out + ".tmp";
  fs::remove_all(tmp);
  fs::create_directories(tmp);
  w.write((tmp / "adapter_model.safetensors").string());
  io::write_file_atomic((tmp / "adapter_config.json").string(), config.dump(2) + "\n");
  fs::remove_all(out);
  fs::rename(tmp, out);
}

// W += scale A^T B^T (in, out) in the columns of each adapter's linear (gpt: the whole model,
// its parameters materialized); every adapter must find its linear.
// (rename: ndtrain's name of an adapter's tensor -> the file's)
void merge_adapters(const models::GPT& gpt, const io::SafeTensorsReader& a, double scale,
                    const std::string& where, const std::function<std::string(const std::string&)>& rename) {
  size_t merged = 0;
  for (size_t i = 0; i < gpt.h.size(); ++i)
    for (const nn::LinearSite& s : gpt.h[i]->linear_sites()) {
      const std::string name = "h." + std::to_string(i) + "." + s.name;
      if (!a.has(rename(name + ".lora_A"))) continue;
      NDT_CHECK(a.has(rename(name + ".lora_B")), where, " has ", rename(name + ".lora_A"),
                " but not its lora_B");
      const Tensor A = a.get(rename(name + ".lora_A"), DType::f32),
                   B = a.get(rename(name + ".lora_B"), DType::f32);  // (r, in), (out, r)
      const int64_t in = s.linear->in, out = s.out(), OC = s.linear->out;
      NDT_CHECK(A.dim() == 2 && B.dim() == 2 && A.size(1) == in && B.size(0) == out && A.size(0) == B.size(1),
                "checkpoint ", where, ": ", name, "'s adapters ", A.shape_str(), ", ", B.shape_str(),
                " do not fit its linear (", in, " -> ", out, "); the base differs from the run's");
      Tensor D = Tensor::empty({in, out}, DType::f32);
      kernels::gemm(A, true, B, true, D, scale, 0.0);  // scale A^T B^T
      // the part's column c is column (c / size) total + offset + c % size of W (in, OC)
      int64_t total = 0, offset = 0, size = out;
      for (size_t p = 0; p < s.sizes.size(); ++p) {
        if (static_cast<int>(p) < s.part) offset += s.sizes[p];
        total += s.sizes[p];
      }
      if (s.part >= 0) size = s.sizes[static_cast<size_t>(s.part)];
      float* w = s.linear->weight.data<float>();
      const float* d = D.data<float>();
      for (int64_t r = 0; r < in; ++r)
        for (int64_t c = 0; c < out; ++c)
          w[r * OC + (s.part < 0 ? c : c / size * total + offset + c % size)] += d[r * out + c];
      merged += 2;
    }
  NDT_CHECK(merged == a.entries().size(), "checkpoint ", where, ": ", a.entries().size() - merged,
            " of its adapter tensors fit no linear of the base model; the base differs from the run's");
}

// The adapters `params` (ndtrain's names) from the safetensors file at `path`, where
// rename(name) is the file's name: every name and shape checked before anything is copied.
void load_named(const std::string& path, const nn::FlatParams& params,
                const std::function<std::string(const std::string&)>& rename, const std::string& lacks,
                const std::string& differs) {
  io::SafeTensorsReader r(path);
  std::set<std::string> used;
  for (const nn::FlatUnit& u : params.units)
    for (const nn::FlatParam& p : u.params) {
      const std::string n = rename(p.spec.name);
      NDT_CHECK(r.has(n), "LoRA adapters ", path, " lack ", n, lacks);
      NDT_CHECK(r.entries().at(n).shape == p.spec.shape, "LoRA adapters ", path, ": ", n, " is ",
                shape_str(r.entries().at(n).shape), ", this run's is ", shape_str(p.spec.shape), differs);
      used.insert(n);
    }
  for (const auto& [name, e] : r.entries())
    NDT_CHECK(used.count(name), "LoRA adapters ", path, " hold ", r.entries().size(),
              " tensors, this run has ", used.size(), ": ", name, " fits none of its adapters", lacks);
  for (const nn::FlatUnit& u : params.units)
    for (const nn::FlatParam& p : u.params) {
      const Tensor v = r.get(rename(p.spec.name), u.data.dtype());
      NDT_CHECK(!non_finite_kind(v), "LoRA adapters ", path, ": ", rename(p.spec.name), " is not finite");
      u.data.narrow(0, p.offset, numel_of(p.spec.shape)).copy_(v.view({v.numel()}));
    }
  params.refresh_compute();
}

// Whether a PEFT option is set: not null, false, empty or "none".
bool set(const nlohmann::json& v) {
  return !(v.is_null() || (v.is_boolean() && !v.get<bool>()) || (v.is_array() && v.empty()) ||
           (v.is_object() && v.empty()) || (v.is_string() && (v == "none" || v == "")));
}

nn::LoraConfig peft_config(const nlohmann::json& j, const std::string& where) {
  NDT_CHECK(j.value("peft_type", std::string("LORA")) == "LORA", where, ": peft_type ", j["peft_type"].dump(),
            " is not supported; ndtrain reads LoRA adapters (peft_type LORA)");
  for (const char* key :
       {"use_dora", "modules_to_save", "lora_bias", "layers_to_transform", "rank_pattern", "alpha_pattern",
        "layer_replication", "trainable_token_indices", "use_qalora", "target_parameters", "exclude_modules"})
    NDT_CHECK(!j.contains(key) || !set(j[key]), where, ": ", key, " = ", j[key].dump(),
              " is not supported (ndtrain applies plain LoRA on the targeted linears only); save the adapter "
              "without it");
  NDT_CHECK(!j.contains("bias") || !set(j["bias"]), where, ": bias = ", j["bias"].dump(),
            " is not supported (trained biases); ndtrain's adapters are bias none");
  nn::LoraConfig c;
  c.rank = j.at("r").get<int64_t>();
  c.alpha = j.value("lora_alpha", 8.0);
  c.dropout = j.value("lora_dropout", 0.0);
  c.rslora = j.value("use_rslora", false);
  const nlohmann::json& t = j.at("target_modules");
  if (t.is_string()) {
    NDT_CHECK(t == "all-linear", where, ": target_modules ", t.dump(),
              " is a regular expression, which ndtrain does not match; list the module names instead");
    c.targets = {"all-linear"};
  } else {
    c.targets = t.get<std::vector<std::string>>();
  }
  NDT_CHECK(c.rank >= 1 && std::isfinite(c.alpha) && c.alpha > 0 && !c.targets.empty(), where,
            ": r must be >= 1, lora_alpha > 0 and target_modules not empty, got r = ", c.rank,
            ", lora_alpha = ", c.alpha, ", ", c.targets.size(), " target_modules");
  return c;
}

}  // namespace

std::string export_lora(const std::string& path, const std::string& out, bool merge, DType dtype,
                        std::ostream& note) {
  const std::string step = step_folder(path);
  verify_checkpoint(step);
  const io::SafeTensorsReader state((fs::path(step) / "state.safetensors").string());
  const std::map<std::string, std::string>& m = state.metadata();
  NDT_CHECK(is_lora_state(m), "checkpoint ", step, " is not a LoRA run's (no lora.rank in its state)");
  const io::SafeTensorsReader adapters((fs::path(step) / "model.safetensors").string());
  if (!merge) {
    write_peft_folder(out, m, adapters, step);
    return step;
  }
  const std::string base = meta(m, "lora.base", step);
  const models::GPTConfig mc = model_config(io::parse_hf_config(meta(m, "lora.base_config", step), step));
  models::GPT gpt(mc);
  nn::FlatParams params = nn::materialize(gpt.units(), Device::cpu(), DType::f32, 0);
  const WeightSource w = find_weights(base);
  check_weights(w, gpt);
  load_weights(w, gpt, params, &note);
  merge_adapters(gpt, adapters, lora_config(m, step).scale(), step, [](const std::string& n) { return n; });
  export_hf(out, gpt, params, dtype, read_tokenizer_files(step), note);
  return step;
}

std::map<std::string, std::string> lora_metadata(const models::GPT& gpt, const std::string& base) {
  const nn::LoraConfig& c = gpt.lora_config;
  std::string targets;
  for (const std::string& t : target_modules(gpt)) targets += (targets.empty() ? "" : ",") + t;
  char alpha[32], dropout[32];
  std::snprintf(alpha, sizeof(alpha), "%.17g", c.alpha);
  std::snprintf(dropout, sizeof(dropout), "%.17g", c.dropout);
  return {{"lora.rank", std::to_string(c.rank)},
          {"lora.alpha", alpha},
          {"lora.dropout", dropout},
          {"lora.rslora", c.rslora ? "true" : "false"},
          {"lora.targets", targets},
          {"lora.arch", gpt.cfg.arch},
          {"lora.base", base},
          {"lora.base_config", io::to_json(hf_config(gpt.cfg, DType::f32))}};
}

bool is_lora_state(const std::map<std::string, std::string>& extra) { return extra.count("lora.rank") > 0; }

void save_adapters(const std::string& path, const nn::FlatParams& params,
                   const std::map<std::string, std::string>& metadata) {
  io::SafeTensorsWriter w;
  for (const nn::FlatUnit& u : params.units) {
    NDT_CHECK(!u.sharded(), "save_adapters: unit ", u.name, " is sharded; adapters are whole on every rank");
    for (const nn::FlatParam& p : u.params)  // the master's values (mixed precision: not the bf16 copy)
      w.add(p.spec.name, u.data.narrow(0, p.offset, numel_of(p.spec.shape)).view(p.spec.shape));
  }
  w.metadata = metadata;
  w.metadata["format"] = "pt";
  w.write(path);
}

void load_adapters(const std::string& path, const nn::FlatParams& params) {
  load_named(
      path, params, [](const std::string& n) { return n; },
      "; the checkpoint was trained with other [lora] targets or another model",
      "; lora.rank or the model differs from the checkpoint's");
}

WholeAdapters whole_adapters(const models::GPTConfig& cfg, const nn::LoraConfig& lora) {
  WholeAdapters w;
  w.gpt = std::make_unique<models::GPT>(cfg);
  w.gpt->add_lora(lora);
  w.params = nn::materialize(w.gpt->adapter_units(), Device::cpu(), DType::f32, 0);
  return w;
}

void scatter_adapters(const nn::FlatParams& whole, const std::vector<Tensor>& m, const std::vector<Tensor>& v,
                      const nn::FlatParams& local, const std::vector<Tensor>& mlocal,
                      const std::vector<Tensor>& vlocal) {
  for (size_t i = 0; i < local.units.size(); ++i) {
    const nn::FlatUnit& u = local.units[i];
    for (const nn::FlatParam& p : u.params) {
      size_t j = 0;  // the whole unit and parameter of this name
      const nn::FlatParam* wp = nullptr;
      for (size_t k = 0; k < whole.units.size() && !wp; ++k)
        for (const nn::FlatParam& q : whole.units[k].params)
          if (q.spec.name == p.spec.name) j = k, wp = &q;
      NDT_CHECK(wp, "LoRA adapters: ", p.spec.name, " is not among the whole model's adapters");
      const Tensor value = whole.units[j].data.narrow(0, wp->offset, numel_of(wp->spec.shape));
      nn::for_each_shard_run(u, p, [&](int64_t dst, int64_t g, int64_t len) {
        u.data.narrow(0, dst, len).copy_(value.narrow(0, g, len));
        if (m.empty()) return;
        mlocal[i].narrow(0, dst, len).copy_(m[j].narrow(0, wp->offset + g, len));
        vlocal[i].narrow(0, dst, len).copy_(v[j].narrow(0, wp->offset + g, len));
      });
    }
  }
  local.refresh_compute();
}

bool is_peft_folder(const std::string& dir) {
  std::error_code ec;
  return fs::is_directory(dir, ec) && fs::exists(fs::path(dir) / "adapter_config.json", ec);
}

nn::LoraConfig read_peft_config(const std::string& dir) {
  NDT_CHECK(is_peft_folder(dir), dir,
            " is not a PEFT adapter folder (no adapter_config.json); give the folder "
            "PeftModel.save_pretrained or export_weights wrote");
  const std::string where = (fs::path(dir) / "adapter_config.json").string();
  NDT_CHECK(fs::exists(fs::path(dir) / "adapter_model.safetensors"), dir,
            " has no adapter_model.safetensors (only safetensors are read: save it with "
            "safe_serialization=True)");
  try {
    return peft_config(io::parse_json_object(io::read_text(where, "adapter config"), where), where);
  } catch (const nlohmann::json::exception& e) {
    NDT_FAIL(where, ": ", e.what(), " (r, lora_alpha, target_modules and use_rslora are read)");
  }
}

void load_peft_adapters(const std::string& dir, const std::string& arch, const nn::FlatParams& params) {
  load_named((fs::path(dir) / "adapter_model.safetensors").string(), params,
             [&](const std::string& n) { return peft_name(n, arch); },
             "; the adapter was made for other target_modules or another base model",
             "; the adapter was made for another base model (or another r)");
}

std::string merge_adapter(const std::string& path, const models::GPT& gpt) {
  if (is_peft_folder(path)) {
    const nn::LoraConfig c = read_peft_config(path);
    nn::check_lora(nn::LoraConfig{.rank = 1, .alpha = 1, .targets = c.targets},
                   gpt.h.front()->linear_sites());
    const io::SafeTensorsReader a((fs::path(path) / "adapter_model.safetensors").string());
    merge_adapters(gpt, a, c.scale(), path, [&](const std::string& n) { return peft_name(n, gpt.cfg.arch); });
    return "PEFT adapter " + path;
  }
  std::string step;
  NDT_CHECK(is_lora_checkpoint(path, &step), path,
            " is neither a PEFT adapter folder (adapter_config.json) nor a LoRA run's checkpoint");
  const io::SafeTensorsReader state((fs::path(step) / "state.safetensors").string());
  const io::SafeTensorsReader a((fs::path(step) / "model.safetensors").string());
  merge_adapters(gpt, a, lora_config(state.metadata(), step).scale(), step,
                 [](const std::string& n) { return n; });
  return "LoRA adapters of " + step;
}

bool is_lora_checkpoint(const std::string& path, std::string* step) {
  std::error_code ec;
  if (!fs::is_directory(path, ec)) return false;
  std::string s;
  try {
    s = step_folder(path);
  } catch (const Error&) {
    return false;
  }
  const fs::path state = fs::path(s) / "state.safetensors";
  if (!fs::exists(state, ec)) return false;
  if (step) *step = s;
  return is_lora_state(io::SafeTensorsReader(state.string()).metadata());
}

std::string load_start_weights(const WeightSource& base, const std::string& base_path,
                               const std::string& adapters, const models::GPT& gpt, nn::FlatParams& model,
                               const nn::FlatParams& adapter_params, std::ostream* warn) {
  std::string said;
  if (!base_path.empty()) {
    load_weights(base, gpt, model, warn);
    said += "initialized from " + base_path + "\n";
  }
  if (!adapters.empty()) {  // whole, then this rank's elements (TP: its slices; PP: its stage's)
    const WholeAdapters w = whole_adapters(gpt.cfg, gpt.lora_config);
    load_peft_adapters(adapters, gpt.cfg.arch, w.params);
    scatter_adapters(w.params, {}, {}, adapter_params, {}, {});
    said += "adapters from " + adapters + "\n";
  }
  return said;
}

}  // namespace ndt::ckpt
