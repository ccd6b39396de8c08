// ndtrain: writing files so that a crash never leaves a half-written one in place.
//
//   io::write_file_atomic("out/latest", "step_00000100\n");
//   io::write_file_atomic("model.safetensors", {header, tensor_bytes_a, tensor_bytes_b});
//
// The pieces are written in order to PATH.tmp, flushed to disk (fsync), and renamed over
// PATH; on any failure the temporary file is removed and PATH is left as it was.
#pragma once

#include <initializer_list>
#include <string>
#include <string_view>
#include <vector>

namespace ndt::io {

void write_file_atomic(const std::string& path, const std::vector<std::string_view>& pieces);
inline void write_file_atomic(const std::string& path, std::string_view bytes) {
  write_file_atomic(path, std::vector<std::string_view>{bytes});
}

}  // namespace ndt::io
