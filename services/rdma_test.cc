// The parts of the RDMA transport that need no device: flag values, the
// queue-pair address as AttachRdma carries it (round trip, and every field
// out of range refused), and what a machine without a device resolves to.
// The verbs data path itself needs a device and is not run here.
#include "services/rdma.h"

#include <string>

#include "gtest/gtest.h"

namespace ringlane::services {
namespace {

TEST(RdmaTest, ModesParseAndPrint) {
  for (RdmaMode m : {RdmaMode::kOff, RdmaMode::kAuto, RdmaMode::kOn}) {
    absl::StatusOr<RdmaMode> back = ParseRdmaMode(RdmaModeName(m));
    ASSERT_TRUE(back.ok());
    EXPECT_EQ(*back, m);
  }
  for (const char* bad : {"", "yes", "ON", "ibverbs"}) {
    EXPECT_EQ(ParseRdmaMode(bad).status().code(), absl::StatusCode::kInvalidArgument) << bad;
  }
}

TEST(RdmaTest, DeviceSpecs) {
  struct Case {
    const char* text;
    bool ok;
    std::string name;
    int port;
    int gid_index;
  };
  const std::string long_name(65, 'a');
  const Case cases[] = {
      {"", true, "", 1, 0},
      {"mlx5_0", true, "mlx5_0", 1, 0},
      {"mlx5_0:2", true, "mlx5_0", 2, 0},
      {"rxe-eth0:1:3", true, "rxe-eth0", 1, 3},
      {":1", false},
      {"mlx5_0:0", false},
      {"mlx5_0:256", false},
      {"mlx5_0:1:-1", false},
      {"mlx5_0:1:256", false},
      {"mlx5_0:x", false},
      {"mlx5_0:1:2:3", false},
      {"../x", false},
      {"a b", false},
      {long_name.c_str(), false},
  };
  for (const Case& c : cases) {
    absl::StatusOr<RdmaDeviceSpec> s = ParseRdmaDeviceSpec(c.text);
    ASSERT_EQ(s.ok(), c.ok) << c.text << ": " << s.status();
    if (!c.ok) {
      EXPECT_EQ(s.status().code(), absl::StatusCode::kInvalidArgument) << c.text;
      continue;
    }
    EXPECT_EQ(s->name, c.name) << c.text;
    EXPECT_EQ(s->port, c.port) << c.text;
    EXPECT_EQ(s->gid_index, c.gid_index) << c.text;
  }
}

RdmaQpAddress SomeAddress() {
  RdmaQpAddress a;
  a.lid = 0xbeef;
  for (size_t i = 0; i < a.gid.size(); ++i) a.gid[i] = static_cast<uint8_t>(0xf0 + i);
  a.qpn = 0xabcdef;
  a.psn = 0x123456;
  a.mtu_bytes = 4096;
  a.port = 2;
  a.device = "mlx5_1";
  return a;
}

TEST(RdmaTest, QueuePairAddressesRoundTrip) {
  const RdmaQpAddress a = SomeAddress();
  v1::RdmaQpAddress p;
  RdmaQpAddressToProto(a, &p);
  // Through the wire format too, as AttachRdma carries it.
  v1::RdmaQpAddress wire;
  ASSERT_TRUE(wire.ParseFromString(p.SerializeAsString()));
  absl::StatusOr<RdmaQpAddress> b = RdmaQpAddressFromProto(wire);
  ASSERT_TRUE(b.ok()) << b.status();
  EXPECT_EQ(b->lid, a.lid);
  EXPECT_EQ(b->gid, a.gid);
  EXPECT_EQ(b->qpn, a.qpn);
  EXPECT_EQ(b->psn, a.psn);
  EXPECT_EQ(b->mtu_bytes, a.mtu_bytes);
  EXPECT_EQ(b->port, a.port);
  EXPECT_EQ(b->device, a.device);
  // The extremes of every field.
  RdmaQpAddress edge = a;
  edge.lid = 0;
  edge.gid = {};
  edge.qpn = (1u << 24) - 1;
  edge.psn = 0;
  edge.mtu_bytes = 256;
  edge.port = 255;
  edge.device = "";
  RdmaQpAddressToProto(edge, &p);
  b = RdmaQpAddressFromProto(p);
  ASSERT_TRUE(b.ok()) << b.status();
  EXPECT_EQ(b->qpn, edge.qpn);
  EXPECT_EQ(b->port, 255);
}

TEST(RdmaTest, QueuePairAddressesOutOfRangeAreInvalidArgument) {
  struct Case {
    const char* what;
    void (*spoil)(v1::RdmaQpAddress*);
  };
  const Case cases[] = {
      {"lid over 16 bits", [](v1::RdmaQpAddress* p) { p->set_lid(1 << 16); }},
      {"short gid", [](v1::RdmaQpAddress* p) { p->set_gid("abc"); }},
      {"no gid", [](v1::RdmaQpAddress* p) { p->clear_gid(); }},
      {"qpn 0", [](v1::RdmaQpAddress* p) { p->set_qpn(0); }},
      {"qpn over 24 bits", [](v1::RdmaQpAddress* p) { p->set_qpn(1 << 24); }},
      {"psn over 24 bits", [](v1::RdmaQpAddress* p) { p->set_psn(1 << 24); }},
      {"mtu 0", [](v1::RdmaQpAddress* p) { p->set_mtu_bytes(0); }},
      {"mtu 1500", [](v1::RdmaQpAddress* p) { p->set_mtu_bytes(1500); }},
      {"mtu 8192", [](v1::RdmaQpAddress* p) { p->set_mtu_bytes(8192); }},
      {"port 0", [](v1::RdmaQpAddress* p) { p->set_port(0); }},
      {"port 256", [](v1::RdmaQpAddress* p) { p->set_port(256); }},
      {"long device", [](v1::RdmaQpAddress* p) { p->set_device(std::string(65, 'd')); }},
  };
  for (const Case& c : cases) {
    v1::RdmaQpAddress p;
    RdmaQpAddressToProto(SomeAddress(), &p);
    c.spoil(&p);
    EXPECT_EQ(RdmaQpAddressFromProto(p).status().code(), absl::StatusCode::kInvalidArgument)
        << c.what;
  }
}

// What a machine without a device (this project's CI) resolves to: auto is
// "not used" with a reason to log, on and a named device are errors.
TEST(RdmaTest, WithoutADeviceAutoFallsBackAndOnIsAnError) {
  if (!RdmaDeviceNames().empty()) GTEST_SKIP() << "this machine has RDMA devices";
  std::string why;
  absl::StatusOr<std::optional<RdmaDeviceSpec>> r = ResolveRdma(RdmaMode::kAuto, {}, &why);
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_FALSE(r->has_value());
  EXPECT_NE(why.find("unavailable"), std::string::npos) << why;
  why.clear();
  r = ResolveRdma(RdmaMode::kOff, {}, &why);
  ASSERT_TRUE(r.ok());
  EXPECT_FALSE(r->has_value());
  EXPECT_NE(why.find("off"), std::string::npos) << why;
  EXPECT_EQ(ResolveRdma(RdmaMode::kOn, {}, &why).status().code(),
            absl::StatusCode::kFailedPrecondition);
  RdmaDeviceSpec named;
  named.name = "mlx5_0";
  EXPECT_EQ(ResolveRdma(RdmaMode::kAuto, named, &why).status().code(),
            absl::StatusCode::kFailedPrecondition);
  EXPECT_EQ(RdmaDevice::Open(named).status().code(), absl::StatusCode::kFailedPrecondition);
}

}  // namespace
}  // namespace ringlane::services
