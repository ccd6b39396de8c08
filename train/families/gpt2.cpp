// What the training tools know of GPT-2 (train/families/family_tools.h): its Hugging Face
// folders (GPT2LMHeadModel: our names and layouts, "transformer." in front), and its block
// (nn::Block: LayerNorms, multi-head attention on the packed qkv, a GELU MLP, biases
// everywhere) for the planner: train/planner/block_kinds.h. Legend: train/planner/shapes.h
// (here Q = 3 Cl and H = 4 C / tp); bytes: a per activation (the compute dtype's), 4 per
// statistic (kF).
#include <algorithm>

#include "models/gpt.h"
#include "train/families/family_tools.h"
#include "train/planner/block_kinds.h"

namespace ndt::train {
namespace {

// ---- Hugging Face folders

// config.json: GPT2Config's names (n_embd, n_layer, n_head, n_positions or n_ctx, n_inner,
// layer_norm_epsilon, activation_function) under HfConfig's
void read_config(const io::HfKeys& k, io::HfConfig& c) {
  c.vocab_size = k.positive("vocab_size");
  c.hidden_size = k.positive("n_embd");
  c.num_hidden_layers = k.positive("n_layer");
  c.num_attention_heads = k.positive("n_head");
  c.num_key_value_heads = c.num_attention_heads;
  // n_positions; files from before transformers 4 may give only n_ctx (the same number)
  c.max_position_embeddings =
      k.has("n_positions") || !k.has("n_ctx") ? k.positive("n_positions") : k.positive("n_ctx");
  c.intermediate_size = k.opt_int("n_inner").value_or(4 * c.hidden_size);
  c.norm_eps = k.opt_num("layer_norm_epsilon").value_or(1e-5);
  c.hidden_act = k.opt_str("activation_function").value_or("gelu_new");
  c.tie_word_embeddings = k.opt_bool("tie_word_embeddings", true);
  c.attention_bias = c.mlp_bias = true;
  NDT_CHECK(c.hidden_size % c.num_attention_heads == 0, k.where, ": n_embd ", c.hidden_size,
            " is not a multiple of n_head ", c.num_attention_heads);
  c.head_dim = c.hidden_size / c.num_attention_heads;
  NDT_CHECK(k.opt_bool("scale_attn_weights", true), k.where, ": scale_attn_weights false is not supported");
  NDT_CHECK(!k.opt_bool("scale_attn_by_inverse_layer_idx", false), k.where,
            ": scale_attn_by_inverse_layer_idx true is not supported");
  NDT_CHECK(!k.opt_bool("add_cross_attention", false), k.where,
            ": add_cross_attention true is not supported");
}

void check_config(const io::HfConfig& c, const std::string& where) {
  io::check_sizes(c, where, {"n_embd", "n_inner", "n_layer", "n_head", "n_positions", "layer_norm_epsilon"});
  NDT_CHECK(c.hidden_act == "gelu_new" || c.hidden_act == "gelu_pytorch_tanh", where,
            ": activation_function '", c.hidden_act,
            "' is not supported; ndtrain's GPT-2 uses the tanh GELU (gelu_new, gelu_pytorch_tanh)");
  NDT_CHECK(c.num_key_value_heads == c.num_attention_heads, where, ": gpt2 has no num_key_value_heads (",
            c.num_key_value_heads, " given for ", c.num_attention_heads, " heads)");
  NDT_CHECK(c.attention_bias && c.mlp_bias, where, ": gpt2 always has attention and MLP biases");
  NDT_CHECK(c.tie_word_embeddings, where,
            ": tie_word_embeddings = false: ndtrain's GPT-2 ties its head to wte; a GPT-2 with a head of "
            "its own (lm_head.weight) cannot be read without dropping it");
  const io::HfConfig none;
  NDT_CHECK(c.rope_theta == none.rope_theta && !c.llama3_scaling && c.factor == 0 && c.low_freq_factor == 0 &&
                c.high_freq_factor == 0 && c.original_max_position_embeddings == 0,
            where, ": gpt2 has no rotary embeddings; leave the rope fields at their defaults");
}

void write_config(const io::HfConfig& c, nlohmann::json& j) {
  j["n_embd"] = c.hidden_size;
  j["n_layer"] = c.num_hidden_layers;
  j["n_head"] = c.num_attention_heads;
  j["n_positions"] = c.max_position_embeddings;
  j["n_inner"] = c.intermediate_size == 4 * c.hidden_size ? nlohmann::json(nullptr)
                                                          : nlohmann::json(c.intermediate_size);
  j["layer_norm_epsilon"] = c.norm_eps;
  j["activation_function"] = c.hidden_act;
}

void from_hf(const io::HfConfig&, models::GPTConfig&) {}  // the shared fields say it all

void to_hf(const models::GPTConfig&, io::HfConfig& hf) {
  hf.model_type = "gpt2";
  hf.hidden_act = "gelu_new";
  hf.tie_word_embeddings = true;
  hf.attention_bias = hf.mlp_bias = true;
}

// GPT-2's folders keep our names and layouts
std::map<std::string, HfSource> sources(const models::GPTConfig& c) {
  std::map<std::string, HfSource> s;
  for (const nn::ParamSpec& p : models::GPT(c).parameters())
    s[p.name] = {HfSource::renamed, {"transformer." + p.name}};
  return s;
}

// ---- the planner

// The CPU's fused core on the packed qkv (ndt::self_attention): its input qkv (3 N Cl, as
// it came) and lse (N NHl); under bf16 also its f32 output y (N Cl; in f32 y is the output,
// c_proj's input).
Count fused_core_saved(const Shapes& s) {
  const Count N = s.N, Cl = s.Cl, NHl = s.NHl, a = s.act_bytes, w = kF;
  return 3 * N * Cl * a + N * NHl * kF + (a == w ? Count(0) : N * Cl * w);
}

// nn::Block::forward (gpt2) with the ops of autograd/ops/*.cpp, per mode (nn::ACMode):
//   none       ln_1: mean, rstd (2N); c_attn keeps its input ln_1(x) (N C); the core
//              (core_saved) and c_proj's input (N Cl: the fused core's output, or heads_to_back's
//              copy); h = x + attn (N C, kept by ln_2) and ln_2's mean, rstd (2N); c_fc's
//              input (N C); GELU's input (N H) and c_proj's input, GELU's output (N H); the
//              block's output (N C, kept by the next block). (Composed, c_attn's (N, 3Cl)
//              output dies: split_last copies q, k, v out of it and keeps nothing.)
//   selective  the same but the core keeps only its input qkv (3 N Cl) and its output
//              (N Cl, c_proj's input); the rest of the core is made again in backward
//              (fused: a second output and lse, N Cl + N NHl, beside the kept qkv).
//   full       the output only (N C); the input is the block before's output.
// During backward, on top of the earlier blocks: the MLP's (everything saved but the
// output, which ln_f or the next block has released, plus the incoming gradient N C, the
// GELU's dx and input gradient 2 N H less the GELU output already released N H; the
// weight gradients go straight into the gradient buffers); then the attention's (ln_1's
// output and stats, the core, two gradients of N C on the residual, the core's backward).
// Full recomputes the block from its input inside backward: the saved set of `none`
// comes back for the duration, plus the incoming gradient. In bytes: a per activation (the
// compute dtype's), 4 per statistic.
//
// Sequence parallelism keeps the block's input, h, its output, the LayerNorms' statistics,
// the gradients on the residual and the column-parallel linears' inputs (ln_1's and ln_2's
// outputs: linear_shared_input keeps the part and gathers it again in backward) on Ns = N / tp
// rows; backward holds the incoming gradient gathered (N C) for each c_proj and the
// gathered input again (N C) for each column-parallel weight gradient.
BlockMem block_memory(const Shapes& s, nn::ACMode mode) {
  const Count N = s.N, Ns = s.Ns, C = s.C, Cl = s.Cl, H = s.H, a = s.act_bytes, stats = 2 * Ns * kF;
  const Count gathered = Ns == N ? Count(0) : 2 * N * C * a;  // an incoming gradient, an input
  const Count mlp_part = (Ns * C /*h*/ + Ns * C /*ln_2 out*/ + 2 * N * H) * a + stats;
  const Count none_saved =
      Ns * C * a /*ln_1 out*/ + stats + core_saved(s) + N * Cl * a + mlp_part + Ns * C * a;
  auto mlp_moment = [&](Count saved) { return saved - Ns * C * a + (Ns * C + N * H) * a + gathered; };
  auto attn_moment = [&](Count core_live) {
    return Ns * C * a + stats + core_live + 2 * Ns * C * a + gathered + core_backward(s);
  };
  BlockMem m;
  switch (mode) {
    case nn::ACMode::none:
      m.saved = none_saved;
      m.mlp = mlp_moment(none_saved);
      m.attn = attn_moment(core_saved(s));
      break;
    case nn::ACMode::selective: {
      m.saved = Ns * C * a + stats + 3 * N * Cl * a + N * Cl * a + mlp_part + Ns * C * a;
      // the core made again in backward, besides its kept input
      const Count again =
          s.core == AttentionCore::cpu_fused ? core_saved(s) - 3 * N * Cl * a + N * Cl * a : core_saved(s);
      m.mlp = mlp_moment(m.saved);
      m.attn = attn_moment(3 * N * Cl * a + again);
      break;
    }
    case nn::ACMode::full:
      m.saved = Ns * C * a;
      m.mlp = Ns * C * a /*incoming gradient*/ + mlp_moment(none_saved);
      m.attn = Ns * C * a + attn_moment(core_saved(s));
      break;
  }
  m.during_backward = std::max(m.mlp, m.attn);
  return m;
}

// zb-h1: c_fc (its input Ns C, its output gradient N H through GELU's backward) and the
// MLP's c_proj (N H, N C).
Count deferred_mlp(const Shapes& s) {
  const Count N = s.N, Ns = s.Ns, C = s.C, H = s.H;
  return Ns * C + N * H + N * C + N * H;
}

// The block's work (nn::Block)
BlockWork block_work(const Shapes& shapes) {
  const double N = shapes.N, Ns = shapes.Ns, C = shapes.C, Cl = shapes.Cl, H = shapes.H;
  const double S = attention_scores(shapes);
  BlockWork work;
  work.scores = S;
  // forward: ln_1 (read, write Ns C); c_attn 2 N C 3Cl; split_last's copies of q, k, v
  // (not when the fused core reads them in place)
  const double copies = shapes.core == AttentionCore::cpu_fused ? 0.0 : 1.0;
  work.attn_in = {2 * N * C * 3 * Cl, 2 * Ns * C + copies * 6 * N * Cl};
  // q k^T and p v: 2 hd FLOPs per score each; the masked softmax reads and writes the
  // scores; the ring's copies (backward copies as much)
  work.core = {0, ring_copies(shapes), 4 * S * double(shapes.hd), 2 * S};
  // heads_to_back's copy; c_proj 2 N Cl C; the residual add
  work.attn_out = {2 * N * Cl * C, copies * 2 * N * Cl + 3 * Ns * C};
  // ln_2, c_fc 2 N C H with GELU (N H written again), c_proj 2 N H C, the residual add
  work.mlp = {4 * N * C * H, 2 * Ns * C + 2 * N * H + 3 * Ns * C};
  // backward: twice the FLOPs (input and weight gradients); LayerNorm's backward reads
  // three tensors and writes one, each bias gradient reads its output gradient, each weight
  // gradient is made and then added into the unit's gradient (3 passes of its size). The
  // column-parallel c_attn and c_fc are split at their input gradient: under TP the
  // trainer sums it over tp while their weight gradient is made (ops::linear_shared_input)
  work.attn_in_b = {2 * N * C * 3 * Cl, 6 * N * Cl + 3 * N * Cl};
  work.attn_in_dw = {2 * N * C * 3 * Cl, 3 * (3 * C * Cl)};
  work.ln_1_b = {0, 4 * Ns * C};
  // (fused: q k^T once more, to make the probabilities again, 2.5x the forward's FLOPs)
  work.core_b = {0, ring_copies(shapes), (fused(shapes.inner) ? 2.5 : 2.0) * work.core.core_flops, 3 * S};
  work.attn_out_b = {2 * work.attn_out.flops, 2 * N * Cl + 2 * N * C + Ns * C + 3 * Cl * C};
  // c_proj's both gradients, GELU's, c_fc's input gradient; then c_fc's weight gradient
  work.mlp_in = {{{6 * N * C * H, 3 * N * H + N * (H + C) + 3 * (C * H)}, {2 * N * C * H, 3 * (C * H)}}};
  work.ln_2_b = {0, 4 * Ns * C + 2 * Ns * C};
  return work;
}

// wte(idx) + wpe(pos); backward scatters into both gradients.
EmbeddingsWork embeddings(const Shapes& shapes) {
  const double N = double(shapes.N), C = double(shapes.C);
  return {{0, 3 * N * C}, {0, 3 * N * C}};
}

std::vector<Gemm> mlp_gemms(int64_t N, int64_t C, int64_t I, int64_t L, DType w) {
  return {{"c_fc", 1, N, C, I, L, w}, {"mlp c_proj", 1, N, I, C, L, w}};
}

// Learned positions: no tables.
Count position_tables(const Shapes&) { return 0; }

const BlockKind kBlock = {
    .name = "gpt2",
    .memory = block_memory,
    .fused_core_saved = fused_core_saved,
    .deferred_mlp = deferred_mlp,
    .position_tables = position_tables,
    .norm_stats = 2,  // LayerNorm's mean and rstd
    .work = block_work,
    .embeddings = embeddings,
    .mlp_inputs = 1,  // c_fc
    .mlp_gemms = mlp_gemms,
};

}  // namespace

extern const FamilyTools kTools_gpt2 = {
    .arch = "gpt2",
    .model_types = {{"gpt2", "GPT2LMHeadModel"}},
    .read_config = read_config,
    .check_config = check_config,
    .write_config = write_config,
    .from_hf = from_hf,
    .to_hf = to_hf,
    .sources = sources,
    .optional_prefix = "transformer.",
    .planner = &kBlock,
};

}  // namespace ndt::train
