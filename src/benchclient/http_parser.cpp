#include "benchclient/http_parser.h"

#include <algorithm>
#include <cctype>
#include <cstring>

namespace moeserve::bench {

namespace {

constexpr size_t kMaxLine = 64 * 1024;
constexpr size_t kMaxHeaderBytes = 256 * 1024;

std::string lower(std::string_view s) {
  std::string r(s);
  for (char& c : r) c = char(std::tolower(static_cast<unsigned char>(c)));
  return r;
}

std::string_view trim(std::string_view s) {
  while (!s.empty() && (s.front() == ' ' || s.front() == '\t')) s.remove_prefix(1);
  while (!s.empty() && (s.back() == ' ' || s.back() == '\t')) s.remove_suffix(1);
  return s;
}

// Whether a comma-separated header value lists token (case-insensitive), e.g. "keep-alive, Upgrade".
bool lists_token(const std::string& value, std::string_view token) {
  std::string v = lower(value);
  size_t start = 0;
  while (start <= v.size()) {
    size_t comma = v.find(',', start);
    if (comma == std::string::npos) comma = v.size();
    if (trim(std::string_view(v).substr(start, comma - start)) == token) return true;
    start = comma + 1;
  }
  return false;
}

}  // namespace

bool HttpResponseParser::fail(std::string msg) {
  state_ = State::kError;
  error_ = std::move(msg);
  return false;
}

bool HttpResponseParser::take_line(std::string_view& data, std::string& line) {
  size_t nl = data.find('\n');
  if (nl == std::string_view::npos) {
    partial_.append(data);
    data = {};
    if (partial_.size() > kMaxLine) fail("HTTP response line longer than 64 KiB");
    return false;
  }
  line = std::move(partial_);
  partial_.clear();
  line.append(data.substr(0, nl));
  data.remove_prefix(nl + 1);
  if (!line.empty() && line.back() == '\r') line.pop_back();
  if (line.size() > kMaxLine) return fail("HTTP response line longer than 64 KiB");
  return true;
}

bool HttpResponseParser::feed(std::string_view data) {
  bytes_received_ += data.size();
  std::string line;
  while (!data.empty()) {
    switch (state_) {
      case State::kError:
        return false;
      case State::kDone:
        extra_bytes_ += data.size();
        return true;
      case State::kStatusLine:
      case State::kHeaders:
      case State::kTrailers:
      case State::kChunkSize:
      case State::kChunkDataEnd: {
        size_t before = data.size();
        bool complete = take_line(data, line);
        if (state_ == State::kError) return false;
        if (state_ == State::kStatusLine || state_ == State::kHeaders) {
          header_bytes_ += before - data.size();
          if (header_bytes_ > kMaxHeaderBytes) return fail("HTTP response headers larger than 256 KiB");
        }
        if (!complete) return true;
        bool ok = true;
        if (state_ == State::kStatusLine) {
          // Tolerate stray empty lines before the status line (RFC 9112 2.2).
          if (!line.empty()) ok = on_status_line(line);
        } else if (state_ == State::kHeaders) {
          ok = line.empty() ? on_headers_end() : on_header_line(line);
        } else if (state_ == State::kChunkSize) {
          ok = on_chunk_size_line(line);
        } else if (state_ == State::kChunkDataEnd) {
          if (!line.empty()) return fail("malformed chunked body: chunk data not followed by CRLF");
          state_ = State::kChunkSize;
        } else if (line.empty()) {  // kTrailers
          state_ = State::kDone;
        }
        if (!ok) return false;
        break;
      }
      case State::kBodyLength:
      case State::kChunkData: {
        size_t n = size_t(std::min<uint64_t>(remaining_, data.size()));
        if (n > 0) sink_(data.substr(0, n));
        data.remove_prefix(n);
        remaining_ -= n;
        if (remaining_ == 0) state_ = state_ == State::kBodyLength ? State::kDone : State::kChunkDataEnd;
        break;
      }
      case State::kBodyUntilClose:
        sink_(data);
        data = {};
        break;
    }
  }
  // A zero-length body completes as soon as the headers do.
  if (state_ == State::kBodyLength && remaining_ == 0) state_ = State::kDone;
  return state_ != State::kError;
}

bool HttpResponseParser::on_eof() {
  if (state_ == State::kBodyUntilClose) state_ = State::kDone;
  if (state_ == State::kDone) return true;
  if (state_ == State::kError) return false;
  if (bytes_received_ == 0) return fail("connection closed by the server before any response");
  return fail("connection closed by the server in the middle of the response");
}

bool HttpResponseParser::on_status_line(const std::string& line) {
  // HTTP/1.x SP 3DIGIT [SP reason]
  if (line.size() < 12 || line.compare(0, 7, "HTTP/1.") != 0 || !std::isdigit(static_cast<unsigned char>(line[7])) ||
      line[8] != ' ')
    return fail("not an HTTP/1.x response: '" + line.substr(0, 80) + "'");
  minor_version_ = line[7] - '0';
  int code = 0;
  for (int i = 9; i < 12; ++i) {
    if (!std::isdigit(static_cast<unsigned char>(line[i])))
      return fail("bad HTTP status line: '" + line.substr(0, 80) + "'");
    code = code * 10 + (line[i] - '0');
  }
  // Three digits, 100-999 (RFC 9110 15: a first digit of 0 is no status class).
  if ((line.size() > 12 && line[12] != ' ') || code < 100)
    return fail("bad HTTP status line: '" + line.substr(0, 80) + "'");
  status_ = code;
  reason_ = line.size() > 13 ? line.substr(13) : "";
  headers_.clear();
  state_ = State::kHeaders;
  return true;
}

bool HttpResponseParser::on_header_line(const std::string& line) {
  size_t colon = line.find(':');
  if (colon == std::string::npos || colon == 0) return fail("malformed HTTP header line: '" + line.substr(0, 80) + "'");
  headers_.emplace_back(lower(std::string_view(line).substr(0, colon)),
                        std::string(trim(std::string_view(line).substr(colon + 1))));
  return true;
}

bool HttpResponseParser::on_headers_end() {
  if (status_ >= 100 && status_ < 200) {  // interim response (100 Continue): the real one follows
    state_ = State::kStatusLine;
    return true;
  }
  std::string te = header("transfer-encoding"), cl = header("content-length");
  if (status_ == 204 || status_ == 304) {
    state_ = State::kDone;
  } else if (!te.empty()) {
    if (!lists_token(te, "chunked")) {
      state_ = State::kBodyUntilClose;
    } else {
      state_ = State::kChunkSize;
    }
  } else if (!cl.empty()) {
    uint64_t n = 0;
    for (char c : cl) {
      if (!std::isdigit(static_cast<unsigned char>(c)) || n > (UINT64_MAX - 9) / 10)
        return fail("bad Content-Length: '" + cl + "'");
      n = n * 10 + uint64_t(c - '0');
    }
    remaining_ = n;
    state_ = n == 0 ? State::kDone : State::kBodyLength;
  } else {
    state_ = State::kBodyUntilClose;
  }
  return true;
}

bool HttpResponseParser::on_chunk_size_line(const std::string& line) {
  std::string_view v = trim(std::string_view(line).substr(0, line.find(';')));  // chunk extensions ignored
  if (v.empty()) return fail("malformed chunked body: empty chunk size line");
  uint64_t n = 0;
  for (char c : v) {
    int d = std::isdigit(static_cast<unsigned char>(c)) ? c - '0'
            : (c >= 'a' && c <= 'f')                    ? c - 'a' + 10
            : (c >= 'A' && c <= 'F')                    ? c - 'A' + 10
                                                        : -1;
    if (d < 0 || n > (UINT64_MAX >> 4)) return fail("malformed chunked body: bad chunk size '" + line + "'");
    n = (n << 4) | uint64_t(d);
  }
  remaining_ = n;
  state_ = n == 0 ? State::kTrailers : State::kChunkData;
  return true;
}

std::string HttpResponseParser::header(std::string_view lower_name) const {
  std::string r;
  for (auto& [k, v] : headers_)
    if (k == lower_name) r += (r.empty() ? "" : ", ") + v;
  return r;
}

bool HttpResponseParser::keep_alive() const {
  if (state_ != State::kDone) return false;
  std::string conn = header("connection");
  if (lists_token(conn, "close")) return false;
  if (minor_version_ == 0) return lists_token(conn, "keep-alive");
  return !header("content-length").empty() || lists_token(header("transfer-encoding"), "chunked") ||
         status_ == 204 || status_ == 304;
}

bool HttpResponseParser::is_event_stream() const {
  std::string ct = lower(header("content-type"));
  return ct.rfind("text/event-stream", 0) == 0;
}

// ---- SSE ----

void SseParser::feed(std::string_view bytes) {
  while (!bytes.empty()) {
    if (after_cr_) {  // CR LF is one line end, even when split between two reads
      after_cr_ = false;
      if (bytes.front() == '\n') {
        bytes.remove_prefix(1);
        continue;
      }
    }
    // The first CR or LF. Two vectorised memchr calls (string_view::find_first_of calls memchr once per byte,
    // and SGLang's events are kilobytes long).
    const char* b = bytes.data();
    const void* lf = std::memchr(b, '\n', bytes.size());
    size_t limit = lf ? size_t(static_cast<const char*>(lf) - b) : bytes.size();
    const void* cr = std::memchr(b, '\r', limit);
    size_t end = cr ? size_t(static_cast<const char*>(cr) - b) : limit;
    if (end == bytes.size()) {
      line_.append(bytes);
      return;
    }
    line_.append(bytes.substr(0, end));
    after_cr_ = bytes[end] == '\r';
    bytes.remove_prefix(end + 1);
    on_line(line_);
    line_.clear();
  }
}

void SseParser::finish() {
  if (!line_.empty()) on_line(line_);
  line_.clear();
  dispatch();
}

void SseParser::on_line(std::string_view line) {
  if (at_start_) {
    at_start_ = false;
    if (line.substr(0, 3) == "\xEF\xBB\xBF") line.remove_prefix(3);
  }
  if (line.empty()) return dispatch();
  if (line.front() == ':') return;  // comment (keep-alive ping)
  size_t colon = line.find(':');
  std::string_view field = line.substr(0, colon), value;
  if (colon != std::string_view::npos) {
    value = line.substr(colon + 1);
    if (!value.empty() && value.front() == ' ') value.remove_prefix(1);
  }
  if (field == "data") {
    if (has_data_) data_ += '\n';
    data_.append(value);
    has_data_ = true;
  }
}

void SseParser::dispatch() {
  bool any = has_data_ && !data_.empty();
  has_data_ = false;
  if (any) {
    ++events_;
    sink_(data_);
  }
  data_.clear();
}

}  // namespace moeserve::bench
