#include "tests/support/http_probe.h"

#include <dirent.h>
#include <netinet/in.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <fstream>
#include <string_view>
#include <thread>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "gtest/gtest.h"
#include "services/flags_util.h"

namespace ringlane::testing {

using services::HttpClient;
using services::HttpRequestSpec;
using services::HttpResponse;

namespace {

absl::StatusOr<std::unique_ptr<HttpClient>> Dial(const std::string& address) {
  absl::StatusOr<std::pair<std::string, int>> hp = services::ParseHostPort(address);
  if (!hp.ok()) return hp.status();
  return HttpClient::Connect(hp->first, hp->second, absl::Seconds(5));
}

HttpRequestSpec PostSpec(const std::string& path, const std::string& body, Headers headers = {}) {
  HttpRequestSpec spec;
  spec.method = "POST";
  spec.target = path;
  spec.body = body;
  spec.headers = std::move(headers);
  return spec;
}

}  // namespace

std::unique_ptr<HttpClient> Connect(const std::string& address) {
  auto c = Dial(address);
  EXPECT_TRUE(c.ok()) << address << ": " << c.status();
  return c.ok() ? std::move(*c) : nullptr;
}

HttpResponse Post(HttpClient& c, const std::string& path, const std::string& body, Headers headers,
                  absl::Duration timeout) {
  auto r = c.Send(PostSpec(path, body, std::move(headers)), timeout);
  EXPECT_TRUE(r.ok()) << r.status();
  return r.ok() ? *r : HttpResponse{};
}

HttpResponse Get(HttpClient& c, const std::string& path, Headers headers, absl::Duration timeout) {
  HttpRequestSpec spec;
  spec.target = path;
  spec.headers = std::move(headers);
  auto r = c.Send(spec, timeout);
  EXPECT_TRUE(r.ok()) << r.status();
  return r.ok() ? *r : HttpResponse{};
}

absl::StatusOr<HttpResponse> GetOnce(const std::string& address, const std::string& path,
                                     absl::Duration timeout) {
  auto c = Dial(address);
  if (!c.ok()) return absl::UnavailableError(absl::StrCat("no connection: ", c.status().message()));
  return (*c)->Send({.target = path}, timeout);
}

absl::StatusOr<HttpResponse> PostOnce(const std::string& address, const std::string& path,
                                      const std::string& body, absl::Duration timeout) {
  auto c = Dial(address);
  if (!c.ok()) return absl::UnavailableError(absl::StrCat("no connection: ", c.status().message()));
  return (*c)->Send(PostSpec(path, body), timeout);
}

bool WaitForHttpStatus(const std::string& address, const std::string& path, int status,
                       std::chrono::milliseconds timeout) {
  return WaitFor(
      [&] {
        auto r = GetOnce(address, path, absl::Seconds(2));
        return r.ok() && r->status == status;
      },
      timeout, std::chrono::milliseconds(25));
}

bool WaitFor(const std::function<bool()>& done, std::chrono::milliseconds timeout,
             std::chrono::milliseconds interval) {
  const auto end = std::chrono::steady_clock::now() + timeout;
  for (;;) {
    if (done()) return true;
    if (std::chrono::steady_clock::now() >= end) return false;
    std::this_thread::sleep_for(interval);
  }
}

nlohmann::json Json(const HttpResponse& r) {
  nlohmann::json j = nlohmann::json::parse(r.body, nullptr, false);
  EXPECT_FALSE(j.is_discarded()) << r.body;
  return j;
}

nlohmann::json GoldenEchoBody(const GoldenCase& g) {
  return {{"model", "stories260K"},
          {"prompt", g.prompt_text},
          {"max_tokens", g.ids.size()},
          {"temperature", 0},
          {"echo", true}};
}

SseStream PostSse(HttpClient& c, const std::string& path, const std::string& body,
                  const std::function<void()>& on_first, absl::Duration timeout) {
  SseStream s;
  services::SseParser sse;
  bool first = true;
  auto r = c.Stream(
      PostSpec(path, body),
      [&](std::string_view data) {
        if (first) {
          first = false;
          s.first = std::chrono::steady_clock::now();
          if (on_first) on_first();
        }
        sse.Feed(data, [&](std::string_view ev) {
          if (ev == "[DONE]") {
            s.done = true;
            return;
          }
          nlohmann::json j = nlohmann::json::parse(ev, nullptr, false);
          if (j.is_discarded()) {
            ++s.malformed;
          } else {
            s.events.push_back(std::move(j));
          }
        });
        return true;
      },
      timeout);
  s.end = std::chrono::steady_clock::now();
  s.transport = r.status();
  if (r.ok()) s.status = r->status;
  return s;
}

void HoldStream(const std::string& address, std::atomic<int>* started,
                const std::atomic<bool>* release) {
  auto client = Connect(address);
  if (!client) {
    ++*started;  // the failed expectation says why; waiters go on
    return;
  }
  nlohmann::json body = {{"model", "stories260K"}, {"prompt", "Lily"},       {"max_tokens", 450},
                         {"ignore_eos", true},     {"loop_watchdog", false}, {"stream", true}};
  bool counted = false;
  (void)client->Stream(
      PostSpec("/v1/completions", body.dump()),
      [&](std::string_view) {
        if (!counted) {
          counted = true;
          ++*started;
        }
        return !release->load();
      },
      absl::Seconds(60));
}

double Metric(const std::string& text, const std::string& name, const std::string& labels) {
  double sum = 0;
  for (absl::string_view line : absl::StrSplit(text, '\n')) {
    if (line.empty() || line[0] == '#') continue;
    const std::string l(line);
    if (l.rfind(name, 0) != 0) continue;
    // `name` must be the whole name, not the prefix of a longer one.
    const char next = l.size() > name.size() ? l[name.size()] : '\0';
    if (next != '{' && next != ' ') continue;
    if (!labels.empty() && l.find(labels) == std::string::npos) continue;
    sum += std::stod(l.substr(l.rfind(' ') + 1));
  }
  return sum;
}

double RssMiB(pid_t pid) {
  std::ifstream in(absl::StrCat("/proc/", pid, "/status"));
  std::string line;
  while (std::getline(in, line)) {
    if (line.rfind("VmRSS:", 0) == 0) return std::stod(line.substr(6)) / 1024.0;
  }
  return -1;
}

int OpenFds(pid_t pid) {
  DIR* d = opendir(absl::StrCat("/proc/", pid, "/fd").c_str());
  if (d == nullptr) return -1;
  int n = 0;
  while (const dirent* e = readdir(d)) {
    if (e->d_name[0] != '.') ++n;
  }
  closedir(d);
  return n;
}

int ConnectLoopback(int port) {
  const int fd = ::socket(AF_INET, SOCK_STREAM, 0);
  if (fd < 0) return -1;
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  addr.sin_port = htons(static_cast<uint16_t>(port));
  if (::connect(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) != 0) {
    ::close(fd);
    return -1;
  }
  return fd;
}

std::string RawExchange(int port, const std::string& bytes, std::chrono::milliseconds quiet) {
  const int fd = ConnectLoopback(port);
  EXPECT_GE(fd, 0);
  if (fd < 0) return "";
  std::string_view left = bytes;
  while (!left.empty()) {
    // The server may stop reading (and answer) long before the end.
    const ssize_t n = ::send(fd, left.data(), left.size(), MSG_NOSIGNAL);
    if (n <= 0) break;
    left.remove_prefix(static_cast<size_t>(n));
  }
  std::string text;
  char buf[4096];
  for (;;) {
    pollfd p{fd, POLLIN, 0};
    if (::poll(&p, 1, static_cast<int>(quiet.count())) <= 0) break;
    const ssize_t n = ::recv(fd, buf, sizeof(buf), 0);
    if (n <= 0) break;
    text.append(buf, static_cast<size_t>(n));
  }
  ::close(fd);
  return text;
}

std::string StatusLine(const std::string& response) {
  return response.substr(0, response.find('\r'));
}

}  // namespace ringlane::testing
