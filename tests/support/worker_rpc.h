// Driving worker daemons directly, the way the router and the kvstore do:
// a group client over a WorkerGroup's ranks, one-row round plans, the
// golden cases as driver lanes, and the KV block export/import streams.
// Free functions; safe to call from several threads on different stubs.
#ifndef RINGLANE_TESTS_SUPPORT_WORKER_RPC_H_
#define RINGLANE_TESTS_SUPPORT_WORKER_RPC_H_

#include <grpcpp/grpcpp.h>

#include <chrono>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "ringlane/v1/worker.grpc.pb.h"
#include "router/client/worker_group.h"
#include "tests/support/cluster.h"
#include "tests/support/group_driver.h"

namespace ringlane::testing {

// `world` ranks of the bundled model on free ports, each with `flags` and
// logging at info (tests read the logs). A rank that does not start is a
// failed expectation; started() says how many did.
WorkerGroup StartGroup(int world, std::vector<std::string> flags = {});

// A group client over `g`'s ranks; null, after a failed expectation, when it
// does not connect within `timeout`.
std::unique_ptr<router::WorkerGroupClient> ConnectGroup(
    const WorkerGroup& g, std::chrono::milliseconds timeout = std::chrono::seconds(30));

std::unique_ptr<v1::Worker::Stub> WorkerStub(
    const std::string& address,
    std::shared_ptr<grpc::ChannelCredentials> creds = grpc::InsecureChannelCredentials());

// A round of one row: lane `lane` fed `tokens` from position `start` over
// `blocks`, sampling its last position greedily.
v1::RoundPlan OneRowPlan(uint64_t lane, int64_t start, const std::vector<int32_t>& tokens,
                         const std::vector<int32_t>& blocks);

// The golden cases as driver lanes, lane i arriving in round stagger * i;
// `max_tokens` > 0 stops them
// early (their output is then a prefix of the golden ids).
std::vector<DriverLane> GoldenLanes(int stagger, int max_tokens = 0);

// An export request of `blocks`, block i under the prefix hash of 16 bytes
// of 'a' + i.
v1::ExportKvBlocksRequest ExportRequest(const std::vector<int32_t>& blocks);

// Reads the chunks ExportKvBlocks sends for `req` into `out`.
grpc::Status ExportKv(v1::Worker::Stub& stub, const v1::ExportKvBlocksRequest& req,
                      std::vector<v1::KvBlockChunk>* out,
                      std::chrono::seconds deadline = std::chrono::seconds(30));
// Writes `chunks` to ImportKvBlocks.
grpc::Status ImportKv(v1::Worker::Stub& stub, const std::vector<v1::KvBlockChunk>& chunks,
                      v1::ImportKvBlocksResponse* resp,
                      std::chrono::seconds deadline = std::chrono::seconds(30));

}  // namespace ringlane::testing

#endif  // RINGLANE_TESTS_SUPPORT_WORKER_RPC_H_
