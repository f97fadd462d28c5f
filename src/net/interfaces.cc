#include "net/interfaces.hpp"

#include <ifaddrs.h>
#include <net/if.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cerrno>
#include <map>
#include <mutex>
#include <utility>

#include "core/format.hpp"
#include "core/param.hpp"
#include "core/status.hpp"

namespace loom {
namespace {

LOOM_PARAM_STR(socketIfnameParam, "LOOM_SOCKET_IFNAME", "",
               "interfaces for TCP: prefixes (eth,ib), ^ to exclude (^docker), = for exact names (=eth0), as "
               "NCCL_SOCKET_IFNAME (default: every interface up but lo and docker*; lo when there is no other); "
               "sockets are striped over all the interfaces selected");
LOOM_PARAM_STR(socketFamilyParam, "LOOM_SOCKET_FAMILY", "",
               "address family for TCP: AF_INET or AF_INET6 (default: both)");
LOOM_PARAM_STR(linkRateParam, "LOOM_LINK_RATE", "",
               "the network's rate for the *_perf summary line, like 100gbit or 400mbit (default: the speed the "
               "kernel reports for the interface Loom uses, physical NICs only)");

bool startsWith(const std::string& s, const std::string& prefix) { return s.compare(0, prefix.size(), prefix) == 0; }

}  // namespace

std::string socketIfnameSetting() { return socketIfnameParam(); }
std::string linkRateSetting() { return linkRateParam(); }

IfnameSpec parseIfnameSpec(const std::string& text) {
  IfnameSpec spec;
  size_t pos = 0;
  if (pos < text.size() && text[pos] == '^') {
    spec.exclude = true;
    ++pos;
  }
  if (pos < text.size() && text[pos] == '=') {
    spec.exact = true;
    ++pos;
  }
  while (pos <= text.size()) {
    size_t comma = text.find(',', pos);
    std::string name = text.substr(pos, comma == std::string::npos ? std::string::npos : comma - pos);
    if (!name.empty()) spec.names.push_back(name);
    if (comma == std::string::npos) break;
    pos = comma + 1;
  }
  return spec;
}

bool ifnameMatches(const IfnameSpec& spec, const std::string& name) {
  bool hit = false;
  for (const auto& n : spec.names) {
    if (spec.exact ? name == n : startsWith(name, n)) {
      hit = true;
      break;
    }
  }
  return spec.exclude ? !hit : hit;
}

std::vector<Interface> findInterfaces(const std::string& ifnameSpec, const std::string& family) {
  ifaddrs* list = nullptr;
  if (getifaddrs(&list) != 0) LOOM_THROW(ErrorCode::System, -1, "getifaddrs failed: " + errnoText(errno));
  IfnameSpec spec = parseIfnameSpec(ifnameSpec.empty() ? "^docker,lo" : ifnameSpec);
  std::vector<Interface> v4, v6;
  for (ifaddrs* ifa = list; ifa != nullptr; ifa = ifa->ifa_next) {
    if (ifa->ifa_addr == nullptr || (ifa->ifa_flags & IFF_UP) == 0) continue;
    int fam = ifa->ifa_addr->sa_family;
    if (fam != AF_INET && fam != AF_INET6) continue;
    if (family == "AF_INET" && fam != AF_INET) continue;
    if (family == "AF_INET6" && fam != AF_INET6) continue;
    if (fam == AF_INET6 && IN6_IS_ADDR_LINKLOCAL(&reinterpret_cast<sockaddr_in6*>(ifa->ifa_addr)->sin6_addr)) continue;
    if (!ifnameMatches(spec, ifa->ifa_name)) continue;
    Interface i{ifa->ifa_name, SockAddr(ifa->ifa_addr, fam == AF_INET ? sizeof(sockaddr_in) : sizeof(sockaddr_in6))};
    (fam == AF_INET ? v4 : v6).push_back(i);
  }
  freeifaddrs(list);
  v4.insert(v4.end(), v6.begin(), v6.end());
  if (v4.empty() && ifnameSpec.empty()) return findInterfaces("=lo", family);  // nothing but loopback
  return v4;
}

namespace {

// The selections made so far, by setting: a communicator's set-up asks for them (its TCP listeners,
// ib's side channel), and a job that makes dozens of groups used to enumerate the interfaces (a
// netlink dump, twice where only loopback is up) dozens of times.
struct Selections {
  std::mutex mu;
  std::map<std::pair<std::string, std::string>, std::vector<Interface>> found;
};
Selections& selections() {
  static auto* s = new Selections();  // never destroyed: used up to exit
  return *s;
}

// Whether every address is still this host's: a bind to it (a datagram socket, port 0) fails with
// EADDRNOTAVAIL once its interface has gone or changed its address. A few system calls, where a
// fresh enumeration is a netlink dump.
bool stillHere(const std::vector<Interface>& ifaces) {
  for (const auto& i : ifaces) {
    const int fd = socket(i.addr.family(), SOCK_DGRAM | SOCK_CLOEXEC, 0);
    if (fd < 0) return false;
    SockAddr a = i.addr;
    a.setPort(0);
    const int rc = bind(fd, a.raw(), a.length());
    const int err = errno;
    close(fd);
    if (rc != 0 && err == EADDRNOTAVAIL) return false;
  }
  return true;
}

}  // namespace

std::vector<Interface> selectedInterfaces() {
  std::string spec = socketIfnameParam();
  std::string family = socketFamilyParam();
  Selections& known = selections();
  {
    std::lock_guard<std::mutex> lock(known.mu);
    auto it = known.found.find({spec, family});
    if (it != known.found.end() && stillHere(it->second)) return it->second;
  }
  auto found = findInterfaces(spec, family);
  if (found.empty()) {
    std::string all;
    for (const auto& i : findInterfaces("^", ""))  // every interface
      all += (all.empty() ? "" : ", ") + i.name + " " + i.addr.host();
    LOOM_THROW(ErrorCode::System, -1,
               strFormat("no network interface matches LOOM_SOCKET_IFNAME=\"%s\" LOOM_SOCKET_FAMILY=\"%s\"; this "
                         "host has: %s",
                         spec.c_str(), family.c_str(), all.c_str()));
  }
  std::lock_guard<std::mutex> lock(known.mu);
  known.found[{spec, family}] = found;
  return found;
}

}  // namespace loom
