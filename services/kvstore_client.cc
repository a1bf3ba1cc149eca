#include "services/kvstore_client.h"

#include <xxhash.h>

#include <algorithm>
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

absl::StatusOr<v1::PutResponse> KvStoreClient::Put(absl::Span<const KvBlockToPut> blocks) {
  for (size_t i = 0; i < blocks.size(); ++i) {
    if (blocks[i].payload.empty()) {
      return absl::InvalidArgumentError(absl::StrCat("block ", i, ": empty payload"));
    }
  }
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
  if (!st.ok()) return FromGrpcStatus(st);
  return resp;
}

absl::StatusOr<KvGetResult> KvStoreClient::GetPrefix(absl::Span<const v1::BlockKey> keys) {
  KvGetResult r;
  if (keys.empty()) return r;
  grpc::ClientContext ctx;
  Prepare(&ctx);
  v1::GetRequest req;
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
    if (static_cast<int64_t>(payload.size() + c.data().size()) > total) {
      stop(
          absl::InternalError(absl::StrCat("block ", i, ": more data than its ", total, " bytes")));
      break;
    }
    payload += c.data();
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
