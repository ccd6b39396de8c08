#include "train/checkpoint/whole.h"

#include "train/io/safetensors.h"

namespace ndt::ckpt {
namespace {

// the single-process layout, on the CPU (its initial values are overwritten)
std::unique_ptr<WholeModel> empty_whole(const models::GPTConfig& mc, const optim::AdamW* opt) {
  auto w = std::make_unique<WholeModel>();
  w->gpt = std::make_unique<models::GPT>(mc);
  w->params = nn::materialize(w->gpt->units(), Device::cpu(), DType::f32, 0);
  for (const nn::FlatUnit& u : w->params.units) {
    w->moments.m.push_back(Tensor::zeros({u.numel}, DType::f32));
    w->moments.v.push_back(Tensor::zeros({u.numel}, DType::f32));
  }
  w->moments.steps = opt ? opt->steps_taken() : 0;
  return w;
}

}  // namespace

std::unique_ptr<WholeModel> gather_whole(const models::GPTConfig& mc, const dist::ParallelModel& pm,
                                         const optim::AdamW* opt, bool keep, bool grads) {
  const bool moments = opt && !grads;
  std::unique_ptr<WholeModel> w = keep ? empty_whole(mc, opt) : nullptr;
  for (size_t i = 0; i < pm.params.units.size(); ++i) {
    const nn::FlatUnit& u = pm.params.units[i];
    // this rank's whole unit buffers (every rank of the FSDP group takes part) ...
    auto whole_unit = [&](const Tensor& shard) { return pm.whole_buffer(u, shard); };
    const Tensor data = whole_unit(grads ? u.grad : u.data);
    const Tensor m = moments ? whole_unit(opt->m()[i]) : Tensor(), v = moments ? whole_unit(opt->v()[i]) : Tensor();
    // ... then each parameter whole (every rank of the tp group takes part)
    for (const nn::FlatParam& p : u.params) {
      const int64_t n = numel_of(p.spec.shape);
      auto whole_param = [&](const Tensor& buf) {
        Tensor local = buf.narrow(0, p.offset, n).view(p.spec.shape);
        const Tensor whole = pm.whole_param(p.spec, local);  // collective
        return keep ? whole.to(Device::cpu()) : whole;       // only the keeping rank needs it on the host
      };
      const Tensor value = whole_param(data);
      const Tensor mv[2] = {moments ? whole_param(m) : Tensor(), moments ? whole_param(v) : Tensor()};
      if (!keep) continue;
      const nn::FlatParam* wp = w->params.find(p.spec.name);
      NDT_CHECK(wp, "gather_whole: ", p.spec.name, " is not in the single-process model");
      wp->value.copy_(value);
      for (int k = 0; k < 2 && moments; ++k)
        (k ? w->moments.v : w->moments.m)[i].narrow(0, wp->offset, value.numel()).copy_(mv[k].view({value.numel()}));
    }
  }
  return w;
}

void write_whole_grads(const std::string& path, const models::GPTConfig& mc, const dist::ParallelModel& pm,
                       const std::string& layout, dist::Communicator& world) {
  const bool lead = world.rank() == 0;
  std::unique_ptr<WholeModel> w = gather_whole(mc, pm, nullptr, /*keep=*/lead, /*grads=*/true);
  if (lead) {
    io::SafeTensorsWriter out;
    for (const nn::FlatUnit& u : w->params.units)
      for (const nn::FlatParam& p : u.params) out.add("grad." + p.spec.name, p.value);
    out.metadata["layout"] = layout;
    out.write(path);
  }
  world.barrier();
}

}  // namespace ndt::ckpt
