// Numeric option parsing and the wording of command-line errors (see cli_args.h).
#include "cli_args.h"

#include <charconv>
#include <cmath>
#include <cstdio>

#include "core/error.h"

namespace sluice::cli {

namespace {

// The name messages use: the first of CLI11's comma-separated names ("-n" of "-n,--n-predict").
std::string display_name(const std::string& names) { return names.substr(0, names.find(',')); }

// "1e+06" style for reals: short, and exact for the bounds sluice uses (0, 1, 1e6).
std::string real_text(double v) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "%g", v);
  return buf;
}

std::string with_note(std::string text, const std::string& note) {
  return note.empty() ? text : text + " (" + note + ")";
}

// One callback per option: CLI11 hands over the text of its single value (a repeated option
// never gets here: CLI11 stops at the repeat, and parse_error_text words it).
CLI::Option* add_parsed(CLI::App& cmd, const std::string& names, const std::string& help, const char* type_name,
                        std::function<void(const std::string&)> parse) {
  auto* opt = cmd.add_option(
      names,
      [parse = std::move(parse)](const CLI::results_t& res) {
        parse(res.empty() ? std::string() : res.back());
        return true;
      },
      help);
  opt->type_name(type_name);
  opt->expected(1);
  return opt;
}

// std::from_chars over the whole text: errc{} only when every character was used.
template <typename T>
std::errc whole_integer(const std::string& text, T& v) {
  const char* end = text.data() + text.size();
  auto [ptr, ec] = std::from_chars(text.data(), end, v);
  if (ec == std::errc() && (ptr != end || text.empty())) return std::errc::invalid_argument;
  return ec;
}

// The integer in `text` within [range.min, range.max] (capped to what T holds), or an
// invalid_argument error that echoes the text and states the range; a number beyond int64
// where the range has no upper end of its own says that it is too large.
template <typename T>
T parse_integer(const std::string& name, const std::string& text, IntRange range) {
  constexpr int64_t type_max = std::numeric_limits<T>::max();
  range.max = std::min(range.max, type_max);
  int64_t v = 0;
  const std::errc ec = whole_integer(text, v);
  if (ec == std::errc::result_out_of_range && text[0] != '-' && range.max == std::numeric_limits<int64_t>::max())
    fail(Status::invalid_argument, name, " ", text, ": too large (at most ", range.max, ")");
  if (ec != std::errc() || v < range.min || v > range.max)
    fail(Status::invalid_argument, name, " ", text, ": expected ", range_text(range));
  return static_cast<T>(v);
}

double parse_real(const std::string& name, const std::string& text, const RealRange& range) {
  double v = 0;
  const char* end = text.data() + text.size();
  auto [ptr, ec] = std::from_chars(text.data(), end, v);
  const bool number = ec == std::errc() && ptr == end && !text.empty();
  const bool above_min = range.min_open ? v > range.min : v >= range.min;
  if (!number || !std::isfinite(v) || !above_min || v > range.max)
    fail(Status::invalid_argument, name, " ", text, ": expected ", range_text(range));
  return v;
}

}  // namespace

std::string range_text(const IntRange& range) {
  const bool unbounded = range.max == std::numeric_limits<int64_t>::max();
  return with_note(
      unbounded ? str("an integer, ", range.min, " or more") : str("an integer from ", range.min, " to ", range.max),
      range.note);
}

std::string range_text(const RealRange& range) {
  const std::string min = real_text(range.min);
  std::string text;
  if (std::isinf(range.max))
    text = range.min_open ? "a finite number above " + min : "a finite number, " + min + " or more";
  else
    text = (range.min_open ? "a number above " + min + ", at most " : "a number from " + min + " to ") +
           real_text(range.max);
  return with_note(text, range.note);
}

CLI::Option* add_integer(CLI::App& cmd, const std::string& names, int64_t& value, const IntRange& range,
                         const std::string& help) {
  return add_parsed(cmd, names, help, "N", [&value, range, name = display_name(names)](const std::string& text) {
    value = parse_integer<int64_t>(name, text, range);
  });
}

CLI::Option* add_integer(CLI::App& cmd, const std::string& names, int32_t& value, const IntRange& range,
                         const std::string& help) {
  return add_parsed(cmd, names, help, "N", [&value, range, name = display_name(names)](const std::string& text) {
    value = parse_integer<int32_t>(name, text, range);
  });
}

CLI::Option* add_threads(CLI::App& cmd, int32_t& value, const std::string& help) {
  return add_integer(cmd, "--threads", value, IntRange::from(0, kThreadsMax, "0: all cores"),
                     help + " (default: all cores)");
}

CLI::Option* add_seed(CLI::App& cmd, const std::string& names, uint64_t& value, const std::string& help) {
  return add_parsed(cmd, names, help, "S", [&value, name = display_name(names)](const std::string& text) {
    constexpr uint64_t max = std::numeric_limits<uint64_t>::max();
    uint64_t v = 0;
    const std::errc ec = whole_integer(text, v);
    if (ec == std::errc::result_out_of_range && text[0] != '-')
      fail(Status::invalid_argument, name, " ", text, ": too large (at most ", max, ")");
    SLUICE_CHECK(ec == std::errc(), Status::invalid_argument, name, " ", text, ": expected an integer from 0 to ", max);
    value = v;
  });
}

CLI::Option* add_real(CLI::App& cmd, const std::string& names, double& value, const RealRange& range,
                      const std::string& help) {
  return add_parsed(cmd, names, help, "X", [&value, range, name = display_name(names)](const std::string& text) {
    value = parse_real(name, text, range);
  });
}

CLI::Option* add_real(CLI::App& cmd, const std::string& names, float& value, const RealRange& range,
                      const std::string& help) {
  return add_parsed(cmd, names, help, "X", [&value, range, name = display_name(names)](const std::string& text) {
    const double v = parse_real(name, text, range);
    constexpr double big = std::numeric_limits<float>::max(), tiny = std::numeric_limits<float>::denorm_min();
    value = static_cast<float>(std::min(v, big));
    if (range.min_open && v > 0 && value == 0) value = static_cast<float>(tiny);
  });
}

namespace {

// "run, logits, perplexity, ...": the subcommands in the order they were registered.
std::string subcommand_list(const CLI::App& app) {
  std::string names;
  for (const CLI::App* sub : app.get_subcommands([](const CLI::App*) { return true; }))
    names += (names.empty() ? "" : ", ") + sub->get_name();
  return names;
}

// The name an option is known by in messages: its first short name, else its first long name.
std::string option_name(const CLI::Option& opt) {
  if (!opt.get_snames().empty()) return "-" + opt.get_snames().front();
  if (!opt.get_lnames().empty()) return "--" + opt.get_lnames().front();
  return opt.get_name(true);
}

// "-n was given twice (3, 5); give it once" for the option CLI11 found repeated.
std::string repeated_option_text(const CLI::App& app) {
  std::vector<const CLI::App*> apps{&app};
  for (const CLI::App* sub : app.get_subcommands([](const CLI::App* s) { return s->parsed(); })) apps.push_back(sub);
  for (const CLI::App* a : apps) {
    for (const CLI::Option* opt : a->get_options()) {
      const size_t allowed = static_cast<size_t>(std::max(1, opt->get_expected_max()));
      if (opt->get_expected_max() <= 0 || opt->count() <= allowed) continue;
      std::string values;
      for (const std::string& v : opt->results()) values += (values.empty() ? "" : ", ") + v;
      const std::string times = opt->count() == 2 ? "twice" : str(opt->count(), " times");
      return str(option_name(*opt), " was given ", times, " (", values, "); give it once");
    }
  }
  return "";
}

}  // namespace

std::string parse_error_text(const CLI::App& app, const CLI::ParseError& e, const std::vector<std::string>& args) {
  const bool no_subcommand = app.get_subcommands().empty();
  if (no_subcommand && (dynamic_cast<const CLI::RequiredError*>(&e) || dynamic_cast<const CLI::ExtrasError*>(&e))) {
    for (const std::string& a : args)
      if (!a.empty() && a[0] != '-')
        return str("unknown subcommand '", a, "' (the subcommands: ", subcommand_list(app), ")");
    return str("a subcommand is required: ", subcommand_list(app), " (sluice --help)");
  }
  if (dynamic_cast<const CLI::ArgumentMismatch*>(&e)) {
    const std::string repeated = repeated_option_text(app);
    if (!repeated.empty()) return repeated;
    // CLI11's "--n-predict: 1 required N missing": the option ended the line without its value.
    const std::string what = e.what();
    const size_t colon = what.find(": 1 required ");
    if (colon != std::string::npos && what.ends_with(" missing")) return what.substr(0, colon) + " needs a value";
  }
  std::string help = "sluice --help";
  if (!no_subcommand) help = "sluice " + app.get_subcommands().front()->get_name() + " --help";
  return str(e.what(), " (", help, ")");
}

}  // namespace sluice::cli
