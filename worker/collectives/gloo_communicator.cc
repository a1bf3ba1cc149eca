// Gloo over TCP or ibverbs. Gloo reports failures by throwing; every call is
// wrapped here so none escapes into the engine (STYLE: no exceptions across
// threads or RPCs), and a failure becomes Unavailable.
#include <netinet/in.h>
#include <sys/socket.h>

#include <algorithm>
#include <climits>
#include <cstring>
#include <exception>
#include <map>
#include <mutex>
#include <stdexcept>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "gloo/allgather.h"
#include "gloo/allgather_ring.h"
#include "gloo/barrier.h"
#include "gloo/barrier_all_to_all.h"
#include "gloo/broadcast.h"
#include "gloo/broadcast_one_to_all.h"
#include "gloo/rendezvous/context.h"
#include "gloo/rendezvous/file_store.h"
#include "gloo/transport/tcp/device.h"
#include "services/log.h"
#include "services/rdma.h"
#include "worker/collectives/communicator.h"
#include "worker/collectives/gloo_context.h"
#include "worker/rendezvous/rendezvous.h"

#if RINGLANE_HAVE_IBVERBS
#include <infiniband/verbs.h>

#include "gloo/transport/ibverbs/device.h"
#endif

namespace ringlane::worker {
namespace {

template <typename Fn>
absl::Status Guard(const char* what, Fn&& fn) {
  try {
    fn();
    return absl::OkStatus();
  } catch (const std::exception& e) {
    return absl::UnavailableError(absl::StrCat("gloo ", what, " failed: ", e.what()));
  }
}

// Registered-buffer algorithms are built once per message shape and run again:
// over ibverbs, building one registers memory and trades keys with the peer.
// Past these bounds every cached one is dropped, on every rank at the same
// call, since all ranks see the same sequence of shapes.
constexpr size_t kMaxBoundShapes = 32;
constexpr size_t kMaxBoundBytes = size_t{256} << 20;

class GlooCommunicator final : public Communicator {
 public:
  GlooCommunicator(std::shared_ptr<gloo::rendezvous::Context> ctx, GlooTransport transport,
                   bool bound, std::chrono::milliseconds timeout)
      : ctx_(std::move(ctx)), transport_(transport), bound_(bound), timeout_(timeout) {}

  int rank() const override { return ctx_->rank; }
  int world_size() const override { return ctx_->size; }
  std::string name() const override {
    return absl::StrCat("gloo-", GlooTransportName(transport_), "(", ctx_->size, " ranks)");
  }

  absl::Status AllReduceSum(float* data, size_t count) override {
    gathered_.resize(count * ctx_->size);
    if (absl::Status st = AllGather(data, count, gathered_.data()); !st.ok()) return st;
    SumInRankOrder(gathered_.data(), ctx_->size, count, data);
    return absl::OkStatus();
  }

  absl::Status AllGather(const float* in, size_t count, float* out) override {
    if (count == 0) return absl::OkStatus();
    if (bound_) return BoundAllGather(in, count, out);
    return Guard("allgather", [&] {
      gloo::AllgatherOptions opts(ctx_);
      opts.setInput(const_cast<float*>(in), count);
      opts.setOutput(out, count * ctx_->size);
      opts.setTag(next_tag_++);
      opts.setTimeout(timeout_);
      gloo::allgather(opts);
    });
  }

  absl::Status Broadcast(float* data, size_t count, int root) override {
    if (root < 0 || root >= ctx_->size) {
      return absl::InvalidArgumentError(absl::StrCat("broadcast root ", root, " out of range"));
    }
    if (count == 0) return absl::OkStatus();
    if (bound_) return BoundBroadcast(data, count, root);
    return Guard("broadcast", [&] {
      gloo::BroadcastOptions opts(ctx_);
      opts.setOutput(data, count);
      opts.setRoot(root);
      opts.setTag(next_tag_++);
      opts.setTimeout(timeout_);
      gloo::broadcast(opts);
    });
  }

  absl::Status Barrier() override {
    if (bound_) {
      if (ctx_->size == 1) return absl::OkStatus();
      return Guard("barrier", [&] {
        if (!barrier_) barrier_ = std::make_unique<gloo::BarrierAllToAll>(ctx_);
        barrier_->run();
      });
    }
    return Guard("barrier", [&] {
      gloo::BarrierOptions opts(ctx_);
      opts.setTag(next_tag_++);
      opts.setTimeout(timeout_);
      gloo::barrier(opts);
    });
  }

 private:
  // The caller's buffers are copied through buffers of our own: a registration
  // pins pages, and a caller's freed buffer whose address comes back would
  // leave it pinning the old ones.
  struct BoundAllgather {
    std::vector<float> in;
    std::vector<float> out;
    std::unique_ptr<gloo::AllgatherRing<float>> algorithm;
  };
  struct BoundBroadcastEntry {
    std::vector<float> data;
    std::unique_ptr<gloo::BroadcastOneToAll<float>> algorithm;
  };

  absl::Status BoundAllGather(const float* in, size_t count, float* out) {
    const size_t n = ctx_->size;
    // AllgatherRing keeps byte counts and offsets in int.
    if (count > static_cast<size_t>(INT_MAX) / sizeof(float) / n) {
      return absl::InvalidArgumentError(
          absl::StrCat("allgather of ", count, " floats over ", n, " ranks is too large"));
    }
    if (n == 1) {
      std::memmove(out, in, count * sizeof(float));
      return absl::OkStatus();
    }
    absl::Status st = Guard("allgather", [&] {
      auto it = allgathers_.find(count);
      if (it == allgathers_.end()) {
        MakeRoom(count * (n + 1) * sizeof(float));
        BoundAllgather& e = allgathers_[count];
        e.in.resize(count);
        e.out.resize(count * n);
        e.algorithm = std::make_unique<gloo::AllgatherRing<float>>(
            ctx_, std::vector<const float*>{e.in.data()}, e.out.data(), static_cast<int>(count));
        bound_bytes_ += count * (n + 1) * sizeof(float);
        it = allgathers_.find(count);
      }
      BoundAllgather& e = it->second;
      std::memcpy(e.in.data(), in, count * sizeof(float));
      e.algorithm->run();
      std::memcpy(out, e.out.data(), count * n * sizeof(float));
    });
    // A half-built entry would be run next time; the group is unusable after
    // a failure anyway, but it must not crash.
    if (!st.ok()) allgathers_.erase(count);
    return st;
  }

  absl::Status BoundBroadcast(float* data, size_t count, int root) {
    if (ctx_->size == 1) return absl::OkStatus();
    if (count > static_cast<size_t>(INT_MAX) / sizeof(float)) {
      return absl::InvalidArgumentError(
          absl::StrCat("broadcast of ", count, " floats is too large"));
    }
    const auto key = std::make_pair(count, root);
    absl::Status st = Guard("broadcast", [&] {
      auto it = broadcasts_.find(key);
      if (it == broadcasts_.end()) {
        MakeRoom(count * sizeof(float));
        BoundBroadcastEntry& e = broadcasts_[key];
        e.data.resize(count);
        e.algorithm = std::make_unique<gloo::BroadcastOneToAll<float>>(
            ctx_, std::vector<float*>{e.data.data()}, count, root);
        bound_bytes_ += count * sizeof(float);
        it = broadcasts_.find(key);
      }
      BoundBroadcastEntry& e = it->second;
      if (ctx_->rank == root) std::memcpy(e.data.data(), data, count * sizeof(float));
      e.algorithm->run();
      std::memcpy(data, e.data.data(), count * sizeof(float));
    });
    if (!st.ok()) broadcasts_.erase(key);
    return st;
  }

  // Throws like Gloo (called inside Guard).
  void MakeRoom(size_t more_bytes) {
    if (allgathers_.size() + broadcasts_.size() < kMaxBoundShapes &&
        bound_bytes_ + more_bytes <= kMaxBoundBytes) {
      return;
    }
    // A peer may still be sending into a buffer about to be deregistered; once
    // every rank has passed a barrier, every earlier message has landed.
    if (!barrier_) barrier_ = std::make_unique<gloo::BarrierAllToAll>(ctx_);
    barrier_->run();
    allgathers_.clear();
    broadcasts_.clear();
    bound_bytes_ = 0;
  }

  std::shared_ptr<gloo::rendezvous::Context> ctx_;
  const GlooTransport transport_;
  // Registered-buffer algorithms (ibverbs, or forced for tests) rather than
  // Gloo's tagged unbound-buffer ones.
  const bool bound_;
  std::chrono::milliseconds timeout_;
  uint32_t next_tag_ = 1;
  std::vector<float> gathered_;

  std::map<size_t, BoundAllgather> allgathers_;                       // by count
  std::map<std::pair<size_t, int>, BoundBroadcastEntry> broadcasts_;  // by count, root
  std::unique_ptr<gloo::BarrierAllToAll> barrier_;
  size_t bound_bytes_ = 0;  // staging bytes held by allgathers_ and broadcasts_
};

// A TCP device whose listening socket binds to the first free port of
// [port_min, port_max] on attr.hostname: CreateDevice resolves the address
// with port 0 (the kernel's choice), so the port is set in the resolved
// address and the Device is built from it. Throws (inside Guard) when every
// port of the range is taken.
std::shared_ptr<gloo::transport::Device> CreateTcpDeviceInRange(
    const gloo::transport::tcp::attr& src, int port_min, int port_max) {
  gloo::transport::tcp::attr attr = gloo::transport::tcp::CreateDeviceAttr(src);
  std::string last_error;
  for (int port = port_min; port <= port_max; ++port) {
    auto* ss = reinterpret_cast<sockaddr_storage*>(&attr.ai_addr);
    if (ss->ss_family == AF_INET) {
      reinterpret_cast<sockaddr_in*>(ss)->sin_port = htons(static_cast<uint16_t>(port));
    } else if (ss->ss_family == AF_INET6) {
      reinterpret_cast<sockaddr_in6*>(ss)->sin6_port = htons(static_cast<uint16_t>(port));
    } else {
      throw std::runtime_error("collectives: the address of " + src.hostname +
                               " is neither IPv4 nor IPv6");
    }
    try {
      return std::make_shared<gloo::transport::tcp::Device>(attr);
    } catch (const std::exception& e) {
      last_error = e.what();  // taken: try the next port
    }
  }
  throw std::runtime_error(absl::StrCat("collectives: no free port in ", port_min, "-", port_max,
                                        " on ", src.hostname, " (", last_error, ")"));
}

absl::StatusOr<std::shared_ptr<gloo::rendezvous::Context>> Connect(const GlooOptions& o,
                                                                   GlooTransport transport) {
  if (o.world_size < 1 || o.rank < 0 || o.rank >= o.world_size) {
    return absl::InvalidArgumentError(
        absl::StrCat("rank ", o.rank, " outside a group of ", o.world_size));
  }
  if (o.file_store_dir.empty() && o.rendezvous_address.empty()) {
    return absl::InvalidArgumentError("gloo: neither a rendezvous address nor a directory");
  }
  std::shared_ptr<gloo::rendezvous::Context> ctx;
  absl::Status st = Guard("rendezvous", [&] {
    std::shared_ptr<gloo::transport::Device> dev;
    if (transport == GlooTransport::kIbverbs) {
#if RINGLANE_HAVE_IBVERBS
      gloo::transport::ibverbs::attr attr;
      attr.name = o.ibverbs_device;
      if (attr.name.empty()) {
        const std::vector<std::string> names = RdmaDeviceNames();
        if (names.empty()) throw std::runtime_error("the RDMA device went away");
        attr.name = names.front();
      }
      attr.port = o.ibverbs_port;
      attr.index = o.ibverbs_index;
      dev = gloo::transport::ibverbs::CreateDevice(attr);
#endif
    } else {
      gloo::transport::tcp::attr attr;
      attr.hostname = o.host;
      if (o.port_min <= 0) {
        dev = gloo::transport::tcp::CreateDevice(attr);
      } else {
        dev = CreateTcpDeviceInRange(attr, o.port_min, o.port_max);
      }
    }
    std::unique_ptr<gloo::rendezvous::Store> store;
    if (!o.rendezvous_address.empty()) {
      store = CreateGrpcStore(o.rendezvous_address, o.group, o.timeout);
    } else {
      store = std::make_unique<gloo::rendezvous::FileStore>(o.file_store_dir);
    }
    ctx = std::make_shared<gloo::rendezvous::Context>(o.rank, o.world_size);
    ctx->setTimeout(o.timeout);
    ctx->connectFullMesh(*store, dev);
  });
  if (!st.ok()) return st;
  return ctx;
}

}  // namespace

const char* GlooTransportName(GlooTransport transport) {
  return transport == GlooTransport::kIbverbs ? "ibverbs" : "tcp";
}

std::vector<std::string> RdmaDeviceNames() {
#if RINGLANE_HAVE_IBVERBS
  // One lister for the collectives and the kvstore transport.
  return services::RdmaDeviceNames();
#else
  return {};
#endif
}

absl::StatusOr<GlooTransport> ResolveGlooTransport(const GlooOptions& o) {
  if (o.transport == "tcp") return GlooTransport::kTcp;
  if (o.transport != "auto" && o.transport != "ibverbs") {
    return absl::InvalidArgumentError(
        absl::StrCat("gloo transport '", o.transport, "' is none of auto, tcp, ibverbs"));
  }
#if RINGLANE_HAVE_IBVERBS
  const std::vector<std::string> names = RdmaDeviceNames();
  if (!names.empty()) {
    if (!o.ibverbs_device.empty() &&
        std::find(names.begin(), names.end(), o.ibverbs_device) == names.end()) {
      return absl::FailedPreconditionError(absl::StrCat("RDMA device '", o.ibverbs_device,
                                                        "' not found; this machine has ",
                                                        absl::StrJoin(names, ", ")));
    }
    static std::once_flag logged;
    std::call_once(logged, [&] {
      RL_LOG(INFO) << "Gloo uses ibverbs ("
                   << (o.ibverbs_device.empty() ? names.front() : o.ibverbs_device) << ")";
    });
    return GlooTransport::kIbverbs;
  }
  if (o.transport == "ibverbs") {
    return absl::FailedPreconditionError(
        "gloo transport 'ibverbs' requested, but no RDMA device found "
        "(ibv_get_device_list lists none)");
  }
  static std::once_flag logged_tcp;
  std::call_once(logged_tcp, [] { RL_LOG(INFO) << "no RDMA device found; Gloo uses TCP"; });
#else
  if (o.transport == "ibverbs") {
    return absl::FailedPreconditionError(
        "gloo transport 'ibverbs' requested, but this build has no rdma-core "
        "(RINGLANE_WITH_RDMA=OFF or libibverbs not found)");
  }
  static std::once_flag logged;
  std::call_once(logged, [] { RL_LOG(INFO) << "built without rdma-core; Gloo uses TCP"; });
#endif
  return GlooTransport::kTcp;
}

absl::StatusOr<std::shared_ptr<gloo::rendezvous::Context>> ConnectGloo(const GlooOptions& o) {
  absl::StatusOr<GlooTransport> transport = ResolveGlooTransport(o);
  if (!transport.ok()) return transport.status();
  return Connect(o, *transport);
}

absl::StatusOr<std::unique_ptr<Communicator>> CreateGlooCommunicator(const GlooOptions& o) {
  absl::StatusOr<GlooTransport> transport = ResolveGlooTransport(o);
  if (!transport.ok()) return transport.status();
  auto ctx = Connect(o, *transport);
  if (!ctx.ok()) return ctx.status();
  if (o.tcp_wait != "async" && o.tcp_wait != "blocking" && o.tcp_wait != "busy_poll") {
    return absl::InvalidArgumentError(
        absl::StrCat("gloo tcp_wait '", o.tcp_wait, "' is none of async, blocking, busy_poll"));
  }
  const bool sync = *transport == GlooTransport::kTcp && o.tcp_wait != "async";
  if (sync) {
    absl::Status st = Guard("tcp_wait", [&] {
      for (int i = 0; i < (*ctx)->size; ++i) {
        if (i != (*ctx)->rank) (*ctx)->getPair(i)->setSync(true, o.tcp_wait == "busy_poll");
      }
    });
    if (!st.ok()) return st;
  }
  const bool bound = *transport == GlooTransport::kIbverbs || o.bound_buffers_for_testing || sync;
  return std::unique_ptr<Communicator>(
      new GlooCommunicator(std::move(*ctx), *transport, bound, o.timeout));
}

}  // namespace ringlane::worker
