// cpp-httplib's server with dcp's loop over each connection's requests (serve/socket_stream.h):
// one blocking wait for each request instead of the library's 10 ms polls, the connection's
// socket known to its handlers, a connection closed after a request the library could not read,
// and idle connections closed at once when the server stops.
#pragma once

#include <httplib.h>

namespace dcp::serve {

class ConnectionServer final : public httplib::Server {
 public:
  ConnectionServer();
  ~ConnectionServer() override;

  // Stops accepting and wakes every connection that waits for a request; they close. Replies in
  // progress go on to their end.
  void stop_all();

  // Serves the requests of one connected socket on this thread until it closes, as a connection
  // thread does (the fuzzer feeds it bytes through a socket pair). Needs a bound server.
  void serve_socket(int sock) { process_and_close_socket(sock); }

  // For handlers, which run on their connection's thread: its socket (-1 outside a connection).
  static int connection_socket();
  // For handlers: close the connection after this reply (the request was not read to its end).
  static void close_after_reply();

 private:
  bool process_and_close_socket(socket_t sock) override;

  const int stop_fd_;
};

}  // namespace dcp::serve
