// ringlane-kvstore: one per node. Keeps KV blocks that left the workers'
// device pools in a DRAM tier and (with --disk_dir) a disk tier, and serves
// them over the KvStore gRPC service with gRPC health and, with
// --metrics_port, Prometheus /metrics. Prints `LISTENING kvstore=host:port`
// (and `LISTENING metrics=host:port`) on stdout once it serves; on SIGTERM
// it drains its calls and writes its DRAM tier to disk, so a graceful
// restart keeps every block. Bad flags exit with status 2, a store or port
// it cannot use with status 1.
#include <grpcpp/ext/proto_server_reflection_plugin.h>
#include <grpcpp/grpcpp.h>
#include <grpcpp/health_check_service_interface.h>

#include <chrono>
#include <cstdio>
#include <filesystem>
#include <limits>
#include <memory>
#include <string>

#include "absl/flags/flag.h"
#include "absl/flags/parse.h"
#include "absl/flags/usage.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "kvstore/server/kvstore_metrics.h"
#include "kvstore/server/kvstore_service.h"
#include "kvstore/store.h"
#include "prometheus/exposer.h"
#include "services/flags_util.h"
#include "services/grpc_security.h"
#include "services/health_port.h"
#include "services/listener_tls.h"
#include "services/log.h"
#include "services/rdma.h"
#include "services/signals.h"

ABSL_FLAG(std::string, listen, "127.0.0.1:50071", "host:port to serve gRPC on; port 0 picks one");
ABSL_FLAG(int, metrics_port, -1,
          "Prometheus /metrics port on the --listen host; 0 picks one, -1 = off");
ABSL_FLAG(int64_t, dram_bytes, int64_t{1} << 30,
          "DRAM tier budget in bytes (payloads plus ~128 bytes per entry)");
ABSL_FLAG(std::string, disk_dir, "",
          "directory of the disk tier (RocksDB; created when missing, kept across restarts); "
          "empty = no disk tier");
ABSL_FLAG(int64_t, disk_bytes, int64_t{16} << 30,
          "disk tier budget in payload bytes (RocksDB's own files come on top)");
ABSL_FLAG(int64_t, disk_max_entries, int64_t{1} << 20,
          "most entries in the disk tier (its index lives in memory, ~200 bytes an entry)");
ABSL_FLAG(bool, write_through, false,
          "write every new block to disk at once too, so a kill -9 loses nothing acknowledged");
ABSL_FLAG(bool, disk_sync, false, "fsync the disk tier's log on every write (power-loss safe)");
ABSL_FLAG(int64_t, max_block_bytes, int64_t{64} << 20, "largest block payload a Put may store");
ABSL_FLAG(int64_t, max_chunk_bytes, int64_t{4} << 20,
          "largest data of one Put chunk, and largest chunk a Get may ask for");
ABSL_FLAG(int, max_keys_per_request, 4096, "most keys in one Get or Lookup");
ABSL_FLAG(int, max_concurrent_calls, 64, "calls served at once; more fail with RESOURCE_EXHAUSTED");
ABSL_FLAG(std::string, health_listen, "",
          "also serve grpc.health.v1 alone, in plaintext, on this host:port (for probes that "
          "cannot present a client certificate); empty = none");
ABSL_FLAG(std::string, shm_dir, "/dev/shm",
          "where clients on this node put the shared-memory segments payloads travel through "
          "(AttachShm); empty = gRPC only");
ABSL_FLAG(int, max_shm_segments, 64, "shared-memory segments attached at once (one per client)");
ABSL_FLAG(std::string, rdma, "auto",
          "RDMA verbs transport (AttachRdma): auto (where a device exists), on (no device is an "
          "error), off");
ABSL_FLAG(std::string, rdma_device, "",
          "RDMA device as NAME[:PORT[:GID_INDEX]] (empty: the first device, port 1, GID index 0)");
ABSL_FLAG(int64_t, max_rdma_bytes, int64_t{256} << 20,
          "largest registered (pinned) buffer one RDMA client gets");
ABSL_FLAG(int, max_rdma_clients, 16,
          "RDMA clients attached at once (a queue pair and a buffer each)");
// Short: every kvstore call is bounded by its client's deadline (hundreds of
// ms), and gRPC's Shutdown waits out the whole deadline while any client
// keeps a connection open, even an idle one.
ABSL_FLAG(int, drain_timeout_ms, 1000,
          "on SIGTERM, how long running calls may finish (gRPC waits this long while clients "
          "stay connected)");
ABSL_FLAG(std::string, log_level, "info", "debug, info, warning or error");
ABSL_FLAG(std::string, tls_ca, "",
          "PEM file of the CA that signs every peer's certificate: with --tls_cert and --tls_key "
          "the KvStore service requires client certificates from it (all three or none)");
ABSL_FLAG(std::string, tls_cert, "", "PEM certificate this kvstore presents");
ABSL_FLAG(std::string, tls_key, "", "PEM private key of --tls_cert");
ABSL_FLAG(bool, allow_plaintext, false,
          "serve a non-loopback --listen without TLS (anyone who reaches it can read and write "
          "KV blocks)");

namespace {

namespace rk = ringlane::kvstore;
namespace rs = ringlane::services;
using rs::ExitWithUsageError;

// A numeric flag and its range, checked in one loop before anything is
// built (the router's convention).
struct FlagRange {
  const char* name;  // without the leading "--"
  double value;
  double min;
  double max;
};

void CheckFlagRanges(std::initializer_list<FlagRange> flags) {
  auto number = [](double x) { return absl::StrFormat("%.15g", x); };
  for (const FlagRange& f : flags) {
    if (f.value >= f.min && f.value <= f.max) continue;
    ExitWithUsageError(
        absl::StrCat("--", f.name, " must be in [", number(f.min), ", ", number(f.max), "]"));
  }
}

template <typename T>
FlagRange Range(const char* name, T value, double min, double max) {
  return {name, static_cast<double>(value), min, max};
}

bool IsWildcard(const std::string& host) {
  return host == "0.0.0.0" || host == "::" || host.empty();
}

}  // namespace

int main(int argc, char** argv) {
  absl::SetProgramUsageMessage(
      "The ringlane KV block store (one per node).\n"
      "  ringlane-kvstore [--listen=127.0.0.1:50071] [--dram_bytes=N] [--disk_dir=DIR "
      "--disk_bytes=N]");
  absl::ParseCommandLine(argc, argv);
  rs::InstallShutdownSignalHandlers();
  rs::SetLogComponent("kvstore");

  auto level = rs::ParseSeverity(absl::GetFlag(FLAGS_log_level));
  if (!level.ok()) ExitWithUsageError(absl::StrCat("--log_level: ", level.status().message()));
  rs::SetMinLogSeverity(*level);

  const std::string listen_flag = absl::GetFlag(FLAGS_listen);
  auto listen = rs::ParseHostPort(listen_flag);
  if (!listen.ok()) ExitWithUsageError(absl::StrCat("--listen: ", listen.status().message()));
  const int metrics_port = absl::GetFlag(FLAGS_metrics_port);
  constexpr double kTiB = 1099511627776.0;
  CheckFlagRanges({
      Range("metrics_port", metrics_port, -1, 65535),
      Range("dram_bytes", absl::GetFlag(FLAGS_dram_bytes), 0, 64 * kTiB),
      Range("disk_bytes", absl::GetFlag(FLAGS_disk_bytes), 1, 1024 * kTiB),
      Range("disk_max_entries", absl::GetFlag(FLAGS_disk_max_entries), 1, 1 << 30),
      Range("max_block_bytes", absl::GetFlag(FLAGS_max_block_bytes), 1, 1 << 30),
      Range("max_chunk_bytes", absl::GetFlag(FLAGS_max_chunk_bytes), 1024, 64 << 20),
      Range("max_keys_per_request", absl::GetFlag(FLAGS_max_keys_per_request), 1, 1 << 20),
      Range("max_concurrent_calls", absl::GetFlag(FLAGS_max_concurrent_calls), 1, 4096),
      Range("max_shm_segments", absl::GetFlag(FLAGS_max_shm_segments), 1, 4096),
      Range("max_rdma_bytes", absl::GetFlag(FLAGS_max_rdma_bytes), 4096, 16 * 1073741824.0),
      Range("max_rdma_clients", absl::GetFlag(FLAGS_max_rdma_clients), 1, 1024),
      Range("drain_timeout_ms", absl::GetFlag(FLAGS_drain_timeout_ms), 1, 3600000),
  });
  auto rdma_mode = rs::ParseRdmaMode(absl::GetFlag(FLAGS_rdma));
  if (!rdma_mode.ok()) ExitWithUsageError(absl::StrCat("--rdma: ", rdma_mode.status().message()));
  auto rdma_spec = rs::ParseRdmaDeviceSpec(absl::GetFlag(FLAGS_rdma_device));
  if (!rdma_spec.ok()) {
    ExitWithUsageError(absl::StrCat("--rdma_device: ", rdma_spec.status().message()));
  }
  const std::string disk_dir = absl::GetFlag(FLAGS_disk_dir);
  if (!disk_dir.empty()) {
    std::error_code ec;
    if (std::filesystem::exists(disk_dir, ec) && !std::filesystem::is_directory(disk_dir, ec)) {
      ExitWithUsageError(absl::StrCat("--disk_dir: ", disk_dir, " is not a directory"));
    }
  }
  auto tls = rs::ListenerTls(
      {absl::GetFlag(FLAGS_tls_ca), absl::GetFlag(FLAGS_tls_cert), absl::GetFlag(FLAGS_tls_key)},
      listen->first, listen_flag, absl::GetFlag(FLAGS_allow_plaintext));
  if (!tls.ok()) ExitWithUsageError(std::string(tls.status().message()));
  rs::SetPeerTls(*tls);

  rk::StoreOptions so;
  so.dram_bytes = absl::GetFlag(FLAGS_dram_bytes);
  so.disk_dir = disk_dir;
  so.disk_bytes = absl::GetFlag(FLAGS_disk_bytes);
  so.disk_max_entries = absl::GetFlag(FLAGS_disk_max_entries);
  so.disk_sync_writes = absl::GetFlag(FLAGS_disk_sync);
  so.write_through = absl::GetFlag(FLAGS_write_through);
  auto store = rk::Store::Open(so);
  if (!store.ok()) {
    RL_LOG(ERROR) << "cannot open the store: " << store.status().message();
    return 1;
  }
  rk::ServiceLimits limits;
  limits.max_block_bytes = absl::GetFlag(FLAGS_max_block_bytes);
  limits.max_chunk_bytes = absl::GetFlag(FLAGS_max_chunk_bytes);
  limits.max_keys_per_request = absl::GetFlag(FLAGS_max_keys_per_request);
  limits.max_concurrent_calls = absl::GetFlag(FLAGS_max_concurrent_calls);
  limits.shm_dir = absl::GetFlag(FLAGS_shm_dir);
  limits.max_shm_segments = absl::GetFlag(FLAGS_max_shm_segments);
  limits.max_rdma_bytes = absl::GetFlag(FLAGS_max_rdma_bytes);
  limits.max_rdma_clients = absl::GetFlag(FLAGS_max_rdma_clients);
  {
    // Where a device exists it is opened once, here; without one (or with
    // --rdma=off) AttachRdma is refused and clients stay on shared memory
    // or gRPC. --rdma=on without a usable device stops the daemon.
    std::string why;
    auto device = rs::ResolveRdma(*rdma_mode, *rdma_spec, &why);
    if (!device.ok()) {
      RL_LOG(ERROR) << "--rdma=" << rs::RdmaModeName(*rdma_mode) << ": "
                    << device.status().message();
      return 1;
    }
    if (device->has_value()) {
      auto opened = rs::RdmaDevice::Open(**device);
      if (opened.ok()) {
        limits.rdma_device = *opened;
        RL_LOG(INFO) << "RDMA on " << (*device)->name << " port " << (*device)->port
                     << ", GID index " << (*device)->gid_index << ": up to "
                     << limits.max_rdma_clients << " clients of " << limits.max_rdma_bytes
                     << " bytes";
      } else if (*rdma_mode == rs::RdmaMode::kOn) {
        RL_LOG(ERROR) << "--rdma=on: " << opened.status().message();
        return 1;
      } else {
        why = absl::StrCat("RDMA unavailable: ", opened.status().message());
      }
    }
    if (limits.rdma_device == nullptr) {
      limits.rdma_unavailable = absl::StrCat(why, " on this kvstore");
      RL_LOG(INFO) << why << "; clients use "
                   << (limits.shm_dir.empty() ? "gRPC"
                                              : "shared memory on this node, gRPC otherwise");
    }
  }
  rk::KvStoreService service(store->get(), limits);

  // Metrics first, so that a port clash fails before the service listens.
  auto collector = std::make_shared<rk::KvStoreCollector>(store->get(), &service);
  std::unique_ptr<prometheus::Exposer> exposer;
  if (metrics_port >= 0) {
    try {
      exposer = std::make_unique<prometheus::Exposer>(rs::JoinHostPort(listen->first, metrics_port),
                                                      /*num_threads=*/1);
    } catch (const std::exception& e) {
      RL_LOG(ERROR) << "--metrics_port " << metrics_port << ": " << e.what();
      return 1;
    }
    exposer->RegisterCollectable(collector);
  }

  grpc::EnableDefaultHealthCheckService(true);
  grpc::reflection::InitProtoReflectionServerBuilderPlugin();
  grpc::ServerBuilder builder;
  int port = 0;
  builder.AddListeningPort(listen_flag, rs::PeerServerCredentials(), &port);
  // gRPC binds with SO_REUSEPORT by default, so a second kvstore on a port
  // in use would "listen" and split the traffic; refuse instead.
  builder.AddChannelArgument(GRPC_ARG_ALLOW_REUSEPORT, 0);
  // A chunk's data plus its key and framing.
  builder.SetMaxReceiveMessageSize(static_cast<int>(limits.max_chunk_bytes + (64 << 10)));
  builder.SetMaxSendMessageSize(static_cast<int>(limits.max_chunk_bytes + (64 << 10)));
  builder.RegisterService(&service);
  std::unique_ptr<grpc::Server> server = builder.BuildAndStart();
  if (server == nullptr || port == 0) {
    RL_LOG(ERROR) << "cannot listen on " << listen_flag << " (in use? --listen picks another"
                  << (rs::PeerTlsEnabled() ? "; or --tls_cert and --tls_key do not match" : "")
                  << ")";
    return 1;
  }
  std::unique_ptr<rs::HealthPort> health_port;
  if (const std::string hl = absl::GetFlag(FLAGS_health_listen); !hl.empty()) {
    auto hp = rs::HealthPort::Start(hl, {"ringlane.v1.KvStore"});
    if (!hp.ok()) {
      RL_LOG(ERROR) << "--health_listen: " << hp.status().message();
      return 1;
    }
    health_port = std::move(*hp);
    health_port->Set(true);
  }
  grpc::HealthCheckServiceInterface* health = server->GetHealthCheckService();
  if (health != nullptr) {
    health->SetServingStatus(true);
    health->SetServingStatus("ringlane.v1.KvStore", true);
  }
  const std::string reach_host = IsWildcard(listen->first) ? "127.0.0.1" : listen->first;
  std::printf("LISTENING kvstore=%s\n", rs::JoinHostPort(reach_host, port).c_str());
  if (health_port) {
    std::printf("LISTENING health=%s\n", rs::JoinHostPort(reach_host, health_port->port()).c_str());
  }
  if (exposer) {
    std::vector<int> ports = exposer->GetListeningPorts();
    std::printf("LISTENING metrics=%s\n",
                rs::JoinHostPort(reach_host, ports.empty() ? metrics_port : ports[0]).c_str());
  }
  std::fflush(stdout);
  const ringlane::v1::StatsResponse st = (*store)->Stats();
  RL_LOG(INFO) << "serving on " << rs::JoinHostPort(reach_host, port) << ": DRAM " << so.dram_bytes
               << " bytes"
               << (disk_dir.empty()
                       ? std::string(", no disk tier")
                       : absl::StrCat(", disk ", disk_dir, " (", so.disk_bytes, " bytes, ",
                                      st.disk().entries(), " entries found)"))
               << (rs::PeerTlsEnabled() ? ", mutual TLS" : ", plaintext");

  const int sig = rs::WaitForShutdownSignal();
  RL_LOG(INFO) << "signal " << sig << ": draining (up to " << absl::GetFlag(FLAGS_drain_timeout_ms)
               << " ms)";
  if (health != nullptr) health->SetServingStatus(false);
  if (health_port) health_port->Set(false);
  server->Shutdown(std::chrono::system_clock::now() +
                   std::chrono::milliseconds(absl::GetFlag(FLAGS_drain_timeout_ms)));
  if (exposer) exposer->RemoveCollectable(collector);
  (*store)->FlushDramToDisk();
  RL_LOG(INFO) << "stopped";
  return 0;
}
