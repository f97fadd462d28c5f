// The last step of an ib link made on first use (transport/ib/link_exchange.hpp), against a peer
// that goes before the link is up: a peer that left a word in the store (its communicator failed
// or was aborted) is named with it, whether it closed the side channel or the kernel reset it;
// one that left none is named as gone.
#include "transport/ib/link_exchange.hpp"

#include <gtest/gtest.h>
#include <sys/socket.h>

#include <future>
#include <string>

#include "core/progress_engine.hpp"

namespace loom {
namespace ib {
namespace {

// Runs an exchange on one end of a socket pair (no queue pairs: it fails before it needs them),
// with `word` as the peer's last word in the store, closes the other end (after reading what the
// exchange sent, or with it unread: a reset) and returns the error the exchange reported.
std::string failureWhenThePeerGoes(const std::string& word, bool reset) {
  int fds[2];
  EXPECT_EQ(socketpair(AF_UNIX, SOCK_STREAM, 0, fds), 0);
  Socket mine(fds[0]), theirs(fds[1]);
  std::promise<Status> failed;
  LinkExchange::Steps steps;
  steps.connect = [](IbConnection&, const std::string&) { ADD_FAILURE() << "the peer sent no addresses"; };
  steps.done = [](std::unique_ptr<IbConnection>, Socket) { ADD_FAILURE() << "no link without the peer"; };
  steps.failed = [&](const Status& why, std::unique_ptr<IbConnection> conn) {
    EXPECT_EQ(conn, nullptr);
    failed.set_value(why);
  };
  steps.lastWord = [word](std::chrono::milliseconds) { return word; };
  ProgressEngine engine(0);
  LinkExchange exchange(0, 1, nullptr, "addresses", std::move(mine), &engine, std::chrono::seconds(10),
                        std::move(steps));
  if (!reset) {
    // Takes what the exchange sent: its close is then an orderly end of the stream.
    char buf[64];
    EXPECT_GT(::recv(theirs.fd(), buf, sizeof buf, 0), 0);
  }
  theirs.reset();
  auto got = failed.get_future();
  if (got.wait_for(std::chrono::seconds(10)) != std::future_status::ready) {
    ADD_FAILURE() << "the exchange did not see its peer go";
    return "";
  }
  const Status s = got.get();
  EXPECT_EQ(s.code, ErrorCode::Remote);
  EXPECT_EQ(s.peer, 1);
  return s.message;
}

TEST(LinkExchange, APeerThatLeftAWordIsNamedWithIt) {
  for (bool reset : {false, true}) {
    const std::string why = failureWhenThePeerGoes("communicator \"loom\" was aborted", reset);
    EXPECT_EQ(why, "ib: cannot link rank 1: rank 1 left the communicator: communicator \"loom\" was aborted")
        << (reset ? "reset" : "closed");
  }
}

TEST(LinkExchange, APeerThatLeftNoWordIsNamedAsGone) {
  EXPECT_NE(failureWhenThePeerGoes("", false).find("it closed the link's side channel while setting the link up"),
            std::string::npos);
  EXPECT_NE(failureWhenThePeerGoes("", true).find("its side channel failed: "), std::string::npos);
}

}  // namespace
}  // namespace ib
}  // namespace loom
