#include "services/kvstore_client.h"

#include <xxhash.h>

#include <algorithm>
#include <cstring>
#include <limits>

#include "absl/strings/str_cat.h"
#include "services/grpc_security.h"
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
  ctx->set_deadline(std::chrono::system_clock::now() + options_.deadline);
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
  absl::MutexLock shm_lock(&shm_mu_);
  const bool shm = UseShm();
  int64_t cursor = static_cast<int64_t>(kShmTokenBytes);
  int64_t via_shm = 0;
  grpc::ClientContext ctx;
  Prepare(&ctx);
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
  absl::MutexLock shm_lock(&shm_mu_);
  const bool shm = UseShm();
  int64_t via_shm = 0;
  grpc::ClientContext ctx;
  Prepare(&ctx);
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
