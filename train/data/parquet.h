// ndtrain: the rows of a Parquet file (the Hugging Face Hub's format for datasets), read
// through Apache Arrow's C++ library (the pyarrow wheel's libarrow and libparquet, which
// scripts/setup.sh installs; built in when CMake finds them: NDT_PARQUET).
//
// Each row is handed over as a JSON object of the columns asked for, so that it reads as a
// .jsonl line does (train/data/jsonl.h): strings, numbers and booleans as themselves, lists
// as arrays, structs as objects (a conversation, list<struct<role, content>>, is the array
// of messages a .jsonl row holds); a null value leaves its key out. Only those columns are
// read, one row group at a time, so a large file costs a row group's memory.
//
//   data::for_each_parquet_row("chats.parquet", {"messages", "text"},
//                              [&](int64_t row, const nlohmann::json& r) { reader.row(r); });
#pragma once

#include <cstdint>
#include <functional>
#include <nlohmann/json_fwd.hpp>
#include <string>
#include <vector>

namespace ndt::data {

// Whether this build reads Parquet files.
bool parquet_supported();

// fn(row number from 1, the row) for every row, in order, with the columns of `columns` the
// file has (those it lacks are left out; none of them at all is an error naming the file's
// columns). Throws ndt::Error naming the file for one that cannot be read (or, built without
// Parquet, saying how to build it); a column of a type other than those above names it.
void for_each_parquet_row(const std::string& path, const std::vector<std::string>& columns,
                          const std::function<void(int64_t, const nlohmann::json&)>& fn);

}  // namespace ndt::data
