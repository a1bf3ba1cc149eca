// What a sampled token does to its choice: detokenized (UTF-8 safe), checked
// against stop ids and stop strings (held back across token boundaries), fed
// to the loop watchdog, its logprobs attached, and turned into the message
// the client receives, with the finish reason and usage when it ends the
// choice. Runs on a group's thread under its mutex; no I/O beyond pushing
// onto the request's ResponseQueue.
#ifndef RINGLANE_ROUTER_REQUEST_CHOICE_OUTPUT_H_
#define RINGLANE_ROUTER_REQUEST_CHOICE_OUTPUT_H_

#include "ringlane/v1/worker.pb.h"
#include "router/request/request_state.h"
#include "router/tokenizer/tokenizer.h"

namespace ringlane::router {

// Records the arrival of `count` tokens of `choice` at `now` in the latency
// series (tokens of one round share the gap since the previous token).
void NoteTokenTimes(RequestState& req, int choice, int count, Clock::time_point now);

// Applies one sampled token to choice `choice` of `req`. True when the
// choice finished with it (its lane is no longer needed). A finished choice
// or a dead request ignores the token.
bool OnSampledToken(RequestState& req, int choice, const ringlane::v1::SampledToken& t,
                    const Tokenizer& tokenizer);

}  // namespace ringlane::router

#endif  // RINGLANE_ROUTER_REQUEST_CHOICE_OUTPUT_H_
