// The table of the families' tools (train/families/family_tools.h), made from their list
// (models/families.h).
#include "train/families/family_tools.h"

#include "models/families.h"
#include "models/family.h"

namespace ndt::train {

#define NDT_DECLARE(arch) extern const FamilyTools kTools_##arch;
NDT_MODEL_FAMILIES(NDT_DECLARE)
#undef NDT_DECLARE

namespace {
#define NDT_ENTRY(arch) &kTools_##arch,
const FamilyTools* const kTools[] = {NDT_MODEL_FAMILIES(NDT_ENTRY)};
#undef NDT_ENTRY
}  // namespace

const FamilyTools& family_tools(const std::string& arch) {
  for (const FamilyTools* t : kTools)
    if (arch == t->arch) return *t;
  NDT_FAIL("model.arch must be ", models::family_names(), ", got '", arch, "'");
}

const FamilyTools* find_tools_for_model_type(const std::string& model_type) {
  for (const FamilyTools* t : kTools)
    for (const FamilyTools::ModelType& m : t->model_types)
      if (model_type == m.name) return t;
  return nullptr;
}

const FamilyTools& tools_for_model_type(const std::string& model_type) {
  const FamilyTools* t = find_tools_for_model_type(model_type);
  NDT_CHECK(t, "unknown model_type '", model_type, "'; ndtrain reads ", model_type_names());
  return *t;
}

std::string model_type_names() {
  std::vector<std::string> names;
  for (const FamilyTools* t : kTools)
    for (const FamilyTools::ModelType& m : t->model_types) names.emplace_back(m.name);
  std::string s;
  for (size_t i = 0; i < names.size(); ++i)
    s += (i == 0 ? "" : i + 1 == names.size() ? " and " : ", ") + names[i];
  return s;
}

const char* architecture_of(const std::string& model_type) {
  for (const FamilyTools* t : kTools)
    for (const FamilyTools::ModelType& m : t->model_types)
      if (model_type == m.name) return m.architecture;
  NDT_FAIL("unknown model_type '", model_type, "'; ndtrain writes ", model_type_names());
}

}  // namespace ndt::train
