// Whole-file reads for the tokenizer loaders.
#ifndef RINGLANE_ROUTER_TOKENIZER_READ_FILE_H_
#define RINGLANE_ROUTER_TOKENIZER_READ_FILE_H_

#include <string>

#include "absl/status/statusor.h"

namespace ringlane::router {

// The contents of `path`. Errors keep errno's code (NotFound for a missing
// file) and read "cannot open <what> <path>" / "cannot read <what> <path>",
// where `what` names the kind of file ("" for none).
absl::StatusOr<std::string> ReadWholeFile(const std::string& path, const std::string& what = "");

}  // namespace ringlane::router

#endif  // RINGLANE_ROUTER_TOKENIZER_READ_FILE_H_
