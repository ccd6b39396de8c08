// A plan in words and as JSON (train_gpt --plan, --plan --json): what each rank holds, the
// moments of the step's peak, the bytes per dimension, the pipeline's stages.
#include <cstdio>
#include <nlohmann/json.hpp>
#include <sstream>

#include "train/io/format.h"
#include "train/planner/plan.h"

namespace ndt::train {

namespace {

// "h.0-h.2": the blocks of a stage's chunks, and "+ embeddings", "+ head" at the ends
std::string blocks_of(const std::vector<std::pair<int64_t, int64_t>>& chunks, bool first, bool last) {
  std::string b;
  for (const auto& [begin, end] : chunks) {
    b += (b.empty() ? "h." : ", h.") + std::to_string(begin);
    if (end - begin > 1) b += "-h." + std::to_string(end - 1);
  }
  return (first ? "embeddings, " : "") + b + (last ? ", head" : "");
}

// The pipeline: its schedule and blocks, then one line per stage.
void print_stages(const Plan& p, std::ostream& o) {
  o << "pipeline: " << p.dims.pp << " stages";
  if (p.pp_virtual > 1) o << " x " << p.pp_virtual << " model chunks per rank";
  o << ", schedule " << p.pp_schedule << " over " << p.accum << " micro-batches, blocks per stage";
  for (int64_t b : p.pp_blocks) o << " " << b;
  o << "; activations " << io::format_bytes(double(p.io_bytes)) << " a message\n";
  char line[320];
  std::snprintf(line, sizeof(line), "  %5s  %-26s %11s %11s %11s %4s %11s %11s %11s\n", "stage", "holds",
                "parameters", "persistent", "activations", "held", "held bytes", "peak", "sent");
  o << line;
  for (const PlanStage& x : p.stages) {
    std::snprintf(
        line, sizeof(line), "  %5lld  %-26s %11lld %11s %11s %4lld %11s %11s %11s%s\n", (long long)x.stage,
        blocks_of(x.chunks, x.first, x.last).c_str(), (long long)x.params,
        io::format_bytes(double(x.persistent_bytes)).c_str(),
        io::format_bytes(double(x.micro_activation_bytes)).c_str(), (long long)x.in_flight,
        io::format_bytes(double(x.held_bytes)).c_str(), io::format_bytes(double(x.peak_bytes)).c_str(),
        io::format_bytes(double(x.comm_bytes)).c_str(), x.stage == p.stage ? "  <- planned below" : "");
    o << line;
  }
}

// "; 2 MoE blocks here of 8 experts (top 2, I=1408, shared expert 5632)"
void print_experts(const Plan& p, std::ostream& o) {
  if (p.n_experts == 0) return;
  o << "; " << p.moe_blocks << " MoE blocks here of " << p.n_experts << " experts (top " << p.experts_per_tok
    << ", I=" << p.expert_hidden;
  if (p.shared_hidden > 0) o << ", shared expert " << p.shared_hidden;
  o << ")";
  if (p.dims.ep > 1 && p.ep_imbalance != 1) o << ", ep imbalance " << p.ep_imbalance;
}

}  // namespace

void print_plan(const Plan& p, std::ostream& o) {
  const dist::ParallelDims& D = p.dims;
  char line[256];
  o << "plan: " << D.str() << " (" << p.strategy << ")\n";
  o << "model: " << (p.arch == "llama" ? "llama, " : "") << p.n_layer << " layers, " << p.n_head << " heads";
  if (p.head_dim * p.n_head != p.n_embd) o << " of " << p.head_dim << " channels";
  if (p.arch == "llama")
    o << " (" << p.n_kv_head << " key/value heads" << (p.qk_norm ? ", q/k norms" : "") << ")";
  o << ", n_embd " << p.n_embd;
  if (p.arch == "llama") o << ", SwiGLU of " << p.mlp_hidden;
  print_experts(p, o);
  o << ", vocabulary " << p.padded_vocab << " (padded); " << p.params_global << " parameters, "
    << p.params_rank << " on each tensor-parallel rank\n";
  o << "batch: " << p.micro_batch << " sequences x " << p.accum << " accumulation x " << D.dp()
    << " data-parallel = " << p.sequences << " sequences = " << p.tokens
    << " tokens per step; each rank runs " << p.micro_batch << " x " << p.local_seq
    << " tokens per micro-step\n";
  if (p.lora_rank > 0)
    o << "LoRA: rank " << p.lora_rank << ", " << p.lora_adapters << " adapters a block, " << p.adapter_params
      << " adapter parameters on this rank (trained: gradients and AdamW moments); the base frozen (its "
         "parameters only: no gradients, no moments, no weight-gradient GEMMs)\n";
  o << "activation checkpointing: " << p.ac
    << (p.ac != "none" && p.ac_every > 1 ? " every " + std::to_string(p.ac_every) : "") << "\n";
  if (D.pp > 1) print_stages(p, o);
  o << "memory per rank" << (D.pp > 1 ? " of stage " + std::to_string(p.stage) : std::string()) << " ("
    << (p.act_bytes == 4 ? std::string("float32")
                         : p.dtype +
                               " activations and parameter copies, float32 master, "
                               "gradients and AdamW")
    << "):\n";
  auto row = [&](const char* what, int64_t b, const std::string& how) {
    std::snprintf(line, sizeof(line), "  %-22s %12s  %s\n", what, io::format_bytes(double(b)).c_str(),
                  how.c_str());
    o << line;
  };
  const bool lora = p.lora_rank > 0;
  row("parameters", p.param_bytes,
      std::string(D.sharded() ? "this rank's shard (1/" + std::to_string(D.fsdp()) + ")" : "") +
          (lora ? std::string(D.sharded() ? " of the base" : "the base") + " and the adapters, whole" : ""));
  row("gradients", p.grad_bytes, lora ? "the adapters' only" : "");
  row("AdamW moments", p.optim_bytes, lora ? "m and v, the adapters' only" : "m and v");
  if (D.sharded())
    row("gathered (FSDP)", p.gathered_bytes,
        "whole buffers at the peak (up to " + io::format_bytes(double(p.gathered_max_bytes)) +
            ": embeddings and their gradient, two blocks and two block gradients)");
  row("activations", p.activation_bytes,
      std::string(D.pp > 1 ? "kept for backward, one micro-batch through the stage"
                           : "kept for backward, one micro-step") +
          " (a block: " + io::format_bytes(double(p.block_activation_bytes)) + ")" +
          (lora ? "; the adapters' x A^T: " + io::format_bytes(double(p.adapter_activation_bytes)) : ""));
  if (D.pp > 1)
    row("activations held", p.held_bytes,
        "at the peak: " + std::to_string(p.in_flight) + " micro-batch" + (p.in_flight == 1 ? "" : "es") +
            " between F and B" +
            (p.deferred_bytes ? std::string(", and the W inputs of those between B and W") : ""));
  if (p.last_stage) {  // the stage with the head and the loss
    row("logits", p.logits_bytes, "B T Vp/tp values");
    row("loss temporaries", p.loss_temp_bytes, "dlogits (TP only: else it is the logits) and statistics");
  }
  row("batch, positions", p.other_bytes, "");
  row("peak estimate", p.peak_bytes, "at " + p.peak_at);
  for (const PlanMoment& m : p.moments) {
    std::snprintf(
        line, sizeof(line), "    %-36s %12s  (activations %s, gathered %s, temporaries %s)\n", m.name.c_str(),
        io::format_bytes(double(m.total)).c_str(), io::format_bytes(double(m.activations)).c_str(),
        io::format_bytes(double(m.gathered)).c_str(), io::format_bytes(double(m.transient)).c_str());
    o << line;
  }
  o << "communication per step, sent by each rank:\n";
  for (const PlanComm& c : p.comm) {
    // the columns in the buffer, the words after them (longer than any buffer of a line)
    std::snprintf(line, sizeof(line), "  %-9s %12s  ", c.dim.c_str(),
                  io::format_bytes(double(c.bytes)).c_str());
    o << line << c.what << " [" << c.formula << "]\n";
  }
  std::snprintf(line, sizeof(line), "  %-9s %12s  (%lld bytes)\n", "total",
                io::format_bytes(double(p.comm_bytes)).c_str(), (long long)p.comm_bytes);
  o << line;
  for (const std::string& n : p.notes) o << "note: " << n << "\n";
}

void print_plan_json(const Plan& p, std::ostream& o) { o << plan_to_json(p).dump(2) << "\n"; }

namespace {

// The pipeline's stages of a plan with pp > 1.
nlohmann::json pipeline_json(const Plan& p) {
  nlohmann::json stages = nlohmann::json::array();
  for (const PlanStage& x : p.stages) {
    nlohmann::json chunks = nlohmann::json::array();
    for (const auto& [b, e] : x.chunks) chunks.push_back({b, e});
    stages.push_back({{"stage", x.stage},
                      {"chunks", chunks},
                      {"first", x.first},
                      {"last", x.last},
                      {"params", x.params},
                      {"persistent", x.persistent_bytes},
                      {"activations_per_micro_batch", x.micro_activation_bytes},
                      {"in_flight", x.in_flight},
                      {"activations_held", x.held_bytes},
                      {"peak", x.peak_bytes},
                      {"peak_at", x.peak_at},
                      {"comm_bytes", x.comm_bytes}});
  }
  return {{"stages", p.dims.pp},
          {"schedule", p.pp_schedule},
          {"virtual", p.pp_virtual},
          {"micro_batches", p.accum},
          {"blocks", p.pp_blocks},
          {"planned_stage", p.stage},
          {"io_bytes", p.io_bytes},
          {"in_flight", p.in_flight},
          {"activations_held", p.held_bytes},
          {"deferred_bytes", p.deferred_bytes},
          {"per_stage", stages}};
}

}  // namespace

nlohmann::json plan_to_json(const Plan& p) {
  nlohmann::json j;
  j["layout"] = {{"pp", p.dims.pp},
                 {"dp_replicate", p.dims.dp_replicate},
                 {"dp_shard", p.dims.dp_shard},
                 {"cp", p.dims.cp},
                 {"sp", p.dims.sp},
                 {"tp", p.dims.tp},
                 {"ep", p.dims.ep},
                 {"world", p.dims.world()},
                 {"strategy", p.strategy}};
  j["dtype"] = p.dtype;
  j["activation_checkpointing"] = p.ac;
  j["ac_every"] = p.ac_every;
  j["batch"] = {{"micro_batch_size", p.micro_batch}, {"seq_len", p.seq_len},
                {"local_seq_len", p.local_seq},      {"grad_accum_steps", p.accum},
                {"sequences", p.sequences},          {"tokens", p.tokens}};
  j["model"] = {{"arch", p.arch},
                {"n_layer", p.n_layer},
                {"n_head", p.n_head},
                {"n_kv_head", p.n_kv_head},
                {"n_embd", p.n_embd},
                {"mlp_hidden", p.mlp_hidden},
                {"padded_vocab", p.padded_vocab},
                {"params", p.params_global},
                {"params_per_tp_rank", p.params_rank}};
  if (p.n_experts > 0)
    j["moe"] = {{"n_experts", p.n_experts},         {"experts_per_tok", p.experts_per_tok},
                {"expert_hidden", p.expert_hidden}, {"shared_hidden", p.shared_hidden},
                {"moe_blocks", p.moe_blocks},       {"ep_imbalance", p.ep_imbalance}};
  if (p.lora_rank > 0)
    j["lora"] = {{"rank", p.lora_rank},
                 {"adapters_per_block", p.lora_adapters},
                 {"adapter_params", p.adapter_params},
                 {"adapter_activations", p.adapter_activation_bytes}};
  j["memory"] = {{"params", p.param_bytes},
                 {"grads", p.grad_bytes},
                 {"optimizer", p.optim_bytes},
                 {"gathered", p.gathered_bytes},
                 {"gathered_max", p.gathered_max_bytes},
                 {"activations", p.activation_bytes},
                 {"activations_per_block", p.block_activation_bytes},
                 {"logits", p.logits_bytes},
                 {"loss_temporaries", p.loss_temp_bytes},
                 {"other", p.other_bytes},
                 {"peak", p.peak_bytes},
                 {"peak_at", p.peak_at}};
  nlohmann::json moments = nlohmann::json::array();
  for (const PlanMoment& m : p.moments)
    moments.push_back({{"name", m.name},
                       {"total", m.total},
                       {"activations", m.activations},
                       {"gathered", m.gathered},
                       {"temporaries", m.transient}});
  j["memory"]["moments"] = moments;
  nlohmann::json comm = nlohmann::json::array();
  for (const PlanComm& c : p.comm)
    comm.push_back({{"dim", c.dim}, {"what", c.what}, {"formula", c.formula}, {"bytes", c.bytes}});
  j["comm"] = comm;
  j["comm_bytes"] = p.comm_bytes;
  j["notes"] = p.notes;
  if (p.dims.pp > 1) j["pipeline"] = pipeline_json(p);
  return j;
}

}  // namespace ndt::train
