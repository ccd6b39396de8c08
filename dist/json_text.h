// ndtrain: the JSON text of the files a job leaves for people and scripts to read (the
// Chrome trace, the flight record), written by nlohmann::json.
//
//   nlohmann::ordered_json doc = {{"rank", 0}, {"entries", entries}};
//   std::string text = dist::json_one_per_line(doc, "entries");
//   // {"rank":0,"entries":[
//   // {...},
//   // {...}
//   // ]}
//
// The document's keys keep their order, with `list` (an array) moved last and one element
// on each line, so that a long record stays readable and greppable. Bytes that are not
// UTF-8 (a name cut in the middle of a character) become U+FFFD instead of throwing.
#pragma once

#include <nlohmann/json.hpp>
#include <string>

namespace ndt::dist {

inline std::string json_one_per_line(nlohmann::ordered_json doc, const std::string& list) {
  auto text = [](const nlohmann::ordered_json& j) {
    return j.dump(-1, ' ', false, nlohmann::ordered_json::error_handler_t::replace);
  };
  const nlohmann::ordered_json items = std::move(doc[list]);
  doc.erase(list);
  std::string s = text(doc);
  s.pop_back();  // the closing brace: the list comes last
  s += std::string(doc.empty() ? "" : ",") + text(list) + ":[";
  for (size_t i = 0; i < items.size(); ++i) s += (i ? ",\n" : "\n") + text(items[i]);
  return s + "\n]}\n";
}

}  // namespace ndt::dist
