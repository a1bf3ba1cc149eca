#include "services/kvstore_client.h"

#include <xxhash.h>

#include <algorithm>
#include <cstring>
#include <limits>

#include "absl/strings/str_cat.h"
#include "services/grpc_security.h"
#include "services/log.h"
#include "services/status_grpc.h"

namespace ringlane::services {

namespace {

// Proto3 encodes equal messages without maps or unknown fields to equal
// bytes; keys are compared that way rather than field by field, so a field
// added to BlockKey is compared too.
bool SameKey(const v1::BlockKey& a, const v1::BlockKey& b) {
  return a.SerializeAsString() == b.SerializeAsString();
}

}  // namespace

grpc::ChannelArguments KvStoreChannelArguments(const KvStoreClientOptions& options) {
  grpc::ChannelArguments args;
  const int64_t max_message =
      std::min<int64_t>(options.max_chunk_bytes + (64 << 10), std::numeric_limits<int32_t>::max());
  args.SetMaxReceiveMessageSize(static_cast<int>(max_message));
  args.SetMaxSendMessageSize(static_cast<int>(max_message));
  // A store that comes back is found within about this long.
  const int backoff_ms = static_cast<int>(std::clamp<int64_t>(
      options.max_reconnect_backoff.count(), 100, std::numeric_limits<int32_t>::max()));
  args.SetInt(GRPC_ARG_INITIAL_RECONNECT_BACKOFF_MS, std::min(backoff_ms, 100));
  args.SetInt(GRPC_ARG_MAX_RECONNECT_BACKOFF_MS, backoff_ms);
  // Despite its name, gRPC uses this as the timeout of one connection
  // attempt (20 s by default), and a channel whose connection broke was seen
  // to retry only after about this long (kvstore_faults_test): short, so a
  // store that came back is used again within about a second, but not so
  // short that a handshake with a busy store is cut off (at 100 ms attempts
  // were, again and again, on a loaded machine).
  args.SetInt(GRPC_ARG_MIN_RECONNECT_BACKOFF_MS, 1000);
  // A lost connection makes the channel resolve the name again, and the DNS
  // resolver waits out a cooldown first (seconds by default): a store that
  // came back would sit unused that long.
  args.SetInt(GRPC_ARG_DNS_MIN_TIME_BETWEEN_RESOLUTIONS_MS, backoff_ms);
  return args;
}

KvStoreClient::KvStoreClient(std::shared_ptr<grpc::Channel> channel, KvStoreClientOptions options)
    : options_(options), channel_(std::move(channel)), stub_(v1::KvStore::NewStub(channel_)) {}

std::unique_ptr<KvStoreClient> KvStoreClient::Connect(const std::string& address,
                                                      KvStoreClientOptions options) {
  return std::make_unique<KvStoreClient>(NewPeerChannel(address, KvStoreChannelArguments(options)),
                                         options);
}

void KvStoreClient::Prepare(grpc::ClientContext* ctx) const {
  Prepare(ctx, std::chrono::system_clock::now() + options_.deadline);
}

void KvStoreClient::Prepare(grpc::ClientContext* ctx, Deadline deadline) const {
  ctx->set_deadline(deadline);
  // Off is gRPC's default; said here because everything rests on it: a
  // channel in TRANSIENT_FAILURE fails the call at once instead of holding
  // it until the store is back.
  ctx->set_wait_for_ready(false);
}

bool KvStoreClient::shm_attached() const {
  absl::MutexLock l(&shm_mu_);
  return shm_attached_;
}

bool KvStoreClient::UseShm() {
  if (options_.shm_bytes <= 0) return false;
  if (shm_attached_) return true;
  const auto now = std::chrono::steady_clock::now();
  if (now < shm_retry_at_) return false;
  // A refusal (another node, shared memory off) is asked again only now and
  // then: the answer rarely changes.
  shm_retry_at_ = now + std::chrono::seconds(10);
  // A segment attached before was unlinked then; a store that restarted
  // needs a new one to find by name.
  if (shm_ != nullptr && !shm_->linked()) shm_.reset();
  if (shm_ == nullptr) {
    auto seg = ShmSegment::Create(options_.shm_dir, static_cast<size_t>(options_.shm_bytes));
    if (!seg.ok()) return false;
    shm_ = std::move(*seg);
  }
  grpc::ClientContext ctx;
  Prepare(&ctx);
  v1::AttachShmRequest req;
  req.set_segment(shm_->name());
  req.set_token(std::string(shm_->token()));
  v1::AttachShmResponse resp;
  shm_attached_ = stub_->AttachShm(&ctx, req, &resp).ok();
  // Named only while the store may open it: attached, or refused (then
  // dropped, and made again at the next try), the file is gone either way.
  if (shm_attached_) {
    shm_->Unlink();
  } else {
    shm_.reset();
  }
  return shm_attached_;
}

void KvStoreClient::NoteShmFailure(const grpc::Status& st) {
  if (st.error_code() == grpc::StatusCode::FAILED_PRECONDITION ||
      st.error_code() == grpc::StatusCode::UNAVAILABLE) {
    shm_attached_ = false;
    shm_retry_at_ = {};
  }
}

absl::StatusOr<v1::PutResponse> KvStoreClient::Put(absl::Span<const KvBlockToPut> blocks) {
  for (size_t i = 0; i < blocks.size(); ++i) {
    if (blocks[i].payload.empty()) {
      return absl::InvalidArgumentError(absl::StrCat("block ", i, ": empty payload"));
    }
  }
  const Deadline deadline = std::chrono::system_clock::now() + options_.deadline;
  size_t done = 0;
  v1::PutResponse resp;
  if (options_.rdma_bytes > 0) {
    absl::MutexLock rdma_lock(&rdma_mu_);
    if (UseRdma(deadline)) {
      std::optional<absl::StatusOr<v1::PutResponse>> r = PutOverRdma(blocks, deadline, &done);
      if (r.has_value()) {
        if (!r->ok()) return r->status();
        resp = **r;
      }
    }
  }
  if (done == blocks.size()) return resp;
  absl::StatusOr<v1::PutResponse> rest = PutOverShmOrGrpc(blocks.subspan(done), deadline);
  if (!rest.ok() || done == 0) return rest;
  resp.set_num_blocks(resp.num_blocks() + rest->num_blocks());
  resp.set_total_bytes(resp.total_bytes() + rest->total_bytes());
  resp.set_num_already_stored(resp.num_already_stored() + rest->num_already_stored());
  return resp;
}

absl::StatusOr<v1::PutResponse> KvStoreClient::PutOverShmOrGrpc(
    absl::Span<const KvBlockToPut> blocks, Deadline deadline) {
  absl::MutexLock shm_lock(&shm_mu_);
  const bool shm = UseShm();
  int64_t cursor = static_cast<int64_t>(kShmTokenBytes);
  int64_t via_shm = 0;
  grpc::ClientContext ctx;
  Prepare(&ctx, deadline);
  v1::PutResponse resp;
  std::unique_ptr<grpc::ClientWriter<v1::KvBlockChunk>> writer = stub_->Put(&ctx, &resp);
  const int64_t chunk = std::max<int64_t>(1, options_.max_chunk_bytes);
  bool open = true;
  for (size_t i = 0; i < blocks.size() && open; ++i) {
    const KvBlockToPut& b = blocks[i];
    const uint64_t sum = b.xxh64 ? *b.xxh64 : XXH64(b.payload.data(), b.payload.size(), 0);
    const int64_t size = static_cast<int64_t>(b.payload.size());
    if (shm && shm_->Contains(cursor, size)) {
      std::memcpy(shm_->data() + cursor, b.payload.data(), b.payload.size());
      v1::KvBlockChunk c;
      *c.mutable_key() = b.key;
      c.set_total_bytes(size);
      c.set_payload_xxh64(sum);
      c.mutable_shm()->set_segment(shm_->name());
      c.mutable_shm()->set_offset(cursor);
      c.mutable_shm()->set_length(size);
      cursor += size;
      via_shm += size;
      if (!writer->Write(c)) open = false;
      continue;
    }
    for (int64_t off = 0; off < size; off += chunk) {
      v1::KvBlockChunk c;
      *c.mutable_key() = b.key;
      c.set_offset_bytes(off);
      c.set_total_bytes(size);
      c.set_data(b.payload.data() + off, static_cast<size_t>(std::min(chunk, size - off)));
      c.set_payload_xxh64(sum);
      // False once the stream broke (the store failed the call, went away
      // or the deadline passed); Finish says why.
      if (!writer->Write(c)) {
        open = false;
        break;
      }
    }
  }
  if (open) writer->WritesDone();
  grpc::Status st = writer->Finish();
  if (!st.ok()) {
    NoteShmFailure(st);
    return FromGrpcStatus(st);
  }
  shm_bytes_moved_.fetch_add(via_shm, std::memory_order_relaxed);
  return resp;
}

absl::StatusOr<KvGetResult> KvStoreClient::GetPrefix(absl::Span<const v1::BlockKey> keys) {
  KvGetResult r;
  if (keys.empty()) return r;
  const Deadline deadline = std::chrono::system_clock::now() + options_.deadline;
  if (options_.rdma_bytes > 0) {
    absl::MutexLock rdma_lock(&rdma_mu_);
    if (UseRdma(deadline)) {
      absl::StatusOr<bool> more = GetOverRdma(keys, deadline, &r);
      if (!more.ok()) {
        if (r.blocks.empty()) return more.status();
        r.stopped = more.status();
        return r;
      }
      if (!*more) return r;
    }
  }
  if (r.blocks.empty()) return GetOverShmOrGrpc(keys, deadline);
  absl::StatusOr<KvGetResult> rest = GetOverShmOrGrpc(keys.subspan(r.blocks.size()), deadline);
  if (!rest.ok()) {
    r.stopped = rest.status();
    return r;
  }
  for (KvStoredBlock& b : rest->blocks) r.blocks.push_back(std::move(b));
  r.stopped = rest->stopped;
  return r;
}

absl::StatusOr<KvGetResult> KvStoreClient::GetOverShmOrGrpc(absl::Span<const v1::BlockKey> keys,
                                                            Deadline deadline) {
  KvGetResult r;
  if (keys.empty()) return r;
  absl::MutexLock shm_lock(&shm_mu_);
  const bool shm = UseShm();
  int64_t via_shm = 0;
  grpc::ClientContext ctx;
  Prepare(&ctx, deadline);
  v1::GetRequest req;
  if (shm) req.set_shm_segment(shm_->name());
  for (const auto& k : keys) *req.add_keys() = k;
  req.set_max_chunk_bytes(static_cast<int32_t>(
      std::clamp<int64_t>(options_.max_chunk_bytes, 1, std::numeric_limits<int32_t>::max())));
  std::unique_ptr<grpc::ClientReader<v1::KvBlockChunk>> reader = stub_->Get(&ctx, req);
  // The block being assembled: it joins r.blocks only whole and verified.
  std::string payload;
  bool in_block = false;
  int64_t total = 0;
  uint64_t sum = 0;
  bool stopped = false;
  auto stop = [&](absl::Status why) {
    r.stopped = std::move(why);
    stopped = true;
    ctx.TryCancel();
  };
  v1::KvBlockChunk c;
  while (!stopped && reader->Read(&c)) {
    const size_t i = r.blocks.size();
    if (i >= keys.size() || !SameKey(c.key(), keys[i])) {
      stop(absl::InternalError(absl::StrCat("the store sent a block out of order at key ", i)));
      break;
    }
    if (!in_block) {
      if (c.offset_bytes() != 0 || c.total_bytes() < 1 ||
          c.total_bytes() > options_.max_block_bytes) {
        stop(absl::InternalError(absl::StrCat("block ", i, ": offset ", c.offset_bytes(),
                                              ", total_bytes ", c.total_bytes(), " (at most ",
                                              options_.max_block_bytes, ")")));
        break;
      }
      in_block = true;
      total = c.total_bytes();
      sum = c.payload_xxh64();
      payload.clear();
    } else if (c.total_bytes() != total || c.payload_xxh64() != sum ||
               c.offset_bytes() != static_cast<int64_t>(payload.size())) {
      stop(absl::InternalError(absl::StrCat("block ", i, ": chunks do not tile it")));
      break;
    }
    const bool sliced = c.has_shm();
    if (sliced && (!shm || c.shm().segment() != shm_->name() || !c.data().empty() ||
                   !shm_->Contains(c.shm().offset(), c.shm().length()))) {
      stop(absl::InternalError(absl::StrCat("block ", i, ": a bad shared-memory slice")));
      break;
    }
    const int64_t n = sliced ? c.shm().length() : static_cast<int64_t>(c.data().size());
    if (static_cast<int64_t>(payload.size()) + n > total) {
      stop(
          absl::InternalError(absl::StrCat("block ", i, ": more data than its ", total, " bytes")));
      break;
    }
    if (sliced) {
      // Copied out before it is checked: the segment is shared memory.
      payload.append(reinterpret_cast<const char*>(shm_->data()) + c.shm().offset(),
                     static_cast<size_t>(n));
      via_shm += n;
    } else {
      payload += c.data();
    }
    if (static_cast<int64_t>(payload.size()) < total) continue;
    in_block = false;
    if (XXH64(payload.data(), payload.size(), 0) != sum) {
      checksum_failures_.fetch_add(1, std::memory_order_relaxed);
      stop(absl::DataLossError(absl::StrCat("block ", i, ": payload checksum mismatch")));
      break;
    }
    r.blocks.push_back(KvStoredBlock{keys[i], std::move(payload), sum});
    payload = std::string();
  }
  grpc::Status st = reader->Finish();
  shm_bytes_moved_.fetch_add(via_shm, std::memory_order_relaxed);
  if (!st.ok()) NoteShmFailure(st);
  if (!stopped && !st.ok()) {
    if (r.blocks.empty()) return FromGrpcStatus(st);
    r.stopped = FromGrpcStatus(st);
  }
  return r;
}

bool KvStoreClient::rdma_attached() const {
  absl::MutexLock l(&rdma_mu_);
  return rdma_ != nullptr;
}

bool KvStoreClient::UseRdma(Deadline deadline) {
  if (rdma_ != nullptr) return true;
  const auto now = std::chrono::steady_clock::now();
  if (now < rdma_retry_at_) return false;
  absl::Status st = AttachRdma(deadline);
  if (st.ok()) {
    RL_LOG(INFO) << "kvstore RDMA region " << rdma_region_ << " attached (" << rdma_size_
                 << " bytes"
                 << (rdma_device_ ? absl::StrCat(", device ", rdma_device_->spec().name) : "")
                 << ")";
    rdma_backoff_ = std::chrono::milliseconds(0);
    rdma_failure_logged_ = false;
    return true;
  }
  DropRdma(st);
  return false;
}

namespace {

// The verbs link: the local registered buffer and the store's region by
// address and rkey.
class EndpointLink final : public KvRdmaLink {
 public:
  EndpointLink(std::unique_ptr<RdmaEndpoint> ep, uint64_t remote_addr, uint32_t rkey)
      : ep_(std::move(ep)), remote_addr_(remote_addr), rkey_(rkey) {}
  uint8_t* data() override { return ep_->data(); }
  size_t size() const override { return ep_->size(); }
  absl::Status Write(size_t offset, size_t length,
                     std::chrono::steady_clock::time_point deadline) override {
    return ep_->Write(offset, remote_addr_, rkey_, length, deadline);
  }
  absl::Status Read(size_t offset, size_t length,
                    std::chrono::steady_clock::time_point deadline) override {
    return ep_->Read(offset, remote_addr_, rkey_, length, deadline);
  }

 private:
  const std::unique_ptr<RdmaEndpoint> ep_;
  const uint64_t remote_addr_;
  const uint32_t rkey_;
};

}  // namespace

absl::Status KvStoreClient::AttachRdma(Deadline deadline) {
  absl::StatusOr<KvRdmaAttachment> a = options_.rdma_attach_for_testing
                                           ? options_.rdma_attach_for_testing()
                                           : AttachRdmaVerbs(deadline);
  if (!a.ok()) return a.status();
  rdma_region_ = a->region;
  rdma_size_ = std::min<int64_t>(a->size_bytes, static_cast<int64_t>(a->link->size()));
  rdma_ = std::move(a->link);
  return absl::OkStatus();
}

absl::StatusOr<KvRdmaAttachment> KvStoreClient::AttachRdmaVerbs(Deadline deadline) {
  if (rdma_device_ == nullptr) {
    RdmaDeviceSpec spec = options_.rdma_device;
    if (spec.name.empty()) {
      const std::vector<std::string> names = RdmaDeviceNames();
      if (names.empty()) {
        return absl::FailedPreconditionError(RdmaCompiled()
                                                 ? "no RDMA device (ibv_get_device_list lists none)"
                                                 : "this build has no rdma-core");
      }
      spec.name = names.front();
    }
    absl::StatusOr<std::shared_ptr<RdmaDevice>> dev = RdmaDevice::Open(spec);
    if (!dev.ok()) return dev.status();
    rdma_device_ = std::move(*dev);
  }
  absl::StatusOr<std::unique_ptr<RdmaEndpoint>> ep = RdmaEndpoint::Create(
      rdma_device_, static_cast<size_t>(options_.rdma_bytes), /*remote_access=*/false);
  if (!ep.ok()) return ep.status();
  grpc::ClientContext ctx;
  Prepare(&ctx, deadline);
  v1::AttachRdmaRequest req;
  RdmaQpAddressToProto((*ep)->address(), req.mutable_qp());
  req.set_size_bytes(options_.rdma_bytes);
  req.set_previous_region(rdma_previous_region_);
  v1::AttachRdmaResponse resp;
  if (grpc::Status st = stub_->AttachRdma(&ctx, req, &resp); !st.ok()) return FromGrpcStatus(st);
  // The store holds a region for us from here on: named at the next attach
  // for it to drop, whether or not this one connects.
  rdma_previous_region_ = resp.region();
  absl::StatusOr<RdmaQpAddress> remote = RdmaQpAddressFromProto(resp.qp());
  if (!remote.ok()) return remote.status();
  if (resp.size_bytes() < 1 || resp.region().empty()) {
    return absl::InternalError("the store attached a region without a name or size");
  }
  if (absl::Status st = (*ep)->Connect(*remote); !st.ok()) return st;
  KvRdmaAttachment a;
  a.link = std::make_unique<EndpointLink>(std::move(*ep), resp.addr(), resp.rkey());
  a.region = resp.region();
  a.size_bytes = resp.size_bytes();
  return a;
}

void KvStoreClient::DropRdma(const absl::Status& why) {
  const bool was_attached = rdma_ != nullptr;
  rdma_.reset();
  // Opened again at the next attach: the device may have gone (a reset).
  rdma_device_.reset();
  rdma_region_.clear();
  rdma_backoff_ = std::clamp(rdma_backoff_ * 2, std::chrono::milliseconds(1000),
                             std::chrono::milliseconds(60000));
  rdma_retry_at_ = std::chrono::steady_clock::now() + rdma_backoff_;
  // Once per outage at WARNING, then quietly until RDMA works again.
  const auto severity = rdma_failure_logged_ ? Severity::kDebug : Severity::kWarning;
  rdma_failure_logged_ = true;
  if (ShouldLog(severity)) {
    Log(severity, absl::StrCat("kvstore RDMA ", was_attached ? "dropped" : "not attached", ": ",
                               why.message(), "; payloads go over ",
                               options_.shm_bytes > 0 ? "shared memory or gRPC" : "gRPC",
                               ", next RDMA attach in ", rdma_backoff_.count() / 1000, " s"));
  }
}

namespace {

// The RDMA transfers' deadline: the call's, on the steady clock.
std::chrono::steady_clock::time_point SteadyDeadline(std::chrono::system_clock::time_point d) {
  return std::chrono::steady_clock::now() +
         std::chrono::duration_cast<std::chrono::steady_clock::duration>(
             d - std::chrono::system_clock::now());
}

// Most blocks one PutRdma or GetRdma names (the store's default
// --max_keys_per_request is 4096); the rest go by the next transport.
constexpr size_t kMaxRdmaBlocksPerCall = 1024;

// Codes that say the region or the rpc is unknown to the store (it
// restarted, dropped the region for a newer client, or predates RDMA): the
// call goes on over another transport.
bool RegionLost(const grpc::Status& st) {
  return st.error_code() == grpc::StatusCode::FAILED_PRECONDITION ||
         st.error_code() == grpc::StatusCode::UNIMPLEMENTED;
}

}  // namespace

std::optional<absl::StatusOr<v1::PutResponse>> KvStoreClient::PutOverRdma(
    absl::Span<const KvBlockToPut> blocks, Deadline deadline, size_t* done) {
  *done = 0;
  v1::PutRdmaRequest req;
  req.set_region(rdma_region_);
  int64_t cursor = 0;
  for (const KvBlockToPut& b : blocks) {
    const int64_t size = static_cast<int64_t>(b.payload.size());
    if (req.blocks_size() >= static_cast<int>(kMaxRdmaBlocksPerCall) ||
        size > rdma_size_ - cursor) {
      break;
    }
    std::memcpy(rdma_->data() + cursor, b.payload.data(), b.payload.size());
    v1::RdmaBlock* rb = req.add_blocks();
    *rb->mutable_key() = b.key;
    rb->set_offset(cursor);
    rb->set_length(size);
    rb->set_payload_xxh64(b.xxh64 ? *b.xxh64 : XXH64(b.payload.data(), b.payload.size(), 0));
    cursor += size;
  }
  if (req.blocks_size() == 0) return std::nullopt;
  if (absl::Status st = rdma_->Write(0, static_cast<size_t>(cursor), SteadyDeadline(deadline));
      !st.ok()) {
    DropRdma(st);
    return std::nullopt;
  }
  grpc::ClientContext ctx;
  Prepare(&ctx, deadline);
  v1::PutResponse resp;
  grpc::Status st = stub_->PutRdma(&ctx, req, &resp);
  if (RegionLost(st)) {
    DropRdma(FromGrpcStatus(st));
    return std::nullopt;
  }
  if (!st.ok()) {
    if (st.error_code() == grpc::StatusCode::UNAVAILABLE) DropRdma(FromGrpcStatus(st));
    return FromGrpcStatus(st);
  }
  *done = static_cast<size_t>(req.blocks_size());
  rdma_bytes_moved_.fetch_add(cursor, std::memory_order_relaxed);
  return resp;
}

absl::StatusOr<bool> KvStoreClient::GetOverRdma(absl::Span<const v1::BlockKey> keys,
                                                Deadline deadline, KvGetResult* r) {
  const size_t n = std::min(keys.size(), kMaxRdmaBlocksPerCall);
  v1::GetRdmaRequest req;
  req.set_region(rdma_region_);
  for (size_t i = 0; i < n; ++i) *req.add_keys() = keys[i];
  grpc::ClientContext ctx;
  Prepare(&ctx, deadline);
  v1::GetRdmaResponse resp;
  grpc::Status st = stub_->GetRdma(&ctx, req, &resp);
  if (RegionLost(st)) {
    DropRdma(FromGrpcStatus(st));
    return true;
  }
  if (!st.ok()) {
    if (st.error_code() == grpc::StatusCode::UNAVAILABLE) DropRdma(FromGrpcStatus(st));
    return FromGrpcStatus(st);
  }
  // Where the store says it wrote each block: in key order, inside the
  // region, within the size this client accepts.
  if (resp.blocks_size() > static_cast<int>(n)) {
    r->stopped = absl::InternalError("the store sent more blocks than asked for");
    return false;
  }
  int64_t end = 0;
  for (int i = 0; i < resp.blocks_size(); ++i) {
    const v1::RdmaBlock& b = resp.blocks(i);
    if (!SameKey(b.key(), keys[i]) || b.offset() < 0 || b.length() < 1 ||
        b.length() > options_.max_block_bytes || b.offset() > rdma_size_ ||
        b.length() > rdma_size_ - b.offset()) {
      r->stopped = absl::InternalError(absl::StrCat("block ", i, ": a bad RDMA slice"));
      return false;
    }
    end = std::max(end, b.offset() + b.length());
  }
  if (end > 0) {
    if (absl::Status rs = rdma_->Read(0, static_cast<size_t>(end), SteadyDeadline(deadline));
        !rs.ok()) {
      DropRdma(rs);
      return true;
    }
  }
  int64_t moved = 0;
  bool more = true;
  for (int i = 0; i < resp.blocks_size(); ++i) {
    const v1::RdmaBlock& b = resp.blocks(i);
    std::string payload(reinterpret_cast<const char*>(rdma_->data()) + b.offset(),
                        static_cast<size_t>(b.length()));
    if (XXH64(payload.data(), payload.size(), 0) != b.payload_xxh64()) {
      checksum_failures_.fetch_add(1, std::memory_order_relaxed);
      r->stopped = absl::DataLossError(
          absl::StrCat("block ", r->blocks.size(), ": payload checksum mismatch"));
      more = false;
      break;
    }
    moved += b.length();
    r->blocks.push_back(KvStoredBlock{keys[i], std::move(payload), b.payload_xxh64()});
  }
  rdma_bytes_moved_.fetch_add(moved, std::memory_order_relaxed);
  if (!more) return false;
  // The prefix ended at a key the store does not have, or every key came.
  if (r->blocks.size() == keys.size()) return false;
  return resp.region_full() || resp.blocks_size() == static_cast<int>(n);
}

absl::StatusOr<v1::LookupResponse> KvStoreClient::Lookup(absl::Span<const v1::BlockKey> keys) {
  grpc::ClientContext ctx;
  Prepare(&ctx);
  v1::LookupRequest req;
  for (const auto& k : keys) *req.add_keys() = k;
  v1::LookupResponse resp;
  if (grpc::Status st = stub_->Lookup(&ctx, req, &resp); !st.ok()) return FromGrpcStatus(st);
  return resp;
}

absl::StatusOr<v1::StatsResponse> KvStoreClient::Stats() {
  grpc::ClientContext ctx;
  Prepare(&ctx);
  v1::StatsResponse resp;
  if (grpc::Status st = stub_->Stats(&ctx, v1::StatsRequest(), &resp); !st.ok()) {
    return FromGrpcStatus(st);
  }
  return resp;
}

absl::StatusOr<v1::DeleteModelResponse> KvStoreClient::DeleteModel(const std::string& model_id) {
  grpc::ClientContext ctx;
  Prepare(&ctx);
  v1::DeleteModelRequest req;
  req.set_model_id(model_id);
  v1::DeleteModelResponse resp;
  if (grpc::Status st = stub_->DeleteModel(&ctx, req, &resp); !st.ok()) {
    return FromGrpcStatus(st);
  }
  return resp;
}

}  // namespace ringlane::services
