// Loom's verbs loader (transport/ib/verbs.hpp) and device listing (ib_device.hpp) against the tests'
// verbs provider (tests/verbs_provider), and the provider itself: it must refuse what a real
// adapter refuses, or the ib transport's tests would prove nothing. Queue pairs are connected to
// each other in this process, and across a fork, through the provider's wire.
#include <dlfcn.h>
#include <fcntl.h>
#include <gtest/gtest.h>
#include <poll.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstdlib>
#include <cstring>
#include <string>
#include <thread>
#include <vector>

#include "common/env_guard.hpp"
#include "common/fake_device.hpp"
#include "transport/ib/ib_device.hpp"
#include "transport/ib/verbs.hpp"
#include "verbs_provider/counters.h"

namespace loom {
namespace ib {
namespace {

const Verbs& V() {
  std::string why;
  const Verbs* v = verbs(&why);
  if (v == nullptr) ADD_FAILURE() << why;
  return *v;
}

// A device opened with one protection domain, one completion queue and its channel.
struct Device {
  explicit Device(const char* name = "mlx5_0") {
    int n = 0;
    ibv_device** list = V().getDeviceList(&n);
    for (int i = 0; i < n; ++i)
      if (std::string(V().getDeviceName(list[i])) == name) ctx = V().openDevice(list[i]);
    V().freeDeviceList(list);
    pd = V().allocPd(ctx);
    channel = V().createCompChannel(ctx);
    cq = V().createCq(ctx, 256, nullptr, channel, 0);
  }
  ~Device() {
    for (auto* q : qps) V().destroyQp(q);
    for (auto* m : mrs) V().deregMr(m);
    V().destroyCq(cq);
    V().destroyCompChannel(channel);
    V().deallocPd(pd);
    V().closeDevice(ctx);
  }
  ibv_qp* qp(uint32_t sendWr = 16, int sigAll = 1) {
    ibv_qp_init_attr a{};
    a.send_cq = cq;
    a.recv_cq = cq;
    a.qp_type = IBV_QPT_RC;
    a.sq_sig_all = sigAll;
    a.cap.max_send_wr = sendWr;
    a.cap.max_recv_wr = 16;
    a.cap.max_send_sge = 2;
    a.cap.max_recv_sge = 2;
    ibv_qp* q = V().createQp(pd, &a);
    if (q != nullptr) qps.push_back(q);
    return q;
  }
  ibv_mr* reg(void* p, size_t n, int access) {
    ibv_mr* m = V().regMr(pd, p, n, access);
    if (m != nullptr) mrs.push_back(m);
    return m;
  }
  uint16_t lid() {
    ibv_port_attr a{};
    V().queryPort(ctx, 1, &a);
    return a.lid;
  }
  ibv_context* ctx = nullptr;
  ibv_pd* pd = nullptr;
  ibv_comp_channel* channel = nullptr;
  ibv_cq* cq = nullptr;
  std::vector<ibv_qp*> qps;
  std::vector<ibv_mr*> mrs;
};

// The provider's counters, through the handle Loom's loader opened.
LoomTestVerbsCounters counters() {
  V();
  void* lib = dlopen(verbsLibrary().c_str(), RTLD_NOW | RTLD_NOLOAD);
  auto fn = reinterpret_cast<const LoomTestVerbsCounters* (*)()>(dlsym(lib, "loom_test_verbs_counters"));
  if (fn == nullptr) {
    ADD_FAILURE() << "the verbs library has no counters: is LOOM_IBVERBS_LIBRARY the tests' provider?";
    return {};
  }
  return *fn();
}

constexpr int kAllAccess = IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE | IBV_ACCESS_REMOTE_READ;

int toInit(ibv_qp* q, int access = kAllAccess) {
  ibv_qp_attr a{};
  a.qp_state = IBV_QPS_INIT;
  a.port_num = 1;
  a.qp_access_flags = access;
  return V().modifyQp(q, &a, IBV_QP_STATE | IBV_QP_PKEY_INDEX | IBV_QP_PORT | IBV_QP_ACCESS_FLAGS);
}

int toRtr(ibv_qp* q, uint32_t remoteQpn, uint16_t lid, uint8_t rnrRetryUnused = 0) {
  (void)rnrRetryUnused;
  ibv_qp_attr a{};
  a.qp_state = IBV_QPS_RTR;
  a.path_mtu = IBV_MTU_4096;
  a.dest_qp_num = remoteQpn;
  a.rq_psn = 0;
  a.max_dest_rd_atomic = 1;
  a.min_rnr_timer = 12;
  a.ah_attr.dlid = lid;
  a.ah_attr.port_num = 1;
  return V().modifyQp(q, &a,
                      IBV_QP_STATE | IBV_QP_AV | IBV_QP_PATH_MTU | IBV_QP_DEST_QPN | IBV_QP_RQ_PSN |
                          IBV_QP_MAX_DEST_RD_ATOMIC | IBV_QP_MIN_RNR_TIMER);
}

int toRts(ibv_qp* q, uint8_t rnrRetry = 7, uint8_t timeout = 14) {
  ibv_qp_attr a{};
  a.qp_state = IBV_QPS_RTS;
  a.timeout = timeout;
  a.retry_cnt = 1;
  a.rnr_retry = rnrRetry;
  a.sq_psn = 0;
  a.max_rd_atomic = 1;
  return V().modifyQp(
      q, &a,
      IBV_QP_STATE | IBV_QP_TIMEOUT | IBV_QP_RETRY_CNT | IBV_QP_RNR_RETRY | IBV_QP_SQ_PSN | IBV_QP_MAX_QP_RD_ATOMIC);
}

void connect(ibv_qp* a, ibv_qp* b, uint16_t lid, uint8_t rnrRetry = 7) {
  ASSERT_EQ(toInit(a), 0);
  ASSERT_EQ(toInit(b), 0);
  ASSERT_EQ(toRtr(a, b->qp_num, lid), 0);
  ASSERT_EQ(toRtr(b, a->qp_num, lid), 0);
  ASSERT_EQ(toRts(a, rnrRetry), 0);
  ASSERT_EQ(toRts(b, rnrRetry), 0);
}

// Polls `cq` until `n` completions came (or 10 s passed).
std::vector<ibv_wc> poll(ibv_cq* cq, size_t n) {
  std::vector<ibv_wc> out;
  const auto until = std::chrono::steady_clock::now() + std::chrono::seconds(10);
  while (out.size() < n && std::chrono::steady_clock::now() < until) {
    ibv_wc wc[8];
    const int k = ibv_poll_cq(cq, 8, wc);
    for (int i = 0; i < k; ++i) out.push_back(wc[i]);
    if (k == 0) std::this_thread::sleep_for(std::chrono::microseconds(100));
  }
  return out;
}

int postSend(ibv_qp* q, ibv_wr_opcode op, void* buf, uint32_t len, uint32_t lkey, uint64_t wrId, uint64_t raddr = 0,
             uint32_t rkey = 0, uint32_t imm = 0, unsigned flags = IBV_SEND_SIGNALED) {
  ibv_sge sge{reinterpret_cast<uint64_t>(buf), len, lkey};
  ibv_send_wr wr{};
  wr.wr_id = wrId;
  wr.sg_list = &sge;
  wr.num_sge = 1;
  wr.opcode = op;
  wr.send_flags = flags;
  wr.imm_data = imm;
  wr.wr.rdma.remote_addr = raddr;
  wr.wr.rdma.rkey = rkey;
  ibv_send_wr* bad = nullptr;
  return ibv_post_send(q, &wr, &bad);
}

int postRecv(ibv_qp* q, void* buf, uint32_t len, uint32_t lkey, uint64_t wrId) {
  ibv_sge sge{reinterpret_cast<uint64_t>(buf), len, lkey};
  ibv_recv_wr wr{};
  wr.wr_id = wrId;
  wr.sg_list = &sge;
  wr.num_sge = len > 0 ? 1 : 0;
  ibv_recv_wr* bad = nullptr;
  return ibv_post_recv(q, &wr, &bad);
}

TEST(VerbsProvider, LoadsThroughLoomsLoaderAndListsItsDevicesAsConfigured) {
  std::string why;
  const std::vector<PortInfo> ports = listPorts(V(), &why);
  ASSERT_EQ(ports.size(), 4u) << why;  // mlx5_0:1, mlx5_1:1-2 (RoCE), mlx5_2:1 (down)
  EXPECT_EQ(ports[0].device, "mlx5_0");
  EXPECT_FALSE(ports[0].ethernet);
  EXPECT_TRUE(ports[0].active());
  EXPECT_GT(ports[0].lid, 0);
  EXPECT_EQ(ports[0].numaNode, 0);
  EXPECT_EQ(mtuBytes(ports[0].activeMtu), 4096);
  EXPECT_EQ(ports[0].speed.lanes, 4);
  EXPECT_STREQ(ports[0].speed.name, "HDR");
  EXPECT_EQ(ports[0].speed.gbps(), 200);
  ASSERT_EQ(ports[0].gids.size(), 1u);
  EXPECT_EQ(ports[0].gids[0].type, GidType::IB);
  EXPECT_NE(ports[0].describe().find("mlx5_0 port 1: ACTIVE, InfiniBand, 4x HDR (200 Gb/s)"), std::string::npos)
      << ports[0].describe();

  EXPECT_EQ(ports[1].device, "mlx5_1");
  EXPECT_EQ(ports[2].port, 2);
  EXPECT_TRUE(ports[1].ethernet);
  EXPECT_EQ(ports[1].numaNode, 1);
  EXPECT_EQ(mtuBytes(ports[1].activeMtu), 1024);
  ASSERT_EQ(ports[1].gids.size(), 4u);
  // The RoCE v2 GID of the IPv4 address, as NCCL picks it.
  EXPECT_EQ(chooseGidIndex(ports[1].gids, AF_INET, -1), 3);
  EXPECT_TRUE(ports[1].gids[3].ipv4());
  EXPECT_EQ(ports[1].gids[3].type, GidType::RoCEv2);
  EXPECT_EQ(ports[1].gids[2].type, GidType::RoCEv1);
  EXPECT_EQ(chooseGidIndex(ports[1].gids, AF_INET, 2), 2) << "LOOM_IB_GID_INDEX forces";

  EXPECT_EQ(ports[3].device, "mlx5_2");
  EXPECT_FALSE(ports[3].active());
  EXPECT_EQ(ports[3].stateText(), "DOWN");
}

namespace {
int deviceListings = 0;  // calls of the counting library's ibv_get_device_list
ibv_device** countedList(int* n) {
  ++deviceListings;
  return V().getDeviceList(n);
}
ibv_device** noDevices(int* n) {
  ++deviceListings;
  *n = 0;
  errno = ENOSYS;
  return nullptr;
}
}  // namespace

// A communicator's set-up asks for the ports (OpenPort): the devices are listed on the first ask
// of the process, not on every one, and a machine without any says why every time.
TEST(VerbsProvider, DevicesAreListedOncePerProcess) {
  static Verbs counting = V();
  counting.getDeviceList = countedList;
  std::string why;
  const std::vector<PortInfo> first = knownPorts(counting, &why);
  ASSERT_EQ(first.size(), 4u) << why;
  EXPECT_EQ(deviceListings, 1);
  const std::vector<PortInfo> again = knownPorts(counting, &why);
  EXPECT_EQ(deviceListings, 1) << "listed again";
  ASSERT_EQ(again.size(), first.size());
  for (size_t i = 0; i < first.size(); ++i) EXPECT_EQ(again[i].describe(), first[i].describe());

  static Verbs none = V();
  none.getDeviceList = noDevices;
  deviceListings = 0;
  for (int i = 0; i < 3; ++i) {
    why.clear();
    EXPECT_TRUE(knownPorts(none, &why).empty());
    EXPECT_NE(why.find("ibv_get_device_list failed"), std::string::npos) << why;
    EXPECT_NE(why.find("no RDMA support"), std::string::npos) << why;
  }
  EXPECT_EQ(deviceListings, 1);
}

TEST(VerbsProvider, GidChoiceFollowsTheAddressFamilyAndFallsBack) {
  auto gid = [](int index, GidType type, std::vector<uint8_t> head) {
    GidInfo g;
    g.index = index;
    g.type = type;
    std::memcpy(g.raw, head.data(), head.size());
    return g;
  };
  const GidInfo v1ll = gid(0, GidType::RoCEv1, {0xfe, 0x80, 0, 0, 0, 0, 0, 0, 1});
  const GidInfo v2ll = gid(1, GidType::RoCEv2, {0xfe, 0x80, 0, 0, 0, 0, 0, 0, 1});
  const GidInfo v2v6 = gid(2, GidType::RoCEv2, {0x20, 0x01, 0x0d, 0xb8, 0, 0, 0, 0, 1});
  const GidInfo v2v4 = gid(3, GidType::RoCEv2, {0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0xff, 0xff, 10, 0, 0, 1});
  EXPECT_EQ(chooseGidIndex({v1ll, v2ll, v2v6, v2v4}, AF_INET, -1), 3);
  EXPECT_EQ(chooseGidIndex({v1ll, v2ll, v2v6, v2v4}, AF_INET6, -1), 2) << "link-local is skipped";
  EXPECT_EQ(chooseGidIndex({v1ll, v2ll}, AF_INET, -1), 1) << "any RoCE v2 before RoCE v1";
  EXPECT_EQ(chooseGidIndex({v1ll}, AF_INET, -1), 0);
  EXPECT_EQ(chooseGidIndex({}, AF_INET, -1), -1);
}

TEST(VerbsProvider, LinkSpeedsAsIbstatReportsThem) {
  EXPECT_EQ(linkSpeed(64, 2).gbps(), 200);   // 4x HDR
  EXPECT_EQ(linkSpeed(128, 2).gbps(), 400);  // 4x NDR
  EXPECT_EQ(linkSpeed(32, 2).gbps(), 100);   // 4x EDR
  EXPECT_EQ(linkSpeed(16, 1).gbps(), 14);    // 1x FDR
  EXPECT_EQ(linkSpeed(64, 16).lanes, 2);     // 2x
  EXPECT_EQ(linkSpeed(0, 2).gbps(), 0);
  EXPECT_EQ(mtuBytes(IBV_MTU_256), 256);
  EXPECT_EQ(mtuBytes(IBV_MTU_4096), 4096);
  EXPECT_EQ(mtuBytes(0), 0);
}

TEST(VerbsProvider, MemoryRegionsNeedMappedMemoryAndConsistentAccess) {
  Device d;
  std::vector<char> buf(4096);
  EXPECT_EQ(d.reg(buf.data(), buf.size(), IBV_ACCESS_REMOTE_WRITE), nullptr) << "remote write without local write";
  EXPECT_EQ(d.reg(nullptr, 64, IBV_ACCESS_LOCAL_WRITE), nullptr);
  EXPECT_EQ(d.reg(reinterpret_cast<void*>(0x1000), 4096, IBV_ACCESS_LOCAL_WRITE), nullptr) << "unmapped memory";
  ibv_mr* m = d.reg(buf.data(), buf.size(), kAllAccess);
  ASSERT_NE(m, nullptr);
  EXPECT_NE(m->lkey, m->rkey);
  EXPECT_EQ(V().deallocPd(d.pd), EBUSY) << "a domain with a region in it";
}

// The emulated device's memory: by pointer only where a peer-memory module would lend its pages
// (EFAULT otherwise, as a real adapter's), and through the dma-buf the device exports, at an I/O
// address of the caller's choosing that RDMA then names, landing where the file and offset say.
TEST(VerbsProvider, DeviceMemoryOnlyThroughItsDmabufOrAPeerMemoryModule) {
  Device d;
  loomtest::FakeDevice dev;
  constexpr size_t kBytes = 5 * 4096;
  auto* mem = static_cast<uint8_t*>(dev.alloc(kBytes));
  errno = 0;
  EXPECT_EQ(d.reg(mem, kBytes, kAllAccess), nullptr) << "device memory by pointer, with no peer-memory module";
  EXPECT_EQ(errno, EFAULT);
  const auto before = counters();
  {
    loomtest::EnvGuard module("LOOM_TEST_VERBS_PEERMEM", "1");
    EXPECT_NE(d.reg(mem + 100, 1000, kAllAccess), nullptr);
  }
  EXPECT_EQ(counters().device_registrations - before.device_registrations, 1u);

  ASSERT_NE(V().regDmabufMr, nullptr) << "the provider exports ibv_reg_dmabuf_mr";
  errno = 0;
  EXPECT_EQ(V().regDmabufMr(d.pd, 0, 4096, 0, -1, kAllAccess), nullptr);
  EXPECT_EQ(errno, EBADF) << "no file: the answer of a provider that imports dma-bufs";
  uint64_t offset = 0;
  std::string why;
  const int fd = dev.exportDmabuf(mem + 4096, 3 * 4096, &offset, &why);
  ASSERT_GE(fd, 0) << why;
  EXPECT_EQ(offset, 4096u);
  EXPECT_EQ(V().regDmabufMr(d.pd, offset, kBytes, 0x10000000, fd, kAllAccess), nullptr) << "past the file's end";
  int pipes[2];
  ASSERT_EQ(pipe(pipes), 0);
  EXPECT_EQ(V().regDmabufMr(d.pd, 0, 4096, 0x10000000, pipes[0], kAllAccess), nullptr) << "not a device's buffer";
  close(pipes[0]);
  close(pipes[1]);
  const uint64_t iova = 0x10000000;
  ibv_mr* m = V().regDmabufMr(d.pd, offset, 3 * 4096, iova, fd, kAllAccess);
  close(fd);  // the region keeps the buffer
  ASSERT_NE(m, nullptr) << std::strerror(errno);
  d.mrs.push_back(m);
  EXPECT_EQ(reinterpret_cast<uint64_t>(m->addr), iova);
  EXPECT_EQ(counters().dmabuf_registrations - before.dmabuf_registrations, 1u);

  ibv_qp* a = d.qp();
  ibv_qp* b = d.qp();
  connect(a, b, d.lid());
  std::vector<uint8_t> src(5000), back(5000);
  for (size_t i = 0; i < src.size(); ++i) src[i] = static_cast<uint8_t>(i * 11 + 3);
  ibv_mr* ms = d.reg(src.data(), src.size(), kAllAccess);
  ibv_mr* mb = d.reg(back.data(), back.size(), kAllAccess);
  // Written at I/O address iova + 10: byte 10 of the exported range, 4096 + 10 into the allocation.
  ASSERT_EQ(postSend(a, IBV_WR_RDMA_WRITE, src.data(), 5000, ms->lkey, 1, iova + 10, m->rkey), 0);
  auto wc = poll(d.cq, 1);
  ASSERT_EQ(wc.size(), 1u);
  EXPECT_EQ(wc[0].status, IBV_WC_SUCCESS) << V().wcStatusStr(wc[0].status);
  EXPECT_EQ(std::memcmp(mem + 4096 + 10, src.data(), 5000), 0);
  // Read back by RDMA, and used as a local source (lkey) of a write into host memory.
  ASSERT_EQ(postSend(a, IBV_WR_RDMA_READ, back.data(), 5000, mb->lkey, 2, iova + 10, m->rkey), 0);
  wc = poll(d.cq, 1);
  ASSERT_EQ(wc.size(), 1u);
  EXPECT_EQ(wc[0].status, IBV_WC_SUCCESS);
  EXPECT_EQ(back, src);
  std::fill(back.begin(), back.end(), 0);
  ibv_sge sge{iova + 10, 5000, m->lkey};
  ibv_send_wr wr{};
  wr.wr_id = 3;
  wr.sg_list = &sge;
  wr.num_sge = 1;
  wr.opcode = IBV_WR_RDMA_WRITE;
  wr.send_flags = IBV_SEND_SIGNALED;
  wr.wr.rdma.remote_addr = reinterpret_cast<uint64_t>(back.data());
  wr.wr.rdma.rkey = mb->rkey;
  ibv_send_wr* bad = nullptr;
  ASSERT_EQ(ibv_post_send(a, &wr, &bad), 0);
  wc = poll(d.cq, 1);
  ASSERT_EQ(wc.size(), 1u);
  EXPECT_EQ(wc[0].status, IBV_WC_SUCCESS);
  EXPECT_EQ(back, src);
  // Past the region's end (the range exported, not the allocation): a remote access error.
  ASSERT_EQ(postSend(a, IBV_WR_RDMA_WRITE, src.data(), 100, ms->lkey, 4, iova + 3 * 4096 - 50, m->rkey), 0);
  wc = poll(d.cq, 1);
  ASSERT_EQ(wc.size(), 1u);
  EXPECT_EQ(wc[0].status, IBV_WC_REM_ACCESS_ERR);
  for (auto* mr : d.mrs) V().deregMr(mr);  // before the device frees its memory
  d.mrs.clear();
  dev.free(mem);
}

TEST(VerbsProvider, QueuePairStateMachineWantsTheAttributesARealOneWants) {
  Device d;
  ibv_qp* q = d.qp();
  ASSERT_NE(q, nullptr);
  ibv_qp_attr a{};
  a.qp_state = IBV_QPS_INIT;
  a.port_num = 1;
  EXPECT_EQ(V().modifyQp(q, &a, IBV_QP_STATE | IBV_QP_PORT), EINVAL) << "INIT without pkey and access";
  a.port_num = 9;
  EXPECT_EQ(V().modifyQp(q, &a, IBV_QP_STATE | IBV_QP_PKEY_INDEX | IBV_QP_PORT | IBV_QP_ACCESS_FLAGS), EINVAL)
      << "no such port";
  EXPECT_EQ(toRtr(q, 1, d.lid()), EINVAL) << "RESET straight to RTR";
  ASSERT_EQ(toInit(q), 0);
  EXPECT_EQ(toRts(q), EINVAL) << "INIT straight to RTS";
  EXPECT_EQ(toRtr(q, 1, 0), EINVAL) << "InfiniBand with no LID";
  ibv_qp_attr big{};
  big.qp_state = IBV_QPS_RTR;
  big.path_mtu = static_cast<ibv_mtu>(7);
  EXPECT_EQ(V().modifyQp(q, &big,
                         IBV_QP_STATE | IBV_QP_AV | IBV_QP_PATH_MTU | IBV_QP_DEST_QPN | IBV_QP_RQ_PSN |
                             IBV_QP_MAX_DEST_RD_ATOMIC | IBV_QP_MIN_RNR_TIMER),
            EINVAL);
  char byte = 0;
  ibv_mr* m = d.reg(&byte, 1, kAllAccess);
  EXPECT_EQ(postSend(q, IBV_WR_SEND, &byte, 1, m->lkey, 1), EINVAL) << "send before RTS";
  ASSERT_EQ(toRtr(q, 1, d.lid()), 0);
  ASSERT_EQ(toRts(q), 0);
  ibv_qp_attr e{};
  e.qp_state = IBV_QPS_ERR;
  EXPECT_EQ(V().modifyQp(q, &e, IBV_QP_STATE | IBV_QP_TIMEOUT), EINVAL) << "to error takes the state alone";
  EXPECT_EQ(V().modifyQp(q, &e, IBV_QP_STATE), 0);
  EXPECT_EQ(q->state, IBV_QPS_ERR);
}

TEST(VerbsProvider, SendReceiveWriteWithImmediateAndRead) {
  Device d;
  ibv_qp* a = d.qp();
  ibv_qp* b = d.qp();
  connect(a, b, d.lid());
  std::vector<uint8_t> src(100000), dst(100000, 0), small(64), inbox(64);
  for (size_t i = 0; i < src.size(); ++i) src[i] = static_cast<uint8_t>(i * 7 + 1);
  ibv_mr* ms = d.reg(src.data(), src.size(), kAllAccess);
  ibv_mr* md = d.reg(dst.data(), dst.size(), kAllAccess);
  ibv_mr* mi = d.reg(inbox.data(), inbox.size(), kAllAccess);
  const auto before = counters();

  ASSERT_EQ(postRecv(b, inbox.data(), 64, mi->lkey, 10), 0);
  ASSERT_EQ(postSend(a, IBV_WR_SEND, src.data(), 64, ms->lkey, 1), 0);
  auto wc = poll(d.cq, 2);
  ASSERT_EQ(wc.size(), 2u);
  for (const auto& w : wc) EXPECT_EQ(w.status, IBV_WC_SUCCESS) << V().wcStatusStr(w.status);
  EXPECT_EQ(std::memcmp(inbox.data(), src.data(), 64), 0);

  // A zero-copy write into the advertised buffer, with immediate data for the receiver.
  ASSERT_EQ(postRecv(b, nullptr, 0, 0, 11), 0);
  ASSERT_EQ(postSend(a, IBV_WR_RDMA_WRITE_WITH_IMM, src.data(), 99999, ms->lkey, 2,
                     reinterpret_cast<uint64_t>(dst.data()) + 1, md->rkey, 0xabcd),
            0);
  wc = poll(d.cq, 2);
  ASSERT_EQ(wc.size(), 2u);
  bool sawRecv = false;
  for (const auto& w : wc) {
    EXPECT_EQ(w.status, IBV_WC_SUCCESS);
    if (w.wr_id == 11) {
      sawRecv = true;
      EXPECT_EQ(w.opcode, IBV_WC_RECV_RDMA_WITH_IMM);
      EXPECT_EQ(w.imm_data, 0xabcdu);
      EXPECT_EQ(w.byte_len, 99999u);
      EXPECT_TRUE(w.wc_flags & IBV_WC_WITH_IMM);
    }
  }
  EXPECT_TRUE(sawRecv);
  EXPECT_EQ(std::memcmp(dst.data() + 1, src.data(), 99999), 0);

  // A read back.
  std::vector<uint8_t> back(1000);
  ibv_mr* mb = d.reg(back.data(), back.size(), kAllAccess);
  ASSERT_EQ(postSend(a, IBV_WR_RDMA_READ, back.data(), 1000, mb->lkey, 3, reinterpret_cast<uint64_t>(dst.data()) + 1,
                     md->rkey),
            0);
  wc = poll(d.cq, 1);
  ASSERT_EQ(wc.size(), 1u);
  EXPECT_EQ(wc[0].status, IBV_WC_SUCCESS);
  EXPECT_EQ(wc[0].opcode, IBV_WC_RDMA_READ);
  EXPECT_EQ(std::memcmp(back.data(), src.data(), 1000), 0);

  const auto after = counters();
  EXPECT_EQ(after.write_bytes - before.write_bytes, 99999u);
  EXPECT_EQ(after.read_bytes - before.read_bytes, 1000u);
  EXPECT_EQ(after.writes_with_imm - before.writes_with_imm, 1u);
}

TEST(VerbsProvider, AWrongRemoteKeyOrBoundsIsARemoteAccessErrorOnBothSides) {
  Device d;
  std::vector<uint8_t> src(256), dst(256);
  ibv_mr* ms = d.reg(src.data(), src.size(), kAllAccess);
  ibv_mr* mdReadOnly = d.reg(dst.data(), dst.size(), IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_READ);
  struct Case {
    uint64_t addr;
    uint32_t rkey;
    const char* what;
  } cases[] = {
      {reinterpret_cast<uint64_t>(dst.data()), ms->rkey + 0x1000, "unknown key"},
      {reinterpret_cast<uint64_t>(dst.data()), mdReadOnly->rkey, "no remote write access"},
      {reinterpret_cast<uint64_t>(src.data()) + 200, ms->rkey, "past the region's end"},
  };
  for (const auto& c : cases) {
    ibv_qp* a = d.qp();
    ibv_qp* b = d.qp();
    connect(a, b, d.lid());
    ASSERT_EQ(postSend(a, IBV_WR_RDMA_WRITE, src.data(), 100, ms->lkey, 7, c.addr, c.rkey), 0);
    auto wc = poll(d.cq, 1);
    ASSERT_EQ(wc.size(), 1u) << c.what;
    EXPECT_EQ(wc[0].status, IBV_WC_REM_ACCESS_ERR) << c.what;
    EXPECT_EQ(a->state, IBV_QPS_ERR) << c.what;
    EXPECT_EQ(b->state, IBV_QPS_ERR) << c.what << ": the responder's queue pair goes to error too";
    ibv_async_event ev{};
    ASSERT_EQ(V().getAsyncEvent(d.ctx, &ev), 0);
    EXPECT_EQ(ev.event_type, IBV_EVENT_QP_ACCESS_ERR);
    EXPECT_EQ(ev.element.qp, b);
    V().ackAsyncEvent(&ev);
  }
  // A bad local key is the requester's own error.
  ibv_qp* a = d.qp();
  ibv_qp* b = d.qp();
  connect(a, b, d.lid());
  ASSERT_EQ(postSend(a, IBV_WR_RDMA_WRITE, src.data(), 100, ms->lkey + 0x1000, 8,
                     reinterpret_cast<uint64_t>(src.data()), ms->rkey),
            0);
  auto wc = poll(d.cq, 1);
  ASSERT_EQ(wc.size(), 1u);
  EXPECT_EQ(wc[0].status, IBV_WC_LOC_PROT_ERR);
}

TEST(VerbsProvider, ReceiverNotReadyRetriesThenFailsWhenTheCountRunsOut) {
  Device d;
  uint8_t byte = 1, in = 0;
  ibv_mr* m = d.reg(&byte, 1, kAllAccess);
  ibv_mr* mi = d.reg(&in, 1, kAllAccess);
  {
    ibv_qp* a = d.qp();
    ibv_qp* b = d.qp();
    connect(a, b, d.lid(), 7);  // 7: retry for ever
    ASSERT_EQ(postSend(a, IBV_WR_SEND, &byte, 1, m->lkey, 1), 0);
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
    ASSERT_EQ(postRecv(b, &in, 1, mi->lkey, 2), 0);  // late: the retried send lands
    auto wc = poll(d.cq, 2);
    ASSERT_EQ(wc.size(), 2u);
    for (const auto& w : wc) EXPECT_EQ(w.status, IBV_WC_SUCCESS);
    EXPECT_EQ(in, 1);
  }
  ibv_qp* a = d.qp();
  ibv_qp* b = d.qp();
  connect(a, b, d.lid(), 2);
  ASSERT_EQ(postSend(a, IBV_WR_SEND, &byte, 1, m->lkey, 3), 0);
  ASSERT_EQ(postSend(a, IBV_WR_SEND, &byte, 1, m->lkey, 4), 0);
  auto wc = poll(d.cq, 2);
  ASSERT_EQ(wc.size(), 2u);
  EXPECT_EQ(wc[0].status, IBV_WC_RNR_RETRY_EXC_ERR);
  EXPECT_EQ(wc[1].status, IBV_WC_WR_FLUSH_ERR) << "work behind a failed request is flushed, in order";
  EXPECT_EQ(a->state, IBV_QPS_ERR);
}

TEST(VerbsProvider, UnsignaledWorkHoldsItsSlotUntilASignaledOneCompletes) {
  Device d;
  ibv_qp* a = d.qp(4, 0);
  ibv_qp* b = d.qp();
  connect(a, b, d.lid());
  std::vector<uint8_t> buf(64);
  ibv_mr* m = d.reg(buf.data(), buf.size(), kAllAccess);
  const auto raddr = reinterpret_cast<uint64_t>(buf.data());
  for (int i = 0; i < 4; ++i)
    ASSERT_EQ(postSend(a, IBV_WR_RDMA_WRITE, buf.data(), 8, m->lkey, i, raddr, m->rkey, 0, 0), 0);
  std::this_thread::sleep_for(std::chrono::milliseconds(50));  // all four done, none signaled
  EXPECT_EQ(postSend(a, IBV_WR_RDMA_WRITE, buf.data(), 8, m->lkey, 9, raddr, m->rkey, 0, 0), ENOMEM)
      << "a full send queue, though its work is done: nothing signaled has freed it";
  ibv_qp* c = d.qp(4, 0);
  ibv_qp* e = d.qp();
  connect(c, e, d.lid());
  for (int i = 0; i < 3; ++i)
    ASSERT_EQ(postSend(c, IBV_WR_RDMA_WRITE, buf.data(), 8, m->lkey, i, raddr, m->rkey, 0, 0), 0);
  ASSERT_EQ(postSend(c, IBV_WR_RDMA_WRITE, buf.data(), 8, m->lkey, 3, raddr, m->rkey), 0);  // signaled
  ASSERT_EQ(poll(d.cq, 1).size(), 1u);
  for (int i = 0; i < 4; ++i)
    EXPECT_EQ(postSend(c, IBV_WR_RDMA_WRITE, buf.data(), 8, m->lkey, 10 + i, raddr, m->rkey, 0, 0), 0)
        << "the signaled completion freed every slot before it";
}

TEST(VerbsProvider, ACompletionChannelFiresOnlyForCompletionsAfterArming) {
  Device d;
  ibv_qp* a = d.qp();
  ibv_qp* b = d.qp();
  connect(a, b, d.lid());
  std::vector<uint8_t> buf(64);
  ibv_mr* m = d.reg(buf.data(), buf.size(), kAllAccess);
  const auto raddr = reinterpret_cast<uint64_t>(buf.data());
  ASSERT_EQ(postSend(a, IBV_WR_RDMA_WRITE, buf.data(), 8, m->lkey, 1, raddr, m->rkey), 0);
  ASSERT_EQ(poll(d.cq, 1).size(), 1u);
  fcntl(d.channel->fd, F_SETFL, fcntl(d.channel->fd, F_GETFL) | O_NONBLOCK);
  ibv_cq* cq = nullptr;
  void* ctx = nullptr;
  EXPECT_NE(V().getCqEvent(d.channel, &cq, &ctx), 0) << "an event without arming";
  ASSERT_EQ(ibv_req_notify_cq(d.cq, 0), 0);
  ASSERT_EQ(postSend(a, IBV_WR_RDMA_WRITE, buf.data(), 8, m->lkey, 2, raddr, m->rkey), 0);
  pollfd p{d.channel->fd, POLLIN, 0};
  ASSERT_EQ(::poll(&p, 1, 5000), 1) << "the channel's descriptor became readable";
  ASSERT_EQ(V().getCqEvent(d.channel, &cq, &ctx), 0);
  EXPECT_EQ(cq, d.cq);
  EXPECT_EQ(V().destroyCq(d.cq), EBUSY) << "an event not acknowledged";
  V().ackCqEvents(cq, 1);
  EXPECT_EQ(poll(d.cq, 1).size(), 1u);
}

// The other process of the test below (this binary run again with --verbs-child IN OUT): its queue
// pair receives one SEND and is written into, then it reports. A fresh process, as verbs wants
// (a forked child shares the parent's adapter state).
int childMain(int in, int out) {
  Device d;
  ibv_qp* q = d.qp();
  std::vector<uint8_t> inbox(32, 0), target(4096, 0);
  ibv_mr* mi = d.reg(inbox.data(), inbox.size(), kAllAccess);
  ibv_mr* mt = d.reg(target.data(), target.size(), kAllAccess);
  uint32_t mine[4] = {q->qp_num, d.lid(), mt->rkey, 0};
  uint64_t addr = reinterpret_cast<uint64_t>(target.data());
  if (toInit(q) != 0 || postRecv(q, inbox.data(), 32, mi->lkey, 1) != 0) return 6;  // RESET takes no receive
  if (write(out, mine, sizeof mine) != sizeof mine || write(out, &addr, sizeof addr) != sizeof addr) return 2;
  uint32_t theirs[2];
  if (read(in, theirs, sizeof theirs) != sizeof theirs) return 3;
  if (toRtr(q, theirs[0], static_cast<uint16_t>(theirs[1])) != 0 || toRts(q) != 0) return 4;
  auto wc = poll(d.cq, 1);
  bool ok = wc.size() == 1 && wc[0].status == IBV_WC_SUCCESS &&
            std::strcmp(reinterpret_cast<char*>(inbox.data()), "hello") == 0;
  char done = 0;
  if (read(in, &done, 1) != 1) return 5;
  for (size_t i = 0; i < target.size(); ++i) ok = ok && target[i] == static_cast<uint8_t>(i);
  return ok ? 0 : 1;
}

TEST(VerbsProvider, QueuePairsInTwoProcessesTalkOverTheWire) {
  int toChild[2], toParent[2];
  ASSERT_EQ(socketpair(AF_UNIX, SOCK_STREAM, 0, toChild), 0);
  ASSERT_EQ(socketpair(AF_UNIX, SOCK_STREAM, 0, toParent), 0);
  const pid_t pid = fork();
  ASSERT_GE(pid, 0);
  if (pid == 0) {
    const std::string in = std::to_string(toChild[0]), out = std::to_string(toParent[1]);
    execl("/proc/self/exe", "loom_ib_tests", "--verbs-child", in.c_str(), out.c_str(), static_cast<char*>(nullptr));
    _exit(127);
  }
  Device d;
  ibv_qp* q = d.qp();
  std::vector<uint8_t> src(4096);
  for (size_t i = 0; i < src.size(); ++i) src[i] = static_cast<uint8_t>(i);
  char hello[32] = "hello";
  ibv_mr* ms = d.reg(src.data(), src.size(), kAllAccess);
  ibv_mr* mh = d.reg(hello, sizeof hello, kAllAccess);
  uint32_t theirs[4];
  uint64_t addr = 0;
  ASSERT_EQ(read(toParent[0], theirs, sizeof theirs), static_cast<ssize_t>(sizeof theirs));
  ASSERT_EQ(read(toParent[0], &addr, sizeof addr), static_cast<ssize_t>(sizeof addr));
  EXPECT_EQ(theirs[1], d.lid()) << "one host, one device: one LID in every process";
  uint32_t mine[2] = {q->qp_num, d.lid()};
  ASSERT_EQ(toInit(q), 0);
  ASSERT_EQ(toRtr(q, theirs[0], static_cast<uint16_t>(theirs[1])), 0);
  ASSERT_EQ(toRts(q), 0);
  ASSERT_EQ(write(toChild[1], mine, sizeof mine), static_cast<ssize_t>(sizeof mine));
  ASSERT_EQ(postSend(q, IBV_WR_SEND, hello, sizeof hello, mh->lkey, 1), 0);
  ASSERT_EQ(postSend(q, IBV_WR_RDMA_WRITE, src.data(), 4096, ms->lkey, 2, addr, theirs[2]), 0);
  auto wc = poll(d.cq, 2);
  ASSERT_EQ(wc.size(), 2u);
  for (const auto& w : wc) EXPECT_EQ(w.status, IBV_WC_SUCCESS) << V().wcStatusStr(w.status);
  ASSERT_EQ(write(toChild[1], "x", 1), 1);
  int status = 0;
  waitpid(pid, &status, 0);
  EXPECT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 0) << "child status " << status;
}

}  // namespace
}  // namespace ib
}  // namespace loom

int main(int argc, char** argv) {
  if (argc == 4 && std::string(argv[1]) == "--verbs-child")
    return loom::ib::childMain(std::atoi(argv[2]), std::atoi(argv[3]));
  // The provider reads these at its first call: devices as a small cluster node has them, and a
  // state directory of this run's own.
  char dir[] = "/tmp/loom-verbs-test-XXXXXX";
  if (mkdtemp(dir) == nullptr) return 1;
  setenv("LOOM_TEST_VERBS_DIR", dir, 1);
  setenv("LOOM_TEST_VERBS_DEVICES", "mlx5_0:ib:1@0,mlx5_1:roce:2@1,mlx5_2:ib:1:down@0", 1);
  ::testing::InitGoogleTest(&argc, argv);
  const int rc = RUN_ALL_TESTS();
  std::string rm = std::string("rm -rf ") + dir;
  (void)!std::system(rm.c_str());
  return rc;
}
