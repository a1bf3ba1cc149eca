// ringlane-generate-client: a prompt in, streamed text out, through the
// router's gRPC Generate API (what `make serve` runs in front of the router).
//
//   ringlane-generate-client --router=127.0.0.1:50051 --prompt="Once upon a time"
//   echo "The cat" | ringlane-generate-client --max_tokens=64
#include <grpcpp/grpcpp.h>

#include <cstdio>
#include <cstdlib>
#include <iostream>
#include <string>

#include "absl/flags/flag.h"
#include "absl/flags/parse.h"
#include "absl/flags/usage.h"
#include "absl/strings/str_split.h"
#include "ringlane/v1/generate.grpc.pb.h"

ABSL_FLAG(std::string, router, "127.0.0.1:50051", "the router's gRPC address");
ABSL_FLAG(std::string, prompt, "", "text to continue; empty = one prompt per stdin line");
ABSL_FLAG(int, max_tokens, 256, "most tokens generated per prompt");
ABSL_FLAG(double, temperature, -1, "sampling temperature; -1 = the router's default");
ABSL_FLAG(double, top_p, 1, "nucleus sampling");
ABSL_FLAG(int64_t, seed, -1, "sampling seed; -1 = the router's policy");
ABSL_FLAG(std::string, stop, "", "stop strings, separated by '|'");
ABSL_FLAG(bool, ignore_eos, false, "keep generating past EOS");
ABSL_FLAG(std::string, api_key, "",
          "sent as 'authorization: Bearer KEY' metadata; empty = $RINGLANE_API_KEY when set");
ABSL_FLAG(bool, usage, true, "print usage (tokens, cached tokens) to stderr after each prompt");

namespace v1 = ringlane::v1;

namespace {

int Generate(v1::Generate::Stub& stub, const std::string& prompt) {
  v1::GenerateRequest req;
  req.set_text(prompt);
  req.set_max_tokens(absl::GetFlag(FLAGS_max_tokens));
  req.set_ignore_eos(absl::GetFlag(FLAGS_ignore_eos));
  if (absl::GetFlag(FLAGS_temperature) >= 0) {
    req.mutable_sampling()->set_temperature(static_cast<float>(absl::GetFlag(FLAGS_temperature)));
  }
  req.mutable_sampling()->set_top_p(static_cast<float>(absl::GetFlag(FLAGS_top_p)));
  if (absl::GetFlag(FLAGS_seed) >= 0) {
    req.mutable_sampling()->set_seed(static_cast<uint64_t>(absl::GetFlag(FLAGS_seed)));
  }
  if (!absl::GetFlag(FLAGS_stop).empty()) {
    for (absl::string_view s : absl::StrSplit(absl::GetFlag(FLAGS_stop), '|')) {
      req.add_stop(std::string(s));
    }
  }
  req.set_echo(true);
  grpc::ClientContext ctx;
  std::string key = absl::GetFlag(FLAGS_api_key);
  if (key.empty() && std::getenv("RINGLANE_API_KEY") != nullptr)
    key = std::getenv("RINGLANE_API_KEY");
  if (!key.empty()) ctx.AddMetadata("authorization", "Bearer " + key);
  auto reader = stub.Generate(&ctx, req);
  v1::GenerateResponse m;
  v1::Usage usage;
  while (reader->Read(&m)) {
    std::fwrite(m.text().data(), 1, m.text().size(), stdout);
    std::fflush(stdout);
    if (m.has_usage()) usage = m.usage();
  }
  std::printf("\n");
  grpc::Status st = reader->Finish();
  if (!st.ok()) {
    std::fprintf(stderr, "error: %s (code %d)\n", st.error_message().c_str(), st.error_code());
    return 1;
  }
  if (absl::GetFlag(FLAGS_usage)) {
    std::fprintf(stderr, "[%d prompt tokens, %d cached, %d generated]\n", usage.prompt_tokens(),
                 usage.cached_tokens(), usage.completion_tokens());
  }
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  absl::SetProgramUsageMessage("ringlane-generate-client --router=host:port [--prompt=TEXT]");
  absl::ParseCommandLine(argc, argv);
  auto stub = v1::Generate::NewStub(
      grpc::CreateChannel(absl::GetFlag(FLAGS_router), grpc::InsecureChannelCredentials()));
  if (!absl::GetFlag(FLAGS_prompt).empty()) return Generate(*stub, absl::GetFlag(FLAGS_prompt));
  std::string line;
  int rc = 0;
  while (std::getline(std::cin, line)) rc |= Generate(*stub, line);
  return rc;
}
