// Python string semantics for the template engine.
//
// Templates are rendered the way Python jinja2 renders them, so every string operation must behave like the
// Python str method of the same name: code-point indexing, Unicode whitespace, repr() quoting, float repr,
// json.dumps escaping. Strings are stored as UTF-8; invalid bytes decode to U+DC80..U+DCFF (Python's
// "surrogateescape") so that they survive a decode/encode round trip unchanged.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

namespace moeserve::tpl::py {

std::u32string decode(std::string_view s);
std::string encode(std::u32string_view s);
void append_utf8(std::string& out, char32_t c);
bool is_ascii(std::string_view s);
// len(s) in code points.
size_t length(std::string_view s);

bool is_space(char32_t c);      // str.isspace for one character
bool is_linebreak(char32_t c);  // a line boundary of str.splitlines
bool is_alpha(char32_t c);
bool is_digit(char32_t c);
bool is_alnum(char32_t c);
bool is_word(char32_t c);       // regex \w
bool is_printable(char32_t c);  // str.isprintable, approximated without the full Unicode database
bool is_upper_char(char32_t c);
bool is_lower_char(char32_t c);
char32_t to_upper(char32_t c);
char32_t to_lower(char32_t c);

std::string upper(std::string_view s);
std::string lower(std::string_view s);
std::string swapcase(std::string_view s);
std::string title(std::string_view s);       // str.title
std::string capitalize(std::string_view s);  // str.capitalize

// str.strip / lstrip / rstrip; chars == nullopt strips whitespace.
std::string strip(std::string_view s, const std::optional<std::string>& chars, bool left, bool right);
// str.split / str.rsplit; sep == nullopt splits on whitespace runs. maxsplit < 0 means no limit.
// An empty separator is the caller's error to report (Python raises ValueError).
std::vector<std::string> split(std::string_view s, const std::optional<std::string>& sep, int64_t maxsplit);
std::vector<std::string> rsplit(std::string_view s, const std::optional<std::string>& sep, int64_t maxsplit);
std::vector<std::string> splitlines(std::string_view s, bool keepends);
std::string replace(std::string_view s, std::string_view old, std::string_view repl, int64_t count);
// str.find in code points; -1 when absent.
int64_t find(std::string_view s, std::string_view sub, bool reverse);
int64_t count(std::string_view s, std::string_view sub);
// str.center / ljust / rjust with a one-character fill.
std::string pad(std::string_view s, int64_t width, char32_t fill, char align);

// repr(str): quotes and escapes exactly like CPython.
std::string repr(std::string_view s);
// repr(float): shortest round-trip digits, Python's choice of fixed or scientific notation.
std::string float_repr(double v);
// json.dumps(str, ensure_ascii=...): quoted and escaped.
std::string json_quote(std::string_view s, bool ensure_ascii);

}  // namespace moeserve::tpl::py
