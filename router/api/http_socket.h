// Socket helpers of the gateway's HTTP server (http_server.h): non-blocking
// probes of a connection's state, sends bounded by a stall timeout, and peer
// addresses. Free functions over plain fds; thread-safe.
#ifndef RINGLANE_ROUTER_API_HTTP_SOCKET_H_
#define RINGLANE_ROUTER_API_HTTP_SOCKET_H_

#include <sys/socket.h>

#include <chrono>
#include <string>
#include <string_view>

namespace ringlane::router::http_internal {

using Clock = std::chrono::steady_clock;

// Milliseconds from now to `deadline` for poll(), 0 when it has passed.
int MillisUntil(Clock::time_point deadline);

// Sends all of `data`. Fails when the peer is gone, or when the socket
// accepts nothing for `stall_timeout` (a client that stopped reading).
bool SendAll(int fd, std::string_view data, std::chrono::milliseconds stall_timeout);

// Non-blocking: true when the peer closed or reset the connection. Bytes
// waiting to be read (a pipelined request) do not count.
bool PeerGone(int fd);

// Non-blocking: true when bytes are waiting to be read.
bool BytesPending(int fd);

// The peer of `fd` as "ip:port", and whether it is a loopback address;
// both left unchanged when the socket has no peer.
void PeerAddress(int fd, std::string& peer, bool& loopback);

// The client's IP as text (no port), the key of the per-peer limit.
std::string PeerIp(const sockaddr_storage& addr);

}  // namespace ringlane::router::http_internal

#endif  // RINGLANE_ROUTER_API_HTTP_SOCKET_H_
