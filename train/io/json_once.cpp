#include "train/io/json_once.h"

#include <set>
#include <vector>

namespace ndt::io {

nlohmann::json parse_json_keys_once(const char* begin, const char* end, std::string& duplicate) {
  std::vector<std::set<std::string>> seen;  // the keys of each open object, outermost first
  auto cb = [&](int depth, nlohmann::json::parse_event_t ev, nlohmann::json& parsed) {
    using E = nlohmann::json::parse_event_t;
    if (ev == E::object_start) {  // depth: of the new object's parent; its keys come at depth + 1
      seen.resize(static_cast<size_t>(depth));
      seen.emplace_back();
    } else if (ev == E::key && depth >= 1 && static_cast<size_t>(depth) <= seen.size()) {
      if (!seen[depth - 1].insert(parsed.get<std::string>()).second && duplicate.empty())
        duplicate = parsed.get<std::string>();
    } else if (ev == E::object_end) {
      seen.resize(static_cast<size_t>(depth));
    }
    return true;
  };
  return nlohmann::json::parse(begin, end, cb);
}

}  // namespace ndt::io
