#include "serve/connection_server.h"

#include <sys/eventfd.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <cstdint>
#include <cstring>

#include "dcp/error.h"
#include "serve/socket_stream.h"

namespace dcp::serve {

namespace {

// The socket of the connection this thread serves, set around each connection.
thread_local int t_connection_socket = -1;
// Set by a handler whose reply must end the connection.
thread_local bool t_close_after_reply = false;

}  // namespace

ConnectionServer::ConnectionServer() : stop_fd_(eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK)) {
  DCP_CHECK(stop_fd_ >= 0, io, "dcp serve: eventfd: ", std::strerror(errno));
}

ConnectionServer::~ConnectionServer() {
  ::close(stop_fd_);
}

void ConnectionServer::stop_all() {
  const std::uint64_t one = 1;
  [[maybe_unused]] const ssize_t n = ::write(stop_fd_, &one, sizeof one);  // stays readable
  stop();
}

int ConnectionServer::connection_socket() {
  return t_connection_socket;
}

void ConnectionServer::close_after_reply() {
  t_close_after_reply = true;
}

bool ConnectionServer::process_and_close_socket(socket_t sock) {
  using std::chrono::milliseconds;
  SocketStream strm(sock, milliseconds(read_timeout_sec_ * 1000 + read_timeout_usec_ / 1000),
                    milliseconds(write_timeout_sec_ * 1000 + write_timeout_usec_ / 1000));
  t_connection_socket = sock;
  t_close_after_reply = false;
  bool ok = false;
  for (std::size_t left = keep_alive_max_count_; left > 0; --left) {
    if (svr_sock_ == INVALID_SOCKET ||
        !strm.wait_for_request(stop_fd_, std::chrono::seconds(keep_alive_timeout_sec_)))
      break;
    bool closed = false;
    ok = process_request(strm, /*close_connection=*/left == 1, closed, nullptr);
    if (!ok || closed || t_close_after_reply) break;
  }
  t_connection_socket = -1;
  if (t_close_after_reply) strm.finish_sending(std::chrono::seconds(1));  // a request cut short
  ::shutdown(sock, SHUT_RDWR);
  ::close(sock);
  return ok;
}

}  // namespace dcp::serve
