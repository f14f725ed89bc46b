#include "fake_server.h"

#include <arpa/inet.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <chrono>
#include <stdexcept>

#include <fmt/format.h>

namespace moeserve::bench::testing {

using nlohmann::json;
using Clock = std::chrono::steady_clock;

namespace {

bool send_all(int fd, std::string_view s) {
  while (!s.empty()) {
    ssize_t n = ::send(fd, s.data(), s.size(), MSG_NOSIGNAL);
    if (n <= 0) return false;
    s.remove_prefix(size_t(n));
  }
  return true;
}

bool send_chunk(int fd, std::string_view s) {
  return send_all(fd, fmt::format("{:x}\r\n", s.size())) && send_all(fd, s) && send_all(fd, "\r\n");
}

// An SSE event as two chunks split in the middle (two writes, so usually two TCP segments).
bool send_event(int fd, const std::string& data) {
  std::string ev = "data: " + data + "\n\n";
  size_t half = ev.size() / 2;
  return send_chunk(fd, std::string_view(ev).substr(0, half)) && send_chunk(fd, std::string_view(ev).substr(half));
}

bool send_json(int fd, int status, const json& body) {
  std::string b = body.dump();
  const char* reason = status == 200 ? "OK" : status == 400 ? "Bad Request" : status == 404 ? "Not Found" : "Error";
  return send_all(fd, fmt::format("HTTP/1.1 {} {}\r\nContent-Type: application/json\r\nContent-Length: {}\r\n\r\n{}",
                                  status, reason, b.size(), b));
}

int64_t count_words(const std::string& s) {
  int64_t n = 0;
  bool in_word = false;
  for (char c : s) {
    bool w = c != ' ';
    n += w && !in_word;
    in_word = w;
  }
  return n;
}

}  // namespace

FakeServer::FakeServer(FakeServerOptions opts) : opts_(opts) {
  listen_fd_ = ::socket(AF_INET, SOCK_STREAM, 0);
  int one = 1;
  setsockopt(listen_fd_, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  addr.sin_port = 0;
  if (::bind(listen_fd_, reinterpret_cast<sockaddr*>(&addr), sizeof addr) != 0 || ::listen(listen_fd_, 512) != 0)
    throw std::runtime_error("fake server: bind/listen failed");
  socklen_t len = sizeof addr;
  getsockname(listen_fd_, reinterpret_cast<sockaddr*>(&addr), &len);
  port_ = ntohs(addr.sin_port);
  acceptor_ = std::thread([this] { accept_loop(); });
}

FakeServer::~FakeServer() {
  stop_ = true;
  acceptor_.join();
  ::close(listen_fd_);
  std::vector<std::thread> workers;
  {
    std::lock_guard lock(mu_);
    for (int fd : conn_fds_) ::shutdown(fd, SHUT_RDWR);
    workers.swap(workers_);
  }
  for (auto& t : workers) t.join();
}

std::vector<json> FakeServer::bodies() const {
  std::lock_guard lock(mu_);
  return bodies_;
}

std::vector<std::string> FakeServer::request_heads() const {
  std::lock_guard lock(mu_);
  return heads_;
}

void FakeServer::accept_loop() {
  while (!stop_) {
    pollfd p{listen_fd_, POLLIN, 0};
    if (::poll(&p, 1, 20) <= 0) continue;
    int fd = ::accept(listen_fd_, nullptr, nullptr);
    if (fd < 0) continue;
    int one = 1;
    setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
    ++connections_;
    std::lock_guard lock(mu_);
    conn_fds_.push_back(fd);
    workers_.emplace_back([this, fd] { serve(fd); });
  }
}

void FakeServer::serve(int fd) {
  std::string buf;
  int served = 0;
  char tmp[8192];
  while (!stop_) {
    size_t head_end = buf.find("\r\n\r\n");
    if (head_end == std::string::npos) {
      pollfd p{fd, POLLIN, 0};
      if (::poll(&p, 1, 20) <= 0) continue;
      ssize_t n = ::recv(fd, tmp, sizeof tmp, 0);
      if (n <= 0) break;
      buf.append(tmp, size_t(n));
      continue;
    }
    std::string head = buf.substr(0, head_end);
    size_t body_len = 0;
    std::string lower = head;
    for (char& c : lower) c = char(std::tolower(static_cast<unsigned char>(c)));
    if (size_t cl = lower.find("content-length:"); cl != std::string::npos)
      body_len = std::stoul(head.substr(cl + 15));
    bool ok = true;
    while (buf.size() < head_end + 4 + body_len) {
      ssize_t n = ::recv(fd, tmp, sizeof tmp, 0);
      if (n <= 0) {
        ok = false;
        break;
      }
      buf.append(tmp, size_t(n));
    }
    if (!ok) break;
    std::string body = buf.substr(head_end + 4, body_len);
    buf.erase(0, head_end + 4 + body_len);
    if (!handle(fd, head, body)) break;
    if (opts_.max_requests_per_conn > 0 && ++served >= opts_.max_requests_per_conn) break;
  }
  std::lock_guard lock(mu_);
  ::shutdown(fd, SHUT_RDWR);
  ::close(fd);
  std::erase(conn_fds_, fd);
}

bool FakeServer::handle(int fd, const std::string& head, const std::string& body) {
  std::string line = head.substr(0, head.find("\r\n"));
  std::string method = line.substr(0, line.find(' '));
  std::string path = line.substr(method.size() + 1, line.rfind(' ') - method.size() - 1);
  {
    std::lock_guard lock(mu_);
    heads_.push_back(head);
  }
  if (method == "GET" && path == "/get_model_info")
    return send_json(fd, 200, {{"model_path", "fake"}, {"is_generation", true}, {"vocab_size", opts_.vocab_size}});
  if (method == "GET" && path == "/v1/models")
    return send_json(fd, 200, {{"object", "list"}, {"data", json::array({{{"id", "fake-model"}}})}});
  if (method == "POST" && path == "/flush_cache") return send_json(fd, 200, json::object());
  if (method == "POST" && (path == "/generate" || path == "/v1/completions" || path == "/v1/chat/completions")) {
    json req = json::parse(body, nullptr, false);
    if (req.is_discarded()) return send_json(fd, 400, {{"error", {{"message", "bad json"}}}});
    {
      std::lock_guard lock(mu_);
      bodies_.push_back(req);
    }
    int n = ++generations_;
    if (opts_.reject_every > 0 && n % opts_.reject_every == 0)
      return send_json(fd, 400, {{"error", {{"message", "prompt is too long"}, {"type", "BadRequestError"},
                                            {"param", nullptr}, {"code", 400}}}});
    int now = ++in_flight_;
    for (int m = max_in_flight_; now > m && !max_in_flight_.compare_exchange_weak(m, now);) {
    }
    bool ok = stream_generation(fd, path, req);
    --in_flight_;
    return ok;
  }
  return send_json(fd, 404, {{"error", {{"message", "no route " + path}}}});
}

bool FakeServer::stream_generation(int fd, const std::string& path, const json& req) {
  const bool sglang = path == "/generate", chat = path == "/v1/chat/completions";
  int64_t n = sglang ? req["sampling_params"]["max_new_tokens"].get<int64_t>() : req["max_tokens"].get<int64_t>();
  int64_t prompt = 0;
  if (sglang) prompt = req.contains("input_ids") ? int64_t(req["input_ids"].size()) : count_words(req["text"]);
  else if (chat) prompt = count_words(req["messages"][0]["content"]);
  else prompt = req["prompt"].is_array() ? int64_t(req["prompt"].size()) : count_words(req["prompt"]);
  bool stream = req.value("stream", false);
  bool usage = req.contains("stream_options") && req["stream_options"].value("include_usage", false);
  auto t0 = Clock::now();
  auto at = [&](double s) {
    std::this_thread::sleep_until(t0 + std::chrono::duration_cast<Clock::duration>(std::chrono::duration<double>(s)));
  };
  json usage_obj = {{"prompt_tokens", prompt}, {"completion_tokens", n}, {"total_tokens", prompt + n}};
  if (!stream) {
    at(opts_.ttft_s + double(n - 1) * opts_.itl_s);
    std::string text;
    for (int64_t i = 0; i < n; ++i) text += " tok";
    json r;
    if (sglang)
      r = {{"text", text}, {"meta_info", {{"prompt_tokens", prompt}, {"completion_tokens", n}}}};
    else if (chat)
      r = {{"choices", json::array({{{"index", 0}, {"message", {{"role", "assistant"}, {"content", text}}}}})},
           {"usage", usage_obj}};
    else
      r = {{"choices", json::array({{{"index", 0}, {"text", text}}})}, {"usage", usage_obj}};
    return send_json(fd, 200, r);
  }
  if (!send_all(fd, "HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\nCache-Control: no-cache\r\n"
                    "Transfer-Encoding: chunked\r\n\r\n"))
    return false;
  if (chat && !send_event(fd, json({{"choices", json::array({{{"index", 0}, {"delta", {{"role", "assistant"},
                                                                                        {"content", ""}}}}})}})
                                  .dump()))
    return false;
  std::string text;
  int64_t done = 0;
  const int64_t first_k = std::min<int64_t>(opts_.tokens_per_event, n);
  while (done < n) {
    int64_t k = std::min<int64_t>(opts_.tokens_per_event, n - done);
    // k tokens every k * itl after the first event.
    at(opts_.ttft_s + (done ? double(done + k - first_k) * opts_.itl_s : 0.0));
    std::string piece;
    for (int64_t i = 0; i < k; ++i) piece += " tok";
    done += k;
    text += piece;
    json ev;
    json finish = done == n ? json("length") : json(nullptr);
    if (sglang) {
      ev = {{"text", text},
            {"output_ids", std::vector<int>(size_t(k), 7)},
            {"meta_info", {{"id", "r"}, {"prompt_tokens", prompt}, {"completion_tokens", done},
                           {"finish_reason", done == n ? json({{"type", "length"}, {"length", n}}) : json(nullptr)}}}};
    } else {
      json choice = {{"index", 0}, {"finish_reason", finish}};
      if (chat) choice["delta"] = {{"content", piece}};
      else choice["text"] = piece;
      ev = {{"id", "cmpl-1"}, {"object", chat ? "chat.completion.chunk" : "text_completion"}, {"model", "fake-model"},
            {"choices", json::array({choice})}, {"usage", nullptr}};
      if (opts_.continuous_usage)
        ev["usage"] = {{"prompt_tokens", prompt}, {"completion_tokens", done}, {"total_tokens", prompt + done}};
    }
    if (!send_event(fd, ev.dump())) return false;
  }
  json usage_chunk = {{"id", "cmpl-1"}, {"choices", json::array()}, {"usage", usage_obj}};
  if (!sglang && usage && !send_event(fd, usage_chunk.dump())) return false;
  return send_event(fd, "[DONE]") && send_all(fd, "0\r\n\r\n");
}

}  // namespace moeserve::bench::testing
