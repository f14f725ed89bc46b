#include <gtest/gtest.h>

#include <random>

#include "benchclient/backend.h"
#include "benchclient/client.h"
#include "benchclient/event_skim.h"
#include "benchclient/http_parser.h"
#include "core/error.h"

namespace moeserve::bench {
namespace {

using nlohmann::json;

// What a response parses to: status, body, SSE events.
struct Parsed {
  int status = 0;
  bool done = false, failed = false, keep_alive = false;
  std::string body;
  std::vector<std::string> events;
};

Parsed parse_in_pieces(const std::string& wire, const std::vector<size_t>& cuts, bool eof = false) {
  Parsed p;
  SseParser sse([&](std::string_view d) { p.events.emplace_back(d); });
  HttpResponseParser http([&](std::string_view b) {
    p.body.append(b);
    sse.feed(b);
  });
  size_t pos = 0;
  for (size_t i = 0; i <= cuts.size(); ++i) {
    size_t end = i < cuts.size() ? cuts[i] : wire.size();
    if (!http.feed(std::string_view(wire).substr(pos, end - pos))) break;
    pos = end;
  }
  if (eof) http.on_eof();
  if (http.done()) sse.finish();
  p.status = http.status();
  p.done = http.done();
  p.failed = http.failed();
  p.keep_alive = http.keep_alive();
  return p;
}

std::string chunked(const std::string& body, const std::vector<size_t>& sizes) {
  std::string r;
  size_t pos = 0, i = 0;
  while (pos < body.size()) {
    size_t n = std::min(body.size() - pos, sizes[i++ % sizes.size()]);
    r += fmt::format("{:X}{}\r\n", n, i == 2 ? ";ext=1" : "") + body.substr(pos, n) + "\r\n";
    pos += n;
  }
  return r + "0\r\n\r\n";
}

// A streamed SGLang /generate answer as the server sends it: cumulative text, one event with two tokens, a final
// event without new tokens, [DONE]; events cut across chunk boundaries.
const std::vector<std::string> kSglangEvents = {
    R"({"text":" Hello","output_ids":[9707],"meta_info":{"id":"a1","finish_reason":null,"prompt_tokens":4,"completion_tokens":1,"cached_tokens":0}})",
    R"({"text":" Hello,","output_ids":[11],"meta_info":{"id":"a1","finish_reason":null,"prompt_tokens":4,"completion_tokens":2,"cached_tokens":0}})",
    R"({"text":" Hello, world!","output_ids":[1879,0],"meta_info":{"id":"a1","finish_reason":null,"prompt_tokens":4,"completion_tokens":4,"cached_tokens":0}})",
    R"({"text":" Hello, world!","output_ids":[],"meta_info":{"id":"a1","finish_reason":{"type":"length","length":4},"prompt_tokens":4,"completion_tokens":4,"cached_tokens":0}})",
    "[DONE]"};

std::string sglang_recording() {
  std::string body;
  for (auto& e : kSglangEvents) body += "data: " + e + "\n\n";
  return "HTTP/1.1 200 OK\r\ndate: Mon, 01 Jan 2024 00:00:00 GMT\r\nserver: uvicorn\r\n"
         "content-type: text/event-stream; charset=utf-8\r\nTransfer-Encoding: chunked\r\n\r\n" +
         chunked(body, {37, 200, 3, 90});
}

// An OpenAI /v1/completions stream with CR LF line ends, a keep-alive comment and the usage chunk at the end.
const std::vector<std::string> kOpenAiEvents = {
    R"({"id":"cmpl-1","object":"text_completion","choices":[{"index":0,"text":" The","finish_reason":null}],"usage":null})",
    R"({"id":"cmpl-1","object":"text_completion","choices":[{"index":0,"text":" end","finish_reason":null}],"usage":null})",
    R"({"id":"cmpl-1","object":"text_completion","choices":[{"index":0,"text":".","finish_reason":"length"}],"usage":null})",
    R"({"id":"cmpl-1","object":"text_completion","choices":[],"usage":{"prompt_tokens":12,"completion_tokens":3,"total_tokens":15}})",
    "[DONE]"};

std::string openai_recording() {
  std::string body = ": ping\r\n\r\n";
  for (auto& e : kOpenAiEvents) body += "data: " + e + "\r\n\r\n";
  return "HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\nTransfer-Encoding: chunked\r\n\r\n" +
         chunked(body, {64, 7, 150});
}

void check_every_split(const std::string& wire, const std::vector<std::string>& events) {
  Parsed whole = parse_in_pieces(wire, {});
  ASSERT_TRUE(whole.done);
  ASSERT_EQ(whole.events, events);
  for (size_t cut = 0; cut <= wire.size(); ++cut) {
    Parsed p = parse_in_pieces(wire, {cut});
    ASSERT_TRUE(p.done) << "split at " << cut;
    ASSERT_EQ(p.events, events) << "split at " << cut;
    ASSERT_EQ(p.body, whole.body) << "split at " << cut;
    ASSERT_TRUE(p.keep_alive);
  }
  std::vector<size_t> every_byte;
  for (size_t i = 1; i < wire.size(); ++i) every_byte.push_back(i);
  EXPECT_EQ(parse_in_pieces(wire, every_byte).events, events);
  std::mt19937 rng(5);
  for (int trial = 0; trial < 300; ++trial) {
    std::vector<size_t> cuts;
    for (int k = 0; k < 6; ++k) cuts.push_back(rng() % (wire.size() + 1));
    std::sort(cuts.begin(), cuts.end());
    ASSERT_EQ(parse_in_pieces(wire, cuts).events, events);
  }
}

TEST(StreamParse, SglangRecordingAtEverySplitPoint) { check_every_split(sglang_recording(), kSglangEvents); }
TEST(StreamParse, OpenAiRecordingAtEverySplitPoint) { check_every_split(openai_recording(), kOpenAiEvents); }

// The whole path (HTTP -> SSE -> token counting) counts the same tokens whatever the TCP split.
TEST(StreamParse, TokenCountsIndependentOfSplits) {
  const std::string wire = sglang_recording();
  for (size_t cut = 0; cut <= wire.size(); cut += 7) {
    ResponseReader reader(Backend::kSglang, 0.0);
    double now = 0;
    SseParser sse([&](std::string_view d) { reader.on_event(d, now); });
    HttpResponseParser http([&](std::string_view b) { sse.feed(b); });
    ASSERT_TRUE(http.feed(std::string_view(wire).substr(0, cut)));
    now = 1.0;
    ASSERT_TRUE(http.feed(std::string_view(wire).substr(cut)));
    ASSERT_TRUE(http.done());
    RequestResult r;
    reader.fill(r, 1.0, 99);
    EXPECT_EQ(r.output_len, 4);
    EXPECT_EQ(r.prompt_len, 4);
    EXPECT_EQ(r.itl_s.size(), 3u);  // tokens 2, 3, 4 (the event with two spreads its gap)
    EXPECT_TRUE(reader.saw_done());
    EXPECT_EQ(r.output_chars, int64_t(std::string(" Hello, world!").size()));
  }
}

TEST(HttpParser, ContentLengthKeepAliveAndClose) {
  std::string wire = "HTTP/1.1 400 Bad Request\r\nContent-Type: application/json\r\nContent-Length: 11\r\n\r\n"
                     "{\"a\":\"xyz\"}";
  Parsed p = parse_in_pieces(wire, {5, 40});
  EXPECT_TRUE(p.done);
  EXPECT_EQ(p.status, 400);
  EXPECT_EQ(p.body, "{\"a\":\"xyz\"}");
  EXPECT_TRUE(p.keep_alive);
  p = parse_in_pieces("HTTP/1.1 200 OK\r\nConnection: close\r\nContent-Length: 0\r\n\r\n", {});
  EXPECT_TRUE(p.done);
  EXPECT_FALSE(p.keep_alive);
  p = parse_in_pieces("HTTP/1.0 200 OK\r\nContent-Length: 2\r\n\r\nok", {});
  EXPECT_FALSE(p.keep_alive);
  p = parse_in_pieces("HTTP/1.0 200 OK\r\nConnection: Keep-Alive\r\nContent-Length: 2\r\n\r\nok", {});
  EXPECT_TRUE(p.keep_alive);
}

TEST(HttpParser, BodyUntilCloseInterimResponsesAndNoBody) {
  Parsed p = parse_in_pieces("HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\n\r\ndata: x\n\ndata: y", {30},
                             /*eof=*/true);
  EXPECT_TRUE(p.done);
  EXPECT_FALSE(p.keep_alive);
  EXPECT_EQ(p.events, (std::vector<std::string>{"x", "y"}));  // the last one without its blank line
  p = parse_in_pieces("HTTP/1.1 100 Continue\r\n\r\nHTTP/1.1 201 Created\r\nContent-Length: 1\r\n\r\nz", {});
  EXPECT_EQ(p.status, 201);
  EXPECT_EQ(p.body, "z");
  p = parse_in_pieces("HTTP/1.1 204 No Content\r\n\r\n", {});
  EXPECT_TRUE(p.done);
  EXPECT_TRUE(p.keep_alive);
  p = parse_in_pieces("\r\nHTTP/1.1 200 OK\nContent-Length: 1\n\nq", {});  // bare LF line ends
  EXPECT_EQ(p.body, "q");
}

TEST(HttpParser, ProtocolErrors) {
  EXPECT_TRUE(parse_in_pieces("SSH-2.0-OpenSSH\r\n", {}).failed);
  EXPECT_TRUE(parse_in_pieces("HTTP/1.1 2x0 OK\r\n\r\n", {}).failed);
  EXPECT_TRUE(parse_in_pieces("HTTP/1.0 040 Bad\r\n\r\n", {}).failed);  // no status class 0 (fuzz: http_response)
  EXPECT_TRUE(parse_in_pieces("HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\nzz\r\n", {}).failed);
  EXPECT_TRUE(parse_in_pieces("HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n2\r\nabX\r\n", {}).failed);
  EXPECT_TRUE(parse_in_pieces("HTTP/1.1 200 OK\r\nContent-Length: -1\r\n\r\n", {}).failed);
  EXPECT_TRUE(parse_in_pieces("HTTP/1.1 200 OK\r\nbad header\r\n\r\n", {}).failed);
  // Cut short by the close.
  Parsed p = parse_in_pieces("HTTP/1.1 200 OK\r\nContent-Length: 10\r\n\r\nabc", {}, true);
  EXPECT_TRUE(p.failed);
  HttpResponseParser h([](std::string_view) {});
  EXPECT_FALSE(h.on_eof());
  EXPECT_NE(h.error().find("before any response"), std::string::npos);
}

TEST(SseParser, LineEndsCommentsFieldsAndMultiLineData) {
  std::vector<std::string> ev;
  SseParser sse([&](std::string_view d) { ev.emplace_back(d); });
  sse.feed("\xEF\xBB\xBF" "data: a\r\n\r");  // BOM, CRLF, then CR
  sse.feed("\n");                           // completes that CR LF: not another empty line
  sse.feed(": comment\ndata:b\ndata:  c\nevent: x\nid: 3\nretry: 10\n\n");
  sse.feed("data\n\ndata:\n\n");  // a field with no colon is data "", an empty data: nothing is dispatched
  sse.feed("data: {\"x\":1}\r");
  sse.feed("\n\r\n");
  EXPECT_EQ(ev, (std::vector<std::string>{"a", "b\n c", "{\"x\":1}"}));
  sse.feed("data: tail");
  sse.finish();
  EXPECT_EQ(ev.back(), "tail");
}

TEST(ResponseReader, SpreadsMultiTokenEventsAsSglang) {
  ResponseReader r(Backend::kSglang, 10.0);
  auto ev = [&](int64_t ct, const std::string& text, double t) {
    r.on_event(json({{"text", text}, {"meta_info", {{"prompt_tokens", 7}, {"completion_tokens", ct}}}}).dump(), t);
  };
  ev(2, "ab", 10.5);     // first event carries 2 tokens: TTFT 0.5, no ITL
  ev(3, "abc", 10.6);    // 1 token after 0.1
  ev(6, "abcdef", 10.9); // 3 tokens after 0.3: three ITLs of 0.1
  ev(6, "abcdef", 11.0); // nothing new
  r.on_event("[DONE]", 11.0);
  RequestResult res;
  r.fill(res, 11.0, 3);
  EXPECT_DOUBLE_EQ(res.ttft_s, 0.5);
  ASSERT_EQ(res.itl_s.size(), 4u);
  for (double x : res.itl_s) EXPECT_NEAR(x, 0.1, 1e-9);
  EXPECT_EQ(res.output_len, 6);
  EXPECT_EQ(res.prompt_len, 7);
  EXPECT_DOUBLE_EQ(res.latency_s, 1.0);
  EXPECT_TRUE(r.error().empty());
}

TEST(ResponseReader, SglangWithoutTextCountsCompletionTokens) {
  ResponseReader r(Backend::kSglang, 0);  // --skip-tokenizer-init: ids only
  r.on_event(R"({"text":"","output_ids":[5],"meta_info":{"completion_tokens":1}})", 1);
  r.on_event(R"({"text":"","output_ids":[6],"meta_info":{"completion_tokens":2}})", 2);
  RequestResult res;
  r.fill(res, 2, 11);
  EXPECT_EQ(res.output_len, 2);
  EXPECT_EQ(res.prompt_len, 11);  // not reported: the dataset's
  EXPECT_EQ(res.itl_s, std::vector<double>{1.0});
}

TEST(ResponseReader, OpenAiUsageAndChatDeltas) {
  ResponseReader c(Backend::kOpenAiCompletions, 0);
  for (size_t i = 0; i < kOpenAiEvents.size(); ++i) c.on_event(kOpenAiEvents[i], 1.0 + double(i));
  RequestResult res;
  c.fill(res, 5, 0);
  EXPECT_EQ(res.output_len, 3);
  EXPECT_EQ(res.prompt_len, 12);
  EXPECT_DOUBLE_EQ(res.ttft_s, 1.0);
  EXPECT_EQ(res.itl_s, (std::vector<double>{1.0, 1.0}));

  ResponseReader chat(Backend::kOpenAiChat, 0);
  chat.on_event(R"({"choices":[{"index":0,"delta":{"role":"assistant","content":""}}]})", 0.5);  // no token
  chat.on_event(R"({"choices":[{"index":0,"delta":{"reasoning_content":"hm"}}]})", 1.0);
  chat.on_event(R"({"choices":[{"index":0,"delta":{"tool_calls":[{"index":0,"function":{"arguments":"{"}}]}}]})", 1.5);
  chat.on_event(R"({"choices":[{"index":0,"delta":{"content":"ok"},"finish_reason":"stop"}]})", 2.0);
  chat.on_event("[DONE]", 2.0);
  chat.fill(res, 2.0, 9);
  EXPECT_DOUBLE_EQ(res.ttft_s, 1.0);
  EXPECT_EQ(res.itl_s, (std::vector<double>{0.5, 0.5}));
  EXPECT_EQ(res.output_len, 3);  // no usage: counted events
  EXPECT_EQ(res.prompt_len, 9);

  ResponseReader cont(Backend::kOpenAiCompletions, 0);  // continuous usage: 2 tokens per chunk
  cont.on_event(R"({"choices":[{"text":"ab"}],"usage":{"prompt_tokens":3,"completion_tokens":2}})", 1.0);
  cont.on_event(R"({"choices":[{"text":"cd"}],"usage":{"prompt_tokens":3,"completion_tokens":4}})", 1.2);
  cont.fill(res, 1.2, 0);
  EXPECT_EQ(res.output_len, 4);
  ASSERT_EQ(res.itl_s.size(), 2u);
  EXPECT_NEAR(res.itl_s[0], 0.1, 1e-12);
}

TEST(ResponseReader, ErrorsAbortsAndWholeBodies) {
  ResponseReader e(Backend::kOpenAiChat, 0);
  e.on_event(R"({"error":{"message":"engine died","code":500}})", 1);
  EXPECT_EQ(e.error(), "engine died");
  ResponseReader a(Backend::kSglang, 0);
  a.on_event(R"({"text":"x","meta_info":{"completion_tokens":1,"finish_reason":{"type":"abort","message":"out of memory"}}})", 1);
  EXPECT_NE(a.error().find("out of memory"), std::string::npos);
  ResponseReader m(Backend::kSglang, 0);
  m.on_event("{not json", 1);
  EXPECT_NE(m.error().find("malformed"), std::string::npos);
  ResponseReader w(Backend::kOpenAiCompletions, 0);  // --disable-stream
  w.on_json_body(R"({"choices":[{"text":"abc"}],"usage":{"prompt_tokens":5,"completion_tokens":9}})", 2.0);
  RequestResult res;
  w.fill(res, 2.0, 0);
  EXPECT_EQ(res.output_len, 9);
  EXPECT_DOUBLE_EQ(res.ttft_s, 2.0);
  EXPECT_TRUE(res.itl_s.empty());
}

// The fast SGLang path agrees with the full JSON parser, and declines what it does not handle.
TEST(EventSkim, AgreesWithTheJsonParser) {
  std::mt19937 rng(11);
  // JSON text pieces: plain, escapes (\" \\ \n \/ \t), \u escapes of 2 and 3 UTF-8 bytes and a surrogate pair,
  // raw UTF-8, JSON punctuation inside the string.
  const std::vector<std::string> pieces = {"a",  " word", R"(\")", R"(\\)", R"(\n)", R"(\u00e9)", R"(\u4e2d)",
                                           R"(\ud83d\ude00)", "é", "中", R"(\/)", R"(\t)", "{", "}", "[", "]", ",", ":"};
  for (int trial = 0; trial < 500; ++trial) {
    std::string text;
    for (int i = int(rng() % 40); i > 0; --i) text += pieces[rng() % pieces.size()];
    std::string ev = R"({"text":")" + text + R"(","output_ids":[1,2,-3],"meta_info":{"id":"x\"y","finish_reason":null,)"
                     R"("prompt_tokens":)" + std::to_string(rng() % 5000) + R"(,"weights":[1.5e-3,{"a":[true,false,null]}],)"
                     R"("completion_tokens":)" + std::to_string(rng() % 5000) + R"(,"cached_tokens":0},"index":0})";
    if (trial % 3 == 0) ev = " \n" + ev + "\t ";
    json j = json::parse(ev);
    SglangEventFields f;
    ASSERT_TRUE(skim_sglang_event(ev, f)) << ev;
    EXPECT_EQ(f.text_bytes, int64_t(j["text"].get<std::string>().size())) << ev;
    EXPECT_EQ(f.completion_tokens, j["meta_info"]["completion_tokens"].get<int64_t>());
    EXPECT_EQ(f.prompt_tokens, j["meta_info"]["prompt_tokens"].get<int64_t>());
  }
  SglangEventFields f;
  EXPECT_TRUE(skim_sglang_event(R"({"meta_info":{"completion_tokens":3}})", f));
  EXPECT_EQ(f.text_bytes, -1);
  EXPECT_TRUE(skim_sglang_event(R"({"text":"x","error":null,"meta_info":null})", f));
  EXPECT_EQ(f.completion_tokens, -1);
  for (const char* declined : {R"({"text":"x","meta_info":{"finish_reason":{"type":"abort"}}})",
                               R"({"error":{"message":"boom"}})", R"({"text":"x")", R"({"text":"x"} junk)",
                               R"({"meta_info":{"completion_tokens":3.5}})", R"({"text":"\u12"})", "[1,2]",
                               R"({"a":tru})", R"({"a":-})", ""})
    EXPECT_FALSE(skim_sglang_event(declined, f)) << declined;
  // What the full parser refuses, the skimmer declines too (found by the sglang_event fuzz target): raw control
  // characters, ill-formed UTF-8, unknown escapes, unpaired surrogates, leading zeros, numbers past a double; and a
  // key with an escape (it may spell "text").
  for (const std::string& declined :
       {std::string("{\"text\":\"a\x01\"}"), std::string("{\"text\":\"\xff\"}"),
        std::string("{\"text\":\"\xc3\"}"), std::string("{\"text\":\"\xed\xa0\x80\"}"),
        std::string(R"({"text":"\x41"})"), std::string(R"({"text":"\ud83d"})"), std::string(R"({"text":"\ude00"})"),
        std::string(R"({"meta_info":{"completion_tokens":007}})"), std::string(R"({"w":01})"),
        std::string(R"({"w":1e400})"), std::string(R"({"w":1.})"), std::string(R"({"w":1e})"),
        std::string("{\"w\":" + std::string(400, '9') + "}"), std::string(R"({"te\u0078t":"abc"})")}) {
    EXPECT_FALSE(skim_sglang_event(declined, f)) << declined;
    EXPECT_TRUE(json::parse(declined, nullptr, false).is_discarded() || declined.find("\\u0078") != std::string::npos)
        << declined << ": the full parser accepts it, so the skimmer should not decline it";
  }
  // A key the skimmer reads given twice: which one counts is the full parser's choice (it keeps the last), so the
  // skimmer declines (found by the sglang_event fuzz target: a second meta_info without prompt_tokens).
  for (const char* declined :
       {R"({"meta_info":{"prompt_tokens":12},"meta_info":{"my":0.5}})", R"({"text":"a","text":"bc"})",
        R"({"meta_info":{"completion_tokens":1,"completion_tokens":2}})", R"({"meta_info":{"prompt_tokens":1,"prompt_tokens":1}})",
        R"({"error":null,"error":null})", R"({"meta_info":{"finish_reason":null,"finish_reason":null}})"})
    EXPECT_FALSE(skim_sglang_event(declined, f)) << declined;
  EXPECT_TRUE(skim_sglang_event(R"({"w":1,"w":2,"meta_info":{"x":1,"x":2,"prompt_tokens":4}})", f));  // others may repeat
  EXPECT_EQ(f.prompt_tokens, 4);
  const char* accepted = R"({"w":[0, -0, 1e-400, 1.5E+3, 123456789012345678901234567890]})";  // both parsers
  EXPECT_TRUE(skim_sglang_event(accepted, f));
  EXPECT_FALSE(json::parse(accepted, nullptr, false).is_discarded());
}

TEST(Backend, RequestBodiesAndNames) {
  BenchRequest ids;
  ids.is_ids = true;
  ids.prompt_ids = {1, 2, 3};
  BenchRequest text;
  text.prompt_text = "hello";
  SamplingOptions s;
  json g = json::parse(build_request_body(Backend::kSglang, ids, 16, s));
  EXPECT_EQ(g["input_ids"], json({1, 2, 3}));
  EXPECT_EQ(g["sampling_params"]["max_new_tokens"], 16);
  EXPECT_EQ(g["sampling_params"]["ignore_eos"], true);
  EXPECT_EQ(g["sampling_params"]["temperature"], 0.0);
  EXPECT_EQ(g["stream"], true);
  EXPECT_EQ(json::parse(build_request_body(Backend::kSglang, text, 4, s))["text"], "hello");
  s.model = "m";
  s.ignore_eos = false;
  s.extra_body = json::parse(R"({"top_k": 1, "stream_options": {"continuous_usage_stats": true}})");
  json o = json::parse(build_request_body(Backend::kOpenAiCompletions, ids, 8, s));
  EXPECT_EQ(o["prompt"], json({1, 2, 3}));
  EXPECT_EQ(o["max_tokens"], 8);
  EXPECT_EQ(o["model"], "m");
  EXPECT_EQ(o["ignore_eos"], false);
  EXPECT_EQ(o["top_k"], 1);
  EXPECT_EQ(o["stream_options"]["include_usage"], true);  // merged, not replaced
  EXPECT_EQ(o["stream_options"]["continuous_usage_stats"], true);
  json c = json::parse(build_request_body(Backend::kOpenAiChat, text, 8, s));
  EXPECT_EQ(c["messages"][0]["content"], "hello");
  EXPECT_EQ(c["messages"][0]["role"], "user");
  EXPECT_THROW(build_request_body(Backend::kOpenAiChat, ids, 8, s), UserError);
  EXPECT_EQ(parse_backend("vllm"), Backend::kOpenAiCompletions);
  EXPECT_EQ(parse_backend("sglang-oai-chat"), Backend::kOpenAiChat);
  EXPECT_THROW(parse_backend("tgi"), UserError);
}

TEST(Backend, HttpErrorMessages) {
  EXPECT_EQ(describe_http_error(400, "Bad Request", R"({"error":{"message":"too long","code":400}})"),
            "HTTP 400: too long");
  EXPECT_EQ(describe_http_error(422, "", R"({"detail":"field required"})"), "HTTP 422: field required");
  EXPECT_EQ(describe_http_error(503, "Service Unavailable", ""), "HTTP 503: Service Unavailable");
  EXPECT_EQ(describe_http_error(500, "", "plain text"), "HTTP 500: plain text");
}

TEST(Endpoint, BaseUrlsAndRequestBytes) {
  Endpoint e = Endpoint::from_base_url("http://10.0.0.5:8000/api/");
  EXPECT_EQ(e.host, "10.0.0.5");
  EXPECT_EQ(e.port, 8000);
  EXPECT_EQ(e.path_prefix, "/api");
  EXPECT_EQ(e.base_url(), "http://10.0.0.5:8000/api");
  e = Endpoint::from_base_url("http://[::1]:30000");
  EXPECT_EQ(e.host, "::1");
  EXPECT_EQ(e.base_url(), "http://[::1]:30000");
  EXPECT_EQ(Endpoint::from_base_url("localhost").port, 80);
  EXPECT_THROW(Endpoint::from_base_url("https://x"), UserError);
  EXPECT_THROW(Endpoint::from_base_url("http://x:99999"), UserError);
  EXPECT_THROW(Endpoint::from_base_url("http://:80"), UserError);
  Endpoint p = Endpoint::from_base_url("http://h:1/pre");
  HttpCall call{"POST", "/generate", "{}", {{"Authorization", "Bearer k"}}};
  EXPECT_EQ(serialize_request(p, call),
            "POST /pre/generate HTTP/1.1\r\nHost: h:1\r\nUser-Agent: moeserve-bench\r\nAccept: */*\r\n"
            "Content-Type: application/json\r\nContent-Length: 2\r\nAuthorization: Bearer k\r\n\r\n{}");
}

}  // namespace
}  // namespace moeserve::bench
