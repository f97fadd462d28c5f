// The rendezvous store and the peer ports under hostile input: stray clients, wrong keys, garbage
// and huge length fields, while the job forms and runs. They are rejected and the job completes.
#include <gtest/gtest.h>

#include <atomic>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <memory>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "bootstrap/rendezvous.hpp"
#include "bootstrap/store_protocol.hpp"
#include "bootstrap/tcp_store.hpp"
#include "bootstrap/tcp_store_server.hpp"
#include "common/env_guard.hpp"
#include "common/ranks.hpp"

using namespace loom;
using namespace std::chrono_literals;

namespace {

// Connects, optionally reads what the server says first, sends `bytes`, and reports whether the
// other side closed the connection within a second.
bool strayIsClosed(const SockAddr& addr, const Bytes& bytes) {
  int err = 0;
  Socket s = connectTo(addr, Deadline(2000ms), &err);
  if (!s.valid()) return true;  // refused counts as rejected
  sendAll(s.fd(), bytes.data(), bytes.size(), Deadline(1000ms));
  uint8_t buf[4096];
  Deadline d(3000ms);
  while (!d.expired()) {
    int rc = recvAll(s.fd(), buf, 1, Deadline(100ms));
    if (rc == ECONNRESET || (rc != 0 && rc != ETIMEDOUT)) return true;
  }
  return false;
}

Bytes text(const char* s) { return Bytes(s, s + std::strlen(s)); }

// Reads the store's hello on `fd` and makes the client's answer that proves `key` (a client
// written by hand, to send what TcpStoreClient would not).
bool clientHello(int fd, const JobKey& key, Bytes* msg) {
  uint8_t hello[24];
  if (recvAll(fd, hello, 24, Deadline(2s)) != 0) return false;
  Nonce sn, cn = randomNonce();
  std::memcpy(sn.data(), hello + 8, 16);
  Mac m = computeMac(key, "store-client", sn, cn);
  *msg = text("LOOMSTC1");
  msg->insert(msg->end(), cn.begin(), cn.end());
  msg->insert(msg->end(), m.begin(), m.end());
  return true;
}

}  // namespace

TEST(Store, SetGetAddAcrossClients) {
  JobKey key = deriveJobKey("store-test");
  TcpStoreServer server(SockAddr::resolve("127.0.0.1", 0).front(), key);
  TcpStoreClient a("127.0.0.1", server.port(), key, 0, Deadline(5s), 5s);
  TcpStoreClient b("127.0.0.1", server.port(), key, 1, Deadline(5s), 5s);
  a.setString("x", "hello");
  auto v = b.get("x", Deadline(1s));
  ASSERT_TRUE(v.has_value());
  EXPECT_EQ(std::string(v->begin(), v->end()), "hello");
  EXPECT_FALSE(b.tryGet("missing").has_value());
  EXPECT_EQ(a.add("n", 5), 5);
  EXPECT_EQ(b.add("n", -2), 3);
  std::vector<std::string> missing;
  EXPECT_FALSE(b.waitAll({"x", "y", "z"}, Deadline(50ms), &missing));
  EXPECT_EQ(missing, (std::vector<std::string>{"y", "z"}));
  Bytes big(3u << 20, 0x5a);  // values of several MiB pass
  a.set("big", big);
  EXPECT_EQ(*b.tryGet("big"), big);
}

// Many keys in one request each way: what a rank's bootstrap uses so that the store serves it in
// O(1) requests, not one per peer. More keys than one request carries, values large enough to be
// left out of one reply and asked for again, a prefix store over it, and a wait for keys that
// arrive meanwhile.
TEST(Store, ManyKeysInOneRequest) {
  JobKey key = deriveJobKey("store-test");
  TcpStoreServer server(SockAddr::resolve("127.0.0.1", 0).front(), key);
  auto a = std::make_shared<TcpStoreClient>("127.0.0.1", server.port(), key, 0, Deadline(5s), 5s);
  TcpStoreClient b("127.0.0.1", server.port(), key, 1, Deadline(5s), 5s);
  const size_t n = storewire::kMaxKeysPerRequest + 7;
  std::vector<std::pair<std::string, Bytes>> pairs;
  std::vector<std::string> keys;
  for (size_t i = 0; i < n; ++i) {
    keys.push_back("k/" + std::to_string(i));
    if (i % 3 != 0) pairs.emplace_back(keys.back(), text(("v" + std::to_string(i)).c_str()));
  }
  a->setMany(pairs);
  auto got = b.tryGetMany(keys);
  ASSERT_EQ(got.size(), n);
  for (size_t i = 0; i < n; ++i) {
    if (i % 3 == 0) {
      EXPECT_FALSE(got[i].has_value()) << i;
    } else {
      ASSERT_TRUE(got[i].has_value()) << i;
      EXPECT_EQ(std::string(got[i]->begin(), got[i]->end()), "v" + std::to_string(i));
    }
  }
  // Values that together pass one reply's limit come back over several rounds of getAll.
  const Bytes big(storewire::kMaxFrame / 3, 0x7e);
  a->setMany({{"big/0", big}, {"big/1", big}, {"big/2", big}, {"big/3", big}});
  std::vector<Bytes> values;
  std::vector<std::string> missing;
  ASSERT_TRUE(b.getAll({"big/0", "big/1", "big/2", "big/3"}, Deadline(10s), &values, &missing));
  for (const auto& v : values) EXPECT_EQ(v, big);
  // Through a prefix store, and keys set while getAll waits.
  PrefixStore pre("job", a);
  std::thread late([&] {
    std::this_thread::sleep_for(50ms);
    pre.setMany({{"x", text("1")}, {"y", text("2")}});
  });
  ASSERT_TRUE(b.getAll({"job/x", "job/y"}, Deadline(5s), &values, &missing));
  late.join();
  EXPECT_EQ(values, (std::vector<Bytes>{text("1"), text("2")}));
  EXPECT_FALSE(b.getAll({"job/x", "job/z"}, Deadline(50ms), &values, &missing));
  EXPECT_EQ(missing, (std::vector<std::string>{"job/z"}));
}

// The bounded requests of a failure path (a rank's last word): they work like set and get while
// the store answers, and once its host is gone they fail quietly within their bounds.
TEST(Store, BoundedRequestsNeverThrowAndKeepTheirBounds) {
  JobKey key = deriveJobKey("store-test");
  auto server = std::make_unique<TcpStoreServer>(SockAddr::resolve("127.0.0.1", 0).front(), key);
  TcpStoreClient a("127.0.0.1", server->port(), key, 0, Deadline(5s), 5s);
  auto b = std::make_shared<TcpStoreClient>("127.0.0.1", server->port(), key, 1, Deadline(5s), 5s);
  PrefixStore pb("comm", b);
  EXPECT_TRUE(a.setBounded("comm/left/0", text("rank 3 closed its connection"), 500ms));
  auto v = pb.getBounded("left/0", Deadline(200ms), 500ms);
  ASSERT_TRUE(v.has_value());
  EXPECT_EQ(std::string(v->begin(), v->end()), "rank 3 closed its connection");
  auto t0 = std::chrono::steady_clock::now();
  EXPECT_FALSE(pb.getBounded("left/1", Deadline(100ms), 500ms).has_value());  // never set: waits its deadline
  EXPECT_LT(std::chrono::steady_clock::now() - t0, 1s);
  server.reset();
  t0 = std::chrono::steady_clock::now();
  EXPECT_FALSE(a.setBounded("comm/left/0", text("again"), 500ms));
  EXPECT_FALSE(pb.getBounded("left/0", Deadline(100ms), 500ms).has_value());
  EXPECT_LT(std::chrono::steady_clock::now() - t0, 2s);
}

// A counter pushed past INT64_MAX wraps around (two's complement) instead of overflowing inside the
// server (undefined behaviour; found by the store_server fuzzer), and the server goes on serving.
TEST(Store, AddPastTheLargestCounterWraps) {
  JobKey key = deriveJobKey("store-add");
  TcpStoreServer server(SockAddr::resolve("127.0.0.1", 0).front(), key);
  TcpStoreClient a("127.0.0.1", server.port(), key, 0, Deadline(5s), 5s);
  EXPECT_EQ(a.add("c", INT64_MAX), INT64_MAX);
  EXPECT_EQ(a.add("c", 2), INT64_MIN + 1);
  EXPECT_EQ(a.add("c", INT64_MIN), 1);
  EXPECT_EQ(a.add("d", 7), 7);
}

TEST(Store, ClientWithAnotherJobsKeyIsTurnedAway) {
  TcpStoreServer server(SockAddr::resolve("127.0.0.1", 0).front(), deriveJobKey("job A"));
  try {
    TcpStoreClient c("127.0.0.1", server.port(), deriveJobKey("job B"), 3, Deadline(5s), 5s);
    FAIL() << "joined a store with the wrong key";
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), ErrorCode::InvalidUsage);
    EXPECT_NE(std::string(e.what()).find("belongs to another job"), std::string::npos) << e.what();
  }
  EXPECT_GE(server.rejected(), 1);
}

TEST(Store, NobodyListeningNamesHostAndPort) {
  // Find a port nobody listens on.
  int err = 0;
  Socket probe = listenOn(SockAddr::resolve("127.0.0.1", 0).front(), 1, &err);
  int port = localAddress(probe.fd()).port();
  probe.reset();
  try {
    TcpStoreClient c("127.0.0.1", port, deriveJobKey("k"), 2, Deadline(300ms), 1s);
    FAIL() << "connected to nothing";
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), ErrorCode::Timeout);
    std::string w = e.what();
    EXPECT_NE(w.find("127.0.0.1:" + std::to_string(port)), std::string::npos) << w;
    EXPECT_NE(w.find("is rank 0 running"), std::string::npos) << w;
  }
}

TEST(Store, PortTakenSaysWhatToDo) {
  TcpStoreServer first(SockAddr::resolve("127.0.0.1", 0).front(), deriveJobKey("a"));
  try {
    TcpStoreServer second(SockAddr::resolve("127.0.0.1", first.port()).front(), deriveJobKey("b"));
    FAIL() << "bound a taken port";
  } catch (const Error& e) {
    std::string w = e.what();
    EXPECT_NE(w.find("Address already in use"), std::string::npos) << w;
    EXPECT_NE(w.find("MASTER_PORT"), std::string::npos) << w;
  }
}

// A wait is answered by the server when the key is set (one request per quarter second of
// waiting, not a poll every few milliseconds), or empty at the deadline.
TEST(Store, GetWaitsOnTheServerSide) {
  JobKey key = deriveJobKey("wait");
  TcpStoreServer server(SockAddr::resolve("127.0.0.1", 0).front(), key);
  TcpStoreClient waiter("127.0.0.1", server.port(), key, 0, Deadline(5s), 5s);
  TcpStoreClient setter("127.0.0.1", server.port(), key, 1, Deadline(5s), 5s);
  PrefixStore prefixed("p", std::make_shared<TcpStoreClient>("127.0.0.1", server.port(), key, 2, Deadline(5s), 5s));
  const uint64_t before = TcpStoreServer::servedInProcess();
  std::thread later([&] {
    std::this_thread::sleep_for(1200ms);
    setter.setString("k", "v");
    setter.setString("p/k", "w");
  });
  auto v = waiter.get("k", Deadline(10s));
  auto w = prefixed.get("k", Deadline(10s));
  later.join();
  ASSERT_TRUE(v.has_value());
  EXPECT_EQ(std::string(v->begin(), v->end()), "v");
  ASSERT_TRUE(w.has_value());
  EXPECT_EQ(std::string(w->begin(), w->end()), "w");
  // 1.2 s in slices of 250 ms: about 6 requests, and the two sets; a poll would be dozens.
  EXPECT_LT(TcpStoreServer::servedInProcess() - before, 16u);
  const auto t0 = std::chrono::steady_clock::now();
  EXPECT_FALSE(waiter.get("never", Deadline(400ms)).has_value());
  EXPECT_GE(std::chrono::steady_clock::now() - t0, 390ms);
}

// A communicator's init asks the store for a few keys per rank: the last rank in reads the
// records once and hands them to the others in the value they wait for, where each rank read all
// N records (N^2 lookups and copies in the store's one thread).
TEST(Store, AnInitReadsAFewKeysPerRank) {
  loomtest::TransportSetup links("tcp");  // links made on first use: the join alone
  for (int n : {4, 16}) {
    const uint64_t requests = TcpStoreServer::servedInProcess(), keys = TcpStoreServer::keysReadInProcess();
    std::atomic<uint64_t> afterRequests{0}, afterKeys{0};
    loomtest::runOk(n, [&](loom::Communicator& c) {
      c.barrier();
      if (c.rank() == 0) {
        afterRequests = TcpStoreServer::servedInProcess();
        afterKeys = TcpStoreServer::keysReadInProcess();
      }
    });
    const uint64_t r = afterRequests - requests, k = afterKeys - keys;
    std::printf("[ store ] init of %d ranks: %llu requests, %llu keys read\n", n, static_cast<unsigned long long>(r),
                static_cast<unsigned long long>(k));
    EXPECT_LE(r, 8u * static_cast<uint64_t>(n)) << n << " ranks";
    EXPECT_LE(k, 4u * static_cast<uint64_t>(n) + static_cast<uint64_t>(n)) << n << " ranks";  // the records once
  }
}

// With the records going down a tree of the ranks (LOOM_RECORD_TREE), the store's host sends them
// once, not to every rank: the bytes it sends grow with N, not N². The communicators work, and so
// do groups made from them.
TEST(Store, RecordsDownATreeLeaveTheStoreAFewBytesPerRank) {
  loomtest::TransportSetup links("tcp");
  const int n = 24;
  uint64_t sent[2] = {0, 0};
  for (int tree : {0, 1}) {
    loomtest::EnvGuard setting("LOOM_RECORD_TREE", tree ? "2" : "off");
    const uint64_t before = TcpStoreServer::bytesSentInProcess();
    std::atomic<uint64_t> after{0};
    loomtest::runOk(n, [&](loom::Communicator& c) {
      c.barrier();
      if (c.rank() == 0) after = TcpStoreServer::bytesSentInProcess();
      std::vector<int64_t> v{c.rank() + 1};
      c.allReduce(v.data(), v.data(), 1, loom::DataType::Int64, loom::ReduceOp::Sum);
      EXPECT_EQ(v[0], int64_t{n} * (n + 1) / 2);
      // Groups of 8 made from it meet through its store: their records go down trees too.
      std::vector<int> members;
      for (int r = c.rank() % 3; r < n; r += 3) members.push_back(r);
      loom::Communicator part = c.group(members, "third " + std::to_string(c.rank() % 3));
      int64_t one = 1;
      part.allReduce(&one, &one, 1, loom::DataType::Int64, loom::ReduceOp::Sum);
      EXPECT_EQ(one, 8);
    });
    sent[tree] = after - before;
  }
  std::printf("[ store ] init of %d ranks: the store sent %llu bytes, %llu with the records down a tree\n", n,
              static_cast<unsigned long long>(sent[0]), static_cast<unsigned long long>(sent[1]));
  EXPECT_LT(sent[1] * 4, sent[0]);
}

// Requests a client sends behind a wait are served after it, in order: a set queued behind a wait
// for its own key does not answer that wait.
TEST(Store, RequestsBehindAWaitKeepTheirOrder) {
  JobKey key = deriveJobKey("wait-order");
  TcpStoreServer server(SockAddr::resolve("127.0.0.1", 0).front(), key);
  SockAddr addr = SockAddr::resolve("127.0.0.1", server.port()).front();
  int err = 0;
  Socket s = connectTo(addr, Deadline(2s), &err);
  Bytes msg;
  ASSERT_TRUE(clientHello(s.fd(), key, &msg));
  Bytes ms(4);
  storewire::putU32(ms.data(), 300);
  for (const Bytes& req : {storewire::encodeRequest(storewire::Op::Wait, "k", ms),
                           storewire::encodeRequest(storewire::Op::Set, "k", text("v")),
                           storewire::encodeRequest(storewire::Op::TryGet, "k", {})})
    msg.insert(msg.end(), req.begin(), req.end());
  ASSERT_EQ(sendAll(s.fd(), msg.data(), msg.size(), Deadline(2s)), 0);
  uint8_t proof[32];
  ASSERT_EQ(recvAll(s.fd(), proof, 32, Deadline(2s)), 0);
  std::vector<std::pair<uint8_t, std::string>> replies;
  for (int i = 0; i < 3; ++i) {
    uint8_t head[5];
    ASSERT_EQ(recvAll(s.fd(), head, 5, Deadline(5s)), 0);
    std::string payload(storewire::getU32(head) - 1, '\0');
    if (!payload.empty()) {
      ASSERT_EQ(recvAll(s.fd(), payload.data(), payload.size(), Deadline(2s)), 0);
    }
    replies.emplace_back(head[4], payload);
  }
  EXPECT_EQ(replies[0].first, static_cast<uint8_t>(storewire::Reply::NotFound));  // its time passed
  EXPECT_EQ(replies[1].first, static_cast<uint8_t>(storewire::Reply::Ok));
  EXPECT_EQ(replies[2], std::make_pair(static_cast<uint8_t>(storewire::Reply::Ok), std::string("v")));
}

namespace {

// A client written by hand on a socket of its own, whose requests go out pipelined.
struct RawClient {
  Socket sock;
  bool open = false;
  bool connect(const SockAddr& addr, const JobKey& key) {
    int err = 0;
    sock = connectTo(addr, Deadline(2s), &err);
    Bytes msg;
    uint8_t proof[32];
    open = sock.valid() && clientHello(sock.fd(), key, &msg) &&
           sendAll(sock.fd(), msg.data(), msg.size(), Deadline(2s)) == 0 &&
           recvAll(sock.fd(), proof, sizeof proof, Deadline(2s)) == 0;
    return open;
  }
  bool send(const std::vector<Bytes>& requests) {
    Bytes msg;
    for (const Bytes& r : requests) msg.insert(msg.end(), r.begin(), r.end());
    return sendAll(sock.fd(), msg.data(), msg.size(), Deadline(2s)) == 0;
  }
  // The next reply: its code and value ("" on a broken connection, with code 0).
  std::pair<uint8_t, std::string> reply(std::chrono::milliseconds within = 10s) {
    uint8_t head[5];
    if (recvAll(sock.fd(), head, 5, Deadline(within)) != 0) return {0, ""};
    std::string payload(storewire::getU32(head) - 1, '\0');
    if (!payload.empty() && recvAll(sock.fd(), payload.data(), payload.size(), Deadline(2s)) != 0) return {0, ""};
    return {head[4], payload};
  }
};

Bytes waitFor(const char* key, uint32_t ms) {
  Bytes v(4);
  storewire::putU32(v.data(), ms);
  return storewire::encodeRequest(storewire::Op::Wait, key, v);
}

}  // namespace

// Hundreds of clients waiting at once, on a few keys, on keys never set, behind each other, some
// leaving mid-wait: each wait is answered once, with its own key's value (or NotFound when its time
// passes), and the requests behind it then run in order (the store indexes its waits by key and by
// deadline instead of looking at every client on every request).
TEST(Store, ManyWaitersAreEachAnsweredOnceWithTheirOwnKey) {
  JobKey key = deriveJobKey("many-waiters");
  TcpStoreServer server(SockAddr::resolve("127.0.0.1", 0).front(), key);
  const SockAddr addr = SockAddr::resolve("127.0.0.1", server.port()).front();
  constexpr int kClients = 300;
  std::vector<RawClient> clients(kClients);
  const auto ok = static_cast<uint8_t>(storewire::Reply::Ok);
  const auto notFound = static_cast<uint8_t>(storewire::Reply::NotFound);
  auto keyOf = [](int i) { return "k" + std::to_string(i % 10); };
  for (int i = 0; i < kClients; ++i) {
    ASSERT_TRUE(clients[static_cast<size_t>(i)].connect(addr, key)) << "client " << i;
    std::vector<Bytes> reqs;
    if (i % 7 == 0) {
      reqs.push_back(waitFor("never", 300));  // times out
    } else {
      reqs.push_back(waitFor(keyOf(i).c_str(), 20000));
    }
    // Behind the wait: a set that only runs once the wait is answered.
    reqs.push_back(storewire::encodeRequest(storewire::Op::Set, "done/" + std::to_string(i), text("1")));
    ASSERT_TRUE(clients[static_cast<size_t>(i)].send(reqs));
  }
  // A chain: "a" answers A, whose set of "b" behind its wait answers B.
  RawClient a, b;
  ASSERT_TRUE(a.connect(addr, key) && b.connect(addr, key));
  ASSERT_TRUE(a.send({waitFor("a", 20000), storewire::encodeRequest(storewire::Op::Set, "b", text("from a"))}));
  ASSERT_TRUE(b.send({waitFor("b", 20000)}));
  // Some leave while they wait.
  for (int i = 11; i < kClients; i += 11)
    if (i % 7 != 0) clients[static_cast<size_t>(i)].sock.reset(-1);
  TcpStoreClient setter("127.0.0.1", server.port(), key, 0, Deadline(5s), 5s);
  std::this_thread::sleep_for(500ms);  // the "never" waits run out first
  for (int k = 0; k < 10; ++k) setter.setString("k" + std::to_string(k), "v" + std::to_string(k));
  setter.setString("a", "go");
  for (int i = 0; i < kClients; ++i) {
    RawClient& c = clients[static_cast<size_t>(i)];
    if (!c.sock.valid()) continue;
    const auto first = c.reply();
    if (i % 7 == 0) {
      EXPECT_EQ(first.first, notFound) << "client " << i;
    } else {
      EXPECT_EQ(first, std::make_pair(ok, "v" + std::to_string(i % 10))) << "client " << i;
    }
    EXPECT_EQ(c.reply().first, ok) << "client " << i << "'s set behind its wait";
  }
  EXPECT_EQ(a.reply(), std::make_pair(ok, std::string("go")));
  EXPECT_EQ(a.reply().first, ok);
  EXPECT_EQ(b.reply(), std::make_pair(ok, std::string("from a")));
  for (int i = 0; i < kClients; ++i) {
    const bool left = i % 11 == 0 && i % 7 != 0 && i > 0;
    EXPECT_EQ(setter.tryGet("done/" + std::to_string(i)).has_value(), !left) << "client " << i;
  }
  // Nothing more comes: each wait was answered once.
  for (int i = 1; i < kClients; i += 37) {
    RawClient& c = clients[static_cast<size_t>(i)];
    if (c.sock.valid()) {
      EXPECT_EQ(c.reply(200ms).first, 0) << "client " << i;
    }
  }
  EXPECT_EQ(server.rejected(), 0);
}

TEST(Store, StrayClientsAreDroppedAndTheStoreGoesOn) {
  JobKey key = deriveJobKey("stray");
  TcpStoreServer server(SockAddr::resolve("127.0.0.1", 0).front(), key);
  SockAddr addr = SockAddr::resolve("127.0.0.1", server.port()).front();
  EXPECT_TRUE(strayIsClosed(addr, text("GET / HTTP/1.0\r\n\r\n")));
  Bytes wrongProof = text("LOOMSTC1");
  wrongProof.resize(56, 0xab);
  EXPECT_TRUE(strayIsClosed(addr, wrongProof));
  // An authenticated client that sends a 4 GiB length field is dropped, not served.
  TcpStoreClient good("127.0.0.1", server.port(), key, 0, Deadline(5s), 5s);
  {
    int err = 0;
    Socket s = connectTo(addr, Deadline(2s), &err);
    Bytes msg;
    ASSERT_TRUE(clientHello(s.fd(), key, &msg));
    ASSERT_EQ(sendAll(s.fd(), msg.data(), msg.size(), Deadline(2s)), 0);
    uint8_t proof[32];
    EXPECT_EQ(recvAll(s.fd(), proof, 32, Deadline(2s)), 0);
    const uint8_t huge[] = {0xff, 0xff, 0xff, 0xff, 1};
    ASSERT_EQ(sendAll(s.fd(), huge, sizeof(huge), Deadline(2s)), 0);
    uint8_t more;
    EXPECT_EQ(recvAll(s.fd(), &more, 1, Deadline(3s)), ECONNRESET);  // dropped
  }
  good.setString("still", "works");
  EXPECT_TRUE(good.tryGet("still").has_value());
  EXPECT_GE(server.rejected(), 3);
}

// Strays hit the store and the peer ports while a 4-rank job forms and runs; the job's data is
// exact and every stray is turned away. Over TCP, the peer ports take the links made on first use
// meanwhile.
class StoreStrays : public ::testing::TestWithParam<const char*> {};

TEST_P(StoreStrays, JobFormsAndRunsDespiteStrays) {
  loomtest::TransportSetup links(GetParam());
  UniqueId id = UniqueId::create();
  UniqueIdFields f;
  std::string why;
  ASSERT_TRUE(decodeUniqueId(id.bytes().data(), id.bytes().size(), &f, &why));
  std::atomic<bool> stop{false};
  std::atomic<int> storeRejected{0}, peerRejected{0};
  std::thread stray([&] {
    std::string prefix = "id-";
    static const char* d = "0123456789abcdef";
    for (int i = 0; i < 8; ++i) {
      prefix += d[f.commId[i] >> 4];
      prefix += d[f.commId[i] & 15];
    }
    Bytes wrongKey = text("LOOMSTC1");
    wrongKey.resize(56, 0x11);
    Bytes peerJunk = text("LOOMPEC1");
    peerJunk.resize(88, 0x22);
    Bytes hugeLen(64, 0xff);
    TcpStoreClient spy(f.store.host(), f.store.port(), f.key, -1, Deadline(10s), 10s);
    // The store stops with the job's last communicator: from then on the spy's reads fail.
    while (!stop.load()) try {
        for (const Bytes& b : {text("\x16\x03\x01 garbage"), wrongKey, hugeLen})
          storeRejected += strayIsClosed(f.store, b) ? 1 : 0;
        for (int r = 1; r < 4; ++r) {
          // Each rank's record (comm/meeting.hpp) holds what its transports published.
          auto record = spy.tryGet(prefix + "/record/" + std::to_string(r));
          std::vector<std::pair<std::string, Bytes>> pairs;
          std::string why;
          std::optional<Bytes> ep;
          if (record && storewire::decodePairs(*record, &pairs, &why))
            for (auto& [k, v] : pairs)
              if (k == "tcp/" + std::to_string(r)) ep = v;
          SockAddr peer;
          // The record: an interface count, then each interface's address and name.
          if (!ep || ep->size() < 1 + SockAddr::kWireBytes || !SockAddr::fromWire(ep->data() + 1, &peer)) continue;
          for (const Bytes& b : {text("SSH-2.0-OpenSSH_9.2\r\n"), peerJunk, hugeLen})
            peerRejected += strayIsClosed(peer, b) ? 1 : 0;
        }
      } catch (const Error&) {
        break;
      }
  });
  auto results = loomtest::runRanks(
      4,
      [&](Communicator& c) {
        if (c.rank() == 0) std::this_thread::sleep_for(1500ms);  // the others wait, under fire
        for (int it = 0; it < 20; ++it) {
          const int to = (c.rank() + 1) % 4, from = (c.rank() + 3) % 4;
          std::vector<uint8_t> out(100000 + it), in(out.size());
          for (size_t i = 0; i < out.size(); ++i) out[i] = loomtest::pattern(c.rank(), to, it, i);
          auto r = c.irecv(in.data(), in.size(), DataType::Uint8, from);
          c.send(out.data(), out.size(), DataType::Uint8, to);
          r.wait();
          for (size_t i = 0; i < in.size(); ++i)
            if (in[i] != loomtest::pattern(from, c.rank(), it, i)) FAIL() << "corrupted byte " << i;
          c.barrier();
          std::this_thread::sleep_for(20ms);
        }
      },
      {}, std::chrono::seconds(120), &id);
  stop = true;
  stray.join();
  for (int r = 0; r < 4; ++r) EXPECT_EQ(results[r].error, "") << "rank " << r;
  EXPECT_GT(storeRejected.load(), 0);
  EXPECT_GT(peerRejected.load(), 0);
}

INSTANTIATE_TEST_SUITE_P(Links, StoreStrays, ::testing::Values("shm", "tcp"));
