// Fully sharded data parallelism (FSDP) at the component level, under mpirun: every rank
// holds 1/n of each unit's flat buffers (padded). In float64, with and without activation
// checkpointing, the gradients and the parameters after 3 AdamW steps (gradient
// accumulation 2) equal the single process's on the same global batch; each rank allocates
// exactly its padded shards; at most two blocks are gathered at once; the all-gathers and
// reduce-scatters have the analytic volume (tests/dist/layout_check.h). And the sharded
// init: no rank materializes the whole model, yet the shards are its buffers bit for bit.
#include <gtest/gtest.h>

#include "dist_testing.h"
#include "layout_check.h"
#include "models/gpt.h"
#include "nn/flat.h"

using namespace ndt;

namespace {

using ndt::testing::check_layout;
using ndt::testing::odd_sized_gpt;

TEST(DistFSDP, FullyShardedEqualsOneProcess) { check_layout({"fsdp", 1, -1}, false); }
TEST(DistFSDP, FullyShardedWithActivationCheckpointing) { check_layout({"fsdp", 1, -1}, true); }

TEST(DistFSDP, ShardedInitEqualsTheWholeModel) {
  // no rank materializes the model: each draws its shard, and the shards put together
  // are the single process's buffers, bit for bit
  auto world = ndt::testing::world();
  models::GPT a(odd_sized_gpt()), b(odd_sized_gpt());
  nn::FlatParams whole = nn::materialize(a.units(), Device::cpu(), DType::f32, 99);
  nn::FlatParams mine =
      nn::materialize(b.units(), Device::cpu(), DType::f32, 99, nn::ShardSpec{world->rank(), world->size()});
  for (size_t i = 0; i < mine.units.size(); ++i) {
    const nn::FlatUnit& u = mine.units[i];
    EXPECT_FALSE(u.full.impl().storage->allocated()) << "the whole buffer is not allocated";
    Tensor all = Tensor::zeros({u.padded_numel});
    world->all_gather(all, u.data)->wait();
    EXPECT_EQ(all.narrow(0, 0, u.numel).to_vector<float>(), whole.units[i].data.to_vector<float>()) << u.name;
  }
}

}  // namespace
