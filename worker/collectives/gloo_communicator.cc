// Gloo over TCP. Gloo reports failures by throwing; every call is wrapped here
// so none escapes into the engine (STYLE: no exceptions across threads or
// RPCs), and a failure becomes Unavailable.
#include <exception>
#include <vector>

#include "absl/strings/str_cat.h"
#include "gloo/allgather.h"
#include "gloo/barrier.h"
#include "gloo/broadcast.h"
#include "gloo/rendezvous/context.h"
#include "gloo/rendezvous/file_store.h"
#include "gloo/transport/tcp/device.h"
#include "worker/collectives/communicator.h"
#include "worker/collectives/gloo_context.h"
#include "worker/rendezvous/rendezvous.h"

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

class GlooCommunicator final : public Communicator {
 public:
  GlooCommunicator(std::shared_ptr<gloo::rendezvous::Context> ctx,
                   std::chrono::milliseconds timeout)
      : ctx_(std::move(ctx)), timeout_(timeout) {}

  int rank() const override { return ctx_->rank; }
  int world_size() const override { return ctx_->size; }
  std::string name() const override { return absl::StrCat("gloo-tcp(", ctx_->size, " ranks)"); }

  absl::Status AllReduceSum(float* data, size_t count) override {
    gathered_.resize(count * ctx_->size);
    if (absl::Status st = AllGather(data, count, gathered_.data()); !st.ok()) return st;
    SumInRankOrder(gathered_.data(), ctx_->size, count, data);
    return absl::OkStatus();
  }

  absl::Status AllGather(const float* in, size_t count, float* out) override {
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
    return Guard("barrier", [&] {
      gloo::BarrierOptions opts(ctx_);
      opts.setTag(next_tag_++);
      opts.setTimeout(timeout_);
      gloo::barrier(opts);
    });
  }

 private:
  std::shared_ptr<gloo::rendezvous::Context> ctx_;
  std::chrono::milliseconds timeout_;
  uint32_t next_tag_ = 1;
  std::vector<float> gathered_;
};

}  // namespace

absl::StatusOr<std::shared_ptr<gloo::rendezvous::Context>> ConnectGloo(const GlooOptions& o) {
  if (o.world_size < 1 || o.rank < 0 || o.rank >= o.world_size) {
    return absl::InvalidArgumentError(
        absl::StrCat("rank ", o.rank, " outside a group of ", o.world_size));
  }
  if (o.file_store_dir.empty() && o.rendezvous_address.empty()) {
    return absl::InvalidArgumentError("gloo: neither a rendezvous address nor a directory");
  }
  std::shared_ptr<gloo::rendezvous::Context> ctx;
  absl::Status st = Guard("rendezvous", [&] {
    gloo::transport::tcp::attr attr;
    attr.hostname = o.host;
    auto dev = gloo::transport::tcp::CreateDevice(attr);
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

absl::StatusOr<std::unique_ptr<Communicator>> CreateGlooCommunicator(const GlooOptions& o) {
  auto ctx = ConnectGloo(o);
  if (!ctx.ok()) return ctx.status();
  return std::unique_ptr<Communicator>(new GlooCommunicator(std::move(*ctx), o.timeout));
}

}  // namespace ringlane::worker
