// Data parallelism (DP) at the component level, under mpirun, in float64: every rank a
// whole replica, gradients all-reduced. The gradients and the parameters after 3 AdamW
// steps (gradient accumulation 2) equal the single process's on the same global batch;
// each rank allocates the whole model, no more; one all-reduce per unit per step, of the
// analytic volume (tests/dist/layout_check.h).
#include <gtest/gtest.h>

#include "layout_check.h"

namespace {

TEST(DistDP, DataParallelEqualsOneProcess) { ndt::testing::check_layout({"dp", -1, 1}, false); }

}  // namespace
