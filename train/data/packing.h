// ndtrain: whole-document packing of rows (Axolotl's multipack), for data with documents.
//
// A row holds `capacity` positions (train.seq_len). Documents go into rows whole, by first
// fit decreasing: the items taken longest first (equal lengths in the order given), each into
// the first row that still has room for it, a new row when none has. A document longer than
// a row is first cut into row-sized pieces (split_lengths). The positions a row's items leave
// free are padding: the loader gives them their own document id and no target.
//
//   std::vector<int64_t> len = {3, 7, 5, 2, 6, 1};
//   data::PackedRows p = data::first_fit_decreasing(len, /*capacity=*/10);
//   // p.rows() == 3: {7, 3} = items {1, 0}, {6, 2, 1} = items {4, 3, 5}, {5} = item {2}
//   p.efficiency(len, 10);   // 24 of 30 positions hold tokens: 0.8
#pragma once

#include <cstdint>
#include <vector>

namespace ndt::data {

// Rows of items in CSR form: row r holds items[offsets[r] .. offsets[r+1]), in the order placed.
struct PackedRows {
  std::vector<int64_t> offsets{0};  // (rows + 1)
  std::vector<int64_t> items;       // item indices, every item exactly once
  int64_t rows() const { return static_cast<int64_t>(offsets.size()) - 1; }
  // real positions / all positions: the sum of the items' lengths over rows() x capacity
  double efficiency(const std::vector<int64_t>& lengths, int64_t capacity) const;
};

// First fit decreasing of items of the given lengths (each 1 .. capacity) into rows of
// `capacity`; deterministic: equal lengths keep their order. Throws ndt::Error naming an item
// that does not fit a row. O(n log n).
PackedRows first_fit_decreasing(const std::vector<int64_t>& lengths, int64_t capacity);

// The pieces a document of `length` tokens becomes in rows of `capacity`: row-sized pieces,
// the remainder last (7 in rows of 3: 3, 3, 1); one piece when it fits.
std::vector<int64_t> split_lengths(int64_t length, int64_t capacity);

}  // namespace ndt::data
