// Network interface selection with NCCL's LOOM_SOCKET_IFNAME syntax:
//   "eth,ib"     interfaces whose names start with eth or ib
//   "^docker,lo" all but those starting with docker or lo
//   "=eth0"      exactly eth0 (and "^=eth0": all but exactly eth0)
// Unset: every interface that is up, except lo and docker*; lo only when there is nothing else.
// LOOM_SOCKET_FAMILY=AF_INET or AF_INET6 keeps one address family.
#pragma once

#include <string>
#include <vector>

#include "net/socket.hpp"

namespace loom {

struct IfnameSpec {
  bool exclude = false;
  bool exact = false;
  std::vector<std::string> names;
};

/// Parses the LOOM_SOCKET_IFNAME syntax.
IfnameSpec parseIfnameSpec(const std::string& text);
/// True when interface `name` is selected by `spec`.
bool ifnameMatches(const IfnameSpec& spec, const std::string& name);

struct Interface {
  std::string name;
  SockAddr addr;
};

/// Interfaces and addresses selected by `ifnameSpec` and `family` ("", "AF_INET", "AF_INET6"),
/// IPv4 first. Link-local IPv6 addresses are skipped.
std::vector<Interface> findInterfaces(const std::string& ifnameSpec, const std::string& family);

/// LOOM_SOCKET_IFNAME as the user set it ("" when unset).
std::string socketIfnameSetting();
/// LOOM_LINK_RATE as the user set it ("" when unset): the benchmarks' link rate.
std::string linkRateSetting();

/// The interfaces chosen by LOOM_SOCKET_IFNAME / LOOM_SOCKET_FAMILY; throws Error(System) when
/// none match, listing the interfaces that exist. Found once per process for each value of the two
/// settings (as NCCL finds its interfaces once) and then remembered, looked for again only when an
/// address remembered is no longer this host's (its interface went down or changed address); an
/// interface that comes up later is seen by the next process. Thread-safe.
std::vector<Interface> selectedInterfaces();

}  // namespace loom
