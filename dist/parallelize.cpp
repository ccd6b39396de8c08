#include "dist/parallelize.h"

#include <algorithm>
#include <cmath>
#include <string>

#include "autograd/node.h"
#include "dist/adapters.h"
#include "dist/data_parallel.h"
#include "dist/expert_parallel/expert_parallel.h"
#include "dist/tensor_parallel/comm.h"
#include "dist/tensor_parallel/tensor_parallel.h"
#include "nn/moe.h"

namespace ndt::dist {

void check_parallel_model(const models::GPTConfig& cfg, const ParallelDims& dims, int64_t seq_len,
                          bool sequence_parallel) {
  check_expert_parallel(cfg, dims);
  // tensor parallelism's heads first, then Ulysses' share of them (and of the cp rank's tokens)
  if (dims.tp > 1) check_tensor_parallel(cfg, dims.tp);
  if (dims.cp > 1) check_context_parallel(seq_len, dims.cp);
  if (dims.sp > 1) check_ulysses(cfg, seq_len, dims.sp, dims.tp, dims.cp);
  if (dims.tp > 1 && sequence_parallel) check_sequence_parallel(seq_len, dims.cp, dims.tp, dims.sp);
}

PipelineLayout plan_layout(const models::GPTConfig& cfg, const ParallelDims& dims,
                           const ParallelConfig& parallel, int64_t seq_len, int64_t micro_batches,
                           double block_cost) {
  check_parallel_model(cfg, dims, seq_len, parallel.sequence_parallel);
  return plan_pipeline(cfg, block_cost,
                       {.stages = dims.pp,
                        .chunks = parallel.pp_virtual,
                        .schedule = parallel.pp_schedule,
                        .split = parallel.pp_split,
                        .micro_batches = micro_batches});
}

models::PipelinePart model_part(const PipelineLayout& layout, const DeviceMesh& mesh) {
  return layout.part(mesh.coords().pp);
}

namespace {

// This rank's shard of every buffer: of the FSDP group's; the units of experts (expert
// parallelism inside FSDP) of the FSDP ranks' that hold the same experts.
nn::ShardSpec shard_spec(const DeviceMesh& mesh) {
  nn::ShardSpec s{mesh.fsdp_rank(), mesh.dims().fsdp()};
  if (mesh.dims().experts_apart()) s.experts = {mesh.ep_shard().rank(), mesh.ep_shard().size()};
  return s;
}
ExpertGroups expert_groups(const DeviceMesh& mesh) {
  if (!mesh.dims().experts_apart()) return {};
  return {&mesh.ep_shard(), &mesh.ep_replicate()};
}

// LoRA's steps 4 and 5: the base frozen in this rank's shard of every buffer (FSDP's gatherer
// around each block when sharded), the adapters whole (TP: split with their linears, step 1);
// their strategy (dist/adapters.h).
std::unique_ptr<Strategy> lora_memory(models::GPT& gpt, const DeviceMesh& mesh, const ParallelizeOptions& o,
                                      ParallelModel& pm) {
  const ParallelDims& dims = mesh.dims();
  pm.base = nn::materialize(gpt.units(dims.experts_apart()), o.device, DType::f32, o.seed, shard_spec(mesh),
                            o.compute_dtype, /*frozen=*/true);
  pm.params = nn::materialize(gpt.adapter_units(), o.device, DType::f32, o.seed, {}, o.compute_dtype);
  std::unique_ptr<FullyShardedDataParallel> gather;
  if (dims.sharded()) {
    gather = std::make_unique<FullyShardedDataParallel>(pm.base, mesh.fsdp(), nullptr, std::nullopt, nullptr,
                                                        /*frozen=*/true, expert_groups(mesh));
    gather->set_trace(o.trace);
    gather->set_reshard_after_forward(o.reshard_after_forward);
    gpt.add_block_wrapper(gather->wrapper());  // outermost
  }
  Communicator* tp = dims.tp > 1 ? &mesh.tp() : nullptr;
  return std::make_unique<AdapterParallel>(pm.params, adapter_data_group(mesh), tp, std::move(gather));
}

// lora.dropout under context parallelism and Ulysses: a rank holds pieces of every row, and
// the mask's key takes their positions in the row (nn::LoraDropout), those the positions hook
// of CP and Ulysses gives the rotary and learned embeddings, without documents: packed rows'
// documents restart the model's positions, not the row's.
void place_lora_dropout(models::GPT& gpt, const ParallelizeOptions& o, int64_t pieces) {
  const int64_t L = o.seq_len / pieces;  // this rank's tokens of a row
  const Tensor pos = gpt.positions(Tensor::empty({1, L}, DType::i32, o.device), 0, Tensor());  // (1, L)
  gpt.lora_dropout->positions = pos.reshape({L});
  gpt.lora_dropout->seq_len = o.seq_len;
}

}  // namespace

std::unique_ptr<ParallelModel> parallelize(models::GPT& gpt, const DeviceMesh& mesh,
                                           const ParallelizeOptions& o) {
  const ParallelDims& dims = mesh.dims();
  auto pm = std::make_unique<ParallelModel>();
  pm->mesh_ = &mesh;
  // 1-2: the description is split; nothing is allocated yet
  pm->split_.sequence_parallel = dims.tp > 1 && o.sequence_parallel;
  if (dims.tp > 1) apply_tensor_parallel(gpt, mesh.tp(), &pm->split_);
  if (dims.cp > 1) pm->cp_ = std::make_unique<ContextParallel>(gpt, mesh.cp(), o.seq_len, &pm->split_);
  // the all-to-alls; each rank's parameters are its experts (FSDP: shards of them, in units apart)
  if (dims.ep > 1) apply_expert_parallel(gpt, mesh.ep());
  if (dims.sp > 1)  // inside the ring (USP) when cp > 1: it wraps CP's attention and positions
    pm->sp_ = std::make_unique<Ulysses>(gpt, mesh.sp(), o.seq_len, &pm->split_, dims.tp, dims.cp);
  if (gpt.cfg.moe()) pm->reduce_router_stats(gpt);
  if (gpt.lora_dropout && dims.cp * dims.sp > 1) place_lora_dropout(gpt, o, dims.cp * dims.sp);
  // 3: wrappers compose inside out, the first installed runs innermost
  if (o.ac != nn::ACMode::none) gpt.add_block_wrapper(nn::activation_checkpointing(o.ac, o.ac_every));
  if (o.trace && !dims.sharded())  // FSDP traces its units itself
    gpt.add_block_wrapper([trace = o.trace](int64_t i, const nn::BlockFn& fn, const Tensor& x) {
      Trace::Scope s(trace, "forward h." + std::to_string(i), Trace::kCompute);
      return fn(x);
    });
  // 4: this rank's shard of every buffer (all of it without FSDP); LoRA: 4 and 5 its own way
  if (gpt.has_lora())
    pm->strategy = lora_memory(gpt, mesh, o, *pm);
  else
    pm->params = nn::materialize(gpt.units(dims.experts_apart()), o.device, DType::f32, o.seed,
                                 shard_spec(mesh), o.compute_dtype);
  // 5: who reduces the gradients; the global norm also sums over the tp group
  Communicator* tp = dims.tp > 1 ? &mesh.tp() : nullptr;
  if (pm->strategy) {
    // LoRA's (lora_memory)
  } else if (dims.sharded()) {
    auto f =
        std::make_unique<FullyShardedDataParallel>(pm->params, mesh.fsdp(), &mesh.replicate(), o.reduce_dtype,
                                                   tp, /*frozen=*/false, expert_groups(mesh));
    f->set_trace(o.trace);
    f->set_reshard_after_forward(o.reshard_after_forward);
    gpt.add_block_wrapper(f->wrapper());  // outermost
    pm->fsdp_ = f.get();
    pm->strategy = std::move(f);
  } else if (dims.dp_replicate > 1) {
    pm->strategy = std::make_unique<DataParallel>(pm->params, mesh.replicate(), tp,
                                                  dims.ep > 1 ? &mesh.ep_data() : nullptr);
  } else {
    pm->strategy = std::make_unique<NoParallelism>(pm->params, tp);
  }
  pm->strategy->read_sequence_split(&pm->split_);
  // the global norm sums over the FSDP group: the other ep ranks' experts, when they lie outside it
  const bool ep_in_fsdp = dims.sharded() && dims.dp_shard > 1;
  if (dims.ep > 1 && !ep_in_fsdp) pm->strategy->read_experts(&mesh.ep());
  // 6: the step's schedule over this rank's chunks (one stage: plain gradient accumulation)
  if (dims.pp > 1) pm->join_pipeline_ends(gpt, mesh, o.trace);
  pm->gpt_ = &gpt;
  pm->device_ = o.device;
  pm->pp_blocks = o.layout.blocks;
  const int64_t C = gpt.cfg.n_embd, tp_size = dims.tp;
  SequenceSplit* split = &pm->split_;
  auto io_shape = [C, tp_size, split](const Tensor& idx) -> Shape {  // what travels between stages
    return {idx.size(0), idx.size(1) / (split->sequence_parallel_now() ? tp_size : 1), C};
  };
  pm->step_ = std::make_unique<Pipeline>(gpt, mesh.pp(), *pm->strategy, o.layout.schedule, io_shape,
                                         o.compute_dtype.value_or(DType::f32), o.trace);
  return pm;
}

// The tied embeddings' gradients: summed between the first and the last stage; in the
// norm, each end's counts half.
void ParallelModel::join_pipeline_ends(const models::GPT& gpt, const DeviceMesh& mesh, Trace* trace) {
  const ParallelDims& dims = mesh.dims();
  const models::PipelinePart& part = gpt.part();
  const bool ends = part.first || part.last;
  tied_ends_ = gpt.cfg.tied() && ends && !gpt.has_lora();  // LoRA: the embeddings are frozen
  ends_ = mesh.pp().split(ends ? 0 : 1, part.first ? 0 : 1, "pp_ends");
  if (ends) {  // members: the first stage, the last; counted like the mesh's groups
    std::vector<bool> remote;
    for (const int64_t stage : {int64_t(0), dims.pp - 1}) {
      ParallelDims::Coords c = mesh.coords();
      c.pp = stage;
      remote.push_back(mesh.hosts()[static_cast<size_t>(dims.rank_of(c))] !=
                       mesh.hosts()[static_cast<size_t>(dims.rank_of(mesh.coords()))]);
    }
    ends_->set_remote_members(std::move(remote));
    ends_->set_description("the pipeline's first and last stage (the tied embeddings' sum)");
    ends_->set_trace(trace);
  }
  strategy->read_pipeline(&mesh.pp(), tied_ends_ ? 0.5 : 1.0);
}

std::vector<Pipeline::Batch> ParallelModel::local(const std::vector<Batch>& batches) const {
  std::vector<Pipeline::Batch> out;
  // CP: this rank's two chunks of each sequence (SP: its part); the documents of the whole rows
  // (the attention's masks and the positions need the documents of other ranks' parts)
  for (const Batch& b : batches) {
    out.push_back({sequence_part(b.inputs).to(device_), sequence_part(b.targets).to(device_),
                   b.docs.defined() ? b.docs.to(device_) : Tensor()});
  }
  return out;
}

Tensor ParallelModel::sequence_part(const Tensor& tokens) const {
  const Tensor part = cp_ ? cp_->local(tokens) : tokens;  // CP: its two chunks
  return sp_ ? sp_->local(part) : part;                   // SP: its contiguous part of them
}

// Mixture-of-experts layers: the routers' statistics summed over the ranks that hold parts of the
// micro-step's batch (the data ranks' micro-batches, the cp and sp ranks' parts of the
// sequences, tp's under sequence parallelism), so that the load-balancing loss is the whole
// batch's, as one process computes it (nn/moe.h)
void ParallelModel::reduce_router_stats(models::GPT& gpt) const {
  std::vector<Communicator*> groups = sequence_groups();
  if (mesh_->dp().size() > 1) groups.push_back(&mesh_->dp());  // the data ranks' micro-batches
  double ranks = 1;  // the gradients are averaged over these ranks (summed over tp: strategy.h)
  for (Communicator* g : groups) ranks *= g->size();
  if (split_.sequence_parallel) groups.push_back(&mesh_->tp());  // tp's parts of the sequence
  if (groups.empty()) return;
  gpt.router_grad_scale = ranks;
  gpt.reduce_router_stats = [groups](nn::RouterLoss& s) {
    std::vector<double> v;  // every layer's rows, counts and probability sums, in one buffer
    for (const auto& [i, l] : s.layers) {
      v.push_back(static_cast<double>(l.rows));
      for (int64_t c : l.counts) v.push_back(static_cast<double>(c));
      v.insert(v.end(), l.prob_sums.begin(), l.prob_sums.end());
      v.push_back(l.z_sum);
    }
    for (Communicator* g : groups) {
      Tensor t = Tensor::from_vector(v, {static_cast<int64_t>(v.size())}).to(g->device());
      g->note_unit("router statistics");
      g->all_reduce(t, ReduceOp::kSum)->wait();
      v = t.to_vector<double>();
    }
    size_t at = 0;
    for (auto& [i, l] : s.layers) {
      l.rows = std::llround(v[at++]);
      for (int64_t& c : l.counts) c = std::llround(v[at++]);
      for (double& p : l.prob_sums) p = v[at++];
      l.z_sum = v[at++];
    }
  };
}

std::vector<Communicator*> ParallelModel::sequence_groups() const {
  std::vector<Communicator*> groups;
  if (cp_) groups.push_back(&mesh_->cp());
  if (sp_) groups.push_back(&mesh_->sp());
  return groups;
}

// (every rank alike: whether the data has documents is its preparation's, one for every rank)
void ParallelModel::weigh_by_trained_tokens(const std::vector<Batch>& batches,
                                            std::vector<Pipeline::Batch>& out) const {
  if (batches.empty() || !batches.front().docs.defined()) return;
  std::vector<double> trained;
  double here = 0;
  for (const Batch& b : batches) {  // this rank's tokens (CP: its chunks; SP: its part)
    const Tensor mine = sequence_part(b.targets);
    const std::vector<int32_t> t = mine.to(Device::cpu()).to_vector<int32_t>();
    trained.push_back(
        static_cast<double>(std::count_if(t.begin(), t.end(), [](int32_t v) { return v != -1; })));
    here += trained.back();
  }
  // the gradients and the loss are averaged over the data, the cp and the sp ranks
  int64_t seq_ranks = 1;
  for (Communicator* seq : sequence_groups()) {
    here = seq->all_reduce_scalar(here, ReduceOp::kSum);
    seq_ranks *= seq->size();
  }
  const double all = mesh_->dp().all_reduce_scalar(here, ReduceOp::kSum);
  const double per =
      static_cast<double>(batches.size()) * static_cast<double>(mesh_->dp().size() * seq_ranks);
  for (size_t i = 0; i < out.size(); ++i) out[i].weight = all > 0 ? trained[i] * per / all : 0.0;
}

double ParallelModel::train(const std::vector<Batch>& micro, const std::function<void(int64_t)>& on_action) {
  params.zero_grad();
  const double m = static_cast<double>(micro.size());
  std::vector<Pipeline::Batch> here = local(micro);
  weigh_by_trained_tokens(micro, here);
  const double loss_sum = step_->train(here, 1.0 / m, on_action);  // mean over micro-batches
  end_accumulation();
  // MoE: the load-balancing part of the loss, for the log (every rank has it, or none; a
  // pipeline's last stage only)
  auto logged = [&](double v, double coef) {  // -1: not logged (a dense model, or the coef 0)
    if (!gpt_->cfg.moe() || coef == 0) return -1.0;
    if (step_->schedule().p > 1) v = mesh_->pp().all_reduce_scalar(std::max(v, 0.0), ReduceOp::kSum);
    return mean_over_ranks(v);
  };
  aux_loss_ = logged(gpt_->take_aux_loss(), gpt_->cfg.router_aux_loss_coef);
  z_loss_ = logged(gpt_->take_z_loss(), gpt_->cfg.router_z_loss_coef);
  return mean_over_ranks(loss_sum / m);
}

double ParallelModel::evaluate(const std::vector<Batch>& batches) {
  autograd::NoGradGuard no_grad;
  strategy->begin_forward_only();
  std::vector<Pipeline::Batch> here = local(batches);
  weigh_by_trained_tokens(batches, here);
  gpt_->training = false;  // the cross-entropy alone
  const double loss_sum = step_->evaluate(here);
  gpt_->training = true;
  strategy->end_forward_only();
  return mean_over_ranks(loss_sum / static_cast<double>(batches.size()));
}

// Every rank draws the same tokens (the same seed): sharded or tensor-parallel, each takes
// part in the collectives; otherwise (DP, CP: each runs the whole sequence here) each samples
// on its own. A pipeline's stages run their blocks in turn and the last one's logits come back.
std::vector<int32_t> ParallelModel::generate(const std::vector<int32_t>& prompt,
                                             const models::SampleOptions& o) {
  strategy->begin_forward_only();
  split_.active = false;  // whole sequences: CP's chunks and sequence parallelism's parts off
  models::LogitsFn through_stages;
  if (step_->schedule().p > 1)
    through_stages = [this](const Tensor& idx, int64_t pos_offset) {
      return step_->next_token_logits(idx, pos_offset);
    };
  // under expert parallelism every rank takes rank 0's tokens: with each rank's experts
  // computing other ranks' rows the ranks' logits need not agree to the bit (elsewhere they do,
  // and the ranks sample without waiting for each other)
  models::SampleOptions same = o;
  if (Communicator& world = mesh_->world(); mesh_->dims().ep > 1)
    same.agree = [this, &world](int32_t token) {
      const Tensor t = Tensor::from_vector<int32_t>({token}, {1}, device_);
      world.broadcast(t, 0)->wait();
      return t.to_vector<int32_t>()[0];
    };
  std::vector<int32_t> ids = models::generate(*gpt_, prompt, same, device_, {}, through_stages);
  split_.active = true;
  strategy->end_forward_only();
  return ids;
}

void ParallelModel::end_accumulation() {
  strategy->end_accumulation();
  if (!tied_ends_) return;
  // wte's gradient from the embedding (first stage) and from the logits (last stage); the
  // unit is the same on both (its other parameters got gradients on one end only)
  const nn::FlatUnit& u = params.units.front();
  ends_->note_unit(u.name);
  ends_->all_reduce(u.grad, ReduceOp::kSum)->wait();
}

int64_t ParallelModel::bytes_sent() const {
  return mesh_->bytes_sent() + (ends_ ? ends_->stats().total_bytes() : 0);
}

int64_t ParallelModel::bytes_across_hosts() const {
  return mesh_->bytes_across_hosts() + (ends_ ? ends_->stats().across_hosts : 0);
}

double ParallelModel::mean_over_ranks(double loss) const {
  loss = mesh_->dp().all_reduce_scalar(loss, ReduceOp::kAvg);
  for (Communicator* seq : sequence_groups()) loss = seq->all_reduce_scalar(loss, ReduceOp::kAvg);
  return loss;
}

Tensor ParallelModel::whole_buffer(const nn::FlatUnit& u, const Tensor& shard) const {
  return fsdp_ ? fsdp_->gather_buffer(u, shard) : shard;
}

Tensor ParallelModel::whole_param(const nn::ParamSpec& spec, const Tensor& local) const {
  if (spec.tp.experts) return gather_param(spec, local, mesh_->ep());  // expert parallelism's slice
  return mesh_->dims().tp > 1 ? gather_param(spec, local, mesh_->tp()) : local;
}

}  // namespace ndt::dist
