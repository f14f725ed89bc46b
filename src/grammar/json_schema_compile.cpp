// The JSON grammar's schema compiler (see json_grammar.h).
//
// Compilation turns the schema into a graph of SchemaNodes (indices into one vector; recursive $refs are edges
// back), then runs post-passes: $ref aliases resolved, anyOf alternatives flattened, enum values filtered by the
// rest of their schema, and the parts no finite value can satisfy pruned. The pruning is what makes the matcher
// exact: every prefix it accepts can still be completed (an optional property whose schema is `false` is never
// offered, a required one that recurses without end makes its object impossible, ...).
#include <algorithm>
#include <map>
#include <string>
#include <utility>

#include <nlohmann/json.hpp>

#include "core/error.h"
#include "core/json_int.h"
#include "grammar/json_grammar_internal.h"

namespace moeserve::grammar {

using json = nlohmann::ordered_json;
using namespace detail;

namespace {

constexpr std::string_view kKeywords[] = {
    "type", "properties", "required", "additionalProperties", "items", "minItems", "maxItems", "minLength",
    "maxLength", "pattern", "enum", "const", "anyOf", "oneOf", "allOf", "$ref", "$defs", "definitions"};
constexpr std::string_view kAnnotations[] = {
    "title", "description", "default", "examples", "$schema", "$id", "$comment", "format", "deprecated",
    "readOnly", "writeOnly", "contentMediaType", "contentEncoding", "discriminator", "strict"};
// The keywords that constrain a value of some type; without "type" they imply it (as xgrammar infers).
constexpr std::string_view kObjectKeywords[] = {"properties", "required", "additionalProperties"};
constexpr std::string_view kArrayKeywords[] = {"items", "minItems", "maxItems"};
constexpr std::string_view kStringKeywords[] = {"minLength", "maxLength", "pattern"};
constexpr std::string_view kTypes[] = {"object", "array", "string", "integer", "number", "boolean", "null"};

template <size_t N>
bool contains(const std::string_view (&set)[N], std::string_view s) {
  return std::find(std::begin(set), std::end(set), s) != std::end(set);
}
template <size_t N>
std::string join(const std::string_view (&set)[N]) {
  std::string out;
  for (std::string_view s : set) out += (out.empty() ? "" : ", ") + std::string(s);
  return out;
}
template <size_t N>
bool has_any(const json& s, const std::string_view (&set)[N]) {
  for (std::string_view k : set)
    if (s.contains(k)) return true;
  return false;
}

// A value as text for a message (never throws on invalid UTF-8).
std::string show(const json& v) { return v.dump(-1, ' ', false, json::error_handler_t::replace); }

// A JSON pointer segment: '~' and '/' escaped.
std::string pointer_segment(std::string_view name) {
  std::string out;
  for (char c : name) out += c == '~' ? std::string("~0") : c == '/' ? std::string("~1") : std::string(1, c);
  return out;
}

// The compact JSON text of a value: what an enum value or a property key must look like in the output.
std::string json_text(const json& v, const std::string& at) {
  try {
    return v.dump();
  } catch (const json::exception&) {
    throw_user("JSON schema: a string at {} is not valid UTF-8", at);
  }
}

// The nodes every schema starts with (detail::Builtin).
void add_builtins(std::vector<SchemaNode>& nodes) {
  nodes.resize(kBuiltins);
  nodes[kAny].kind = Kind::Any;
  nodes[kAnyObject].kind = Kind::Object;
  nodes[kAnyObject].free_form = true;
  nodes[kAnyObject].additional = kAny;
  nodes[kAnyObject].next_required = {0};
  nodes[kAnyArray].kind = Kind::Array;
  nodes[kAnyArray].items = kAny;
  nodes[kAnyString].kind = Kind::String;
  nodes[kAnyNumber].kind = Kind::Number;
  nodes[kAnyInteger].kind = Kind::Integer;
  nodes[kBool].kind = nodes[kNull].kind = nodes[kWords].kind = Kind::Literal;
  nodes[kBool].texts = {"false", "true"};
  nodes[kNull].texts = {"null"};
  nodes[kWords].texts = {"false", "null", "true"};
}

class Compiler {
 public:
  Compiler(const json& doc, bool ignore_unsupported)
      : doc_(doc), ignore_unsupported_(ignore_unsupported), impl_(std::make_unique<JsonSchema::Impl>()) {
    add_builtins(impl_->nodes);
  }

  std::unique_ptr<JsonSchema::Impl> run() {
    impl_->root = ref_node("#", doc_, "#");
    resolve_aliases();
    flatten_any_of();
    build_tables();
    filter_enums();
    prune();
    build_tables();
    return std::move(impl_);
  }

 private:
  std::vector<SchemaNode>& nodes() { return impl_->nodes; }
  uint32_t add(SchemaNode n) {
    MS_USER_CHECK(nodes().size() < size_t(kMaxSchemaNodes),
                  "JSON schema: more than {} subschemas; constrained decoding takes smaller schemas", kMaxSchemaNodes);
    nodes().push_back(std::move(n));
    return static_cast<uint32_t>(nodes().size() - 1);
  }

  uint32_t compile(const json& s, const std::string& at);
  uint32_t compile_ref(const json& ref, const std::string& at);
  uint32_t ref_node(const std::string& ref, const json& target, const std::string& target_at);
  uint32_t compile_typed(const json& s, const std::string& at);
  uint32_t compile_object(const json& s, const std::string& at);
  uint32_t compile_array(const json& s, const std::string& at);
  uint32_t compile_string(const json& s, const std::string& at);
  uint32_t count(const json& s, const char* key, const std::string& at, uint32_t absent);

  void resolve_aliases();
  void flatten_any_of();
  void build_tables();
  void filter_enums();
  void prune();

  // An enum / const whose values must also match the rest of their schema (filtered once the graph is whole).
  struct Enum {
    uint32_t literal, rest;
    std::vector<std::string> texts;
  };

  const json& doc_;
  const bool ignore_unsupported_;
  std::unique_ptr<JsonSchema::Impl> impl_;
  std::map<std::string, uint32_t> refs_;  // $ref text -> its Alias node: a recursive $ref ends at the map
  std::vector<Enum> enums_;
};

uint32_t Compiler::compile(const json& s, const std::string& at) {
  if (s.is_boolean()) {
    if (s.get<bool>()) return kAny;
    SchemaNode none;  // `false`: no value (a Literal without texts)
    none.kind = Kind::Literal;
    return add(std::move(none));
  }
  MS_USER_CHECK(s.is_object(), "JSON schema: the schema at {} is {}; expected an object or a boolean", at, show(s));
  for (const auto& [k, v] : s.items()) {
    MS_USER_CHECK(contains(kKeywords, k) || contains(kAnnotations, k) || ignore_unsupported_,
                  "JSON schema: keyword \"{}\" at {} is not supported; supported keywords: {} (allOf with one "
                  "schema; $ref to \"#\", \"#/$defs/NAME\" or \"#/definitions/NAME\"); ignored annotations: {}",
                  k, at, join(kKeywords), join(kAnnotations));
  }
  // Definitions are compiled when a $ref reaches them: unused ones are not checked.
  for (const char* defs : {"$defs", "definitions"})
    MS_USER_CHECK(!s.contains(defs) || s[defs].is_object(), "JSON schema: \"{}\" at {} must be an object", defs,
                  at);

  // At most one way of building the value: an intersection of two (say "anyOf" beside "type") is not supported.
  std::vector<std::string> ways;
  for (const char* k : {"$ref", "anyOf", "oneOf", "allOf"})
    if (s.contains(k)) ways.emplace_back(k);
  for (const char* k : {"type", "properties", "required", "additionalProperties", "items", "minItems", "maxItems",
                        "minLength", "maxLength", "pattern"}) {
    if (s.contains(k)) {
      ways.emplace_back(k);
      break;
    }
  }
  MS_USER_CHECK(ways.size() <= 1, "JSON schema: \"{}\" together with \"{}\" at {} is not supported; use one of them",
                ways[0], ways.size() > 1 ? ways[1] : "", at);

  uint32_t rest = kAny;
  if (s.contains("$ref")) {
    rest = compile_ref(s["$ref"], at + "/$ref");
  } else if (s.contains("anyOf") || s.contains("oneOf")) {
    // oneOf as anyOf: the alternatives of generated schemas rarely overlap, and exclusivity cannot be enforced
    // byte by byte.
    const char* k = s.contains("anyOf") ? "anyOf" : "oneOf";
    const json& list = s[k];
    MS_USER_CHECK(list.is_array() && !list.empty(), "JSON schema: \"{}\" at {} must be a non-empty array", k, at);
    SchemaNode n;
    n.kind = Kind::AnyOf;
    for (size_t i = 0; i < list.size(); ++i) n.alts.push_back(compile(list[i], fmt::format("{}/{}/{}", at, k, i)));
    rest = add(std::move(n));
  } else if (s.contains("allOf")) {
    const json& list = s["allOf"];
    MS_USER_CHECK(list.is_array() && list.size() == 1,
                  "JSON schema: \"allOf\" at {} must be an array of exactly one schema (an intersection of several "
                  "is not supported)", at);
    rest = compile(list[0], at + "/allOf/0");
  } else if (!ways.empty()) {
    rest = compile_typed(s, at);
  }

  if (!s.contains("enum") && !s.contains("const")) return rest;
  // enum / const: literals, keeping the values that also match the rest of the schema (e.g. its "type").
  std::vector<json> values;
  if (s.contains("enum")) {
    MS_USER_CHECK(s["enum"].is_array() && !s["enum"].empty(), "JSON schema: \"enum\" at {} must be a non-empty array",
                  at);
    values = s["enum"].get<std::vector<json>>();
  }
  if (s.contains("const")) {
    const bool in_enum = !s.contains("enum") || std::find(values.begin(), values.end(), s["const"]) != values.end();
    values.clear();
    if (in_enum) values.push_back(s["const"]);
  }
  SchemaNode lit;
  lit.kind = Kind::Literal;
  for (const json& v : values) lit.texts.push_back(json_text(v, at));
  std::sort(lit.texts.begin(), lit.texts.end());
  lit.texts.erase(std::unique(lit.texts.begin(), lit.texts.end()), lit.texts.end());
  std::vector<std::string> texts = lit.texts;
  const uint32_t id = add(std::move(lit));
  if (rest != kAny) enums_.push_back({id, rest, std::move(texts)});
  return id;
}

uint32_t Compiler::compile_ref(const json& ref, const std::string& at) {
  MS_USER_CHECK(ref.is_string(), "JSON schema: \"$ref\" at {} must be a string, not {}", at, show(ref));
  const std::string r = ref.get<std::string>();
  if (r == "#") return ref_node(r, doc_, "#");
  for (const char* defs : {"$defs", "definitions"}) {
    const std::string prefix = fmt::format("#/{}/", defs);
    if (r.compare(0, prefix.size(), prefix) != 0 || r.find('/', prefix.size()) != std::string::npos) continue;
    std::string name;  // the pointer segment unescaped (~1 is '/', ~0 is '~')
    for (size_t i = prefix.size(); i < r.size(); ++i) {
      if (r[i] == '~' && i + 1 < r.size() && (r[i + 1] == '0' || r[i + 1] == '1')) name += r[++i] == '0' ? '~' : '/';
      else name += r[i];
    }
    MS_USER_CHECK(doc_.is_object() && doc_.contains(defs) && doc_[defs].is_object() && doc_[defs].contains(name),
                  "JSON schema: \"$ref\": \"{}\" at {} points to no schema: the root has no {} entry \"{}\"", r, at,
                  defs, name);
    return ref_node(r, doc_[defs][name], r);
  }
  throw_user("JSON schema: \"$ref\": \"{}\" at {} is not supported; use \"#\", \"#/$defs/NAME\" or "
             "\"#/definitions/NAME\"", r, at);
}

uint32_t Compiler::ref_node(const std::string& ref, const json& target, const std::string& target_at) {
  if (auto it = refs_.find(ref); it != refs_.end()) return it->second;
  SchemaNode alias;
  alias.kind = Kind::Alias;
  alias.ref = ref;
  const uint32_t id = add(std::move(alias));
  refs_.emplace(ref, id);  // before compiling the target: a recursive $ref inside it ends here
  const uint32_t t = compile(target, target_at);
  nodes()[id].target = t;
  return id;
}

uint32_t Compiler::compile_typed(const json& s, const std::string& at) {
  std::vector<std::string> types;
  if (s.contains("type")) {
    const json& t = s["type"];
    const bool ok = t.is_string() || (t.is_array() && !t.empty() &&
                                      std::all_of(t.begin(), t.end(), [](const json& e) { return e.is_string(); }));
    MS_USER_CHECK(ok, "JSON schema: \"type\" at {} must be a type name or a non-empty array of them, not {}", at,
                  show(t));
    types = t.is_string() ? std::vector<std::string>{t.get<std::string>()} : t.get<std::vector<std::string>>();
    for (const std::string& name : types)
      MS_USER_CHECK(contains(kTypes, name), "JSON schema: \"type\" at {} is \"{}\"; expected one of: {}", at, name,
                    join(kTypes));
  } else {
    if (has_any(s, kObjectKeywords)) types.push_back("object");
    if (has_any(s, kArrayKeywords)) types.push_back("array");
    if (has_any(s, kStringKeywords)) types.push_back("string");
  }
  const bool number = std::find(types.begin(), types.end(), "number") != types.end();
  std::vector<uint32_t> alts;
  for (const std::string& t : types) {
    uint32_t id = kNone;
    if (t == "object") id = compile_object(s, at);
    else if (t == "array") id = compile_array(s, at);
    else if (t == "string") id = compile_string(s, at);
    else if (t == "integer") id = number ? kNone : kAnyInteger;  // integers are numbers
    else if (t == "number") id = kAnyNumber;
    else if (t == "boolean") id = kBool;
    else if (t == "null") id = kNull;
    if (id != kNone && std::find(alts.begin(), alts.end(), id) == alts.end()) alts.push_back(id);
  }
  if (alts.size() == 1) return alts[0];
  SchemaNode n;
  n.kind = Kind::AnyOf;
  n.alts = std::move(alts);
  return add(std::move(n));
}

uint32_t Compiler::count(const json& s, const char* key, const std::string& at, uint32_t absent) {
  if (!s.contains(key)) return absent;
  int64_t v = 0;
  MS_USER_CHECK(json_to_int64(s[key], v) == JsonInt::Ok && v >= 0,
                "JSON schema: \"{}\" at {} must be a non-negative integer, not {}", key, at, show(s[key]));
  return static_cast<uint32_t>(std::min<int64_t>(v, kUnbounded - 1));
}

uint32_t Compiler::compile_object(const json& s, const std::string& at) {
  SchemaNode n;
  n.kind = Kind::Object;
  if (s.contains("properties")) {
    const json& props = s["properties"];
    MS_USER_CHECK(props.is_object(), "JSON schema: \"properties\" at {} must be an object", at);
    // The properties in the order the schema lists them (an ordered_json keeps it), as xgrammar emits them.
    for (const auto& [name, sub] : props.items()) {
      const std::string where = at + "/properties/" + pointer_segment(name);
      const uint32_t node = compile(sub, where);
      n.props.push_back({json_text(json(name), where), node, false});
    }
  }
  if (s.contains("required")) {
    const json& req = s["required"];
    MS_USER_CHECK(req.is_array(), "JSON schema: \"required\" at {} must be an array of property names", at);
    for (const json& name : req) {
      MS_USER_CHECK(name.is_string(), "JSON schema: \"required\" at {} lists {}, not a property name", at, show(name));
      const std::string key = json_text(name, at);
      auto it = std::find_if(n.props.begin(), n.props.end(), [&](const Prop& p) { return p.key == key; });
      MS_USER_CHECK(it != n.props.end(),
                    "JSON schema: \"required\" at {} names {}, which is not in \"properties\" (only listed properties "
                    "can be required)", at, key);
      it->required = true;
    }
  }
  const json add_props = s.contains("additionalProperties") ? s["additionalProperties"] : json(true);
  MS_USER_CHECK(add_props.is_boolean() || add_props.is_object(),
                "JSON schema: \"additionalProperties\" at {} must be a boolean or a schema, not {}", at,
                show(add_props));
  // With "properties", no other key is accepted whatever additionalProperties says (strict mode, as xgrammar).
  if (!s.contains("properties") && add_props != json(false)) {
    n.free_form = true;
    n.additional = compile(add_props, at + "/additionalProperties");
  }
  return add(std::move(n));
}

uint32_t Compiler::compile_array(const json& s, const std::string& at) {
  SchemaNode n;
  n.kind = Kind::Array;
  n.items = kAny;
  if (s.contains("items")) {
    MS_USER_CHECK(!s["items"].is_array(),
                  "JSON schema: \"items\" at {} is an array (tuple validation), which is not supported; give one "
                  "schema for every item", at);
    n.items = compile(s["items"], at + "/items");
  }
  n.min_items = count(s, "minItems", at, 0);
  n.max_items = count(s, "maxItems", at, kUnbounded);
  MS_USER_CHECK(n.min_items <= n.max_items, "JSON schema: minItems {} exceeds maxItems {} at {}", n.min_items,
                n.max_items, at);
  return add(std::move(n));
}

uint32_t Compiler::compile_string(const json& s, const std::string& at) {
  SchemaNode n;
  n.kind = Kind::String;
  n.min_len = count(s, "minLength", at, 0);
  n.max_len = count(s, "maxLength", at, kUnbounded);
  MS_USER_CHECK(n.min_len <= n.max_len, "JSON schema: minLength {} exceeds maxLength {} at {}", n.min_len, n.max_len,
                at);
  // pattern: ECMAScript search semantics, as a whole match of the decoded value; else a known format's pattern
  // (an unknown format, or one that is not a string, stays an ignored annotation).
  std::string regex, what;
  if (s.contains("pattern")) {
    MS_USER_CHECK(s["pattern"].is_string(), "JSON schema: \"pattern\" at {} must be a string, not {}", at,
                  show(s["pattern"]));
    regex = pattern_as_whole_match(s["pattern"].get<std::string>());
    what = fmt::format("\"pattern\" {} at {}", show(s["pattern"]), at);
  } else if (s.contains("format") && s["format"].is_string()) {
    regex = std::string(format_pattern(s["format"].get<std::string>()));
    what = fmt::format("\"format\" {} at {}", show(s["format"]), at);
  }
  if (!regex.empty()) n.pattern = compile_string_pattern(regex, n.min_len, n.max_len, what);
  return add(std::move(n));
}

void Compiler::resolve_aliases() {
  auto resolve = [&](uint32_t& id) {
    const uint32_t start = id;
    for (size_t steps = 0; nodes()[id].kind == Kind::Alias; ++steps) {
      MS_USER_CHECK(steps <= nodes().size(), "JSON schema: \"$ref\": \"{}\" leads back to itself through $refs alone",
                    nodes()[start].ref);
      id = nodes()[id].target;
    }
  };
  for (SchemaNode& n : nodes()) {
    for (Prop& p : n.props) resolve(p.node);
    for (uint32_t& a : n.alts) resolve(a);
    if (n.additional != kNone) resolve(n.additional);
    if (n.items != kNone) resolve(n.items);
  }
  for (Enum& e : enums_) resolve(e.rest);
  resolve(impl_->root);
}

void Compiler::flatten_any_of() {
  // An anyOf's alternatives become the non-anyOf nodes reachable through nested anyOfs. A branch that leads back
  // to the anyOf adds no value (the least fixed point), which keeps the matcher's forking finite.
  std::vector<char> seen(nodes().size());
  std::vector<uint32_t> visited;
  for (SchemaNode& n : nodes()) {
    if (n.kind != Kind::AnyOf) continue;
    for (uint32_t id : visited) seen[id] = 0;
    visited.clear();
    std::vector<uint32_t> todo(n.alts.rbegin(), n.alts.rend()), flat;
    while (!todo.empty()) {
      const uint32_t id = todo.back();
      todo.pop_back();
      if (seen[id]) continue;
      seen[id] = 1;
      visited.push_back(id);
      if (nodes()[id].kind != Kind::AnyOf) flat.push_back(id);
      else todo.insert(todo.end(), nodes()[id].alts.rbegin(), nodes()[id].alts.rend());
    }
    for (uint32_t id : flat)
      if (nodes()[id].kind == Kind::Any) flat = {id};  // any value subsumes the other branches
    // (No location here: the tree is a graph by now; the count is what the client can act on.)
    MS_USER_CHECK(flat.size() <= size_t(kMaxAlternatives),
                  "JSON schema: an anyOf / oneOf / type list of {} alternatives (nested ones counted); constrained "
                  "decoding follows at most {}", flat.size(), kMaxAlternatives);
    n.alts = std::move(flat);
  }
}

void Compiler::build_tables() {
  for (SchemaNode& n : nodes()) {
    if (n.kind != Kind::Object) continue;
    const uint32_t size = static_cast<uint32_t>(n.props.size());
    n.keys_sorted.resize(size);
    for (uint32_t i = 0; i < size; ++i) n.keys_sorted[i] = i;
    std::sort(n.keys_sorted.begin(), n.keys_sorted.end(),
              [&](uint32_t x, uint32_t y) { return n.props[x].key < n.props[y].key; });
    n.next_required.assign(size + 1, size);
    for (uint32_t i = size; i-- > 0;) n.next_required[i] = n.props[i].required ? i : n.next_required[i + 1];
  }
}

void Compiler::filter_enums() {
  // Each pass keeps the values that match the current graph; literals nested in the rest of an enum's schema may
  // shrink in the same pass, so repeat until nothing changes (values only ever go, so this ends).
  for (bool changed = true; changed;) {
    changed = false;
    for (const Enum& e : enums_) {
      if (nodes()[e.rest].kind == Kind::Any) continue;
      std::vector<std::string> keep;
      for (const std::string& t : e.texts)
        if (matches(nodes(), e.rest, t)) keep.push_back(t);
      if (keep != nodes()[e.literal].texts) {
        nodes()[e.literal].texts = std::move(keep);
        changed = true;
      }
    }
  }
}

void Compiler::prune() {
  // Productive: some finite value matches. The least fixed point, so that required recursion without end
  // ({"properties": {"next": {"$ref": "#"}}, "required": ["next"]}) is unproductive.
  std::vector<SchemaNode>& ns = nodes();
  std::vector<char> ok(ns.size(), 0);
  auto productive = [&](const SchemaNode& n) {
    switch (n.kind) {
      case Kind::String: return !n.pattern || n.pattern->viable(Regex::start(), 0);
      case Kind::Any:
      case Kind::Integer:
      case Kind::Number: return true;
      case Kind::Literal: return !n.texts.empty();
      case Kind::Array: return n.min_items == 0 || ok[n.items];
      case Kind::Object:
        return n.free_form || std::all_of(n.props.begin(), n.props.end(),
                                          [&](const Prop& p) { return !p.required || ok[p.node]; });
      case Kind::AnyOf: return std::any_of(n.alts.begin(), n.alts.end(), [&](uint32_t a) { return bool(ok[a]); });
      case Kind::Alias: return false;  // resolved away: no longer reachable
    }
    return false;
  };
  for (bool changed = true; changed;) {
    changed = false;
    for (size_t i = 0; i < ns.size(); ++i) {
      if (!ok[i] && productive(ns[i])) ok[i] = changed = true;
    }
  }
  MS_USER_CHECK(ok[impl_->root],
                "JSON schema: no JSON value satisfies the schema (an enum / const with no value of the allowed type, a "
                "false schema, a pattern that no string within minLength / maxLength matches, minItems of "
                "impossible items, or required properties that recurse without end)");
  // Remove what cannot be completed, so that the matcher never starts it: anyOf branches, optional properties,
  // keys of a free-form object whose values are impossible, items that are impossible.
  for (SchemaNode& n : ns) {
    std::erase_if(n.alts, [&](uint32_t a) { return !ok[a]; });
    std::erase_if(n.props, [&](const Prop& p) { return !p.required && !ok[p.node]; });
    if (n.free_form && !ok[n.additional]) n.free_form = false;
    if (n.kind == Kind::Array && !ok[n.items]) n.max_items = 0;
  }
}

}  // namespace

// ---------------------------------------------------------------------------------------------------------------
// Public API.

std::shared_ptr<const JsonSchema> JsonSchema::compile(const nlohmann::ordered_json& schema, bool ignore_unsupported) {
  Compiler c(schema, ignore_unsupported);
  std::unique_ptr<Impl> impl = c.run();
  return std::shared_ptr<const JsonSchema>(new JsonSchema(std::move(impl)));
}

std::shared_ptr<const JsonSchema> JsonSchema::any_object() {
  auto impl = std::make_unique<Impl>();
  add_builtins(impl->nodes);
  impl->root = kAnyObject;
  return std::shared_ptr<const JsonSchema>(new JsonSchema(std::move(impl)));
}

JsonSchema::JsonSchema(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}
JsonSchema::~JsonSchema() = default;

}  // namespace moeserve::grammar
