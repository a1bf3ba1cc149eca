// The bundled model for the worker's unit tests, loaded once per call (a
// failed load is a failed expectation and a null model). Header-only.
#ifndef RINGLANE_WORKER_TESTING_MODELS_H_
#define RINGLANE_WORKER_TESTING_MODELS_H_

#include <memory>
#include <string>

#include "gtest/gtest.h"
#include "worker/model/model.h"

namespace ringlane::worker {

inline std::shared_ptr<const ModelWeights> BundledStories() {
  auto m =
      LoadModel(std::string(RINGLANE_SOURCE_DIR) + "/deploy/models/stories260K/stories260K.bin");
  EXPECT_TRUE(m.ok()) << m.status();
  if (!m.ok()) return nullptr;
  return std::shared_ptr<const ModelWeights>(std::move(*m));
}

}  // namespace ringlane::worker

#endif  // RINGLANE_WORKER_TESTING_MODELS_H_
