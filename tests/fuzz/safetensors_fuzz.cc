// The safetensors reader and the Hugging Face directory loader
// (worker/model/safetensors.h, LoadModel of a directory) over arbitrary file
// bytes. safetensors.h promises that a corrupt or hostile file is an error,
// never a crash, and that the whole header is checked against the file
// before any pointer is handed out; so what must hold is: no crash, no
// undefined behaviour, every tensor of an accepted file inside the file with
// exactly dtype x shape bytes, and a directory the loader accepts runs a
// step.
//
// Input: byte 0 = mode. Even: the rest is model.safetensors, loaded beside a
// fixed tiny config.json (make_seeds.py writes matching files). Odd: the
// rest is config.json '\0' model.safetensors.
#include <cstdint>
#include <filesystem>
#include <string>
#include <string_view>

#include "absl/status/status.h"
#include "tests/fuzz/fuzz_support.h"
#include "tests/fuzz/model_step.h"
#include "worker/dtype.h"
#include "worker/model/model.h"
#include "worker/model/safetensors.h"

namespace {

// The shape make_seeds.py writes its tiny safetensors seeds for.
constexpr std::string_view kTinyConfig = R"({
  "model_type": "llama", "hidden_size": 8, "intermediate_size": 16,
  "num_hidden_layers": 1, "num_attention_heads": 2, "num_key_value_heads": 1,
  "vocab_size": 16, "max_position_embeddings": 32, "rms_norm_eps": 1e-05,
  "rope_theta": 10000.0, "hidden_act": "silu", "tie_word_embeddings": true,
  "bos_token_id": 1, "eos_token_id": 2
})";

// A directory of its own per process: config.json and model.safetensors.
const std::string& Dir() {
  static const std::string* dir = [] {
    auto* d = new std::string("/dev/shm/ringlane_fuzz_safetensors_" + std::to_string(::getpid()));
    std::filesystem::create_directories(*d);
    std::atexit([] { std::filesystem::remove_all(Dir()); });
    return d;
  }();
  return *dir;
}

void WriteFile(const std::string& path, std::string_view bytes) {
  int fd = ::open(path.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0600);
  FUZZ_CHECK(fd >= 0, "cannot create %s", path.c_str());
  FUZZ_CHECK(::write(fd, bytes.data(), bytes.size()) == static_cast<ssize_t>(bytes.size()),
             "cannot write %s", path.c_str());
  ::close(fd);
}

void CheckTensors(const ringlane::worker::SafetensorsFile& f) {
  const uint8_t* begin = f.file()->data();
  const uint8_t* end = begin + f.file()->size();
  for (const ringlane::worker::SafetensorsTensor& t : f.tensors()) {
    FUZZ_CHECK(
        t.data >= begin && t.data <= end && t.size_bytes <= static_cast<size_t>(end - t.data),
        "tensor %s lies outside the file", t.name.c_str());
    for (int64_t d : t.shape)
      FUZZ_CHECK(d >= 0, "tensor %s has a negative dimension", t.name.c_str());
    const int64_t n = t.NumElements();
    FUZZ_CHECK(
        n >= 0 && static_cast<size_t>(n) * ringlane::worker::DTypeSize(t.dtype) == t.size_bytes,
        "tensor %s: %lld elements of %zu bytes in %zu bytes", t.name.c_str(),
        static_cast<long long>(n), ringlane::worker::DTypeSize(t.dtype), t.size_bytes);
    FUZZ_CHECK(f.Find(t.name) == &t, "Find(%s) does not find it", t.name.c_str());
  }
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  ringlane::fuzz::ByteReader in(data, size);
  const uint8_t mode = in.Byte();
  const std::string_view config = (mode & 1) != 0 ? in.Until('\0') : kTinyConfig;
  const std::string_view weights = in.Rest();
  const std::string st_path = Dir() + "/model.safetensors";
  WriteFile(st_path, weights);

  absl::StatusOr<ringlane::worker::SafetensorsFile> f =
      ringlane::worker::SafetensorsFile::Open(st_path);
  if (!f.ok()) {
    FUZZ_CHECK(f.status().code() == absl::StatusCode::kInvalidArgument, "Open failed with %s",
               f.status().ToString().c_str());
    return 0;
  }
  CheckTensors(*f);

  WriteFile(Dir() + "/config.json", config);
  // NotFound: a tensor the config needs is not in the file.
  ringlane::fuzz::CheckLoaded(ringlane::worker::LoadModel(Dir()),
                              {absl::StatusCode::kInvalidArgument, absl::StatusCode::kUnimplemented,
                               absl::StatusCode::kNotFound});
  return 0;
}
