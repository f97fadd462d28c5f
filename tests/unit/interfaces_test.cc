#include "net/interfaces.hpp"

#include <gtest/gtest.h>

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

TEST(PortRange, Parsing) {
  int lo = 0, hi = 0;
  EXPECT_TRUE(loom::parsePortRange("40000-40100", &lo, &hi));
  EXPECT_EQ(lo, 40000);
  EXPECT_EQ(hi, 40100);
  EXPECT_TRUE(loom::parsePortRange("5000-5000", &lo, &hi));
  for (const char* bad : {"", "40000", "40100-40000", "0-10", "1-70000", "40000-40100x", "a-b", "40000:40100"})
    EXPECT_FALSE(loom::parsePortRange(bad, &lo, &hi)) << bad;
}
