// Devices, contexts and ports of the tests' verbs provider (provider.hpp).
//
// LOOM_TEST_VERBS_DEVICES lists the devices, comma-separated, each `name[:ib|roce[:ports[:down]]][@numa]`
// (default "mlx5_0": one InfiniBand port on NUMA node 0). An InfiniBand port gets a LID shared by
// every process of its host (network namespace), and a GID table of one entry; a RoCE port gets the
// table a RoCE v2 adapter shows (link-local and IPv4-mapped GIDs, each as RoCE v1 and v2) for this
// host's IPv4 address. The sysfs files Loom reads beside the verbs calls (NUMA node, GID types) are
// written under the state directory, where the device's ibdev_path points.
#include <arpa/inet.h>
#include <fcntl.h>
#include <ifaddrs.h>
#include <net/if.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <mutex>
#include <sstream>

#include "provider.hpp"

#undef ibv_query_port

namespace vp {
namespace {

void mkdirs(const std::string& path) {
  for (size_t i = 1; i <= path.size(); ++i)
    if (i == path.size() || path[i] == '/') mkdir(path.substr(0, i).c_str(), 0777);
}

void writeFile(const std::string& path, const std::string& text) {
  std::ofstream f(path);
  f << text << "\n";
}

std::string readFirstLine(const char* path) {
  std::ifstream f(path);
  std::string s;
  if (f) std::getline(f, s);
  return s;
}

}  // namespace

in_addr hostIpv4() {
  in_addr a{};
  if (const char* ip = std::getenv("LOOM_TEST_VERBS_IP"); ip != nullptr && inet_pton(AF_INET, ip, &a) == 1) return a;
  ifaddrs* list = nullptr;
  a.s_addr = htonl(INADDR_LOOPBACK);
  if (getifaddrs(&list) != 0) return a;
  for (ifaddrs* i = list; i != nullptr; i = i->ifa_next) {
    if (i->ifa_addr == nullptr || i->ifa_addr->sa_family != AF_INET) continue;
    if ((i->ifa_flags & IFF_UP) == 0 || (i->ifa_flags & IFF_LOOPBACK) != 0) continue;
    a = reinterpret_cast<sockaddr_in*>(i->ifa_addr)->sin_addr;
    break;
  }
  freeifaddrs(list);
  return a;
}

namespace {

Device* makeDevice(const std::string& spec, int index) {
  auto* d = new Device();
  std::memset(&d->dev, 0, sizeof d->dev);
  std::string body = spec;
  const size_t at = body.find('@');
  if (at != std::string::npos) {
    d->numaNode = std::atoi(body.c_str() + at + 1);
    body = body.substr(0, at);
  }
  std::vector<std::string> f;
  std::stringstream ss(body);
  for (std::string x; std::getline(ss, x, ':');) f.push_back(x);
  d->name = f.empty() ? "mlx5_0" : f[0];
  d->roce = f.size() > 1 && f[1] == "roce";
  const int nports = f.size() > 2 ? std::max(1, std::atoi(f[2].c_str())) : 1;
  const bool down = f.size() > 3 && f[3] == "down";
  d->ports.resize(static_cast<size_t>(nports));
  for (auto& p : d->ports) p.active = !down;
  d->guid = 0x0002c90300000000ULL + static_cast<uint64_t>(index + 1) * 0x100;
  std::snprintf(d->dev.name, sizeof d->dev.name, "%s", d->name.c_str());
  std::snprintf(d->dev.dev_name, sizeof d->dev.dev_name, "uverbs%d", index);
  std::snprintf(d->dev.dev_path, sizeof d->dev.dev_path, "/sys/class/infiniband_verbs/uverbs%d", index);
  d->dev.node_type = IBV_NODE_CA;
  d->dev.transport_type = IBV_TRANSPORT_IB;
  // The sysfs Loom reads, private to this process (its contents depend on the configuration only).
  const std::string sys = stateDir() + "/sys-" + std::to_string(getpid()) + "/" + d->name;
  mkdirs(sys + "/device");
  writeFile(sys + "/device/numa_node", std::to_string(d->numaNode));
  for (int p = 1; p <= nports; ++p) {
    const std::string types = sys + "/ports/" + std::to_string(p) + "/gid_attrs/types";
    mkdirs(types);
    const char* names[] = {"IB/RoCE v1", "RoCE v2", "IB/RoCE v1", "RoCE v2"};
    for (int i = 0; i < (d->roce ? 4 : 1); ++i) writeFile(types + "/" + std::to_string(i), names[i]);
  }
  std::snprintf(d->dev.ibdev_path, sizeof d->dev.ibdev_path, "%s", sys.c_str());
  return d;
}

// The GID at `index` of a port: [0] link-local from the GUID (IB, or RoCE v1), [1] the same as
// RoCE v2, [2] and [3] the host's IPv4 address mapped, as RoCE v1 and v2.
bool gidAt(const Device* d, int port, int index, ibv_gid* out, uint32_t* type) {
  const bool mapped = d->roce && (index == 2 || index == 3);
  if (index < 0 || index >= (d->roce ? 4 : 1)) return false;
  std::memset(out->raw, 0, 16);
  if (mapped) {
    std::memcpy(out->raw, d->ports[static_cast<size_t>(port - 1)].gid, 16);
  } else {
    out->raw[0] = 0xfe;
    out->raw[1] = 0x80;
    const uint64_t g = d->guid + static_cast<uint64_t>(port);
    for (int i = 0; i < 8; ++i) out->raw[8 + i] = static_cast<uint8_t>(g >> (56 - 8 * i));
  }
  *type = !d->roce ? IBV_GID_TYPE_IB : (index % 2 == 0 ? IBV_GID_TYPE_ROCE_V1 : IBV_GID_TYPE_ROCE_V2);
  return true;
}

}  // namespace

const std::string& stateDir() {
  static const std::string dir = [] {
    const char* env = std::getenv("LOOM_TEST_VERBS_DIR");
    std::string d = env != nullptr && *env != '\0' ? env : "/tmp/loom-test-verbs-" + std::to_string(getuid());
    mkdirs(d);
    return d;
  }();
  return dir;
}

const std::string& hostKey() {
  static const std::string key = [] {
    std::string boot = readFirstLine("/proc/sys/kernel/random/boot_id");
    char ns[128] = {0};
    ssize_t n = readlink("/proc/self/ns/net", ns, sizeof ns - 1);
    std::string k = boot + "/" + (n > 0 ? std::string(ns, static_cast<size_t>(n)) : "net");
    for (char& c : k)
      if (c == ' ' || c == '\n') c = '_';
    return k;
  }();
  return key;
}

std::vector<Device*>& devices() {
  // Never destroyed: callers may hold a device until the process ends.
  static std::vector<Device*>* list = [] {
    auto* v = new std::vector<Device*>();
    const char* env = std::getenv("LOOM_TEST_VERBS_DEVICES");
    std::stringstream ss(env != nullptr && *env != '\0' ? env : "mlx5_0");
    int index = 0;
    for (std::string item; std::getline(ss, item, ',');)
      if (!item.empty()) v->push_back(makeDevice(item, index++));
    return v;
  }();
  return *list;
}

void assignAddress(Device* d, int port) {
  // Once per port, under a lock: every thread that opens the device reads the address after its
  // own open, which took the lock after the first.
  static std::mutex mu;
  std::lock_guard<std::mutex> guard(mu);
  PortConfig& p = d->ports[static_cast<size_t>(port - 1)];
  if (p.assigned) return;
  p.assigned = true;
  if (d->roce) {
    const in_addr a = hostIpv4();
    std::memset(p.gid, 0, 16);
    p.gid[10] = 0xff;
    p.gid[11] = 0xff;
    std::memcpy(p.gid + 12, &a, 4);
    return;
  }
  if (p.lid != 0) return;
  // One LID per host, device and port, the same in every process of the host: the first process
  // to open the port takes the next free one.
  const std::string key = hostKey() + " " + d->name + " " + std::to_string(port);
  const int lock = open((stateDir() + "/lids.lock").c_str(), O_CREAT | O_RDWR | O_CLOEXEC, 0666);
  flock(lock, LOCK_EX);
  std::ifstream in(stateDir() + "/lids");
  int count = 0;
  for (std::string line; std::getline(in, line);) {
    ++count;
    const size_t sp = line.rfind(' ');
    if (sp != std::string::npos && line.substr(0, sp) == key)
      p.lid = static_cast<uint16_t>(std::atoi(line.c_str() + sp + 1));
  }
  if (p.lid == 0) {
    p.lid = static_cast<uint16_t>(count + 1);
    std::ofstream out(stateDir() + "/lids", std::ios::app);
    out << key << " " << p.lid << "\n";
  }
  flock(lock, LOCK_UN);
  close(lock);
}

void postAsyncEvent(Context* c, const ibv_async_event& event) {
  {
    std::lock_guard<std::mutex> lock(c->asyncMu);
    c->asyncEvents.push_back(event);
  }
  const char b = 1;
  (void)!write(c->asyncPipe[1], &b, 1);
}

}  // namespace vp

using vp::Context;
using vp::Device;

extern "C" {

ibv_device** ibv_get_device_list(int* num) {
  auto& list = vp::devices();
  auto** out = static_cast<ibv_device**>(std::calloc(list.size() + 1, sizeof(ibv_device*)));
  for (size_t i = 0; i < list.size(); ++i) out[i] = &list[i]->dev;
  if (num != nullptr) *num = static_cast<int>(list.size());
  return out;
}

void ibv_free_device_list(ibv_device** list) { std::free(list); }

const char* ibv_get_device_name(ibv_device* device) { return device->name; }

__be64 ibv_get_device_guid(ibv_device* device) { return htobe64(reinterpret_cast<Device*>(device)->guid); }

ibv_context* ibv_open_device(ibv_device* device) {
  auto* d = reinterpret_cast<Device*>(device);
  auto* c = new Context();
  std::memset(&c->ctx, 0, sizeof c->ctx);
  c->device = d;
  c->ctx.device = device;
  c->ctx.num_comp_vectors = 1;
  c->ctx.abi_compat = nullptr;  // not an extended context: verbs.h's inlines use the basic ops
  if (pipe2(c->asyncPipe, O_CLOEXEC) != 0) {
    delete c;
    return nullptr;
  }
  c->ctx.async_fd = c->asyncPipe[0];
  c->ctx.cmd_fd = open("/dev/null", O_RDONLY | O_CLOEXEC);
  pthread_mutex_init(&c->ctx.mutex, nullptr);
  c->ctx.ops.post_send = vp::postSend;
  c->ctx.ops.post_recv = vp::postRecv;
  c->ctx.ops.poll_cq = vp::pollCq;
  c->ctx.ops.req_notify_cq = vp::reqNotifyCq;
  for (int p = 1; p <= static_cast<int>(d->ports.size()); ++p) vp::assignAddress(d, p);
  return &c->ctx;
}

int ibv_close_device(ibv_context* context) {
  auto* c = reinterpret_cast<Context*>(context);
  close(c->asyncPipe[0]);
  close(c->asyncPipe[1]);
  close(c->ctx.cmd_fd);
  delete c;
  return 0;
}

int ibv_query_device(ibv_context* context, ibv_device_attr* attr) {
  const Device* d = reinterpret_cast<Context*>(context)->device;
  std::memset(attr, 0, sizeof *attr);
  std::snprintf(attr->fw_ver, sizeof attr->fw_ver, "loom-test-verbs 1");
  attr->node_guid = htobe64(d->guid);
  attr->sys_image_guid = htobe64(d->guid);
  attr->max_mr_size = ~0ULL;
  attr->page_size_cap = 0xfffff000;
  attr->vendor_id = 0x1234;
  attr->vendor_part_id = 1;
  attr->max_qp = 1 << 17;
  attr->max_qp_wr = 1 << 15;
  attr->device_cap_flags = IBV_DEVICE_RC_RNR_NAK_GEN;
  attr->max_sge = 30;
  attr->max_cq = 1 << 16;
  attr->max_cqe = (1 << 22) - 1;
  attr->max_mr = 1 << 20;
  attr->max_pd = 1 << 16;
  attr->max_qp_rd_atom = 16;
  attr->max_qp_init_rd_atom = 16;
  attr->max_pkeys = 128;
  attr->phys_port_cnt = static_cast<uint8_t>(d->ports.size());
  return 0;
}

// Declared by verbs.h with its compatibility type; callers (Loom's loader) pass a whole
// ibv_port_attr, as the library's own inline wrapper does.
int ibv_query_port(ibv_context* context, uint8_t port, _compat_ibv_port_attr* compat) {
  auto* attr = reinterpret_cast<ibv_port_attr*>(compat);
  const Device* d = reinterpret_cast<Context*>(context)->device;
  if (port < 1 || port > d->ports.size()) return EINVAL;
  const vp::PortConfig& p = d->ports[port - 1u];
  std::memset(attr, 0, sizeof *attr);
  attr->state = p.active ? IBV_PORT_ACTIVE : IBV_PORT_DOWN;
  attr->phys_state = p.active ? 5 : 3;  // LinkUp, Disabled
  attr->max_mtu = IBV_MTU_4096;
  attr->active_mtu = d->roce ? IBV_MTU_1024 : IBV_MTU_4096;  // RoCE on a 1500-byte Ethernet MTU
  attr->gid_tbl_len = d->roce ? 4 : 1;
  attr->max_msg_sz = 1u << 30;
  attr->pkey_tbl_len = 128;
  attr->lid = d->roce ? 0 : p.lid;
  attr->sm_lid = d->roce ? 0 : 1;
  attr->active_width = 2;                  // 4x
  attr->active_speed = d->roce ? 32 : 64;  // 4x EDR-rate lanes (100 GbE), HDR
  attr->link_layer = d->roce ? IBV_LINK_LAYER_ETHERNET : IBV_LINK_LAYER_INFINIBAND;
  return 0;
}

int ibv_query_gid(ibv_context* context, uint8_t port, int index, ibv_gid* gid) {
  const Device* d = reinterpret_cast<Context*>(context)->device;
  uint32_t type = 0;
  if (port < 1 || port > d->ports.size() || !vp::gidAt(d, port, index, gid, &type)) return EINVAL;
  return 0;
}

int _ibv_query_gid_ex(ibv_context* context, uint32_t port, uint32_t index, ibv_gid_entry* entry, uint32_t flags,
                      size_t size) {
  const Device* d = reinterpret_cast<Context*>(context)->device;
  if (flags != 0 || size < sizeof(ibv_gid_entry)) return EINVAL;
  if (port < 1 || port > d->ports.size()) return EINVAL;
  uint32_t type = 0;
  if (!vp::gidAt(d, static_cast<int>(port), static_cast<int>(index), &entry->gid, &type)) return ENODATA;
  entry->gid_index = index;
  entry->port_num = port;
  entry->gid_type = type;
  entry->ndev_ifindex = 0;
  return 0;
}

}  // extern "C"
