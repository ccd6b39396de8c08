// A Parquet file's rows as JSON objects (train/data/parquet.h), through Arrow's C++ library.
#include "train/data/parquet.h"

#include <algorithm>
#include <nlohmann/json.hpp>

#include "tensor/error.h"

#ifdef NDT_PARQUET
#include <arrow/api.h>
#include <arrow/array/concatenate.h>
#include <arrow/io/file.h>
#include <parquet/arrow/reader.h>
#include <parquet/arrow/schema.h>
#include <parquet/exception.h>
#endif

namespace ndt::data {

#ifndef NDT_PARQUET

bool parquet_supported() { return false; }

void for_each_parquet_row(const std::string& path, const std::vector<std::string>&,
                          const std::function<void(int64_t, const nlohmann::json&)>&) {
  NDT_FAIL(path,
           ": this build reads no Parquet files: run scripts/setup.sh (it installs the pyarrow wheel's Arrow "
           "C++ libraries, which the build then finds), or convert the file to .jsonl");
}

#else

namespace {

using nlohmann::json;

json value(const arrow::Array& a, int64_t i, const std::string& column);

template <typename List>
json list(const List& l, int64_t i, const std::string& column) {
  json out = json::array();
  for (int64_t k = l.value_offset(i); k < l.value_offset(i + 1); ++k)
    out.push_back(value(*l.values(), k, column));
  return out;
}

// A value of an Arrow array as JSON (null: the caller leaves the key out). Recursive over lists
// and structs, as deep as the data is.
json value(const arrow::Array& a, int64_t i, const std::string& column) {
  if (a.IsNull(i)) return nullptr;
  switch (a.type_id()) {
    case arrow::Type::STRING:
      return static_cast<const arrow::StringArray&>(a).GetString(i);
    case arrow::Type::LARGE_STRING:
      return static_cast<const arrow::LargeStringArray&>(a).GetString(i);
    case arrow::Type::STRING_VIEW:
      return std::string(static_cast<const arrow::StringViewArray&>(a).GetView(i));
    case arrow::Type::BOOL:
      return static_cast<const arrow::BooleanArray&>(a).Value(i);
    case arrow::Type::INT32:
      return static_cast<const arrow::Int32Array&>(a).Value(i);
    case arrow::Type::INT64:
      return static_cast<const arrow::Int64Array&>(a).Value(i);
    case arrow::Type::DOUBLE:
      return static_cast<const arrow::DoubleArray&>(a).Value(i);
    case arrow::Type::LIST:
      return list(static_cast<const arrow::ListArray&>(a), i, column);
    case arrow::Type::LARGE_LIST:
      return list(static_cast<const arrow::LargeListArray&>(a), i, column);
    case arrow::Type::STRUCT: {
      const auto& s = static_cast<const arrow::StructArray&>(a);
      json out = json::object();
      for (int f = 0; f < s.num_fields(); ++f) {
        json v = value(*s.field(f), i, column);
        if (!v.is_null()) out[s.type()->field(f)->name()] = std::move(v);
      }
      return out;
    }
    default:
      NDT_FAIL("column '", column, "' holds ", a.type()->ToString(),
               " values, which a row does not read (strings, numbers, booleans, lists and structs of them)");
  }
}

// The Parquet columns (leaves) under a top-level field.
void leaves(const parquet::arrow::SchemaField& f, std::vector<int>& out) {
  if (f.children.empty()) out.push_back(f.column_index);
  for (const parquet::arrow::SchemaField& c : f.children) leaves(c, out);
}

template <typename T>
T ok(arrow::Result<T> r, const std::string& path) {
  NDT_CHECK(r.ok(), path, ": cannot read it as Parquet (", r.status().ToString(), ")");
  return std::move(r).ValueUnsafe();
}

}  // namespace

bool parquet_supported() { return true; }

void for_each_parquet_row(const std::string& path, const std::vector<std::string>& columns,
                          const std::function<void(int64_t, const nlohmann::json&)>& fn) {
  std::unique_ptr<parquet::arrow::FileReader> reader;
  try {
    reader = ok(
        parquet::arrow::OpenFile(ok(arrow::io::ReadableFile::Open(path), path), arrow::default_memory_pool()),
        path);
  } catch (const parquet::ParquetException& e) {
    NDT_FAIL(path, ": cannot read it as Parquet (", e.what(), ")");
  }
  // the columns asked for that the file has, and their leaves
  const parquet::arrow::SchemaManifest& m = reader->manifest();
  std::vector<std::string> names, have;
  std::vector<int> leaf;
  for (const parquet::arrow::SchemaField& f : m.schema_fields) {
    have.push_back(f.field->name());
    if (std::find(columns.begin(), columns.end(), f.field->name()) == columns.end()) continue;
    names.push_back(f.field->name());
    leaves(f, leaf);
  }
  std::string listed;
  for (const std::string& h : have) listed += (listed.empty() ? "" : ", ") + h;
  NDT_CHECK(
      !names.empty(), path, ": no column a row reads (its columns: ", listed,
      "; set the fields' names with --messages_field, --prompt_field, --completion_field, --text_field)");
  int64_t row = 0;
  for (int g = 0; g < reader->num_row_groups(); ++g) {
    const std::shared_ptr<arrow::Table> t = ok(reader->ReadRowGroup(g, leaf), path);
    if (t->num_rows() == 0) continue;
    std::vector<std::shared_ptr<arrow::Array> > cols;  // one array each (a row group's column is one chunk)
    for (const std::string& n : names) {
      const std::shared_ptr<arrow::ChunkedArray> chunks = t->GetColumnByName(n);
      cols.push_back(chunks->num_chunks() == 1 ? chunks->chunk(0)
                                               : ok(arrow::Concatenate(chunks->chunks()), path));
    }
    for (int64_t i = 0; i < t->num_rows(); ++i) {
      json r = json::object();
      for (size_t c = 0; c < cols.size(); ++c)
        if (json v = value(*cols[c], i, names[c]); !v.is_null()) r[names[c]] = std::move(v);
      fn(++row, r);
    }
  }
}

#endif

}  // namespace ndt::data
