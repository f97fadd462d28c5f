// Slurm host-list expansion: "node[01-04,07],gpu-a[1-2]-ib,login1" -> node01 node02 ... login1.
// Pure; throws loom::Error(InvalidArgument) on malformed input or on more than `maxHosts` hosts.
#pragma once

#include <cstddef>
#include <string>
#include <vector>

namespace loom {

/// Expands a Slurm host list (several bracket groups in one name multiply, as in Slurm).
std::vector<std::string> expandHostList(const std::string& list, size_t maxHosts = 1u << 20);

/// The first host of a Slurm host list, without expanding the rest.
std::string firstHost(const std::string& list);

}  // namespace loom
