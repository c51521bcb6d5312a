#include "serve/http_server.h"

#include <httplib.h>
#include <poll.h>
#include <sys/resource.h>
#include <sys/socket.h>

#include <chrono>
#include <regex>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "dcp/error.h"
#include "serve/connection_server.h"
#include "serve/connection_threads.h"

namespace dcp::serve {

struct HttpServer::Impl {
  ConnectionServer server;
  int listen_fd = -1;  // the listening socket, seen by the socket-options hook
  // Every route's method and path pattern, as registered: a known path asked with another
  // method is a 405 naming the ones it takes.
  std::vector<std::pair<std::string, std::regex>> routes;
  // The POST routes' handlers, for a request without a body (below).
  std::vector<std::pair<std::string, httplib::Server::Handler>> post_handlers;
};

namespace {

// cpp-httplib's task queue for its connections: a thread each, as many as the clients hold open
// (serve/connection_threads.h); the bound keeps a flood of connections from exhausting the
// process's threads, and past it connections wait their turn.
class HttpConnectionQueue final : public httplib::TaskQueue {
 public:
  void enqueue(std::function<void()> fn) override { threads_.enqueue(std::move(fn)); }
  void shutdown() override { threads_.shutdown(); }

 private:
  ConnectionThreads threads_{16, 4096, std::chrono::seconds(30)};
};

void reply(httplib::Response& res, const HttpReply& r) {
  res.status = r.status;
  res.set_content(r.body, r.content_type.c_str());
}

// Runs a handled request: a whole reply, or a stream written chunk by chunk (a failed write means
// the client went away; the stream then cancels its requests).
void answer(httplib::Response& res, Handled h) {
  if (h.reply) return reply(res, *h.reply);
  auto stream = std::make_shared<std::function<void(const ChunkWriter&)>>(std::move(h.stream));
  res.set_header("Cache-Control", "no-cache");
  res.set_chunked_content_provider(
      "text/event-stream", [stream](std::size_t, httplib::DataSink& sink) {
        (*stream)([&](const std::string& piece) { return sink.write(piece.data(), piece.size()); });
        sink.done();
        return true;
      });
}

// Whether the client of the request being handled has closed its connection (or its sending
// half, as a client that gave up does; uvicorn takes that for a disconnect too). The socket stays
// open while the handler runs.
ClientGone client_gone() {
  return [fd = ConnectionServer::connection_socket()] {
    if (fd < 0) return false;
    pollfd p{fd, POLLRDHUP, 0};
    return ::poll(&p, 1, 0) == 1 && (p.revents & (POLLRDHUP | POLLHUP | POLLERR)) != 0;
  };
}

// Whether an Authorization header carries the key, compared in time independent of where it
// differs (a timing probe learns nothing of the key's bytes).
bool authorized(const std::string& header, const std::string& key) {
  const std::string prefix = "Bearer ";
  if (header.compare(0, prefix.size(), prefix) != 0) return false;
  const std::string_view sent = std::string_view(header).substr(prefix.size());
  unsigned char diff = sent.size() == key.size() ? 0 : 1;
  for (std::size_t i = 0; i < key.size(); ++i)
    diff |= static_cast<unsigned char>(key[i] ^ (i < sent.size() ? sent[i] : ~key[i]));
  return diff == 0;
}

}  // namespace

HttpServer::HttpServer(OpenAiApi& api, HttpOptions options) : impl_(std::make_unique<Impl>()) {
  httplib::Server& s = impl_->server;
  s.set_pre_routing_handler([key = options.api_key, impl = impl_.get()](const httplib::Request& req,
                                                                        httplib::Response& res) {
    const bool open = req.method == "GET" && (req.path == "/health" || req.path == "/metrics");
    if (!key.empty() && !open && !authorized(req.get_header_value("Authorization"), key)) {
      reply(res, OpenAiApi::error(401,
                                  "a valid API key is required: send the header "
                                  "'Authorization: Bearer <key>' (dcp serve --api-key)"));
      res.set_header("WWW-Authenticate", "Bearer");
      return httplib::Server::HandlerResponse::Handled;
    }
    // A POST with neither Content-Length nor Transfer-Encoding has no body (RFC 9112 6.3), as
    // `curl -X POST URL` sends it: the library would wait for the connection to close instead,
    // then answer 400. Its route runs here with the empty body.
    if (req.method == "POST" && !req.has_header("Content-Length") &&
        !req.has_header("Transfer-Encoding")) {
      for (const auto& [path, handler] : impl->post_handlers) {
        if (path != req.path) continue;
        handler(req, res);
        return httplib::Server::HandlerResponse::Handled;
      }
      res.status = 404;  // the error handler words it (404, or 405 for a GET path)
      return httplib::Server::HandlerResponse::Handled;
    }
    return httplib::Server::HandlerResponse::Unhandled;
  });
  s.new_task_queue = [] { return new HttpConnectionQueue(); };
  s.set_payload_max_length(64u << 20);  // beyond: 413 from httplib
  // Without it a reply's body waits behind its headers for the client's delayed ACK, tens of
  // milliseconds for each reply on a kept-alive connection (docs/serving.md).
  s.set_tcp_nodelay(true);
  // The library closes a kept-alive connection after its fifth request, so a client sending its
  // requests one after another reconnected every fifth one; nginx's bound instead.
  s.set_keep_alive_max_count(1000);
  // The library listens with a backlog of 5: a burst of clients connecting at once would see
  // dropped handshakes. Keep the socket to listen on it again with a deep queue after bind.
  s.set_socket_options([impl = impl_.get()](socket_t fd) {
    int yes = 1;
    setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &yes, sizeof yes);  // what the default hook does
    impl->listen_fd = fd;
  });
  const auto post = [&s, impl = impl_.get()](const std::string& path, httplib::Server::Handler h) {
    s.Post(path, h);
    impl->routes.emplace_back("POST", std::regex(path));
    impl->post_handlers.emplace_back(path, std::move(h));
  };
  const auto get = [&s, impl = impl_.get()](const std::string& path, httplib::Server::Handler h) {
    s.Get(path, std::move(h));  // HEAD too: the library answers it from the GET handler
    impl->routes.emplace_back("GET, HEAD", std::regex(path));
  };
  post("/v1/completions", [&api](const httplib::Request& req, httplib::Response& res) {
    answer(res, api.completions(req.body, client_gone()));
  });
  post("/v1/chat/completions", [&api](const httplib::Request& req, httplib::Response& res) {
    answer(res, api.chat_completions(req.body, client_gone()));
  });
  post("/generate", [&api](const httplib::Request& req, httplib::Response& res) {
    answer(res, api.generate(req.body, client_gone()));
  });
  post("/tokenize", [&api](const httplib::Request& req, httplib::Response& res) {
    reply(res, api.tokenize(req.body));
  });
  post("/detokenize", [&api](const httplib::Request& req, httplib::Response& res) {
    reply(res, api.detokenize(req.body));
  });
  get("/v1/models",
      [&api](const httplib::Request&, httplib::Response& res) { reply(res, api.models()); });
  get(R"(/v1/models/(.+))", [&api](const httplib::Request& req, httplib::Response& res) {
    reply(res, api.model(req.matches[1]));  // OpenAI's retrieve (model names may hold '/')
  });
  get("/health",
      [&api](const httplib::Request&, httplib::Response& res) { reply(res, api.health()); });
  get("/metrics",
      [&api](const httplib::Request&, httplib::Response& res) { reply(res, api.metrics()); });
  post("/reset_prefix_cache", [&api](const httplib::Request&, httplib::Response& res) {
    reply(res, api.reset_prefix_cache());
  });
  get("/version",
      [&api](const httplib::Request&, httplib::Response& res) { reply(res, api.version()); });
  // SGLang's: the model's and the server's description, a health check that generates, and its
  // name for emptying the prefix cache (GET or POST, as SGLang takes it).
  for (const char* path : {"/get_model_info", "/model_info"})
    get(path,
        [&api](const httplib::Request&, httplib::Response& res) { reply(res, api.model_info()); });
  for (const char* path : {"/get_server_info", "/server_info"})
    get(path,
        [&api](const httplib::Request&, httplib::Response& res) { reply(res, api.server_info()); });
  get("/health_generate", [&api](const httplib::Request&, httplib::Response& res) {
    reply(res, api.health_generate());
  });
  const auto flush = [&api](const httplib::Request&, httplib::Response& res) {
    reply(res, api.reset_prefix_cache());
  };
  get("/flush_cache", flush);
  post("/flush_cache", flush);
  post("/abort_request", [&api](const httplib::Request& req, httplib::Response& res) {
    reply(res, api.abort_request(req.body));
  });
  // Anything else: an OpenAI-style 404, or 405 for a known path with another method.
  s.set_error_handler([impl = impl_.get()](const httplib::Request& req, httplib::Response& res) {
    if (!res.body.empty()) return;
    if (res.status == 404) {
      std::string allowed;
      for (const auto& [method, pattern] : impl->routes) {
        if (std::regex_match(req.path, pattern)) allowed += (allowed.empty() ? "" : ", ") + method;
      }
      if (!allowed.empty()) {
        res.status = 405;
        res.set_header("Allow", allowed);
        const HttpReply r = OpenAiApi::error(
            405, str(req.method, " ", req.path, " is not served (it takes ", allowed, ")"));
        res.set_content(r.body, r.content_type.c_str());
        return;
      }
    }
    // The library's own 400: the request could not be read whole (its end is unknown).
    if (res.status == 400) {
      ConnectionServer::close_after_reply();
      res.set_header("Connection", "close");
    }
    const HttpReply r = OpenAiApi::error(
        res.status, res.status == 404 ? str("no route ", req.method, " ", req.path)
                    : res.status == 400
                        ? "malformed HTTP request: a request line or header too long or not "
                          "well formed, or a broken chunked body"
                        : str("HTTP ", res.status, " for ", req.method, " ", req.path));
    res.set_content(r.body, r.content_type.c_str());
  });
  s.set_exception_handler(
      [](const httplib::Request&, httplib::Response& res, std::exception_ptr ep) {
        std::string what = "internal error";
        try {
          std::rethrow_exception(ep);
        } catch (const std::exception& e) {
          what = e.what();
        } catch (...) {
        }
        reply(res, OpenAiApi::error(500, what));
      });
}

HttpServer::~HttpServer() = default;

namespace {

// A socket per connection: lift the soft limit on open files (often 1024) to the hard one, as
// servers do, so a thousand clients do not leave accept() failing while threads are free.
void raise_open_file_limit() {
  rlimit limit{};
  if (getrlimit(RLIMIT_NOFILE, &limit) != 0 || limit.rlim_cur >= limit.rlim_max) return;
  limit.rlim_cur = limit.rlim_max;
  setrlimit(RLIMIT_NOFILE, &limit);  // best effort: the old limit still serves
}

}  // namespace

void HttpServer::serve_socket(int sock) {
  impl_->server.serve_socket(sock);
}

int HttpServer::bind(const std::string& host, int port) {
  const int bound = port == 0 ? impl_->server.bind_to_any_port(host.c_str())
                              : (impl_->server.bind_to_port(host.c_str(), port) ? port : -1);
  DCP_CHECK(bound > 0, io, "--host ", host, " --port ", port,
            ": cannot listen there (the port is taken, or the address is not this machine's)");
  if (impl_->listen_fd >= 0) ::listen(impl_->listen_fd, SOMAXCONN);
  raise_open_file_limit();
  return bound;
}

void HttpServer::listen() { impl_->server.listen_after_bind(); }

void HttpServer::stop() {
  impl_->server.stop_all();
}

}  // namespace dcp::serve
