// ringlane-logits: the engine's next-token logits at every position of a token
// sequence, teacher-forced, as raw little-endian float32 [tokens][vocab]. The
// independent references in tests/reference/ compare against this output.
//
//   ringlane-logits --model=DIR --tokens=1,5,7 --chunk=16 --out=logits.f32
//
// The sequence is fed in prefill chunks of --chunk tokens, each asking for the
// logits of all its positions, so chunked prefill is what is checked.
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

ABSL_FLAG(std::string, model, "", "model directory or llama2.c checkpoint (required)");
ABSL_FLAG(std::string, tokens, "", "comma-separated token ids (required)");
ABSL_FLAG(int, chunk, 16, "prefill chunk size in tokens");
ABSL_FLAG(int, threads, 2, "engine threads");
ABSL_FLAG(std::string, kv_dtype, "f32", "KV cache dtype: f32, bf16 or fp8");
ABSL_FLAG(std::string, out, "", "output file of float32 logits (required)");
ABSL_FLAG(int, dense_window, 2051,
          "DSA models: positions with at most this many keys attend densely, the others to "
          "the indexer's top-k");

namespace rw = ringlane::worker;
using ringlane::services::ExitWithUsageError;

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
  rw::CpuBackendOptions opt;
  opt.threads = absl::GetFlag(FLAGS_threads);
  auto backend =
      rw::CreateCpuBackend(std::shared_ptr<const rw::ModelWeights>(std::move(*model)), opt);
  if (!backend.ok()) return die(backend.status());
  const int bs = 16;
  const int blocks = (static_cast<int>(tokens.size()) + bs - 1) / bs;
  if (absl::Status s = (*backend)->AllocateKvPool({blocks, bs, *kv}); !s.ok()) return die(s);

  std::ofstream out(out_path, std::ios::binary | std::ios::trunc);
  rw::SeqStep seq;
  for (int b = 0; b < blocks; ++b) seq.block_ids.push_back(b);
  for (size_t p = 0; p < tokens.size(); p += chunk) {
    const size_t n = std::min(tokens.size() - p, static_cast<size_t>(chunk));
    seq.start_position = static_cast<int64_t>(p);
    seq.tokens.assign(tokens.begin() + p, tokens.begin() + p + n);
    seq.logit_offsets.clear();
    for (size_t i = 0; i < n; ++i) seq.logit_offsets.push_back(static_cast<int32_t>(i));
    rw::RoundInput in;
    in.seqs = {seq};
    auto res = (*backend)->Step(in);
    if (!res.ok()) return die(res.status());
    const std::vector<float>& l = res->logits[0];
    out.write(reinterpret_cast<const char*>(l.data()),
              static_cast<std::streamsize>(l.size() * sizeof(float)));
  }
  out.close();
  if (!out) return die(absl::InternalError(absl::StrCat("cannot write ", out_path)));
  return 0;
}
