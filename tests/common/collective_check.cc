#include "common/collective_check.hpp"

#include <algorithm>
#include <cmath>
#include <vector>

#include "kernels/reduce.hpp"

using loom::DataType;
using loom::ReduceOp;

namespace loomtest {

namespace {

bool isFloat(DataType t) {
  return t == DataType::Float16 || t == DataType::Float32 || t == DataType::Float64 || t == DataType::Bfloat16;
}
bool isSigned(DataType t) { return isFloat(t) || t == DataType::Int8 || t == DataType::Int32 || t == DataType::Int64; }

// Checks one buffer of `count` elements against f(i); reports the first mismatch.
template <typename F>
void expectBuffer(const void* buf, size_t count, DataType t, ReduceOp op, F f, const std::string& what,
                  const Report& fail) {
  for (size_t i = 0; i < count; ++i) {
    double want = f(i), got = load(buf, i, t);
    if (std::fabs(got - want) > tolerance(t, op, want)) {
      fail(what + ": element " + std::to_string(i) + " is " + std::to_string(got) + ", expected " +
           std::to_string(want));
      return;
    }
  }
}

}  // namespace

const ReduceOp kOps[5] = {ReduceOp::Sum, ReduceOp::Prod, ReduceOp::Max, ReduceOp::Min, ReduceOp::Avg};

// Rank r's input at global index i: small integers, so sums, products, minima and maxima are exact
// in every type and independent of the order of reduction.
double inputValue(int r, size_t i, DataType t, ReduceOp op) {
  const long k = static_cast<long>(i % 100003);
  switch (op) {
    case ReduceOp::Sum:
    case ReduceOp::Avg:
      return isSigned(t) ? ((r * 3 + k * 7) % 9) - 4 : (r * 3 + k * 7) % 9;
    case ReduceOp::Prod:
      if ((r + k) % 3 == 0) return 2;
      return (isSigned(t) && (r * 5 + k) % 2 == 1) ? -1 : 1;
    case ReduceOp::Max:
    case ReduceOp::Min:
      return isSigned(t) ? ((r * 37 + k * 11) % 61) - 30 : (r * 37 + k * 11) % 61;
  }
  return 0;
}

void store(void* buf, size_t i, DataType t, double v) {
  switch (t) {
    case DataType::Int8:
      static_cast<int8_t*>(buf)[i] = static_cast<int8_t>(static_cast<int64_t>(v));
      break;
    case DataType::Uint8:
      static_cast<uint8_t*>(buf)[i] = static_cast<uint8_t>(static_cast<int64_t>(v));
      break;
    case DataType::Int32:
      static_cast<int32_t*>(buf)[i] = static_cast<int32_t>(v);
      break;
    case DataType::Uint32:
      static_cast<uint32_t*>(buf)[i] = static_cast<uint32_t>(static_cast<int64_t>(v));
      break;
    case DataType::Int64:
      static_cast<int64_t*>(buf)[i] = static_cast<int64_t>(v);
      break;
    case DataType::Uint64:
      static_cast<uint64_t*>(buf)[i] = static_cast<uint64_t>(static_cast<int64_t>(v));
      break;
    case DataType::Float16:
      static_cast<uint16_t*>(buf)[i] = loom::kernels::floatToFp16(static_cast<float>(v));
      break;
    case DataType::Bfloat16:
      static_cast<uint16_t*>(buf)[i] = loom::kernels::floatToBf16(static_cast<float>(v));
      break;
    case DataType::Float32:
      static_cast<float*>(buf)[i] = static_cast<float>(v);
      break;
    case DataType::Float64:
      static_cast<double*>(buf)[i] = v;
      break;
  }
}

double load(const void* buf, size_t i, DataType t) {
  switch (t) {
    case DataType::Int8:
      return static_cast<const int8_t*>(buf)[i];
    case DataType::Uint8:
      return static_cast<const uint8_t*>(buf)[i];
    case DataType::Int32:
      return static_cast<const int32_t*>(buf)[i];
    case DataType::Uint32:
      return static_cast<const uint32_t*>(buf)[i];
    case DataType::Int64:
      return static_cast<double>(static_cast<const int64_t*>(buf)[i]);
    case DataType::Uint64:
      return static_cast<double>(static_cast<const uint64_t*>(buf)[i]);
    case DataType::Float16:
      return loom::kernels::fp16ToFloat(static_cast<const uint16_t*>(buf)[i]);
    case DataType::Bfloat16:
      return loom::kernels::bf16ToFloat(static_cast<const uint16_t*>(buf)[i]);
    case DataType::Float32:
      return static_cast<const float*>(buf)[i];
    case DataType::Float64:
      return static_cast<const double*>(buf)[i];
  }
  return 0;
}

// The reduction of all ranks' inputs at global index i, as the type stores it (wrapping integers).
double expected(int n, size_t i, DataType t, ReduceOp op) {
  double acc = inputValue(0, i, t, op);
  for (int r = 1; r < n; ++r) {
    double v = inputValue(r, i, t, op);
    switch (op) {
      case ReduceOp::Sum:
      case ReduceOp::Avg:
        acc += v;
        break;
      case ReduceOp::Prod:
        acc *= v;
        break;
      case ReduceOp::Max:
        acc = std::max(acc, v);
        break;
      case ReduceOp::Min:
        acc = std::min(acc, v);
        break;
    }
  }
  if (op == ReduceOp::Avg) {
    if (isFloat(t)) return acc / n;
    return static_cast<double>(static_cast<int64_t>(acc) / n);  // truncating, as C
  }
  // Round-trip through the type: integers wrap, floats are exact here.
  uint8_t tmp[8];
  store(tmp, 0, t, acc);
  return load(tmp, 0, t);
}

double tolerance(DataType t, ReduceOp op, double value) {
  if (op != ReduceOp::Avg || !isFloat(t)) return 0;
  double ulp = t == DataType::Float16    ? 1.0 / 1024
               : t == DataType::Bfloat16 ? 1.0 / 128
               : t == DataType::Float32  ? 1.2e-7
                                         : 2.3e-16;
  return ulp * std::max(1.0, std::fabs(value));
}

std::string describe(const Case& k, const char* what, int rank) {
  return std::string(what) + " " + loom::toString(k.type) + " " + loom::toString(k.op) + " count " +
         std::to_string(k.count) + (k.inPlace ? " in place" : " out of place") + " root " + std::to_string(k.root) +
         " on rank " + std::to_string(rank);
}

// Runs one collective case on this rank and checks it.
namespace {
DeviceBuffers* gDevice = nullptr;

// The buffers runCase hands to Loom: the host vectors themselves, or device copies of them
// (uploaded when first asked for, downloaded by finish() once the stream has drained).
class Mirror {
 public:
  explicit Mirror(int rank) : dev_(gDevice), stream_(dev_ ? dev_->stream(rank) : nullptr) {}
  ~Mirror() {
    for (auto& m : maps_) dev_->free(m.second);
  }
  Mirror(const Mirror&) = delete;
  Mirror& operator=(const Mirror&) = delete;
  uint8_t* of(std::vector<uint8_t>& v) {
    if (dev_ == nullptr) return v.data();
    for (auto& m : maps_)
      if (m.first == &v) return static_cast<uint8_t*>(m.second);
    void* p = dev_->alloc(v.size());
    dev_->upload(p, v.data(), v.size());
    maps_.emplace_back(&v, p);
    return static_cast<uint8_t*>(p);
  }
  void* stream() const { return stream_; }
  void finish() {
    if (dev_ == nullptr) return;
    dev_->synchronize(stream_);
    for (auto& m : maps_) dev_->download(m.first->data(), m.second, m.first->size());
  }

 private:
  DeviceBuffers* dev_;
  void* stream_;
  std::vector<std::pair<std::vector<uint8_t>*, void*>> maps_;
};
}  // namespace

void setDeviceBuffers(DeviceBuffers* d) { gDevice = d; }

void runCase(loom::Communicator& c, const char* coll, const Case& k, const Report& fail) {
  const int n = c.size(), r = c.rank();
  const size_t E = loom::sizeOf(k.type), cnt = k.count, N = static_cast<size_t>(n);
  std::string what = describe(k, coll, r);
  std::vector<uint8_t> in, out;
  Mirror m(r);
  void* st = m.stream();
  auto fill = [&](std::vector<uint8_t>& v, size_t elems, size_t base, int rank) {
    v.assign(elems * E + 64, 0xA5);  // a tail of canaries catches writes past the end
    for (size_t i = 0; i < elems; ++i) store(v.data(), i, k.type, inputValue(rank, base + i, k.type, k.op));
  };
  auto canariesIntact = [&](const std::vector<uint8_t>& v, size_t elems) {
    for (size_t i = elems * E; i < v.size(); ++i)
      if (v[i] != 0xA5) {
        fail(what + ": wrote past the end of the buffer");
        return;
      }
  };
  const std::string name = coll;
  if (name == "all_reduce") {
    fill(in, cnt, 0, r);
    if (k.inPlace) {
      c.allReduce(m.of(in), m.of(in), cnt, k.type, k.op, st);
      m.finish();
      expectBuffer(
          in.data(), cnt, k.type, k.op, [&](size_t i) { return expected(n, i, k.type, k.op); }, what, fail);
      canariesIntact(in, cnt);
    } else {
      out.assign(cnt * E + 64, 0xA5);
      c.allReduce(m.of(in), m.of(out), cnt, k.type, k.op, st);
      m.finish();
      expectBuffer(
          out.data(), cnt, k.type, k.op, [&](size_t i) { return expected(n, i, k.type, k.op); }, what, fail);
      canariesIntact(out, cnt);
    }
  } else if (name == "reduce") {
    fill(in, cnt, 0, r);
    out.assign(cnt * E + 64, 0xA5);
    std::vector<uint8_t>& dst = k.inPlace ? in : out;
    c.reduce(m.of(in), m.of(dst), cnt, k.type, k.op, k.root, st);
    m.finish();
    if (r == k.root) {
      expectBuffer(
          dst.data(), cnt, k.type, k.op, [&](size_t i) { return expected(n, i, k.type, k.op); }, what, fail);
      canariesIntact(dst, cnt);
    }
  } else if (name == "broadcast") {
    fill(in, cnt, 0, r);
    out.assign(cnt * E + 64, 0xA5);
    std::vector<uint8_t>& dst = k.inPlace ? in : out;
    c.broadcast(m.of(in), m.of(dst), cnt, k.type, k.root, st);
    m.finish();
    expectBuffer(
        dst.data(), cnt, k.type, ReduceOp::Sum,
        [&](size_t i) {
          uint8_t one[8];
          store(one, 0, k.type, inputValue(k.root, i, k.type, k.op));
          return load(one, 0, k.type);
        },
        what, fail);
    canariesIntact(dst, cnt);
  } else if (name == "all_gather") {
    out.assign(N * cnt * E + 64, 0xA5);
    if (k.inPlace) {
      for (size_t i = 0; i < cnt; ++i) store(out.data(), r * cnt + i, k.type, inputValue(r, i, k.type, k.op));
      c.allGather(m.of(out) + r * cnt * E, m.of(out), cnt, k.type, st);
    } else {
      fill(in, cnt, 0, r);
      c.allGather(m.of(in), m.of(out), cnt, k.type, st);
    }
    m.finish();
    expectBuffer(
        out.data(), N * cnt, k.type, ReduceOp::Sum,
        [&](size_t g) {
          uint8_t one[8];
          store(one, 0, k.type,
                inputValue(static_cast<int>(g / std::max<size_t>(cnt, 1)), g % std::max<size_t>(cnt, 1), k.type, k.op));
          return load(one, 0, k.type);
        },
        what, fail);
    canariesIntact(out, N * cnt);
  } else if (name == "reduce_scatter") {
    fill(in, N * cnt, 0, r);
    out.assign(cnt * E + 64, 0xA5);
    if (k.inPlace) {
      c.reduceScatter(m.of(in), m.of(in) + r * cnt * E, cnt, k.type, k.op, st);
    } else {
      c.reduceScatter(m.of(in), m.of(out), cnt, k.type, k.op, st);
    }
    m.finish();
    const uint8_t* dst = k.inPlace ? in.data() + r * cnt * E : out.data();
    expectBuffer(
        dst, cnt, k.type, k.op, [&](size_t i) { return expected(n, r * cnt + i, k.type, k.op); }, what, fail);
    if (!k.inPlace) canariesIntact(out, cnt);
  } else if (name == "all_to_all") {
    fill(in, N * cnt, static_cast<size_t>(r) * 1000, r);
    out.assign(N * cnt * E + 64, 0xA5);
    std::vector<uint8_t>& dst = k.inPlace ? in : out;
    c.allToAll(m.of(in), m.of(dst), cnt, k.type, st);
    m.finish();
    expectBuffer(
        dst.data(), N * cnt, k.type, ReduceOp::Sum,
        [&](size_t g) {
          size_t p = g / std::max<size_t>(cnt, 1), i = g % std::max<size_t>(cnt, 1);
          uint8_t one[8];
          store(one, 0, k.type, inputValue(static_cast<int>(p), p * 1000 + r * cnt + i, k.type, k.op));
          return load(one, 0, k.type);
        },
        what, fail);
    canariesIntact(dst, N * cnt);
  } else if (name == "gather") {
    // Rank j's block at j * cnt on the root; elsewhere no receive buffer at all.
    const bool root = r == k.root;
    out.assign(N * cnt * E + 64, 0xA5);
    if (k.inPlace && root) {
      for (size_t i = 0; i < cnt; ++i) store(out.data(), r * cnt + i, k.type, inputValue(r, i, k.type, k.op));
      c.gather(m.of(out) + r * cnt * E, m.of(out), cnt, k.type, k.root, st);
    } else {
      fill(in, cnt, 0, r);
      c.gather(m.of(in), root ? m.of(out) : nullptr, cnt, k.type, k.root, st);
    }
    m.finish();
    if (root) {
      expectBuffer(
          out.data(), N * cnt, k.type, ReduceOp::Sum,
          [&](size_t g) {
            uint8_t one[8];
            store(
                one, 0, k.type,
                inputValue(static_cast<int>(g / std::max<size_t>(cnt, 1)), g % std::max<size_t>(cnt, 1), k.type, k.op));
            return load(one, 0, k.type);
          },
          what, fail);
      canariesIntact(out, N * cnt);
    }
  } else if (name == "scatter") {
    // The root's block j (its input at j * cnt) to rank j; elsewhere no send buffer at all.
    const bool root = r == k.root;
    if (root) fill(in, N * cnt, 0, r);
    out.assign(cnt * E + 64, 0xA5);
    const uint8_t* dst;
    if (k.inPlace && root) {
      c.scatter(m.of(in), m.of(in) + r * cnt * E, cnt, k.type, k.root, st);
      m.finish();
      dst = in.data() + r * cnt * E;
    } else {
      c.scatter(root ? m.of(in) : nullptr, m.of(out), cnt, k.type, k.root, st);
      m.finish();
      dst = out.data();
      canariesIntact(out, cnt);
    }
    expectBuffer(
        dst, cnt, k.type, ReduceOp::Sum,
        [&](size_t i) {
          uint8_t one[8];
          store(one, 0, k.type, inputValue(k.root, r * cnt + i, k.type, k.op));
          return load(one, 0, k.type);
        },
        what, fail);
  }
}

const char* const kColls[8] = {"all_reduce",     "reduce",     "broadcast", "all_gather",
                               "reduce_scatter", "all_to_all", "gather",    "scatter"};

size_t runMatrix(loom::Communicator& c, const std::vector<size_t>& counts, const Report& fail) {
  const int n = c.size();
  size_t cases = 0;
  for (const char* coll : kColls) {
    const std::string name = coll;
    const bool reduces = name != "broadcast" && name != "all_gather" && name != "all_to_all";
    const bool rooted = name == "reduce" || name == "broadcast" || name == "gather" || name == "scatter";
    for (DataType t : {DataType::Int8, DataType::Uint8, DataType::Int32, DataType::Uint32, DataType::Int64,
                       DataType::Uint64, DataType::Float16, DataType::Float32, DataType::Float64, DataType::Bfloat16})
      for (ReduceOp op : kOps) {
        if (!reduces && op != ReduceOp::Sum) continue;
        for (size_t count : counts)
          for (bool inPlace : {false, true})
            for (int root : {0, n - 1}) {
              if (root != 0 && !rooted) continue;
              runCase(c, coll, Case{t, op, count, inPlace, root}, fail);
              ++cases;
            }
      }
  }
  return cases;
}

}  // namespace loomtest
