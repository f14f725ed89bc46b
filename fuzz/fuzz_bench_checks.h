// The checks of the targets for what `moeserve bench` reads from a server (src/benchclient): the HTTP/1.1 response
// parser, the Server-Sent Events parser and the SGLang event skimmer. A benchmark runs against servers that are
// not ours; whatever they (or a proxy) send must end in a result or a clear error, and the fast paths must agree
// with the slow ones. Kept apart from fuzz_checks.h because they link the bench client's sources.
//
// Input layouts:
//   http_response : ParserHeader (5 bytes: flags, four chunk lengths) + the bytes a server sends. flags bit 0: the
//                   peer closes the connection after them (on_eof()).
//   sglang_event  : one stream event's data (a JSON document, or anything).
//
// What must hold:
//   http_response : the parser's outcome (done / failed, status, headers, the decoded body, keep-alive, the bytes
//                   past the response) is the same however the bytes are split; the body fed through SseParser
//                   gives the same events whole and split, and the same as a plain reading of the WHATWG rules.
//   sglang_event  : when the skimmer accepts an event, the full JSON parser accepts it too and gives the same text
//                   length and token counts (the skimmer declines what it does not handle; the bench then uses
//                   the full parser, so an acceptance that disagrees would be a wrong measurement).
#pragma once

#include <string>
#include <string_view>
#include <vector>

#include <nlohmann/json.hpp>

#include "benchclient/event_skim.h"
#include "benchclient/http_parser.h"
#include "core/json_int.h"
#include "fuzz_checks.h"

namespace moeserve::fuzz {

// The events of an SSE stream read the plain way (WHATWG HTML 9.2.6): lines end at CR LF, LF or CR; a leading BOM is
// dropped; "data" fields join with LF; an empty line dispatches non-empty data; the end of the stream dispatches
// what is pending (SseParser::finish's leniency).
inline std::vector<std::string> reference_sse_events(std::string_view s) {
  if (s.substr(0, 3) == "\xEF\xBB\xBF") s.remove_prefix(3);
  std::vector<std::string> events;
  std::string data;
  bool has_data = false;
  auto dispatch = [&] {
    if (has_data && !data.empty()) events.push_back(data);
    data.clear();
    has_data = false;
  };
  auto on_line = [&](std::string_view line) {
    if (line.empty()) return dispatch();
    if (line.front() == ':') return;
    const size_t colon = line.find(':');
    std::string_view value;
    if (colon != std::string_view::npos) {
      value = line.substr(colon + 1);
      if (!value.empty() && value.front() == ' ') value.remove_prefix(1);
    }
    if (line.substr(0, colon) != "data") return;
    if (has_data) data += '\n';
    data.append(value);
    has_data = true;
  };
  size_t start = 0, i = 0;
  while (i < s.size()) {
    if (s[i] == '\r' || s[i] == '\n') {
      on_line(s.substr(start, i - start));
      if (s[i] == '\r' && i + 1 < s.size() && s[i + 1] == '\n') ++i;
      start = ++i;
    } else {
      ++i;
    }
  }
  if (start < s.size()) on_line(s.substr(start));
  dispatch();
  return events;
}

struct HttpOutcome {
  bool done = false, failed = false, headers_done = false, keep_alive = false, event_stream = false;
  int status = 0;
  std::string body, content_type, transfer_encoding;
  size_t extra = 0;
  bool operator==(const HttpOutcome&) const = default;
};

inline HttpOutcome parse_http(const std::vector<std::string_view>& pieces, bool eof) {
  HttpOutcome o;
  bench::HttpResponseParser p([&](std::string_view b) { o.body.append(b); });
  for (std::string_view piece : pieces) {
    if (p.failed()) break;  // the client stops reading at an error
    p.feed(piece);
  }
  if (eof && !p.failed() && !p.done()) p.on_eof();
  o.done = p.done(), o.failed = p.failed(), o.headers_done = p.headers_done();
  FUZZ_CHECK(!(o.done && o.failed), "done and failed at once");
  FUZZ_CHECK(!o.failed || !p.error().empty(), "a failure without a message");
  if (o.headers_done && !o.failed) {
    o.status = p.status(), o.keep_alive = p.keep_alive(), o.event_stream = p.is_event_stream();
    o.content_type = p.header("content-type"), o.transfer_encoding = p.header("transfer-encoding");
  }
  o.extra = o.done ? p.extra_bytes() : 0;
  return o;
}

inline void check_http_response(std::string_view data) {
  const ParserHeader h(data);
  const bool eof = (h.flags & 1) != 0;
  const HttpOutcome whole = parse_http({h.text}, eof);
  const HttpOutcome split = parse_http(h.chunks(), eof);
  FUZZ_CHECK(whole == split, "split input parsed differently: done {}/{} failed {}/{} status {}/{} body {}/{} bytes",
             whole.done, split.done, whole.failed, split.failed, whole.status, split.status, whole.body.size(),
             split.body.size());
  if (whole.status != 0) FUZZ_CHECK(whole.status >= 100 && whole.status <= 999, "status {}", whole.status);
  // The body as an event stream, whole and in the same pieces.
  const std::vector<std::string> want = reference_sse_events(whole.body);
  for (int form = 0; form < 2; ++form) {
    std::vector<std::string> got;
    bench::SseParser sse([&](std::string_view e) { got.emplace_back(e); });
    if (form == 0) {
      sse.feed(whole.body);
    } else {
      std::string header(data.substr(0, ParserHeader::kSize));
      header.resize(ParserHeader::kSize, '\0');
      const std::string framed = header + whole.body;  // hb views it
      const ParserHeader hb(framed);
      for (std::string_view piece : hb.chunks()) sse.feed(piece);
    }
    sse.finish();
    FUZZ_CHECK(got == want, "SseParser ({}) gave {} events, the WHATWG reading {}", form ? "split" : "whole",
               got.size(), want.size());
    FUZZ_CHECK(sse.events() == got.size(), "events() {} for {} events", sse.events(), got.size());
  }
}

inline void check_sglang_event(std::string_view data) {
  bench::SglangEventFields f;
  if (!bench::skim_sglang_event(data, f)) return;
  nlohmann::json j;
  try {
    j = nlohmann::json::parse(data);
  } catch (const nlohmann::json::exception& e) {
    throw CheckFailure(fmt::format("the skimmer accepted what the JSON parser refuses ({}): {}", e.what(), show(data)));
  }
  FUZZ_CHECK(j.is_object(), "accepted a non-object: {}", show(data));
  FUZZ_CHECK(!j.contains("error") || j["error"].is_null(), "accepted an error event: {}", show(data));
  const int64_t text =
      j.contains("text") && j["text"].is_string() ? int64_t(j["text"].get_ref<const std::string&>().size()) : -1;
  FUZZ_CHECK(f.text_bytes == text, "text bytes {} (the parser's {}): {}", f.text_bytes, text, show(data));
  const nlohmann::json meta = j.contains("meta_info") ? j["meta_info"] : nlohmann::json();
  FUZZ_CHECK(meta.is_null() || meta.is_object(), "meta_info {}", meta.dump());
  auto count = [&](const char* k) {
    int64_t v = -1;
    if (meta.is_object() && meta.contains(k) && json_to_int64(meta[k], v) != JsonInt::Ok) v = -2;
    return v;
  };
  FUZZ_CHECK(f.completion_tokens == count("completion_tokens"), "completion_tokens {} (the parser's {}): {}",
             f.completion_tokens, count("completion_tokens"), show(data));
  FUZZ_CHECK(f.prompt_tokens == count("prompt_tokens"), "prompt_tokens {} (the parser's {}): {}", f.prompt_tokens,
             count("prompt_tokens"), show(data));
  if (meta.is_object() && meta.contains("finish_reason"))
    FUZZ_CHECK(meta["finish_reason"].is_null(), "accepted a final event (finish_reason {})", meta.dump());
}

}  // namespace moeserve::fuzz
