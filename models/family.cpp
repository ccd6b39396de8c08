// The table of model families (models/family.h), made from their list (models/families.h).
#include "models/family.h"

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

}  // namespace ndt::models
