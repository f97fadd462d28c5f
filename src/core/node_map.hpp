// NodeMap: which ranks share a node (can share memory; core/topology.hpp), learnt when a
// communicator joins and fixed for its lifetime. Nodes are numbered by their lowest rank.
#pragma once

#include <algorithm>
#include <cstddef>
#include <vector>

namespace loom {

struct NodeMap {
  std::vector<int> nodeOf;              ///< by rank: the index of its node
  std::vector<std::vector<int>> ranks;  ///< by node: its ranks, ascending

  int count() const { return static_cast<int>(ranks.size()); }
  int of(int rank) const { return nodeOf[static_cast<size_t>(rank)]; }
  const std::vector<int>& on(int node) const { return ranks[static_cast<size_t>(node)]; }
  /// `rank`'s index among the ranks of its node.
  int localRank(int rank) const {
    const auto& local = on(of(rank));
    return static_cast<int>(std::find(local.begin(), local.end(), rank) - local.begin());
  }
};

}  // namespace loom
