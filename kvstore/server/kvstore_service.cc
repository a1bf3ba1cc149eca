#include "kvstore/server/kvstore_service.h"

#include <algorithm>
#include <cstring>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "kvstore/block_key.h"
#include "services/status_grpc.h"

namespace ringlane::kvstore {

namespace {

constexpr char kRegionPrefix[] = "rdma-";
constexpr size_t kRegionIdHexChars = 32;

// "rdma-" then 32 lowercase hex digits (128 random bits: a region's name is
// not guessable by another client of the store).
bool ValidRegionName(const std::string& name) {
  const std::string_view prefix = kRegionPrefix;
  if (name.size() != prefix.size() + kRegionIdHexChars || name.rfind(prefix, 0) != 0) return false;
  for (size_t i = prefix.size(); i < name.size(); ++i) {
    const char c = name[i];
    if (!((c >= '0' && c <= '9') || (c >= 'a' && c <= 'f'))) return false;
  }
  return true;
}

std::string NewRegionName() {
  static constexpr char kHex[] = "0123456789abcdef";
  std::random_device rd;
  std::string name = kRegionPrefix;
  for (size_t i = 0; i < kRegionIdHexChars; ++i) name += kHex[rd() & 15];
  return name;
}

}  // namespace

// One client's RDMA region: a buffer registered for the client's queue pair
// alone (an RC queue pair talks to one peer), or plain memory in tests.
struct KvStoreService::RdmaRegion {
  std::string name;
  std::unique_ptr<services::RdmaEndpoint> endpoint;
  std::unique_ptr<uint8_t[]> test_memory;
  size_t test_size = 0;

  uint8_t* data() { return endpoint ? endpoint->data() : test_memory.get(); }
  size_t size() const { return endpoint ? endpoint->size() : test_size; }
  bool Contains(int64_t offset, int64_t length) const {
    return offset >= 0 && length >= 0 && offset <= static_cast<int64_t>(size()) &&
           length <= static_cast<int64_t>(size()) - offset;
  }
};

// Holds one of max_concurrent_calls for the life of a handler.
class KvStoreService::CallSlot {
 public:
  explicit CallSlot(KvStoreService* s) : s_(s) {
    ok_ = s_->active_calls_.fetch_add(1, std::memory_order_acq_rel) <
          s_->limits_.max_concurrent_calls;
    if (!ok_) s_->rejected_busy_.fetch_add(1, std::memory_order_relaxed);
  }
  ~CallSlot() { s_->active_calls_.fetch_sub(1, std::memory_order_acq_rel); }
  bool ok() const { return ok_; }
  grpc::Status Busy() const {
    return grpc::Status(
        grpc::StatusCode::RESOURCE_EXHAUSTED,
        absl::StrCat("more than ", s_->limits_.max_concurrent_calls, " kvstore calls at once"));
  }

 private:
  KvStoreService* const s_;
  bool ok_ = false;
};

KvStoreService::KvStoreService(Store* store, const ServiceLimits& limits)
    : store_(store), limits_(limits) {}

grpc::Status KvStoreService::Invalid(const absl::Status& s) {
  rejected_invalid_.fetch_add(1, std::memory_order_relaxed);
  return services::ToGrpcStatus(s);
}

grpc::Status KvStoreService::CheckKeys(
    const google::protobuf::RepeatedPtrField<v1::BlockKey>& keys) {
  if (keys.size() > limits_.max_keys_per_request) {
    return Invalid(absl::InvalidArgumentError(absl::StrCat(
        keys.size(), " keys in one request (at most ", limits_.max_keys_per_request, ")")));
  }
  for (int i = 0; i < keys.size(); ++i) {
    if (absl::Status s = ValidateKey(keys[i]); !s.ok()) {
      return Invalid(absl::InvalidArgumentError(absl::StrCat("keys[", i, "]: ", s.message())));
    }
  }
  return grpc::Status::OK;
}

grpc::Status KvStoreService::Put(grpc::ServerContext* ctx,
                                 grpc::ServerReader<v1::KvBlockChunk>* reader,
                                 v1::PutResponse* resp) {
  CallSlot slot(this);
  if (!slot.ok()) return slot.Busy();
  auto invalid = [this](const std::string& msg) {
    return Invalid(absl::InvalidArgumentError(msg));
  };
  // The block being received: nothing of it is in the store until its last
  // chunk arrived and its checksum matched (the first phase lives only in
  // this handler's memory, so a broken stream or a crash leaves nothing).
  std::string key;  // encoded; empty between blocks
  std::string payload;
  int64_t total = 0;
  uint64_t sum = 0;
  int blocks = 0;
  int already = 0;
  int64_t bytes = 0;
  v1::KvBlockChunk c;
  while (reader->Read(&c)) {
    if (ctx->IsCancelled()) return grpc::Status::CANCELLED;
    if (absl::Status s = ValidateKey(c.key()); !s.ok()) {
      return invalid(absl::StrCat("block ", blocks, ": ", s.message()));
    }
    if (c.total_bytes() < 1 || c.total_bytes() > limits_.max_block_bytes) {
      return invalid(absl::StrCat("block ", blocks, ": total_bytes ", c.total_bytes(), " (1..",
                                  limits_.max_block_bytes, ")"));
    }
    // The chunk's bytes: inline, or a slice of the caller's segment (copied
    // out below, and verified with the rest of the block).
    std::shared_ptr<services::ShmSegment> seg;
    if (c.has_shm()) {
      seg = Segment(c.shm().segment());
      if (seg == nullptr) {
        return grpc::Status(grpc::StatusCode::FAILED_PRECONDITION,
                            "unknown shared-memory segment (attach it again)");
      }
      if (!c.data().empty() || !seg->Contains(c.shm().offset(), c.shm().length())) {
        return invalid(absl::StrCat("block ", blocks, ": a shared-memory slice outside its ",
                                    seg->size(), "-byte segment, or with inline data too"));
      }
    }
    const int64_t n = seg ? c.shm().length() : static_cast<int64_t>(c.data().size());
    const int64_t limit = seg ? limits_.max_block_bytes : limits_.max_chunk_bytes;
    if (n < 1 || n > limit) {
      return invalid(absl::StrCat("block ", blocks, ": chunk of ", n, " bytes (1..", limit, ")"));
    }
    std::string k = EncodeKey(c.key());
    if (key.empty()) {
      if (c.offset_bytes() != 0) {
        return invalid(absl::StrCat("block ", blocks, " starts at offset ", c.offset_bytes()));
      }
      key = std::move(k);
      total = c.total_bytes();
      sum = c.payload_xxh64();
      payload.clear();
      payload.shrink_to_fit();
    } else if (k != key || c.total_bytes() != total || c.payload_xxh64() != sum ||
               c.offset_bytes() != static_cast<int64_t>(payload.size())) {
      return invalid(absl::StrCat("block ", blocks, ": a chunk at offset ", c.offset_bytes(),
                                  " does not continue it at ", payload.size(),
                                  " (chunks of a block in order, same key, size and checksum)"));
    }
    if (static_cast<int64_t>(payload.size()) + n > total) {
      return invalid(absl::StrCat("block ", blocks, ": more data than its ", total, " bytes"));
    }
    if (seg) {
      payload.append(reinterpret_cast<const char*>(seg->data()) + c.shm().offset(),
                     static_cast<size_t>(n));
    } else {
      payload += c.data();
    }
    if (static_cast<int64_t>(payload.size()) < total) continue;
    // Growth by appending may have left up to twice the size allocated;
    // the store keeps the block for long, so keep only what it needs.
    payload.shrink_to_fit();
    auto shared = std::make_shared<const std::string>(std::move(payload));
    payload = std::string();
    bool was_stored = false;
    absl::Status st = store_->Put(key, shared, sum, &was_stored);
    if (st.code() == absl::StatusCode::kDataLoss) {
      return grpc::Status(grpc::StatusCode::DATA_LOSS,
                          absl::StrCat("block ", blocks, ": payload checksum mismatch"));
    }
    if (!st.ok()) return services::ToGrpcStatus(st);
    ++blocks;
    if (was_stored) ++already;
    bytes += total;
    key.clear();
  }
  if (!key.empty()) {
    return invalid(absl::StrCat("stream ended inside block ", blocks, " (", payload.size(), " of ",
                                total, " bytes); nothing of it was stored"));
  }
  resp->set_num_blocks(blocks);
  resp->set_total_bytes(bytes);
  resp->set_num_already_stored(already);
  return grpc::Status::OK;
}

grpc::Status KvStoreService::Get(grpc::ServerContext* ctx, const v1::GetRequest* req,
                                 grpc::ServerWriter<v1::KvBlockChunk>* writer) {
  CallSlot slot(this);
  if (!slot.ok()) return slot.Busy();
  if (grpc::Status s = CheckKeys(req->keys()); !s.ok()) return s;
  if (req->max_chunk_bytes() < 0 || req->max_chunk_bytes() > limits_.max_chunk_bytes) {
    return Invalid(absl::InvalidArgumentError(absl::StrCat(
        "max_chunk_bytes ", req->max_chunk_bytes(), " (0..", limits_.max_chunk_bytes, ")")));
  }
  const int64_t chunk = req->max_chunk_bytes() > 0
                            ? req->max_chunk_bytes()
                            : std::min(kDefaultGetChunkBytes, limits_.max_chunk_bytes);
  std::shared_ptr<services::ShmSegment> seg;
  if (!req->shm_segment().empty()) {
    seg = Segment(req->shm_segment());
    if (seg == nullptr) {
      return grpc::Status(grpc::StatusCode::FAILED_PRECONDITION,
                          "unknown shared-memory segment (attach it again)");
    }
  }
  int64_t cursor = static_cast<int64_t>(services::kShmTokenBytes);
  for (const v1::BlockKey& k : req->keys()) {
    if (ctx->IsCancelled()) return grpc::Status::CANCELLED;
    absl::StatusOr<Block> b = store_->Get(EncodeKey(k));
    if (b.status().code() == absl::StatusCode::kNotFound) break;
    if (!b.ok()) return services::ToGrpcStatus(b.status());
    const std::string& p = *b->payload;
    const int64_t size = static_cast<int64_t>(p.size());
    if (seg && seg->Contains(cursor, size)) {
      std::memcpy(seg->data() + cursor, p.data(), p.size());
      v1::KvBlockChunk c;
      *c.mutable_key() = k;
      c.set_total_bytes(size);
      c.set_payload_xxh64(b->xxh64);
      c.mutable_shm()->set_segment(seg->name());
      c.mutable_shm()->set_offset(cursor);
      c.mutable_shm()->set_length(size);
      cursor += size;
      if (!writer->Write(c)) return grpc::Status::CANCELLED;
      store_->CountBytesOut(size);
      continue;
    }
    for (int64_t off = 0; off < size; off += chunk) {
      v1::KvBlockChunk c;
      *c.mutable_key() = k;
      c.set_offset_bytes(off);
      c.set_total_bytes(size);
      c.set_data(p.data() + off, static_cast<size_t>(std::min(chunk, size - off)));
      c.set_payload_xxh64(b->xxh64);
      if (!writer->Write(c)) return grpc::Status::CANCELLED;
    }
    store_->CountBytesOut(size);
  }
  return grpc::Status::OK;
}

grpc::Status KvStoreService::Lookup(grpc::ServerContext* ctx, const v1::LookupRequest* req,
                                    v1::LookupResponse* resp) {
  CallSlot slot(this);
  if (!slot.ok()) return slot.Busy();
  if (grpc::Status s = CheckKeys(req->keys()); !s.ok()) return s;
  bool leading = true;
  int num_leading = 0;
  for (const v1::BlockKey& k : req->keys()) {
    const bool present = store_->Contains(EncodeKey(k));
    resp->add_present(present);
    leading = leading && present;
    if (leading) ++num_leading;
  }
  resp->set_num_leading_present(num_leading);
  return grpc::Status::OK;
}

grpc::Status KvStoreService::Stats(grpc::ServerContext* ctx, const v1::StatsRequest* req,
                                   v1::StatsResponse* resp) {
  *resp = store_->Stats();
  return grpc::Status::OK;
}

grpc::Status KvStoreService::DeleteModel(grpc::ServerContext* ctx,
                                         const v1::DeleteModelRequest* req,
                                         v1::DeleteModelResponse* resp) {
  CallSlot slot(this);
  if (!slot.ok()) return slot.Busy();
  if (req->model_id().empty() || req->model_id().size() > kMaxModelIdBytes) {
    return Invalid(absl::InvalidArgumentError(absl::StrCat("model_id of ", req->model_id().size(),
                                                           " bytes (1..", kMaxModelIdBytes, ")")));
  }
  absl::StatusOr<v1::DeleteModelResponse> r = store_->DeleteModel(req->model_id());
  if (!r.ok()) return services::ToGrpcStatus(r.status());
  *resp = *r;
  return grpc::Status::OK;
}

std::shared_ptr<services::ShmSegment> KvStoreService::Segment(const std::string& name) {
  absl::MutexLock l(&shm_mu_);
  for (const auto& s : segments_) {
    if (s->name() == name) return s;
  }
  return nullptr;
}

grpc::Status KvStoreService::AttachShm(grpc::ServerContext* ctx, const v1::AttachShmRequest* req,
                                       v1::AttachShmResponse* resp) {
  CallSlot slot(this);
  if (!slot.ok()) return slot.Busy();
  if (limits_.shm_dir.empty()) {
    return grpc::Status(grpc::StatusCode::FAILED_PRECONDITION,
                        "shared memory is off on this kvstore (--shm_dir)");
  }
  if (!services::ShmSegment::ValidName(req->segment()) ||
      req->token().size() != services::kShmTokenBytes) {
    return Invalid(absl::InvalidArgumentError(
        "segment: a name \"ringlane-kv-\" then 1..64 of [a-z0-9-], and a 16-byte token"));
  }
  if (std::shared_ptr<services::ShmSegment> s = Segment(req->segment())) {
    if (s->token() == req->token()) {
      resp->set_size_bytes(static_cast<int64_t>(s->size()));
      return grpc::Status::OK;
    }
  }
  absl::StatusOr<std::unique_ptr<services::ShmSegment>> seg =
      services::ShmSegment::Open(limits_.shm_dir, req->segment(), req->token(),
                                 static_cast<size_t>(limits_.max_shm_segment_bytes));
  if (!seg.ok()) {
    if (absl::IsInvalidArgument(seg.status())) return Invalid(seg.status());
    return services::ToGrpcStatus(seg.status());
  }
  resp->set_size_bytes(static_cast<int64_t>((*seg)->size()));
  absl::MutexLock l(&shm_mu_);
  // One segment per name: a re-attach (the client made a new one under the
  // name after a restart) replaces the old mapping.
  for (auto it = segments_.begin(); it != segments_.end(); ++it) {
    if ((*it)->name() == req->segment()) {
      segments_.erase(it);
      break;
    }
  }
  while (static_cast<int>(segments_.size()) >= limits_.max_shm_segments) segments_.pop_front();
  segments_.push_back(std::move(*seg));
  return grpc::Status::OK;
}

std::shared_ptr<KvStoreService::RdmaRegion> KvStoreService::Region(const std::string& name) {
  absl::MutexLock l(&rdma_mu_);
  for (const auto& r : regions_) {
    if (r->name == name) return r;
  }
  return nullptr;
}

void KvStoreService::AddRegion(std::shared_ptr<RdmaRegion> r, const std::string& previous) {
  // The regions dropped here are freed after the lock is released (declared
  // first, destroyed last): destroying a queue pair and deregistering its
  // buffer are system calls.
  std::vector<std::shared_ptr<RdmaRegion>> dropped;
  absl::MutexLock l(&rdma_mu_);
  for (auto it = regions_.begin(); it != regions_.end(); ++it) {
    if (!previous.empty() && (*it)->name == previous) {
      dropped.push_back(std::move(*it));
      regions_.erase(it);
      break;
    }
  }
  while (!regions_.empty() && static_cast<int>(regions_.size()) >= limits_.max_rdma_clients) {
    dropped.push_back(std::move(regions_.front()));
    regions_.pop_front();
  }
  regions_.push_back(std::move(r));
}

int KvStoreService::rdma_regions() const {
  absl::MutexLock l(&rdma_mu_);
  return static_cast<int>(regions_.size());
}

std::string KvStoreService::AttachRdmaRegionForTesting(size_t size, uint8_t** data) {
  auto r = std::make_shared<RdmaRegion>();
  r->name = NewRegionName();
  r->test_memory = std::make_unique<uint8_t[]>(size);
  r->test_size = size;
  *data = r->test_memory.get();
  std::string name = r->name;
  AddRegion(std::move(r), "");
  return name;
}

grpc::Status KvStoreService::AttachRdma(grpc::ServerContext* ctx, const v1::AttachRdmaRequest* req,
                                        v1::AttachRdmaResponse* resp) {
  CallSlot slot(this);
  if (!slot.ok()) return slot.Busy();
  // A malformed request is refused as such whatever this store's RDMA
  // state, so a client bug shows up on a machine without a device too.
  absl::StatusOr<services::RdmaQpAddress> remote = services::RdmaQpAddressFromProto(req->qp());
  if (!remote.ok()) return Invalid(remote.status());
  if (req->size_bytes() < 1) {
    return Invalid(absl::InvalidArgumentError(
        absl::StrCat("size_bytes ", req->size_bytes(), " (at least 1)")));
  }
  if (!req->previous_region().empty() && !ValidRegionName(req->previous_region())) {
    return Invalid(absl::InvalidArgumentError(
        "previous_region: empty, or \"rdma-\" then 32 lowercase hex digits"));
  }
  if (limits_.rdma_device == nullptr) {
    return grpc::Status(grpc::StatusCode::FAILED_PRECONDITION, limits_.rdma_unavailable);
  }
  const size_t size = static_cast<size_t>(std::min(req->size_bytes(), limits_.max_rdma_bytes));
  auto ep = services::RdmaEndpoint::Create(limits_.rdma_device, size, /*remote_access=*/true);
  if (!ep.ok()) {
    return grpc::Status(grpc::StatusCode::FAILED_PRECONDITION,
                        absl::StrCat("cannot make an RDMA region: ", ep.status().message()));
  }
  if (absl::Status st = (*ep)->Connect(*remote); !st.ok()) {
    return grpc::Status(grpc::StatusCode::FAILED_PRECONDITION,
                        absl::StrCat("cannot connect to the client's queue pair: ", st.message()));
  }
  auto r = std::make_shared<RdmaRegion>();
  r->name = NewRegionName();
  r->endpoint = std::move(*ep);
  services::RdmaQpAddressToProto(r->endpoint->address(), resp->mutable_qp());
  resp->set_region(r->name);
  resp->set_addr(r->endpoint->addr());
  resp->set_rkey(r->endpoint->rkey());
  resp->set_size_bytes(static_cast<int64_t>(r->endpoint->size()));
  AddRegion(std::move(r), req->previous_region());
  return grpc::Status::OK;
}

grpc::Status KvStoreService::PutRdma(grpc::ServerContext* ctx, const v1::PutRdmaRequest* req,
                                     v1::PutResponse* resp) {
  CallSlot slot(this);
  if (!slot.ok()) return slot.Busy();
  if (!ValidRegionName(req->region())) {
    return Invalid(absl::InvalidArgumentError("region: \"rdma-\" then 32 lowercase hex digits"));
  }
  if (req->blocks_size() > limits_.max_keys_per_request) {
    return Invalid(absl::InvalidArgumentError(absl::StrCat(req->blocks_size(),
                                                           " blocks in one request (at most ",
                                                           limits_.max_keys_per_request, ")")));
  }
  for (int i = 0; i < req->blocks_size(); ++i) {
    const v1::RdmaBlock& b = req->blocks(i);
    if (absl::Status s = ValidateKey(b.key()); !s.ok()) {
      return Invalid(absl::InvalidArgumentError(absl::StrCat("block ", i, ": ", s.message())));
    }
    if (b.offset() < 0 || b.length() < 1 || b.length() > limits_.max_block_bytes) {
      return Invalid(absl::InvalidArgumentError(absl::StrCat("block ", i, ": offset ", b.offset(),
                                                             ", length ", b.length(), " (1..",
                                                             limits_.max_block_bytes, ")")));
    }
  }
  std::shared_ptr<RdmaRegion> region = Region(req->region());
  if (region == nullptr) {
    return grpc::Status(grpc::StatusCode::FAILED_PRECONDITION,
                        "unknown RDMA region (attach again)");
  }
  for (int i = 0; i < req->blocks_size(); ++i) {
    const v1::RdmaBlock& b = req->blocks(i);
    if (!region->Contains(b.offset(), b.length())) {
      return Invalid(absl::InvalidArgumentError(
          absl::StrCat("block ", i, ": a slice outside its ", region->size(), "-byte region")));
    }
  }
  int blocks = 0;
  int already = 0;
  int64_t bytes = 0;
  for (const v1::RdmaBlock& b : req->blocks()) {
    if (ctx->IsCancelled()) return grpc::Status::CANCELLED;
    // Copied out before the store checks it: the client's adapter may still
    // write the region (a confused or hostile client), so only the copy is
    // verified and kept.
    auto payload = std::make_shared<const std::string>(
        reinterpret_cast<const char*>(region->data()) + b.offset(),
        static_cast<size_t>(b.length()));
    bool was_stored = false;
    absl::Status st = store_->Put(EncodeKey(b.key()), payload, b.payload_xxh64(), &was_stored);
    if (st.code() == absl::StatusCode::kDataLoss) {
      return grpc::Status(grpc::StatusCode::DATA_LOSS,
                          absl::StrCat("block ", blocks, ": payload checksum mismatch"));
    }
    if (!st.ok()) return services::ToGrpcStatus(st);
    ++blocks;
    if (was_stored) ++already;
    bytes += b.length();
  }
  resp->set_num_blocks(blocks);
  resp->set_total_bytes(bytes);
  resp->set_num_already_stored(already);
  return grpc::Status::OK;
}

grpc::Status KvStoreService::GetRdma(grpc::ServerContext* ctx, const v1::GetRdmaRequest* req,
                                     v1::GetRdmaResponse* resp) {
  CallSlot slot(this);
  if (!slot.ok()) return slot.Busy();
  if (!ValidRegionName(req->region())) {
    return Invalid(absl::InvalidArgumentError("region: \"rdma-\" then 32 lowercase hex digits"));
  }
  if (grpc::Status s = CheckKeys(req->keys()); !s.ok()) return s;
  std::shared_ptr<RdmaRegion> region = Region(req->region());
  if (region == nullptr) {
    return grpc::Status(grpc::StatusCode::FAILED_PRECONDITION,
                        "unknown RDMA region (attach again)");
  }
  int64_t cursor = 0;
  for (const v1::BlockKey& k : req->keys()) {
    if (ctx->IsCancelled()) return grpc::Status::CANCELLED;
    // A block that does not fit was read (and counted as a hit) here and is
    // read again by the client's next call: rare, as regions hold many
    // blocks, and cheaper than a size lookup before every read.
    absl::StatusOr<Block> b = store_->Get(EncodeKey(k));
    if (b.status().code() == absl::StatusCode::kNotFound) break;
    if (!b.ok()) return services::ToGrpcStatus(b.status());
    const std::string& p = *b->payload;
    const int64_t size = static_cast<int64_t>(p.size());
    if (!region->Contains(cursor, size)) {
      resp->set_region_full(true);
      break;
    }
    std::memcpy(region->data() + cursor, p.data(), p.size());
    v1::RdmaBlock* out = resp->add_blocks();
    *out->mutable_key() = k;
    out->set_offset(cursor);
    out->set_length(size);
    out->set_payload_xxh64(b->xxh64);
    cursor += size;
    store_->CountBytesOut(size);
  }
  return grpc::Status::OK;
}

}  // namespace ringlane::kvstore
