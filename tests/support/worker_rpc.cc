#include "tests/support/worker_rpc.h"

#include <algorithm>

#include "gtest/gtest.h"
#include "tests/support/lane_runner.h"

namespace ringlane::testing {

WorkerGroup StartGroup(int world, std::vector<std::string> flags) {
  flags.insert(flags.begin(), "--log_level=info");
  WorkerGroup g(world, std::move(flags));
  g.Start();
  return g;
}

std::unique_ptr<router::WorkerGroupClient> ConnectGroup(const WorkerGroup& g,
                                                        std::chrono::milliseconds timeout) {
  auto c = router::WorkerGroupClient::Connect(g.Addresses(), timeout);
  EXPECT_TRUE(c.ok()) << c.status();
  return c.ok() ? std::move(*c) : nullptr;
}

std::unique_ptr<v1::Worker::Stub> WorkerStub(const std::string& address,
                                             std::shared_ptr<grpc::ChannelCredentials> creds) {
  return v1::Worker::NewStub(grpc::CreateChannel(address, std::move(creds)));
}

v1::RoundPlan OneRowPlan(uint64_t lane, int64_t start, const std::vector<int32_t>& tokens,
                         const std::vector<int32_t>& blocks) {
  v1::RoundPlan p;
  v1::LaneStep* r = p.add_rows();
  r->set_lane_id(lane);
  r->set_start_position(start);
  r->mutable_token_ids()->Add(tokens.begin(), tokens.end());
  r->mutable_block_ids()->Add(blocks.begin(), blocks.end());
  r->set_sample_last(true);
  *r->mutable_sampling() = Greedy();
  return p;
}

std::vector<DriverLane> GoldenLanes(int stagger, int max_tokens) {
  std::vector<DriverLane> lanes;
  int i = 0;
  for (const GoldenCase& g : GoldenCases()) {
    DriverLane l;
    l.prompt = g.prompt;
    l.max_tokens = static_cast<int>(g.ids.size());
    if (max_tokens > 0) l.max_tokens = std::min(l.max_tokens, max_tokens);
    l.sampling = Greedy();
    l.arrival_round = stagger * i;
    lanes.push_back(l);
    ++i;
  }
  return lanes;
}

v1::ExportKvBlocksRequest ExportRequest(const std::vector<int32_t>& blocks) {
  v1::ExportKvBlocksRequest req;
  for (size_t i = 0; i < blocks.size(); ++i) {
    req.add_block_ids(blocks[i]);
    req.add_prefix_hashes(std::string(16, static_cast<char>('a' + i)));
  }
  return req;
}

grpc::Status ExportKv(v1::Worker::Stub& stub, const v1::ExportKvBlocksRequest& req,
                      std::vector<v1::KvBlockChunk>* out, std::chrono::seconds deadline) {
  grpc::ClientContext ctx;
  ctx.set_deadline(std::chrono::system_clock::now() + deadline);
  auto rd = stub.ExportKvBlocks(&ctx, req);
  v1::KvBlockChunk ch;
  while (rd->Read(&ch)) out->push_back(ch);
  return rd->Finish();
}

grpc::Status ImportKv(v1::Worker::Stub& stub, const std::vector<v1::KvBlockChunk>& chunks,
                      v1::ImportKvBlocksResponse* resp, std::chrono::seconds deadline) {
  grpc::ClientContext ctx;
  ctx.set_deadline(std::chrono::system_clock::now() + deadline);
  auto w = stub.ImportKvBlocks(&ctx, resp);
  // A refused stream stops taking writes; Finish says why.
  for (const v1::KvBlockChunk& c : chunks) w->Write(c);
  w->WritesDone();
  return w->Finish();
}

}  // namespace ringlane::testing
