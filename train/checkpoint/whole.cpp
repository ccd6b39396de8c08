#include "train/checkpoint/whole.h"

#include "dist/pipeline_parallel/stages.h"
#include "train/checkpoint/lora.h"
#include "train/checkpoint/sharded.h"
#include "train/io/safetensors.h"

namespace ndt::ckpt {
namespace {

// What a run trains: its adapters (LoRA), or its model's parameters (experts_apart: as
// models::GPT::units lays them out under expert parallelism inside FSDP)
std::vector<nn::UnitSpec> trained_units(const models::GPT& gpt, bool experts_apart = false) {
  return gpt.has_lora() ? gpt.adapter_units() : gpt.units(experts_apart);
}

// the single-process layout, on the CPU (its initial values are overwritten); LoRA (`lora`
// on): the adapters'
std::unique_ptr<WholeModel> empty_whole(const models::GPTConfig& mc, const nn::LoraConfig& lora,
                                        const optim::AdamW* opt) {
  auto w = std::make_unique<WholeModel>();
  w->gpt = std::make_unique<models::GPT>(mc);
  if (lora.on()) w->gpt->add_lora(lora);
  w->params = nn::materialize(trained_units(*w->gpt), Device::cpu(), DType::f32, 0);
  for (const nn::FlatUnit& u : w->params.units) {
    w->moments.m.push_back(Tensor::zeros({u.numel}, DType::f32));
    w->moments.v.push_back(Tensor::zeros({u.numel}, DType::f32));
  }
  w->moments.steps = opt ? opt->steps_taken() : 0;
  return w;
}

// One parameter whole, with its moments (undefined without them), on the CPU.
struct WholeParam {
  Tensor value, m, v;
};

// Which of w's units holds `name`, and where.
std::pair<size_t, const nn::FlatParam*> locate(const WholeModel& w, const std::string& name) {
  for (size_t i = 0; i < w.params.units.size(); ++i)
    for (const nn::FlatParam& p : w.params.units[i].params)
      if (p.spec.name == name) return {i, &p};
  NDT_FAIL("gather_whole: ", name, " is not in the single-process model");
}

void put(WholeModel& w, const std::string& name, const WholeParam& p) {
  const auto [i, wp] = locate(w, name);
  wp->value.copy_(p.value.view(wp->spec.shape));
  if (p.m.defined()) w.moments.m[i].narrow(0, wp->offset, p.m.numel()).copy_(p.m.view({p.m.numel()}));
  if (p.v.defined()) w.moments.v[i].narrow(0, wp->offset, p.v.numel()).copy_(p.v.view({p.v.numel()}));
}

// The parameters of pipeline stage `stage` in the order its lead sends them: its units'
// buffer order (nn::flat_layout), as the stage describes them (models::PipelinePart).
std::vector<nn::ParamSpec> stage_params(const models::GPTConfig& mc, const dist::ParallelModel& pm,
                                        int64_t stage) {
  const int64_t p = pm.mesh().dims().pp;
  models::GPT part(mc, dist::pipeline_part(pm.pp_blocks, p, stage));
  if (pm.gpt().has_lora()) part.add_lora(pm.gpt().lora_config);
  std::vector<nn::ParamSpec> out;
  for (const nn::FlatUnit& u : nn::flat_layout(trained_units(part, pm.mesh().dims().experts_apart())))
    for (const nn::FlatParam& fp : u.params) out.push_back(fp.spec);
  return out;
}

}  // namespace

// Within a stage: each unit whole over the FSDP group, each parameter whole over the tp
// group, kept by the stage's lead. Under pipeline parallelism the stages' leads (the ranks
// with coordinate 0 in every other dimension: the pipeline group of rank 0) then send theirs
// to rank 0, one parameter at a time in their buffer order.
std::unique_ptr<WholeModel> gather_whole(const models::GPTConfig& mc, const dist::ParallelModel& pm,
                                         const optim::AdamW* opt, bool keep, bool grads) {
  const bool moments = opt && !grads;
  const dist::DeviceMesh& mesh = pm.mesh();
  const dist::ParallelDims::Coords& x = mesh.coords();
  const bool pipelined = mesh.dims().pp > 1;
  const bool stage_lead = x.replicate == 0 && x.shard == 0 && x.cp == 0 && x.sp == 0 && x.tp == 0;
  const bool collect = keep || (pipelined && stage_lead);
  std::vector<std::pair<std::string, WholeParam>> mine;  // this stage's, on its lead
  for (size_t i = 0; i < pm.params.units.size(); ++i) {
    const nn::FlatUnit& u = pm.params.units[i];
    // this rank's whole unit buffers (every rank of the FSDP group takes part) ...
    auto whole_unit = [&](const Tensor& shard) { return pm.whole_buffer(u, shard); };
    const Tensor data = whole_unit(grads ? u.grad : u.data);
    const Tensor m = moments ? whole_unit(opt->m()[i]) : Tensor(),
                 v = moments ? whole_unit(opt->v()[i]) : Tensor();
    // ... then each parameter whole (every rank of the tp group takes part)
    for (const nn::FlatParam& p : u.params) {
      const int64_t n = numel_of(p.spec.shape);
      auto whole_param = [&](const Tensor& buf) {
        Tensor local = buf.narrow(0, p.offset, n).view(p.spec.shape);
        const Tensor whole = pm.whole_param(p.spec, local);  // collective
        return collect ? whole.to(Device::cpu()) : whole;    // only the collecting rank needs it on the host
      };
      WholeParam wp{whole_param(data), moments ? whole_param(m) : Tensor(),
                    moments ? whole_param(v) : Tensor()};
      if (collect) mine.push_back({p.spec.name, std::move(wp)});
    }
  }
  std::unique_ptr<WholeModel> w = keep ? empty_whole(mc, pm.gpt().lora_config, opt) : nullptr;
  if (w)
    for (const auto& [name, p] : mine) put(*w, name, p);
  if (!pipelined || !stage_lead) return w;
  dist::Communicator& pp = mesh.pp();
  if (pp.rank() != 0) {  // a stage's lead: its parameters to rank 0, in order
    for (const auto& [name, p] : mine)
      for (const Tensor& t : {p.value, p.m, p.v})
        if (t.defined()) pp.send(t.to(pp.device()), 0)->wait();
    return w;
  }
  for (int64_t s = 1; s < pp.size(); ++s)
    for (const nn::ParamSpec& spec : stage_params(mc, pm, s)) {
      WholeParam p;
      for (Tensor* t : {&p.value, &p.m, &p.v}) {
        if (t != &p.value && !moments) continue;
        Tensor in = Tensor::empty(spec.global_shape(), DType::f32, pp.device());
        pp.recv(in, static_cast<int>(s))->wait();
        *t = in.to(Device::cpu());
      }
      if (w) put(*w, spec.name, p);
    }
  return w;
}

void write_whole_grads(const std::string& path, const models::GPTConfig& mc, const dist::ParallelModel& pm,
                       const std::string& layout, dist::Communicator& world) {
  const bool lead = world.rank() == 0;
  // (LoRA: the adapters' gradients)
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

std::string save_run(const std::string& dir, bool sharded, int keep, const TrainState& st,
                     const models::GPTConfig& mc, const dist::ParallelModel& pm, const optim::AdamW& opt,
                     PruneLog* prune_log) {
  const bool lora = pm.gpt().has_lora();  // adapters: gathered whole onto rank 0 in either format
  if (sharded && !lora)
    return save_sharded(dir, st, pm.params, opt, pm.mesh(), mc, pm.pp_blocks, keep, prune_log);
  dist::Communicator& world = pm.mesh().world();
  const bool lead = world.rank() == 0;  // the others wait, so that a failed write stops every rank
  std::unique_ptr<WholeModel> w = gather_whole(mc, pm, &opt, /*keep=*/lead, /*grads=*/false);
  std::string where, error;
  if (lead) {
    try {
      where = save_checkpoint(dir, *w->gpt, w->params, w->moments, st, keep, prune_log);
    } catch (const std::exception& e) {
      error = e.what();
    }
  }
  if (world.all_reduce_scalar(error.empty() ? 0.0 : 1.0, dist::ReduceOp::kMax) > 0)
    throw Error(lead ? error : "rank 0 failed to write the checkpoint of step " + std::to_string(st.step));
  return where;
}

bool writes_checkpoints(bool sharded, const dist::DeviceMesh& mesh) {  // LoRA: sharded = false
  return sharded ? mesh.coords().replicate == 0 : mesh.world().rank() == 0;
}

TrainState resume_run(const std::string& path, const models::GPTConfig& mc, const models::GPT& gpt,
                      dist::ParallelModel& pm, optim::AdamW& opt, std::ostream* warn) {
  TrainState st;
  NDT_CHECK(gpt.has_lora() || !is_lora_checkpoint(path), "checkpoint ", path,
            " holds LoRA adapters; resume it with its [lora] settings and model.init_from");
  if (gpt.has_lora()) {  // the adapters whole on the host, then this rank's elements of them
    const WholeAdapters w = whole_adapters(mc, gpt.lora_config);
    Moments m;
    st = load_checkpoint(path, *w.gpt, w.params, m);
    scatter_adapters(w.params, m.m, m.v, pm.params, opt.m(), opt.v());
    opt.set_steps_taken(m.steps);
  } else if (is_sharded(path)) {  // the writers' shards, whatever their layout
    st = load_sharded(path, mc, pm.params, opt, warn);
  } else {  // the single-process layout; each rank reads only its elements
    const std::vector<nn::FlatUnit> whole = nn::flat_layout(models::GPT(mc).units());
    int64_t adam_steps = 0;
    st = load_checkpoint_local(path, gpt, pm.params, whole, opt.m(), opt.v(), &adam_steps);
    opt.set_steps_taken(adam_steps);
  }
  pm.params.refresh_compute();  // mixed precision: the copies the model computes with
  return st;
}

}  // namespace ndt::ckpt
