// `sluice serve` with Python's http.client (tests/tools/server/python_client.py): a kept-alive
// connection carrying a completion and /health, a streamed completion (its connection closes
// after it), then two requests pipelined in one write; greedy text equal to the Generator's.
// (The openai npm client's two transports: tests/tools/server/serve_cli_test.cpp; cpp-httplib's
// client: tests/tools/server/server_test.cpp.)
#include <gtest/gtest.h>

#include <cstdio>

#include "tests/models/fixture_util.h"
#include "tests/tools/server/server_util.h"

using namespace sluice;
using namespace sluice::test;
using nlohmann::json;

TEST(ServerClients, PythonHttpClientKeepAliveStreamingAndPipelining) {
  Served s;
  const std::string prompt = "The old man walked";
  const std::string want = greedy_text(s.model, s.model.tokenizer->encode(prompt, s.model.tokenizer->add_bos()), 10, 96);
  const std::string cmd = "python3 " + (source_dir() / "tests/tools/server/python_client.py").string() + " " +
                          std::to_string(s.port) + " '" + prompt + "' 10 2>&1";
  FILE* p = ::popen(cmd.c_str(), "r");
  ASSERT_NE(p, nullptr);
  std::string out;
  char buf[4096];
  while (size_t n = std::fread(buf, 1, sizeof buf, p)) out.append(buf, n);
  const int rc = ::pclose(p);
  ASSERT_EQ(rc, 0) << out << " (python3 is among the test's Debian packages: make test-deps)";
  const json got = json::parse(out, nullptr, false);
  ASSERT_TRUE(got.is_object()) << out;
  EXPECT_EQ(got["completion_status"], 200);
  EXPECT_EQ(got["completion"], want);
  EXPECT_EQ(got["stream"], want);
  EXPECT_EQ(got["stream_done"], true);
  EXPECT_EQ(got["stream_closes"], true);
  EXPECT_EQ(got["health"], "ok");
  EXPECT_EQ(got["health_after_stream"], "ok");
  EXPECT_EQ(got["same_connection"], true) << "the connection was not kept alive";
  EXPECT_EQ(got["pipelined_text"], want);
  EXPECT_EQ(got["pipelined_health"], "ok");
}
