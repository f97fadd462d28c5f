// loom-info: what Loom sees on this host.
//   loom-info          version, build features, network interfaces, transports
//   loom-info --env    the launch detected from the environment (and where each value came
//                      from), and every LOOM_* tunable with its current value
//   loom-info --env --markdown
//                      docs/settings.md: every setting with its default and meaning
//   loom-info --algos  the cost model's algorithm per size and world size
//   loom-info --links  inside a job: the transport chosen for every pair of ranks
//   loom-info --dump [--pid PID] [--comm N]
//                      a live job's flight records and hang report: asks every rank through the
//                      job's rendezvous store (ranks waiting in Loom answer within a second) and
//                      prints what each did last; the job is found from this environment or from
//                      rank process PID's (same host)
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <map>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "bootstrap/auth.hpp"
#include "bootstrap/launcher_env.hpp"
#include "bootstrap/tcp_store.hpp"
#include "collectives/select.hpp"
#include "comm/flight_recorder.hpp"
#include "core/param.hpp"
#include "core/signature.hpp"
#include "core/topology.hpp"
#include "device/runtime.hpp"
#include "kernels/reduce.hpp"
#include "loom/loom.h"
#include "loom/loom.hpp"
#include "loom_config.h"
#if LOOM_HAVE_IBVERBS
#include "transport/ib/gpu_direct.hpp"
#include "transport/ib/ib_device.hpp"
#include "transport/ib/ib_select.hpp"
#include "transport/ib/open_port.hpp"
#include "transport/ib/verbs.hpp"
#endif
#include "net/interfaces.hpp"
#include "settings_doc.hpp"
#include "transport/memory_monitor.hpp"
#include "transport/registry.hpp"
#include "transport/shm/shm_transport.hpp"
#include "transport/tcp/tcp_transport.hpp"

namespace {

void printEnv() {
  std::printf("Launch detected from the environment:\n");
  try {
    loom::LaunchInfo info = loom::detectLaunch(loom::processEnv());
    std::printf("  launcher           %s\n", info.launcher.c_str());
    for (const auto& [field, value] : info.provenance) std::printf("  %-18s %s\n", field.c_str(), value.c_str());
  } catch (const loom::Error& e) {
    std::printf("  none: %s\n", e.message().c_str());
  }
  std::printf("\nTunables (environment variable, current value, default, meaning):\n");
  for (const auto& p : loom::allParams()) {
    const char* v = std::getenv(p.env);
    std::printf("  %-28s %-12s default %-8s %s\n", p.env, v != nullptr ? v : "(unset)",
                p.defaultText.empty() ? "\"\"" : p.defaultText.c_str(), p.help);
  }
}

const char* whereRuns(loom::coll::Needs n) {
  switch (n) {
    case loom::coll::Needs::Links:
      return "anywhere";
    case loom::coll::Needs::OneNodeArena:
      return "one node";
    case loom::coll::Needs::SeveralNodes:
      return "nodes";
    case loom::coll::Needs::CanonicalNodes:
      return "even nodes";
  }
  return "?";
}

void printAlgos() {
  using loom::coll::Coll;
  std::printf(
      "The algorithms (LOOM_ALGO takes a name, or collective:name; rows marked (reproducible) serve\n"
      "reproducible mode's float reductions and are not forced)\n\n");
  std::printf("%-15s %-15s %-26s %-10s %s\n", "collective", "name", "also", "runs", "what");
  for (const auto& row : loom::coll::algorithmTable()) {
    std::printf("%-15s %-15s %-26s %-10s %s%s\n", loom::coll::collName(row.coll), row.name, row.aliases,
                whereRuns(row.needs), row.mode == loom::coll::Mode::Reproducible ? "(reproducible) " : "", row.why);
  }
  const auto model = loom::coll::costModelFor(loom::tcp::TcpTransport::linkProperties());
  const std::string forced = loom::coll::algoOverrideFromEnv();
  std::printf("\nAlgorithm chosen per collective, message size (whole buffer) and world size, flat\n");
  std::printf(
      "(cost model: %.0f us per message, %.2f GB/s per link, reduction %.1f GB/s, %zu-byte ring chunks, %zu-byte chain "
      "chunks, %zu-byte tree chunks; LOOM_ALGO=\"%s\")\n\n",
      model.latencyUs, model.gbps, model.reduceGbps, model.chunkBytes, model.pipeChunkBytes, model.treeChunkBytes,
      forced.c_str());
  const int ranks[] = {2, 3, 4, 8, 16, 32, 64, 256};
  const size_t sizes[] = {8, 1024, 64 * 1024, 256 * 1024, 1 << 20, 4 << 20, 16 << 20, 256 << 20};
  const char* sizeNames[] = {"8B", "1K", "64K", "256K", "1M", "4M", "16M", "256M"};
  for (int i = 0; i < loom::coll::kCollCount; ++i) {
    const auto c = static_cast<Coll>(i);
    if (c == Coll::Barrier) continue;  // moves no bytes: its rows above say it all
    std::printf("%-15s", loom::coll::collName(c));
    for (const char* s : sizeNames) std::printf(" %7s", s);
    std::printf("\n");
    for (int n : ranks) {
      std::printf("  %3d ranks    ", n);
      for (size_t b : sizes) std::printf(" %7s", loom::coll::algoName(loom::coll::selectAlgo(c, b, n, model, forced)));
      std::printf("\n");
    }
  }
}

// Every InfiniBand / RoCE port the verbs library reports, as the ib transport would see it.
void printRdmaDevices() {
#if LOOM_HAVE_IBVERBS
  std::string why;
  const loom::ib::Verbs* v = loom::ib::verbs(&why);
  if (v == nullptr) {
    std::printf("RDMA devices: none (%s)\n", why.c_str());
    return;
  }
  const auto ports = loom::ib::listPorts(*v, &why);
  if (ports.empty()) {
    std::printf("RDMA devices (%s): none (%s)\n", loom::ib::verbsLibrary().c_str(), why.c_str());
    return;
  }
  std::printf("RDMA devices (%s):\n", loom::ib::verbsLibrary().c_str());
  for (const auto& p : ports) std::printf("  %s\n", p.describe().c_str());
  // Device buffers over the port a rank of this process would open.
  try {
    auto port = loom::ib::OpenPort::open(
        *v, loom::ib::ibSettingsFromEnv(), [] { return loom::ib::callerLocality(0); }, &why);
    if (!port) {
      std::printf("GPUDirect RDMA: not looked for (%s)\n", why.c_str());
      return;
    }
    const loom::ib::GpuDirectChoice g = loom::ib::chooseGpuDirect(port->context());
    if (g.mode == loom::ib::GpuDirectMode::Off)
      std::printf("GPUDirect RDMA: not used (%s); device send/recv is staged through host memory\n", g.why.c_str());
    else
      std::printf("GPUDirect RDMA on %s: through %s (%s); device send/recv moves in place\n", port->describe().c_str(),
                  loom::ib::toString(g.mode), g.why.c_str());
  } catch (const loom::Error& e) {
    std::printf("GPUDirect RDMA: not looked for (%s)\n", e.what());
  }
#else
  std::printf("RDMA devices: not looked for (built without the verbs headers, libibverbs-dev)\n");
#endif
}

void printInfo() {
  std::printf("Loom %s (public headers %s)\n", loomGetBuildId(), loomGetHeadersDigest());
  std::printf("CPU reduction kernels: %s (chosen at run time)\n", loom::kernels::isaName());
  std::printf("Build features: CUDA %s, InfiniBand verbs %s, hwloc %s\n", LOOM_HAVE_CUDA ? "toolkit found" : "no",
              LOOM_HAVE_IBVERBS ? "library found" : "no", LOOM_HAVE_HWLOC ? "library found" : "no");
  if (loom::device::DeviceRuntime* rt = loom::device::startRuntime()) {
    std::printf(
        "Device buffers: %d CUDA device(s); collectives among the ranks of one node through CUDA IPC (transport "
        "cuda_ipc; several ranks may share a GPU), across nodes staged through pinned host memory (send/recv over ib "
        "in "
        "place where GPUDirect RDMA is: below); streams held by "
        "%s\n",
        rt->deviceCount(), rt->waitMechanism().c_str());
  } else {
    std::printf("Device buffers: unavailable (%s)\n", loom::device::unavailableReason().c_str());
  }
  std::printf("Transports compiled in, in preference order:");
  for (const auto& t : loom::allTransports()) std::printf(" %s", t.name);
  std::printf("\n");
  // What a transport that registers memory (pins it for a NIC) may do with registrations.
  if (loom::MemoryMonitor::get() != nullptr) {
    std::printf("Memory registrations: cached for reuse; libc's unmapping calls are watched (LOOM_MEMORY_HOOKS)\n");
  } else {
    std::printf("Memory registrations: kept only while in use (%s)\n", loom::MemoryMonitor::reason().c_str());
  }
  printRdmaDevices();
  std::printf("Interfaces for TCP (LOOM_SOCKET_IFNAME / LOOM_SOCKET_FAMILY):\n");
  try {
    for (const auto& i : loom::selectedInterfaces()) std::printf("  %-10s %s\n", i.name.c_str(), i.addr.host().c_str());
  } catch (const loom::Error& e) {
    std::printf("  none: %s\n", e.message().c_str());
  }
  const loom::HostIdentity id = loom::localHostIdentity();
  std::printf("Host identity (ranks with the same one share memory): %s\n", id.describe().c_str());
  std::printf("Topology: %s", loom::describeTopology(loom::discoverTopology()).c_str());
}

}  // namespace

// Joins a job (loomrun -n N loom-info --links, or under srun / mpirun / torchrun) and prints, on
// rank 0, the transport each pair of ranks got and each rank's link descriptions.
int printLinks() {
  loom::Communicator c = loom::Communicator::fromEnv();
  const int n = c.size(), me = c.rank();
  // Every rank's view of its links: one code per peer (0 self, 1 shm, 2 tcp, 3 other).
  std::vector<int32_t> mine(static_cast<size_t>(n)), all(static_cast<size_t>(n) * static_cast<size_t>(n));
  for (int p = 0; p < n; ++p) {
    const std::string t = c.transportOf(p);
    mine[static_cast<size_t>(p)] = t == "self" ? 0 : t == "shm" ? 1 : t == "tcp" ? 2 : 3;
  }
  c.allGather(mine.data(), all.data(), mine.size(), loom::DataType::Int32);
  // The links each rank holds now (TCP links are made on first use: those this all-gather used).
  const int32_t held = c.linkCount();
  std::vector<int32_t> heldBy(static_cast<size_t>(n));
  c.allGather(&held, heldBy.data(), 1, loom::DataType::Int32);
  if (me == 0) {
    const char* names[] = {"-", "shm", "tcp", "?"};
    std::printf("# transports of %d ranks on %d node(s): row = rank, column = peer\n%6s", n, c.nodeCount(), "");
    for (int p = 0; p < n; ++p) std::printf(" %4d", p);
    std::printf("\n");
    for (int r = 0; r < n; ++r) {
      std::printf("%4d n%d", r, c.nodeOf(r));
      for (int p = 0; p < n; ++p) std::printf(" %4s", names[all[static_cast<size_t>(r * n + p)]]);
      std::printf("\n");
    }
    std::printf("# links held after two all-gathers (TCP's are made on first use; LOOM_CONNECT=eager: all at init):");
    for (int r = 0; r < n; ++r) std::printf(" %d", heldBy[static_cast<size_t>(r)]);
    std::printf("\n# rank 0's links:\n");
    for (int p = 1; p < n; ++p) std::printf("  %s\n", c.describeLink(p).c_str());
  }
  c.barrier();
  return 0;
}

// The environment of process `pid` (/proc/PID/environ), as an EnvLookup.
loom::EnvLookup environOf(int pid) {
  auto vars = std::make_shared<std::map<std::string, std::string>>();
  std::ifstream in("/proc/" + std::to_string(pid) + "/environ", std::ios::binary);
  if (!in) throw loom::Error(loom::ErrorCode::InvalidArgument, "cannot read /proc/" + std::to_string(pid) + "/environ");
  std::string item;
  while (std::getline(in, item, '\0')) {
    const size_t eq = item.find('=');
    if (eq != std::string::npos) (*vars)[item.substr(0, eq)] = item.substr(eq + 1);
  }
  return [vars](const char* name) -> const char* {
    auto it = vars->find(name);
    return it == vars->end() ? nullptr : it->second.c_str();
  };
}

// Asks a live job for its ranks' flight records and prints them with the hang report.
int printDump(int pid, int comm) {
  const loom::LaunchInfo info = loom::detectLaunch(pid > 0 ? environOf(pid) : loom::processEnv());
  auto base =
      std::make_shared<loom::TcpStoreClient>(info.masterAddr, info.masterPort, loom::deriveJobKey(info.jobKeySeed), -1,
                                             loom::Deadline(std::chrono::seconds(10)), std::chrono::seconds(10));
  loom::PrefixStore store("env-" + std::to_string(comm), base);
  const int64_t request = store.add(loom::kDumpRequestKey, 1);
  std::map<int, std::vector<loom::FlightEntry>> records;
  for (int tries = 0; tries < 30 && static_cast<int>(records.size()) < info.size; ++tries) {
    for (int r = 0; r < info.size; ++r) {
      if (records.count(r) != 0) continue;
      if (auto v = store.tryGet(loom::flightKey(r))) {
        if (auto entries = loom::readPublishedFlight(std::string(v->begin(), v->end()), request))
          records[r] = std::move(*entries);
      }
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
  }
  std::printf("# flight records of %zu of %d ranks (job at %s:%d, communicator %d)\n", records.size(), info.size,
              info.masterAddr.c_str(), info.masterPort, comm);
  std::map<int64_t, int> running;
  for (const auto& [r, entries] : records) {
    std::printf("rank %d:\n", r);
    std::printf("%s", loom::formatFlight(entries, 8).c_str());
    for (const auto& e : entries)
      if (e.state == loom::FlightEntry::State::Running) ++running[e.seq];
  }
  if (running.empty()) {
    std::printf("# no rank that answered is inside a collective; ranks that did not answer are not waiting in Loom\n");
  } else {
    int64_t seq = running.begin()->first;
    for (const auto& [s, n] : running)
      if (n > running[seq]) seq = s;
    std::printf("%s\n", loom::hangReport(info.size, records, seq).c_str());
  }
  return 0;
}

int main(int argc, char** argv) {
  if (argc > 1 && (std::strcmp(argv[1], "-h") == 0 || std::strcmp(argv[1], "--help") == 0)) {
    std::printf(
        "usage: loom-info [--env [--markdown] | --algos | --links | --dump [--pid PID] [--comm N]]\n"
        "  (no argument)  this host: identity, NUMA nodes, cores, NICs, GPUs, transports built in\n"
        "  --env          the launch detected from the environment, and every LOOM_ setting\n"
        "  --env --markdown  every setting as docs/settings.md (generated, checked in CI)\n"
        "  --algos        the algorithm the cost model picks per size and world size\n"
        "  --links        inside a job (loomrun -n 4 loom-info --links): the transport of every pair\n"
        "  --dump         a live job's flight records and hang report, found from this environment or\n"
        "                 from rank process PID's (--pid); --comm N: the job's N-th communicator (0)\n");
    return 0;
  }
  if (argc > 1 && std::strcmp(argv[1], "--env") == 0) {
    if (argc > 2 && std::strcmp(argv[2], "--markdown") == 0) {
      std::fputs(loom::tools::settingsMarkdown(loom::allParams()).c_str(), stdout);
      return 0;
    }
    printEnv();
    return 0;
  }
  if (argc > 1 && std::strcmp(argv[1], "--algos") == 0) {
    printAlgos();
    return 0;
  }
  if (argc > 1 && std::strcmp(argv[1], "--links") == 0) {
    try {
      return printLinks();
    } catch (const loom::Error& e) {
      std::fprintf(stderr, "loom-info --links: %s\n", e.what());
      return 1;
    }
  }
  if (argc > 1 && std::strcmp(argv[1], "--dump") == 0) {
    int pid = 0, comm = 0;
    for (int a = 2; a + 1 < argc; a += 2) {
      if (std::strcmp(argv[a], "--pid") == 0) pid = std::atoi(argv[a + 1]);
      if (std::strcmp(argv[a], "--comm") == 0) comm = std::atoi(argv[a + 1]);
    }
    try {
      return printDump(pid, comm);
    } catch (const loom::Error& e) {
      std::fprintf(stderr, "loom-info --dump: %s\n", e.what());
      return 1;
    }
  }
  if (argc > 1) {
    std::fprintf(stderr, "loom-info: unknown argument %s (try --help)\n", argv[1]);
    return 2;
  }
  printInfo();
  return 0;
}
