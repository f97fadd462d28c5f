#include "net/socket.hpp"

#include <arpa/inet.h>
#include <fcntl.h>
#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <random>

#include "core/format.hpp"
#include "core/param.hpp"
#include "core/status.hpp"

namespace loom {
namespace {
LOOM_PARAM_STR(portRangeParam, "LOOM_PORT_RANGE", "",
               "ports to listen on, lo-hi, for firewalled clusters (peer links and unique-id stores; default: any)");
}  // namespace

SockAddr::SockAddr() : len_(0) { std::memset(&storage_, 0, sizeof(storage_)); }

SockAddr::SockAddr(const sockaddr* sa, socklen_t len) : SockAddr() {
  if (len > sizeof(storage_)) len = sizeof(storage_);
  std::memcpy(&storage_, sa, len);
  len_ = len;
}

std::vector<SockAddr> SockAddr::resolve(const std::string& host, int port) {
  addrinfo hints{};
  hints.ai_family = AF_UNSPEC;
  hints.ai_socktype = SOCK_STREAM;
  addrinfo* res = nullptr;
  std::string service = std::to_string(port);
  int rc = getaddrinfo(host.c_str(), service.c_str(), &hints, &res);
  if (rc != 0) {
    LOOM_THROW(ErrorCode::System, -1,
               strFormat("cannot resolve host \"%s\": %s (check MASTER_ADDR / the host list)", host.c_str(),
                         gai_strerror(rc)));
  }
  std::vector<SockAddr> out;
  for (addrinfo* ai = res; ai != nullptr; ai = ai->ai_next) {
    if (ai->ai_family == AF_INET || ai->ai_family == AF_INET6) out.emplace_back(ai->ai_addr, ai->ai_addrlen);
  }
  freeaddrinfo(res);
  return out;
}

SockAddr SockAddr::any(int family, int port) {
  SockAddr a;
  if (family == AF_INET6) {
    auto* s6 = reinterpret_cast<sockaddr_in6*>(&a.storage_);
    s6->sin6_family = AF_INET6;
    s6->sin6_addr = in6addr_any;
    a.len_ = sizeof(sockaddr_in6);
  } else {
    auto* s4 = reinterpret_cast<sockaddr_in*>(&a.storage_);
    s4->sin_family = AF_INET;
    s4->sin_addr.s_addr = htonl(INADDR_ANY);
    a.len_ = sizeof(sockaddr_in);
  }
  a.setPort(port);
  return a;
}

int SockAddr::port() const {
  if (family() == AF_INET) return ntohs(reinterpret_cast<const sockaddr_in*>(&storage_)->sin_port);
  if (family() == AF_INET6) return ntohs(reinterpret_cast<const sockaddr_in6*>(&storage_)->sin6_port);
  return -1;
}

void SockAddr::setPort(int port) {
  if (family() == AF_INET) reinterpret_cast<sockaddr_in*>(&storage_)->sin_port = htons(static_cast<uint16_t>(port));
  if (family() == AF_INET6) reinterpret_cast<sockaddr_in6*>(&storage_)->sin6_port = htons(static_cast<uint16_t>(port));
}

std::string SockAddr::host() const {
  char buf[INET6_ADDRSTRLEN] = {0};
  if (family() == AF_INET) {
    inet_ntop(AF_INET, &reinterpret_cast<const sockaddr_in*>(&storage_)->sin_addr, buf, sizeof(buf));
  } else if (family() == AF_INET6) {
    inet_ntop(AF_INET6, &reinterpret_cast<const sockaddr_in6*>(&storage_)->sin6_addr, buf, sizeof(buf));
  } else {
    return "?";
  }
  return buf;
}

std::string SockAddr::toString() const {
  if (family() == AF_INET6) return "[" + host() + "]:" + std::to_string(port());
  return host() + ":" + std::to_string(port());
}

bool SockAddr::isLoopback() const {
  if (family() == AF_INET) {
    return (ntohl(reinterpret_cast<const sockaddr_in*>(&storage_)->sin_addr.s_addr) >> 24) == 127;
  }
  if (family() == AF_INET6) return IN6_IS_ADDR_LOOPBACK(&reinterpret_cast<const sockaddr_in6*>(&storage_)->sin6_addr);
  return false;
}

void SockAddr::toWire(uint8_t* out) const {
  std::memset(out, 0, kWireBytes);
  out[0] = family() == AF_INET6 ? 6 : 4;
  uint16_t p = static_cast<uint16_t>(port());
  out[2] = static_cast<uint8_t>(p >> 8);
  out[3] = static_cast<uint8_t>(p & 0xff);
  if (family() == AF_INET) {
    std::memcpy(out + 4, &reinterpret_cast<const sockaddr_in*>(&storage_)->sin_addr, 4);
  } else {
    std::memcpy(out + 4, &reinterpret_cast<const sockaddr_in6*>(&storage_)->sin6_addr, 16);
  }
}

bool SockAddr::fromWire(const uint8_t* in, SockAddr* out) {
  int port = (in[2] << 8) | in[3];
  if (port == 0) return false;
  if (in[0] == 4) {
    sockaddr_in s4{};
    s4.sin_family = AF_INET;
    s4.sin_port = htons(static_cast<uint16_t>(port));
    std::memcpy(&s4.sin_addr, in + 4, 4);
    *out = SockAddr(reinterpret_cast<sockaddr*>(&s4), sizeof(s4));
    return true;
  }
  if (in[0] == 6) {
    sockaddr_in6 s6{};
    s6.sin6_family = AF_INET6;
    s6.sin6_port = htons(static_cast<uint16_t>(port));
    std::memcpy(&s6.sin6_addr, in + 4, 16);
    *out = SockAddr(reinterpret_cast<sockaddr*>(&s6), sizeof(s6));
    return true;
  }
  return false;
}

Socket& Socket::operator=(Socket&& o) noexcept {
  if (this != &o) reset(o.release());
  return *this;
}

void Socket::reset(int fd) {
  if (fd_ >= 0) ::close(fd_);
  fd_ = fd;
}

void setNonBlocking(int fd) {
  int flags = fcntl(fd, F_GETFL, 0);
  fcntl(fd, F_SETFL, flags | O_NONBLOCK);
}

void setNoDelay(int fd) {
  int one = 1;
  setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
}

void setQuickAck(int fd) {
  int one = 1;
  setsockopt(fd, IPPROTO_TCP, TCP_QUICKACK, &one, sizeof(one));
}

void setLowWater(int fd, int bytes) { setsockopt(fd, SOL_SOCKET, SO_RCVLOWAT, &bytes, sizeof(bytes)); }

void setBufferSizes(int fd, int bytes) {
  if (bytes <= 0) return;
  setsockopt(fd, SOL_SOCKET, SO_SNDBUF, &bytes, sizeof(bytes));
  setsockopt(fd, SOL_SOCKET, SO_RCVBUF, &bytes, sizeof(bytes));
}

SockAddr localAddress(int fd) {
  sockaddr_storage ss{};
  socklen_t len = sizeof(ss);
  getsockname(fd, reinterpret_cast<sockaddr*>(&ss), &len);
  return SockAddr(reinterpret_cast<sockaddr*>(&ss), len);
}

SockAddr peerAddress(int fd) {
  sockaddr_storage ss{};
  socklen_t len = sizeof(ss);
  if (getpeername(fd, reinterpret_cast<sockaddr*>(&ss), &len) != 0) return SockAddr();
  return SockAddr(reinterpret_cast<sockaddr*>(&ss), len);
}

std::string listenAdvice(int err) {
  const std::string range = portRangeParam();
  if (range.empty()) return "";
  if (err == EINVAL) return "; LOOM_PORT_RANGE=" + range + " does not read as a range of ports such as 40000-40100";
  if (err == EADDRINUSE) return "; every port of LOOM_PORT_RANGE=" + range + " is in use: widen the range";
  return "";
}

bool parsePortRange(const std::string& text, int* lo, int* hi) {
  char dash = 0;
  char tail = 0;
  int a = 0, b = 0;
  if (std::sscanf(text.c_str(), "%d%c%d%c", &a, &dash, &b, &tail) != 3 || dash != '-') return false;
  if (a < 1 || b > 65535 || a > b) return false;
  *lo = a;
  *hi = b;
  return true;
}

namespace {

Socket listenExactly(const SockAddr& addr, int backlog, int* err) {
  Socket s(::socket(addr.family(), SOCK_STREAM | SOCK_CLOEXEC | SOCK_NONBLOCK, 0));
  if (!s.valid()) {
    *err = errno;
    return Socket();
  }
  int one = 1;
  setsockopt(s.fd(), SOL_SOCKET, SO_REUSEADDR, &one, sizeof(one));
  if (addr.family() == AF_INET6) {
    int zero = 0;  // a wildcard IPv6 listener also accepts IPv4
    setsockopt(s.fd(), IPPROTO_IPV6, IPV6_V6ONLY, &zero, sizeof(zero));
  }
  if (::bind(s.fd(), addr.raw(), addr.length()) != 0 || ::listen(s.fd(), backlog) != 0) {
    *err = errno;
    return Socket();
  }
  *err = 0;
  return s;
}

}  // namespace

Socket listenOn(const SockAddr& addr, int backlog, int* err) {
  // Any port (0), with LOOM_PORT_RANGE set: the first free one of the range, from a random start
  // (firewalled clusters open a range; jobs sharing a host should not all try the same port first).
  const std::string range = portRangeParam();
  int lo = 0, hi = 0;
  if (addr.port() != 0 || range.empty()) return listenExactly(addr, backlog, err);
  if (!parsePortRange(range, &lo, &hi)) {
    *err = EINVAL;
    return Socket();
  }
  const int span = hi - lo + 1;
  const int start = static_cast<int>(std::random_device{}() % static_cast<unsigned>(span));
  for (int i = 0; i < span; ++i) {
    SockAddr a = addr;
    a.setPort(lo + (start + i) % span);
    Socket s = listenExactly(a, backlog, err);
    if (s.valid() || *err != EADDRINUSE) return s;
  }
  *err = EADDRINUSE;
  return Socket();
}

Socket connectTo(const SockAddr& addr, const Deadline& deadline, int* err) {
  Socket s(::socket(addr.family(), SOCK_STREAM | SOCK_CLOEXEC | SOCK_NONBLOCK, 0));
  if (!s.valid()) {
    *err = errno;
    return Socket();
  }
  if (::connect(s.fd(), addr.raw(), addr.length()) != 0) {
    if (errno != EINPROGRESS) {
      *err = errno;
      return Socket();
    }
    pollfd p{s.fd(), POLLOUT, 0};
    int rc;
    do {
      rc = ::poll(&p, 1, deadline.remainingMs());
    } while (rc < 0 && errno == EINTR);
    if (rc == 0) {
      *err = ETIMEDOUT;
      return Socket();
    }
    int soerr = 0;
    socklen_t len = sizeof(soerr);
    getsockopt(s.fd(), SOL_SOCKET, SO_ERROR, &soerr, &len);
    if (rc < 0 || soerr != 0) {
      *err = rc < 0 ? errno : soerr;
      return Socket();
    }
  }
  *err = 0;
  return s;
}

namespace {

int waitFor(int fd, short events, const Deadline& deadline) {
  pollfd p{fd, events, 0};
  for (;;) {
    int rc = ::poll(&p, 1, deadline.remainingMs());
    if (rc > 0) return 0;
    if (rc == 0) return ETIMEDOUT;
    if (errno != EINTR) return errno;
  }
}

}  // namespace

int sendAll(int fd, const void* buf, size_t len, const Deadline& deadline) {
  const char* p = static_cast<const char*>(buf);
  while (len > 0) {
    ssize_t n = ::send(fd, p, len, MSG_NOSIGNAL);
    if (n > 0) {
      p += n;
      len -= static_cast<size_t>(n);
      continue;
    }
    if (n < 0 && errno == EINTR) continue;
    if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) {
      if (int rc = waitFor(fd, POLLOUT, deadline)) return rc;
      continue;
    }
    return errno != 0 ? errno : EPIPE;
  }
  return 0;
}

int recvAll(int fd, void* buf, size_t len, const Deadline& deadline) {
  char* p = static_cast<char*>(buf);
  while (len > 0) {
    ssize_t n = ::recv(fd, p, len, 0);
    if (n > 0) {
      p += n;
      len -= static_cast<size_t>(n);
      continue;
    }
    if (n == 0) return ECONNRESET;
    if (errno == EINTR) continue;
    if (errno == EAGAIN || errno == EWOULDBLOCK) {
      if (int rc = waitFor(fd, POLLIN, deadline)) return rc;
      continue;
    }
    return errno;
  }
  return 0;
}

}  // namespace loom
