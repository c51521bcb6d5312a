#include "serve/socket_stream.h"

#include <netdb.h>
#include <poll.h>
#include <sys/socket.h>

#include <algorithm>
#include <cerrno>
#include <cstring>

namespace dcp::serve {
namespace {

// poll() on `fds`, restarted after a signal with the time left.
int poll_within(pollfd* fds, nfds_t count, std::chrono::milliseconds timeout) {
  const auto deadline = std::chrono::steady_clock::now() + timeout;
  for (;;) {
    const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(
        deadline - std::chrono::steady_clock::now());
    const int n = ::poll(fds, count, static_cast<int>(std::max<std::int64_t>(0, left.count())));
    if (n >= 0 || errno != EINTR) return n;
  }
}

int poll_one(int fd, short events, std::chrono::milliseconds timeout) {
  pollfd p{fd, events, 0};
  return poll_within(&p, 1, timeout);
}

void numeric_name(const sockaddr_storage& a, socklen_t size, std::string& ip, int& port) {
  char host[NI_MAXHOST], serv[NI_MAXSERV];
  if (getnameinfo(reinterpret_cast<const sockaddr*>(&a), size, host, sizeof host, serv, sizeof serv,
                  NI_NUMERICHOST | NI_NUMERICSERV) == 0) {
    ip = host;
    port = std::atoi(serv);
  }
}

}  // namespace

SocketStream::SocketStream(int sock, std::chrono::milliseconds read_timeout,
                           std::chrono::milliseconds write_timeout)
    : sock_(sock), read_timeout_(read_timeout), write_timeout_(write_timeout) {}

bool SocketStream::is_readable() const {
  return begin_ < end_ || poll_one(sock_, POLLIN, read_timeout_) > 0;
}

bool SocketStream::is_writable() const {
  // A peer that is gone reads as writable (POLLERR, POLLHUP): the write then fails and says so.
  return poll_one(sock_, POLLOUT, write_timeout_) > 0;
}

ssize_t SocketStream::read(char* ptr, size_t size) {
  if (begin_ == end_) {
    if (!is_readable()) return -1;
    // A body read in large pieces goes straight to its place; lines go through the buffer.
    const bool direct = size >= sizeof buffer_;
    ssize_t n;
    do {
      n = ::recv(sock_, direct ? ptr : buffer_, direct ? size : sizeof buffer_, 0);
    } while (n < 0 && errno == EINTR);
    if (n <= 0 || direct) return n;
    begin_ = 0;
    end_ = static_cast<size_t>(n);
  }
  const size_t n = std::min(size, end_ - begin_);
  std::memcpy(ptr, buffer_ + begin_, n);
  begin_ += n;
  return static_cast<ssize_t>(n);
}

ssize_t SocketStream::write(const char* ptr, size_t size) {
  size_t sent = 0;
  while (sent < size) {
    if (!is_writable()) return -1;
    const ssize_t n = ::send(sock_, ptr + sent, size - sent, MSG_NOSIGNAL);
    if (n < 0) {
      if (errno == EINTR || errno == EAGAIN || errno == EWOULDBLOCK) continue;
      return -1;
    }
    sent += static_cast<size_t>(n);
  }
  return static_cast<ssize_t>(sent);
}

void SocketStream::get_remote_ip_and_port(std::string& ip, int& port) const {
  sockaddr_storage a{};
  socklen_t size = sizeof a;
  if (getpeername(sock_, reinterpret_cast<sockaddr*>(&a), &size) == 0)
    numeric_name(a, size, ip, port);
}

void SocketStream::get_local_ip_and_port(std::string& ip, int& port) const {
  sockaddr_storage a{};
  socklen_t size = sizeof a;
  if (getsockname(sock_, reinterpret_cast<sockaddr*>(&a), &size) == 0)
    numeric_name(a, size, ip, port);
}

bool SocketStream::wait_for_request(int stop_fd, std::chrono::milliseconds timeout) const {
  if (begin_ < end_) return true;
  pollfd p[2] = {{sock_, POLLIN, 0}, {stop_fd, POLLIN, 0}};
  return poll_within(p, 2, timeout) > 0 && p[1].revents == 0 && p[0].revents != 0;
}

void SocketStream::finish_sending(std::chrono::milliseconds limit) {
  ::shutdown(sock_, SHUT_WR);
  begin_ = end_ = 0;
  const auto deadline = std::chrono::steady_clock::now() + limit;
  for (;;) {
    const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(
        deadline - std::chrono::steady_clock::now());
    if (left.count() <= 0 || poll_one(sock_, POLLIN, left) <= 0 ||
        ::recv(sock_, buffer_, sizeof buffer_, 0) <= 0)
      return;
  }
}

}  // namespace dcp::serve
