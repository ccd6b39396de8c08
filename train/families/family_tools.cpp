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

const FamilyTools& tools_for_model_type(const std::string& model_type) {
  std::string known;
  for (const FamilyTools* t : kTools)
    for (const char* m : t->model_types) {
      if (model_type == m) return *t;
      known += (known.empty() ? "" : ", ") + std::string(m);
    }
  NDT_FAIL("unknown model_type '", model_type, "'; ndtrain reads ", known);
}

}  // namespace ndt::train
