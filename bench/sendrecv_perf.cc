// sendrecv_perf: every rank sends to rank+1 and receives from rank-1 at once (nccl-tests'
// sendrecv); busbw equals algbw. After the table it prints anchors measured in the same run:
// single-thread memcpy, raw TCP sockets in the same pattern, and the barrier's latency.
// See common/perf_harness.hpp.
#include "common/perf_harness.hpp"

int main(int argc, char** argv) { return loom::bench::perfMain(argc, argv, loom::bench::Kind::SendRecv); }
