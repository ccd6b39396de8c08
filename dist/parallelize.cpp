#include "dist/parallelize.h"

#include <string>

#include "dist/data_parallel.h"
#include "dist/tensor_parallel/comm.h"
#include "dist/tensor_parallel/tensor_parallel.h"

namespace ndt::dist {

void check_parallel_model(const models::GPTConfig& cfg, const ParallelDims& dims, int64_t seq_len,
                          bool sequence_parallel, int64_t pp_virtual) {
  NDT_CHECK(dims.pp * pp_virtual <= cfg.n_layer, "parallel.pp_size", pp_virtual > 1 ? " x parallel.pp_virtual = " : " = ",
            dims.pp * pp_virtual, " pipeline stages need at least as many blocks, but model.n_layer is ", cfg.n_layer);
  if (dims.tp > 1) check_tensor_parallel(cfg, dims.tp);
  if (dims.cp > 1) check_context_parallel(seq_len, dims.cp);
  if (dims.tp > 1 && sequence_parallel) check_sequence_parallel(seq_len, dims.cp, dims.tp);
}

std::unique_ptr<ParallelModel> parallelize(models::GPT& gpt, const DeviceMesh& mesh,
                                           const ParallelizeOptions& o) {
  const ParallelDims& dims = mesh.dims();
  auto pm = std::make_unique<ParallelModel>();
  pm->mesh_ = &mesh;
  // 1-2: the description is split; nothing is allocated yet
  pm->split_.sequence_parallel = dims.tp > 1 && o.sequence_parallel;
  if (dims.tp > 1) apply_tensor_parallel(gpt, mesh.tp(), &pm->split_);
  if (dims.cp > 1) pm->cp_ = std::make_unique<ContextParallel>(gpt, mesh.cp(), o.seq_len, &pm->split_);
  // 3: wrappers compose inside out, the first installed runs innermost
  if (o.ac != nn::ACMode::none) gpt.add_block_wrapper(nn::activation_checkpointing(o.ac, o.ac_every));
  if (o.trace && !dims.sharded())  // FSDP traces its units itself
    gpt.add_block_wrapper([trace = o.trace](int64_t i, const nn::BlockFn& fn, const Tensor& x) {
      Trace::Scope s(trace, "forward h." + std::to_string(i), Trace::kCompute);
      return fn(x);
    });
  // 4: this rank's shard of every buffer (all of it without FSDP)
  pm->params = nn::materialize(gpt.units(), o.device, DType::f32, o.seed,
                               nn::ShardSpec{mesh.fsdp_rank(), dims.fsdp()}, o.compute_dtype);
  // 5: who reduces the gradients; the global norm also sums over the tp group
  Communicator* tp = dims.tp > 1 ? &mesh.tp() : nullptr;
  if (dims.sharded()) {
    auto f = std::make_unique<FullyShardedDataParallel>(pm->params, mesh.fsdp(), &mesh.replicate(),
                                                        o.reduce_dtype, tp);
    f->set_trace(o.trace);
    f->set_reshard_after_forward(o.reshard_after_forward);
    gpt.add_block_wrapper(f->wrapper());  // outermost
    pm->fsdp_ = f.get();
    pm->strategy = std::move(f);
  } else if (dims.dp_replicate > 1) {
    pm->strategy = std::make_unique<DataParallel>(pm->params, mesh.replicate(), tp);
  } else {
    pm->strategy = std::make_unique<NoParallelism>(pm->params, tp);
  }
  pm->strategy->read_sequence_split(&pm->split_);
  // 6: the pipeline over this rank's chunks
  if (dims.pp > 1) {
    const models::PipelinePart& part = gpt.part();
    const bool tied_ends = gpt.cfg.tied() && (part.first || part.last);
    // the tied embeddings' gradients: summed between the two ends; in the norm, each end's counts half
    pm->ends_ = mesh.pp().split(part.first || part.last ? 0 : 1, part.first ? 0 : 1, "pp_ends");
    if (part.first || part.last) {  // members: the first stage, the last; counted like the mesh's groups
      std::vector<bool> remote;
      for (const int64_t stage : {int64_t(0), dims.pp - 1}) {
        ParallelDims::Coords c = mesh.coords();
        c.pp = stage;
        remote.push_back(mesh.hosts()[static_cast<size_t>(dims.rank_of(c))] !=
                         mesh.hosts()[static_cast<size_t>(dims.rank_of(mesh.coords()))]);
      }
      pm->ends_->set_remote_members(std::move(remote));
      pm->ends_->set_description("the pipeline's first and last stage (the tied embeddings' sum)");
      pm->ends_->set_trace(o.trace);
    }
    pm->strategy->read_pipeline(&mesh.pp(), tied_ends ? 0.5 : 1.0);
    pm->tied_ends_ = tied_ends;
    pm->pp_blocks = o.pp_blocks;
    const int64_t C = gpt.cfg.n_embd, tp = dims.tp;
    SequenceSplit* split = &pm->split_;
    auto io_shape = [C, tp, split](const Tensor& idx) -> Shape {
      const bool sp = split->sequence_parallel && split->active;
      return {idx.size(0), idx.size(1) / (sp ? tp : 1), C};
    };
    const int64_t v = static_cast<int64_t>(part.chunks.size());
    pm->pipeline = std::make_unique<Pipeline>(
        gpt, mesh.pp(), *pm->strategy,
        pp::make_schedule(pp::parse_kind(o.pp_schedule), static_cast<int>(dims.pp), static_cast<int>(o.micro_batches),
                          static_cast<int>(v)),
        io_shape, o.compute_dtype.value_or(DType::f32), o.trace);
  }
  return pm;
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

std::vector<Communicator*> ParallelModel::own_communicators() const {
  if (!ends_) return {};
  return {ends_.get()};
}

Tensor ParallelModel::local(const Tensor& tokens) const { return cp_ ? cp_->local(tokens) : tokens; }

double ParallelModel::mean_over_ranks(double loss) const {
  loss = mesh_->dp().all_reduce_scalar(loss, ReduceOp::kAvg);
  return cp_ ? mesh_->cp().all_reduce_scalar(loss, ReduceOp::kAvg) : loss;
}

bool ParallelModel::forward_is_collective() const { return fsdp_ || mesh_->dims().tp > 1 || pipeline; }

void ParallelModel::split_sequences(bool on) { split_.active = on; }

Tensor ParallelModel::whole_buffer(const nn::FlatUnit& u, const Tensor& shard) const {
  return fsdp_ ? fsdp_->gather_buffer(u, shard) : shard;
}

Tensor ParallelModel::whole_param(const nn::ParamSpec& spec, const Tensor& local) const {
  return mesh_->dims().tp > 1 ? gather_param(spec, local, mesh_->tp()) : local;
}

}  // namespace ndt::dist
