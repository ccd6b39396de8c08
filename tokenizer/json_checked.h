// ndtrain: every JSON file the project reads (config.json, a safetensors header and index,
// tokenizer.json, vocab.json, checkpoint.json, metrics lines) goes through this one parser.
// nlohmann::json copies and prints nested values recursively, so a document nested some
// 70,000 levels deep ("[[[[...", a few hundred KB) overflows the stack; this parser refuses
// nesting deeper than kMaxJsonDepth while it reads, so no such document exists in memory.
// It also reports a key given twice in one object (nlohmann keeps one value of the two and
// drops the other without a word).
//
//   nlohmann::json j = ndt::parse_json_checked(text, "out/ckpt/step_00000100/checkpoint.json");
//   std::string dup;  // a key given twice, or empty
//   nlohmann::json h = ndt::parse_json_checked(header, path, &dup);
//
// Too deep throws ndt::Error, one line naming the file; invalid JSON throws
// nlohmann::json::exception as nlohmann::json::parse does (the caller says what the file is).
//
// It lives in tokenizer/, the lowest layer that reads JSON: train/ (above it) includes it,
// tokenizer/ needs it itself, and dist/ only writes JSON.
#pragma once

#include <istream>
#include <nlohmann/json.hpp>
#include <string>
#include <string_view>

namespace ndt {

// Far beyond any real file: Hugging Face configs, tokenizers and checkpoints nest under 10.
constexpr int kMaxJsonDepth = 512;

nlohmann::json parse_json_checked(std::string_view text, const std::string& file,
                                  std::string* duplicate = nullptr);
// The whole stream (an open file) as text, then parsed as above.
nlohmann::json parse_json_checked(std::istream& in, const std::string& file,
                                  std::string* duplicate = nullptr);

}  // namespace ndt
