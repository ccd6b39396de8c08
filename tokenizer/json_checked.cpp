#include "tokenizer/json_checked.h"

#include <set>
#include <sstream>
#include <vector>

#include "tensor/error.h"

namespace ndt {

nlohmann::json parse_json_checked(std::string_view text, const std::string& file, std::string* duplicate) {
  std::vector<std::set<std::string>> seen;  // the keys of each open object, outermost first
  auto cb = [&](int depth, nlohmann::json::parse_event_t ev, nlohmann::json& parsed) {
    using E = nlohmann::json::parse_event_t;
    // depth: of the new object or array's parent; throwing here ends the parse before the
    // document grows deeper
    if ((ev == E::object_start || ev == E::array_start) && depth >= kMaxJsonDepth)
      NDT_FAIL(file, ": JSON nested deeper than ", kMaxJsonDepth, " levels; not a file ndtrain reads");
    if (!duplicate) return true;
    if (ev == E::object_start) {  // its keys come at depth + 1
      seen.resize(static_cast<size_t>(depth));
      seen.emplace_back();
    } else if (ev == E::key && depth >= 1 && static_cast<size_t>(depth) <= seen.size()) {
      if (!seen[depth - 1].insert(parsed.get<std::string>()).second && duplicate->empty())
        *duplicate = parsed.get<std::string>();
    } else if (ev == E::object_end) {
      seen.resize(static_cast<size_t>(depth));
    }
    return true;
  };
  return nlohmann::json::parse(text.begin(), text.end(), cb);
}

nlohmann::json parse_json_checked(std::istream& in, const std::string& file, std::string* duplicate) {
  std::stringstream s;
  s << in.rdbuf();
  return parse_json_checked(s.str(), file, duplicate);
}

}  // namespace ndt
