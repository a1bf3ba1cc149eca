// Offload and restore bandwidth through the kvstore client (a benchmark,
// not a test; issue 14): puts N blocks of B bytes into a running
// ringlane-kvstore, reads them back as one prefix chain (each block verified
// on receipt, as a worker restores), and copies the same bytes with memcpy
// in the same run, so the figures can be read as fractions of this machine's
// memory bandwidth. Every transport, interleaved: gRPC over loopback, the
// same-node shared-memory segment, and RDMA verbs where a device exists
// (--rdma=auto; without one it says so and measures the other two).
//
//   ringlane-kvstore-transfer-bench --kvstore=HOST:PORT [--blocks=256 --block_bytes=1048576
//   --repeats=3 --rdma=auto --rdma_device=NAME[:PORT[:GID_INDEX]]]
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <memory>
#include <string>
#include <vector>

#include "absl/flags/flag.h"
#include "absl/flags/parse.h"
#include "absl/strings/str_format.h"
#include "services/kvstore_client.h"
#include "services/rdma.h"

ABSL_FLAG(std::string, kvstore, "", "host:port of a running ringlane-kvstore (required)");
ABSL_FLAG(int, blocks, 256, "blocks per put and per get");
ABSL_FLAG(int, block_bytes, 1 << 20, "bytes per block");
ABSL_FLAG(int, repeats, 3, "rounds of put, get and memcpy; the best of each is reported");
ABSL_FLAG(std::string, rdma, "auto", "RDMA client too: auto (where a device exists), on, off");
ABSL_FLAG(std::string, rdma_device, "", "RDMA device as NAME[:PORT[:GID_INDEX]]");

namespace {

namespace v1 = ringlane::v1;
using Clock = std::chrono::steady_clock;

double Seconds(Clock::time_point a, Clock::time_point b) {
  return std::chrono::duration<double>(b - a).count();
}

}  // namespace

int main(int argc, char** argv) {
  absl::ParseCommandLine(argc, argv);
  const std::string address = absl::GetFlag(FLAGS_kvstore);
  const int n = absl::GetFlag(FLAGS_blocks);
  const int bytes = absl::GetFlag(FLAGS_block_bytes);
  const int repeats = absl::GetFlag(FLAGS_repeats);
  if (address.empty() || n < 1 || bytes < 1 || repeats < 1) {
    std::fprintf(stderr, "usage: --kvstore=HOST:PORT, --blocks, --block_bytes, --repeats >= 1\n");
    return 2;
  }
  auto rdma_mode = ringlane::services::ParseRdmaMode(absl::GetFlag(FLAGS_rdma));
  auto rdma_spec = ringlane::services::ParseRdmaDeviceSpec(absl::GetFlag(FLAGS_rdma_device));
  if (!rdma_mode.ok() || !rdma_spec.ok()) {
    std::fprintf(stderr, "usage: --rdma=auto|on|off, --rdma_device=NAME[:PORT[:GID_INDEX]]\n");
    return 2;
  }
  std::string rdma_why;
  auto rdma_device = ringlane::services::ResolveRdma(*rdma_mode, *rdma_spec, &rdma_why);
  if (!rdma_device.ok()) {
    std::fprintf(stderr, "--rdma: %s\n", std::string(rdma_device.status().message()).c_str());
    return 1;
  }
  std::vector<std::string> payloads(n);
  for (int i = 0; i < n; ++i) {
    payloads[i].resize(bytes);
    for (int j = 0; j < bytes; j += 64) payloads[i][j] = static_cast<char>(i * 31 + j);
  }
  const double total = static_cast<double>(n) * bytes;
  struct Best {
    double put = 1e30, get = 1e30, copy = 1e30;
    bool used = false;  // the transport carried the payloads (not refused)
  };
  std::string sink(bytes, '\0');
  // One client per transport, the repeats interleaved so drift hits both.
  ringlane::services::KvStoreClientOptions o;
  o.deadline = std::chrono::seconds(60);
  o.max_block_bytes = bytes;
  auto grpc_client = ringlane::services::KvStoreClient::Connect(address, o);
  o.shm_bytes = int64_t{n} * bytes + 4096;
  auto shm_client = ringlane::services::KvStoreClient::Connect(address, o);
  o.shm_bytes = 0;
  std::unique_ptr<ringlane::services::KvStoreClient> rdma_client;
  if (rdma_device->has_value()) {
    o.rdma_bytes = int64_t{n} * bytes;
    o.rdma_device = **rdma_device;
    rdma_client = ringlane::services::KvStoreClient::Connect(address, o);
  } else {
    std::fprintf(stderr, "%s: measuring gRPC and shared memory only\n", rdma_why.c_str());
  }
  const char* names[3] = {"gRPC", "shared memory", "RDMA"};
  ringlane::services::KvStoreClient* clients[3] = {grpc_client.get(), shm_client.get(),
                                                   rdma_client.get()};
  const int num_transports = rdma_client ? 3 : 2;
  Best best[3];
  for (int r = 0; r < repeats; ++r) {
    for (int t = 0; t < num_transports; ++t) {
      ringlane::services::KvStoreClient& client = *clients[t];
      std::vector<v1::BlockKey> keys(n);
      std::vector<ringlane::services::KvBlockToPut> puts(n);
      for (int i = 0; i < n; ++i) {
        v1::BlockKey& k = keys[i];
        k.set_model_id("transfer-bench");
        std::string h(16, '\0');
        const int id = (r * 3 + t) * n + i;
        std::memcpy(h.data(), &id, sizeof(id));
        k.set_prefix_hash(h);
        k.set_rank(0);
        k.set_tp_world_size(1);
        k.set_kv_dtype(v1::DTYPE_BF16);
        k.set_block_size_tokens(16);
        puts[i] = {k, payloads[i], std::nullopt};
      }
      auto t0 = Clock::now();
      auto put = client.Put(puts);
      auto t1 = Clock::now();
      if (!put.ok()) {
        std::fprintf(stderr, "put: %s\n", std::string(put.status().message()).c_str());
        return 1;
      }
      auto got = client.GetPrefix(keys);
      auto t2 = Clock::now();
      if (!got.ok() || static_cast<int>(got->blocks.size()) != n) {
        std::fprintf(stderr, "get: %s (%zu of %d blocks; is --dram_bytes large enough?)\n",
                     got.ok() ? std::string(got->stopped.message()).c_str()
                              : std::string(got.status().message()).c_str(),
                     got.ok() ? got->blocks.size() : 0, n);
        return 1;
      }
      for (int i = 0; i < n; ++i) std::memcpy(sink.data(), payloads[i].data(), bytes);
      auto t3 = Clock::now();
      best[t].put = std::min(best[t].put, Seconds(t0, t1));
      best[t].get = std::min(best[t].get, Seconds(t1, t2));
      best[t].copy = std::min(best[t].copy, Seconds(t2, t3));
      best[t].used = t == 0 || (t == 1 ? client.shm_bytes_moved() : client.rdma_bytes_moved()) > 0;
      std::fprintf(stderr,
                   "repeat %d/%d %s: put %.3f s, get %.3f s, memcpy %.4f s (bytes by shared "
                   "memory %lld, by RDMA %lld)\n",
                   r + 1, repeats, names[t], Seconds(t0, t1), Seconds(t1, t2), Seconds(t2, t3),
                   static_cast<long long>(client.shm_bytes_moved()),
                   static_cast<long long>(client.rdma_bytes_moved()));
      client.DeleteModel("transfer-bench").IgnoreError();
    }
  }
  double best_copy = 1e30;
  for (int t = 0; t < num_transports; ++t) best_copy = std::min(best_copy, best[t].copy);
  const double copy = total / best_copy / 1e9;
  std::printf("| %d blocks of %d bytes | GB/s (best of %d) | of memcpy |\n", n, bytes, repeats);
  std::printf("|---|---:|---:|\n");
  for (int t = 0; t < num_transports; ++t) {
    const std::string name =
        best[t].used ? names[t] : absl::StrFormat("%s (refused: gRPC)", names[t]);
    std::printf("| offload (Put), %s | %.2f | %.3f |\n", name.c_str(), total / best[t].put / 1e9,
                total / best[t].put / 1e9 / copy);
    std::printf("| restore (GetPrefix, verified), %s | %.2f | %.3f |\n", name.c_str(),
                total / best[t].get / 1e9, total / best[t].get / 1e9 / copy);
  }
  std::printf("| memcpy | %.2f | 1 |\n", copy);
  return 0;
}
