// Sockets: addresses (IPv4 and IPv6), an owning fd, and the deadline-bounded blocking helpers
// used during bootstrap. The data path (tcp/) uses the fds non-blocking through the progress engine.
#pragma once

#include <sys/socket.h>

#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include "core/deadline.hpp"

namespace loom {

/// An IPv4 or IPv6 socket address.
class SockAddr {
 public:
  SockAddr();
  SockAddr(const sockaddr* sa, socklen_t len);

  /// Resolves a host name or numeric address (either family). Throws Error(System) naming the host.
  static std::vector<SockAddr> resolve(const std::string& host, int port);
  /// The wildcard address of a family (AF_INET6 accepts IPv4 too).
  static SockAddr any(int family, int port);

  int family() const { return storage_.ss_family; }
  int port() const;
  void setPort(int port);
  /// Numeric host text: "192.0.2.2", "::1".
  std::string host() const;
  /// "192.0.2.2:1234" or "[::1]:1234".
  std::string toString() const;
  bool isLoopback() const;

  const sockaddr* raw() const { return reinterpret_cast<const sockaddr*>(&storage_); }
  socklen_t length() const { return len_; }

  /// Fixed-size wire form (20 bytes): family, port, 16 address bytes.
  static constexpr size_t kWireBytes = 20;
  void toWire(uint8_t* out) const;
  /// Returns false when the bytes do not hold a valid address.
  static bool fromWire(const uint8_t* in, SockAddr* out);

 private:
  sockaddr_storage storage_;
  socklen_t len_;
};

/// An owned file descriptor; closes on destruction.
class Socket {
 public:
  Socket() = default;
  explicit Socket(int fd) : fd_(fd) {}
  Socket(Socket&& o) noexcept : fd_(o.release()) {}
  Socket& operator=(Socket&& o) noexcept;
  Socket(const Socket&) = delete;
  Socket& operator=(const Socket&) = delete;
  ~Socket() { reset(); }

  int fd() const { return fd_; }
  bool valid() const { return fd_ >= 0; }
  int release() {
    int f = fd_;
    fd_ = -1;
    return f;
  }
  void reset(int fd = -1);

 private:
  int fd_ = -1;
};

void setNonBlocking(int fd);
void setNoDelay(int fd);
/// Acknowledges what the socket has received now, and leaves the kernel's delayed-ACK mode
/// (TCP_QUICKACK; the kernel may return to it later, so callers set it again after reads).
void setQuickAck(int fd);
/// Sets SO_RCVLOWAT: the socket reads as readable (poll, epoll) once `bytes` are queued (or it
/// closed, or its memory runs short).
void setLowWater(int fd, int bytes);
/// Sets SO_SNDBUF and SO_RCVBUF (0: leave the kernel's autotuning alone).
void setBufferSizes(int fd, int bytes);
/// The local address a socket is bound to.
SockAddr localAddress(int fd);
/// The remote address of a connected socket.
SockAddr peerAddress(int fd);

/// Creates a non-blocking listening socket bound to `addr` (SO_REUSEADDR). On failure returns an
/// invalid Socket and sets *err to errno.
/// A listening socket on `addr`. Port 0 means any: the kernel's pick, or with LOOM_PORT_RANGE
/// ("lo-hi", for firewalled clusters) the first free port of that range (err: EADDRINUSE when it
/// is full, EINVAL when LOOM_PORT_RANGE does not read as a range).
Socket listenOn(const SockAddr& addr, int backlog, int* err);
/// Advice for a listenOn failure with `err` under LOOM_PORT_RANGE ("" when it does not apply).
std::string listenAdvice(int err);
/// Parses "lo-hi" (1 <= lo <= hi <= 65535).
bool parsePortRange(const std::string& text, int* lo, int* hi);

/// Connects a non-blocking socket to `addr`, waiting at most until `deadline`. On failure returns
/// an invalid Socket and sets *err (ETIMEDOUT when the deadline passed).
Socket connectTo(const SockAddr& addr, const Deadline& deadline, int* err);

/// Writes all of buf (non-blocking fd, poll-driven) before the deadline. Returns 0 or an errno
/// (ETIMEDOUT, EPIPE...).
int sendAll(int fd, const void* buf, size_t len, const Deadline& deadline);
/// Reads exactly len bytes before the deadline. Returns 0, an errno, or ECONNRESET on end of file.
int recvAll(int fd, void* buf, size_t len, const Deadline& deadline);

}  // namespace loom
