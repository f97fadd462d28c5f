#include "bootstrap/hostlist.hpp"

#include <gtest/gtest.h>

#include "loom/loom.hpp"

using loom::expandHostList;
using loom::firstHost;
using V = std::vector<std::string>;

TEST(HostList, PlainNames) { EXPECT_EQ(expandHostList("a,b,login1"), (V{"a", "b", "login1"})); }

TEST(HostList, RangesKeepZeroPadding) {
  EXPECT_EQ(expandHostList("node[01-04,07]"), (V{"node01", "node02", "node03", "node04", "node07"}));
  EXPECT_EQ(expandHostList("n[8-11]"), (V{"n8", "n9", "n10", "n11"}));
}

TEST(HostList, MixedItemsAndSuffixes) {
  EXPECT_EQ(expandHostList("gpu-a[1-2]-ib,login1,c[3]"), (V{"gpu-a1-ib", "gpu-a2-ib", "login1", "c3"}));
}

TEST(HostList, SeveralBracketGroupsMultiply) {
  EXPECT_EQ(expandHostList("r[1-2]n[01-02]"), (V{"r1n01", "r1n02", "r2n01", "r2n02"}));
}

TEST(HostList, FirstHost) {
  EXPECT_EQ(firstHost("node[01-04,07]"), "node01");
  EXPECT_EQ(firstHost("login1,node[1-9999999]"), "login1");
  EXPECT_EQ(firstHost("127.0.0.[1-4]"), "127.0.0.1");
  // Only the first name is made, however many the item holds; the item is still checked.
  EXPECT_EQ(firstHost("r[0-999999]n[0-999999]"), "r0n0");
  EXPECT_THROW(firstHost("r[0-9]n[5-1]"), loom::Error);
}

TEST(HostList, MalformedListsAreErrors) {
  for (const char* bad : {"node[01-04", "node01-04]", "node[a-b]", "node[4-1]", "", "a,,b", "n[[1]]", "n[1-]"}) {
    EXPECT_THROW(expandHostList(bad), loom::Error) << bad;
  }
}

TEST(HostList, HugeExpansionIsRefused) {
  EXPECT_THROW(expandHostList("n[0-99999999999]"), loom::Error);
  EXPECT_THROW(expandHostList("a[0-9999]b[0-9999]", 1000000), loom::Error);
  // Names without brackets count too (found by tools/fuzz.sh).
  EXPECT_EQ(expandHostList("n[1-3],x", 4).size(), 4u);
  EXPECT_THROW(expandHostList("n[1-3],x,y", 4), loom::Error);
}
