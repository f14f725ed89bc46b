// The properties the fuzz targets check, shared by the libFuzzer targets (fuzz/fuzz_*.cpp, built with clang by
// fuzz/CMakeLists.txt) and by the regression test that replays saved inputs under the main g++ build
// (tests/fuzz_regressions/test_fuzz_regressions.cpp). One function per target; each takes the raw input bytes.
//
// A broken property throws CheckFailure. Any other exception that escapes a check_* function is a failure too
// (the only exception a check lets through silently is the moeserve::UserError its API documents). The fuzz
// targets turn both into abort(), so libFuzzer records the input; the regression test turns them into test
// failures.
//
// Input layouts (the first bytes of the parser inputs are a small header so that libFuzzer can mutate the
// options and the chunking along with the text; see ParserHeader):
//   tokenizer_encode : the text to encode (any bytes).
//   tokenizer_decode : byte 0 = flags (bit 0 skip_special_tokens, bit 1 also test an out-of-range id), then
//                      3 bytes per id (see ids_from_bytes).
//   tokenizer_json   : a tokenizer.json document.
//   template         : a Jinja template source, rendered with fixed_template_context().
//   tool_calls       : ParserHeader (5 bytes) + model output. flags bit 0: 0 = "qwen3_coder", 1 = "hermes".
//   reasoning        : ParserHeader (5 bytes) + model output. flags bits 0-1: parser (0 qwen3, 1 qwen3-thinking,
//                      2 deepseek-r1, 3 qwen3), bit 2 starts_in_reasoning, bit 3 thinking disabled.
#pragma once

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <ctime>
#include <exception>
#include <memory>
#include <span>
#include <stdexcept>
#include <string>
#include <string_view>
#include <typeinfo>
#include <vector>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include "core/error.h"
#include "parsers/reasoning.h"
#include "parsers/tool_calls.h"
#include "template/jinja.h"
#include "tokenizer/tokenizer.h"
#include "tokenizer/unicode.h"

namespace moeserve::fuzz {

// A property the fuzzed code must keep, broken.
class CheckFailure : public std::runtime_error {
 public:
  explicit CheckFailure(const std::string& msg) : std::runtime_error(msg) {}
};

#define FUZZ_CHECK(cond, ...)                                                                              \
  do {                                                                                                     \
    if (!(cond)) {                                                                                         \
      throw ::moeserve::fuzz::CheckFailure(::fmt::format("{}:{}: {}: ", __FILE__, __LINE__, #cond) +       \
                                           ::fmt::format(__VA_ARGS__));                                    \
    }                                                                                                      \
  } while (0)

// ---- helpers ------------------------------------------------------------------------------------------------

// Printable form of bytes for failure messages (escapes, truncated).
inline std::string show(std::string_view s, size_t max = 400) {
  std::string out;
  for (size_t i = 0; i < s.size() && i < max; ++i) {
    const unsigned char c = static_cast<unsigned char>(s[i]);
    if (c == '\n') out += "\\n";
    else if (c == '\\') out += "\\\\";
    else if (c == '"') out += "\\\"";
    else if (c < 0x20 || c >= 0x7f) out += fmt::format("\\x{:02x}", c);
    else out += static_cast<char>(c);
  }
  if (s.size() > max) out += fmt::format("...({} bytes)", s.size());
  return "\"" + out + "\"";
}

// Independent of the tokenizer's own validator on purpose: a strict UTF-8 check (no overlongs, no surrogates,
// nothing above U+10FFFF).
inline bool valid_utf8(std::string_view s) {
  size_t i = 0;
  const auto* p = reinterpret_cast<const unsigned char*>(s.data());
  const size_t n = s.size();
  while (i < n) {
    const unsigned char b = p[i];
    if (b < 0x80) {
      ++i;
      continue;
    }
    int len;
    unsigned char lo = 0x80, hi = 0xBF;
    if (b >= 0xC2 && b <= 0xDF) len = 2;
    else if (b == 0xE0) len = 3, lo = 0xA0;
    else if (b >= 0xE1 && b <= 0xEC) len = 3;
    else if (b == 0xED) len = 3, hi = 0x9F;
    else if (b >= 0xEE && b <= 0xEF) len = 3;
    else if (b == 0xF0) len = 4, lo = 0x90;
    else if (b >= 0xF1 && b <= 0xF3) len = 4;
    else if (b == 0xF4) len = 4, hi = 0x8F;
    else return false;
    if (i + len > n) return false;
    if (p[i + 1] < lo || p[i + 1] > hi) return false;
    for (int k = 2; k < len; ++k) {
      if (p[i + k] < 0x80 || p[i + k] > 0xBF) return false;
    }
    i += len;
  }
  return true;
}

inline std::string_view as_view(const uint8_t* data, size_t size) {
  return {reinterpret_cast<const char*>(data), size};
}

// Runs one check; returns "" when it passed, else what went wrong.
template <typename F>
std::string run_check(F&& f) {
  try {
    f();
    return {};
  } catch (const CheckFailure& e) {
    return std::string("CHECK FAILED: ") + e.what();
  } catch (const std::exception& e) {
    return fmt::format("UNEXPECTED EXCEPTION ({}): {}", typeid(e).name(), e.what());
  } catch (...) {
    return "UNEXPECTED EXCEPTION of a non-std type";
  }
}

// ---- tokenizer ----------------------------------------------------------------------------------------------

// decode(ids) against the streaming detokenizer fed the same ids: same text, every piece valid UTF-8.
inline void check_stream_equals_decode(const tok::Tokenizer& t, std::span<const int32_t> ids, bool skip_special) {
  const std::string full = t.decode(ids, skip_special);
  FUZZ_CHECK(valid_utf8(full), "decode gave invalid UTF-8 {}", show(full));
  tok::StreamingDetokenizer st(t, skip_special);
  std::string streamed;
  for (size_t i = 0; i < ids.size(); ++i) {
    const std::string piece = st.push(ids[i]);
    FUZZ_CHECK(valid_utf8(piece), "push(#{} = {}) emitted invalid UTF-8 {}", i, ids[i], show(piece));
    streamed += piece;
  }
  const std::string tail = st.finish();
  FUZZ_CHECK(valid_utf8(tail), "finish emitted invalid UTF-8 {}", show(tail));
  streamed += tail;
  FUZZ_CHECK(streamed == full, "streaming detokenizer (skip_special={}) gave {}, decode gave {}", skip_special,
             show(streamed), show(full));
}

// An id outside the vocabulary is a UserError for decode and for the streaming detokenizer, never a crash.
inline void check_bad_id(const tok::Tokenizer& t, std::span<const int32_t> good, int32_t bad) {
  std::vector<int32_t> ids(good.begin(), good.end());
  ids.push_back(bad);
  bool threw = false;
  try {
    t.decode(ids);
  } catch (const UserError&) {
    threw = true;
  }
  FUZZ_CHECK(threw, "decode accepted the out-of-range id {}", bad);
  tok::StreamingDetokenizer st(t, false);
  for (int32_t id : good) st.push(id);
  threw = false;
  try {
    st.push(bad);
  } catch (const UserError&) {
    threw = true;
  }
  FUZZ_CHECK(threw, "StreamingDetokenizer::push accepted the out-of-range id {}", bad);
  st.finish();
}

// The checks on one encode: never throws, ids in range, decode == streaming, and for text that is valid UTF-8
// and already NFC (so that normalization cannot change it) decode(encode(text)) == text.
// `lossless_nfc`: the tokenizer is byte-level with an NFC normalizer only (the real Qwen3 one).
inline void check_encode(const tok::Tokenizer& t, std::string_view text, bool lossless_nfc) {
  std::vector<int32_t> ids;
  try {
    ids = t.encode(text, /*add_special_tokens=*/false);
  } catch (const std::exception& e) {
    throw CheckFailure(fmt::format("encode threw ({}): {} on {}", typeid(e).name(), e.what(), show(text)));
  }
  const int32_t vocab = t.vocab_size();
  for (int32_t id : ids) FUZZ_CHECK(id >= 0 && id < vocab, "encode gave id {} outside [0, {})", id, vocab);
  FUZZ_CHECK(text.empty() || !ids.empty() || !lossless_nfc, "no ids for non-empty text {}", show(text));
  check_stream_equals_decode(t, ids, false);
  check_stream_equals_decode(t, ids, true);
  if (lossless_nfc && valid_utf8(text) &&
      tok::unicode::normalize(text, tok::unicode::NormalForm::kNFC) == text) {
    const std::string back = t.decode(ids);
    FUZZ_CHECK(back == text, "decode(encode(x)) != x: x = {}, got {}", show(text), show(back));
  }
}

// tokenizer_encode: the whole input is text; the tokenizer is the real Qwen3 one.
inline void check_tokenizer_encode(const tok::Tokenizer& qwen3, std::string_view data) {
  check_encode(qwen3, data, /*lossless_nfc=*/true);
  // With special tokens (Qwen3 adds none, but the path must run).
  std::vector<int32_t> with_special;
  try {
    with_special = qwen3.encode(data, /*add_special_tokens=*/true);
  } catch (const std::exception& e) {
    throw CheckFailure(fmt::format("encode(add_special_tokens) threw: {}", e.what()));
  }
  (void)with_special;
}

// Ids from input bytes, 3 bytes each, biased towards the ids where decoding is delicate:
//  b0 < 0x40          : the single-byte token of byte b1 (byte-level tokenizers: partial UTF-8 sequences);
//  0x40 <= b0 < 0x60  : one of the 64 highest ids (added / special tokens);
//  otherwise          : ((b0 & 0x3F) << 16 | b1 << 8 | b2) % vocab_size.
inline std::vector<int32_t> ids_from_bytes(const tok::Tokenizer& t, std::string_view bytes) {
  const int32_t vocab = t.vocab_size();
  std::vector<int32_t> ids;
  if (vocab <= 0) return ids;
  const auto& table = tok::unicode::byte_level_table();
  for (size_t i = 0; i + 3 <= bytes.size(); i += 3) {
    const auto b0 = static_cast<unsigned char>(bytes[i]);
    const auto b1 = static_cast<unsigned char>(bytes[i + 1]);
    const auto b2 = static_cast<unsigned char>(bytes[i + 2]);
    if (b0 < 0x40) {
      if (auto id = t.token_to_id(table.byte_to_utf8[b1])) {
        ids.push_back(*id);
        continue;
      }
    }
    if (b0 >= 0x40 && b0 < 0x60) {
      ids.push_back(std::max(0, vocab - 1 - (b1 % 64)));
      continue;
    }
    ids.push_back(static_cast<int32_t>(((uint32_t(b0 & 0x3F) << 16) | (uint32_t(b1) << 8) | b2) % uint32_t(vocab)));
  }
  return ids;
}

// tokenizer_decode: ids derived from the input, decoded whole and streamed.
inline void check_tokenizer_decode(const tok::Tokenizer& t, std::string_view data) {
  if (data.empty()) return;
  const auto flags = static_cast<unsigned char>(data[0]);
  const std::vector<int32_t> ids = ids_from_bytes(t, data.substr(1));
  check_stream_equals_decode(t, ids, (flags & 1) != 0);
  if (flags & 2) {
    const int32_t bad = (flags & 4) ? -1 - (flags >> 3) : t.vocab_size() + (flags >> 3);
    check_bad_id(t, ids, bad);
  }
}

// tokenizer_json: loading must succeed or throw UserError; a tokenizer that loads must encode and decode a few
// texts and all its small ids with the same guarantees (UserError allowed from encode: a pathological regex).
inline void check_tokenizer_json(std::string_view data) {
  std::unique_ptr<tok::Tokenizer> t;
  try {
    t = tok::Tokenizer::from_json_string(std::string(data));
  } catch (const UserError&) {
    return;
  }
  FUZZ_CHECK(t->vocab_size() >= 0, "negative vocab_size {}", t->vocab_size());
  static const char* const kTexts[] = {
      "Hello world",    " leading  and trailing  ", "a\n\nb\r\n\tc", "caf\xC3\xA9 cafe\xCC\x81 \xEF\xBC\xA1",
      "1234567 3.14",   "<s>x</s><unk>",            "\xE4\xBD\xA0\xE5\xA5\xBD\xF0\x9F\x99\x82",
      "\xFF\xC3 broken", "",                        "\xE2\x96\x81lower UPPER-case, end.",
  };
  for (const char* text : kTexts) {
    std::vector<int32_t> ids;
    try {
      ids = t->encode(text, true);
    } catch (const UserError&) {
      continue;
    }
    for (int32_t id : ids) {
      FUZZ_CHECK(id >= 0 && id < t->vocab_size(), "encode gave id {} outside [0, {})", id, t->vocab_size());
    }
    check_stream_equals_decode(*t, ids, false);
    check_stream_equals_decode(*t, ids, true);
  }
  std::vector<int32_t> all;
  for (int32_t id = 0; id < std::min<int32_t>(t->vocab_size(), 300); ++id) all.push_back(id);
  check_stream_equals_decode(*t, all, false);
  check_stream_equals_decode(*t, all, true);
  std::vector<int32_t> rev(all.rbegin(), all.rend());
  check_stream_equals_decode(*t, rev, false);
  check_bad_id(*t, {}, t->vocab_size());
}

// ---- template -----------------------------------------------------------------------------------------------

inline const nlohmann::ordered_json& fixed_template_context() {
  static const nlohmann::ordered_json ctx = nlohmann::ordered_json::parse(R"({
    "bos_token": "<|im_start|>", "eos_token": "<|im_end|>", "pad_token": "<|endoftext|>",
    "enable_thinking": true, "add_generation_prompt": true, "documents": null,
    "messages": [
      {"role": "system", "content": "You are a helpful assistant."},
      {"role": "user", "content": "What is the weather in Paris? <b>&amp;</b> 天気"},
      {"role": "assistant", "content": "", "reasoning_content": "Need the tool.",
       "tool_calls": [{"id": "call_1", "type": "function",
                       "function": {"name": "get_weather", "arguments": {"location": "Paris", "days": 3}}},
                      {"id": "call_2", "type": "function",
                       "function": {"name": "calc", "arguments": "{\"a\": 1.5}"}}]},
      {"role": "tool", "tool_call_id": "call_1", "content": "{\"temp\": 21}"},
      {"role": "tool", "tool_call_id": "call_2", "content": "1.5"},
      {"role": "assistant", "content": "<think>\nok\n</think>\n\nIt is 21 degrees."},
      {"role": "user", "content": [{"type": "text", "text": "and now?"}, {"type": "image"}]}
    ],
    "tools": [
      {"type": "function", "function": {"name": "get_weather", "description": "Weather for a city",
        "parameters": {"type": "object", "properties": {"location": {"type": "string"},
          "unit": {"type": "string", "enum": ["celsius", "fahrenheit"]}, "days": {"type": "integer"}},
          "required": ["location"]}}},
      {"type": "function", "function": {"name": "calc", "parameters": {"type": "object", "properties": {
          "a": {"type": "number"}, "b": {"type": "number"}}}}}
    ],
    "x": [1, 2, 3], "y": {"a": "b", "c": [true, null, 2.5]}, "s": "str", "n": 7, "f": -0.5, "b": false,
    "none": null, "big": 9223372036854775807, "neg": -9223372036854775808, "u": "é\u0000\ud83d\ude42"
  })");
  return ctx;
}

inline tpl::RenderOptions fixed_clock() {
  std::tm tm{};
  tm.tm_year = 2025 - 1900;
  tm.tm_mon = 2;
  tm.tm_mday = 14;
  tm.tm_hour = 9;
  tm.tm_min = 26;
  tm.tm_sec = 53;
  tm.tm_wday = 5;
  tm.tm_yday = 72;
  tpl::RenderOptions o;
  o.now = tm;
  return o;
}

// template: parse + render may only fail with UserError.
inline void check_template(std::string_view data) {
  try {
    const tpl::Template t = tpl::Template::parse(std::string(data));
    t.render(fixed_template_context(), fixed_clock());
  } catch (const UserError&) {
  }
}

// ---- parsers ------------------------------------------------------------------------------------------------

// The 5-byte header of the parser inputs: flags, then four chunk lengths (byte % 17; 0 pushes an empty chunk),
// used in turn. Inputs shorter than the header are all header (and the text is empty).
struct ParserHeader {
  static constexpr size_t kSize = 5;
  uint8_t flags = 0;
  size_t lens[4] = {0, 0, 0, 0};
  std::string_view text;

  explicit ParserHeader(std::string_view data) {
    if (!data.empty()) flags = static_cast<uint8_t>(data[0]);
    for (size_t i = 0; i < 4; ++i) lens[i] = i + 1 < data.size() ? static_cast<unsigned char>(data[i + 1]) % 17 : 0;
    text = data.size() > kSize ? data.substr(kSize) : std::string_view();
  }

  // The chunks the streaming side is fed. After four empty chunks in a row the rest comes in one piece.
  std::vector<std::string_view> chunks() const {
    std::vector<std::string_view> out;
    size_t pos = 0, i = 0;
    int empties = 0;
    while (pos < text.size()) {
      size_t len = lens[i++ % 4];
      if (len == 0 && ++empties > 4) len = text.size() - pos;
      if (len != 0) empties = 0;
      len = std::min(len, text.size() - pos);
      out.push_back(text.substr(pos, len));
      pos += len;
    }
    return out;
  }
};

inline const nlohmann::ordered_json& fixed_tools() {
  static const nlohmann::ordered_json t = nlohmann::ordered_json::parse(R"([
    {"type": "function", "function": {"name": "get_weather", "description": "Weather for a city",
      "parameters": {"type": "object", "properties": {
        "location": {"type": "string"}, "unit": {"type": "string", "enum": ["celsius", "fahrenheit"]},
        "days": {"type": "integer"}}, "required": ["location"]}}},
    {"type": "function", "function": {"name": "calc", "parameters": {"type": "object", "properties": {
        "a": {"type": "number"}, "b": {"type": "number"}, "precise": {"type": "boolean"}}}}},
    {"type": "function", "function": {"name": "write_file", "parameters": {"type": "object", "properties": {
        "path": {"type": "string"}, "content": {"type": "string"}}}}},
    {"type": "function", "function": {"name": "search", "parameters": {"type": "object", "properties": {
        "query": {"type": "string"}, "filters": {"type": "object"}, "tags": {"type": "array"},
        "limit": {"type": ["integer", "null"]}, "ratio": {"type": "number"}}}}},
    {"type": "function", "function": {"name": "ping"}}
  ])");
  return t;
}

inline std::unique_ptr<parsers::ToolCallParser> make_tool_parser(const std::string& name) {
  auto counter = std::make_shared<int>(0);
  return parsers::ToolCallParser::create(name, fixed_tools(),
                                         [counter] { return "call_" + std::to_string((*counter)++); });
}

// tool_calls: streaming in the header's chunks == parse_full; delta shapes as tool_calls.h documents; for
// UTF-8 input every arguments string is a compact JSON object. Parsing model output never throws.
inline void check_tool_calls(std::string_view data) {
  const ParserHeader h(data);
  const std::string name = (h.flags & 1) ? "hermes" : "qwen3_coder";
  const parsers::ToolParseResult full = make_tool_parser(name)->parse_full(h.text);

  auto p = make_tool_parser(name);
  parsers::ToolParseResult got;
  auto add = [&](const parsers::ToolStreamDelta& d) {
    got.content += d.content;
    for (const parsers::ToolCallDelta& c : d.calls) {
      if (c.index == static_cast<int>(got.calls.size())) {
        FUZZ_CHECK(!c.id.empty() && !c.name.empty() && c.arguments_fragment.empty(),
                   "first delta of index {} must carry id and name only (id {}, name {}, args {})", c.index,
                   show(c.id), show(c.name), show(c.arguments_fragment));
        got.calls.push_back({c.id, c.name, ""});
      } else {
        FUZZ_CHECK(c.index + 1 == static_cast<int>(got.calls.size()), "delta for index {} while {} calls are open",
                   c.index, got.calls.size());
        FUZZ_CHECK(c.id.empty() && c.name.empty() && !c.arguments_fragment.empty(),
                   "later delta of index {} must carry only argument text (id {}, name {}, args {})", c.index,
                   show(c.id), show(c.name), show(c.arguments_fragment));
        got.calls.back().arguments += c.arguments_fragment;
      }
    }
  };
  for (std::string_view chunk : h.chunks()) add(p->push(chunk));
  add(p->finish());

  const std::string where = fmt::format("parser {} text {}", name, show(h.text));
  FUZZ_CHECK(got.content == full.content, "streamed content {} != parse_full content {}; {}", show(got.content),
             show(full.content), where);
  FUZZ_CHECK(got.calls.size() == full.calls.size(), "streamed {} calls, parse_full {}; {}", got.calls.size(),
             full.calls.size(), where);
  for (size_t i = 0; i < full.calls.size(); ++i) {
    FUZZ_CHECK(got.calls[i].id == full.calls[i].id, "call {} id {} vs {}; {}", i, got.calls[i].id, full.calls[i].id,
               where);
    FUZZ_CHECK(got.calls[i].name == full.calls[i].name, "call {} name {} vs {}; {}", i, show(got.calls[i].name),
               show(full.calls[i].name), where);
    FUZZ_CHECK(got.calls[i].arguments == full.calls[i].arguments,
               "call {}: streamed argument fragments concatenate to {}, parse_full gave {}; {}", i,
               show(got.calls[i].arguments), show(full.calls[i].arguments), where);
    FUZZ_CHECK(p->tools().contains(full.calls[i].name), "call {} names undeclared function {}; {}", i,
               show(full.calls[i].name), where);
  }
  const auto& streamed = p->streamed_calls();
  FUZZ_CHECK(streamed.size() == got.calls.size(), "streamed_calls() has {} calls, deltas {}; {}", streamed.size(),
             got.calls.size(), where);
  for (size_t i = 0; i < streamed.size(); ++i) {
    FUZZ_CHECK(streamed[i].arguments == got.calls[i].arguments, "streamed_calls()[{}].arguments {} vs deltas {}; {}",
               i, show(streamed[i].arguments), show(got.calls[i].arguments), where);
  }
  if (valid_utf8(h.text)) {
    for (size_t i = 0; i < full.calls.size(); ++i) {
      const std::string& args = full.calls[i].arguments;
      nlohmann::ordered_json j;
      try {
        j = nlohmann::ordered_json::parse(args);
      } catch (const nlohmann::json::exception& e) {
        throw CheckFailure(fmt::format("call {} arguments {} are not JSON ({}); {}", i, show(args), e.what(), where));
      }
      FUZZ_CHECK(j.is_object(), "call {} arguments {} are not a JSON object; {}", i, show(args), where);
    }
  }
}

// reasoning: streaming in the header's chunks == parse_full; never throws; thinking disabled passes through.
inline void check_reasoning(std::string_view data) {
  const ParserHeader h(data);
  static const char* const kNames[] = {"qwen3", "qwen3-thinking", "deepseek-r1", "qwen3"};
  const std::string name = kNames[h.flags & 3];
  const bool starts_in_reasoning = (h.flags & 4) != 0;
  const bool thinking_enabled = (h.flags & 8) == 0;
  const parsers::ReasoningResult full =
      parsers::ReasoningParser::create(name, starts_in_reasoning, thinking_enabled)->parse_full(h.text);
  auto p = parsers::ReasoningParser::create(name, starts_in_reasoning, thinking_enabled);
  parsers::ReasoningResult got;
  for (std::string_view chunk : h.chunks()) {
    const parsers::ReasoningResult r = p->push(chunk);
    got.reasoning += r.reasoning;
    got.content += r.content;
  }
  const parsers::ReasoningResult r = p->finish();
  got.reasoning += r.reasoning;
  got.content += r.content;
  const std::string where = fmt::format("parser {} starts_in_reasoning={} thinking_enabled={} text {}", name,
                                        starts_in_reasoning, thinking_enabled, show(h.text));
  FUZZ_CHECK(got.reasoning == full.reasoning, "streamed reasoning {} != parse_full reasoning {}; {}",
             show(got.reasoning), show(full.reasoning), where);
  FUZZ_CHECK(got.content == full.content, "streamed content {} != parse_full content {}; {}", show(got.content),
             show(full.content), where);
  FUZZ_CHECK(full.reasoning.size() + full.content.size() <= h.text.size(), "output longer than the input; {}",
             where);
  if (!thinking_enabled) {
    FUZZ_CHECK(full.reasoning.empty() && full.content == h.text, "thinking disabled must pass through; {}", where);
  }
}

}  // namespace moeserve::fuzz
