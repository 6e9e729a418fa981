// The Jinja corpus, part 1: whitespace handling, how each kind of value prints, operators,
// statements and syntax errors. Each case is one small template with fixed variables,
// rendered by sluice and by @huggingface/jinja under node (jinja_reference.h) and compared
// byte for byte; where the reference throws, sluice must throw in the same phase.
#include <gtest/gtest.h>

#include "tests/format/jinja_reference.h"

using sluice::test::expect_cases_match_reference;
using sluice::test::JinjaCase;

namespace {

TEST(JinjaCorpus, Whitespace) {
  const std::vector<JinjaCase> cases = {
      {"text only, final newline dropped", "Hello\nWorld\n"},
      {"only one final newline dropped", "a\n\n"},
      {"trim_blocks after a block tag", "{% if true %}\nyes\n{% endif %}\nafter"},
      {"lstrip_blocks before a block tag", "  {% if true %}\n  yes\n  {% endif %}\nend"},
      {"lstrip with tabs", "\t \t{% set x = 1 %}\n{{ x }}"},
      {"no lstrip after text on the line", "a {% if true %}x{% endif %}"},
      {"expressions keep their newline", "{{ 'a' }}\n{{ 'b' }}\n"},
      {"minus on both sides of blocks", "a   {%- if true -%}   b   {%- endif -%}   c"},
      {"minus on expressions", "a \n {{- 'x' -}} \n b"},
      {"minus strips newlines and unicode spaces", "a\u00a0\u3000\n{{- 'b' -}}\u2003\n c"},
      {"comments", "a {# comment #} b|a {#- c -#} b|a\n{# c #}\nb"},
      {"comment at a line start", "  {#- c #}\n  x"},
      {"comment with a minus inside", "a {# x - #} b"},
      {"CRLF lines keep their CR", "{% if true %}\r\nA\r\n{% endif %}\r\nB"},
      {"lstrip after a U+2028 line break", "a\u2028  {% if true %}b{% endif %}"},
      {"trim_blocks applies to -} in plain text", "x -}\ny 100%}\nz #}\nw }}\nv"},
      {"lstrip applies to {- in plain text", "a\n   {-b"},
      {"generation tags removed", "{% generation %}abc{% endgeneration %}"},
      {"generation tags keep the whitespace around", "x  {% generation %}  y  {% endgeneration %}  z"},
      {"generation tags with minus", "x  {%- generation -%}  y  {%- endgeneration %}  z"},
      {"typical chat layout", "{%- for m in ['a', 'b'] %}\n    {{- m + '\\n' }}\n{%- endfor %}\n"},
      {"set lines vanish", "{% set x = 1 %}\n{% set y = 2 %}\n{{ x + y }}\n"},
      {"minus after text strips the whole run", "line1\n   \n  {{- 'x' }}"},
      {"raw newlines inside a string literal", "{{ 'a\nb' }}"},
  };
  expect_cases_match_reference(cases);
}

TEST(JinjaCorpus, Printing) {
  const std::vector<JinjaCase> cases = {
      {"integers and floats", "{{ 42 }}|{{ -7 }}|{{ 1.5 }}|{{ 2.0 }}|{{ -0.0 }}|{{ 0.0 }}|{{ 007 }}"},
      {"division and remainder", "{{ 10 / 4 }}|{{ 10 / 5 }}|{{ 7 // 2 }}|{{ -7 // 2 }}|{{ 7 % 3 }}|{{ -7 % 3 }}|{{ 7.5 // 2 }}|{{ 7.5 % 2 }}"},
      {"powers", "{{ 2 ** 10 }}|{{ 2 ** -1 }}|{{ 2 ** 0.5 }}|{{ 2.0 ** 2 }}|{{ true ** 2 }}"},
      {"large and small numbers",
       "{{ 2 ** 60 }}|{{ 2 ** 70 }}|{{ 1 / 3 }}|{{ 0.1 + 0.2 }}|{{ 1000000.0 * 1000000.0 * 1000000000.0 }}|"
       "{{ 100000000000000000000.0 }}|{{ 0.000001 }}|{{ 0.0000001 }}|{{ 123456789012345678901234567890 }}"},
      {"numbers from JSON", "{{ a }}|{{ b }}|{{ c }}|{{ d }}|{{ a is integer }}|{{ e }}",
       R"({"a": 1.0, "b": 2.5, "c": 12345678901234567890, "d": -0.0, "e": 1e300})"},
      {"infinities and NaN", "{{ 1 / 0 }}|{{ -1 / 0 }}|{{ 0 / 0 }}|{{ 5 // 0 }}|{{ 5 % 0 }}|{{ [1 / 0] }}"},
      {"booleans and none", "{{ true }}|{{ false }}|{{ none }}|{{ True }}|{{ False }}|{{ None }}|[{{ undefined_var }}]"},
      {"lists and dicts", "{{ [1, 2.0, 'a', true, none] }}|{{ {'a': 1, 'b': [1, {'c': none}]} }}|{{ [] }}|{{ {} }}"},
      {"undefined inside a list", "{{ [1, nothing] }}|{{ {'k': nothing} }}"},
      {"string escapes", R"({{ 'It\'s' }}|{{ "a\"b" }}|{{ 'tab\there' }}|{{ '\x41\u00e9' }}|{{ 'back\\slash' }}|{{ '\u2028' }})"},
      {"adjacent string literals", R"({{ 'a' 'b' "c" }})"},
      {"JSON escaping in printed dicts", R"({{ {'q': 'a"b\\c\n', 'ctl': '\x01\b\f\r\t'} }})"},
      {"unicode in printed lists", R"({{ ['é', '😀', '\u007f'] }})"},
      {"a namespace prints as JSON", "{% set ns = namespace(a=1, b='x') %}{{ ns }}"},
      {"the loop variable prints", "{% for x in [1, 2] %}{{ loop }}\n{% endfor %}"},
      {"variables from JSON print", "{{ msg }}|{{ msg.content }}|{{ items }}", R"({"msg": {"role": "user", "content": "hi"}, "items": [1, [2, 3], {"a": null}]})"},
      {"object keys that are array indexes come first", "{{ o }}|{% for k in o %}{{ k }},{% endfor %}",
       R"({"o": {"b": 1, "2": 2, "a": 3, "1": 4, "01": 5, "-1": 6}})"},
      {"a tuple cannot print", "{{ (1, 2) }}"},
      {"nested tuple cannot print", "{{ [(1, 2)] }}"},
  };
  expect_cases_match_reference(cases);
}

TEST(JinjaCorpus, Operators) {
  const std::vector<JinjaCase> cases = {
      {"arithmetic precedence", "{{ 1 + 2 * 3 }}|{{ (1 + 2) * 3 }}|{{ 2 ** 3 ** 2 }}|{{ -2 ** 2 }}|{{ 10 - 2 - 3 }}|{{ 1 - -1 }}|{{ 2*3 }}|{{ 1-1 }}"},
      {"concatenation", "{{ 'a' + 'b' }}|{{ 'a' ~ 1 ~ 2.0 ~ true }}|{{ 'n' + 1 }}|{{ 1 + 'n' }}|{{ 'x' + 1.0 }}|{{ 'l' + [1, 'a'] }}|{{ 'd' ~ {'a': 1} }}|{{ [1] ~ [2] }}"},
      {"comparisons", "{{ 1 < 2 }}|{{ 2 <= 2 }}|{{ 3 > 4 }}|{{ 1 >= 1.0 }}|{{ 1 == 1.0 }}|{{ 1 != 2 }}|{{ 'a' == 'a' }}|{{ 'a' != 'b' }}"},
      {"loose equality",
       "{{ 1 == true }}|{{ '1' == 1 }}|{{ '' == 0 }}|{{ none == nothing }}|{{ none == false }}|{{ ['a'] == 'a' }}|"
       "{{ [1, 2] == '1,2' }}|{{ [] == false }}|{{ [1] == [1] }}|{{ x == x }}|{{ ' 2 ' == 2 }}|{{ '0x10' == 16 }}|{{ {} == '[object Map]' }}",
       R"({"x": [1]})"},
      {"string comparison is refused", "{{ 'a' < 'b' }}"},
      {"chained comparison is refused", "{{ 1 < 2 < 3 }}"},
      {"and / or return operands", "{{ 0 or 'b' }}|{{ 'a' and 'b' }}|{{ [] or {} }}|{{ none and 1 }}|{{ not 0 }}|{{ not not 'x' }}|{{ 1 and 0 or 2 }}|{{ nothing or 'u' }}"},
      {"membership",
       "{{ 'a' in 'cat' }}|{{ 'z' not in 'cat' }}|{{ 2 in [1, 2] }}|{{ '2' in [1, 2] }}|{{ 'k' in {'k': 1} }}|{{ 'v' in {'k': 'v'} }}|"
       "{{ 1 in nothing }}|{{ 1 not in nothing }}|{{ 2.0 in [1, 2] }}|{{ 'a' in ('a', 'b') }}"},
      {"membership of none is refused", "{{ none in [none] }}"},
      {"membership in a string needs a string", "{{ 1 in 'abc' }}"},
      {"membership of a list in a list is refused", "{{ [1] in [[1]] }}"},
      {"list concatenation", "{{ [1] + [2, 3] }}|{{ (1, 2) + [3] }}"},
      {"booleans as numbers", "{{ -true }}|{{ +false }}|{{ true ** 2 }}"},
      {"boolean addition is refused", "{{ true + 1 }}"},
      {"undefined arithmetic is refused", "{{ missing + 1 }}"},
      {"none arithmetic is refused", "{{ none + 1 }}"},
      {"undefined concatenation is refused", "{{ 'a' ~ missing }}"},
      {"zero to a negative power is refused", "{{ 0 ** -1 }}"},
      {"complex powers are refused", "{{ (-8) ** 0.5 }}"},
      {"overflowing powers are refused", "{{ 10 ** 400 }}"},
      {"filters and tests bind tighter", "{{ -3 | abs }}|{{ 4 * 4 is even }}|{{ 'ab' ~ 'c' | upper }}|{{ 2 + 3 | string }}"},
      {"ternaries", "{{ 'y' if 1 else 'n' }}|{{ 'y' if 0 else 'n' }}|[{{ 'y' if 0 }}]|{{ 'a' if false else 'b' if true else 'c' }}"},
      {"not binds looser than comparison", "{{ not 1 == 2 }}|{{ not 'a' in 'b' }}|{{ not 'a' in 'a' }}"},
      {"unary minus on a variable", "{{ -x }}|{{ - x }}|{{ -(x) }}|{{ x - -x }}", R"({"x": 3})"},
      {"string repetition is refused", "{{ 'a' * 3 }}"},
      {"unary minus on a string is refused", "{{ -'a' }}"},
  };
  expect_cases_match_reference(cases);
}

TEST(JinjaCorpus, Statements) {
  const std::vector<JinjaCase> cases = {
      {"if / elif / else", "{% for x in [1, 2, 3, 4] %}{% if x == 1 %}one{% elif x == 2 %}two{% elif x == 3 %}three{% else %}other{% endif %},{% endfor %}"},
      {"nested if", "{% if a %}{% if b %}ab{% else %}a{% endif %}{% endif %}", R"({"a": true, "b": false})"},
      {"for with else", "{% for x in [] %}x{% else %}empty{% endfor %}|{% for x in [1] %}{{ x }}{% else %}empty{% endfor %}"},
      {"for over a dict's keys", "{% for k in {'b': 1, 'a': 2} %}{{ k }}{% endfor %}|{% for k, v in {'b': 1, 'a': 2}.items() %}{{ k }}={{ v }};{% endfor %}"},
      {"for with a condition", "{% for x in [1, 2, 3, 4, 5] if x is odd %}{{ x }}:{{ loop.index }}/{{ loop.length }};{% endfor %}"},
      {"loop variables",
       "{% for x in ['a', 'b', 'c'] %}{{ loop.index }}{{ loop.index0 }}{{ loop.revindex }}{{ loop.revindex0 }}{{ loop.first }}"
       "{{ loop.last }}{{ loop.length }}{{ loop.previtem }}{{ loop.nextitem }}|{% endfor %}"},
      {"nested loops", "{% for a in [1, 2] %}{% for b in [3, 4] %}{{ loop.index }}{% endfor %}{{ loop.index }};{% endfor %}"},
      {"tuple unpacking", "{% for a, b in [[1, 2], [3, 4]] %}{{ a }}{{ b }};{% endfor %}|{% for (a, b) in [[5, 6]] %}{{ a }}{{ b }}{% endfor %}"},
      {"unpacking the wrong length", "{% for a, b in [[1, 2, 3]] %}{% endfor %}"},
      {"unpacking a tuple is refused", "{% for a, b in [(1, 2)] %}{{ a }}{% endfor %}"},
      {"looping over a string is refused", "{% for c in 'abc' %}{{ c }}{% endfor %}"},
      {"looping over undefined is refused", "{% for c in nothing %}{{ c }}{% endfor %}"},
      {"break", "{% for x in range(10) %}{% if x == 3 %}{% break %}{% endif %}{{ x }}{% endfor %}"},
      {"continue", "{% for x in range(5) %}{% if x is even %}{% continue %}{% endif %}{{ x }}{% endfor %}"},
      {"break drops the pass's output", "{% for x in [1, 2] %}a{{ x }}{% if x == 2 %}{% break %}{% endif %}{% endfor %}"},
      {"break in the first pass runs the else block", "{% for x in [1] %}{% break %}{% else %}else{% endfor %}"},
      {"continue in every pass runs the else block", "{% for x in [1, 2] %}{% continue %}{% else %}E{% endfor %}"},
      {"break outside a loop", "{% break %}"},
      {"break from a macro breaks the caller's loop", "{% macro m() %}{% break %}{% endmacro %}{% for x in [1, 2] %}{{ x }}{{ m() }}{% endfor %}after"},
      {"set", "{% set x = 1 %}{% set y = x + 1 %}{{ x }}{{ y }}"},
      {"set several names", "{% set a, b = 1, 2 %}{{ a }}{{ b }}|{% set c, d = [3, 4] %}{{ c }}{{ d }}"},
      {"set with too few values", "{% set a, b = [1] %}"},
      {"set block", "{% set block %}Hello {{ 'World' }}{% endset %}[{{ block }}]"},
      {"set block with minus", "{%- set x -%}\n  a\n{%- endset -%}\n[{{ x }}]"},
      {"loop scope", "{% set x = 1 %}{% for i in [1] %}{% set x = 2 %}{{ x }}{% endfor %}{{ x }}"},
      {"if does not scope", "{% if true %}{% set x = 5 %}{% endif %}{{ x }}"},
      {"loop variables persist across passes", "{% for i in [1, 2] %}{% if i == 2 %}{{ seen }}{% endif %}{% set seen = i %}{% endfor %}"},
      {"namespace counts across a loop", "{% set ns = namespace(count=0) %}{% for i in range(3) %}{% set ns.count = ns.count + 1 %}{% endfor %}{{ ns.count }}"},
      {"namespace from a dict and pairs", "{% set ns = namespace({'a': 1}, b=2) %}{{ ns.a }}{{ ns.b }}|{% set n2 = namespace([['k', 'v'], 'xy']) %}{{ n2.k }}{{ n2.x }}"},
      {"namespace attribute order", "{% set ns = namespace(b=1, a=2) %}{% set ns.c = 3 %}{% set ns.b = 4 %}{{ ns }}"},
      {"namespace missing attribute", "{% set ns = namespace() %}{{ ns.missing is defined }}"},
      {"set on a dict is refused", "{% set d = {} %}{% set d.x = 1 %}"},
      {"namespace takes one positional argument", "{{ namespace({}, {}) }}"},
      {"the name namespace can be shadowed", "{% set namespace = 1 %}{{ namespace }}{% for i in [1] %}{{ namespace is callable }}{% endfor %}"},
      {"filter block", "{% filter upper %}hello {{ 'world' }}{% endfilter %}|{% filter replace('a', 'o') %}banana{% endfilter %}"},
      {"comments inside blocks", "{% if true %}{# hidden #}shown{% endif %}"},
      {"set of a loop's output", "{% set out %}{% for i in range(3) %}{{ i }}{% endfor %}{% endset %}{{ out|length }}{{ out }}"},
  };
  expect_cases_match_reference(cases);
}

TEST(JinjaCorpus, SyntaxErrors) {
  const std::vector<JinjaCase> cases = {
      {"unknown statement", "{% foo %}"},
      {"unclosed if", "{% if true %}x"},
      {"unclosed for", "{% for x in y %}x"},
      {"endif without if", "{% endif %}"},
      {"stray else", "a{% else %}b"},
      {"unclosed set block", "{% set x %}abc"},
      {"missing }}", "{{ x "},
      {"missing %}", "{% if x "},
      {"unterminated string", "{{ 'abc }}"},
      {"unterminated comment", "{# abc"},
      {"unexpected character", "{{ x ! y }}"},
      {"unexpected @", "{{ @ }}"},
      {"bad escape", R"({{ '\q' }})"},
      {"bad hex escape", R"({{ '\xZZ' }})"},
      {"non-ASCII name", "{{ é }}"},
      {"exponent notation", "{{ 1e3 }}"},
      {"empty expression", "{{ }}"},
      {"trailing comma in a tuple", "{{ (1,) }}"},
      {"empty subscript", "{{ [1, 2][] }}"},
      {"positional after keyword", "{{ f(a=1, 2) }}"},
      {"parameter without default after one with", "{% macro m(a=1, b) %}{% endmacro %}"},
      {"duplicate parameter", "{% macro m(a, a) %}{% endmacro %}"},
      {"four-part slice", "{{ x[1:2:3:4] }}"},
      {"filter name must be a name", "{{ x | 'upper' }}"},
      {"test name must be a name", "{{ x is 'none' }}"},
      {"test with arguments", "{{ 6 is divisibleby(3) }}"},
      {"dot then a string", "{{ x.'a' }}"},
      {"loop variable must be a name", "{% for 1 in x %}{% endfor %}"},
      {"for without in", "{% for x on y %}{% endfor %}"},
      {"{%+ is not supported", "{%+ if true %}x{% endif %}"},
      {"unpacking in parameters", "{% macro m(*a) %}{% endmacro %}"},
      {"keyword unpacking must be last", "{{ f(**a, b) }}"},
      {"missing commas are accepted", "{{ [1 2 3] }}|{{ {'a': 1 'b': 2} }}|{{ [10, 20][1 0] }}"},
      {"a sign at the start of text", "{%- if true %}-x{% endif %}"},
      {"dot index", "{{ x.0 }}{{ x.-1 }}", R"({"x": [7, 8]})"},
      {"call block needs a name", "{% call 1() %}{% endcall %}"},
      {"not a statement name", "{% 1 %}"},
      {"unclosed list", "{{ [1, 2 }}"},
      {"unclosed dict", "{{ {'a': 1 }}"},
      {"dict without colon", "{{ {'a' 1} }}"},
      {"end of input inside a tag", "{% if x"},
      {"nested object literals and }}", "{{ {'a': {'b': 1}} }}"},
  };
  expect_cases_match_reference(cases);
}

TEST(JinjaCorpus, Edges) {
  const std::vector<JinjaCase> cases = {
      {"minus after a comment keeps the text token rule", "a {# c #}  {{- 'x' }}|b\n{#- c -#}\n  y"},
      {"lstrip with a minus block", "  {%- if true %}\n  x\n  {%- endif %}\n"},
      {"nested dict in a set", "{% set x = {'a': {'b': 1}} %}{{ x.a.b }}{{ x }}"},
      {"tags inside comments and strings", "{# {{ x }} {% if %} #}{{ '{{ x }}' }}{{ \"{% y %}\" }}"},
      {"raw is not supported", "{% raw %}{{ x }}{% endraw %}"},
      {"a comment inside an expression", "{{ 1 {# c #} }}"},
      {"expressions over several lines", "{{\n  'a'\n  ~\n  'b'\n}}"},
      {"loop.cycle is not there", "{% for x in [1] %}{{ loop.cycle('a', 'b') }}{% endfor %}"},
      {"filters on call results", "{{ range(3)|list|length }}|{{ 'a,b'.split(',')[1] }}|{{ 'A'.lower()|upper }}"},
      {"a member of a filter call is refused", "{{ 'x'|replace('x', 'y').upper }}"},
      {"mixed arithmetic gives floats", "{{ 1 + 1.0 }}|{{ 1.5 + 1.5 }}|{{ 2 * 1.5 }}|{{ 3 - 1.0 }}|{{ 4 / 2 }}|{{ 2 ** 2.0 }}|{{ 9 // 2.0 }}"},
      {"a namespace changed inside a macro", "{% set ns = namespace(x=1) %}{% macro m() %}{% set ns.x = 2 %}{% endmacro %}{{ m() }}{{ ns.x }}"},
      {"set of a filtered length", "{% set n = msgs|length %}{{ n }}{% set last = msgs[-1] %}{{ last.role }}", R"({"msgs": [{"role": "a"}, {"role": "b"}]})"},
      {"ternary with filters", "{{ x|default('a') if y else 'b' }}|{{ 'c' if not y else x|upper }}", R"({"x": "q", "y": false})"},
      {"loop over keyword arguments", "{% macro m() %}{% for k in kwargs %}{{ k }}={{ kwargs[k] }};{% endfor %}{% endmacro %}{{ m(b=1, a=2) }}"},
      {"caller with defaults", "{% macro m() %}{{ caller(1) }}|{{ caller(1, 5) }}{% endmacro %}{% call(a, b=2) m() %}{{ a }}{{ b }}{% endcall %}"},
      {"unicode case", "{{ 'Ωμέγα'|upper }}|{{ 'ЖУК'|lower }}|{{ 'İ'|lower|length }}|{{ 'ﬁ'|upper }}|{{ 'ǅ'|lower }}"},
      {"title after non-ASCII", "{{ 'éa bé_c'|title }}|{{ 'élan'.capitalize() }}"},
      {"whitespace-only text between tags", "{% if true %} {% endif %}|{% if true %}\n\n{% endif %}|"},
      {"deeply indented template", "{%- for i in range(2) %}\n        {%- for j in range(2) %}\n                {{- i ~ j }}\n        {%- endfor %}\n{%- endfor %}"},
      {"strings with escaped quotes across tags", R"({{ "it's" }}{{ 'say "hi"' }}{{ '\\' }})"},
      {"keys that look like numbers in a literal keep their order", "{{ {'b': 1, '2': 2, '1': 3} }}"},
      {"membership of a namespace key is refused", "{% set ns = namespace(a=1) %}{{ 'a' in ns }}"},
      {"is defined on loop attributes", "{% for x in [1] %}{{ loop.previtem is defined }}{{ loop.nextitem is defined }}{{ loop.depth is defined }}{% endfor %}"},
  };
  expect_cases_match_reference(cases);
}

}  // namespace
