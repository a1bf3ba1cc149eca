#include "services/rdma.h"

#include <sys/mman.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <random>
#include <thread>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"

#if RINGLANE_HAVE_IBVERBS
#include <infiniband/verbs.h>
#endif

namespace ringlane::services {

namespace {

constexpr uint32_t k24Bits = (1u << 24) - 1;
constexpr size_t kMaxDeviceNameBytes = 64;

bool ValidMtu(uint32_t bytes) {
  return bytes == 256 || bytes == 512 || bytes == 1024 || bytes == 2048 || bytes == 4096;
}

}  // namespace

absl::StatusOr<RdmaMode> ParseRdmaMode(std::string_view mode) {
  // This Abseil's string_view is not std's: StrCat takes std::string.
  const std::string s(mode);
  if (s == "off") return RdmaMode::kOff;
  if (s == "auto") return RdmaMode::kAuto;
  if (s == "on") return RdmaMode::kOn;
  return absl::InvalidArgumentError(absl::StrCat("'", s, "' is none of auto, on, off"));
}

const char* RdmaModeName(RdmaMode mode) {
  switch (mode) {
    case RdmaMode::kOff:
      return "off";
    case RdmaMode::kAuto:
      return "auto";
    case RdmaMode::kOn:
      return "on";
  }
  return "?";
}

absl::StatusOr<RdmaDeviceSpec> ParseRdmaDeviceSpec(std::string_view text) {
  const std::string s(text);
  RdmaDeviceSpec spec;
  if (s.empty()) return spec;
  std::vector<std::string> parts = absl::StrSplit(s, ':');
  if (parts.size() > 3 || parts[0].empty() || parts[0].size() > kMaxDeviceNameBytes) {
    return absl::InvalidArgumentError(
        absl::StrCat("'", s, "' is not NAME[:PORT[:GID_INDEX]] (a name of 1..64 bytes)"));
  }
  for (char c : parts[0]) {
    if (!((c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') || c == '_' ||
          c == '-' || c == '.')) {
      return absl::InvalidArgumentError(absl::StrCat("'", s, "': a device name of [A-Za-z0-9_.-]"));
    }
  }
  spec.name = std::string(parts[0]);
  if (parts.size() > 1 &&
      (!absl::SimpleAtoi(parts[1], &spec.port) || spec.port < 1 || spec.port > 255)) {
    return absl::InvalidArgumentError(absl::StrCat("'", s, "': the port must be in [1, 255]"));
  }
  if (parts.size() > 2 && (!absl::SimpleAtoi(parts[2], &spec.gid_index) || spec.gid_index < 0 ||
                           spec.gid_index > 255)) {
    return absl::InvalidArgumentError(absl::StrCat("'", s, "': the GID index must be in [0, 255]"));
  }
  return spec;
}

bool RdmaCompiled() {
#if RINGLANE_HAVE_IBVERBS
  return true;
#else
  return false;
#endif
}

std::vector<std::string> RdmaDeviceNames() {
  std::vector<std::string> names;
#if RINGLANE_HAVE_IBVERBS
  int n = 0;
  // Null with no devices or no RDMA support in the kernel: "none", not an
  // error.
  ibv_device** list = ibv_get_device_list(&n);
  if (list == nullptr) return names;
  for (int i = 0; i < n; ++i) names.emplace_back(ibv_get_device_name(list[i]));
  ibv_free_device_list(list);
  std::sort(names.begin(), names.end());
#endif
  return names;
}

absl::StatusOr<std::optional<RdmaDeviceSpec>> ResolveRdma(RdmaMode mode,
                                                          const RdmaDeviceSpec& requested,
                                                          std::string* why) {
  if (mode == RdmaMode::kOff) {
    *why = "RDMA is off";
    return std::nullopt;
  }
  if (!RdmaCompiled()) {
    if (mode == RdmaMode::kOn || !requested.name.empty()) {
      return absl::FailedPreconditionError(
          "RDMA requested, but this build has no rdma-core (RINGLANE_WITH_RDMA=OFF or libibverbs "
          "not found)");
    }
    *why = "RDMA unavailable: this build has no rdma-core";
    return std::nullopt;
  }
  const std::vector<std::string> names = RdmaDeviceNames();
  if (!requested.name.empty()) {
    if (std::find(names.begin(), names.end(), requested.name) == names.end()) {
      return absl::FailedPreconditionError(
          absl::StrCat("RDMA device '", requested.name, "' not found; this machine has ",
                       names.empty() ? std::string("none (ibv_get_device_list lists none)")
                                     : absl::StrJoin(names, ", ")));
    }
    return requested;
  }
  if (names.empty()) {
    if (mode == RdmaMode::kOn) {
      return absl::FailedPreconditionError(
          "RDMA 'on' requested, but no RDMA device found (ibv_get_device_list lists none)");
    }
    *why = "RDMA unavailable: no RDMA device found (ibv_get_device_list lists none)";
    return std::nullopt;
  }
  RdmaDeviceSpec spec = requested;
  spec.name = names.front();
  return spec;
}

void RdmaQpAddressToProto(const RdmaQpAddress& a, v1::RdmaQpAddress* p) {
  p->set_lid(a.lid);
  p->set_gid(std::string(reinterpret_cast<const char*>(a.gid.data()), a.gid.size()));
  p->set_qpn(a.qpn);
  p->set_psn(a.psn);
  p->set_mtu_bytes(static_cast<uint32_t>(a.mtu_bytes));
  p->set_port(static_cast<uint32_t>(a.port));
  p->set_device(a.device);
}

absl::StatusOr<RdmaQpAddress> RdmaQpAddressFromProto(const v1::RdmaQpAddress& p) {
  auto bad = [](const std::string& what) {
    return absl::InvalidArgumentError(absl::StrCat("queue pair address: ", what));
  };
  if (p.lid() > 0xffff) return bad(absl::StrCat("lid ", p.lid(), " over 16 bits"));
  if (p.gid().size() != 16) return bad(absl::StrCat("a gid of ", p.gid().size(), " bytes (16)"));
  if (p.qpn() == 0 || p.qpn() > k24Bits) return bad(absl::StrCat("qpn ", p.qpn(), " (1..2^24-1)"));
  if (p.psn() > k24Bits) return bad(absl::StrCat("psn ", p.psn(), " over 24 bits"));
  if (!ValidMtu(p.mtu_bytes())) {
    return bad(absl::StrCat("mtu_bytes ", p.mtu_bytes(), " (256, 512, 1024, 2048 or 4096)"));
  }
  if (p.port() < 1 || p.port() > 255) return bad(absl::StrCat("port ", p.port(), " (1..255)"));
  if (p.device().size() > kMaxDeviceNameBytes) return bad("a device name over 64 bytes");
  RdmaQpAddress a;
  a.lid = static_cast<uint16_t>(p.lid());
  std::memcpy(a.gid.data(), p.gid().data(), a.gid.size());
  a.qpn = p.qpn();
  a.psn = p.psn();
  a.mtu_bytes = static_cast<int>(p.mtu_bytes());
  a.port = static_cast<int>(p.port());
  a.device = p.device();
  return a;
}

#if RINGLANE_HAVE_IBVERBS

namespace {

// Queue pair settings. One WR is in flight at a time (each is signaled and
// waited for), so the queues are tiny. Payloads are kilobytes to
// megabytes, far over any inline limit; a small transfer goes inline only
// when it fits what the device granted (cap.max_inline_data after create).
constexpr uint32_t kMaxInlineRequest = 64;
constexpr int kCqDepth = 4;
// RDMA READs outstanding at once: one (we wait for each). The responder
// (the store) must accept at least as many as the requester issues.
constexpr uint8_t kRdAtomic = 1;
// Local ACK timeout 4.096 us * 2^14 = 67 ms, 7 retries: a dead peer fails a
// WR in about half a second, and the call's deadline bounds it anyway.
constexpr uint8_t kAckTimeout = 14;
constexpr uint8_t kRetryCount = 7;
constexpr uint8_t kRnrRetry = 7;
constexpr uint8_t kMinRnrTimer = 12;
// Largest one WR moves (devices' max_msg_sz is usually 2^31; a smaller one
// is honoured).
constexpr size_t kMaxWrBytes = size_t{1} << 30;

absl::Status VerbsError(const std::string& what, int err) {
  return absl::FailedPreconditionError(absl::StrCat(what, ": ", std::strerror(err)));
}

ibv_mtu MtuEnum(int bytes) {
  switch (bytes) {
    case 256:
      return IBV_MTU_256;
    case 512:
      return IBV_MTU_512;
    case 1024:
      return IBV_MTU_1024;
    case 2048:
      return IBV_MTU_2048;
    default:
      return IBV_MTU_4096;
  }
}

int MtuBytes(ibv_mtu mtu) { return 128 << static_cast<int>(mtu); }

}  // namespace

struct RdmaDevice::Impl {
  ibv_context* ctx = nullptr;
  ibv_pd* pd = nullptr;
  ibv_port_attr port{};
  ibv_gid gid{};
  bool ethernet = false;  // RoCE: addressed by GID, every packet has a GRH
};

struct RdmaEndpoint::Impl {
  ibv_cq* cq = nullptr;
  ibv_qp* qp = nullptr;
  ibv_mr* mr = nullptr;
  uint32_t max_inline = 0;
  // Largest one work request moves: the port's max_msg_sz, at most 1 GiB.
  size_t max_wr_bytes = 0;
  uint64_t next_wr_id = 1;
};

absl::StatusOr<std::shared_ptr<RdmaDevice>> RdmaDevice::Open(const RdmaDeviceSpec& spec) {
  int n = 0;
  ibv_device** list = ibv_get_device_list(&n);
  if (list == nullptr) return VerbsError("ibv_get_device_list", errno);
  auto impl = std::make_unique<Impl>();
  for (int i = 0; i < n && impl->ctx == nullptr; ++i) {
    if (spec.name == ibv_get_device_name(list[i])) impl->ctx = ibv_open_device(list[i]);
  }
  ibv_free_device_list(list);
  if (impl->ctx == nullptr) {
    return absl::FailedPreconditionError(
        absl::StrCat("RDMA device '", spec.name, "' not found or cannot be opened"));
  }
  // From here on the destructor closes what was opened.
  std::shared_ptr<RdmaDevice> dev(new RdmaDevice(spec, std::move(impl)));
  Impl& d = *dev->impl_;
  const uint8_t port = static_cast<uint8_t>(spec.port);
  if (int err = ibv_query_port(d.ctx, port, &d.port); err != 0) {
    return VerbsError(absl::StrCat(spec.name, " port ", spec.port), err);
  }
  if (d.port.state != IBV_PORT_ACTIVE) {
    return absl::FailedPreconditionError(
        absl::StrCat(spec.name, " port ", spec.port, " is not active"));
  }
  d.ethernet = d.port.link_layer == IBV_LINK_LAYER_ETHERNET;
  if (ibv_query_gid(d.ctx, port, spec.gid_index, &d.gid) != 0) {
    return absl::FailedPreconditionError(
        absl::StrCat(spec.name, " port ", spec.port, ": no GID at index ", spec.gid_index));
  }
  const bool zero_gid =
      std::all_of(std::begin(d.gid.raw), std::end(d.gid.raw), [](uint8_t b) { return b == 0; });
  if (d.ethernet && zero_gid) {
    return absl::FailedPreconditionError(
        absl::StrCat(spec.name, " port ", spec.port, " is RoCE and GID index ", spec.gid_index,
                     " is empty (pick one with show_gids: NAME:PORT:GID_INDEX)"));
  }
  d.pd = ibv_alloc_pd(d.ctx);
  if (d.pd == nullptr) return VerbsError(absl::StrCat(spec.name, ": ibv_alloc_pd"), errno);
  return dev;
}

RdmaDevice::~RdmaDevice() {
  if (impl_->pd != nullptr) ibv_dealloc_pd(impl_->pd);
  if (impl_->ctx != nullptr) ibv_close_device(impl_->ctx);
}

absl::StatusOr<std::unique_ptr<RdmaEndpoint>> RdmaEndpoint::Create(
    std::shared_ptr<RdmaDevice> device, size_t buffer_bytes, bool remote_access) {
  if (device == nullptr || buffer_bytes == 0) {
    return absl::InvalidArgumentError("an RDMA endpoint needs a device and a buffer");
  }
  // Anonymous pages: page-aligned and zeroed, so a region never shows a
  // previous user's bytes.
  void* p =
      ::mmap(nullptr, buffer_bytes, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  if (p == MAP_FAILED) return VerbsError(absl::StrCat("mmap of ", buffer_bytes, " bytes"), errno);
  std::unique_ptr<RdmaEndpoint> ep(
      new RdmaEndpoint(device, std::make_unique<Impl>(), static_cast<uint8_t*>(p), buffer_bytes));
  const RdmaDevice::Impl& d = *device->impl_;
  Impl& e = *ep->impl_;
  e.cq = ibv_create_cq(d.ctx, kCqDepth, nullptr, nullptr, 0);
  if (e.cq == nullptr) return VerbsError("ibv_create_cq", errno);
  ibv_qp_init_attr init{};
  init.send_cq = e.cq;
  init.recv_cq = e.cq;
  init.qp_type = IBV_QPT_RC;
  init.sq_sig_all = 0;
  init.cap.max_send_wr = 2;
  init.cap.max_recv_wr = 1;
  init.cap.max_send_sge = 1;
  init.cap.max_recv_sge = 1;
  init.cap.max_inline_data = kMaxInlineRequest;
  e.qp = ibv_create_qp(d.pd, &init);
  if (e.qp == nullptr) {
    // Some devices take no inline data at all.
    init.cap.max_inline_data = 0;
    e.qp = ibv_create_qp(d.pd, &init);
  }
  if (e.qp == nullptr) return VerbsError("ibv_create_qp", errno);
  e.max_inline = init.cap.max_inline_data;  // what the device granted
  e.max_wr_bytes = std::min<size_t>(kMaxWrBytes, std::max<uint32_t>(d.port.max_msg_sz, 4096));
  int access = IBV_ACCESS_LOCAL_WRITE;
  if (remote_access) access |= IBV_ACCESS_REMOTE_WRITE | IBV_ACCESS_REMOTE_READ;
  e.mr = ibv_reg_mr(d.pd, p, buffer_bytes, access);
  if (e.mr == nullptr) {
    return VerbsError(absl::StrCat("ibv_reg_mr of ", buffer_bytes, " bytes (RLIMIT_MEMLOCK?)"),
                      errno);
  }
  ibv_qp_attr attr{};
  attr.qp_state = IBV_QPS_INIT;
  attr.pkey_index = 0;
  attr.port_num = static_cast<uint8_t>(device->spec().port);
  attr.qp_access_flags = remote_access ? (IBV_ACCESS_REMOTE_WRITE | IBV_ACCESS_REMOTE_READ) : 0;
  if (int err = ibv_modify_qp(e.qp, &attr,
                              IBV_QP_STATE | IBV_QP_PKEY_INDEX | IBV_QP_PORT | IBV_QP_ACCESS_FLAGS);
      err != 0) {
    return VerbsError("queue pair to INIT", err);
  }
  RdmaQpAddress& a = ep->local_;
  a.lid = d.port.lid;
  std::memcpy(a.gid.data(), d.gid.raw, a.gid.size());
  a.qpn = e.qp->qp_num;
  std::random_device rd;
  a.psn = rd() & k24Bits;
  a.mtu_bytes = MtuBytes(d.port.active_mtu);
  a.port = device->spec().port;
  a.device = device->spec().name;
  return ep;
}

RdmaEndpoint::~RdmaEndpoint() {
  // The queue pair first: destroying it stops the adapter from touching the
  // buffer (work still in flight is flushed), then the registration and the
  // completion queue it used, then the memory.
  if (impl_->qp != nullptr) ibv_destroy_qp(impl_->qp);
  if (impl_->mr != nullptr) ibv_dereg_mr(impl_->mr);
  if (impl_->cq != nullptr) ibv_destroy_cq(impl_->cq);
  ::munmap(buffer_, size_);
}

uint32_t RdmaEndpoint::rkey() const { return impl_->mr->rkey; }

absl::Status RdmaEndpoint::Connect(const RdmaQpAddress& remote) {
  const RdmaDevice::Impl& d = *device_->impl_;
  const bool remote_gid_zero =
      std::all_of(remote.gid.begin(), remote.gid.end(), [](uint8_t b) { return b == 0; });
  if (d.ethernet && remote_gid_zero) {
    return absl::FailedPreconditionError("the peer sent no GID; RoCE addresses by GID");
  }
  if (!d.ethernet && remote.lid == 0) {
    return absl::FailedPreconditionError("the peer sent LID 0 on an InfiniBand port");
  }
  ibv_qp_attr attr{};
  attr.qp_state = IBV_QPS_RTR;
  attr.path_mtu = MtuEnum(std::min(local_.mtu_bytes, remote.mtu_bytes));
  attr.dest_qp_num = remote.qpn;
  attr.rq_psn = remote.psn;
  attr.max_dest_rd_atomic = kRdAtomic;
  attr.min_rnr_timer = kMinRnrTimer;
  attr.ah_attr.dlid = remote.lid;
  attr.ah_attr.sl = 0;
  attr.ah_attr.src_path_bits = 0;
  attr.ah_attr.port_num = static_cast<uint8_t>(local_.port);
  // RoCE has no LIDs: every packet carries a GRH, routed by the peer's GID
  // from our GID index. On InfiniBand a GRH is needed only across subnets.
  if (d.ethernet) {
    attr.ah_attr.is_global = 1;
    std::memcpy(attr.ah_attr.grh.dgid.raw, remote.gid.data(), remote.gid.size());
    attr.ah_attr.grh.sgid_index = static_cast<uint8_t>(device_->spec().gid_index);
    attr.ah_attr.grh.hop_limit = 64;
    attr.ah_attr.grh.traffic_class = 0;
    attr.ah_attr.grh.flow_label = 0;
  }
  if (int err = ibv_modify_qp(impl_->qp, &attr,
                              IBV_QP_STATE | IBV_QP_AV | IBV_QP_PATH_MTU | IBV_QP_DEST_QPN |
                                  IBV_QP_RQ_PSN | IBV_QP_MAX_DEST_RD_ATOMIC | IBV_QP_MIN_RNR_TIMER);
      err != 0) {
    return VerbsError("queue pair to RTR", err);
  }
  attr = ibv_qp_attr{};
  attr.qp_state = IBV_QPS_RTS;
  attr.timeout = kAckTimeout;
  attr.retry_cnt = kRetryCount;
  attr.rnr_retry = kRnrRetry;
  attr.sq_psn = local_.psn;
  attr.max_rd_atomic = kRdAtomic;
  if (int err = ibv_modify_qp(impl_->qp, &attr,
                              IBV_QP_STATE | IBV_QP_TIMEOUT | IBV_QP_RETRY_CNT | IBV_QP_RNR_RETRY |
                                  IBV_QP_SQ_PSN | IBV_QP_MAX_QP_RD_ATOMIC);
      err != 0) {
    return VerbsError("queue pair to RTS", err);
  }
  connected_ = true;
  return absl::OkStatus();
}

absl::Status RdmaEndpoint::Transfer(bool write, size_t offset, uint64_t remote_addr, uint32_t rkey,
                                    size_t length, std::chrono::steady_clock::time_point deadline) {
  if (!connected_) return absl::FailedPreconditionError("RDMA endpoint not connected");
  if (offset > size_ || length > size_ - offset) {
    return absl::InvalidArgumentError(absl::StrCat("RDMA transfer [", offset, ", +", length,
                                                   ") outside a ", size_, "-byte buffer"));
  }
  const char* op = write ? "RDMA WRITE" : "RDMA READ";
  for (size_t done = 0; done < length;) {
    const size_t n = std::min(length - done, impl_->max_wr_bytes);
    ibv_sge sge{};
    sge.addr = reinterpret_cast<uintptr_t>(buffer_ + offset + done);
    sge.length = static_cast<uint32_t>(n);
    sge.lkey = impl_->mr->lkey;
    ibv_send_wr wr{};
    wr.wr_id = impl_->next_wr_id++;
    wr.sg_list = &sge;
    wr.num_sge = 1;
    wr.opcode = write ? IBV_WR_RDMA_WRITE : IBV_WR_RDMA_READ;
    wr.send_flags = IBV_SEND_SIGNALED;
    if (write && n <= impl_->max_inline) wr.send_flags |= IBV_SEND_INLINE;
    wr.wr.rdma.remote_addr = remote_addr + offset + done;
    wr.wr.rdma.rkey = rkey;
    ibv_send_wr* bad = nullptr;
    if (int err = ibv_post_send(impl_->qp, &wr, &bad); err != 0) {
      return absl::UnavailableError(absl::StrCat(op, ": ibv_post_send: ", std::strerror(err)));
    }
    // Busy-poll (transfers take microseconds to milliseconds), checking the
    // clock every few hundred polls and yielding the core now and then.
    ibv_wc wc{};
    for (uint64_t polls = 1;; ++polls) {
      const int got = ibv_poll_cq(impl_->cq, 1, &wc);
      if (got < 0) return absl::UnavailableError(absl::StrCat(op, ": ibv_poll_cq failed"));
      if (got == 1) break;
      if (polls % 256 == 0) {
        if (std::chrono::steady_clock::now() >= deadline) {
          return absl::DeadlineExceededError(absl::StrCat(op, " of ", n, " bytes not completed"));
        }
        std::this_thread::yield();
      }
    }
    if (wc.status != IBV_WC_SUCCESS || wc.wr_id != wr.wr_id) {
      return absl::UnavailableError(absl::StrCat(op, ": work completion ",
                                                 ibv_wc_status_str(wc.status), " (wr ", wc.wr_id,
                                                 ", expected ", wr.wr_id, ")"));
    }
    done += n;
  }
  return absl::OkStatus();
}

#else  // !RINGLANE_HAVE_IBVERBS

struct RdmaDevice::Impl {};
struct RdmaEndpoint::Impl {};

absl::StatusOr<std::shared_ptr<RdmaDevice>> RdmaDevice::Open(const RdmaDeviceSpec& spec) {
  return absl::FailedPreconditionError("this build has no rdma-core");
}
RdmaDevice::~RdmaDevice() = default;

absl::StatusOr<std::unique_ptr<RdmaEndpoint>> RdmaEndpoint::Create(
    std::shared_ptr<RdmaDevice> device, size_t buffer_bytes, bool remote_access) {
  return absl::FailedPreconditionError("this build has no rdma-core");
}
RdmaEndpoint::~RdmaEndpoint() { ::munmap(buffer_, size_); }
uint32_t RdmaEndpoint::rkey() const { return 0; }
absl::Status RdmaEndpoint::Connect(const RdmaQpAddress& remote) {
  return absl::FailedPreconditionError("this build has no rdma-core");
}
absl::Status RdmaEndpoint::Transfer(bool write, size_t offset, uint64_t remote_addr, uint32_t rkey,
                                    size_t length, std::chrono::steady_clock::time_point deadline) {
  return absl::FailedPreconditionError("this build has no rdma-core");
}

#endif  // RINGLANE_HAVE_IBVERBS

RdmaDevice::RdmaDevice(RdmaDeviceSpec spec, std::unique_ptr<Impl> impl)
    : spec_(std::move(spec)), impl_(std::move(impl)) {}

RdmaEndpoint::RdmaEndpoint(std::shared_ptr<RdmaDevice> device, std::unique_ptr<Impl> impl,
                           uint8_t* buffer, size_t size)
    : device_(std::move(device)), impl_(std::move(impl)), buffer_(buffer), size_(size) {}

absl::Status RdmaEndpoint::Write(size_t offset, uint64_t remote_addr, uint32_t rkey, size_t length,
                                 std::chrono::steady_clock::time_point deadline) {
  return Transfer(/*write=*/true, offset, remote_addr, rkey, length, deadline);
}

absl::Status RdmaEndpoint::Read(size_t offset, uint64_t remote_addr, uint32_t rkey, size_t length,
                                std::chrono::steady_clock::time_point deadline) {
  return Transfer(/*write=*/false, offset, remote_addr, rkey, length, deadline);
}

}  // namespace ringlane::services
