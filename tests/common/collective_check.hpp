// The collectives' reference, independent of Loom: every rank's input at every index (small
// integers, so that sums, products, minima and maxima are exact in every type and independent of
// the order of reduction), the expected result of each collective, a tolerance for float averages
// (one division: one unit in the last place), and runCase, which runs one collective on this rank
// and checks every element of its result and the canaries past its end. Shared by the in-process
// tests and by the worker the multi-node tests start on every "node"; failures go to a callback.
#pragma once

#include <cstddef>
#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "loom/loom.hpp"

namespace loomtest {

/// Every reduction op, and every collective runCase knows.
extern const loom::ReduceOp kOps[5];
extern const char* const kColls[8];

struct Case {
  loom::DataType type;
  loom::ReduceOp op;
  size_t count;
  bool inPlace;
  int root;
};

/// Rank r's input at global index i.
double inputValue(int r, size_t i, loom::DataType t, loom::ReduceOp op);
/// Element i of a buffer of type t, stored from / loaded as a double.
void store(void* buf, size_t i, loom::DataType t, double v);
double load(const void* buf, size_t i, loom::DataType t);
/// The reduction over n ranks at index i, as the type stores it (wrapping integers).
double expected(int n, size_t i, loom::DataType t, loom::ReduceOp op);
/// How far a result may be from `value`: 0 but for float averages.
double tolerance(loom::DataType t, loom::ReduceOp op, double value);
/// "all_reduce float32 sum count 7 in place root 0 on rank 3".
std::string describe(const Case& k, const char* what, int rank);

/// Called with a description of each mismatch found.
using Report = std::function<void(const std::string&)>;

/// Where runCase puts the buffers it passes to Loom, when not in host memory: a device (the CUDA
/// runtime in the gpu suite, an emulated one elsewhere). Uploads and downloads are synchronous.
class DeviceBuffers {
 public:
  virtual ~DeviceBuffers() = default;
  virtual void* alloc(size_t bytes) = 0;
  virtual void free(void* p) = 0;
  virtual void upload(void* dev, const void* host, size_t bytes) = 0;
  virtual void download(void* host, const void* dev, size_t bytes) = 0;
  /// The stream rank `rank` orders its collectives on.
  virtual void* stream(int rank) = 0;
  /// Waits until everything queued on `stream` has run.
  virtual void synchronize(void* stream) = 0;
};
/// Makes runCase (and runMatrix) use `d` (nullptr: host memory again). Not thread-safe against
/// cases running.
void setDeviceBuffers(DeviceBuffers* d);

/// Runs collective `coll` (one of kColls) with case k on this rank and checks the result.
void runCase(loom::Communicator& c, const char* coll, const Case& k, const Report& fail);

/// Runs every collective x datatype x op x placement x root (0 and the last) at each count.
/// Returns the number of cases run.
size_t runMatrix(loom::Communicator& c, const std::vector<size_t>& counts, const Report& fail);

}  // namespace loomtest
