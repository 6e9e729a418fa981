// RoutingTraceWriter: one JSON object per routed row.
#include "engine/routing_trace.h"

#include <cerrno>
#include <cstring>

#include <nlohmann/json.hpp>

#include "core/error.h"

namespace sluice {

RoutingTraceWriter::RoutingTraceWriter(const std::filesystem::path& path, std::string dataset)
    : path_(path.string()), dataset_(std::move(dataset)) {
  file_ = std::fopen(path_.c_str(), "w");
  SLUICE_CHECK(file_ != nullptr, Status::io, "cannot write routing trace ", path_, ": ", std::strerror(errno));
}

RoutingTraceWriter::~RoutingTraceWriter() {
  if (file_) std::fclose(file_);
}

void RoutingTraceWriter::write(const RoutingEvent& e) {
  std::lock_guard<std::mutex> lock(mutex_);
  const Routing& r = *e.routing;
  for (int64_t row = 0; row < r.n_rows; ++row) {
    nlohmann::json j = {{"dataset", dataset_}, {"problem_id", problem_id_}, {"layer", e.layer},
                        {"token_idx", e.first_position + row}};
    j["experts"] = std::vector<int32_t>(r.ids.begin() + row * r.k, r.ids.begin() + (row + 1) * r.k);
    j["gating_probs"] = std::vector<float>(r.weights.begin() + row * r.k, r.weights.begin() + (row + 1) * r.k);
    std::string line = j.dump() + "\n";
    SLUICE_CHECK(std::fwrite(line.data(), 1, line.size(), file_) == line.size(), Status::io,
                 "writing routing trace ", path_, ": ", std::strerror(errno));
  }
}

}  // namespace sluice
