// The OpenAI wire format of the gateway: request bodies of /v1/completions
// and /v1/chat/completions turned into GenerateRequests (openai_request.h),
// the router's GenerateResponses turned into OpenAI responses and stream
// chunks (openai_response.h), and errors in OpenAI's shape
// (openai_errors.h). Pure functions and plain state, no I/O: the gateway
// (gateway.h) does the HTTP side. Include this header for all three.
#ifndef RINGLANE_ROUTER_API_OPENAI_API_H_
#define RINGLANE_ROUTER_API_OPENAI_API_H_

#include "router/api/openai_errors.h"
#include "router/api/openai_request.h"
#include "router/api/openai_response.h"

#endif  // RINGLANE_ROUTER_API_OPENAI_API_H_
