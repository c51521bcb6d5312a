// One HTTP connection's socket as cpp-httplib reads and writes it, and the wait for its next
// request.
//
// cpp-httplib's own connection loop waits for a request by polling the socket every 10 ms, so
// each open connection woke its thread about 90 times a second: 100 idle keep-alive connections
// kept a fifth of a core busy, 1000 a whole one. `dcp serve` runs the loop itself
// (http_server.cpp) with one blocking poll per wait, woken by data, a hang-up, the keep-alive
// timeout or the server stopping.
#pragma once

#include <httplib.h>

#include <chrono>
#include <string>

namespace dcp::serve {

class SocketStream final : public httplib::Stream {
 public:
  SocketStream(int sock, std::chrono::milliseconds read_timeout,
               std::chrono::milliseconds write_timeout);

  bool is_readable() const override;
  bool is_writable() const override;
  ssize_t read(char* ptr, size_t size) override;
  ssize_t write(const char* ptr, size_t size) override;
  void get_remote_ip_and_port(std::string& ip, int& port) const override;
  void get_local_ip_and_port(std::string& ip, int& port) const override;
  int socket() const override { return sock_; }

  // Whether a request's bytes (or a hang-up) arrived within `timeout`; false when it passed, or
  // when `stop_fd` became readable first (the server is stopping). Bytes already read ahead
  // count as arrived.
  bool wait_for_request(int stop_fd, std::chrono::milliseconds timeout) const;

  // Ends the sending half, then reads and drops what the client still sends until it closes or
  // `limit` passes: a close with unread bytes would reset the connection, and the client could
  // lose the last reply before reading it.
  void finish_sending(std::chrono::milliseconds limit);

 private:
  int sock_;
  std::chrono::milliseconds read_timeout_, write_timeout_;
  // Read ahead: cpp-httplib reads a request's line and headers a byte at a time.
  char buffer_[4096];
  size_t begin_ = 0, end_ = 0;
};

}  // namespace dcp::serve
