// zshard-server and zshardctl as real processes: bad flags exit non-zero
// with one line naming the flag; a server on port 0 reports its port and
// answers zshardctl.
#include <sys/stat.h>
#include <unistd.h>

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <memory>

#include "absl/strings/str_split.h"
#include "gtest/gtest.h"
#include "tests/integration/process.h"

namespace zshard {
namespace {

using testing::Process;

std::string TempDir() {
  std::string tmpl =
      (std::filesystem::temp_directory_path() / "zsflags.XXXXXX").string();
  return mkdtemp(tmpl.data());
}

void ExpectRefused(const std::vector<std::string>& args,
                   const std::string& flag) {
  const std::string dir = TempDir();
  std::vector<std::string> argv = {ZSHARD_SERVER_BIN};
  argv.insert(argv.end(), args.begin(), args.end());
  Process p(argv, dir + "/server");
  auto code = p.Wait(absl::Seconds(20));
  ASSERT_TRUE(code.has_value()) << "server with bad flags kept running";
  EXPECT_NE(*code, 0);
  const std::string err = p.Stderr();
  std::vector<std::string> lines = absl::StrSplit(err, '\n', absl::SkipEmpty());
  ASSERT_EQ(lines.size(), 1u) << err;
  EXPECT_NE(lines[0].find(flag), std::string::npos) << lines[0];
  std::filesystem::remove_all(dir);
}

TEST(ServerFlagsTest, BadFlagsExitNonZeroNamingTheFlag) {
  ExpectRefused({"--num_shards=abc"}, "--num_shards");
  ExpectRefused({"--shard_id=5", "--num_shards=4", "--coordinator=127.0.0.1:1"},
                "--shard_id");
  ExpectRefused({"--no_such_flag=1"}, "--no_such_flag");
  ExpectRefused({"--shard_id=1", "--num_shards=2"}, "--coordinator");
  ExpectRefused({"--listen=nonsense"}, "--listen");
  ExpectRefused({"--listen=127.0.0.1:70000"}, "--listen");  // no wrapping
  ExpectRefused({"--listen=127.0.0.1:-1"}, "--listen");
  ExpectRefused({"--trainers=0"}, "--trainers");
  ExpectRefused({"--config=/nonexistent/ds_config.json"}, "--config");
  ExpectRefused({"--transport=rdma"}, "--transport");
  ExpectRefused({"--lease_timeout_s=0"}, "--lease_timeout_s");
  ExpectRefused({"--trainer_timeout_s=0"}, "--trainer_timeout_s");
  ExpectRefused({"--trainer_timeout_s=abc"}, "--trainer_timeout_s");
  ExpectRefused({"--trainers=2", "--min_trainers=3"},
                "min_trainers <= trainers");
  ExpectRefused({"--trainers=4", "--max_trainers=3"},
                "trainers <= max_trainers");
  ExpectRefused({"--max_trainers=0"}, "--max_trainers");
  ExpectRefused({"--stop_timeout_s=-1"}, "--stop_timeout_s");
  ExpectRefused({"--stop_timeout_s=4000"}, "--stop_timeout_s");
  // A silent trainer must be dropped before the others' calls time out.
  ExpectRefused({"--trainer_timeout_s=30", "--wait_timeout_s=20"},
                "--trainer_timeout_s");
  ExpectRefused({"--restore=latest"}, "--restore");
  // A checkpoint directory that cannot be created or written fails at
  // start, not at the first checkpoint.
  ExpectRefused({"--checkpoint_dir=/dev/null/ckpt"}, "--checkpoint_dir");
  const std::string dir = TempDir();
  std::ofstream(dir + "/file") << "x";
  ExpectRefused({"--checkpoint_dir=" + dir + "/file"}, "--checkpoint_dir");
  if (::geteuid() != 0) {  // root writes through the mode bits
    std::filesystem::create_directory(dir + "/ro");
    ::chmod((dir + "/ro").c_str(), 0555);
    ExpectRefused({"--checkpoint_dir=" + dir + "/ro"}, "--checkpoint_dir");
  }
  std::filesystem::remove_all(dir);
}

TEST(ServerFlagsTest, BadConfigValueIsRefusedWithTheKeyPath) {
  const std::string dir = TempDir();
  {
    std::ofstream cfg(dir + "/ds.json");
    cfg << R"({"zero_optimization": {"stage": 5}})";
  }
  ExpectRefused({"--config=" + dir + "/ds.json"}, "zero_optimization.stage");
  std::filesystem::remove_all(dir);
}

TEST(ServerFlagsTest, ServesOnAFreePortAndAnswersStatus) {
  const std::string dir = TempDir();
  Process server({ZSHARD_SERVER_BIN, "--listen=127.0.0.1:0",
                  "--port_file=" + dir + "/port", "--trainers=2"},
                 dir + "/server");
  const int port =
      testing::WaitForPortFile(dir + "/port", server, absl::Seconds(20));
  ASSERT_GT(port, 0) << server.Stderr();
  Process ctl(
      {ZSHARDCTL_BIN, "status", "--server=127.0.0.1:" + std::to_string(port)},
      dir + "/ctl");
  auto code = ctl.Wait(absl::Seconds(20));
  ASSERT_TRUE(code.has_value());
  EXPECT_EQ(*code, 0) << ctl.Stderr();
  EXPECT_NE(ctl.Stdout().find("1 shards, 2 trainers"), std::string::npos)
      << ctl.Stdout();
  Process health(
      {ZSHARDCTL_BIN, "health", "--server=127.0.0.1:" + std::to_string(port)},
      dir + "/health");
  code = health.Wait(absl::Seconds(20));
  ASSERT_TRUE(code.has_value());
  EXPECT_EQ(*code, 0) << health.Stderr();
  EXPECT_NE(health.Stdout().find("SERVING"), std::string::npos)
      << health.Stdout();
  // No callback service made the server hybrid: gRPC 1.51 then runs
  // "nexting_thread"s for its alternative completion queues (and served the
  // sync methods from non-polling queues: stalls and ~20% more CPU per step).
  for (const auto& task : std::filesystem::directory_iterator(
           "/proc/" + std::to_string(server.pid()) + "/task")) {
    std::ifstream comm(task.path() / "comm");
    std::string name;
    std::getline(comm, name);
    EXPECT_NE(name, "nexting_thread");
  }
  // Nothing listens on port 1: refused within the deadline, exit 1.
  Process unhealthy(
      {ZSHARDCTL_BIN, "health", "--server=127.0.0.1:1", "--timeout_s=2"},
      dir + "/unhealthy");
  code = unhealthy.Wait(absl::Seconds(20));
  ASSERT_TRUE(code.has_value());
  EXPECT_EQ(*code, 1);
  EXPECT_NE(unhealthy.Stderr().find("health check failed"), std::string::npos)
      << unhealthy.Stderr();
  Process bad({ZSHARDCTL_BIN, "frobnicate", "--server=127.0.0.1:1"},
              dir + "/bad");
  code = bad.Wait(absl::Seconds(20));
  ASSERT_TRUE(code.has_value());
  EXPECT_EQ(*code, 2);
  kill(server.pid(), SIGTERM);
  code = server.Wait(absl::Seconds(20));
  ASSERT_TRUE(code.has_value()) << "server did not stop on SIGTERM";
  EXPECT_EQ(*code, 0);
  std::filesystem::remove_all(dir);
}

// A second server on a port the first holds is refused (no SO_REUSEPORT
// sharing the trainers between the two); zshardctl status exits non-zero
// naming a shard that does not answer, after printing the rest.
TEST(ServerFlagsTest, APortInUseIsRefusedAndAnUnreachableShardFailsStatus) {
  const std::string dir = TempDir();
  Process shard0({ZSHARD_SERVER_BIN, "--listen=127.0.0.1:0",
                  "--port_file=" + dir + "/port0", "--num_shards=2"},
                 dir + "/shard0");
  const int port0 =
      testing::WaitForPortFile(dir + "/port0", shard0, absl::Seconds(20));
  ASSERT_GT(port0, 0) << shard0.Stderr();
  const std::string coordinator = "127.0.0.1:" + std::to_string(port0);
  Process twin({ZSHARD_SERVER_BIN, "--listen=" + coordinator}, dir + "/twin");
  auto code = twin.Wait(absl::Seconds(20));
  ASSERT_TRUE(code.has_value()) << "a second server shares the port";
  EXPECT_NE(*code, 0);
  EXPECT_NE(twin.Stderr().find("cannot listen on " + coordinator),
            std::string::npos)
      << twin.Stderr();

  Process shard1({ZSHARD_SERVER_BIN, "--listen=127.0.0.1:0",
                  "--port_file=" + dir + "/port1", "--num_shards=2",
                  "--shard_id=1", "--coordinator=" + coordinator},
                 dir + "/shard1");
  ASSERT_GT(testing::WaitForPortFile(dir + "/port1", shard1, absl::Seconds(20)),
            0)
      << shard1.Stderr();
  // Both answer: 0. Shard 1 gone: 1, naming it, shard 0 still printed.
  auto status = [&](const std::string& name) {
    auto p = std::make_unique<Process>(
        std::vector<std::string>{ZSHARDCTL_BIN, "status",
                                 "--server=" + coordinator, "--timeout_s=3"},
        dir + "/" + name);
    return p;
  };
  for (int attempt = 0; attempt < 50; ++attempt) {
    auto both = status("both" + std::to_string(attempt));
    code = both->Wait(absl::Seconds(20));
    ASSERT_TRUE(code.has_value());
    if (*code == 0) break;  // shard 1 may not be listed by shard 0 yet
    absl::SleepFor(absl::Milliseconds(100));
  }
  EXPECT_EQ(*code, 0);
  shard1.Kill();
  auto one = status("one");
  code = one->Wait(absl::Seconds(30));
  ASSERT_TRUE(code.has_value());
  EXPECT_EQ(*code, 1);
  EXPECT_NE(one->Stderr().find("shard 1 did not answer"), std::string::npos)
      << one->Stderr();
  EXPECT_NE(one->Stdout().find("2 shards"), std::string::npos) << one->Stdout();
  std::filesystem::remove_all(dir);
}

}  // namespace
}  // namespace zshard
