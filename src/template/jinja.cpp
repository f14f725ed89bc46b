#include "template/jinja.h"

#include "template/ast.h"
#include "template/interp.h"
#include "template/parser.h"

namespace moeserve::tpl {

struct Program {
  Body body;
};

Template Template::parse(const std::string& source) {
  auto p = std::make_shared<Program>();
  p->body = parse_template(source);
  Template t;
  t.program_ = std::move(p);
  return t;
}

std::string Template::render(const nlohmann::ordered_json& context, const RenderOptions& opts) const {
  MS_CHECK(program_ != nullptr, "render() on a default-constructed Template");
  if (!context.is_object() && !context.is_null())
    throw UserError("chat template context must be a JSON object");
  Interp in(opts.now);
  try {
    return in.render(program_->body, Value::from_json(context));
  } catch (const EvalError& e) {
    throw UserError(fmt::format("chat template error at line {}: {}", in.line(), e.what()));
  } catch (const UserError&) {
    throw;
  } catch (const std::bad_alloc&) {
    throw;
  } catch (const std::exception& e) {  // a library error on template-controlled input is still the template's
    throw UserError(fmt::format("chat template error at line {}: {}", in.line(), e.what()));
  }
}

}  // namespace moeserve::tpl
