// TcpConnection: the link to one peer over one or more TCP sockets ("streams").
//
// Protocol (frame.hpp): messages up to the eager limit go whole on stream 0; larger ones are
// announced (RTS), accepted by the receiver once a matching receive is posted (CTS), then striped
// as DATA frames over all streams and received straight into the receive buffer. Matching is per
// tag in arrival order on stream 0, which is send order. Receives that arrive before they are
// posted are kept ("unexpected": an eager payload is buffered, an RTS only remembered).
//
// Threads: isend/irecv run on the caller's thread and may write to a socket directly (a send on
// an idle socket then costs no thread hand-off); reading and the rest of writing happen on the
// progress engine's thread. One mutex, mu_, guards all state; requests are completed with it held
// (Request never calls back into the connection).
#pragma once

#include <deque>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "core/progress_engine.hpp"
#include "transport/socket.hpp"
#include "transport/tcp/frame.hpp"
#include "transport/transport.hpp"

namespace loom {
namespace tcp {

struct TcpOptions {
  size_t eagerBytes = 64 * 1024;       ///< largest message sent without RTS/CTS
  size_t stripeMinBytes = 256 * 1024;  ///< a slice per stream is at least this big
};

class TcpConnection : public Connection {
 public:
  /// Takes the connected, authenticated sockets (index = stream). `engine` and `failure` outlive it.
  TcpConnection(int rank, int peer, std::vector<Socket> sockets, ProgressEngine* engine,
                std::shared_ptr<FailureState> failure, TcpOptions options, std::string description);
  ~TcpConnection() override;

  /// Registers the sockets with the engine.
  void start();

  int peer() const override { return peer_; }
  void isend(const RequestPtr& req, const void* buf, size_t bytes, uint32_t tag) noexcept override;
  void irecv(const RequestPtr& req, void* buf, size_t bytes, uint32_t tag) noexcept override;
  void failAll(const Status& status) noexcept override;
  std::string describe() const override { return description_; }

 private:
  struct SendOp {
    RequestPtr req;
    const uint8_t* buf = nullptr;
    size_t bytes = 0;
    uint32_t tag = 0;
    uint64_t seq = 0;
    int framesLeft = 0;
  };
  struct RecvOp {
    RequestPtr req;
    uint8_t* buf = nullptr;
    size_t capacity = 0;
    size_t bytes = 0;  // size of the matched message
    size_t received = 0;
    uint32_t tag = 0;
    uint64_t seq = 0;  // the sender's sequence number, once an RTS matched
  };
  struct Unexpected {
    FrameHeader hdr;
    std::vector<uint8_t> data;  // eager payload
    bool complete = false;
    std::shared_ptr<RecvOp> claimedBy;
  };
  struct OutFrame {
    uint8_t hdr[kHeaderBytes];
    const uint8_t* payload = nullptr;
    size_t payloadLen = 0;
    size_t sent = 0;
    std::shared_ptr<SendOp> op;  // completed when its last frame is written
  };
  enum class Sink { None, Direct, Discard, Unexpected, Data };
  struct Stream;
  class Handler;

  void onEvents(int stream, uint32_t events) noexcept;
  Status readLocked(Stream& s);
  Status flushLocked(Stream& s);
  Status onHeaderLocked(Stream& s, const FrameHeader& h);
  Status finishPayloadLocked(Stream& s);
  void sendCtsLocked(uint64_t seq, bool accept);
  void enqueueLocked(Stream& s, const FrameHeader& h, const uint8_t* payload, size_t len, std::shared_ptr<SendOp> op);
  void onSentLocked(OutFrame& f);
  void deliverUnexpectedLocked(Unexpected& u, RecvOp& op);
  void acceptRtsLocked(const FrameHeader& h, const std::shared_ptr<RecvOp>& op);
  bool hasPendingLocked() const;
  /// Fails all pending requests and closes the sockets; returns whether anything was pending.
  bool failLocked(const Status& status);
  Status truncation(size_t message, const RecvOp& op) const;
  Status malformed(const std::string& why) const;

  const int rank_;
  const int peer_;
  ProgressEngine* const engine_;  // outlives this: the communicator stops it before destroying us
  const std::shared_ptr<FailureState> failure_;
  const TcpOptions options_;
  const std::string description_;

  std::mutex mu_;
  std::vector<std::unique_ptr<Stream>> streams_;
  std::map<uint32_t, std::deque<std::shared_ptr<RecvOp>>> posted_;
  std::map<uint32_t, std::deque<std::shared_ptr<Unexpected>>> unexpected_;
  std::map<uint64_t, std::shared_ptr<SendOp>> awaitingCts_;
  std::map<uint64_t, std::shared_ptr<RecvOp>> incoming_;
  uint64_t nextSendSeq_ = 0;
  uint64_t nextRecvSeq_ = 0;
  bool closed_ = false;
  Status closedStatus_;
};

}  // namespace tcp
}  // namespace loom
