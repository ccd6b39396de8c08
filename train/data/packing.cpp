#include "train/data/packing.h"

#include <algorithm>
#include <numeric>

#include "tensor/error.h"

namespace ndt::data {

namespace {

// The rows' free positions in a max tree over n row slots (all empty at first), so that
// "the first row with at least `need` free" is one walk from the root: the left child when
// it has room, else the right. Slots past the last opened row are empty rows, so the walk
// opens a new row exactly when no opened row has room.
class FreeTree {
 public:
  FreeTree(int64_t n, int64_t capacity) : leaves_(1) {
    while (leaves_ < n) leaves_ *= 2;
    free_.assign(static_cast<size_t>(2 * leaves_), capacity);
  }
  // The first slot with at least `need` free positions (the root has room: checked by the caller).
  int64_t first_with(int64_t need) const {
    int64_t node = 1;
    while (node < leaves_) node = free_[static_cast<size_t>(2 * node)] >= need ? 2 * node : 2 * node + 1;
    return node - leaves_;
  }
  void take(int64_t slot, int64_t n) {
    int64_t node = slot + leaves_;
    free_[static_cast<size_t>(node)] -= n;
    for (node /= 2; node >= 1; node /= 2)
      free_[static_cast<size_t>(node)] =
          std::max(free_[static_cast<size_t>(2 * node)], free_[static_cast<size_t>(2 * node + 1)]);
  }

 private:
  int64_t leaves_;
  std::vector<int64_t> free_;  // heap order: node i has children 2i, 2i+1; leaves at [leaves_, 2 leaves_)
};

}  // namespace

double PackedRows::efficiency(const std::vector<int64_t>& lengths, int64_t capacity) const {
  if (rows() == 0) return 1.0;
  int64_t real = 0;
  for (int64_t i : items) real += lengths[static_cast<size_t>(i)];
  return static_cast<double>(real) / static_cast<double>(rows() * capacity);
}

PackedRows first_fit_decreasing(const std::vector<int64_t>& lengths, int64_t capacity) {
  NDT_CHECK(capacity >= 1, "packing: rows of ", capacity, " positions; the row length must be >= 1");
  const int64_t n = static_cast<int64_t>(lengths.size());
  for (int64_t i = 0; i < n; ++i)
    NDT_CHECK(lengths[static_cast<size_t>(i)] >= 1 && lengths[static_cast<size_t>(i)] <= capacity,
              "packing: item ", i, " has ", lengths[static_cast<size_t>(i)], " tokens, not 1 .. ", capacity,
              " (a row); cut longer documents with split_lengths first");
  std::vector<int64_t> order(static_cast<size_t>(n));
  std::iota(order.begin(), order.end(), 0);
  std::stable_sort(order.begin(), order.end(), [&](int64_t a, int64_t b) {
    return lengths[static_cast<size_t>(a)] > lengths[static_cast<size_t>(b)];
  });
  FreeTree tree(std::max<int64_t>(n, 1), capacity);
  std::vector<int64_t> row_of(static_cast<size_t>(n));
  int64_t rows = 0;
  for (int64_t i : order) {
    const int64_t r = tree.first_with(lengths[static_cast<size_t>(i)]);
    tree.take(r, lengths[static_cast<size_t>(i)]);
    row_of[static_cast<size_t>(i)] = r;
    rows = std::max(rows, r + 1);
  }
  // CSR: count per row, then place the items in the order they were placed
  PackedRows p;
  p.offsets.assign(static_cast<size_t>(rows + 1), 0);
  for (int64_t i = 0; i < n; ++i) ++p.offsets[static_cast<size_t>(row_of[static_cast<size_t>(i)] + 1)];
  std::partial_sum(p.offsets.begin(), p.offsets.end(), p.offsets.begin());
  std::vector<int64_t> next(p.offsets.begin(), p.offsets.end() - 1);
  p.items.resize(static_cast<size_t>(n));
  for (int64_t i : order)
    p.items[static_cast<size_t>(next[static_cast<size_t>(row_of[static_cast<size_t>(i)])]++)] = i;
  return p;
}

std::vector<int64_t> split_lengths(int64_t length, int64_t capacity) {
  NDT_CHECK(length >= 1 && capacity >= 1, "packing: a document of ", length, " tokens in rows of ", capacity,
            "; both must be >= 1");
  std::vector<int64_t> pieces(static_cast<size_t>(length / capacity), capacity);
  if (length % capacity) pieces.push_back(length % capacity);
  return pieces;
}

}  // namespace ndt::data
