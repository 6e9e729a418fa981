// Numbers as @huggingface/jinja sees them: every Jinja integer and float is a JavaScript
// double, printed and parsed by JavaScript's rules (Number.prototype.toString, toFixed,
// parseInt, parseFloat, Number()). The interpreter mirrors them so that a render matches the
// reference byte for byte, including the odd cases (1e+21, 1152921504606847000, -0).
#pragma once

#include <string>
#include <string_view>

namespace sluice::jinja {

// Number.prototype.toString(): shortest round-trip digits, exponent form below 1e-6 and from
// 1e21 on, "NaN", "Infinity", and "0" for -0.
std::string js_number_to_string(double x);

// FloatValue.toString() of @huggingface/jinja: "-0.0" for -0, integral values with ".0"
// (x.toFixed(1)), everything else as js_number_to_string.
std::string js_float_to_string(double x);

// parseInt(s, 10): leading whitespace, an optional sign, decimal digits; NaN when no digit.
double js_parse_int(std::string_view s);

// parseFloat(s): the longest decimal literal (or Infinity) after leading whitespace; NaN when
// there is none.
double js_parse_float(std::string_view s);

// Number(s), the conversion loose equality (==) applies to a string: surrounding whitespace
// ignored, "" is 0, decimal or 0x / 0o / 0b literals, NaN for anything else.
double js_string_to_number(std::string_view s);

}  // namespace sluice::jinja
