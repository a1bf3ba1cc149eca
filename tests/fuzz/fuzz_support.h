// Helpers the fuzz targets share: a reader that splits one input into the
// choices a target makes, a check that aborts (so libFuzzer records the
// input as a crash), and files with fuzzed contents for loaders that take a
// path. Used on one thread per process, as libFuzzer runs targets.
#ifndef RINGLANE_TESTS_FUZZ_FUZZ_SUPPORT_H_
#define RINGLANE_TESTS_FUZZ_FUZZ_SUPPORT_H_

#include <fcntl.h>
#include <sys/mman.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <string_view>

// A property the code under test promises: a broken one is a finding, not a
// rejected input, so it aborts with the reason.
#define FUZZ_CHECK(cond, ...)                                                            \
  do {                                                                                   \
    if (!(cond)) {                                                                       \
      std::fprintf(stderr, "%s:%d: FUZZ_CHECK(%s) failed: ", __FILE__, __LINE__, #cond); \
      std::fprintf(stderr, __VA_ARGS__);                                                 \
      std::fprintf(stderr, "\n");                                                        \
      std::abort();                                                                      \
    }                                                                                    \
  } while (0)

namespace ringlane::fuzz {

// Takes choices off the front of an input; past the end every read is 0 or
// empty, so any input is a valid sequence of choices.
class ByteReader {
 public:
  ByteReader(const uint8_t* data, size_t size)
      : data_(reinterpret_cast<const char*>(data)), size_(size) {}
  uint8_t Byte() { return pos_ < size_ ? static_cast<uint8_t>(data_[pos_++]) : 0; }
  uint16_t U16() {
    uint16_t lo = Byte();
    return static_cast<uint16_t>(lo | (Byte() << 8));
  }
  // The bytes before the next `sep` (consumed) or the end.
  std::string_view Until(char sep) {
    size_t end = std::string_view(data_ + pos_, size_ - pos_).find(sep);
    if (end == std::string_view::npos) end = size_ - pos_;
    std::string_view out(data_ + pos_, end);
    pos_ = std::min(size_, pos_ + end + 1);
    return out;
  }
  std::string_view Rest() {
    std::string_view out(data_ + pos_, size_ - pos_);
    pos_ = size_;
    return out;
  }
  bool empty() const { return pos_ >= size_; }

 private:
  const char* data_;
  size_t size_;
  size_t pos_ = 0;
};

// A file under /dev/shm (tmpfs, so rewriting it for every input costs no
// disk I/O) whose name ends in `suffix`, for loaders that choose the format
// by the name; removed at exit.
class ScratchFile {
 public:
  explicit ScratchFile(std::string_view suffix) {
    path_ = "/dev/shm/ringlane_fuzz_" + std::to_string(::getpid()) + "_" +
            std::to_string(counter_++) + std::string(suffix);
  }
  ~ScratchFile() { ::unlink(path_.c_str()); }
  ScratchFile(const ScratchFile&) = delete;
  ScratchFile& operator=(const ScratchFile&) = delete;

  // Replaces the contents; aborts when tmpfs refuses (not a finding of the
  // code under test, but a run without its file would test nothing).
  const std::string& Write(std::string_view bytes) {
    int fd = ::open(path_.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0600);
    FUZZ_CHECK(fd >= 0, "cannot create %s: %s", path_.c_str(), std::strerror(errno));
    size_t done = 0;
    while (done < bytes.size()) {
      ssize_t n = ::write(fd, bytes.data() + done, bytes.size() - done);
      FUZZ_CHECK(n > 0, "cannot write %s: %s", path_.c_str(), std::strerror(errno));
      done += static_cast<size_t>(n);
    }
    ::close(fd);
    return path_;
  }
  const std::string& path() const { return path_; }

 private:
  static inline int counter_ = 0;
  std::string path_;
};

}  // namespace ringlane::fuzz

#endif  // RINGLANE_TESTS_FUZZ_FUZZ_SUPPORT_H_
