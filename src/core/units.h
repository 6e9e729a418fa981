// Byte sizes as users write them on the command line ("512M", "8G", "1.5GiB", "4096") and
// as messages print them ("24.0 MiB").
#pragma once

#include <cstdint>
#include <string>
#include <string_view>

namespace sluice {

// A byte count: a number (decimal fraction allowed) and an optional binary suffix K, M, G or
// T (optionally followed by "B" or "iB", any case): "512M" = 512 MiB. Plain numbers are
// bytes. Errors (invalid_argument) name `what` (the option) and the text.
uint64_t parse_byte_size(std::string_view text, std::string_view what);

// "24.0 MiB", "1.50 GiB", "512 B".
std::string byte_size_text(uint64_t bytes);

}  // namespace sluice
