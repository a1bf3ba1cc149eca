// A shared-memory segment for the kvstore's same-node transport: a file in
// a tmpfs directory (/dev/shm), mapped read-write by a client (who creates
// it, writes a random token at its start, and removes it when done) and by
// the kvstore (who opens it by name and checks the token). Payload bytes go
// through it with one memcpy on each side instead of gRPC's framing and
// copies. Neither side trusts the other's writes: the reader copies the
// bytes out and verifies their XXH64 on its copy.
//
// Not thread-safe: one call at a time uses a segment (KvStoreClient holds a
// lock around it).
#ifndef RINGLANE_SERVICES_SHM_SEGMENT_H_
#define RINGLANE_SERVICES_SHM_SEGMENT_H_

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <string_view>

#include "absl/status/statusor.h"

namespace ringlane::services {

inline constexpr size_t kShmTokenBytes = 16;

class ShmSegment {
 public:
  // A new segment of `size` bytes (> kShmTokenBytes) in `dir`, named
  // "ringlane-kv-<pid>-<n>", its token written. Removed at destruction.
  static absl::StatusOr<std::unique_ptr<ShmSegment>> Create(const std::string& dir, size_t size);
  // Maps segment `name` of `dir` if its name is valid (ValidName) and its
  // first bytes are `token`. FailedPrecondition when it cannot be opened
  // or the token differs (another node's, or another file); InvalidArgument
  // for a bad name or a size over `max_size`.
  static absl::StatusOr<std::unique_ptr<ShmSegment>> Open(const std::string& dir,
                                                          const std::string& name,
                                                          std::string_view token, size_t max_size);
  // "ringlane-kv-" then 1..64 of [a-z0-9-].
  static bool ValidName(std::string_view name);

  ~ShmSegment();
  ShmSegment(const ShmSegment&) = delete;
  ShmSegment& operator=(const ShmSegment&) = delete;

  const std::string& name() const { return name_; }
  std::string_view token() const { return {reinterpret_cast<const char*>(data_), kShmTokenBytes}; }
  uint8_t* data() { return data_; }
  const uint8_t* data() const { return data_; }
  size_t size() const { return size_; }
  // Removes the file (the owner's mapping, and the store's, stay): once the
  // store attached it, nothing needs the name, and a client killed later
  // leaves nothing behind in the directory.
  void Unlink();
  bool linked() const { return linked_; }
  // Whether [offset, offset + length) lies past the token and inside.
  bool Contains(int64_t offset, int64_t length) const;

 private:
  ShmSegment(std::string path, std::string name, uint8_t* data, size_t size, bool owner)
      : path_(std::move(path)), name_(std::move(name)), data_(data), size_(size), owner_(owner) {}
  const std::string path_;
  const std::string name_;
  uint8_t* const data_;
  const size_t size_;
  const bool owner_;  // unlinks the file at destruction
  bool linked_ = true;
};

}  // namespace ringlane::services

#endif  // RINGLANE_SERVICES_SHM_SEGMENT_H_
