// Shared by the distributed tests (run under mpirun by tests/dist/dist_main.cpp): the
// world, and the float64 inputs and comparison of the layer-level TP and CP tests.
//
//   Tensor x = ndt::testing::randn({B, T, C}, 1, /*grad=*/true);  // the same on every rank
//   EXPECT_LT(ndt::testing::max_diff(whole_out, part_out), 1e-12);
#pragma once

#include <cstdint>
#include <memory>
#include <vector>

#include "dist/comm/communicator.h"
#include "tensor/tensor.h"

namespace ndt::testing {

std::shared_ptr<dist::Communicator> world();  // MPI_COMM_WORLD (tests/dist/dist_main.cpp)

// A float64 tensor of shape s, standard normal from seed 17 and this stream: every rank
// draws the same values for the same stream.
Tensor randn(const Shape& s, uint64_t stream, bool grad = false);

// The largest difference between a and b, relative to the largest magnitude of the
// reference a; a gtest failure when their shapes differ.
double max_diff(const Tensor& a, const Tensor& b);

// Packed rows' document ids (2, T) i32: row r made of documents of lengths[r] in turn,
// repeated until T positions are filled.
Tensor packed_docs(const std::vector<int64_t> (&lengths)[2], int64_t T);

}  // namespace ndt::testing
