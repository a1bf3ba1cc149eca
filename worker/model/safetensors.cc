#include "worker/model/safetensors.h"

#include <fcntl.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <numeric>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "nlohmann/json.hpp"

namespace ringlane::worker {
namespace {

using Json = nlohmann::json;

// Rejecting absurd headers early keeps a hostile length from driving a huge
// JSON parse; the reference implementation uses the same 100 MB bound.
constexpr uint64_t kMaxHeaderBytes = 100ull << 20;

absl::Status Bad(absl::string_view path, absl::string_view what) {
  return absl::InvalidArgumentError(absl::StrCat(path, ": invalid safetensors file: ", what));
}

absl::Status BadTensor(absl::string_view path, absl::string_view name, absl::string_view what) {
  return absl::InvalidArgumentError(
      absl::StrCat(path, ": invalid safetensors file: tensor '", name, "': ", what));
}

// product(shape) * elem_size, or false on overflow.
bool ByteCount(absl::Span<const int64_t> shape, size_t elem_size, uint64_t* out) {
  uint64_t n = elem_size;
  for (int64_t d : shape) {
    if (d < 0) return false;
    if (__builtin_mul_overflow(n, static_cast<uint64_t>(d), &n)) return false;
  }
  *out = n;
  return true;
}

std::string ShapeString(absl::Span<const int64_t> shape) {
  return absl::StrCat("[", absl::StrJoin(shape, ", "), "]");
}

absl::Status ParseTensorEntry(absl::string_view path, const std::string& name, const Json& v,
                              const uint8_t* data, uint64_t data_size, SafetensorsTensor* t) {
  if (!v.is_object()) return BadTensor(path, name, "entry is not a JSON object");
  auto dtype_it = v.find("dtype");
  if (dtype_it == v.end() || !dtype_it->is_string()) {
    return BadTensor(path, name, "missing or non-string 'dtype'");
  }
  absl::StatusOr<DType> dtype = ParseSafetensorsDType(dtype_it->get<std::string>());
  if (!dtype.ok()) return BadTensor(path, name, dtype.status().message());

  auto shape_it = v.find("shape");
  if (shape_it == v.end() || !shape_it->is_array()) {
    return BadTensor(path, name, "missing or non-array 'shape'");
  }
  std::vector<int64_t> shape;
  for (const Json& d : *shape_it) {
    if (!d.is_number_unsigned() || d.get<uint64_t>() > static_cast<uint64_t>(INT64_MAX)) {
      return BadTensor(path, name, absl::StrCat("shape entry ", d.dump(), " is not a size"));
    }
    shape.push_back(static_cast<int64_t>(d.get<uint64_t>()));
  }

  auto off_it = v.find("data_offsets");
  if (off_it == v.end() || !off_it->is_array() || off_it->size() != 2 ||
      !(*off_it)[0].is_number_unsigned() || !(*off_it)[1].is_number_unsigned()) {
    return BadTensor(path, name, "'data_offsets' must be two non-negative integers");
  }
  uint64_t begin = (*off_it)[0].get<uint64_t>();
  uint64_t end = (*off_it)[1].get<uint64_t>();
  if (begin > end) {
    return BadTensor(path, name,
                     absl::StrCat("data_offsets [", begin, ", ", end, "] are reversed"));
  }
  if (end > data_size) {
    return BadTensor(
        path, name,
        absl::StrCat("data_offsets [", begin, ", ", end, "] run past the end of the data section (",
                     data_size, " bytes); the file is truncated or the header lies"));
  }
  uint64_t expected = 0;
  if (!ByteCount(shape, DTypeSize(*dtype), &expected)) {
    return BadTensor(path, name, absl::StrCat("shape ", ShapeString(shape), " overflows"));
  }
  if (end - begin != expected) {
    return BadTensor(
        path, name,
        absl::StrCat("data_offsets [", begin, ", ", end, "] hold ", end - begin, " bytes but ",
                     std::string(DTypeName(*dtype)), " ", ShapeString(shape), " needs ", expected));
  }
  t->name = name;
  t->dtype = *dtype;
  t->shape = std::move(shape);
  t->data = data + begin;
  t->size_bytes = expected;
  return absl::OkStatus();
}

}  // namespace

int64_t SafetensorsTensor::NumElements() const {
  int64_t n = 1;
  for (int64_t d : shape) n *= d;
  return n;
}

absl::StatusOr<SafetensorsFile> SafetensorsFile::Open(const std::string& path) {
  absl::StatusOr<std::shared_ptr<MappedFile>> file = MappedFile::Open(path);
  if (!file.ok()) return file.status();
  return Parse(*std::move(file));
}

absl::StatusOr<SafetensorsFile> SafetensorsFile::Parse(std::shared_ptr<MappedFile> file) {
  const std::string& path = file->path();
  const uint64_t size = file->size();
  if (size < 8) {
    return Bad(path,
               absl::StrCat("file is ", size, " bytes, shorter than the 8-byte header length"));
  }
  uint64_t header_len = 0;
  for (int i = 7; i >= 0; --i) header_len = (header_len << 8) | file->data()[i];
  if (header_len > size - 8) {
    return Bad(path, absl::StrCat("header length ", header_len, " exceeds the ", size - 8,
                                  " bytes after the length field (file is truncated or corrupt)"));
  }
  if (header_len > kMaxHeaderBytes) {
    return Bad(path, absl::StrCat("header length ", header_len, " is larger than the limit of ",
                                  kMaxHeaderBytes));
  }
  const char* header = reinterpret_cast<const char*>(file->data() + 8);
  const uint8_t* data = file->data() + 8 + header_len;
  const uint64_t data_size = size - 8 - header_len;

  SafetensorsFile out;
  // nlohmann reports malformed JSON and type mismatches by throwing; keep every
  // exception inside this call.
  try {
    Json root = Json::parse(header, header + header_len);
    if (!root.is_object()) return Bad(path, "header is not a JSON object");
    for (auto it = root.begin(); it != root.end(); ++it) {
      if (it.key() == "__metadata__") {
        if (!it.value().is_object()) return Bad(path, "'__metadata__' is not a JSON object");
        for (auto m = it.value().begin(); m != it.value().end(); ++m) {
          if (!m.value().is_string()) {
            return Bad(path, absl::StrCat("'__metadata__' entry '", m.key(), "' is not a string"));
          }
          out.metadata_[m.key()] = m.value().get<std::string>();
        }
        continue;
      }
      SafetensorsTensor t;
      absl::Status s = ParseTensorEntry(path, it.key(), it.value(), data, data_size, &t);
      if (!s.ok()) return s;
      out.tensors_.push_back(std::move(t));
    }
  } catch (const Json::exception& e) {
    return Bad(path, absl::StrCat("header is not valid JSON: ", e.what()));
  }

  // Tensors may not share bytes: a header that maps two names onto one range
  // is corrupt, and loading it would alias weights silently.
  std::vector<size_t> order(out.tensors_.size());
  std::iota(order.begin(), order.end(), 0);
  std::sort(order.begin(), order.end(),
            [&](size_t a, size_t b) { return out.tensors_[a].data < out.tensors_[b].data; });
  const SafetensorsTensor* prev = nullptr;
  for (size_t i : order) {
    const SafetensorsTensor& t = out.tensors_[i];
    if (t.size_bytes == 0) continue;
    if (prev != nullptr && t.data < prev->data + prev->size_bytes) {
      return BadTensor(path, t.name,
                       absl::StrCat("data_offsets overlap those of tensor '", prev->name, "'"));
    }
    prev = &t;
  }
  for (size_t i = 0; i < out.tensors_.size(); ++i) out.index_[out.tensors_[i].name] = i;
  out.file_ = std::move(file);
  return out;
}

const SafetensorsTensor* SafetensorsFile::Find(std::string_view name) const {
  auto it = index_.find(std::string(name));
  return it == index_.end() ? nullptr : &tensors_[it->second];
}

// ---------------------------------------------------------------------------
// Writer

absl::StatusOr<std::unique_ptr<SafetensorsWriter>> SafetensorsWriter::Create(
    const std::string& path, std::vector<SafetensorsTensorSpec> tensors,
    const std::map<std::string, std::string>& metadata) {
  std::unique_ptr<SafetensorsWriter> w(new SafetensorsWriter());
  w->path_ = path;
  w->tmp_path_ = path + ".tmp";
  const size_t n = tensors.size();
  w->sizes_.resize(n);
  w->offsets_.resize(n);
  std::map<std::string, int> seen;
  for (size_t i = 0; i < n; ++i) {
    const SafetensorsTensorSpec& t = tensors[i];
    if (t.name.empty() || t.name == "__metadata__") {
      return absl::InvalidArgumentError(absl::StrCat(path, ": invalid tensor name '", t.name, "'"));
    }
    if (!seen.emplace(t.name, static_cast<int>(i)).second) {
      return absl::InvalidArgumentError(
          absl::StrCat(path, ": tensor '", t.name, "' appears twice"));
    }
    uint64_t bytes = 0;
    if (!ByteCount(t.shape, DTypeSize(t.dtype), &bytes)) {
      return absl::InvalidArgumentError(absl::StrCat(path, ": tensor '", t.name, "': shape ",
                                                     ShapeString(t.shape), " is invalid"));
    }
    w->sizes_[i] = bytes;
  }
  // Larger elements first keeps every tensor aligned to its element size, as
  // the data section itself starts on an 8-byte boundary.
  std::vector<size_t> order(n);
  std::iota(order.begin(), order.end(), 0);
  std::sort(order.begin(), order.end(), [&](size_t a, size_t b) {
    size_t sa = DTypeSize(tensors[a].dtype), sb = DTypeSize(tensors[b].dtype);
    if (sa != sb) return sa > sb;
    return tensors[a].name < tensors[b].name;
  });
  size_t off = 0;
  for (size_t i : order) {
    w->offsets_[i] = off;
    off += w->sizes_[i];
  }
  w->data_bytes_ = off;

  std::string header;
  try {
    Json root = Json::object();
    if (!metadata.empty()) root["__metadata__"] = metadata;
    for (size_t i = 0; i < n; ++i) {
      root[tensors[i].name] = {
          {"dtype", std::string(DTypeName(tensors[i].dtype))},
          {"shape", tensors[i].shape},
          {"data_offsets", {w->offsets_[i], w->offsets_[i] + w->sizes_[i]}},
      };
    }
    header = root.dump();
  } catch (const Json::exception& e) {
    return absl::InvalidArgumentError(
        absl::StrCat(path, ": cannot encode safetensors header: ", e.what()));
  }
  while ((8 + header.size()) % 8 != 0) header.push_back(' ');
  w->data_start_ = 8 + header.size();
  w->specs_ = std::move(tensors);
  w->written_ = std::make_unique<std::atomic<size_t>[]>(n);
  for (size_t i = 0; i < n; ++i) w->written_[i].store(0);

  w->fd_ = ::open(w->tmp_path_.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  if (w->fd_ < 0) {
    return absl::InternalError(
        absl::StrCat("cannot create ", w->tmp_path_, ": ", std::strerror(errno)));
  }
  uint8_t len[8];
  uint64_t hl = header.size();
  for (int i = 0; i < 8; ++i) len[i] = static_cast<uint8_t>(hl >> (8 * i));
  std::string prefix(reinterpret_cast<const char*>(len), 8);
  prefix += header;
  if (absl::Status s = w->WriteAt(
          -1, 0,
          absl::MakeConstSpan(reinterpret_cast<const uint8_t*>(prefix.data()), prefix.size()));
      !s.ok()) {
    return s;
  }
  // Sizing the file now lets WriteAt fill it in any order.
  if (::ftruncate(w->fd_, static_cast<off_t>(w->data_start_ + w->data_bytes_)) != 0) {
    return absl::InternalError(
        absl::StrCat("cannot size ", w->tmp_path_, ": ", std::strerror(errno)));
  }
  return w;
}

SafetensorsWriter::~SafetensorsWriter() {
  if (fd_ >= 0) ::close(fd_);
  if (!finished_ && !tmp_path_.empty()) ::unlink(tmp_path_.c_str());
}

int SafetensorsWriter::IndexOf(std::string_view name) const {
  for (size_t i = 0; i < specs_.size(); ++i) {
    if (specs_[i].name == name) return static_cast<int>(i);
  }
  return -1;
}

// index == -1 writes at an absolute file offset (the header).
absl::Status SafetensorsWriter::WriteAt(int index, size_t offset, absl::Span<const uint8_t> bytes) {
  size_t pos = offset;
  if (index >= 0) {
    if (static_cast<size_t>(index) >= specs_.size()) {
      return absl::InvalidArgumentError(absl::StrCat(path_, ": no tensor #", index));
    }
    if (offset > sizes_[index] || bytes.size() > sizes_[index] - offset) {
      return absl::InvalidArgumentError(
          absl::StrCat(path_, ": write of ", bytes.size(), " bytes at ", offset,
                       " overruns tensor '", specs_[index].name, "' (", sizes_[index], " bytes)"));
    }
    pos = data_start_ + offsets_[index] + offset;
  }
  const uint8_t* p = bytes.data();
  size_t left = bytes.size();
  while (left > 0) {
    ssize_t r = ::pwrite(fd_, p, left, static_cast<off_t>(pos));
    if (r < 0) {
      if (errno == EINTR) continue;
      return absl::InternalError(absl::StrCat("write to ", tmp_path_, ": ", std::strerror(errno)));
    }
    p += r;
    pos += static_cast<size_t>(r);
    left -= static_cast<size_t>(r);
  }
  if (index >= 0) written_[index].fetch_add(bytes.size());
  return absl::OkStatus();
}

absl::Status SafetensorsWriter::Finish() {
  for (size_t i = 0; i < specs_.size(); ++i) {
    if (written_[i].load() != sizes_[i]) {
      return absl::FailedPreconditionError(absl::StrCat(path_, ": tensor '", specs_[i].name,
                                                        "' got ", written_[i].load(), " of its ",
                                                        sizes_[i], " bytes"));
    }
  }
  if (::close(fd_) != 0) {
    fd_ = -1;
    return absl::InternalError(absl::StrCat("close ", tmp_path_, ": ", std::strerror(errno)));
  }
  fd_ = -1;
  if (::rename(tmp_path_.c_str(), path_.c_str()) != 0) {
    return absl::InternalError(
        absl::StrCat("rename ", tmp_path_, " to ", path_, ": ", std::strerror(errno)));
  }
  finished_ = true;
  return absl::OkStatus();
}

absl::Status WriteSafetensors(const std::string& path,
                              absl::Span<const SafetensorsTensorData> tensors,
                              const std::map<std::string, std::string>& metadata) {
  std::vector<SafetensorsTensorSpec> specs;
  specs.reserve(tensors.size());
  for (const SafetensorsTensorData& t : tensors) specs.push_back({t.name, t.dtype, t.shape});
  absl::StatusOr<std::unique_ptr<SafetensorsWriter>> w =
      SafetensorsWriter::Create(path, std::move(specs), metadata);
  if (!w.ok()) return w.status();
  for (size_t i = 0; i < tensors.size(); ++i) {
    if (tensors[i].bytes.size() != (*w)->tensor_bytes(static_cast<int>(i))) {
      return absl::InvalidArgumentError(absl::StrCat(
          path, ": tensor '", tensors[i].name, "' has ", tensors[i].bytes.size(), " bytes but ",
          std::string(DTypeName(tensors[i].dtype)), " ", ShapeString(tensors[i].shape), " needs ",
          (*w)->tensor_bytes(static_cast<int>(i))));
    }
    if (absl::Status s = (*w)->WriteAt(static_cast<int>(i), 0, tensors[i].bytes); !s.ok()) {
      return s;
    }
  }
  return (*w)->Finish();
}

}  // namespace ringlane::worker
