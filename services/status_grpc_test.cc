#include "services/status_grpc.h"

#include <string>

#include "gtest/gtest.h"

namespace ringlane::services {
namespace {

TEST(StatusGrpcTest, OkMapsToOk) {
  EXPECT_TRUE(ToGrpcStatus(absl::OkStatus()).ok());
  EXPECT_TRUE(FromGrpcStatus(grpc::Status::OK).ok());
}

TEST(StatusGrpcTest, EveryCodeRoundTripsWithItsMessage) {
  for (int code = 1; code <= 16; ++code) {
    SCOPED_TRACE(code);
    const std::string message = "failure #" + std::to_string(code);
    const absl::Status original(static_cast<absl::StatusCode>(code), message);

    const grpc::Status wire = ToGrpcStatus(original);
    EXPECT_EQ(static_cast<int>(wire.error_code()), code);
    EXPECT_EQ(wire.error_message(), message);

    const absl::Status back = FromGrpcStatus(wire);
    EXPECT_EQ(back.code(), original.code());
    EXPECT_EQ(back.message(), message);
    EXPECT_EQ(back, original);
  }
}

TEST(StatusGrpcTest, EveryGrpcCodeRoundTrips) {
  for (int code = 1; code <= 16; ++code) {
    SCOPED_TRACE(code);
    const grpc::Status wire(static_cast<grpc::StatusCode>(code), "m");
    const grpc::Status back = ToGrpcStatus(FromGrpcStatus(wire));
    EXPECT_EQ(back.error_code(), wire.error_code());
    EXPECT_EQ(back.error_message(), "m");
  }
}

TEST(StatusGrpcTest, NamedCodesAgree) {
  EXPECT_EQ(ToGrpcStatus(absl::UnavailableError("x")).error_code(), grpc::StatusCode::UNAVAILABLE);
  EXPECT_EQ(ToGrpcStatus(absl::InvalidArgumentError("x")).error_code(),
            grpc::StatusCode::INVALID_ARGUMENT);
  EXPECT_EQ(ToGrpcStatus(absl::DataLossError("x")).error_code(), grpc::StatusCode::DATA_LOSS);
  EXPECT_EQ(FromGrpcStatus(grpc::Status(grpc::StatusCode::DEADLINE_EXCEEDED, "")).code(),
            absl::StatusCode::kDeadlineExceeded);
}

TEST(StatusGrpcTest, OutOfRangeCodesBecomeUnknown) {
  const absl::Status odd(static_cast<absl::StatusCode>(42), "odd");
  const grpc::Status wire = ToGrpcStatus(odd);
  EXPECT_EQ(wire.error_code(), grpc::StatusCode::UNKNOWN);
  EXPECT_EQ(wire.error_message(), "odd");
  // The other direction cannot be tested: grpc::Status copies its code as the
  // enum type, and a value outside the enum is undefined behaviour (UBSan
  // stops the test), so FromGrpcStatus's range check is only a guard.
}

}  // namespace
}  // namespace ringlane::services
