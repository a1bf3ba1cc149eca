#include "router/api/http_server.h"

#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <sys/eventfd.h>
#include <sys/socket.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <cstdint>
#include <cstring>
#include <exception>
#include <thread>

#include "absl/base/thread_annotations.h"
#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "router/api/http_connection.h"
#include "router/api/http_socket.h"
#include "services/flags_util.h"
#include "services/log.h"

namespace ringlane::router {
namespace {

using http_internal::Connection;
using http_internal::ConnectionEnv;
using http_internal::DefaultErrorBody;
using http_internal::PeerIp;

// Connections being answered 503 at once; beyond that they are just closed.
constexpr int kMaxRejecting = 64;

}  // namespace

std::string HttpRequest::Header(std::string_view name) const {
  auto it = headers.find(std::string(name));
  return it == headers.end() ? std::string() : it->second;
}

// Threads: Start's caller; one accept thread (AcceptLoop) that registers
// connections and joins finished connection threads; one thread per
// connection; Shutdown's caller. Only `mu` guards shared state.
struct HttpServer::Impl {
  struct Conn {
    // Closed by EndConnection under mu, so Shutdown can shut it down under
    // mu without racing a close (and hitting a reused fd number).
    int fd = -1;
    bool rejecting = false;
    std::string peer_ip;  // counted in per_peer while not rejecting
    // Waiting for the first byte of a request (set by its thread).
    std::atomic<bool> idle{true};
    // Shut down to make room; no longer counted in active or per_peer.
    bool evicted = false;
    std::thread thread;
  };

  Impl(HttpServerOptions options_in, HttpHandler handler_in)
      : options(std::move(options_in)), handler(std::move(handler_in)) {
    env.options = &options;
    env.handler = &handler;
    env.shutting_down = [this] {
      absl::MutexLock lock(&mu);
      return shutting_down;
    };
  }

  ~Impl() {
    if (listen_fd >= 0) ::close(listen_fd);
    if (wake_fd >= 0) ::close(wake_fd);
  }

  void AcceptLoop();
  void RunConnection(uint64_t id, int fd, bool rejecting, std::atomic<bool>* idle);
  // Under pressure: shuts down the oldest connection waiting for a request
  // (of `ip` only, when not empty) and stops counting it. False when every
  // connection is busy.
  bool EvictIdle(const std::string& ip) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu);
  void EndConnection(uint64_t id) ABSL_LOCKS_EXCLUDED(mu);
  bool NoConnections() const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu) { return conns.empty(); }
  std::vector<std::thread> TakeFinished() ABSL_LOCKS_EXCLUDED(mu) {
    absl::MutexLock lock(&mu);
    std::vector<std::thread> out;
    out.swap(finished);
    return out;
  }

  // Fixed after Start.
  const HttpServerOptions options;
  const HttpHandler handler;
  ConnectionEnv env;
  int listen_fd = -1;
  int wake_fd = -1;
  int port = 0;
  std::thread accept_thread;

  mutable absl::Mutex mu;
  bool shutting_down ABSL_GUARDED_BY(mu) = false;
  bool shutdown_done ABSL_GUARDED_BY(mu) = false;
  uint64_t next_id ABSL_GUARDED_BY(mu) = 0;
  std::map<uint64_t, std::unique_ptr<Conn>> conns ABSL_GUARDED_BY(mu);
  // Connections being served (not the ones being answered 503).
  int active ABSL_GUARDED_BY(mu) = 0;
  int rejecting ABSL_GUARDED_BY(mu) = 0;
  // Connections being served, by client IP.
  std::map<std::string, int> per_peer ABSL_GUARDED_BY(mu);
  // Threads of ended connections, joined by the accept loop or Shutdown.
  std::vector<std::thread> finished ABSL_GUARDED_BY(mu);
};

void HttpServer::Impl::AcceptLoop() {
  for (;;) {
    for (std::thread& t : TakeFinished()) t.join();
    pollfd fds[2] = {{listen_fd, POLLIN, 0}, {wake_fd, POLLIN, 0}};
    const int ready = ::poll(fds, 2, -1);
    if (ready < 0 && errno == EINTR) continue;
    if (fds[1].revents != 0) return;
    sockaddr_storage addr{};
    socklen_t addr_len = sizeof(addr);
    const int fd =
        ::accept4(listen_fd, reinterpret_cast<sockaddr*>(&addr), &addr_len, SOCK_CLOEXEC);
    if (fd < 0) {
      if (errno == EMFILE || errno == ENFILE || errno == ENOBUFS || errno == ENOMEM) {
        RL_LOG(WARNING) << "http accept: " << std::strerror(errno);
        // The pending connection stays readable; do not spin on it.
        std::this_thread::sleep_for(std::chrono::milliseconds(50));
      }
      continue;
    }
    const int one = 1;
    ::setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));

    absl::MutexLock lock(&mu);
    if (shutting_down) {
      ::close(fd);
      return;
    }
    std::string ip = PeerIp(addr);
    auto peer_count = per_peer.find(ip);
    const bool peer_full = options.max_connections_per_peer > 0 && peer_count != per_peer.end() &&
                           peer_count->second >= options.max_connections_per_peer;
    // A flood of connections that never speak must not lock out clients
    // and probes: the oldest connection waiting for a request makes room
    // (of this peer when it is the peer's share that is full). Only when
    // every connection is busy is the new one answered 503.
    bool reject = false;
    if (peer_full) {
      reject = !EvictIdle(ip);
    } else if (active >= options.max_connections) {
      reject = !EvictIdle("");
    }
    if (reject && rejecting >= kMaxRejecting) {
      ::close(fd);
      continue;
    }
    ++(reject ? rejecting : active);
    if (!reject) ++per_peer[ip];
    const uint64_t id = next_id++;
    auto conn = std::make_unique<Conn>();
    conn->fd = fd;
    conn->rejecting = reject;
    conn->peer_ip = std::move(ip);
    // Started under mu: the thread's EndConnection needs mu, so `thread` is
    // assigned before the thread can move it to `finished`.
    std::atomic<bool>* idle = &conn->idle;
    conn->thread =
        std::thread([this, id, fd, reject, idle] { RunConnection(id, fd, reject, idle); });
    conns.emplace(id, std::move(conn));
  }
}

bool HttpServer::Impl::EvictIdle(const std::string& ip) {
  for (auto& [id, conn] : conns) {  // oldest first
    if (conn->rejecting || conn->evicted || !conn->idle.load()) continue;
    if (!ip.empty() && conn->peer_ip != ip) continue;
    // Its thread sees EOF and ends; the fd is closed there, as always.
    ::shutdown(conn->fd, SHUT_RDWR);
    conn->evicted = true;
    --active;
    auto peer = per_peer.find(conn->peer_ip);
    if (peer != per_peer.end() && --peer->second <= 0) per_peer.erase(peer);
    return true;
  }
  return false;
}

void HttpServer::Impl::RunConnection(uint64_t id, int fd, bool rejecting, std::atomic<bool>* idle) {
  // An exception escaping a thread ends the process; one from Beast or the
  // allocator ends only this connection.
  try {
    Connection connection(fd, env, rejecting ? nullptr : idle);
    if (rejecting) {
      connection.Reject();
    } else {
      connection.Serve();
    }
  } catch (const std::exception& e) {
    RL_LOG(ERROR) << "http connection failed: " << e.what();
  }
  EndConnection(id);
}

void HttpServer::Impl::EndConnection(uint64_t id) {
  absl::MutexLock lock(&mu);
  auto it = conns.find(id);
  Conn& conn = *it->second;
  ::close(conn.fd);
  if (conn.rejecting) {
    --rejecting;
  } else if (!conn.evicted) {
    --active;
    auto peer = per_peer.find(conn.peer_ip);
    if (peer != per_peer.end() && --peer->second <= 0) per_peer.erase(peer);
  }
  finished.push_back(std::move(conn.thread));
  conns.erase(it);
}

HttpServer::HttpServer(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}

HttpServer::~HttpServer() { Shutdown(absl::Now()); }

absl::StatusOr<std::unique_ptr<HttpServer>> HttpServer::Start(HttpServerOptions options,
                                                              HttpHandler handler) {
  absl::StatusOr<std::pair<std::string, int>> host_port = services::ParseHostPort(options.listen);
  if (!host_port.ok()) {
    return absl::InvalidArgumentError(
        absl::StrCat("listen address: ", host_port.status().message()));
  }
  if (options.max_connections < 1) {
    return absl::InvalidArgumentError("max_connections must be at least 1");
  }
  if (options.idle_timeout <= std::chrono::milliseconds::zero()) {
    return absl::InvalidArgumentError("idle_timeout must be positive");
  }
  if (options.first_byte_timeout <= std::chrono::milliseconds::zero()) {
    return absl::InvalidArgumentError("first_byte_timeout must be positive");
  }
  if (options.max_connections_per_peer < 0) {
    return absl::InvalidArgumentError("max_connections_per_peer must be >= 0");
  }
  if (!handler) return absl::InvalidArgumentError("no handler");
  if (!options.error_body) options.error_body = DefaultErrorBody;
  auto impl = std::make_unique<Impl>(std::move(options), std::move(handler));

  addrinfo hints{};
  hints.ai_family = AF_UNSPEC;
  hints.ai_socktype = SOCK_STREAM;
  hints.ai_flags = AI_PASSIVE | AI_NUMERICSERV;
  addrinfo* addrs = nullptr;
  const std::string port_text = std::to_string(host_port->second);
  if (int rc = ::getaddrinfo(host_port->first.c_str(), port_text.c_str(), &hints, &addrs);
      rc != 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("listen address '", impl->options.listen, "': ", ::gai_strerror(rc)));
  }
  std::string bind_error = "no address";
  for (addrinfo* a = addrs; a != nullptr; a = a->ai_next) {
    const int fd =
        ::socket(a->ai_family, a->ai_socktype | SOCK_CLOEXEC | SOCK_NONBLOCK, a->ai_protocol);
    if (fd < 0) {
      bind_error = std::strerror(errno);
      continue;
    }
    const int one = 1;
    ::setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof(one));
    if (::bind(fd, a->ai_addr, a->ai_addrlen) != 0 || ::listen(fd, SOMAXCONN) != 0) {
      bind_error = std::strerror(errno);
      ::close(fd);
      continue;
    }
    impl->listen_fd = fd;
    break;
  }
  ::freeaddrinfo(addrs);
  if (impl->listen_fd < 0) {
    return absl::UnavailableError(
        absl::StrCat("cannot listen on ", impl->options.listen, ": ", bind_error));
  }
  sockaddr_storage bound{};
  socklen_t bound_len = sizeof(bound);
  ::getsockname(impl->listen_fd, reinterpret_cast<sockaddr*>(&bound), &bound_len);
  impl->port =
      ntohs(bound.ss_family == AF_INET6 ? reinterpret_cast<const sockaddr_in6*>(&bound)->sin6_port
                                        : reinterpret_cast<const sockaddr_in*>(&bound)->sin_port);

  impl->wake_fd = ::eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK);
  if (impl->wake_fd < 0) {
    return absl::UnavailableError(absl::StrCat("eventfd: ", std::strerror(errno)));
  }
  impl->env.wake_fd = impl->wake_fd;
  Impl* raw = impl.get();
  impl->accept_thread = std::thread([raw] { raw->AcceptLoop(); });
  return std::unique_ptr<HttpServer>(new HttpServer(std::move(impl)));
}

int HttpServer::port() const { return impl_->port; }

int HttpServer::active_connections() const {
  absl::MutexLock lock(&impl_->mu);
  return impl_->active;
}

void HttpServer::Shutdown(absl::Time deadline) {
  Impl& impl = *impl_;
  {
    absl::MutexLock lock(&impl.mu);
    if (impl.shutting_down) {
      // Another caller is (or was) shutting down; return when it is done.
      impl.mu.Await(absl::Condition(&impl.shutdown_done));
      return;
    }
    impl.shutting_down = true;
  }
  // The eventfd stays readable, waking the accept loop and every connection
  // waiting for its next request, now and later.
  const uint64_t one = 1;
  if (::write(impl.wake_fd, &one, sizeof(one)) != sizeof(one)) {
    RL_LOG(ERROR) << "http shutdown: eventfd write: " << std::strerror(errno);
  }
  impl.accept_thread.join();
  ::close(impl.listen_fd);
  impl.listen_fd = -1;

  std::vector<std::thread> threads;
  {
    absl::MutexLock lock(&impl.mu);
    const absl::Condition drained(&impl, &Impl::NoConnections);
    if (!impl.mu.AwaitWithDeadline(drained, deadline)) {
      // Exchanges still running past the deadline: fail their reads and
      // writes so their handlers see the client as gone.
      for (auto& [id, conn] : impl.conns) ::shutdown(conn->fd, SHUT_RDWR);
      impl.mu.Await(drained);
    }
    threads.swap(impl.finished);
  }
  for (std::thread& t : threads) t.join();
  absl::MutexLock lock(&impl.mu);
  impl.shutdown_done = true;
}

}  // namespace ringlane::router
