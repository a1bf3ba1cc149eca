// ringlane-worker: one tensor-parallel rank. Loads its shard of the model,
// serves the Worker gRPC service (and, on rank 0 without --rendezvous, the
// group's Rendezvous service), forms its group with the other ranks, and
// drains on SIGTERM. With --listen port 0 it prints `LISTENING worker=host:port`
// on stdout once it serves.
#include <grpcpp/ext/proto_server_reflection_plugin.h>
#include <grpcpp/grpcpp.h>
#include <grpcpp/health_check_service_interface.h>
#include <xxhash.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <filesystem>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "absl/flags/flag.h"
#include "absl/flags/parse.h"
#include "absl/flags/usage.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_split.h"
#include "prometheus/exposer.h"
#include "prometheus/registry.h"
#include "services/flags_util.h"
#include "services/grpc_security.h"
#include "services/health_port.h"
#include "services/kvstore_client.h"
#include "services/listener_tls.h"
#include "services/log.h"
#include "services/rdma.h"
#include "services/signals.h"
#include "worker/backend/factory.h"
#include "worker/kv_cache.h"
#include "worker/model/model.h"
#include "worker/model/resident.h"
#include "worker/model/shard.h"
#include "worker/rendezvous/rendezvous.h"
#include "worker/server/draft_runner.h"
#include "worker/server/group.h"
#include "worker/server/worker_metrics.h"
#include "worker/server/worker_service.h"

ABSL_FLAG(std::string, model, "", "model: a Hugging Face directory or a llama2.c .bin file");
ABSL_FLAG(std::string, draft_model, "",
          "a smaller model with the same vocabulary (Hugging Face directory or llama2.c .bin) "
          "that rank 0 runs to propose drafts for speculative decoding (the router's "
          "--spec_drafters=model); other ranks ignore it");
ABSL_FLAG(int, draft_layers, 0,
          "instead of --draft_model: rank 0 drafts with the model's own first N layers (its "
          "embedding, final norm and head on top; a self-drafter sharing the weights); 0 = none");
ABSL_FLAG(bool, draft_mtp, false,
          "rank 0 drafts with the checkpoint's MTP layer (DeepSeek-V3 / GLM-5 "
          "num_nextn_predict_layers), fed the model's hidden states");
ABSL_FLAG(std::string, model_id, "",
          "model id to report; default: the model's directory or file "
          "name without extension");
ABSL_FLAG(int, rank, 0, "this worker's rank in its tensor-parallel group");
ABSL_FLAG(int, world_size, 1, "ranks in the group (tensor-parallel degree)");
ABSL_FLAG(std::string, group, "default", "name of the worker group");
ABSL_FLAG(std::string, rendezvous, "",
          "host:port of the group's Rendezvous service; empty on rank 0 = serve it on --listen "
          "(required on other ranks)");
ABSL_FLAG(std::string, listen, "",
          "host:port to serve gRPC on; default 127.0.0.1:(50061 + rank); port 0 picks one");
ABSL_FLAG(std::string, collective_host, "",
          "address the collectives bind to and advertise to peers; default: the --listen host "
          "(127.0.0.1 when that is a wildcard)");
ABSL_FLAG(std::string, collective_ports, "",
          "LO-HI: the port range the TCP collectives listen in (the first free port), so a "
          "firewall or NetworkPolicy can allow them; empty: the kernel picks. Give at least two "
          "ports: a re-formation binds while the previous formation's socket is open");
ABSL_FLAG(std::string, transport, "auto",
          "collectives transport: auto (ibverbs where an RDMA device exists, else TCP), tcp or "
          "ibverbs");
ABSL_FLAG(std::string, tcp_wait, "blocking",
          "how a TCP rank waits for peers: blocking (reads its sockets itself), busy_poll (spins; "
          "only when every rank has a core of its own) or async (Gloo's device thread)");
ABSL_FLAG(int, metrics_port, -1,
          "Prometheus /metrics port on the --listen host; 0 picks one, "
          "-1 = off");
ABSL_FLAG(int, state_slots, 16,
          "models with recurrent (linear-attention) layers: lanes that can hold a state at once "
          "(each a float32 copy of every such layer's state; the router admits no more)");
ABSL_FLAG(int, state_checkpoints, 64,
          "models with recurrent layers: checkpoints of a lane's state the worker keeps for "
          "prefix hits (each the size of a state slot); 0 = none, and no prefix is reused");
ABSL_FLAG(int, state_checkpoint_interval, 256,
          "models with recurrent layers: positions between state checkpoints, a multiple of "
          "--block_size (a prefix hit resumes from the last checkpoint at or before it)");
// 0 by default: on the CPU backend the chunked form saves nothing (the
// recurrence is as many flops, vectorised along the value dimension; see
// README, "KDA chunks") and costs the next turn of a conversation the
// prefix reuse of the reply's positions.
ABSL_FLAG(int, kda_chunk, 0,
          "models with KDA layers: prefill runs in the chunked form over whole chunks of this "
          "many positions at absolute multiples of it (must divide --state_checkpoint_interval); "
          "0: every position through the recurrence");
ABSL_FLAG(int, kv_blocks, 0,
          "KV pool size in blocks; 0 = enough for 4 sequences of the "
          "model's full context");
ABSL_FLAG(int, block_size, 16, "KV block size in tokens");
ABSL_FLAG(std::string, kv_dtype, "f32", "KV cache dtype: f32, bf16 or fp8");
ABSL_FLAG(bool, expert_parallel, false,
          "MoE models: each rank holds n_routed / world_size whole experts instead of a slice "
          "of every expert (attention, shared experts and dense layers stay tensor-parallel); "
          "every rank of a group must agree");
ABSL_FLAG(bool, decode_context_parallel, false,
          "latent-cache models (DeepSeek-V3 family) in a group of several ranks: each rank keeps "
          "every world_size-th position of the latent cache instead of all of them, so the group "
          "holds world_size times the context; every rank of a group must agree");
ABSL_FLAG(int, dsa_dense_window, 2051,
          "DSA models (deepseek_v32, glm_moe_dsa): a position with at most this many tokens of "
          "context attends to all of them, beyond to the index_topk the indexer picks");
ABSL_FLAG(int, threads, 1, "compute threads of this rank");
ABSL_FLAG(bool, huge_page_weights, true,
          "cpu backend: copy this rank's matrices out of the file mapping onto transparent huge "
          "pages at load (decode reads every weight per token, and 4 KiB pages cost it a TLB "
          "miss each: 1.08-1.30x decode measured); false serves from the mapping");
ABSL_FLAG(std::string, fp8_layout, "tiles",
          "with --huge_page_weights, how FP8 matrices are stored: tiles (interleaved 64-column "
          "groups in tiles of 4 rows, one stream per decode tile: one stream 1.03-1.2x faster "
          "than rows) or rows (the checkpoint's order: a batch of 5 measured 1.09-1.36x faster "
          "than tiles on an AMD EPYC)");
ABSL_FLAG(std::string, backend, "cpu", "compute backend: cpu (cuda is not built yet)");
ABSL_FLAG(int, join_timeout_ms, 60000,
          "how long to wait for the other ranks before logging who is missing");
ABSL_FLAG(int, collective_timeout_ms, 30000,
          "longest wait inside one collective before the group counts as broken");
ABSL_FLAG(int, drain_timeout_ms, 10000,
          "on SIGTERM, how long open streams may continue before they are cancelled");
ABSL_FLAG(std::string, log_level, "info", "debug, info, warning or error");
ABSL_FLAG(std::string, tls_ca, "",
          "PEM file of the CA that signs every peer's certificate: with --tls_cert and --tls_key, "
          "the Worker and Rendezvous services require client certificates from it and this rank "
          "dials its rendezvous over mutual TLS (all three or none)");
ABSL_FLAG(std::string, tls_cert, "",
          "PEM certificate this rank presents, as server and as client (SANs must cover the "
          "address peers dial)");
ABSL_FLAG(std::string, tls_key, "", "PEM private key of --tls_cert");
ABSL_FLAG(bool, allow_plaintext, false,
          "serve a non-loopback --listen without TLS (anyone who reaches it can run rounds and "
          "read or overwrite KV blocks)");

ABSL_FLAG(std::string, health_listen, "",
          "also serve grpc.health.v1 alone, in plaintext, on this host:port (for probes that "
          "cannot present a client certificate); empty = none");
ABSL_FLAG(std::string, kvstore, "",
          "host:port of this node's ringlane-kvstore: blocks the router offloads go there and "
          "restores come from there (empty: no kvstore)");
ABSL_FLAG(int, kvstore_deadline_ms, 300,
          "deadline of every kvstore call; a slower store counts as down for that call");
ABSL_FLAG(int, kvstore_shm_mb, 64,
          "MiB of the shared-memory segment payloads to and from a kvstore on the same node "
          "travel through (0 = gRPC only; a kvstore that cannot see it is used over gRPC)");
ABSL_FLAG(std::string, kvstore_rdma, "auto",
          "RDMA verbs for payloads to and from the kvstore: auto (where a device exists), on (no "
          "device is an error), off; a kvstore that refuses it is used over shared memory or gRPC");
ABSL_FLAG(std::string, kvstore_rdma_device, "",
          "RDMA device for the kvstore as NAME[:PORT[:GID_INDEX]] (empty: the first device, port "
          "1, GID index 0)");
ABSL_FLAG(int, kvstore_rdma_mb, 64,
          "MiB of the registered (pinned) buffer for RDMA payloads to and from the kvstore");
ABSL_FLAG(int, kvstore_queue_mb, 256,
          "payload MiB of offloaded blocks waiting for upload; beyond it new ones are dropped");

namespace {

namespace rw = ringlane::worker;
namespace rs = ringlane::services;
using rs::ExitWithUsageError;

std::string ModelId(const std::string& path) {
  std::filesystem::path p(path);
  if (std::filesystem::is_directory(p)) {
    std::string name = p.filename().string();
    if (name.empty()) name = p.parent_path().filename().string();
    return name;
  }
  return p.stem().string();
}

// A revision string that changes when the weights do: a hash of the config and
// weight files' names and sizes.
std::string ModelRevision(const std::string& path) {
  namespace fs = std::filesystem;
  std::vector<std::string> parts;
  std::error_code ec;
  if (fs::is_directory(path)) {
    for (const auto& e : fs::directory_iterator(path, ec)) {
      if (e.is_regular_file()) {
        parts.push_back(absl::StrCat(e.path().filename().string(), ":", e.file_size()));
      }
    }
  } else {
    parts.push_back(absl::StrCat(fs::path(path).filename().string(), ":", fs::file_size(path, ec)));
  }
  std::sort(parts.begin(), parts.end());
  std::string all;
  for (const auto& s : parts) absl::StrAppend(&all, s, "\n");
  return absl::StrFormat("%016x", XXH64(all.data(), all.size(), 0));
}

// --huge_page_weights: *model becomes its copy on huge pages; false (logged)
// when the copy cannot be allocated.
bool Resident(std::shared_ptr<const rw::ModelWeights>* model, const char* what) {
  const auto t0 = std::chrono::steady_clock::now();
  rw::ResidentReport report;
  auto r = rw::MakeResident(*model, &report, absl::GetFlag(FLAGS_fp8_layout) == "tiles");
  if (!r.ok()) {
    RL_LOG(ERROR) << what << ": " << r.status().message()
                  << " (--huge_page_weights=false serves from the file mapping)";
    return false;
  }
  *model = *r;
  const double ms =
      std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
  if (!report.huge_pages) {
    RL_LOG(INFO) << what << ": transparent huge pages are off; served from the file mapping";
  } else {
    RL_LOG(INFO) << absl::StrFormat(
        "%s: %d matrices (%d FP8 in row tiles), %.1f MiB copied onto huge pages in %.0f ms "
        "(%.1f MiB backed by 2 MiB pages)",
        what, report.matrices, report.row_tiled, report.bytes / 1048576.0, ms,
        report.huge_page_bytes / 1048576.0);
  }
  return true;
}

bool IsWildcard(const std::string& host) {
  return host == "0.0.0.0" || host == "::" || host.empty();
}

}  // namespace

int main(int argc, char** argv) {
  absl::SetProgramUsageMessage(
      "One tensor-parallel rank of a ringlane worker group.\n"
      "  ringlane-worker --model=DIR_OR_BIN [--rank=R --world_size=W --rendezvous=HOST:PORT]");
  absl::ParseCommandLine(argc, argv);
  rs::InstallShutdownSignalHandlers();

  auto level = rs::ParseSeverity(absl::GetFlag(FLAGS_log_level));
  if (!level.ok()) ExitWithUsageError(absl::StrCat("--log_level: ", level.status().message()));
  rs::SetMinLogSeverity(*level);

  const std::string model_path = absl::GetFlag(FLAGS_model);
  if (model_path.empty()) ExitWithUsageError("--model is required");
  if (!std::filesystem::exists(model_path)) {
    ExitWithUsageError(absl::StrCat("--model: ", model_path, " does not exist"));
  }
  const std::string draft_path = absl::GetFlag(FLAGS_draft_model);
  if (!draft_path.empty() && !std::filesystem::exists(draft_path)) {
    ExitWithUsageError(absl::StrCat("--draft_model: ", draft_path, " does not exist"));
  }
  const int draft_layers = absl::GetFlag(FLAGS_draft_layers);
  if (draft_layers < 0) ExitWithUsageError("--draft_layers must be >= 0");
  const bool draft_mtp = absl::GetFlag(FLAGS_draft_mtp);
  if ((draft_layers > 0) + !draft_path.empty() + draft_mtp > 1) {
    ExitWithUsageError(
        "--draft_model, --draft_layers and --draft_mtp are three ways to draft; give one");
  }
  const int world = absl::GetFlag(FLAGS_world_size);
  const int rank = absl::GetFlag(FLAGS_rank);
  if (world < 1 || world > 64) ExitWithUsageError("--world_size must be in [1, 64]");
  if (rank < 0 || rank >= world) {
    ExitWithUsageError(absl::StrCat("--rank must be in [0, ", world, ") for --world_size=", world));
  }
  const std::string group_name = absl::GetFlag(FLAGS_group);
  if (group_name.empty() || group_name.find('/') != std::string::npos) {
    ExitWithUsageError("--group must be a non-empty name without '/'");
  }
  std::string rendezvous = absl::GetFlag(FLAGS_rendezvous);
  if (!rendezvous.empty()) {
    if (auto hp = rs::ParseHostPort(rendezvous); !hp.ok() || hp->second == 0) {
      ExitWithUsageError(
          absl::StrCat("--rendezvous: '", rendezvous, "' is not host:port with a non-zero port"));
    }
  } else if (world > 1 && rank != 0) {
    ExitWithUsageError("--rendezvous is required on ranks other than 0");
  }
  int collective_port_min = 0, collective_port_max = 0;
  if (const std::string ports = absl::GetFlag(FLAGS_collective_ports); !ports.empty()) {
    const std::vector<std::string> parts = absl::StrSplit(ports, '-');
    if (parts.size() != 2 || !absl::SimpleAtoi(parts[0], &collective_port_min) ||
        !absl::SimpleAtoi(parts[1], &collective_port_max) || collective_port_min < 1 ||
        collective_port_max > 65535 || collective_port_min > collective_port_max) {
      ExitWithUsageError(absl::StrCat("--collective_ports: '", ports,
                                      "' is not LO-HI with 1 <= LO <= HI <= 65535"));
    }
  }
  std::string listen_flag = absl::GetFlag(FLAGS_listen);
  if (listen_flag.empty()) listen_flag = absl::StrCat("127.0.0.1:", 50061 + rank);
  auto listen = rs::ParseHostPort(listen_flag);
  if (!listen.ok()) ExitWithUsageError(absl::StrCat("--listen: ", listen.status().message()));
  auto tls = rs::ListenerTls(
      {absl::GetFlag(FLAGS_tls_ca), absl::GetFlag(FLAGS_tls_cert), absl::GetFlag(FLAGS_tls_key)},
      listen->first, listen_flag, absl::GetFlag(FLAGS_allow_plaintext));
  if (!tls.ok()) ExitWithUsageError(std::string(tls.status().message()));
  // Before the first server or channel: the rendezvous client, the Gloo
  // store and the NCCL id exchange all dial with it.
  rs::SetPeerTls(*tls);
  const int metrics_port = absl::GetFlag(FLAGS_metrics_port);
  if (metrics_port != -1) {
    if (absl::Status s = rs::ValidatePort(metrics_port); !s.ok()) {
      ExitWithUsageError(absl::StrCat("--metrics_port: ", s.message()));
    }
  }
  const int threads = absl::GetFlag(FLAGS_threads);
  if (threads < 1 || threads > 256) ExitWithUsageError("--threads must be in [1, 256]");
  const int block_size = absl::GetFlag(FLAGS_block_size);
  if (block_size < 1 || block_size > 4096) ExitWithUsageError("--block_size must be in [1, 4096]");
  const bool expert_parallel = absl::GetFlag(FLAGS_expert_parallel);
  const int dense_window = absl::GetFlag(FLAGS_dsa_dense_window);
  if (dense_window < 1) ExitWithUsageError("--dsa_dense_window must be positive");
  if (absl::GetFlag(FLAGS_state_slots) < 1 || absl::GetFlag(FLAGS_state_slots) > 4096) {
    ExitWithUsageError("--state_slots must be in [1, 4096]");
  }
  if (absl::GetFlag(FLAGS_state_checkpoints) < 0 ||
      absl::GetFlag(FLAGS_state_checkpoints) > 65536) {
    ExitWithUsageError("--state_checkpoints must be in [0, 65536]");
  }
  const int kda_chunk = absl::GetFlag(FLAGS_kda_chunk);
  if (kda_chunk < 0 || kda_chunk > 1024) ExitWithUsageError("--kda_chunk must be in [0, 1024]");
  int kv_blocks = absl::GetFlag(FLAGS_kv_blocks);
  if (kv_blocks < 0) ExitWithUsageError("--kv_blocks must be >= 0");
  auto kv_dtype = rw::ParseDTypeFlag(absl::GetFlag(FLAGS_kv_dtype));
  if (!kv_dtype.ok() || *kv_dtype == rw::DType::kF16) {
    ExitWithUsageError("--kv_dtype must be f32, bf16 or fp8");
  }
  const std::string transport = absl::GetFlag(FLAGS_transport);
  if (transport != "auto" && transport != "tcp" && transport != "ibverbs") {
    ExitWithUsageError("--transport must be auto, tcp or ibverbs");
  }
  const std::string tcp_wait = absl::GetFlag(FLAGS_tcp_wait);
  if (tcp_wait != "blocking" && tcp_wait != "busy_poll" && tcp_wait != "async") {
    ExitWithUsageError("--tcp_wait must be blocking, busy_poll or async");
  }
  const std::string fp8_layout = absl::GetFlag(FLAGS_fp8_layout);
  if (fp8_layout != "tiles" && fp8_layout != "rows") {
    ExitWithUsageError("--fp8_layout must be tiles or rows");
  }
  const std::string backend = absl::GetFlag(FLAGS_backend);
  if (backend == "cuda") {
    ExitWithUsageError("--backend=cuda: this build has no CUDA backend yet; use --backend=cpu");
  } else if (backend != "cpu") {
    ExitWithUsageError(absl::StrCat("--backend: unknown backend '", backend, "' (cpu)"));
  }
  for (auto [name, v] : {std::pair{"--join_timeout_ms", absl::GetFlag(FLAGS_join_timeout_ms)},
                         {"--collective_timeout_ms", absl::GetFlag(FLAGS_collective_timeout_ms)},
                         {"--drain_timeout_ms", absl::GetFlag(FLAGS_drain_timeout_ms)}}) {
    if (v < 1) ExitWithUsageError(absl::StrCat(name, " must be positive"));
  }
  const std::string kvstore_address = absl::GetFlag(FLAGS_kvstore);
  if (!kvstore_address.empty()) {
    if (auto hp = rs::ParseHostPort(kvstore_address); !hp.ok() || hp->second == 0) {
      ExitWithUsageError(
          absl::StrCat("--kvstore: '", kvstore_address, "' is not host:port with a non-zero port"));
    }
  }
  const int kvstore_deadline_ms = absl::GetFlag(FLAGS_kvstore_deadline_ms);
  if (kvstore_deadline_ms < 1 || kvstore_deadline_ms > 60000) {
    ExitWithUsageError("--kvstore_deadline_ms must be in [1, 60000]");
  }
  const int kvstore_shm_mb = absl::GetFlag(FLAGS_kvstore_shm_mb);
  if (kvstore_shm_mb < 0 || kvstore_shm_mb > 65536) {
    ExitWithUsageError("--kvstore_shm_mb must be in [0, 65536]");
  }
  const int kvstore_queue_mb = absl::GetFlag(FLAGS_kvstore_queue_mb);
  if (kvstore_queue_mb < 0 || kvstore_queue_mb > (1 << 20)) {
    ExitWithUsageError("--kvstore_queue_mb must be in [0, 1048576]");
  }
  auto kvstore_rdma = rs::ParseRdmaMode(absl::GetFlag(FLAGS_kvstore_rdma));
  if (!kvstore_rdma.ok()) {
    ExitWithUsageError(absl::StrCat("--kvstore_rdma: ", kvstore_rdma.status().message()));
  }
  auto kvstore_rdma_spec = rs::ParseRdmaDeviceSpec(absl::GetFlag(FLAGS_kvstore_rdma_device));
  if (!kvstore_rdma_spec.ok()) {
    ExitWithUsageError(
        absl::StrCat("--kvstore_rdma_device: ", kvstore_rdma_spec.status().message()));
  }
  const int kvstore_rdma_mb = absl::GetFlag(FLAGS_kvstore_rdma_mb);
  if (kvstore_rdma_mb < 1 || kvstore_rdma_mb > 16384) {
    ExitWithUsageError("--kvstore_rdma_mb must be in [1, 16384]");
  }
  // The kvstore's RDMA device, looked for once here (only with a kvstore):
  // none with auto is one log line below and shared memory or gRPC; none
  // with on is an error, as the collectives' forced ibverbs.
  std::optional<rs::RdmaDeviceSpec> kvstore_rdma_device;
  std::string kvstore_rdma_why;
  if (!kvstore_address.empty()) {
    auto d = rs::ResolveRdma(*kvstore_rdma, *kvstore_rdma_spec, &kvstore_rdma_why);
    if (!d.ok()) {
      RL_LOG(ERROR) << "--kvstore_rdma=" << rs::RdmaModeName(*kvstore_rdma) << ": "
                    << d.status().message();
      return 1;
    }
    kvstore_rdma_device = *d;
  }
  rs::SetLogComponent(absl::StrCat("worker/", group_name, "/r", rank));

  // The model: the whole file is mapped; the shard views only its part, so
  // the pages this rank touches are its own.
  const auto t0 = std::chrono::steady_clock::now();
  RL_LOG(INFO) << "loading " << model_path << " (rank " << rank << " of " << world << ")";
  auto full = rw::LoadModel(model_path);
  if (!full.ok()) {
    RL_LOG(ERROR) << "cannot load the model: " << full.status().message();
    return 1;
  }
  (*full)->config.indexer.dense_window = dense_window;
  if ((*full)->config.linear.heads > 0) (*full)->config.linear.chunk = kda_chunk;
  std::shared_ptr<const rw::ModelWeights> shard(std::move(*full));
  // The self-drafter views the whole model, so it is cut before sharding.
  std::shared_ptr<const rw::ModelWeights> draft;
  if (draft_layers > 0 && rank == 0) {
    auto d = rw::FirstLayers(shard, draft_layers);
    if (!d.ok()) {
      RL_LOG(ERROR) << "--draft_layers: " << d.status().message();
      return 1;
    }
    draft = *d;
    RL_LOG(INFO) << "self-drafter: the model's first " << draft_layers << " of "
                 << shard->config.layers << " layers";
  }
  if (draft_mtp && rank == 0) {
    auto d = rw::MtpDrafter(shard);
    if (!d.ok()) {
      RL_LOG(ERROR) << "--draft_mtp: " << d.status().message();
      return 1;
    }
    draft = *d;
    RL_LOG(INFO) << "MTP drafter: the checkpoint's layer " << shard->config.layers;
  }
  if (world > 1) {
    auto s = rw::ShardModel(shard, rank, world, {.expert_parallel = expert_parallel});
    if (!s.ok()) {
      RL_LOG(ERROR) << "cannot shard the model " << world << " ways: " << s.status().message();
      return 1;
    }
    shard = *s;
  }
  const bool huge_pages = absl::GetFlag(FLAGS_huge_page_weights) && backend == rw::kCpuBackend;
  if (huge_pages && !Resident(&shard, "weights")) return 1;
  if (huge_pages && draft != nullptr && !Resident(&draft, "self-drafter weights")) return 1;
  const rw::ModelConfig& cfg = shard->config;
  const int context = cfg.max_position > 0 ? cfg.max_position : 2048;
  const bool dcp = absl::GetFlag(FLAGS_decode_context_parallel) && world > 1;
  if (dcp && !rw::IsMla(cfg)) {
    RL_LOG(ERROR) << "--decode_context_parallel splits a latent cache by position; "
                  << cfg.model_type << " keeps per-head K/V (tensor parallelism splits its heads)";
    return 1;
  }
  if (dcp && cfg.indexer.Pooled()) {
    // A pool's positions would sit on different ranks.
    RL_LOG(ERROR) << "--decode_context_parallel with the pooled indexer (index_kpool "
                  << cfg.indexer.kpool << ") is not supported";
    return 1;
  }
  // A block id of the router's covers block_tokens positions: block_size of
  // them on each rank under context parallel.
  const int block_tokens = block_size * (dcp ? world : 1);
  if (kv_blocks == 0) kv_blocks = 4 * ((context + block_tokens - 1) / block_tokens);
  const int checkpoint_interval = absl::GetFlag(FLAGS_state_checkpoint_interval);
  if (checkpoint_interval <= 0 || checkpoint_interval % block_tokens != 0) {
    ExitWithUsageError(absl::StrCat("--state_checkpoint_interval (", checkpoint_interval,
                                    ") must be a positive multiple of the block's ", block_tokens,
                                    " tokens"));
  }
  if (cfg.linear.heads > 0 && kda_chunk > 0 && checkpoint_interval % kda_chunk != 0) {
    // A prefix hit resumes at a checkpoint, where its prefill continues in
    // whole chunks only if the checkpoint ends one.
    ExitWithUsageError(absl::StrCat("--kda_chunk (", kda_chunk,
                                    ") must divide --state_checkpoint_interval (",
                                    checkpoint_interval, ")"));
  }
  const rw::KvPoolSpec pool{kv_blocks,
                            block_size,
                            *kv_dtype,
                            absl::GetFlag(FLAGS_state_slots),
                            absl::GetFlag(FLAGS_state_checkpoints),
                            checkpoint_interval};
  rw::KvPoolSpec info_pool = pool;
  info_pool.block_size = block_tokens;
  absl::StatusOr<int64_t> block_bytes_or = rw::KvBlockBytes(backend, cfg, shard->shard, pool);
  if (!block_bytes_or.ok()) {
    RL_LOG(ERROR) << "KV pool: " << block_bytes_or.status().message();
    return 1;
  }
  const int64_t block_bytes = *block_bytes_or;
  absl::StatusOr<std::vector<rw::LayerCacheSpec>> layer_caches =
      rw::LayerCaches(backend, cfg, shard->shard);
  if (!layer_caches.ok()) {
    RL_LOG(ERROR) << "KV pool: " << layer_caches.status().message();
    return 1;
  }
  RL_LOG(INFO) << absl::StrFormat(
      "model %s: %d layers, %d/%d heads (this rank %d, KV %d), vocab %d, context %d; "
      "KV pool %d blocks x %d tokens, %s, %.1f MiB, %d bytes per token (%s); loaded in %.0f ms",
      model_path, cfg.layers, cfg.heads, cfg.kv_heads, shard->shard.heads, shard->shard.kv_heads,
      cfg.vocab, context, kv_blocks, block_tokens, rw::DTypeName(*kv_dtype),
      static_cast<double>(block_bytes) * kv_blocks / (1 << 20), block_bytes / block_tokens,
      dcp ? absl::StrCat("latent, 1 position in ", world, ": decode context parallel")
          : std::string(rw::IsMla(cfg) ? "latent" : "K/V"),
      std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count());
  const int64_t state_bytes_per_slot = rw::StateBytesPerSlot(*layer_caches);
  if (state_bytes_per_slot > 0) {
    RL_LOG(INFO) << absl::StrFormat(
        "recurrent state: %d slots and %d checkpoints (every %d positions) x %.2f MiB (every "
        "linear-attention layer's state of a lane), %.1f MiB; the router admits at most %d lanes",
        pool.state_slots, pool.state_checkpoints, checkpoint_interval,
        static_cast<double>(state_bytes_per_slot) / (1 << 20),
        static_cast<double>(state_bytes_per_slot) * (pool.state_slots + pool.state_checkpoints) /
            (1 << 20),
        pool.state_slots);
  }

  // The draft model runs on rank 0 only, whole; the others need not load it.
  if (!draft_path.empty() && rank == 0) {
    RL_LOG(INFO) << "loading the draft model " << draft_path;
    auto d = rw::LoadModel(draft_path);
    if (!d.ok()) {
      RL_LOG(ERROR) << "cannot load the draft model: " << d.status().message();
      return 1;
    }
    (*d)->config.indexer.dense_window = dense_window;
    const rw::ModelConfig& dc = (*d)->config;
    if (dc.vocab != cfg.vocab) {
      RL_LOG(ERROR) << "--draft_model: its vocabulary has " << dc.vocab << " tokens, the model's "
                    << cfg.vocab << "; a draft model must share it";
      return 1;
    }
    if (dc.max_position > 0 && dc.max_position < context) {
      RL_LOG(ERROR) << "--draft_model: its context (" << dc.max_position
                    << " tokens) is shorter than the model's (" << context << ")";
      return 1;
    }
    if (absl::StatusOr<int64_t> b = rw::KvBlockBytes(backend, dc, (*d)->shard, pool); !b.ok()) {
      RL_LOG(ERROR) << "--draft_model: " << b.status().message();
      return 1;
    }
    RL_LOG(INFO) << absl::StrFormat("draft model %s: %d layers, %d heads, vocab %d", draft_path,
                                    dc.layers, dc.heads, dc.vocab);
    draft = std::shared_ptr<const rw::ModelWeights>(std::move(*d));
    if (huge_pages && !Resident(&draft, "draft model weights")) return 1;
  }

  // Metrics first, so that a port clash fails before the group forms.
  const std::string model_id =
      absl::GetFlag(FLAGS_model_id).empty() ? ModelId(model_path) : absl::GetFlag(FLAGS_model_id);
  auto registry = std::make_shared<prometheus::Registry>();
  rw::WorkerMetrics metrics(*registry, model_id, group_name, rank);
  metrics.kv_pool_blocks->Set(kv_blocks);
  metrics.state_slots->Set(state_bytes_per_slot > 0 ? pool.state_slots : 0);
  metrics.state_bytes->Set(
      static_cast<double>(state_bytes_per_slot) *
      (state_bytes_per_slot > 0 ? pool.state_slots + pool.state_checkpoints : 0));
  std::unique_ptr<prometheus::Exposer> exposer;
  if (metrics_port >= 0) {
    try {
      exposer = std::make_unique<prometheus::Exposer>(rs::JoinHostPort(listen->first, metrics_port),
                                                      /*num_threads=*/1);
    } catch (const std::exception& e) {
      RL_LOG(ERROR) << "--metrics_port " << metrics_port << ": " << e.what();
      return 1;
    }
    exposer->RegisterCollectable(registry);
  }

  rw::GroupOptions go;
  go.name = group_name;
  go.rank = rank;
  go.world_size = world;
  go.host = absl::GetFlag(FLAGS_collective_host);
  if (go.host.empty()) go.host = IsWildcard(listen->first) ? "127.0.0.1" : listen->first;
  go.port_min = collective_port_min;
  go.port_max = collective_port_max;
  go.join_timeout = std::chrono::milliseconds(absl::GetFlag(FLAGS_join_timeout_ms));
  go.collective_timeout = std::chrono::milliseconds(absl::GetFlag(FLAGS_collective_timeout_ms));
  go.kv_pool = pool;
  go.transport = transport;
  go.tcp_wait = tcp_wait;
  go.backend.kind = backend;
  go.backend.cpu.threads = threads;
  go.backend.cpu.context_parallel = dcp;
  go.draft_model = draft;
  rw::GroupMember group(shard, go);

  rw::WorkerIdentity id;
  id.model_id = model_id;
  id.model_revision = ModelRevision(model_path);
  id.backend = backend;
  id.group = group_name;
  id.rank = rank;
  id.world_size = world;
  // A context-parallel block holds every world-th position: not
  // exchangeable with a replicated one, nor across ranks.
  id.kv_layout_fingerprint =
      rw::KvLayoutFingerprint(dcp ? absl::StrCat(backend, "/dcp", world) : backend, *layer_caches);
  if (draft != nullptr) {
    id.draft_model_id = !draft_path.empty() ? ModelId(draft_path)
                        : draft_mtp         ? absl::StrCat(model_id, " (MTP layer)")
                                    : absl::StrCat(model_id, " (first ", draft_layers, " layers)");
    id.max_proposed_drafts = rw::kMaxProposedDrafts;
  }
  if (cfg.moe.n_routed > 0) id.moe_sharding = expert_parallel && world > 1 ? "ep" : "tp";
  id.kv_rank_shared = !dcp && std::all_of(layer_caches->begin(), layer_caches->end(),
                                          [](const rw::LayerCacheSpec& c) {
                                            return c.kind == rw::CacheKind::kLatentKv;
                                          });
  // The store is reached lazily (a channel connects on first use), so a
  // kvstore that starts after the worker, or restarts, is used once it is up.
  std::unique_ptr<rw::KvStoreLink> kvstore;
  if (!kvstore_address.empty()) {
    rs::KvStoreClientOptions ko;
    ko.deadline = std::chrono::milliseconds(kvstore_deadline_ms);
    // A block stored with its state checkpoint carries the state and its
    // position too (worker_service.cc).
    ko.max_block_bytes = std::max<int64_t>(
        block_bytes + (state_bytes_per_slot > 0 ? 8 + state_bytes_per_slot : 0), 1);
    ko.shm_bytes = int64_t{kvstore_shm_mb} << 20;
    if (kvstore_rdma_device.has_value()) {
      ko.rdma_bytes = int64_t{kvstore_rdma_mb} << 20;
      ko.rdma_device = *kvstore_rdma_device;
    }
    rw::KvStoreLinkOptions lo;
    lo.max_queued_bytes = static_cast<size_t>(kvstore_queue_mb) << 20;
    kvstore = std::make_unique<rw::KvStoreLink>(rs::KvStoreClient::Connect(kvstore_address, ko), lo,
                                                &metrics);
    id.kvstore_address = kvstore_address;
    RL_LOG(INFO) << "kvstore at " << kvstore_address << " (deadline " << kvstore_deadline_ms
                 << " ms, upload queue " << kvstore_queue_mb << " MiB, shared memory "
                 << kvstore_shm_mb << " MiB when on the same node)";
    if (kvstore_rdma_device.has_value()) {
      RL_LOG(INFO) << "kvstore payloads over RDMA on " << kvstore_rdma_device->name << " port "
                   << kvstore_rdma_device->port << " (" << kvstore_rdma_mb
                   << " MiB registered) where the kvstore accepts it";
    } else {
      RL_LOG(INFO) << "kvstore: " << kvstore_rdma_why << "; payloads go over "
                   << (kvstore_shm_mb > 0 ? "shared memory when on the same node, else gRPC"
                                          : "gRPC");
    }
  }
  rw::WorkerService service(&group, cfg, info_pool, block_bytes, std::move(*layer_caches), id,
                            &metrics, kvstore.get());
  rw::RendezvousService rendezvous_service;

  grpc::EnableDefaultHealthCheckService(true);
  grpc::reflection::InitProtoReflectionServerBuilderPlugin();
  grpc::ServerBuilder builder;
  int port = 0;
  builder.AddListeningPort(listen_flag, rs::PeerServerCredentials(), &port);
  // The router pings its workers (keepalive) to notice a frozen rank between
  // rounds, as often as every second with a short round deadline; gRPC's
  // default policy would take those pings for abuse and close the
  // connection. Pinging the router back ends a stream whose router froze or
  // vanished without closing its socket, so that a new router can connect.
  builder.AddChannelArgument(GRPC_ARG_HTTP2_MIN_RECV_PING_INTERVAL_WITHOUT_DATA_MS, 500);
  builder.AddChannelArgument(GRPC_ARG_KEEPALIVE_PERMIT_WITHOUT_CALLS, 1);
  builder.AddChannelArgument(GRPC_ARG_HTTP2_MAX_PING_STRIKES, 0);
  builder.AddChannelArgument(GRPC_ARG_KEEPALIVE_TIME_MS, 10000);
  builder.AddChannelArgument(GRPC_ARG_KEEPALIVE_TIMEOUT_MS, 10000);
  builder.RegisterService(&service);
  const bool serve_rendezvous = world > 1 && rendezvous.empty();
  if (serve_rendezvous) builder.RegisterService(&rendezvous_service);
  std::unique_ptr<grpc::Server> server = builder.BuildAndStart();
  if (server == nullptr || port == 0) {
    RL_LOG(ERROR) << "cannot listen on " << listen_flag << " (in use? --listen picks another"
                  << (rs::PeerTlsEnabled() ? "; or --tls_cert and --tls_key do not match" : "")
                  << ")";
    return 1;
  }
  const std::string reach_host = IsWildcard(listen->first) ? "127.0.0.1" : listen->first;
  if (serve_rendezvous) rendezvous = rs::JoinHostPort(reach_host, port);
  // Known only now that the server has its port.
  group.set_rendezvous_address(rendezvous);

  std::unique_ptr<rs::HealthPort> health_port;
  if (const std::string hl = absl::GetFlag(FLAGS_health_listen); !hl.empty()) {
    auto hp = rs::HealthPort::Start(hl, {"ringlane.v1.Worker"});
    if (!hp.ok()) {
      RL_LOG(ERROR) << "--health_listen: " << hp.status().message();
      return 1;
    }
    health_port = std::move(*hp);
  }
  grpc::HealthCheckServiceInterface* health = server->GetHealthCheckService();
  auto set_health = [health, &health_port](bool serving) {
    if (health_port) health_port->Set(serving);
    if (health == nullptr) return;
    health->SetServingStatus(serving);
    health->SetServingStatus("ringlane.v1.Worker", serving);
  };
  set_health(false);
  group.set_on_change([&](const rw::GroupMember::State& s) {
    set_health(s.ready && !rs::ShutdownRequested());
    metrics.group_ready->Set(s.ready ? 1 : 0);
    metrics.group_epoch->Set(s.ready ? static_cast<double>(s.epoch) : 0);
    if (s.ready) metrics.group_formations->Increment();
  });
  group.Start();

  std::printf("LISTENING worker=%s\n", rs::JoinHostPort(reach_host, port).c_str());
  if (health_port) {
    std::printf("LISTENING health=%s\n", rs::JoinHostPort(reach_host, health_port->port()).c_str());
  }
  if (exposer) {
    std::vector<int> ports = exposer->GetListeningPorts();
    std::printf("LISTENING metrics=%s\n",
                rs::JoinHostPort(reach_host, ports.empty() ? metrics_port : ports[0]).c_str());
  }
  std::fflush(stdout);
  RL_LOG(INFO) << "serving on " << rs::JoinHostPort(reach_host, port) << " (group '" << group_name
               << "', rank " << rank << " of " << world
               << (world > 1 ? absl::StrCat(", rendezvous ", rendezvous,
                                            serve_rendezvous ? " served here" : "")
                             : std::string())
               << (rs::PeerTlsEnabled() ? ", mutual TLS" : ", plaintext") << ")";

  const int sig = rs::WaitForShutdownSignal();
  RL_LOG(INFO) << "signal " << sig << ": draining (up to " << absl::GetFlag(FLAGS_drain_timeout_ms)
               << " ms for open streams)";
  set_health(false);
  service.Drain();
  group.RequestStop();
  server->Shutdown(std::chrono::system_clock::now() +
                   std::chrono::milliseconds(absl::GetFlag(FLAGS_drain_timeout_ms)));
  group.Stop();
  RL_LOG(INFO) << "stopped";
  return 0;
}
