// ringlane-logits: the engine's next-token logits at every position of a token
// sequence, teacher-forced, as raw little-endian float32 [tokens][vocab]. The
// independent references in tests/reference/ compare against this output.
//
//   ringlane-logits --model=DIR --tokens=1,5,7 --chunk=16 --out=logits.f32
//
// The sequence is fed in prefill chunks of --chunk tokens, each asking for the
// logits of all its positions, so chunked prefill is what is checked.
//
// MTP checkpoints (DeepSeek-V3 / GLM-5 with num_nextn_predict_layers):
//   --mtp_out=FILE   also the MTP layer's teacher-forced logits [tokens - 1][vocab]:
//                    row j from the model's hidden state at j and token j + 1
//   --mtp_draft=K    instead: feed --tokens as a greedy lane's prompt through the
//                    worker's round executor and MTP drafter (in --chunk chunks)
//                    and print {"next": sampled token, "drafts": [K proposals]}
#include <cstdio>
#include <fstream>
#include <string>
#include <vector>

#include "absl/flags/flag.h"
#include "absl/flags/parse.h"
#include "absl/flags/usage.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "services/flags_util.h"
#include "worker/backend/backend.h"
#include "worker/dtype.h"
#include "worker/model/model.h"
#include "worker/model/shard.h"
#include "worker/server/draft_runner.h"
#include "worker/server/round_executor.h"

ABSL_FLAG(std::string, model, "", "model directory or llama2.c checkpoint (required)");
ABSL_FLAG(std::string, tokens, "", "comma-separated token ids (required)");
ABSL_FLAG(int, chunk, 16, "prefill chunk size in tokens");
ABSL_FLAG(int, threads, 2, "engine threads");
ABSL_FLAG(int, kda_chunk, 0,
          "models with KDA layers: run whole chunks of this many positions (at absolute "
          "multiples of it) in the chunked form; 0: every position through the recurrence");
ABSL_FLAG(std::string, kv_dtype, "f32", "KV cache dtype: f32, bf16 or fp8");
ABSL_FLAG(std::string, out, "", "output file of float32 logits (required)");
ABSL_FLAG(int, dense_window, 2051,
          "DSA models: positions with at most this many keys attend densely, the others to "
          "the indexer's top-k");

ABSL_FLAG(std::string, mtp_out, "", "also write the MTP layer's teacher-forced float32 logits");
ABSL_FLAG(int, mtp_draft, 0, "print the MTP drafter's K proposals after the greedy next token");

namespace rw = ringlane::worker;
namespace v1 = ringlane::v1;
using ringlane::services::ExitWithUsageError;

namespace {

absl::Status Fail(const std::string& what) { return absl::InternalError(what); }

// --mtp_draft: the prompt through a greedy lane of the round executor with
// the MTP drafter on rank 0, as a worker runs it.
absl::Status PrintMtpDraft(std::shared_ptr<const rw::ModelWeights> model,
                           const std::vector<int32_t>& tokens, int chunk, int k, rw::DType kv,
                           const rw::CpuBackendOptions& opt) {
  auto target = rw::CreateCpuBackend(model, opt);
  if (!target.ok()) return target.status();
  auto view = rw::MtpDrafter(model);
  if (!view.ok()) return view.status();
  auto draft = rw::CreateCpuBackend(*view, opt);
  if (!draft.ok()) return draft.status();
  const int bs = 16;
  const int blocks = (static_cast<int>(tokens.size()) + bs) / bs + 1;
  const rw::KvPoolSpec pool{blocks, bs, kv, 1};
  if (absl::Status s = (*target)->AllocateKvPool(pool); !s.ok()) return s;
  auto runner = rw::DraftRunner::Create(std::move(*draft), pool, model->config.vocab,
                                        model->config.max_position);
  if (!runner.ok()) return runner.status();
  rw::RoundExecutor exec(target->get(), /*rank=*/0, nullptr, runner->get());
  std::string json;
  for (size_t p = 0; p < tokens.size(); p += chunk) {
    const size_t n = std::min(tokens.size() - p, static_cast<size_t>(chunk));
    const bool last = p + n == tokens.size();
    v1::RoundPlan plan;
    plan.set_round_id(p / chunk + 1);
    v1::LaneStep* row = plan.add_rows();
    row->set_lane_id(1);
    row->set_start_position(static_cast<int64_t>(p));
    row->mutable_token_ids()->Add(tokens.begin() + p, tokens.begin() + p + n);
    for (int b = 0; b < (static_cast<int>(p + n) + bs - 1) / bs; ++b) row->add_block_ids(b);
    if (p == 0) {
      row->mutable_sampling()->set_temperature(0);
      row->mutable_sampling()->set_seed(1);
    }
    if (last) {
      row->set_sample_last(true);
      row->set_propose_drafts(k);
    }
    auto res = exec.Run(plan);
    if (!res.ok()) return res.status();
    if (res->error().code() != 0) return Fail(res->error().message());
    if (!last) continue;
    if (res->outputs_size() != 1) return Fail("no output");
    const v1::LaneOutput& o = res->outputs(0);
    json = absl::StrCat("{\"next\": ", o.tokens(0).token_id(), ", \"drafts\": [");
    for (int i = 0; i < o.draft_token_ids_size(); ++i) {
      absl::StrAppend(&json, i ? ", " : "", o.draft_token_ids(i));
    }
    absl::StrAppend(&json, "]}");
  }
  std::printf("%s\n", json.c_str());
  return absl::OkStatus();
}

}  // namespace

int main(int argc, char** argv) {
  absl::SetProgramUsageMessage(
      "Writes the engine's teacher-forced logits of a token sequence.\n"
      "  ringlane-logits --model=DIR --tokens=1,5,7 --out=logits.f32");
  absl::ParseCommandLine(argc, argv);
  const std::string path = absl::GetFlag(FLAGS_model), out_path = absl::GetFlag(FLAGS_out);
  if (path.empty() || out_path.empty()) ExitWithUsageError("--model and --out are required");
  std::vector<int32_t> tokens;
  for (absl::string_view part : absl::StrSplit(absl::GetFlag(FLAGS_tokens), ',')) {
    int32_t id;
    if (!absl::SimpleAtoi(part, &id))
      ExitWithUsageError(absl::StrCat("--tokens: bad id '", part, "'"));
    tokens.push_back(id);
  }
  const int chunk = absl::GetFlag(FLAGS_chunk);
  if (tokens.empty() || chunk <= 0) ExitWithUsageError("--tokens must be non-empty, --chunk > 0");
  absl::StatusOr<rw::DType> kv = rw::ParseDTypeFlag(absl::GetFlag(FLAGS_kv_dtype));
  if (!kv.ok()) ExitWithUsageError(absl::StrCat("--kv_dtype: ", kv.status().message()));

  auto die = [](const absl::Status& s) {
    std::fprintf(stderr, "ringlane-logits: %s\n", std::string(s.message()).c_str());
    return 1;
  };
  auto model = rw::LoadModel(path);
  if (!model.ok()) return die(model.status());
  if (absl::GetFlag(FLAGS_dense_window) < 1) ExitWithUsageError("--dense_window must be positive");
  (*model)->config.indexer.dense_window = absl::GetFlag(FLAGS_dense_window);
  const int kda_chunk = absl::GetFlag(FLAGS_kda_chunk);
  if (kda_chunk < 0 || kda_chunk > 1024) ExitWithUsageError("--kda_chunk must be in [0, 1024]");
  (*model)->config.linear.chunk = kda_chunk;
  rw::CpuBackendOptions opt;
  opt.threads = absl::GetFlag(FLAGS_threads);
  std::shared_ptr<const rw::ModelWeights> weights(std::move(*model));
  if (const int k = absl::GetFlag(FLAGS_mtp_draft); k > 0) {
    if (absl::Status s = PrintMtpDraft(weights, tokens, chunk, k, *kv, opt); !s.ok()) return die(s);
    return 0;
  }
  const std::string mtp_path = absl::GetFlag(FLAGS_mtp_out);
  auto backend = rw::CreateCpuBackend(weights, opt);
  if (!backend.ok()) return die(backend.status());
  const int bs = 16;
  const int blocks = (static_cast<int>(tokens.size()) + bs - 1) / bs;
  // One state slot: the one sequence's, for models with recurrent layers.
  if (absl::Status s = (*backend)->AllocateKvPool({blocks, bs, *kv, 1}); !s.ok()) return die(s);

  std::ofstream out(out_path, std::ios::binary | std::ios::trunc);
  std::vector<float> hidden;  // [tokens][hidden], final-normed, for --mtp_out
  rw::SeqStep seq;
  seq.state_slot = 0;
  // Every token is the prompt's: all whole chunks may run chunked.
  seq.linear_chunked_until = static_cast<int64_t>(tokens.size());
  for (int b = 0; b < blocks; ++b) seq.block_ids.push_back(b);
  for (size_t p = 0; p < tokens.size(); p += chunk) {
    const size_t n = std::min(tokens.size() - p, static_cast<size_t>(chunk));
    seq.start_position = static_cast<int64_t>(p);
    seq.tokens.assign(tokens.begin() + p, tokens.begin() + p + n);
    seq.logit_offsets.clear();
    for (size_t i = 0; i < n; ++i) seq.logit_offsets.push_back(static_cast<int32_t>(i));
    rw::RoundInput in;
    in.seqs = {seq};
    in.want_hidden = !mtp_path.empty();
    auto res = (*backend)->Step(in);
    if (!res.ok()) return die(res.status());
    const std::vector<float>& l = res->logits[0];
    out.write(reinterpret_cast<const char*>(l.data()),
              static_cast<std::streamsize>(l.size() * sizeof(float)));
    if (in.want_hidden) {
      if (res->hidden.empty()) return die(Fail("this model's graph returns no hidden states"));
      hidden.insert(hidden.end(), res->hidden[0].begin(), res->hidden[0].end());
    }
  }
  out.close();
  if (!out) return die(absl::InternalError(absl::StrCat("cannot write ", out_path)));
  if (mtp_path.empty()) return 0;

  // The MTP layer over positions 0 .. T-2, each from the hidden state at j
  // and token j + 1, in the same chunks.
  if (tokens.size() < 2) ExitWithUsageError("--mtp_out needs at least two tokens");
  auto view = rw::MtpDrafter(weights);
  if (!view.ok()) return die(view.status());
  auto mtp = rw::CreateCpuBackend(*view, opt);
  if (!mtp.ok()) return die(mtp.status());
  if (absl::Status s = (*mtp)->AllocateKvPool({blocks, bs, *kv}); !s.ok()) return die(s);
  const int64_t D = weights->config.hidden;
  std::ofstream mout(mtp_path, std::ios::binary | std::ios::trunc);
  const size_t rows = tokens.size() - 1;
  for (size_t p = 0; p < rows; p += chunk) {
    const size_t n = std::min(rows - p, static_cast<size_t>(chunk));
    seq.start_position = static_cast<int64_t>(p);
    seq.tokens.assign(tokens.begin() + p + 1, tokens.begin() + p + 1 + n);
    seq.hidden_in.assign(hidden.begin() + p * D, hidden.begin() + (p + n) * D);
    seq.logit_offsets.clear();
    for (size_t i = 0; i < n; ++i) seq.logit_offsets.push_back(static_cast<int32_t>(i));
    rw::RoundInput in;
    in.seqs = {seq};
    auto res = (*mtp)->Step(in);
    if (!res.ok()) return die(res.status());
    const std::vector<float>& l = res->logits[0];
    mout.write(reinterpret_cast<const char*>(l.data()),
               static_cast<std::streamsize>(l.size() * sizeof(float)));
  }
  mout.close();
  if (!mout) return die(absl::InternalError(absl::StrCat("cannot write ", mtp_path)));
  return 0;
}
