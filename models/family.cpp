// The table of model families (models/family.h), made from their list (models/families.h).
#include "models/family.h"

#include <sstream>

#include "models/families.h"

namespace ndt::models {

#define NDT_DECLARE(arch) extern const Family kFamily_##arch;
NDT_MODEL_FAMILIES(NDT_DECLARE)
#undef NDT_DECLARE

namespace {
#define NDT_ENTRY(arch) &kFamily_##arch,
const Family* const kFamilies[] = {NDT_MODEL_FAMILIES(NDT_ENTRY)};
#undef NDT_ENTRY
}  // namespace

std::vector<const Family*> families() { return {std::begin(kFamilies), std::end(kFamilies)}; }

std::string family_names() {
  std::string s;
  const size_t n = std::size(kFamilies);
  for (size_t i = 0; i < n; ++i)
    s += std::string(i == 0 ? "" : i + 1 == n ? " or " : ", ") + kFamilies[i]->arch;
  return s;
}

const Family* find_family(const std::string& arch) {
  for (const Family* f : kFamilies)
    if (arch == f->arch) return f;
  return nullptr;
}

const Family& family(const std::string& arch) {
  if (const Family* f = find_family(arch)) return *f;
  NDT_FAIL("model.arch must be ", family_names(), " (Qwen2 and Mistral are llama), got '", arch, "'");
}

const Family& GPTConfig::family() const { return models::family(arch); }
bool GPTConfig::tied() const { return family().always_tied || tie_embeddings; }
int64_t GPTConfig::mlp_hidden() const { return family().mlp_hidden(*this); }

bool GPTConfig::moe_layer(int64_t i) const {
  if (n_experts <= 0 || (i + 1) % moe_every != 0) return false;
  std::istringstream in(dense_layers);
  for (std::string item; std::getline(in, item, ',');) {
    size_t used = 0;
    int64_t layer = -1;
    try {
      layer = std::stoll(item, &used);
    } catch (const std::exception&) {
      used = 0;
    }
    NDT_CHECK(
        used > 0 && item.find_first_not_of(" ", used) == std::string::npos && layer >= 0 && layer < n_layer,
        "model.dense_layers = \"", dense_layers, "\": '", item, "' is not a layer 0..", n_layer - 1,
        "; give the dense layers' indices separated by commas, e.g. \"0,5\"");
    if (layer == i) return false;
  }
  return true;
}

int64_t GPTConfig::moe_layers() const {
  int64_t n = 0;
  for (int64_t i = 0; i < n_layer; ++i) n += moe_layer(i) ? 1 : 0;
  return n;
}

}  // namespace ndt::models
