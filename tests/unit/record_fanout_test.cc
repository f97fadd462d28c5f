// The records' fan-out: a value proved with the job key, for this communicator and this rank, is
// taken; whatever else connects (garbage, another job's key, another communicator, a message
// for another rank, one that claims a gigabyte and stops, one that says nothing) is turned away
// and counted, and holds up neither the listener nor the sender.
#include "bootstrap/record_fanout.hpp"

#include <gtest/gtest.h>
#include <sys/socket.h>

#include <chrono>
#include <cstring>
#include <string>
#include <thread>
#include <vector>

#include "bootstrap/store_protocol.hpp"

namespace {

using loom::Bytes;
using loom::Deadline;
using std::chrono::milliseconds;

const loom::JobKey kKey = loom::deriveJobKey("fan-out test");
const loom::Nonce kComm = loom::randomNonce();

Bytes valueOf(size_t n) {
  Bytes v(n);
  for (size_t i = 0; i < n; ++i) v[i] = static_cast<uint8_t>(i * 7 + 3);
  return v;
}

// A raw connection to the listener that sends `bytes` (and stays open until it goes).
loom::Socket sendRaw(const loom::SockAddr& to, const Bytes& bytes) {
  int err = 0;
  loom::Socket s = loom::connectTo(to, Deadline(milliseconds(2000)), &err);
  EXPECT_TRUE(s.valid()) << err;
  if (!bytes.empty()) {
    EXPECT_EQ(loom::sendAll(s.fd(), bytes.data(), bytes.size(), Deadline(milliseconds(2000))), 0);
  }
  return s;
}

TEST(FanOut, AValueProvedForThisRankIsTaken) {
  loom::FanOutListener listener(kKey, kComm, 5);
  const Bytes value = valueOf(300000);  // more than a socket buffer: sent as the receiver reads
  std::vector<int> missed{-1};
  std::thread sender([&] {
    missed = loom::fanOut(kKey, kComm, 2, value, {{5, listener.address()}}, Deadline(milliseconds(10000)));
  });
  const auto got = listener.receive(Deadline(milliseconds(10000)));
  sender.join();
  ASSERT_TRUE(got.has_value());
  EXPECT_EQ(*got, value);
  EXPECT_TRUE(missed.empty());
  EXPECT_EQ(listener.rejected(), 0);
  // An empty value is a value.
  std::thread again([&] { loom::fanOut(kKey, kComm, 2, {}, {{5, listener.address()}}, Deadline(milliseconds(5000))); });
  const auto empty = listener.receive(Deadline(milliseconds(5000)));
  again.join();
  ASSERT_TRUE(empty.has_value());
  EXPECT_TRUE(empty->empty());
}

TEST(FanOut, StrangersAreTurnedAwayAndHoldUpNoOne) {
  loom::FanOutListener listener(kKey, kComm, 3);
  const auto at = listener.address();
  // One that says nothing, and stays: the proved sender must get through beside it.
  loom::Socket silent = sendRaw(at, {});
  // Garbage; another job's key; another communicator; a message for rank 4.
  loom::Socket garbage = sendRaw(at, Bytes(100, 'x'));
  loom::fanOut(loom::deriveJobKey("another job"), kComm, 0, valueOf(10), {{3, at}}, Deadline(milliseconds(2000)));
  loom::fanOut(kKey, loom::randomNonce(), 0, valueOf(10), {{3, at}}, Deadline(milliseconds(2000)));
  loom::fanOut(kKey, kComm, 0, valueOf(10), {{4, at}}, Deadline(milliseconds(2000)));
  // A head that claims a gigabyte, and then goes: nothing of that size is kept for it.
  Bytes head(56, 0);
  std::memcpy(head.data(), "LOOMFAN2", 8);
  loom::storewire::putU32(head.data() + 12, 3);
  loom::storewire::putI64(head.data() + 16, int64_t{1} << 30);
  sendRaw(at, head);
  // Nothing proved came yet: the wait ends empty at its deadline, each stranger counted.
  EXPECT_FALSE(listener.receive(Deadline(milliseconds(500))).has_value());
  EXPECT_EQ(listener.rejected(), 5);  // all but the silent one, which may yet speak
  const Bytes value = valueOf(5000);
  std::thread sender([&] { loom::fanOut(kKey, kComm, 0, value, {{3, at}}, Deadline(milliseconds(10000))); });
  const auto got = listener.receive(Deadline(milliseconds(10000)));
  sender.join();
  ASSERT_TRUE(got.has_value());
  EXPECT_EQ(*got, value);
}

TEST(FanOut, ASenderNamesTheRanksItDidNotReach) {
  loom::FanOutListener listener(kKey, kComm, 1);
  loom::SockAddr gone;
  {
    loom::FanOutListener closed(kKey, kComm, 2);
    gone = closed.address();
  }  // its port now refuses connections
  std::thread receiver([&] { EXPECT_TRUE(listener.receive(Deadline(milliseconds(10000))).has_value()); });
  const auto missed =
      loom::fanOut(kKey, kComm, 0, valueOf(1000), {{1, listener.address()}, {2, gone}}, Deadline(milliseconds(5000)));
  receiver.join();
  EXPECT_EQ(missed, std::vector<int>{2});
}

}  // namespace
