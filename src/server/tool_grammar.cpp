#include "server/tool_grammar.h"

#include <algorithm>
#include <map>
#include <vector>

#include "core/error.h"
#include "core/log.h"
#include "grammar/json_grammar.h"
#include "grammar/regex_grammar.h"
#include "parsers/param_convert.h"

namespace moeserve::server {

using json = nlohmann::ordered_json;

namespace {

// The functions the call may name: the named one, or every tool.
std::vector<const json*> callable(const json& tools, const std::string& function) {
  std::vector<const json*> out;
  for (const json& t : tools) {
    const json& f = t["function"];
    if (function.empty() || f["name"].get<std::string>() == function) out.push_back(&f);
  }
  return out;
}

// A function's parameters schema, as an object schema (a missing or empty one: any object).
json parameters_of(const json& f) {
  if (f.contains("parameters") && f["parameters"].is_object() && !f["parameters"].empty()) return f["parameters"];
  return json{{"type", "object"}};
}

ToolCallGrammar hermes_grammar(const std::vector<const json*>& fns) {
  json alts = json::array();
  for (const json* f : fns)
    alts.push_back({{"type", "object"},
                    {"properties", {{"name", {{"const", (*f)["name"]}}}, {"arguments", parameters_of(*f)}}},
                    {"required", {"name", "arguments"}}});
  const json schema = alts.size() == 1 ? alts[0] : json{{"anyOf", alts}};
  ToolCallGrammar g;
  g.spec = std::make_shared<grammar::ConstraintSpec>();
  g.spec->schema = grammar::JsonSchema::compile(schema, /*ignore_unsupported=*/true);
  g.prefix = "<tool_call>\n";
  return g;
}

// The value regex of one qwen3_coder parameter by its declared type.
std::string coder_value_regex(const json& schema) {
  if (schema.is_object() && schema.contains("enum") && schema["enum"].is_array() && !schema["enum"].empty()) {
    std::string alts;
    for (const json& v : schema["enum"]) {
      if (!v.is_string()) return qwen3_coder_free_value_regex();  // (a mixed enum: its values' texts vary)
      alts += (alts.empty() ? "" : "|") + grammar::regex_escape(v.get<std::string>());
    }
    return "(" + alts + ")";
  }
  const std::vector<std::string> types = schema.is_object() ? parsers::schema_types(schema) : std::vector<std::string>{};
  if (types.size() == 1) {
    if (types[0] == "integer") return "-?[0-9]+";
    if (types[0] == "number") return "-?[0-9]+(\\.[0-9]+)?([eE][-+]?[0-9]+)?";
    if (types[0] == "boolean") return "(true|false)";
  }
  return qwen3_coder_free_value_regex();
}

std::string coder_parameter(const std::string& name_regex, const std::string& value_regex) {
  return "<parameter=" + name_regex + ">\\n" + value_regex + "\\n</parameter>\\n";
}

// A function's parameters in the schema's order, the required ones present; a schema without properties: any
// parameters, any number of times.
std::string coder_body(const json& f) {
  const json params = parameters_of(f);
  if (!params.contains("properties") || !params["properties"].is_object())
    return "(" + coder_parameter("[^<>\\n]+", qwen3_coder_free_value_regex()) + ")*";
  std::vector<std::string> required;
  if (params.contains("required") && params["required"].is_array())
    for (const json& r : params["required"])
      if (r.is_string()) required.push_back(r.get<std::string>());
  std::string body;
  for (const auto& [name, schema] : params["properties"].items()) {
    const std::string piece = coder_parameter(grammar::regex_escape(name), coder_value_regex(schema));
    const bool req = std::find(required.begin(), required.end(), name) != required.end();
    body += req ? piece : "(" + piece + ")?";
  }
  return body;
}

ToolCallGrammar coder_grammar(const std::vector<const json*>& fns, const std::string& function, bool parallel) {
  ToolCallGrammar g;
  g.spec = std::make_shared<grammar::ConstraintSpec>();
  if (!function.empty()) {
    g.prefix = "<tool_call>\n<function=" + function + ">\n";
    g.spec->regex = grammar::Regex::compile(coder_body(*fns[0]) + "</function>\\n</tool_call>");
    return g;
  }
  std::string call;  // a function's name (after the forced "<function="), its parameters, the call's end
  for (const json* f : fns)
    call += (call.empty() ? "(?:" : "|") + grammar::regex_escape((*f)["name"].get<std::string>()) + ">\\n" +
            coder_body(*f);
  call += ")</function>\\n</tool_call>";
  g.prefix = "<tool_call>\n<function=";
  // Parallel calls (OpenAI's parallel_tool_calls, on by default): more blocks after the first, as the template
  // writes them; where that pattern passes the regex's bounds, one call.
  if (parallel) {
    try {
      g.spec->regex = grammar::Regex::compile(call + "(?:\\n<tool_call>\\n<function=" + call + ")*");
      return g;
    } catch (const UserError&) {
    }
  }
  g.spec->regex = grammar::Regex::compile(call);
  return g;
}

}  // namespace

std::string qwen3_coder_free_value_regex() {
  // The markers have no '<' past their first byte, so a text holds none of them iff no piece of it after a '<' (up to
  // the next '<' or the end) starts with a marker's rest. Such a piece leaves every rest at some byte (one that
  // continues none of them, and is no '<') and then runs on without '<', or is a proper prefix of a rest.
  using Rests = std::vector<std::string>;
  auto by_byte = [](const Rests& rests) {
    std::map<char, Rests> m;
    for (const std::string& r : rests) m[r[0]].push_back(r.substr(1));
    return m;
  };
  auto completes = [](const Rests& after) { return std::find(after.begin(), after.end(), "") != after.end(); };
  auto leave = [&](auto&& self, const Rests& rests) -> std::string {
    std::string cls = "[^<", alts;
    for (const auto& [c, after] : by_byte(rests)) {
      cls += c;
      if (!completes(after)) alts += std::string("|") + c + "(" + self(self, after) + ")";
    }
    return cls + "]" + alts;
  };
  auto prefix = [&](auto&& self, const Rests& rests) -> std::string {
    std::string alts;
    for (const auto& [c, after] : by_byte(rests))
      if (!completes(after)) alts += (alts.empty() ? "" : "|") + std::string(1, c) + self(self, after);
    return alts.empty() ? "" : "(" + alts + ")?";
  };
  const Rests rests = {"/parameter>", "parameter=", "/function>"};
  return "[^<]*(<((" + leave(leave, rests) + ")[^<]*|" + prefix(prefix, rests) + "))*";
}

ToolCallGrammar tool_call_grammar(const std::string& parser, const json& tools, const std::string& function,
                                  bool parallel) {
  const bool hermes = parser == "hermes" || parser == "qwen25", coder = parser == "qwen3_coder";
  if (!hermes && !coder) return {};
  const std::vector<const json*> fns = callable(tools, function);
  if (fns.empty() || fns.size() > kMaxToolAlternatives) return {};
  try {
    return hermes ? hermes_grammar(fns) : coder_grammar(fns, function, parallel);
  } catch (const UserError& e) {  // past the grammar's bounds: the call is left to the model
    log_debug("tool_choice: no grammar for the tools' call ({}); the call is not constrained", e.what());
    return {};
  }
}

}  // namespace moeserve::server
