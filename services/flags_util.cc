#include "services/flags_util.h"

#include <cstdio>
#include <cstdlib>

#include "absl/strings/ascii.h"
#include "absl/strings/str_cat.h"

namespace ringlane::services {
namespace {

// Debian's Abseil is built with its own absl::string_view (not an alias of
// std::string_view), so views cross into absl::StrCat through this.
absl::string_view AbslView(std::string_view s) { return absl::string_view(s.data(), s.size()); }

constexpr int kMaxPort = 65535;

// Digits only: no sign, no spaces, at most 5 digits (so no overflow).
absl::StatusOr<int> ParsePort(std::string_view text, std::string_view whole) {
  if (text.empty()) {
    return absl::InvalidArgumentError(absl::StrCat("missing port in '", AbslView(whole), "'"));
  }
  if (text.size() > 5) {
    return absl::InvalidArgumentError(
        absl::StrCat("port '", AbslView(text), "' out of range 0..65535"));
  }
  int port = 0;
  for (char c : text) {
    if (!absl::ascii_isdigit(static_cast<unsigned char>(c))) {
      return absl::InvalidArgumentError(
          absl::StrCat("port '", AbslView(text), "' is not a number"));
    }
    port = port * 10 + (c - '0');
  }
  if (absl::Status s = ValidatePort(port); !s.ok()) return s;
  return port;
}

bool HasSpace(std::string_view s) {
  for (char c : s) {
    if (absl::ascii_isspace(static_cast<unsigned char>(c))) return true;
  }
  return false;
}

}  // namespace

absl::Status ValidatePort(int port) {
  if (port < 0 || port > kMaxPort) {
    return absl::InvalidArgumentError(
        absl::StrCat("port ", port, " out of range 0..65535 (0 picks a free port)"));
  }
  return absl::OkStatus();
}

absl::StatusOr<std::pair<std::string, int>> ParseHostPort(std::string_view host_port) {
  if (host_port.empty()) {
    return absl::InvalidArgumentError("empty address; want host:port");
  }
  if (HasSpace(host_port)) {
    return absl::InvalidArgumentError(
        absl::StrCat("address '", AbslView(host_port), "' contains spaces"));
  }
  std::string_view host;
  std::string_view port;
  if (host_port.front() == '[') {
    const size_t close = host_port.find(']');
    if (close == std::string_view::npos) {
      return absl::InvalidArgumentError(
          absl::StrCat("unclosed '[' in '", AbslView(host_port), "'"));
    }
    host = host_port.substr(1, close - 1);
    std::string_view rest = host_port.substr(close + 1);
    if (rest.empty() || rest.front() != ':') {
      return absl::InvalidArgumentError(
          absl::StrCat("want [ipv6]:port, got '", AbslView(host_port), "'"));
    }
    port = rest.substr(1);
    if (host.find(':') == std::string_view::npos) {
      return absl::InvalidArgumentError(
          absl::StrCat("brackets are for IPv6 addresses, got '", AbslView(host_port), "'"));
    }
  } else {
    const size_t colon = host_port.rfind(':');
    if (colon == std::string_view::npos) {
      return absl::InvalidArgumentError(
          absl::StrCat("missing port in '", AbslView(host_port), "'; want host:port"));
    }
    host = host_port.substr(0, colon);
    port = host_port.substr(colon + 1);
    if (host.find(':') != std::string_view::npos) {
      return absl::InvalidArgumentError(absl::StrCat("IPv6 address needs brackets: '[",
                                                     AbslView(host), "]:", AbslView(port), "'"));
    }
  }
  if (host.empty()) {
    return absl::InvalidArgumentError(absl::StrCat("missing host in '", AbslView(host_port), "'"));
  }
  absl::StatusOr<int> parsed_port = ParsePort(port, host_port);
  if (!parsed_port.ok()) return parsed_port.status();
  return std::make_pair(std::string(host), *parsed_port);
}

std::string JoinHostPort(std::string_view host, int port) {
  if (host.find(':') != std::string_view::npos)
    return absl::StrCat("[", AbslView(host), "]:", port);
  return absl::StrCat(AbslView(host), ":", port);
}

void ExitWithUsageError(std::string_view msg) {
  std::fprintf(stderr, "error: %.*s\n", static_cast<int>(msg.size()), msg.data());
  std::fflush(stderr);
  std::exit(2);
}

}  // namespace ringlane::services
