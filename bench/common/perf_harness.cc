#include "perf_harness.hpp"

#include <getopt.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

#include "anchors.hpp"
#include "device/runtime.hpp"
#include "kernels/reduce.hpp"
#include "loom/loom.hpp"
#include "results.hpp"

namespace loom {
namespace bench {
namespace {

using Clock = std::chrono::steady_clock;

struct Options {
  size_t minBytes = 32 * 1024 * 1024, maxBytes = 32 * 1024 * 1024;
  double factor = 1;
  size_t increment = 0;
  int iters = 20, warmup = 5, check = 1, root = 0;
  std::vector<DataType> types{DataType::Float32};
  std::vector<ReduceOp> ops{ReduceOp::Sum};
  std::string csv, json, linkRate;
  bool device = false;  // -G / --device cuda: buffers in the local GPU's memory, on a stream
};

const char* kTypeNames[] = {"int8",   "uint8", "int32", "uint32", "int64",
                            "uint64", "half",  "float", "double", "bfloat16"};

size_t parseSize(const char* s) {
  char* end = nullptr;
  double v = std::strtod(s, &end);
  switch (*end) {
    case 'K':
    case 'k':
      v *= 1024;
      break;
    case 'M':
    case 'm':
      v *= 1024 * 1024;
      break;
    case 'G':
    case 'g':
      v *= 1024.0 * 1024 * 1024;
      break;
    default:
      break;
  }
  return static_cast<size_t>(v);
}

[[noreturn]] void usage(int code) {
  std::printf(
      "usage: *_perf [-b minbytes] [-e maxbytes] [-f stepfactor | -i stepbytes] [-n iters] [-w warmup]\n"
      "              [-c 0|1] [-o sum|prod|max|min|avg|all] [-d type|all] [-r root]\n"
      "              [--csv FILE] [--json FILE] [--link-rate RATE] [-G 0|1 | --device host|cuda]\n"
      "  -G 1 / --device cuda: buffers in GPU memory (the GPU of the rank's local rank), collectives ordered on a\n"
      "  CUDA stream, timed to the stream's completion, as nccl-tests do\n"
      "  --link-rate: the network's rate (10gbit, 400mbit) for the summary line; else LOOM_LINK_RATE, else the\n"
      "  speed of the interface Loom uses, when the kernel knows it\n"
      "  sizes take K, M, G suffixes; types: int8 uint8 int32 uint32 int64 uint64 half float double bfloat16\n"
      "  launch with loomrun -n N, srun, mpirun or torchrun\n");
  std::exit(code);
}

Options parse(int argc, char** argv) {
  Options o;
  static option longOpts[] = {{"csv", required_argument, nullptr, 'C'},
                              {"json", required_argument, nullptr, 'J'},
                              {"link-rate", required_argument, nullptr, 'L'},
                              {"device", required_argument, nullptr, 'D'},
                              {"help", no_argument, nullptr, 'h'},
                              {nullptr, 0, nullptr, 0}};
  int c;
  while ((c = getopt_long(argc, argv, "b:e:f:i:n:w:c:o:d:r:G:h", longOpts, nullptr)) != -1) {
    switch (c) {
      case 'b':
        o.minBytes = parseSize(optarg);
        break;
      case 'e':
        o.maxBytes = parseSize(optarg);
        break;
      case 'f':
        o.factor = std::atof(optarg);
        break;
      case 'i':
        o.increment = parseSize(optarg);
        break;
      case 'n':
        o.iters = std::max(1, std::atoi(optarg));
        break;
      case 'w':
        o.warmup = std::max(0, std::atoi(optarg));
        break;
      case 'c':
        o.check = std::atoi(optarg);
        break;
      case 'r':
        o.root = std::atoi(optarg);
        break;
      case 'C':
        o.csv = optarg;
        break;
      case 'G':
        o.device = std::atoi(optarg) != 0;
        break;
      case 'D':
        if (std::string(optarg) != "host" && std::string(optarg) != "cuda") usage(2);
        o.device = std::string(optarg) == "cuda";
        break;
      case 'J':
        o.json = optarg;
        break;
      case 'L':
        o.linkRate = optarg;
        if (parseRateGbit(o.linkRate) <= 0) usage(2);
        break;
      case 'o': {
        std::string s = optarg;
        o.ops.clear();
        const char* names[] = {"sum", "prod", "max", "min", "avg"};
        for (int k = 0; k < 5; ++k)
          if (s == "all" || s == names[k]) o.ops.push_back(static_cast<ReduceOp>(k));
        if (o.ops.empty()) usage(2);
        break;
      }
      case 'd': {
        std::string s = optarg;
        o.types.clear();
        for (int k = 0; k < 10; ++k)
          if (s == "all" || s == kTypeNames[k] || s == toString(static_cast<DataType>(k)))
            o.types.push_back(static_cast<DataType>(k));
        if (o.types.empty()) usage(2);
        break;
      }
      case 'h':
        usage(0);
      default:
        usage(2);
    }
  }
  if (o.maxBytes < o.minBytes) o.maxBytes = o.minBytes;
  return o;
}

std::string strFactor(double f) {
  char buf[32];
  std::snprintf(buf, sizeof(buf), "%g", f);
  return buf;
}

bool hasOp(Kind k) { return k == Kind::AllReduce || k == Kind::Reduce || k == Kind::ReduceScatter; }
bool hasRoot(Kind k) { return k == Kind::Broadcast || k == Kind::Reduce || k == Kind::Gather || k == Kind::Scatter; }
// Whether a "size" is the whole buffer of n blocks (nccl-tests: size is the largest buffer).
bool ofBlocks(Kind k) {
  return k == Kind::AllGather || k == Kind::ReduceScatter || k == Kind::AllToAll || k == Kind::Gather ||
         k == Kind::Scatter;
}
// The collective's name for Communicator::algorithmFor; null for send/recv (no algorithm).
const char* collectiveOf(Kind k) {
  switch (k) {
    case Kind::AllReduce:
      return "all_reduce";
    case Kind::Broadcast:
      return "broadcast";
    case Kind::Reduce:
      return "reduce";
    case Kind::AllGather:
      return "all_gather";
    case Kind::ReduceScatter:
      return "reduce_scatter";
    case Kind::AllToAll:
      return "all_to_all";
    case Kind::Gather:
      return "gather";
    case Kind::Scatter:
      return "scatter";
    case Kind::SendRecv:
      return nullptr;
  }
  return nullptr;
}
const char* title(Kind k) {
  switch (k) {
    case Kind::AllReduce:
      return "all_reduce_perf";
    case Kind::Broadcast:
      return "broadcast_perf";
    case Kind::Reduce:
      return "reduce_perf";
    case Kind::AllGather:
      return "all_gather_perf";
    case Kind::ReduceScatter:
      return "reduce_scatter_perf";
    case Kind::AllToAll:
      return "alltoall_perf";
    case Kind::Gather:
      return "gather_perf";
    case Kind::Scatter:
      return "scatter_perf";
    case Kind::SendRecv:
      return "sendrecv_perf";
  }
  return "?";
}
double busFactor(Kind k, int n) {
  switch (k) {
    case Kind::AllReduce:
      return 2.0 * (n - 1) / n;
    case Kind::AllGather:
    case Kind::ReduceScatter:
    case Kind::AllToAll:
    case Kind::Gather:
    case Kind::Scatter:
      return static_cast<double>(n - 1) / n;
    default:
      return 1.0;
  }
}
// Elements per rank block for a "size" in bytes (nccl-tests: size is the largest buffer).
size_t countFor(Kind k, size_t bytes, size_t elem, int n) {
  size_t c = bytes / elem;
  if (ofBlocks(k)) c /= static_cast<size_t>(n);
  return c;
}
bool isSignedType(DataType t) { return !(t == DataType::Uint8 || t == DataType::Uint32 || t == DataType::Uint64); }

// Input of rank r at global index i: small integers, so every reduction order gives the same bits.
double inputValue(int r, size_t i, DataType t, ReduceOp op) {
  const long k = static_cast<long>(i % 4099);
  if (op == ReduceOp::Prod) return ((r + k) % 5 == 0) ? 2 : 1;
  if (op == ReduceOp::Max || op == ReduceOp::Min)
    return isSignedType(t) ? (r * 13 + k * 7) % 31 - 15 : (r * 13 + k * 7) % 31;
  return isSignedType(t) ? (r + k) % 5 - 2 : (r + k) % 5;
}

void put(void* b, size_t i, DataType t, double v) {
  switch (t) {
    case DataType::Int8:
      static_cast<int8_t*>(b)[i] = static_cast<int8_t>(v);
      break;
    case DataType::Uint8:
      static_cast<uint8_t*>(b)[i] = static_cast<uint8_t>(v);
      break;
    case DataType::Int32:
      static_cast<int32_t*>(b)[i] = static_cast<int32_t>(v);
      break;
    case DataType::Uint32:
      static_cast<uint32_t*>(b)[i] = static_cast<uint32_t>(v);
      break;
    case DataType::Int64:
      static_cast<int64_t*>(b)[i] = static_cast<int64_t>(v);
      break;
    case DataType::Uint64:
      static_cast<uint64_t*>(b)[i] = static_cast<uint64_t>(v);
      break;
    case DataType::Float16:
      static_cast<uint16_t*>(b)[i] = kernels::floatToFp16(static_cast<float>(v));
      break;
    case DataType::Bfloat16:
      static_cast<uint16_t*>(b)[i] = kernels::floatToBf16(static_cast<float>(v));
      break;
    case DataType::Float32:
      static_cast<float*>(b)[i] = static_cast<float>(v);
      break;
    case DataType::Float64:
      static_cast<double*>(b)[i] = v;
      break;
  }
}

double get(const void* b, size_t i, DataType t) {
  switch (t) {
    case DataType::Int8:
      return static_cast<const int8_t*>(b)[i];
    case DataType::Uint8:
      return static_cast<const uint8_t*>(b)[i];
    case DataType::Int32:
      return static_cast<const int32_t*>(b)[i];
    case DataType::Uint32:
      return static_cast<const uint32_t*>(b)[i];
    case DataType::Int64:
      return static_cast<double>(static_cast<const int64_t*>(b)[i]);
    case DataType::Uint64:
      return static_cast<double>(static_cast<const uint64_t*>(b)[i]);
    case DataType::Float16:
      return kernels::fp16ToFloat(static_cast<const uint16_t*>(b)[i]);
    case DataType::Bfloat16:
      return kernels::bf16ToFloat(static_cast<const uint16_t*>(b)[i]);
    case DataType::Float32:
      return static_cast<const float*>(b)[i];
    case DataType::Float64:
      return static_cast<const double*>(b)[i];
  }
  return 0;
}

double reduced(int n, size_t i, DataType t, ReduceOp op) {
  double acc = inputValue(0, i, t, op);
  for (int r = 1; r < n; ++r) {
    double v = inputValue(r, i, t, op);
    if (op == ReduceOp::Prod)
      acc *= v;
    else if (op == ReduceOp::Max)
      acc = std::max(acc, v);
    else if (op == ReduceOp::Min)
      acc = std::min(acc, v);
    else
      acc += v;
  }
  if (op == ReduceOp::Avg) {
    bool fl = t == DataType::Float16 || t == DataType::Float32 || t == DataType::Float64 || t == DataType::Bfloat16;
    acc = fl ? acc / n : static_cast<double>(static_cast<int64_t>(acc) / n);
  }
  uint8_t tmp[8];
  put(tmp, 0, t, acc);
  return get(tmp, 0, t);
}

struct Bench {
  Communicator& comm;
  Kind kind;
  int n, rank;
  std::vector<uint8_t> send, recv;
  // Device mode: the buffers the collectives get are device copies of send and recv.
  device::DeviceRuntime* rt = nullptr;
  device::StreamHandle stream = nullptr;
  uint8_t *dsend = nullptr, *drecv = nullptr;

  uint8_t* sendBuf() { return rt ? dsend : send.data(); }
  uint8_t* recvBuf() { return rt ? drecv : recv.data(); }
  // Host vectors to the device before a checked call, and the results back after it.
  void upload() {
    if (!rt) return;
    rt->copyAsync(dsend, send.data(), send.size(), stream);
    rt->copyAsync(drecv, recv.data(), recv.size(), stream);
    rt->synchronize(stream);
  }
  void download() {
    if (!rt) return;
    rt->synchronize(stream);
    rt->copyAsync(send.data(), dsend, send.size(), stream);
    rt->copyAsync(recv.data(), drecv, recv.size(), stream);
    rt->synchronize(stream);
  }

  // One call of the collective, out of place or in place.
  void run(size_t count, DataType t, ReduceOp op, int root, bool inPlace) {
    const size_t E = sizeOf(t), blk = count * E;
    uint8_t* s = sendBuf();
    uint8_t* r = inPlace ? sendBuf() : recvBuf();
    switch (kind) {
      case Kind::AllReduce:
        comm.allReduce(s, r, count, t, op, stream);
        break;
      case Kind::Broadcast:
        comm.broadcast(s, r, count, t, root, stream);
        break;
      case Kind::Reduce:
        comm.reduce(s, r, count, t, op, root, stream);
        break;
      case Kind::AllGather:
        comm.allGather(inPlace ? r + rank * blk : s, r, count, t, stream);
        break;
      case Kind::ReduceScatter:
        comm.reduceScatter(s, inPlace ? s + rank * blk : r, count, t, op, stream);
        break;
      case Kind::AllToAll:
        comm.allToAll(s, r, count, t, stream);
        break;
      case Kind::Gather:  // in place on the root: its block is already at root * blk of the output
        comm.gather(inPlace && rank == root ? r + rank * blk : s, r, count, t, root, stream);
        break;
      case Kind::Scatter:
        comm.scatter(s, inPlace && rank == root ? s + rank * blk : r, count, t, root, stream);
        break;
      case Kind::SendRecv: {
        auto rq = comm.irecv(r == s ? recv.data() : r, count, t, (rank + n - 1) % n);
        auto sq = comm.isend(s, count, t, (rank + 1) % n);
        sq.wait();
        rq.wait();
        break;
      }
    }
  }

  void fillInput(size_t count, DataType t, ReduceOp op, int root, bool inPlace) {
    const size_t E = sizeOf(t);
    if ((kind == Kind::AllGather || (kind == Kind::Gather && rank == root)) && inPlace) {
      for (size_t i = 0; i < count; ++i) put(send.data() + rank * count * E, i, t, inputValue(rank, i, t, op));
      return;
    }
    size_t elems = (kind == Kind::ReduceScatter || kind == Kind::AllToAll || kind == Kind::Scatter) ? count * n : count;
    for (size_t i = 0; i < elems; ++i) put(send.data(), i, t, inputValue(rank, i, t, op));
  }

  // Number of wrong elements on this rank after one checked call.
  double wrong(size_t count, DataType t, ReduceOp op, int root, bool inPlace) {
    const size_t E = sizeOf(t);
    fillInput(count, t, op, root, inPlace);
    upload();
    run(count, t, op, root, inPlace);
    download();
    const uint8_t* out = inPlace ? send.data() : recv.data();
    double bad = 0;
    auto expectAt = [&](size_t i, double want) { bad += get(out, i, t) != want ? 1 : 0; };
    switch (kind) {
      case Kind::AllReduce:
        for (size_t i = 0; i < count; ++i) expectAt(i, reduced(n, i, t, op));
        break;
      case Kind::Reduce:
        if (rank == root)
          for (size_t i = 0; i < count; ++i) expectAt(i, reduced(n, i, t, op));
        break;
      case Kind::Broadcast:
        for (size_t i = 0; i < count; ++i) {
          uint8_t one[8];
          put(one, 0, t, inputValue(root, i, t, op));
          expectAt(i, get(one, 0, t));
        }
        break;
      case Kind::AllGather:
        for (size_t g = 0; g < count * n; ++g) {
          uint8_t one[8];
          put(one, 0, t, inputValue(static_cast<int>(g / count), g % count, t, op));
          expectAt(g, get(one, 0, t));
        }
        break;
      case Kind::ReduceScatter:
        out = inPlace ? send.data() + rank * count * E : recv.data();
        for (size_t i = 0; i < count; ++i) bad += get(out, i, t) != reduced(n, rank * count + i, t, op) ? 1 : 0;
        break;
      case Kind::AllToAll:
        for (size_t g = 0; g < count * n; ++g) {
          uint8_t one[8];
          put(one, 0, t, inputValue(static_cast<int>(g / count), rank * count + g % count, t, op));
          expectAt(g, get(one, 0, t));
        }
        break;
      case Kind::Gather:
        if (rank == root)
          for (size_t g = 0; g < count * n; ++g) {
            uint8_t one[8];
            put(one, 0, t, inputValue(static_cast<int>(g / count), g % count, t, op));
            expectAt(g, get(one, 0, t));
          }
        break;
      case Kind::Scatter:
        out = inPlace && rank == root ? send.data() + rank * count * E : recv.data();
        for (size_t i = 0; i < count; ++i) {
          uint8_t one[8];
          put(one, 0, t, inputValue(root, rank * count + i, t, op));
          bad += get(out, i, t) != get(one, 0, t) ? 1 : 0;
        }
        break;
      case Kind::SendRecv: {
        const uint8_t* got = recv.data();
        int from = (rank + n - 1) % n;
        for (size_t i = 0; i < count; ++i) {
          uint8_t one[8];
          put(one, 0, t, inputValue(from, i, t, op));
          bad += get(got, i, t) != get(one, 0, t) ? 1 : 0;
        }
        break;
      }
    }
    return bad;
  }

  // Seconds per call, the slowest rank's.
  // Device-to-device copy bandwidth of this rank's GPU (bytes read + written per second), from
  // copies of `bytes` between the two device buffers; the anchor of the device figures.
  double deviceCopyBandwidth(size_t bytes, int iters) {
    rt->copyAsync(drecv, dsend, bytes, stream);
    rt->synchronize(stream);
    auto t0 = Clock::now();
    for (int i = 0; i < iters; ++i) rt->copyAsync(drecv, dsend, bytes, stream);
    rt->synchronize(stream);
    const double sec = std::chrono::duration<double>(Clock::now() - t0).count() / iters;
    return sec > 0 ? 2.0 * static_cast<double>(bytes) / sec : 0;
  }

  double time(size_t count, DataType t, ReduceOp op, int root, bool inPlace, int warmup, int iters) {
    fillInput(count, t, op, root, inPlace);
    upload();
    for (int i = 0; i < warmup; ++i) run(count, t, op, root, inPlace);
    if (rt) rt->synchronize(stream);
    comm.barrier();
    auto t0 = Clock::now();
    for (int i = 0; i < iters; ++i) run(count, t, op, root, inPlace);
    if (rt) rt->synchronize(stream);  // device collectives return once queued: time to completion
    double sec = std::chrono::duration<double>(Clock::now() - t0).count() / iters;
    comm.allReduce(&sec, &sec, 1, DataType::Float64, ReduceOp::Max);
    return sec;
  }
};

// For send/recv: what the machine itself does in the same run (memcpy, raw sockets in the same
// pattern) at the largest size, and the barrier's latency.
void printAnchors(Communicator& comm, const Options& o, double peakBus, size_t peakBytes) {
  const int n = comm.size();
  double raw = n > 1 ? rawRingGBs(comm, o.maxBytes, 5) : 0;
  std::vector<double> batches;
  for (int b = 0; b < 5; ++b) {
    comm.barrier();
    auto t0 = Clock::now();
    for (int i = 0; i < 200; ++i) comm.barrier();
    double sec = std::chrono::duration<double>(Clock::now() - t0).count() / 200;
    comm.allReduce(&sec, &sec, 1, DataType::Float64, ReduceOp::Max);
    batches.push_back(sec);
  }
  std::sort(batches.begin(), batches.end());
  if (comm.rank() != 0) return;
  double mem = memcpyGBs(o.maxBytes);
  std::printf("# Anchors measured in this run, at %zu bytes:\n", o.maxBytes);
  std::printf("#   memcpy, one thread            : %8.2f GB/s\n", mem);
  if (n > 1) std::printf("#   raw TCP sockets, same pattern : %8.2f GB/s per rank\n", raw);
  if (n > 1 && raw > 0) {
    std::printf("#   Loom peak send/recv           : %8.2f GB/s at %zu bytes = %.0f%% of raw TCP, %.0f%% of memcpy\n",
                peakBus, peakBytes, 100.0 * peakBus / raw, 100.0 * peakBus / mem);
  }
  std::printf("#   barrier latency (%d ranks)     : %8.2f us\n#\n", n, batches[2] * 1e6);
}

}  // namespace

int perfMain(int argc, char** argv, Kind kind) {
  Options o = parse(argc, argv);
  try {
    Communicator comm = Communicator::fromEnv();
    const int n = comm.size(), rank = comm.rank();
    if (hasRoot(kind) && (o.root < 0 || o.root >= n)) {
      if (rank == 0) std::fprintf(stderr, "root %d is out of range for %d ranks\n", o.root, n);
      return 2;
    }
    Bench b{comm, kind, n, rank, {}, {}};
    b.send.assign(o.maxBytes + 64, 0);
    b.recv.assign(o.maxBytes + 64, 0);
    if (o.device) {
      b.rt = device::startRuntime();
      if (b.rt == nullptr) {
        if (rank == 0) std::fprintf(stderr, "--device cuda: %s\n", device::unavailableReason().c_str());
        return 2;
      }
      if (kind == Kind::SendRecv) {
        if (rank == 0) std::fprintf(stderr, "sendrecv_perf: device buffers are not supported yet (host only)\n");
        return 2;
      }
      b.rt->setDevice(comm.localRank() % std::max(1, b.rt->deviceCount()));
      b.stream = b.rt->createStream();
      b.dsend = static_cast<uint8_t*>(b.rt->allocDevice(b.send.size()));
      b.drecv = static_cast<uint8_t*>(b.rt->allocDevice(b.recv.size()));
    }
    Results results(title(kind), n, comm.nodeCount(), findLinkRate(o.linkRate));
    if (rank == 0) {
      char host[256] = {0};
      gethostname(host, sizeof(host) - 1);
      std::printf("# Loom %s: %d ranks (rank 0 on %s), kernels: %s\n", title(kind), n, host, kernels::isaName());
      if (b.rt) {
        std::printf("# buffers: device %d (%s), ordered on a stream held by %s\n", b.rt->currentDevice(), b.rt->name(),
                    b.rt->waitMechanism().c_str());
        bool ipc = comm.nodeCount() == 1;
        for (int p = 0; p < n; ++p) ipc = ipc && (p == rank || comm.transportOf(p) == "cuda_ipc");
        std::printf("# device data moves %s\n",
                    n == 1 ? "by device copies (one rank)"
                    : ipc  ? "through CUDA IPC (peers' buffers mapped and read in place by the kernels)"
                           : "through pinned host staging (CUDA IPC needs every rank on one node)");
      } else {
        std::printf("# buffers: host memory\n");
      }
      std::printf(
          "# minBytes %zu maxBytes %zu step: %s warmup iters: %d iters: %d validation: %d\n", o.minBytes, o.maxBytes,
          (o.increment > 0 ? std::to_string(o.increment) + "(bytes)" : strFactor(o.factor) + "(factor)").c_str(),
          o.warmup, o.iters, o.check);
      std::printf("#\n# %62s %33s %33s\n", "", "out-of-place", "in-place");
      std::printf("# %12s %12s %8s %6s %6s %9s %7s %7s %6s %9s %7s %7s %6s %7s\n", "size", "count", "type", "redop",
                  "root", "time", "algbw", "busbw", "#wrong", "time", "algbw", "busbw", "#wrong", "algo");
      std::printf("# %12s %12s %8s %6s %6s %9s %7s %7s %6s %9s %7s %7s %6s %7s\n", "(B)", "(elements)", "", "", "",
                  "(us)", "(GB/s)", "(GB/s)", "", "(us)", "(GB/s)", "(GB/s)", "", "");
    }
    // The device anchor: rank 0's copy bandwidth, measured alone (the others wait).
    double copyBw = 0;
    if (b.rt && rank == 0) {
      copyBw = b.deviceCopyBandwidth(o.maxBytes, 20);
      std::printf("# device copy bandwidth: %.1f GB/s (cudaMemcpy device to device of %zu bytes; read + write)\n",
                  copyBw / 1e9, o.maxBytes);
    }
    if (b.rt) comm.barrier();
    double busSum = 0, wrongTotal = 0, peakBus = 0;
    size_t peakBytes = 0;
    double lastTime = 0;  // out of place, at the last size of the first datatype and op
    size_t lastBytes = 0;
    int rows = 0;
    const char* opNames[] = {"sum", "prod", "max", "min", "avg"};
    for (DataType t : o.types)
      for (ReduceOp op : (hasOp(kind) ? o.ops : std::vector<ReduceOp>{ReduceOp::Sum})) {
        const size_t E = sizeOf(t);
        for (size_t bytes = o.minBytes; bytes <= o.maxBytes;) {
          const size_t count = countFor(kind, bytes, E, n);
          const size_t shown = ofBlocks(kind) ? count * n * E : count * E;
          double tm[2], bw[2], bus[2], bad[2];
          for (int ip = 0; ip < 2; ++ip) {
            const bool inPlace = ip == 1;
            if (kind == Kind::SendRecv && inPlace) {
              tm[ip] = bw[ip] = bus[ip] = bad[ip] = -1;
              continue;
            }
            tm[ip] = b.time(count, t, op, o.root, inPlace, o.warmup, o.iters);
            if (!inPlace && t == o.types.front() && op == o.ops.front()) {
              lastTime = tm[ip];
              lastBytes = count * E;
            }
            bad[ip] = o.check ? b.wrong(count, t, op, o.root, inPlace) : 0;
            comm.allReduce(&bad[ip], &bad[ip], 1, DataType::Float64, ReduceOp::Sum);
            bw[ip] = tm[ip] > 0 ? static_cast<double>(shown) / tm[ip] / 1e9 : 0;
            bus[ip] = bw[ip] * busFactor(kind, n);
          }
          if (rank == 0) {
            std::printf("  %12zu %12zu %8s %6s %6d", shown, ofBlocks(kind) ? count * n : count,
                        kTypeNames[static_cast<int>(t)], hasOp(kind) ? opNames[static_cast<int>(op)] : "none",
                        hasRoot(kind) ? o.root : -1);
            for (int ip = 0; ip < 2; ++ip) {
              if (tm[ip] < 0) {
                std::printf(" %9s %7s %7s %6s", "N/A", "N/A", "N/A", "N/A");
                continue;
              }
              std::printf(" %9.2f %7.2f %7.2f %6.0f", tm[ip] * 1e6, bw[ip], bus[ip], bad[ip]);
              busSum += bus[ip];
              wrongTotal += bad[ip];
              ++rows;
              if (bus[ip] > peakBus) {
                peakBus = bus[ip];
                peakBytes = shown;
              }
              Row row;
              row.bytes = shown;
              row.count = count;
              row.type = kTypeNames[static_cast<int>(t)];
              row.op = hasOp(kind) ? opNames[static_cast<int>(op)] : "none";
              row.root = hasRoot(kind) ? o.root : -1;
              row.inPlace = ip == 1;
              row.timeUs = tm[ip] * 1e6;
              row.algbw = bw[ip];
              row.busbw = bus[ip];
              row.wrong = bad[ip];
              results.add(row);
            }
            // Which algorithm ran (the cost model's or LOOM_ALGO's choice); device buffers take
            // the path named in the header.
            const char* coll = collectiveOf(kind);
            std::printf(" %7s\n", coll == nullptr || b.rt ? "-" : comm.algorithmFor(coll, shown).c_str());
            std::fflush(stdout);
          }
          size_t next =
              o.increment > 0 ? bytes + o.increment : static_cast<size_t>(static_cast<double>(bytes) * o.factor);
          if (next <= bytes) break;
          bytes = next;
        }
      }
    if (rank == 0) {
      std::printf("# Out of bounds values : %.0f %s\n", wrongTotal, wrongTotal == 0 ? "OK" : "FAILED");
      std::printf("# Avg bus bandwidth    : %g \n", rows > 0 ? busSum / rows : 0.0);
      std::printf("# Peak bus bandwidth   : %.3f GB/s at %zu bytes\n", peakBus, peakBytes);
      std::printf("%s\n#\n", results.summary().c_str());
      if (b.rt && kind == Kind::AllReduce && n > 1 && comm.nodeCount() == 1 && b.rt->deviceCount() == 1 && copyBw > 0 &&
          lastTime > 0) {
        // Ranks sharing one GPU: an all-reduce moves at least 2·n·S bytes through its memory.
        const double bound = 2.0 * n * static_cast<double>(lastBytes) / copyBw;
        std::printf(
            "# HBM bound, %d ranks on one GPU, %zu bytes: 2*n*S = %.3g GB at %.1f GB/s = %.1f us; measured "
            "%.1f us (out of place): %.0f%% of the bound\n#\n",
            n, lastBytes, 2.0 * n * static_cast<double>(lastBytes) / 1e9, copyBw / 1e9, bound * 1e6, lastTime * 1e6,
            100.0 * bound / lastTime);
      }
      if (!o.csv.empty()) results.writeCsv(o.csv);
      if (!o.json.empty()) results.writeJson(o.json);
    }
    if (kind == Kind::SendRecv) printAnchors(comm, o, peakBus, peakBytes);
    comm.barrier();
    if (b.rt) {
      b.rt->freeDevice(b.dsend);
      b.rt->freeDevice(b.drecv);
      b.rt->destroyStream(b.stream);
    }
    return wrongTotal == 0 ? 0 : 1;
  } catch (const Error& e) {
    std::fprintf(stderr, "%s\n", e.what());
    return 1;
  }
}

}  // namespace bench
}  // namespace loom
