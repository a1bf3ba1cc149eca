// The scheduler's state of one worker group: lanes running on it, choices
// waiting for a lane, lanes whose worker state a release row must still drop.
// Owned by the group's loop and touched only under its mutex; the planner
// and the applier take it by reference.
//
// A request (RequestState) has n choices; a choice runs as a lane. A choice
// outlives its lanes: preemption releases a lane and later starts a new one
// over the prompt plus the tokens generated so far, which (sampling being
// keyed by absolute position) continues the same text.
#ifndef RINGLANE_ROUTER_SCHED_LANE_H_
#define RINGLANE_ROUTER_SCHED_LANE_H_

#include <cstdint>
#include <deque>
#include <memory>
#include <vector>

#include "router/kv/kv_block_manager.h"
#include "router/request/request_state.h"

namespace ringlane::router {

struct Waiting {
  std::shared_ptr<RequestState> req;
  int choice = 0;
  // The kvstore tier (kv_tiering.h) asked its store for this choice's
  // uncached prompt blocks once; while `restoring`, they are being brought
  // back and the planner admits the choices behind it instead.
  bool kv_probed = false;
  bool restoring = false;
};

struct Lane {
  LaneId id = 0;
  std::shared_ptr<RequestState> req;
  int choice = 0;
  uint64_t admit_seq = 0;
  // The prompt this lane prefills (the request's prompt plus what the choice
  // generated before a preemption), then every token sampled since: seq[p]
  // is the input at position p.
  std::vector<int32_t> seq;
  int64_t prompt_len = 0;
  // Positions whose KV the planned rounds write. A verify row advances it by
  // all its positions when planned; its result moves it back to the
  // positions actually accepted.
  int64_t fed = 0;
  int64_t committed_blocks = 0;
  bool params_sent = false;
  bool in_plan = false;  // has a row in the plan being built
  bool gone = false;     // released; removed from the lane list at the next compaction
  // Rows of this lane in rounds sent and not yet applied, and how many of
  // them are void: planned behind a verify row assuming its drafts accepted
  // (LaneStep.assume_accepted), they were voided when it rejected one.
  int rows_in_flight = 0;
  int void_rows = 0;
  // Rows in flight with drafts and not void: a row planned behind one of
  // them assumes its drafts accepted.
  int verify_rows_in_flight = 0;
  // The drafts of the lane's newest row in flight, which a row pipelined
  // behind it assumes accepted.
  std::vector<int32_t> flight_drafts;

  int live_rows_in_flight() const { return rows_in_flight - void_rows; }

  // Tokens the choice had when this lane started (after a preemption, part
  // of the lane's prompt).
  int64_t generated_before() const {
    return prompt_len - static_cast<int64_t>(req->p.prompt.size());
  }
  bool prefilling() const { return fed < prompt_len; }
};

struct SchedState {
  std::deque<Waiting> waiting;
  std::vector<std::unique_ptr<Lane>> lanes;  // admission order
  // Lanes finished by the last result whose worker state a release row drops.
  std::vector<LaneId> pending_release;
  uint64_t next_lane_id = 1;
  uint64_t next_admit_seq = 1;
  uint64_t round_id = 0;

  int64_t live_lanes() const;
  // Drops lanes marked gone.
  void Compact();
  // The lane with `id` that is not gone, or null.
  Lane* Find(LaneId id);
};

}  // namespace ringlane::router

#endif  // RINGLANE_ROUTER_SCHED_LANE_H_
