// Checks that the generated library builds, links and round-trips messages,
// and that the service stubs exist.
#include <memory>
#include <string>
#include <type_traits>

#include "grpcpp/create_channel.h"
#include "grpcpp/security/credentials.h"
#include "gtest/gtest.h"
#include "ringlane/v1/generate.grpc.pb.h"
#include "ringlane/v1/kvstore.grpc.pb.h"
#include "ringlane/v1/worker.grpc.pb.h"

namespace ringlane::v1 {
namespace {

RoundPlan MakePlan() {
  RoundPlan plan;
  plan.set_round_id(42);

  // A new lane's prefill chunk.
  LaneStep* prefill = plan.add_rows();
  prefill->set_lane_id(7);
  prefill->set_start_position(0);
  for (int t : {1, 400, 22, 9}) prefill->add_token_ids(t);
  prefill->add_block_ids(3);
  prefill->set_sample_last(true);
  prefill->set_choice_index(1);
  SamplingParams* sp = prefill->mutable_sampling();
  sp->set_temperature(0.7f);
  sp->set_top_k(40);
  sp->set_top_p(0.9f);
  sp->set_seed(1234567890123ull);
  sp->set_top_logprobs(2);

  // A speculative verify row of another lane.
  LaneStep* verify = plan.add_rows();
  verify->set_lane_id(8);
  verify->set_start_position(130);
  verify->set_use_last_sampled(true);
  for (int t : {5, 6, 7}) verify->add_token_ids(t);
  for (int b : {0, 1, 2}) verify->add_block_ids(b);
  for (int o : {0, 1, 2, 3}) verify->add_verify_offsets(o);
  verify->set_release_lane(true);
  return plan;
}

TEST(ProtoTest, RoundPlanRoundTrips) {
  const RoundPlan plan = MakePlan();
  std::string bytes;
  ASSERT_TRUE(plan.SerializeToString(&bytes));

  RoundPlan parsed;
  ASSERT_TRUE(parsed.ParseFromString(bytes));
  EXPECT_EQ(parsed.SerializeAsString(), bytes);
  EXPECT_EQ(parsed.round_id(), 42u);
  ASSERT_EQ(parsed.rows_size(), 2);

  const LaneStep& p = parsed.rows(0);
  EXPECT_EQ(p.lane_id(), 7u);
  ASSERT_EQ(p.token_ids_size(), 4);
  EXPECT_EQ(p.token_ids(1), 400);
  EXPECT_TRUE(p.sample_last());
  EXPECT_FALSE(p.use_last_sampled());
  ASSERT_TRUE(p.has_sampling());
  EXPECT_TRUE(p.sampling().has_temperature());
  EXPECT_FLOAT_EQ(p.sampling().temperature(), 0.7f);
  EXPECT_EQ(p.sampling().seed(), 1234567890123ull);
  EXPECT_EQ(p.choice_index(), 1);

  const LaneStep& v = parsed.rows(1);
  EXPECT_TRUE(v.use_last_sampled());
  EXPECT_FALSE(v.has_sampling());
  EXPECT_EQ(v.start_position(), 130);
  ASSERT_EQ(v.verify_offsets_size(), 4);
  EXPECT_EQ(v.verify_offsets(3), 3);
  EXPECT_TRUE(v.release_lane());
}

TEST(ProtoTest, OptionalSamplingFieldsDistinguishAbsentFromZero) {
  SamplingParams sp;
  EXPECT_FALSE(sp.has_temperature());
  EXPECT_FALSE(sp.has_seed());
  sp.set_temperature(0.0f);
  SamplingParams parsed;
  ASSERT_TRUE(parsed.ParseFromString(sp.SerializeAsString()));
  EXPECT_TRUE(parsed.has_temperature());
  EXPECT_FALSE(parsed.has_top_p());
}

TEST(ProtoTest, RoundResultAndKvChunkRoundTrip) {
  RoundResult result;
  result.set_round_id(3);
  LaneOutput* out = result.add_outputs();
  out->set_lane_id(8);
  out->set_accepted_draft_count(2);
  SampledToken* tok = out->add_tokens();
  tok->set_token_id(11);
  tok->set_logprob(-0.25f);
  TokenLogprob* alt = tok->add_top_logprobs();
  alt->set_token_id(12);
  alt->set_logprob(-1.5f);
  result.mutable_error()->set_code(3);
  result.set_compute_time_us(1500);

  RoundResult parsed;
  ASSERT_TRUE(parsed.ParseFromString(result.SerializeAsString()));
  ASSERT_EQ(parsed.outputs_size(), 1);
  EXPECT_EQ(parsed.outputs(0).tokens(0).top_logprobs(0).token_id(), 12);
  EXPECT_EQ(parsed.error().code(), 3);

  KvBlockChunk chunk;
  chunk.mutable_key()->set_model_id("stories260K");
  chunk.mutable_key()->set_prefix_hash(std::string(16, '\xab'));
  chunk.mutable_key()->set_kv_dtype(DTYPE_BF16);
  chunk.set_offset_bytes(1 << 20);
  chunk.set_total_bytes(3 << 20);
  chunk.set_data(std::string("\0\1\2", 3));
  chunk.set_payload_xxh64(0xfedcba9876543210ull);
  KvBlockChunk chunk2;
  ASSERT_TRUE(chunk2.ParseFromString(chunk.SerializeAsString()));
  EXPECT_EQ(chunk2.key().prefix_hash().size(), 16u);
  EXPECT_EQ(chunk2.data().size(), 3u);
  EXPECT_EQ(chunk2.payload_xxh64(), 0xfedcba9876543210ull);
}

TEST(ProtoTest, GenerateRequestPromptOneof) {
  GenerateRequest req;
  req.set_text("Once upon a time");
  EXPECT_EQ(req.prompt_case(), GenerateRequest::kText);
  req.mutable_token_ids()->add_ids(1);
  EXPECT_EQ(req.prompt_case(), GenerateRequest::kTokenIds);
  EXPECT_FALSE(req.has_max_tokens());

  GenerateResponse resp;
  resp.set_finish_reason(FINISH_REASON_LENGTH);
  resp.mutable_usage()->set_cached_tokens(64);
  GenerateResponse parsed;
  ASSERT_TRUE(parsed.ParseFromString(resp.SerializeAsString()));
  EXPECT_EQ(parsed.finish_reason(), FINISH_REASON_LENGTH);
  EXPECT_EQ(parsed.usage().cached_tokens(), 64);
}

TEST(ProtoTest, ServiceStubsExist) {
  static_assert(std::is_class_v<Worker::Stub>);
  static_assert(std::is_base_of_v<Worker::StubInterface, Worker::Stub>);
  static_assert(std::is_class_v<Worker::Service>);
  static_assert(std::is_class_v<KvStore::Stub>);
  static_assert(std::is_class_v<Generate::Stub>);
  // Creating a channel does not connect, so no server is needed.
  auto channel = grpc::CreateChannel("127.0.0.1:1", grpc::InsecureChannelCredentials());
  std::unique_ptr<Worker::Stub> stub = Worker::NewStub(channel);
  EXPECT_NE(stub, nullptr);
}

}  // namespace
}  // namespace ringlane::v1
