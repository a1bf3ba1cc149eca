// The llama2.c checkpoint loader (worker/model/loader.cc, LoadModel of a
// *.bin) over arbitrary file bytes. The header's seven int32 fields decide
// every size, so what must hold is: no crash, no undefined behaviour (the
// size arithmetic overflows int64 for hostile headers), an error for every
// file whose size disagrees with its header, and a model that runs a step
// whenever the loader accepts one.
//
// Input: the checkpoint file (make_seeds.py writes tiny real ones).
#include <cstdint>
#include <string_view>

#include "absl/status/status.h"
#include "tests/fuzz/fuzz_support.h"
#include "tests/fuzz/model_step.h"
#include "worker/model/model.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  static ringlane::fuzz::ScratchFile* file = new ringlane::fuzz::ScratchFile("_model.bin");
  const std::string& path =
      file->Write(std::string_view(reinterpret_cast<const char*>(data), size));
  ringlane::fuzz::CheckLoaded(
      ringlane::worker::LoadModel(path),
      {absl::StatusCode::kInvalidArgument, absl::StatusCode::kUnimplemented});
  return 0;
}
