#include "net/interfaces.hpp"

#include <gtest/gtest.h>
#include <sched.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstdlib>
#include <string>

#include "net/socket.hpp"

using loom::ifnameMatches;
using loom::parseIfnameSpec;

TEST(Ifname, Prefixes) {
  auto s = parseIfnameSpec("eth,ib");
  EXPECT_TRUE(ifnameMatches(s, "eth0"));
  EXPECT_TRUE(ifnameMatches(s, "ib1"));
  EXPECT_FALSE(ifnameMatches(s, "lo"));
}

TEST(Ifname, Exclusion) {
  auto s = parseIfnameSpec("^docker,lo");
  EXPECT_TRUE(ifnameMatches(s, "eth0"));
  EXPECT_FALSE(ifnameMatches(s, "docker0"));
  EXPECT_FALSE(ifnameMatches(s, "lo"));
}

TEST(Ifname, ExactNames) {
  auto s = parseIfnameSpec("=eth0");
  EXPECT_TRUE(ifnameMatches(s, "eth0"));
  EXPECT_FALSE(ifnameMatches(s, "eth01"));
  auto x = parseIfnameSpec("^=eth0");
  EXPECT_FALSE(ifnameMatches(x, "eth0"));
  EXPECT_TRUE(ifnameMatches(x, "eth01"));
}

TEST(Ifname, LoopbackIsFoundWhenNamed) {
  auto v4 = loom::findInterfaces("=lo", "AF_INET");
  ASSERT_FALSE(v4.empty());
  EXPECT_TRUE(v4.front().addr.isLoopback());
  auto v6 = loom::findInterfaces("=lo", "AF_INET6");
  if (!v6.empty()) {
    EXPECT_EQ(v6.front().addr.host(), "::1");
  }
}

TEST(Ifname, DefaultSkipsLoopbackWhenSomethingElseExists) {
  auto all = loom::findInterfaces("^", "");
  bool other = false;
  for (auto& i : all) other |= i.name != "lo";
  auto def = loom::findInterfaces("", "");
  ASSERT_FALSE(def.empty());
  if (other) {
    for (auto& i : def) EXPECT_NE(i.name, "lo");
  }
}

// The selection is remembered per setting, and looked for again once an address it holds is gone:
// in a network namespace of its own, an interface of a veth pair changes its address between two calls.
TEST(Ifname, SelectionIsRememberedUntilItsAddressGoes) {
  if (geteuid() != 0 || std::system("command -v ip > /dev/null") != 0) {
    GTEST_SKIP() << "needs root and iproute2's ip, to make a network namespace with a veth pair";
  }
  const pid_t pid = fork();
  if (pid == 0) {
    if (unshare(CLONE_NEWNET) != 0) _exit(77);
    if (std::system("ip link set lo up && ip link add d0 type veth peer name d1 && ip addr add 198.18.9.1/24 dev d0 && "
                    "ip link set d1 up && ip link set d0 up") != 0)
      _exit(77);
    setenv("LOOM_SOCKET_IFNAME", "=d0", 1);
    auto first = loom::selectedInterfaces();
    if (first.size() != 1 || first.front().addr.host() != "198.18.9.1") _exit(1);
    if (loom::selectedInterfaces().front().addr.host() != "198.18.9.1") _exit(2);
    setenv("LOOM_SOCKET_IFNAME", "=lo", 1);  // another setting: its own selection
    if (!loom::selectedInterfaces().front().addr.isLoopback()) _exit(3);
    if (std::system("ip addr del 198.18.9.1/24 dev d0 && ip addr add 198.18.9.2/24 dev d0") != 0) _exit(77);
    setenv("LOOM_SOCKET_IFNAME", "=d0", 1);
    auto later = loom::selectedInterfaces();
    if (later.size() != 1 || later.front().addr.host() != "198.18.9.2") _exit(4);
    _exit(0);
  }
  int status = 0;
  ASSERT_EQ(waitpid(pid, &status, 0), pid);
  ASSERT_TRUE(WIFEXITED(status));
  if (WEXITSTATUS(status) == 77) {
    GTEST_SKIP() << "unshare(CLONE_NEWNET) or `ip link add d0 type veth peer name d1` failed: run as root on a kernel "
                    "with network namespaces and veth (modprobe veth), outside a container that forbids them";
  }
  EXPECT_EQ(WEXITSTATUS(status), 0) << "1: first selection, 2: remembered, 3: another setting, 4: after the change";
}

TEST(PortRange, Parsing) {
  int lo = 0, hi = 0;
  EXPECT_TRUE(loom::parsePortRange("40000-40100", &lo, &hi));
  EXPECT_EQ(lo, 40000);
  EXPECT_EQ(hi, 40100);
  EXPECT_TRUE(loom::parsePortRange("5000-5000", &lo, &hi));
  for (const char* bad : {"", "40000", "40100-40000", "0-10", "1-70000", "40000-40100x", "a-b", "40000:40100"})
    EXPECT_FALSE(loom::parsePortRange(bad, &lo, &hi)) << bad;
}
