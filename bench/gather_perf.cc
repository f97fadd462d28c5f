// gather_perf: see common/perf_harness.hpp.
#include "common/perf_harness.hpp"

int main(int argc, char** argv) { return loom::bench::perfMain(argc, argv, loom::bench::Kind::Gather); }
