#include "router/tokenizer/read_file.h"

#include <array>
#include <cerrno>
#include <cstdio>
#include <memory>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"

namespace ringlane::router {

absl::StatusOr<std::string> ReadWholeFile(const std::string& path, const std::string& what) {
  const std::string name = what.empty() ? path : absl::StrCat(what, " ", path);
  std::unique_ptr<std::FILE, int (*)(std::FILE*)> file(std::fopen(path.c_str(), "rb"),
                                                       &std::fclose);
  if (file == nullptr) {
    // Saved first: building the message may allocate and clobber errno.
    const int error = errno;
    return absl::ErrnoToStatus(error, absl::StrCat("cannot open ", name));
  }
  std::string data;
  std::array<char, 1 << 16> buffer;
  size_t n;
  while ((n = std::fread(buffer.data(), 1, buffer.size(), file.get())) > 0) {
    data.append(buffer.data(), n);
  }
  if (std::ferror(file.get())) {
    const int error = errno;
    return absl::ErrnoToStatus(error, absl::StrCat("cannot read ", name));
  }
  return data;
}

}  // namespace ringlane::router
