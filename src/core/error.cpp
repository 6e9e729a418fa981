// Names of status codes, for messages and the public API.
#include "core/error.h"

namespace sluice {

const char* status_name(Status s) {
  switch (s) {
    case Status::ok: return "ok";
    case Status::invalid_argument: return "invalid argument";
    case Status::not_found: return "not found";
    case Status::corrupt: return "corrupt";
    case Status::unsupported: return "unsupported";
    case Status::io: return "io error";
    case Status::out_of_memory: return "out of memory";
    case Status::timeout: return "timeout";
    case Status::internal: return "internal error";
    case Status::unavailable: return "unavailable";
  }
  return "unknown";
}

}  // namespace sluice
