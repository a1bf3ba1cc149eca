// RDMA verbs (rdma-core) for the kvstore's transport: which devices exist,
// how a --rdma mode and a device flag resolve against them, the address of a
// reliable-connected (RC) queue pair as KvStore.AttachRdma carries it, and
// one small endpoint type both ends use (a queue pair, its completion queue
// and one registered buffer).
//
// Built always: without rdma-core (RINGLANE_HAVE_IBVERBS unset) everything
// here compiles, RdmaDeviceNames() is empty and RdmaDevice::Open says
// FailedPrecondition, so callers fall back to shared memory or gRPC.
//
// The verbs calls are kept inside rdma.cc; this header names no ibverbs
// type, so files that include it need no rdma-core headers.
#ifndef RINGLANE_SERVICES_RDMA_H_
#define RINGLANE_SERVICES_RDMA_H_

#include <array>
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "ringlane/v1/kvstore.pb.h"

namespace ringlane::services {

// --rdma / --kvstore_rdma: never, where a device exists, or required (no
// device is an error at start-up, as the collectives' forced "ibverbs").
enum class RdmaMode { kOff, kAuto, kOn };
absl::StatusOr<RdmaMode> ParseRdmaMode(std::string_view s);
const char* RdmaModeName(RdmaMode mode);

// Which device, HCA port and GID index to use: "NAME[:PORT[:GID_INDEX]]",
// e.g. "mlx5_0:1:3"; an empty name means the first device (by name), port 1,
// GID index 0. RoCE v2 usually needs a GID index other than 0 (see
// `show_gids`).
struct RdmaDeviceSpec {
  std::string name;
  int port = 1;
  int gid_index = 0;
};
absl::StatusOr<RdmaDeviceSpec> ParseRdmaDeviceSpec(std::string_view s);

// Whether this build has rdma-core.
bool RdmaCompiled();
// The RDMA devices ibv_get_device_list() lists, sorted; empty without
// rdma-core or without devices (no kernel support is "no devices").
std::vector<std::string> RdmaDeviceNames();

// Resolves `mode` against the devices present. The device to use (its name
// filled in), or nullopt when RDMA is not to be used: off, or auto without
// a device (`why` then says which, for the caller's one log line).
// FailedPrecondition for on without a device, or a named device that does
// not exist (whatever the mode: a typo should not silently mean "none").
absl::StatusOr<std::optional<RdmaDeviceSpec>> ResolveRdma(RdmaMode mode,
                                                          const RdmaDeviceSpec& requested,
                                                          std::string* why);

// One end of an RC queue pair, as v1::RdmaQpAddress carries it.
struct RdmaQpAddress {
  uint16_t lid = 0;
  std::array<uint8_t, 16> gid{};
  uint32_t qpn = 0;  // 24 bits
  uint32_t psn = 0;  // 24 bits
  int mtu_bytes = 1024;
  int port = 1;
  std::string device;
};
void RdmaQpAddressToProto(const RdmaQpAddress& a, v1::RdmaQpAddress* p);
// InvalidArgument for a field out of range (a 24-bit field over 24 bits, a
// GID not of 16 bytes, an MTU that is not a power of two in 256..4096, a
// port outside 1..255, a LID over 16 bits, a device name over 64 bytes).
absl::StatusOr<RdmaQpAddress> RdmaQpAddressFromProto(const v1::RdmaQpAddress& p);

// An opened device and its protection domain, shared by the endpoints made
// on it. Thread-safe (verbs objects are).
class RdmaDevice {
 public:
  // Opens `spec` (its name must be set; see ResolveRdma) and checks that
  // its port is active. FailedPrecondition when the build has no rdma-core
  // or the device, port or GID cannot be used.
  static absl::StatusOr<std::shared_ptr<RdmaDevice>> Open(const RdmaDeviceSpec& spec);
  ~RdmaDevice();
  RdmaDevice(const RdmaDevice&) = delete;
  RdmaDevice& operator=(const RdmaDevice&) = delete;

  const RdmaDeviceSpec& spec() const { return spec_; }

 private:
  friend class RdmaEndpoint;
  struct Impl;
  RdmaDevice(RdmaDeviceSpec spec, std::unique_ptr<Impl> impl);
  const RdmaDeviceSpec spec_;
  std::unique_ptr<Impl> impl_;
};

// One RC queue pair, its completion queue and one buffer registered on the
// device's protection domain. The client posts RDMA WRITE and READ from its
// buffer to the peer's; the store's endpoint is only their target (its
// buffer registered for remote read and write, by this queue pair's peer
// alone, since an RC queue pair talks to one peer).
//
// Not thread-safe: one call at a time (KvStoreClient holds a lock around
// it). A Write or Read that fails or times out leaves the queue pair in an
// unknown state with work maybe still in flight: the owner must destroy the
// endpoint (which stops the device from touching the buffer) and make a
// new one, never reuse it.
class RdmaEndpoint {
 public:
  // A buffer of `buffer_bytes` (page-aligned, zeroed) registered for local
  // write, and with `remote_access` also for remote read and write; a queue
  // pair in INIT.
  static absl::StatusOr<std::unique_ptr<RdmaEndpoint>> Create(std::shared_ptr<RdmaDevice> device,
                                                              size_t buffer_bytes,
                                                              bool remote_access);
  ~RdmaEndpoint();
  RdmaEndpoint(const RdmaEndpoint&) = delete;
  RdmaEndpoint& operator=(const RdmaEndpoint&) = delete;

  // This end's address, for the peer.
  const RdmaQpAddress& address() const { return local_; }
  // Moves the queue pair to ready-to-receive and ready-to-send against
  // `remote` (the path MTU is the smaller of the two ends').
  absl::Status Connect(const RdmaQpAddress& remote);

  uint8_t* data() { return buffer_; }
  size_t size() const { return size_; }
  // The buffer's address and rkey, for the peer's one-sided operations.
  uint64_t addr() const { return reinterpret_cast<uintptr_t>(buffer_); }
  uint32_t rkey() const;

  // One-sided transfers between this buffer's [offset, offset + length) and
  // the same range of the peer's buffer at remote_addr (registered with
  // `rkey`; both ends use the same offsets), waiting for
  // their completion until `deadline`. DeadlineExceeded past it, Unavailable
  // for a work completion error, InvalidArgument for a range outside the
  // buffer. A completed WRITE means the peer's adapter acknowledged the
  // bytes; it is placed before any message sent after it.
  absl::Status Write(size_t offset, uint64_t remote_addr, uint32_t rkey, size_t length,
                     std::chrono::steady_clock::time_point deadline);
  absl::Status Read(size_t offset, uint64_t remote_addr, uint32_t rkey, size_t length,
                    std::chrono::steady_clock::time_point deadline);

 private:
  struct Impl;
  RdmaEndpoint(std::shared_ptr<RdmaDevice> device, std::unique_ptr<Impl> impl, uint8_t* buffer,
               size_t size);
  absl::Status Transfer(bool write, size_t offset, uint64_t remote_addr, uint32_t rkey,
                        size_t length, std::chrono::steady_clock::time_point deadline);

  const std::shared_ptr<RdmaDevice> device_;
  std::unique_ptr<Impl> impl_;
  uint8_t* const buffer_;
  const size_t size_;
  RdmaQpAddress local_;
  bool connected_ = false;
};

}  // namespace ringlane::services

#endif  // RINGLANE_SERVICES_RDMA_H_
