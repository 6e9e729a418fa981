// sluice tokenize: a text's token ids under a model's tokenizer.json, without loading the
// model (llama.cpp's llama-tokenize). Three outputs:
//   ids     comma-separated on one line: what `run --tokens` and `bench` take (default)
//   pieces  one token a line, "id<TAB>piece" with the piece's bytes escaped like a C string
//   u32     little-endian uint32 a token, no header: a corpus for a training script (numpy's
//           fromfile(path, '<u4'))
// A file is read a piece at a time (format/text_pieces.h), so memory stays bounded whatever
// its size; the ids equal those of encoding the whole file at once except at a cut inside one
// endless line (text_pieces.h says when).
#include <unistd.h>

#include <cstdio>
#include <memory>
#include <optional>
#include <string>

#include "cli_args.h"
#include "cli_common.h"
#include "cli_output.h"
#include "core/error.h"
#include "core/paths.h"
#include "format/output_file.h"
#include "format/text_pieces.h"
#include "format/tokenizer.h"

namespace sluice::cli {
namespace {

enum class IdFormat { ids, pieces, u32 };

// A token's bytes for a line of `pieces` output: printable ASCII as is, the rest as C escapes.
std::string escaped(const std::string& bytes) {
  std::string out;
  for (const unsigned char c : bytes) {
    switch (c) {
      case '\n': out += "\\n"; break;
      case '\t': out += "\\t"; break;
      case '\r': out += "\\r"; break;
      case '\\': out += "\\\\"; break;
      default:
        if (c >= 0x20 && c < 0x7f) {
          out += static_cast<char>(c);
        } else {
          char hex[8];
          std::snprintf(hex, sizeof hex, "\\x%02x", c);
          out += hex;
        }
    }
  }
  return out;
}

// Where the ids go: stdout, or an OutputFile committed at the end (a failed run leaves no
// half-written file).
class IdSink {
 public:
  IdSink(const std::string& path, IdFormat format, const Tokenizer& tok) : format_(format), tok_(tok) {
    if (!path.empty()) file_ = std::make_unique<OutputFile>(path);
  }
  void push(std::span<const int32_t> ids) {
    std::string text;
    for (const int32_t id : ids) {
      switch (format_) {
        case IdFormat::ids:
          if (n_ > 0) text += ',';
          text += std::to_string(id);
          break;
        case IdFormat::pieces:
          text += std::to_string(id) + '\t' + escaped(tok_.token_text(id)) + '\n';
          break;
        case IdFormat::u32: {
          const uint32_t v = static_cast<uint32_t>(id);
          const char le[4] = {static_cast<char>(v & 0xff), static_cast<char>((v >> 8) & 0xff),
                              static_cast<char>((v >> 16) & 0xff), static_cast<char>(v >> 24)};
          text.append(le, 4);
          break;
        }
      }
      ++n_;
    }
    emit(text);
  }
  void finish() {
    if (format_ == IdFormat::ids) emit("\n");
    if (file_) file_->commit();
    else stdout_flush();
  }
  int64_t count() const { return n_; }

 private:
  void emit(std::string_view text) {
    if (file_) file_->write(text);
    else stdout_write(text);
  }
  IdFormat format_;
  const Tokenizer& tok_;
  std::unique_ptr<OutputFile> file_;
  int64_t n_ = 0;
};

}  // namespace

void register_tokenize(CLI::App& app) {
  struct Options {
    std::string model, prompt, file, out, format = "ids";
    bool add_bos = false, has_prompt = false;
  };
  auto opt = std::make_shared<Options>();
  CLI::App* cmd = app.add_subcommand("tokenize", "token ids of a text under a model's tokenizer");
  cmd->add_option("--model", opt->model, "model directory (HF checkpoint or pack) holding tokenizer.json")->required();
  CLI::Option* prompt = cmd->add_option("--prompt", opt->prompt, "the text");
  CLI::Option* file = cmd->add_option("--file", opt->file, "a UTF-8 text file, read a piece at a time");
  prompt->excludes(file);
  file->excludes(prompt);
  cmd->add_option("--out", opt->out, "write here instead of stdout");
  cmd->add_option("--format", opt->format,
                  "ids (comma-separated, as --tokens takes them; default), pieces (id<TAB>piece a line) or u32 "
                  "(little-endian uint32 a token)");
  cmd->add_flag("--add-bos", opt->add_bos, "start with the tokenizer's bos token, where it has one");
  cmd->callback([opt, prompt, file] {
    SLUICE_CHECK(prompt->count() + file->count() == 1, Status::invalid_argument,
                 "tokenize: give the text with --prompt or --file");
    std::optional<IdFormat> format;
    if (opt->format == "ids") format = IdFormat::ids;
    else if (opt->format == "pieces") format = IdFormat::pieces;
    else if (opt->format == "u32") format = IdFormat::u32;
    SLUICE_CHECK(format.has_value(), Status::invalid_argument, "--format: '", opt->format, "' (ids, pieces or u32)");
    SLUICE_CHECK(*format != IdFormat::u32 || !opt->out.empty() || !isatty(fileno(stdout)), Status::invalid_argument,
                 "--format u32 writes binary: give --out FILE or redirect stdout");
    const std::filesystem::path tiktoken = std::filesystem::path(opt->model) / "tiktoken.model";
    std::error_code ec;
    expect_input_file(std::filesystem::is_regular_file(tiktoken, ec) ? tiktoken : std::filesystem::path(opt->model) / "tokenizer.json",
                      "--model", "a directory with tokenizer.json (or tiktoken.model)");
    if (file->count()) expect_input_file(opt->file, "--file", "a UTF-8 text file");
    if (!opt->out.empty()) expect_output_file(opt->out, "--out", "a file for the token ids");
    const Tokenizer tok = Tokenizer::load(opt->model);
    // Ctrl-C or SIGTERM stops at the next piece: the unfinished --out file is removed (the
    // sink's OutputFile, unwound) and the exit status is 130.
    InterruptFlag interrupt;
    IdSink sink(opt->out, *format, tok);
    if (prompt->count()) {
      sink.push(tok.encode(opt->prompt, opt->add_bos));
    } else {
      TextPieceReader text(opt->file);
      std::string piece;
      bool first = true;
      while (text.next(piece)) {
        if (interrupt.flag()->load()) exit_interrupted(opt->out.empty() ? "tokenize" : "tokenize: " + opt->out + " not written");
        try {
          sink.push(tok.encode(piece, opt->add_bos && first));
        } catch (const Error& e) {
          fail(e.status(), opt->file, " (the piece from byte ", text.piece_offset(), "): ", e.what());
        }
        first = false;
      }
    }
    sink.finish();
    if (!opt->out.empty()) std::fprintf(stderr, "sluice: %lld tokens to %s\n", static_cast<long long>(sink.count()), opt->out.c_str());
  });
}

}  // namespace sluice::cli
