#include "services/shm_segment.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <cstring>
#include <random>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"

namespace ringlane::services {

namespace {

constexpr char kPrefixText[] = "ringlane-kv-";
constexpr std::string_view kPrefix = kPrefixText;

absl::Status Errno(const std::string& what) {
  return absl::FailedPreconditionError(absl::StrCat(what, ": ", std::strerror(errno)));
}

}  // namespace

bool ShmSegment::ValidName(std::string_view name) {
  if (name.size() <= kPrefix.size() || name.size() > kPrefix.size() + 64) return false;
  if (name.substr(0, kPrefix.size()) != kPrefix) return false;
  for (char c : name.substr(kPrefix.size())) {
    if (!((c >= 'a' && c <= 'z') || (c >= '0' && c <= '9') || c == '-')) return false;
  }
  return true;
}

absl::StatusOr<std::unique_ptr<ShmSegment>> ShmSegment::Create(const std::string& dir,
                                                               size_t size) {
  if (size <= kShmTokenBytes) return absl::InvalidArgumentError("segment too small");
  static std::atomic<int> n{0};
  const std::string name = absl::StrCat(kPrefixText, getpid(), "-", n++);
  const std::string path = absl::StrCat(dir, "/", name);
  const int fd = ::open(path.c_str(), O_RDWR | O_CREAT | O_EXCL | O_CLOEXEC, 0600);
  if (fd < 0) return Errno(absl::StrCat("cannot create ", path));
  if (::ftruncate(fd, static_cast<off_t>(size)) != 0) {
    absl::Status st = Errno(absl::StrCat("cannot size ", path));
    ::close(fd);
    ::unlink(path.c_str());
    return st;
  }
  void* p = ::mmap(nullptr, size, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
  ::close(fd);
  if (p == MAP_FAILED) {
    absl::Status st = Errno(absl::StrCat("cannot map ", path));
    ::unlink(path.c_str());
    return st;
  }
  auto* data = static_cast<uint8_t*>(p);
  std::random_device rd;
  for (size_t i = 0; i < kShmTokenBytes; ++i) data[i] = static_cast<uint8_t>(rd());
  return std::unique_ptr<ShmSegment>(new ShmSegment(path, name, data, size, /*owner=*/true));
}

absl::StatusOr<std::unique_ptr<ShmSegment>> ShmSegment::Open(const std::string& dir,
                                                             const std::string& name,
                                                             std::string_view token,
                                                             size_t max_size) {
  if (!ValidName(name)) return absl::InvalidArgumentError("bad shared-memory segment name");
  if (token.size() != kShmTokenBytes) {
    return absl::InvalidArgumentError(absl::StrCat("token of ", token.size(), " bytes"));
  }
  const std::string path = absl::StrCat(dir, "/", name);
  // O_NOFOLLOW: a name is a file of the directory, never a link out of it.
  const int fd = ::open(path.c_str(), O_RDWR | O_NOFOLLOW | O_CLOEXEC);
  if (fd < 0) return Errno(absl::StrCat("cannot open segment ", name));
  struct stat st;
  if (::fstat(fd, &st) != 0 || !S_ISREG(st.st_mode)) {
    ::close(fd);
    return absl::FailedPreconditionError(absl::StrCat("segment ", name, " is not a file"));
  }
  const size_t size = static_cast<size_t>(st.st_size);
  if (size <= kShmTokenBytes || size > max_size) {
    ::close(fd);
    return absl::InvalidArgumentError(absl::StrCat("segment ", name, " of ", size, " bytes (",
                                                   kShmTokenBytes + 1, "..", max_size, ")"));
  }
  void* p = ::mmap(nullptr, size, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
  ::close(fd);
  if (p == MAP_FAILED) return Errno(absl::StrCat("cannot map segment ", name));
  auto seg = std::unique_ptr<ShmSegment>(
      new ShmSegment(path, name, static_cast<uint8_t*>(p), size, /*owner=*/false));
  if (seg->token() != token) {
    return absl::FailedPreconditionError(
        absl::StrCat("segment ", name, " does not hold the caller's token (another node's?)"));
  }
  return seg;
}

void ShmSegment::Unlink() {
  if (owner_ && linked_) ::unlink(path_.c_str());
  linked_ = false;
}

ShmSegment::~ShmSegment() {
  ::munmap(data_, size_);
  Unlink();
}

bool ShmSegment::Contains(int64_t offset, int64_t length) const {
  return offset >= static_cast<int64_t>(kShmTokenBytes) && length >= 0 &&
         offset <= static_cast<int64_t>(size_) && length <= static_cast<int64_t>(size_) - offset;
}

}  // namespace ringlane::services
