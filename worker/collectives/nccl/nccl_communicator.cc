#include "worker/collectives/nccl_communicator.h"

#include <cuda_runtime.h>
#include <grpcpp/grpcpp.h>
#include <nccl.h>
#include <unistd.h>

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <thread>
#include <utility>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "ringlane/v1/rendezvous.grpc.pb.h"
#include "services/grpc_security.h"
#include "worker/collectives/nccl/rank_order_sum.h"

namespace ringlane::worker {
namespace {

using Clock = std::chrono::steady_clock;

absl::Status ValidateGroup(const NcclOptions& o) {
  if (o.world_size < 1 || o.rank < 0 || o.rank >= o.world_size) {
    return absl::InvalidArgumentError(
        absl::StrCat("nccl: rank ", o.rank, " outside a group of ", o.world_size));
  }
  if (o.world_size > 1 && o.rendezvous_address.empty() && o.file_store_dir.empty()) {
    return absl::InvalidArgumentError("nccl: neither a rendezvous address nor a directory");
  }
  return absl::OkStatus();
}

absl::StatusOr<std::string> NewUniqueId() {
  ncclUniqueId id;
  if (ncclResult_t r = ncclGetUniqueId(&id); r != ncclSuccess) {
    return absl::UnavailableError(absl::StrCat("ncclGetUniqueId: ", ncclGetErrorString(r)));
  }
  return std::string(id.internal, sizeof(id.internal));
}

std::string Where(const NcclOptions& o) {
  return absl::StrCat("NCCL unique id of group '", o.group, "'");
}

absl::Status PublishGrpc(const NcclOptions& o, const std::string& id) {
  auto stub = ringlane::v1::Rendezvous::NewStub(services::NewPeerChannel(o.rendezvous_address));
  ringlane::v1::RendezvousSetRequest req;
  req.set_group(o.group);
  req.set_key(kNcclUniqueIdKey);
  req.set_value(id);
  ringlane::v1::RendezvousSetResponse resp;
  grpc::ClientContext ctx;
  ctx.set_deadline(std::chrono::system_clock::now() + o.timeout);
  ctx.set_wait_for_ready(true);  // the service may still be starting
  grpc::Status st = stub->Set(&ctx, req, &resp);
  if (!st.ok()) {
    return absl::UnavailableError(absl::StrCat("rendezvous at ", o.rendezvous_address,
                                               " (publishing the ", Where(o),
                                               "): ", st.error_message()));
  }
  return absl::OkStatus();
}

absl::StatusOr<std::string> FetchGrpc(const NcclOptions& o) {
  auto stub = ringlane::v1::Rendezvous::NewStub(services::NewPeerChannel(o.rendezvous_address));
  ringlane::v1::RendezvousGetRequest req;
  req.set_group(o.group);
  req.set_key(kNcclUniqueIdKey);
  req.set_wait_ms(o.timeout.count());
  ringlane::v1::RendezvousGetResponse resp;
  grpc::ClientContext ctx;
  // The service answers within wait_ms; the margin is for the call itself.
  ctx.set_deadline(std::chrono::system_clock::now() + o.timeout + std::chrono::seconds(5));
  ctx.set_wait_for_ready(true);
  grpc::Status st = stub->Get(&ctx, req, &resp);
  if (!st.ok()) {
    return absl::UnavailableError(absl::StrCat("rendezvous at ", o.rendezvous_address,
                                               " (waiting for the ", Where(o),
                                               "): ", st.error_message()));
  }
  return std::move(*resp.mutable_value());
}

std::filesystem::path IdFile(const NcclOptions& o) {
  std::string name = o.group;
  for (char& c : name) {
    if (c == '/') c = '_';
  }
  return std::filesystem::path(o.file_store_dir) / (name + "." + kNcclUniqueIdKey);
}

absl::Status PublishFile(const NcclOptions& o, const std::string& id) {
  const std::filesystem::path path = IdFile(o);
  // Readers poll for the final name, so it must appear with all its bytes.
  const std::filesystem::path tmp = path.string() + ".tmp" + std::to_string(getpid());
  {
    std::ofstream out(tmp, std::ios::binary | std::ios::trunc);
    out.write(id.data(), static_cast<std::streamsize>(id.size()));
    if (!out.good()) return absl::UnavailableError(absl::StrCat("writing ", tmp.string()));
  }
  std::error_code ec;
  std::filesystem::rename(tmp, path, ec);
  if (ec)
    return absl::UnavailableError(absl::StrCat("renaming to ", path.string(), ": ", ec.message()));
  return absl::OkStatus();
}

absl::StatusOr<std::string> FetchFile(const NcclOptions& o) {
  const std::filesystem::path path = IdFile(o);
  const auto deadline = Clock::now() + o.timeout;
  for (;;) {
    std::ifstream in(path, std::ios::binary);
    if (in) return std::string(std::istreambuf_iterator<char>(in), {});
    if (Clock::now() >= deadline) {
      return absl::UnavailableError(absl::StrCat(Where(o), " not in ", o.file_store_dir, " within ",
                                                 o.timeout.count(), " ms: rank 0 never arrived"));
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
}

absl::Status NcclStatus(const std::string& what, ncclResult_t r) {
  std::string msg = absl::StrCat("nccl ", what, ": ", ncclGetErrorString(r));
  if (r == ncclInvalidArgument || r == ncclInvalidUsage) return absl::InvalidArgumentError(msg);
  return absl::UnavailableError(msg);
}

absl::Status CudaStatus(const std::string& what, cudaError_t e) {
  return absl::UnavailableError(absl::StrCat("cuda ", what, ": ", cudaGetErrorString(e)));
}

// Owned by the caller's step thread; not thread-safe (communicator.h). The
// NCCL communicator is non-blocking so that a hung peer turns into a timeout
// and an abort instead of a thread stuck forever inside NCCL.
class NcclCommunicator final : public Communicator {
 public:
  NcclCommunicator(int rank, int world_size, int device, std::chrono::milliseconds timeout)
      : rank_(rank), world_size_(world_size), device_(device), timeout_(timeout) {}

  ~NcclCommunicator() override {
    cudaSetDevice(device_);
    if (comm_ != nullptr) {
      // Finalize flushes NCCL's outstanding work; if even that hangs, abort.
      ncclResult_t r = ncclCommFinalize(comm_);
      if (Settle("finalize", r).ok()) {
        ncclCommDestroy(comm_);
      } else if (comm_ != nullptr) {
        ncclCommAbort(comm_);
      }
      comm_ = nullptr;
    }
    if (scratch_ != nullptr) cudaFree(scratch_);
    if (one_ != nullptr) cudaFree(one_);
    if (own_stream_ && stream_ != nullptr) cudaStreamDestroy(stream_);
  }

  absl::Status Init(const std::string& unique_id, cudaStream_t stream) {
    if (cudaError_t e = cudaSetDevice(device_); e != cudaSuccess) {
      return CudaStatus(absl::StrCat("set device ", device_), e);
    }
    if (stream != nullptr) {
      stream_ = stream;
    } else {
      if (cudaError_t e = cudaStreamCreateWithFlags(&stream_, cudaStreamNonBlocking);
          e != cudaSuccess) {
        return CudaStatus("create stream", e);
      }
      own_stream_ = true;
    }
    if (cudaError_t e = cudaMalloc(&one_, sizeof(float)); e != cudaSuccess) {
      return CudaStatus("malloc", e);
    }
    ncclUniqueId id;
    std::copy(unique_id.begin(), unique_id.end(), id.internal);
    ncclConfig_t config = NCCL_CONFIG_INITIALIZER;
    config.blocking = 0;
    ncclResult_t r = ncclCommInitRankConfig(&comm_, world_size_, id, rank_, &config);
    if (r != ncclSuccess && r != ncclInProgress) {
      if (comm_ != nullptr) ncclCommAbort(comm_);
      comm_ = nullptr;
      return NcclStatus(absl::StrCat("init of rank ", rank_, " of ", world_size_), r);
    }
    if (absl::Status st = Settle("init (a peer never connected?)", r); !st.ok()) {
      comm_ = nullptr;  // Settle aborted it
      return st;
    }
    return absl::OkStatus();
  }

  int rank() const override { return rank_; }
  int world_size() const override { return world_size_; }
  std::string name() const override {
    return absl::StrCat("nccl(", world_size_, " ranks, cuda:", device_, ")");
  }

  absl::Status AllReduceSum(float* data, size_t count) override {
    if (absl::Status st = Enter(); !st.ok() || count == 0) return st;
    const size_t need = count * world_size_;
    if (need > scratch_floats_) {
      // Every earlier call has finished (each waits), so nothing still reads it.
      if (scratch_ != nullptr) cudaFree(scratch_);
      scratch_ = nullptr;
      scratch_floats_ = 0;
      if (cudaError_t e = cudaMalloc(&scratch_, need * sizeof(float)); e != cudaSuccess) {
        return Fail(CudaStatus("malloc of the all-reduce scratch", e));
      }
      scratch_floats_ = need;
    }
    if (absl::Status st =
            Settle("allgather", ncclAllGather(data, scratch_, count, ncclFloat32, comm_, stream_));
        !st.ok()) {
      return st;
    }
    if (cudaError_t e = LaunchRankOrderSum(scratch_, world_size_, count, data, stream_);
        e != cudaSuccess) {
      return Fail(CudaStatus("rank-order sum", e));
    }
    return Wait("allreduce");
  }

  absl::Status AllGather(const float* in, size_t count, float* out) override {
    if (absl::Status st = Enter(); !st.ok() || count == 0) return st;
    if (absl::Status st =
            Settle("allgather", ncclAllGather(in, out, count, ncclFloat32, comm_, stream_));
        !st.ok()) {
      return st;
    }
    return Wait("allgather");
  }

  absl::Status Broadcast(float* data, size_t count, int root) override {
    if (root < 0 || root >= world_size_) {
      return absl::InvalidArgumentError(absl::StrCat("broadcast root ", root, " out of range"));
    }
    if (absl::Status st = Enter(); !st.ok() || count == 0) return st;
    if (absl::Status st = Settle(
            "broadcast", ncclBroadcast(data, data, count, ncclFloat32, root, comm_, stream_));
        !st.ok()) {
      return st;
    }
    return Wait("broadcast");
  }

  absl::Status Barrier() override {
    if (absl::Status st = Enter(); !st.ok()) return st;
    // NCCL has no barrier; a one-element all-reduce completes only once every
    // rank has entered it. Its value is never read, so its order is moot.
    if (absl::Status st =
            Settle("barrier", ncclAllReduce(one_, one_, 1, ncclFloat32, ncclSum, comm_, stream_));
        !st.ok()) {
      return st;
    }
    return Wait("barrier");
  }

 private:
  // The calling thread may have another device current (a backend's); NCCL
  // and the kernel launch use the current one.
  absl::Status Enter() {
    if (!broken_.ok()) {
      return absl::UnavailableError(
          absl::StrCat("nccl communicator unusable after: ", broken_.message()));
    }
    if (cudaError_t e = cudaSetDevice(device_); e != cudaSuccess) {
      return Fail(CudaStatus(absl::StrCat("set device ", device_), e));
    }
    return absl::OkStatus();
  }

  // A non-blocking communicator may still be working on the call that
  // returned `r`; NCCL wants that finished before the next NCCL call.
  absl::Status Settle(const std::string& what, ncclResult_t r) {
    if (r != ncclSuccess && r != ncclInProgress) return Fail(NcclStatus(what, r));
    const auto deadline = Clock::now() + timeout_;
    for (;;) {
      ncclResult_t state = ncclSuccess;
      if (ncclResult_t q = ncclCommGetAsyncError(comm_, &state); q != ncclSuccess) state = q;
      if (state == ncclSuccess) return absl::OkStatus();
      if (state != ncclInProgress) return Fail(NcclStatus(what, state));
      if (Clock::now() >= deadline) {
        return Fail(absl::UnavailableError(
            absl::StrCat("nccl ", what, ": not done within ", timeout_.count(), " ms")));
      }
      std::this_thread::yield();
    }
  }

  // Polls rather than synchronizing: cudaStreamSynchronize would wait forever
  // for a peer that is gone, and NCCL reports a broken peer asynchronously.
  absl::Status Wait(const char* what) {
    const auto deadline = Clock::now() + timeout_;
    for (;;) {
      cudaError_t e = cudaStreamQuery(stream_);
      if (e == cudaSuccess) return absl::OkStatus();
      if (e != cudaErrorNotReady) return Fail(CudaStatus(what, e));
      ncclResult_t state = ncclSuccess;
      ncclCommGetAsyncError(comm_, &state);
      if (state != ncclSuccess && state != ncclInProgress) return Fail(NcclStatus(what, state));
      if (Clock::now() >= deadline) {
        return Fail(absl::UnavailableError(absl::StrCat(
            "nccl ", what, ": not done within ", timeout_.count(), " ms (a peer gone or hung)")));
      }
      std::this_thread::yield();
    }
  }

  // Aborting unblocks the kernels NCCL left waiting on this stream; the
  // group has to be formed again.
  absl::Status Fail(absl::Status st) {
    if (broken_.ok()) broken_ = st;
    if (comm_ != nullptr) ncclCommAbort(comm_);
    comm_ = nullptr;
    return st;
  }

  const int rank_;
  const int world_size_;
  const int device_;
  const std::chrono::milliseconds timeout_;

  ncclComm_t comm_ = nullptr;
  cudaStream_t stream_ = nullptr;
  bool own_stream_ = false;
  float* one_ = nullptr;      // the barrier's one device float
  float* scratch_ = nullptr;  // AllReduceSum's gathered parts, world_size_ x count
  size_t scratch_floats_ = 0;
  absl::Status broken_;  // the first failure; OK while usable
};

}  // namespace

bool NcclAvailable() { return true; }

absl::StatusOr<std::string> ExchangeNcclUniqueId(const NcclOptions& o) {
  if (absl::Status st = ValidateGroup(o); !st.ok()) return st;
  if (o.world_size == 1) return NewUniqueId();
  const bool grpc = !o.rendezvous_address.empty();
  absl::StatusOr<std::string> id;
  if (o.rank == 0) {
    id = NewUniqueId();
    if (!id.ok()) return id.status();
    absl::Status st = grpc ? PublishGrpc(o, *id) : PublishFile(o, *id);
    if (!st.ok()) return st;
  } else {
    id = grpc ? FetchGrpc(o) : FetchFile(o);
    if (!id.ok()) return id.status();
  }
  if (id->size() != sizeof(ncclUniqueId)) {
    return absl::FailedPreconditionError(
        absl::StrCat(Where(o), " has ", id->size(), " bytes, not ", sizeof(ncclUniqueId)));
  }
  return id;
}

absl::StatusOr<std::unique_ptr<Communicator>> CreateNcclCommunicator(const NcclOptions& o) {
  if (absl::Status st = ValidateGroup(o); !st.ok()) return st;
  int devices = 0;
  // Without a driver the runtime fails here ("driver version is
  // insufficient"): that is a machine without a GPU, not a broken one.
  if (cudaError_t e = cudaGetDeviceCount(&devices); e != cudaSuccess || devices == 0) {
    return absl::FailedPreconditionError(absl::StrCat(
        "no CUDA device", e != cudaSuccess ? absl::StrCat(": ", cudaGetErrorString(e)) : ""));
  }
  const int device = o.device >= 0 ? o.device : o.rank % devices;
  if (device >= devices) {
    return absl::InvalidArgumentError(
        absl::StrCat("nccl: device ", device, " but only ", devices, " visible"));
  }
  absl::StatusOr<std::string> id = ExchangeNcclUniqueId(o);
  if (!id.ok()) return id.status();
  auto comm = std::make_unique<NcclCommunicator>(o.rank, o.world_size, device, o.timeout);
  if (absl::Status st = comm->Init(*id, o.stream); !st.ok()) return st;
  return std::unique_ptr<Communicator>(std::move(comm));
}

}  // namespace ringlane::worker
