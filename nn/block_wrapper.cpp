#include "nn/block_wrapper.h"

#include "autograd/recompute.h"

namespace ndt::nn {

namespace {
// Set while a block wrapped by selective checkpointing runs its forward on this thread.
thread_local bool t_selective = false;

class SelectiveScope {
 public:
  explicit SelectiveScope(bool on) : prev_(t_selective) { t_selective = on; }
  ~SelectiveScope() { t_selective = prev_; }
  SelectiveScope(const SelectiveScope&) = delete;
  SelectiveScope& operator=(const SelectiveScope&) = delete;

 private:
  bool prev_;
};
}  // namespace

ACMode block_checkpointing(ACMode mode, int64_t every, int64_t block) {
  return block % every == 0 ? mode : ACMode::none;
}

BlockWrapper activation_checkpointing(int64_t every) { return activation_checkpointing(ACMode::full, every); }

BlockWrapper activation_checkpointing(ACMode mode, int64_t every) {
  NDT_CHECK(every >= 1, "activation_checkpointing: every must be >= 1, got ", every);
  switch (mode) {
    case ACMode::none:
      return [](int64_t, const BlockFn& fn, const Tensor& x) { return fn(x); };
    case ACMode::full:
      return [every](int64_t block, const BlockFn& fn, const Tensor& x) {
        if (block_checkpointing(ACMode::full, every, block) == ACMode::none) return fn(x);
        // fn is copied: backward recomputes it long after this call returned
        return autograd::recompute(
            [fn](const std::vector<Tensor>& in) { return std::vector<Tensor>{fn(in[0])}; }, {x})[0];
      };
    case ACMode::selective:
      return [every](int64_t block, const BlockFn& fn, const Tensor& x) {
        if (block_checkpointing(ACMode::selective, every, block) == ACMode::none) return fn(x);
        SelectiveScope scope(true);  // the block's layers see it in recompute_selected()
        return fn(x);
      };
  }
  NDT_CHECK(false, "activation_checkpointing: unknown mode ", static_cast<int>(mode));
  return {};
}

Tensor recompute_selected(const std::function<Tensor(const Tensor&)>& fn, const Tensor& x) {
  if (!t_selective) return fn(x);
  // fn is copied (backward recomputes it after this call returned) and runs outside the
  // scope, in forward and in the recompute alike: nothing inside it is checkpointed twice.
  return autograd::recompute(
      [fn](const std::vector<Tensor>& in) {
        SelectiveScope plain(false);
        return std::vector<Tensor>{fn(in[0])};
      },
      {x})[0];
}

BlockFn wrap_block(const std::vector<BlockWrapper>& wrappers, int64_t block, BlockFn fn) {
  for (const BlockWrapper& w : wrappers)
    fn = [w, block, inner = std::move(fn)](const Tensor& x) { return w(block, inner, x); };
  return fn;
}

std::string describe_checkpointing(ACMode mode, int64_t every) {
  if (mode == ACMode::none) return "";
  return std::string(mode == ACMode::full ? "full (the whole block recomputed in backward)"
                                          : "selective (the attention core recomputed in backward)") +
         (every == 1 ? " in every block"
                     : " in blocks 0, " + std::to_string(every) + ", " + std::to_string(2 * every) + ", ...");
}

}  // namespace ndt::nn
