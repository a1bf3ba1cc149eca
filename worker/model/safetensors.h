// Reading and writing the safetensors format: an 8-byte little-endian header
// length N, N bytes of JSON describing each tensor {dtype, shape, data_offsets},
// then the tensor bytes. The reader validates the whole header against the file
// before handing out any pointer, so a corrupt or hostile file is an error,
// never a crash. Tensors point into the mapping; nothing is copied.
//
// Threads: a SafetensorsFile is immutable after Open/Parse and may be read from
// any thread. A SafetensorsWriter is used by one thread at a time, except that
// WriteAt may be called concurrently for disjoint byte ranges.
#ifndef RINGLANE_WORKER_MODEL_SAFETENSORS_H_
#define RINGLANE_WORKER_MODEL_SAFETENSORS_H_

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <string_view>
#include <unordered_map>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/types/span.h"
#include "worker/dtype.h"
#include "worker/model/model.h"

namespace ringlane::worker {

// One tensor of a parsed file; `data` points into the mapping.
struct SafetensorsTensor {
  std::string name;
  DType dtype = DType::kF32;
  std::vector<int64_t> shape;
  const uint8_t* data = nullptr;
  size_t size_bytes = 0;

  int64_t NumElements() const;
};

class SafetensorsFile {
 public:
  // Maps `path` and parses it.
  static absl::StatusOr<SafetensorsFile> Open(const std::string& path);
  // Parses an already mapped file. Every problem (truncation, invalid JSON,
  // offsets out of range, overlapping or reversed, byte count not matching
  // dtype * shape, unsupported dtype) is an InvalidArgument error whose message
  // names the file and the tensor.
  static absl::StatusOr<SafetensorsFile> Parse(std::shared_ptr<MappedFile> file);

  // nullptr when the file has no tensor of that name.
  const SafetensorsTensor* Find(std::string_view name) const;
  // In header order.
  const std::vector<SafetensorsTensor>& tensors() const { return tensors_; }
  // The "__metadata__" entries (string values only, as the format requires).
  const std::map<std::string, std::string>& metadata() const { return metadata_; }
  const std::shared_ptr<MappedFile>& file() const { return file_; }
  const std::string& path() const { return file_->path(); }

 private:
  std::shared_ptr<MappedFile> file_;
  std::vector<SafetensorsTensor> tensors_;
  std::unordered_map<std::string, size_t> index_;
  std::map<std::string, std::string> metadata_;
};

// What a writer needs to know about a tensor before any data is written.
struct SafetensorsTensorSpec {
  std::string name;
  DType dtype = DType::kF32;
  std::vector<int64_t> shape;
};

// Writes a file whose layout is fixed up front: Create computes every tensor's
// offsets and writes the header, then data arrive through WriteAt in any order
// (so a generator can stream, and write a scale tensor after its weights).
// Tensors are laid out by decreasing element size, then name, so that each one
// is aligned to its element size. The header is padded with spaces to a
// multiple of 8 bytes. Data go to `path`.tmp, renamed to `path` by Finish.
class SafetensorsWriter {
 public:
  static absl::StatusOr<std::unique_ptr<SafetensorsWriter>> Create(
      const std::string& path, std::vector<SafetensorsTensorSpec> tensors,
      const std::map<std::string, std::string>& metadata = {});
  ~SafetensorsWriter();
  SafetensorsWriter(const SafetensorsWriter&) = delete;
  SafetensorsWriter& operator=(const SafetensorsWriter&) = delete;

  // Index of `name` in the spec list given to Create, or -1.
  int IndexOf(std::string_view name) const;
  // Writes `bytes` at byte `offset` inside tensor `index`. Safe to call from
  // several threads for disjoint ranges.
  absl::Status WriteAt(int index, size_t offset, absl::Span<const uint8_t> bytes);
  // Checks that every tensor received exactly its byte count, then publishes
  // the file under its final name.
  absl::Status Finish();

  // Bytes of tensor data in the file (excluding the header).
  size_t data_bytes() const { return data_bytes_; }
  size_t tensor_bytes(int index) const { return sizes_[index]; }

 private:
  SafetensorsWriter() = default;

  std::string path_;
  std::string tmp_path_;
  int fd_ = -1;
  size_t data_start_ = 0;
  size_t data_bytes_ = 0;
  std::vector<SafetensorsTensorSpec> specs_;
  std::vector<size_t> offsets_;  // relative to the data section
  std::vector<size_t> sizes_;
  std::unique_ptr<std::atomic<size_t>[]> written_;
  bool finished_ = false;
};

// A tensor with its bytes in memory, for WriteSafetensors.
struct SafetensorsTensorData {
  std::string name;
  DType dtype = DType::kF32;
  std::vector<int64_t> shape;
  absl::Span<const uint8_t> bytes;
};

// Writes `tensors` to `path` in one go; each tensor's byte count must equal
// product(shape) * DTypeSize(dtype).
absl::Status WriteSafetensors(const std::string& path,
                              absl::Span<const SafetensorsTensorData> tensors,
                              const std::map<std::string, std::string>& metadata = {});

}  // namespace ringlane::worker

#endif  // RINGLANE_WORKER_MODEL_SAFETENSORS_H_
