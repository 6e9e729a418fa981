// The Jinja corpus, part 2: attribute access and slicing, filters, tests, methods of strings
// and dicts, globals, macros and call blocks. Compared with @huggingface/jinja under node as
// in part 1 (jinja_reference.h).
#include <gtest/gtest.h>
#include <gtest/gtest-spi.h>

#include "tests/format/jinja_reference.h"

using sluice::test::expect_cases_match_reference;
using sluice::test::JinjaCase;

namespace {

const char* const kData = R"({
  "d": {"a": 1, "b": "two"},
  "l": [1, 2, 3, 4, 5],
  "s": "héllo😀",
  "people": [{"name": "Ann", "age": 31, "meta": {"rank": 2}, "tags": ["x", "y"]},
             {"name": "bob", "age": 25, "meta": {"rank": 3}, "tags": []},
             {"name": "Cy", "age": 40, "meta": {"rank": 1}, "tags": ["z"]}],
  "msgs": [{"role": "system", "content": "S"}, {"role": "user", "content": "U1"},
           {"role": "assistant", "content": "A1", "tool_calls": [{"name": "f"}]},
           {"role": "user", "content": "U2"}, {"role": "assistant", "content": "A2", "tool_calls": []}]
})";

TEST(JinjaCorpus, MembersAndSlices) {
  const std::vector<JinjaCase> cases = {
      {"attributes and indexes",
       "{{ d.a }}|{{ d['b'] }}|{{ d.missing }}|{{ d.missing is defined }}|{{ l[0] }}|{{ l[-1] }}|{{ l[5] is defined }}|"
       "{{ l.0 }}|{{ s[1] }}|{{ s[-3] }}|{{ s.length }}|{{ l.length }}|{{ s[20] is defined }}",
       kData},
      {"list slices",
       "{{ l[1:] }}|{{ l[:2] }}|{{ l[::-1] }}|{{ l[::2] }}|{{ l[-2:] }}|{{ l[1:-1] }}|{{ l[5:] }}|{{ l[::-2] }}|{{ l[3:0:-1] }}|"
       "{{ l[2:-1:-1] }}|{{ l[0:3:0] }}|{{ l[-10:10] }}|{{ l[:] }}|{{ l[1::2] }}",
       kData},
      {"string slices by code point", "{{ s[1:3] }}|{{ s[::-1] }}|{{ s[-3:] }}|{{ 'abc'[5:] }}", kData},
      {"reversed messages", "{% for m in msgs[::-1] %}{{ m.role[0] }}{% endfor %}", kData},
      {"undefined attribute chains", "{{ missing.a.b is defined }}|{{ none.x is defined }}|{{ (5).x is defined }}|{{ true.x is defined }}"},
      {"indexing undefined is refused", "{{ missing[0] }}"},
      {"indexing a dict by integer is refused", "{{ d[0] }}", kData},
      {"indexing a list by float is refused", "{{ l[1.0] }}", kData},
      {"builtins as attributes", "{{ d.items is defined }}|{{ d.keys()|list }}|{{ d.get is callable }}", kData},
      {"a key shadows a builtin", "{{ d.items }}", R"({"d": {"items": "mine"}})"},
      {"slice bounds must be integers", "{{ l[1.5:] }}", kData},
      {"a dict cannot be sliced", "{{ d[1:] }}", kData},
      {"slice of a tuple is a list", "{{ (1, 2, 3)[1:] }}"},
      {"computed namespace attribute", "{% set ns = namespace(a=1) %}{% set k = 'a' %}{{ ns[k] }}{{ ns['a'] }}"},
  };
  expect_cases_match_reference(cases);
}

TEST(JinjaCorpus, StringAndNumberFilters) {
  const std::vector<JinjaCase> cases = {
      {"case filters",
       "{{ 'hello world'|upper }}|{{ 'HeLLo'|lower }}|{{ 'hello wORLD-foo_bar 3d éa'|title }}|{{ 'hELLO'|capitalize }}|"
       "{{ 'straße'|upper }}|{{ 'ÀÉÎ'|lower }}|{{ 'éa'|capitalize }}|{{ 'ǆ'|upper }}"},
      {"trim, length, string, safe", "{{ '  x \n'|trim }}|{{ 'abc'|length }}|{{ '😀a'|length }}|{{ 'x'|string }}|{{ 'x'|safe }}|{{ 'ab'|join }}"},
      {"int and float of strings",
       "{{ '42'|int }}|{{ ' -12abc'|int }}|{{ 'abc'|int }}|{{ 'abc'|int(7) }}|{{ '3.9'|int }}|{{ '2.5'|float }}|{{ 'x'|float }}|"
       "{{ 'x'|float(1.5) }}|{{ '1e3'|float }}|{{ '.5'|float }}|{{ '-Infinity'|float }}|{{ 'x'|int(default=3) }}"},
      {"int and float of numbers",
       "{{ 3.7|int }}|{{ -3.7|int }}|{{ 3|float }}|{{ true|int }}|{{ false|float }}|{{ 2.5|int(0) }}|{{ true|int(5) }}|{{ false|bool }}"},
      {"abs", "{{ -3|abs }}|{{ -2.5|abs }}|{{ (0 - 4)|abs }}"},
      {"string of values", "{{ 2.0|string }}|{{ 3|string }}|{{ true|string }}|{{ [1, 'a', 2.0]|string }}|{{ [nothing]|string }}"},
      {"default", "{{ missing|default('d') }}|{{ ''|default('d') }}|{{ ''|default('d', true) }}|{{ none|default('d') }}|"
                  "{{ none|default('d', boolean=true) }}|{{ 0|default(5, true) }}|[{{ missing|default() }}]"},
      {"default without parentheses is refused on undefined", "{{ missing|default }}"},
      {"indent", "{{ 'a\nb\n\nc'|indent }}|{{ 'a\nb'|indent(2) }}|{{ 'a\nb'|indent(2, true) }}|{{ 'a\n\nb'|indent(width=1, first=true, blank=true) }}"},
      {"replace", "{{ 'aaa'|replace('a', 'b') }}|{{ 'aaa'|replace('a', 'b', 2) }}|{{ 'aaa'|replace('a', 'b', count=1) }}|"
                  "{{ 'abc'|replace('', '-') }}|{{ 'a.b'|replace('.', '$&') }}|{{ 'aaa'|replace('a', 'b', 0) }}|{{ 'aaa'|replace('a', 'b', -1) }}"},
      {"filter chains", "{{ ' A b '|trim|lower|replace(' ', '_')|upper }}"},
      {"unknown filter on a string", "{{ 'x'|nosuch }}"},
      {"upper of a number is refused", "{{ 1|upper }}"},
      {"length of none is refused", "{{ none|length }}"},
      {"length of undefined is refused", "{{ missing|length }}"},
      {"string of a dict is refused", "{{ {'a': 1}|string }}"},
      {"list of a string is refused", "{{ 'abc'|list }}"},
      {"indent width must be an integer", "{{ 'a'|indent('  ') }}"},
  };
  expect_cases_match_reference(cases);
}

TEST(JinjaCorpus, ListAndDictFilters) {
  const std::vector<JinjaCase> cases = {
      {"join", "{{ [1, 'a', none, 2.0, true]|join }}|{{ ['a', 'b']|join(', ') }}|{{ 'abc'|join('-') }}|{{ [[1, 2], 'x']|join('|') }}|"
               "{{ ['a']|join(separator='+') }}|{{ [{'a': 1}]|join }}"},
      {"first, last, length, reverse, list", "{{ [3, 1, 2]|first }}|{{ [3, 1, 2]|last }}|{{ [3, 1, 2]|length }}|{{ [3, 1, 2]|reverse }}|{{ (1, 2)|list|length }}"},
      {"first of an empty list", "{{ []|first }}"},
      {"sort", "{{ [3, 1, 2]|sort }}|{{ ['b', 'A', 'c', 'a']|sort }}|{{ ['b', 'A', 'c', 'a']|sort(case_sensitive=true) }}|"
               "{{ [3, 1, 2]|sort(reverse=true) }}|{{ [1, 2.5, true, 0]|sort }}|{{ ['b', 'a']|sort(true) }}"},
      {"sort by attribute", "{{ people|sort(attribute='age')|map(attribute='name')|join(',') }}|"
                            "{{ people|sort(attribute='meta.rank', reverse=true)|map(attribute='name')|join(',') }}|"
                            "{{ people|sort(attribute='name')|map(attribute='name')|join(',') }}",
       kData},
      {"sort of mixed types is refused", "{{ [1, 'a']|sort }}"},
      {"unique", "{{ [1, 2, 1, '1', 2.0, 'a', 'a', none, none]|unique }}"},
      {"map", "{{ people|map(attribute='name')|list }}|{{ people|map(attribute='missing', default='?')|join }}|"
              "{{ people|map(attribute='tags.0')|list }}|{{ people|map(attribute='meta.rank')|list }}",
       kData},
      {"map without attribute is refused", "{{ people|map('upper')|list }}", kData},
      {"selectattr and rejectattr",
       "{{ msgs|selectattr('role', 'equalto', 'user')|map(attribute='content')|join(',') }}|{{ msgs|rejectattr('role', 'eq', 'user')|length }}|"
       "{{ msgs|selectattr('tool_calls')|length }}|{{ msgs|selectattr('tool_calls', 'defined')|length }}|{{ msgs|rejectattr('tool_calls')|length }}|"
       "{{ msgs|selectattr('tool_calls', 'undefined')|length }}",
       kData},
      {"selectattr needs string literals", "{% set r = 'role' %}{{ msgs|selectattr(r)|list }}", kData},
      {"selectattr needs dicts", "{{ [1, 2]|selectattr('x')|list }}"},
      {"selectattr with an unknown test", "{{ msgs|selectattr('role', 'nosuch')|list }}", kData},
      {"tojson of values",
       R"({{ d|tojson }}|{{ [1, 'a', none, true, 2.5, 3.0]|tojson }}|{{ 'é"\n'|tojson }}|{{ 'é😀'|tojson(ensure_ascii=true) }}|{{ missing|tojson }}|{{ [missing]|tojson }})",
       kData},
      {"tojson with indent", "{{ {'b': 1, 'a': [1, 2]}|tojson(indent=2) }}|{{ []|tojson(indent=2) }}|{{ {}|tojson(indent=4) }}|{{ [[], {}]|tojson(indent=2) }}|"
                             "{{ {'a': {'b': [1, {'c': 2}]}, 'd': 'x'}|tojson(indent=4) }}|{{ [1, 2]|tojson(indent=0) }}|{{ 1|tojson(indent=-1) }}"},
      {"tojson with sort_keys and separators", "{{ {'b': 1, 'A': 2, '_c': 3, 'a': 4, 'B2': 5, 'a1': 6}|tojson(sort_keys=true) }}|"
                                                "{{ [1, 2]|tojson(separators=(',', ':')) }}|{{ {'a': 1}|tojson(separators=[';', '=']) }}|"
                                                "{{ {'a': [1]}|tojson(indent=2, separators=(', ', ' : ')) }}"},
      {"tojson of a namespace and of tools", "{% set ns = namespace(a=1) %}{{ ns|tojson }}|{{ tools|tojson }}",
       R"({"tools": [{"type": "function", "function": {"name": "get_weather", "parameters": {"type": "object", "properties": {"city": {"type": "string"}}}}}]})"},
      {"tojson of a tuple is refused", "{{ (1, 2)|tojson }}"},
      {"tojson indent must be an integer", "{{ d|tojson(indent='  ') }}", kData},
      {"tojson negative indent is refused", "{{ [1]|tojson(indent=-1) }}"},
      {"tojson of a function is refused", "{{ {'f': range}|tojson }}"},
      {"dict filters", "{{ d|items|list }}|{{ d|length }}|{{ d|keys }}|{{ d|values }}|{{ {'b': 2, 'a': 1}|dictsort }}|"
                       "{{ {'b': 1, 'a': 2}|dictsort(by='value') }}|{{ {'b': 1, 'a': 2, 'C': 0}|dictsort(reverse=true) }}|"
                       "{{ {'b': 1, 'B': 2, 'a': 3}|dictsort(true) }}|{{ d|items() }}",
       kData},
      {"unknown filter on a list", "{{ [1]|upper }}"},
      {"unknown filter on a dict", "{{ d|nosuch }}", kData},
      {"filter of a namespace is refused", "{% set ns = namespace() %}{{ ns|length }}"},
  };
  expect_cases_match_reference(cases);
}

TEST(JinjaCorpus, Tests) {
  const std::vector<JinjaCase> cases = {
      {"tests on every kind",
       "{% for v in [1, 2.5, 'a', true, none, [1], {'a': 1}, nothing, (1, 2)] %}{{ v is defined }}{{ v is none }}{{ v is string }}"
       "{{ v is number }}{{ v is integer }}{{ v is boolean }}{{ v is iterable }}{{ v is mapping }}{{ v is sequence }}"
       "{{ v is callable }}{{ v is true }}{{ v is false }};{% endfor %}"},
      {"more tests", "{{ 3 is odd }}|{{ 4 is even }}|{{ -3 is odd }}|{{ 'abc' is lower }}|{{ 'ABC' is upper }}|{{ 'aB' is lower }}|{{ 1 is true }}|"
                     "{{ 0 is false }}|{{ x is not defined }}|{{ range is callable }}|{{ 'a'.upper is callable }}|{{ missing is undefined }}|"
                     "{{ 1 is not none }}|{{ 'A1' is upper }}|{{ 5 is lower }}"},
      {"odd of a float is refused", "{{ 2.5 is odd }}"},
      {"unknown test", "{{ 1 is prime }}"},
      {"eq without a value is refused", "{{ 1 is eq }}"},
      {"chained tests", "{{ 1 is odd is true }}"},
  };
  expect_cases_match_reference(cases);
}

TEST(JinjaCorpus, Methods) {
  const std::vector<JinjaCase> cases = {
      {"string case and strip methods",
       R"({{ 'Hello'.upper() }}|{{ 'Hello'.lower() }}|{{ '  x \n'.strip() }}|{{ 'xxhixx'.strip('x') }}|{{ '\n\na'.lstrip('\n') }}|)"
       R"({{ 'a  '.rstrip() }}|{{ 'hello world'.title() }}|{{ 'hello'.capitalize() }})"},
      {"startswith and endswith", "{{ 'abc'.startswith('ab') }}|{{ 'abc'.endswith('bc') }}|{{ 'abc'.startswith(('x', 'a')) }}|{{ 'abc'.endswith(['x']) }}|{{ ''.startswith('') }}"},
      {"startswith needs an argument", "{{ 'abc'.startswith() }}"},
      {"split",
       "{{ 'a,b,,c'.split(',') }}|{{ '  a  b c '.split() }}|{{ 'a b c'.split(none, 1) }}|{{ 'a,b,c'.split(',', 1) }}|{{ 'a,b,c'.split(',', 0) }}|"
       "{{ '  a b c'.split(none, 0) }}|{{ 'a,b,c,d'.split(',', -2) }}|{{ ''.split() }}|{{ ''.split(',') }}|{{ 'a\u3000b'.split() }}"},
      {"split by an empty separator is refused", "{{ 'abc'.split('') }}"},
      {"split by a number is refused", "{{ 'a'.split(1) }}"},
      {"split with keyword arguments is refused", "{{ 'a b'.split(maxsplit=1) }}"},
      {"replace method", "{{ 'hello'.replace('l', 'L') }}|{{ 'hello'.replace('l', 'L', 1) }}|{{ 'hello'.replace('', '.') }}"},
      {"reasoning split as in Qwen3", R"({% set c = '<think>\nhmm\n</think>\n\nAnswer' %}{{ c.split('</think>')[-1].lstrip('\n') }}|{{ c.split('</think>')[0].rstrip('\n').split('<think>')[-1].lstrip('\n') }})"},
      {"dict methods", "{{ d.get('a') }}|{{ d.get('zz') }}|{{ d.get('zz', 'def') }}|{{ d.keys() }}|{{ d.values() }}|{{ d.items() }}|"
                       "{% for k, v in d.items() %}{{ k }}{{ v }}{% endfor %}|{{ d.dictsort(reverse=true) }}",
       kData},
      {"get needs a string key", "{{ d.get(1) }}", kData},
      {"get with a keyword default returns the keywords", "{{ d.get('zz', default=1) is mapping }}", kData},
      {"unknown string method", "{{ 'a'.nosuch() }}"},
      {"lists have no append", "{{ [1].append(2) }}"},
      {"calling a string is refused", "{{ 'a'() }}"},
  };
  expect_cases_match_reference(cases);
}

TEST(JinjaCorpus, Globals) {
  const int64_t sep5 = 1725519489000;  // 2024-09-05T07:08:09Z
  const int64_t jan1 = 1735707600000;  // 2025-01-01T05:00:00Z
  const std::vector<JinjaCase> cases = {
      {"range", "{{ range(3) }}|{{ range(1, 4) }}|{{ range(0, 10, 3) }}|{{ range(5, 0, -2) }}|{{ range(0) }}|{{ range(3, 1) }}|{{ range(0.5, 3) }}"},
      {"range step zero is refused", "{{ range(1, 2, 0) }}"},
      {"raise_exception", "{{ raise_exception('Bad thing') }}"},
      {"raise_exception only when reached", "{% if false %}{{ raise_exception('x') }}{% endif %}ok"},
      {"raise_exception in a macro", "{% macro check(m) %}{% if m.role not in ['user', 'assistant'] %}{{ raise_exception('bad role ' + m.role) }}{% endif %}{% endmacro %}"
                                     "{% for m in msgs %}{{ check(m) }}{% endfor %}",
       R"({"msgs": [{"role": "user"}, {"role": "robot"}]})"},
      {"strftime_now", "{{ strftime_now('%Y-%m-%d %H:%M') }}|{{ strftime_now('%d %b %Y') }}|{{ strftime_now('%B %%Y %A %') }}", "{}", sep5},
      {"strftime_now in January", "{{ strftime_now('%d %B %Y, %H:%M, %b %m') }}", "{}", jan1},
      {"constants", "{{ True and not False }}|{{ None is none }}|{{ true == True }}"},
      {"a variable may not redefine a global", "{{ range }}", R"({"range": 1})"},
      {"a variable may not be called namespace", "x", R"({"namespace": 1})"},
      {"undefined variables print nothing", "[{{ missing }}]"},
  };
  expect_cases_match_reference(cases);
}

TEST(JinjaCorpus, MacrosAndCallBlocks) {
  const std::vector<JinjaCase> cases = {
      {"macro with defaults and keywords",
       "{% macro greet(name, greeting='Hello') %}{{ greeting }}, {{ name }}!{% endmacro %}{{ greet('Ann') }}|{{ greet('Bob', 'Hi') }}|{{ greet(greeting='Yo', name='Cy') }}"},
      {"a default refers to an earlier parameter", "{% macro m(a, b=a * 2) %}{{ a }}{{ b }}{% endmacro %}{{ m(2) }}|{{ m(2, 5) }}"},
      {"missing arguments are undefined", "{% macro m(a, b) %}[{{ a }}][{{ b is defined }}]{% endmacro %}{{ m(1) }}"},
      {"varargs and kwargs", "{% macro m(a) %}{{ a }}{{ varargs }}{{ kwargs }}{% endmacro %}{{ m(1, 2, 3, x=4) }}|{{ m(1) }}"},
      {"too many arguments", "{% macro m(a) %}{% endmacro %}{{ m(1, 2) }}"},
      {"unknown keyword argument", "{% macro m(a) %}{% endmacro %}{{ m(b=1) }}"},
      {"kwargs declared first is a plain variable", "{% macro m() %}{% set kwargs = 5 %}{{ kwargs }}{% endmacro %}{{ m(a=1) }}"},
      {"kwargs read first is bound", "{% macro m() %}{{ kwargs }}{% set kwargs = 5 %}{{ kwargs }}{% endmacro %}{{ m(a=1) }}"},
      {"macros see the caller's variables", "{% macro m() %}{{ v }}{% endmacro %}{% for v in [1, 2] %}{{ m() }}{% endfor %}"},
      {"recursive macro", "{% macro f(n) %}{% if n > 0 %}{{ n }}{{ f(n - 1) }}{% endif %}{% endmacro %}{{ f(3) }}"},
      {"macro spreads", "{% macro m(a, b, c=0) %}{{ a }}{{ b }}{{ c }}{% endmacro %}{{ m(*[1, 2]) }}|{{ m(1, **{'b': 5, 'c': 6}) }}"},
      {"duplicate keyword argument", "{% macro m(a) %}{% endmacro %}{{ m(a=1, **{'a': 2}) }}"},
      {"call block", "{% macro wrap(tag) %}<{{ tag }}>{{ caller() }}</{{ tag }}>{% endmacro %}{% call wrap('b') %}bold{% endcall %}"},
      {"call block with arguments", "{% macro each(items) %}{% for i in items %}{{ caller(i) }}{% endfor %}{% endmacro %}{% call(x) each([1, 2]) %}[{{ x }}]{% endcall %}"},
      {"call block sees its own scope", "{% set v = 'outer' %}{% macro m() %}{% set v = 'inner' %}{{ caller() }}{% endmacro %}{% call m() %}{{ v }}{% endcall %}"},
      {"calling an undefined macro", "{{ nosuch(1) }}"},
      {"a macro rendering a tool schema",
       "{% macro render(props) %}{% for name, p in props.items() %}{{ name }}: {{ p.type }}{% if p.description is defined %} ({{ p.description }}){% endif %}"
       "{% if not loop.last %}, {% endif %}{% endfor %}{% endmacro %}{{ render(tool.parameters.properties) }}",
       R"({"tool": {"parameters": {"properties": {"city": {"type": "string", "description": "the city"}, "days": {"type": "integer"}}}}})"},
  };
  expect_cases_match_reference(cases);
}

// The comparison itself can fail: printing a function is something sluice refuses and the
// reference does not (it prints the JavaScript source), so this case must be reported.
TEST(JinjaCorpus, ComparisonReportsADifference) {
  EXPECT_NONFATAL_FAILURE(expect_cases_match_reference({JinjaCase("function", "{{ range }}")}), "the reference renders");
}

}  // namespace
