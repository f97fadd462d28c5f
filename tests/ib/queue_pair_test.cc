// How the ib transport picks its port and brings its queue pairs up (transport/ib/ib_select.hpp,
// open_port.hpp, queue_pair.hpp), against the tests' verbs provider: the devices configured in
// verbs_provider_test.cc's main (mlx5_0: InfiniBand, NUMA 0; mlx5_1: RoCE, 2 ports, NUMA 1;
// mlx5_2: down).
#include <dirent.h>
#include <gtest/gtest.h>
#include <limits.h>
#include <stdlib.h>
#include <sys/socket.h>

#include <chrono>
#include <cstring>
#include <thread>

#include "common/env_guard.hpp"
#include "common/fake_device.hpp"
#include "device/runtime.hpp"
#include "loom/loom.hpp"
#include "transport/ib/open_port.hpp"

namespace loom {
namespace ib {
namespace {

PortInfo port(const char* device, int p, bool active, int numa) {
  PortInfo x;
  x.device = device;
  x.port = p;
  x.state = active ? IBV_PORT_ACTIVE : IBV_PORT_DOWN;
  x.numaNode = numa;
  return x;
}

Locality at(int numa, int localIndex) {
  Locality l;
  l.numaNode = numa;
  l.localIndex = localIndex;
  return l;
}

TEST(IbSelect, ActivePortsOfTheRanksNumaNodeFirstSpreadByLocalIndex) {
  const std::vector<PortInfo> ports = {port("mlx5_0", 1, true, 0), port("mlx5_1", 1, true, 1),
                                       port("mlx5_2", 1, false, 1), port("mlx5_3", 1, true, 1)};
  std::string why;
  const HcaSpec all = parseHcaSpec("");
  EXPECT_EQ(choosePort(ports, all, at(1, 0), &why)->device, "mlx5_1");
  EXPECT_EQ(choosePort(ports, all, at(1, 1), &why)->device, "mlx5_3") << "the next rank of the node, the next port";
  EXPECT_EQ(choosePort(ports, all, at(1, 2), &why)->device, "mlx5_1");
  EXPECT_EQ(choosePort(ports, all, at(0, 5), &why)->device, "mlx5_0");
  EXPECT_EQ(choosePort(ports, all, at(7, 1), &why)->device, "mlx5_1") << "no port on the node: any active one";
  EXPECT_EQ(choosePort(ports, parseHcaSpec("mlx5_0"), at(1, 0), &why)->device, "mlx5_0") << "LOOM_IB_HCA first";
  EXPECT_EQ(choosePort(ports, parseHcaSpec("^mlx5_1,mlx5_3"), at(1, 0), &why)->device, "mlx5_0");
  EXPECT_EQ(choosePort(ports, parseHcaSpec("mlx5_2"), at(1, 0), &why), nullptr) << "a port that is down";
  EXPECT_NE(why.find("mlx5_2:1 (DOWN)"), std::string::npos) << why;
  EXPECT_NE(why.find("LOOM_IB_HCA"), std::string::npos) << why;
  EXPECT_EQ(choosePort({}, all, at(0, 0), &why), nullptr);
}

// With a GPU, the ports behind the PCI switch it sits behind first, then those on its NUMA node,
// whatever the CPUs' node; ranks sharing the nearest ports spread over them.
TEST(IbSelect, PortsNearestTheRanksGpuFirst) {
  auto on = [](const char* device, int numa, const char* pci) {
    PortInfo p = port(device, 1, true, numa);
    p.pciPath = std::string("/sys/devices/") + pci;
    return p;
  };
  const std::vector<PortInfo> ports = {
      on("mlx5_0", 0, "pci0000:00/0000:00:01.0/0000:01:00.0/0000:02:00.0/0000:03:00.0"),
      on("mlx5_1", 0, "pci0000:00/0000:00:01.0/0000:01:00.0/0000:02:01.0/0000:04:00.0"),
      on("mlx5_2", 1, "pci0000:80/0000:80:01.0/0000:81:00.0/0000:82:00.0/0000:83:00.0"),
      on("mlx5_3", 1, "pci0000:80/0000:80:02.0/0000:84:00.0")};
  const HcaSpec all = parseHcaSpec("");
  std::string why;
  Locality gpu = at(1, 0);  // CPUs on node 1, GPU beside mlx5_1
  gpu.gpuPciPath = "/sys/devices/pci0000:00/0000:00:01.0/0000:01:00.0/0000:02:01.0/0000:05:00.0";
  gpu.gpuNumaNode = 0;
  EXPECT_EQ(choosePort(ports, all, gpu, &why)->device, "mlx5_1") << "the same switch port";
  gpu.gpuPciPath = "/sys/devices/pci0000:80/0000:80:01.0/0000:81:00.0/0000:82:04.0/0000:86:00.0";
  gpu.gpuNumaNode = 1;
  EXPECT_EQ(choosePort(ports, all, gpu, &why)->device, "mlx5_2") << "the same switch";
  gpu.gpuPciPath = "/sys/devices/pci0000:40/0000:40:01.0/0000:41:00.0";  // a host bridge with no port
  EXPECT_EQ(choosePort(ports, all, gpu, &why)->device, "mlx5_2") << "no bridge in common: the GPU's NUMA node";
  gpu.localIndex = 1;
  EXPECT_EQ(choosePort(ports, all, gpu, &why)->device, "mlx5_3") << "spread over that node's ports";
  EXPECT_EQ(choosePort(ports, parseHcaSpec("mlx5_0"), gpu, &why)->device, "mlx5_0") << "LOOM_IB_HCA first";
  EXPECT_EQ(sharedPciDepth("/sys/devices/pci0000:00/0000:00:01.0/a", "/sys/devices/pci0000:00/0000:00:01.0/b"), 2);
  EXPECT_EQ(sharedPciDepth("/sys/devices/pci0000:00/x", "/sys/devices/pci0000:80/x"), 0);
  EXPECT_EQ(sharedPciDepth("", "/sys/devices/pci0000:00"), 0);
}

// The rank's GPU is the device runtime's current one, found in sysfs by its PCI address (here a
// PCI device of this machine stands for it, as the emulated runtime says it is there).
TEST(IbSelect, CallerLocalityFindsTheRuntimesCurrentGpu) {
  std::string bus;
  if (DIR* d = opendir("/sys/bus/pci/devices")) {
    while (dirent* e = readdir(d))
      if (e->d_name[0] != '.') bus = e->d_name;
    closedir(d);
  }
  if (bus.empty()) GTEST_SKIP() << "this machine lists no PCI device in /sys/bus/pci/devices";
  char real[PATH_MAX];
  ASSERT_NE(realpath(("/sys/bus/pci/devices/" + bus).c_str(), real), nullptr);
  loomtest::FakeDevice gpu;
  gpu.busId = bus;
  device::setRuntimeForTesting(&gpu);
  const Locality where = callerLocality(3);
  gpu.busId.clear();
  const Locality unknown = callerLocality(0);
  device::setRuntimeForTesting(nullptr);
  EXPECT_EQ(where.localIndex, 3);
  EXPECT_EQ(where.gpuPciPath, real);
  EXPECT_EQ(where.gpuPciPath.rfind("/sys/devices/", 0), 0u) << where.gpuPciPath;
  EXPECT_EQ(unknown.gpuPciPath, "") << "a runtime that cannot say where its GPU is: the CPUs decide";
}

TEST(IbSelect, SettingsOutOfRangeNameTheVariable) {
  for (auto [name, value] : {std::pair<const char*, const char*>{"LOOM_IB_TIMEOUT", "32"},
                             {"LOOM_IB_RETRY_CNT", "8"},
                             {"LOOM_IB_SL", "16"},
                             {"LOOM_IB_QPS_PER_CONNECTION", "0"},
                             {"LOOM_IB_ADDR_FAMILY", "AF_UNIX"},
                             {"LOOM_IB_HCA", "mlx5_0:x"}}) {
    loomtest::EnvGuard g(name, value);
    try {
      ibSettingsFromEnv();
      ADD_FAILURE() << name << "=" << value << " accepted";
    } catch (const Error& e) {
      EXPECT_EQ(e.code(), ErrorCode::InvalidArgument);
      EXPECT_NE(std::string(e.what()).find(name), std::string::npos) << e.what();
    }
  }
  const IbSettings s = ibSettingsFromEnv();
  EXPECT_EQ(s.timeout, 20);
  EXPECT_EQ(s.retryCnt, 7);
  EXPECT_EQ(s.family, AF_INET);
}

TEST(QpAddress, RoundTripsThroughText) {
  QpAddress a;
  a.qpn = 0xabcdef;
  a.psn = 0x123456;
  a.lid = 17;
  a.mtu = IBV_MTU_4096;
  QpAddress b;
  ASSERT_TRUE(QpAddress::decode(a.encode(), &b));
  EXPECT_EQ(b.qpn, a.qpn);
  EXPECT_EQ(b.psn, a.psn);
  EXPECT_EQ(b.lid, 17);
  EXPECT_FALSE(b.global);
  a.global = true;
  for (int i = 0; i < 16; ++i) a.gid[i] = static_cast<uint8_t>(i * 17);
  ASSERT_TRUE(QpAddress::decode(a.encode(), &b));
  EXPECT_TRUE(b.global);
  EXPECT_EQ(std::memcmp(a.gid, b.gid, 16), 0);
  for (const char* bad : {"", "1 2 3", "1 2 3 5 abc", "1 2 3 5 00112233445566778899aabbccddeeffzz"})
    EXPECT_FALSE(QpAddress::decode(bad, &b)) << bad;
}

// Two queue pairs of one opened port, connected through their addresses as text, carry a SEND.
void connectAndSend(const char* hca) {
  loomtest::EnvGuard g("LOOM_IB_HCA", hca);
  std::string why;
  const Verbs* v = verbs(&why);
  ASSERT_NE(v, nullptr) << why;
  auto port = OpenPort::open(
      *v, ibSettingsFromEnv(), [] { return Locality{}; }, &why);
  ASSERT_NE(port, nullptr) << why;
  const PortContext& pc = port->context();
  ibv_cq* cq = v->createCq(pc.context, 64, nullptr, nullptr, 0);
  ASSERT_NE(cq, nullptr);
  {
    QueuePair a(pc, cq, cq, 16, 16, 0, 1), b(pc, cq, cq, 16, 16, 1, 0);
    QpAddress aa, ba;
    ASSERT_TRUE(QpAddress::decode(a.address().encode(), &aa));
    ASSERT_TRUE(QpAddress::decode(b.address().encode(), &ba));
    EXPECT_EQ(aa.global, pc.port.ethernet);
    a.init();
    b.init();
    char in[16] = {0}, out[16] = "over the wire";
    ibv_mr* mi = v->regMr(pc.pd, in, sizeof in, IBV_ACCESS_LOCAL_WRITE);
    ibv_mr* mo = v->regMr(pc.pd, out, sizeof out, IBV_ACCESS_LOCAL_WRITE);
    ibv_sge rs{reinterpret_cast<uint64_t>(in), sizeof in, mi->lkey};
    ibv_recv_wr rw{};
    rw.sg_list = &rs;
    rw.num_sge = 1;
    ibv_recv_wr* badr = nullptr;
    ASSERT_EQ(ibv_post_recv(b.get(), &rw, &badr), 0);
    a.connect(ba);
    b.connect(aa);
    ibv_sge ss{reinterpret_cast<uint64_t>(out), sizeof out, mo->lkey};
    ibv_send_wr sw{};
    sw.sg_list = &ss;
    sw.num_sge = 1;
    sw.opcode = IBV_WR_SEND;
    sw.send_flags = IBV_SEND_SIGNALED;
    ibv_send_wr* bads = nullptr;
    ASSERT_EQ(ibv_post_send(a.get(), &sw, &bads), 0);
    int got = 0;
    const auto until = std::chrono::steady_clock::now() + std::chrono::seconds(10);
    while (got < 2 && std::chrono::steady_clock::now() < until) {
      ibv_wc wc;
      if (ibv_poll_cq(cq, 1, &wc) == 1) {
        EXPECT_EQ(wc.status, IBV_WC_SUCCESS) << v->wcStatusStr(wc.status);
        ++got;
      }
    }
    EXPECT_EQ(got, 2);
    EXPECT_STREQ(in, "over the wire");
    v->deregMr(mi);
    v->deregMr(mo);
  }
  v->destroyCq(cq);
}

TEST(QueuePair, ComesUpOverInfiniBandByLid) { connectAndSend("mlx5_0"); }
TEST(QueuePair, ComesUpOverRoceByGid) { connectAndSend("mlx5_1:2"); }

TEST(QueuePair, ABadAddressIsAnErrorNamingThePeer) {
  std::string why;
  const Verbs* v = verbs(&why);
  loomtest::EnvGuard g("LOOM_IB_HCA", "mlx5_0");
  auto port = OpenPort::open(
      *v, ibSettingsFromEnv(), [] { return Locality{}; }, &why);
  ASSERT_NE(port, nullptr) << why;
  ibv_cq* cq = v->createCq(port->context().context, 8, nullptr, nullptr, 0);
  {
    QueuePair a(port->context(), cq, cq, 4, 4, 2, 5);
    a.init();
    QpAddress bad = a.address();
    bad.lid = 0;  // no LID on InfiniBand: the adapter refuses RTR
    try {
      a.connect(bad);
      ADD_FAILURE() << "connected to nowhere";
    } catch (const Error& e) {
      EXPECT_EQ(e.peer(), 5);
      EXPECT_NE(std::string(e.what()).find("rank 5"), std::string::npos) << e.what();
      EXPECT_NE(std::string(e.what()).find("RTR"), std::string::npos) << e.what();
    }
  }
  v->destroyCq(cq);
}

TEST(OpenPort, NoUsablePortSaysWhy) {
  std::string why;
  const Verbs* v = verbs(&why);
  loomtest::EnvGuard g("LOOM_IB_HCA", "mlx5_2");
  EXPECT_EQ(OpenPort::open(
                *v, ibSettingsFromEnv(), [] { return Locality{}; }, &why),
            nullptr);
  EXPECT_NE(why.find("mlx5_2:1 (DOWN)"), std::string::npos) << why;
}

}  // namespace
}  // namespace ib
}  // namespace loom
