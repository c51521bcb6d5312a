// Bytes from the network as a connection's whole stream: `dcp serve`'s HTTP front (cpp-httplib's
// parser under dcp's connection loop and socket stream, then the API's routes) reads them through
// a socket pair, pipelined requests and all, and answers until the stream ends. Never a crash and
// never a hang: the client's half is closed before serving, so every read ends.
#include <sys/socket.h>
#include <unistd.h>

#include <cstddef>
#include <cstdint>
#include <optional>
#include <thread>

#include "api_fixture.h"
#include "serve/http_server.h"

namespace {

struct Fixture : ApiFixture {
  Fixture() {
    http.emplace(*api, dcp::serve::HttpOptions{});
    http->bind("127.0.0.1", 0);  // the connection loop serves only while the server is bound
  }
  std::optional<dcp::serve::HttpServer> http;
};

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  static Fixture f;
  int fds[2];
  if (socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, fds) != 0) __builtin_trap();
  // The client: writes the bytes, closes its sending half, and reads the replies until the server
  // closes (on its own thread, so that neither side's buffer fills while the other waits).
  std::thread client([fd = fds[1], data, size] {
    for (std::size_t sent = 0; sent < size;) {
      const ssize_t n = ::send(fd, data + sent, size - sent, MSG_NOSIGNAL);
      if (n <= 0) break;  // the server closed first (a request it could not read)
      sent += static_cast<std::size_t>(n);
    }
    ::shutdown(fd, SHUT_WR);
    char buf[4096];
    while (::recv(fd, buf, sizeof buf, 0) > 0) {
    }
    ::close(fd);
  });
  f.http->serve_socket(fds[0]);  // closes its socket
  client.join();
  return 0;
}
