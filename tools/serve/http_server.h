// The HTTP front of `dcp serve`: cpp-httplib routes onto OpenAiApi, streams as server-sent events.
#pragma once

#include <memory>
#include <string>

#include "serve/openai_api.h"

namespace dcp::serve {

struct HttpOptions {
  // When set, every request but GET /health and GET /metrics (probes and scrapers) must send
  // "Authorization: Bearer <api_key>"; others get 401.
  std::string api_key;
};

class HttpServer {
 public:
  explicit HttpServer(OpenAiApi& api, HttpOptions options = {});
  ~HttpServer();
  // Binds host:port (0: any free port) and returns the port; throws naming --host/--port.
  int bind(const std::string& host, int port);
  // Serves on the bound socket until stop() (call from another thread).
  void listen();
  void stop();
  // Serves one connected socket on this thread until it closes (after bind); for the fuzzer.
  void serve_socket(int sock);

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace dcp::serve
