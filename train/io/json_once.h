// JSON whose objects name each key once. nlohmann::json keeps one value of a key given twice
// and drops the other without a word; the files ndtrain reads (a safetensors header, a model
// folder's config.json) are refused instead, naming the key.
#pragma once

#include <nlohmann/json.hpp>
#include <string>

namespace ndt::io {

// Parses [begin, end); `duplicate` gets the first key given twice in one object, or stays
// empty. Invalid JSON throws nlohmann::json::exception, as nlohmann::json::parse does.
nlohmann::json parse_json_keys_once(const char* begin, const char* end, std::string& duplicate);

}  // namespace ndt::io
