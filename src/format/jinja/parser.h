// Tokens to a syntax tree, as @huggingface/jinja's parser.ts does it (its precedence, its
// tolerance of missing commas in lists, its errors). Throws Error(invalid_argument)
// "line N: reason" for what the reference rejects.
#pragma once

#include <memory>
#include <vector>

#include "format/jinja/ast.h"
#include "format/jinja/lexer.h"

namespace sluice::jinja {

std::unique_ptr<Program> parse(const std::vector<Token>& tokens);

}  // namespace sluice::jinja
