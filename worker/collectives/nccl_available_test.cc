// The NCCL names every build links (nccl_communicator.h), checked in every
// build: with NCCL they validate their arguments, without it they say why
// they cannot run. The collectives themselves are tested in
// collectives/nccl/nccl_communicator_test.cc, built only with CUDA and NCCL.
#include "gtest/gtest.h"
#include "worker/collectives/nccl_communicator.h"

namespace ringlane::worker {
namespace {

TEST(NcclAvailable, MatchesWhatTheFactoriesSay) {
  // An out-of-range rank is rejected before CUDA or the network is touched.
  const NcclOptions bad{.rank = 2, .world_size = 2};
  if (NcclAvailable()) {
    EXPECT_EQ(CreateNcclCommunicator(bad).status().code(), absl::StatusCode::kInvalidArgument);
    EXPECT_EQ(ExchangeNcclUniqueId(bad).status().code(), absl::StatusCode::kInvalidArgument);
  } else {
    absl::Status st = CreateNcclCommunicator(bad).status();
    EXPECT_EQ(st.code(), absl::StatusCode::kUnimplemented);
    EXPECT_NE(st.message().find("built without CUDA/NCCL"), std::string::npos) << st;
    EXPECT_EQ(ExchangeNcclUniqueId(bad).status().code(), absl::StatusCode::kUnimplemented);
  }
}

}  // namespace
}  // namespace ringlane::worker
