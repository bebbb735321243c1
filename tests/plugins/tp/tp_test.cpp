// The tensor-parallel suite: real processes, real Gloo over loopback.
//
// Each TpLayers case spawns W ranks of smp_tp_test_worker (see tp_worker.cpp) with
// RANK / WORLD_SIZE / MASTER_ADDR=127.0.0.1 / MASTER_PORT (a free port) /
// OMP_NUM_THREADS=1, and asserts every rank exits 0; otherwise it prints every rank's
// output. The rule checks of smp_tp.so are tested here too, through the C ABI.
#include <smp/abi.h>

#include "plugin/host_api.h"

#include <smp/sdk/module.hpp>

#include <gtest/gtest.h>

#include <arpa/inet.h>
#include <dlfcn.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <signal.h>
#include <spawn.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

extern char** environ;

namespace {

int free_port() {
  int fd = ::socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  a.sin_port = 0;
  socklen_t len = sizeof(a);
  if (fd < 0 || ::bind(fd, reinterpret_cast<sockaddr*>(&a), sizeof(a)) != 0 ||
      ::getsockname(fd, reinterpret_cast<sockaddr*>(&a), &len) != 0)
    throw std::runtime_error("free_port: " + std::string(std::strerror(errno)));
  int port = ntohs(a.sin_port);
  ::close(fd);
  return port;
}

struct RankResult {
  int status = -1;  // exit code, or -signal, or -1000 on timeout
  std::string output;
};

// Spawns `world` ranks of the worker and waits for all (killing the ones still
// running at the deadline).
std::vector<RankResult> run_ranks(int world, const std::vector<std::string>& args, int timeout_s) {
  const std::string exe = std::string(SMP_BIN_DIR) + "/smp_tp_test_worker";
  char dir_tmpl[] = "/tmp/smp_tp_test_XXXXXX";
  std::string dir = ::mkdtemp(dir_tmpl);
  const int port = free_port();
  std::vector<pid_t> pids(world, -1);
  std::vector<RankResult> res(world);
  for (int r = 0; r < world; ++r) {
    std::vector<std::string> env;
    for (char** e = environ; *e; ++e) {
      std::string kv = *e;
      auto key = kv.substr(0, kv.find('='));
      if (key != "RANK" && key != "WORLD_SIZE" && key != "MASTER_ADDR" && key != "MASTER_PORT" &&
          key != "OMP_NUM_THREADS" && key != "LOCAL_RANK")
        env.push_back(kv);
    }
    env.push_back("RANK=" + std::to_string(r));
    env.push_back("LOCAL_RANK=" + std::to_string(r));
    env.push_back("WORLD_SIZE=" + std::to_string(world));
    env.push_back("MASTER_ADDR=127.0.0.1");
    env.push_back("MASTER_PORT=" + std::to_string(port));
    env.push_back("OMP_NUM_THREADS=1");
    std::vector<char*> envp, argv;
    for (auto& s : env) envp.push_back(s.data());
    envp.push_back(nullptr);
    std::vector<std::string> a{exe};
    a.insert(a.end(), args.begin(), args.end());
    for (auto& s : a) argv.push_back(s.data());
    argv.push_back(nullptr);

    std::string log = dir + "/rank" + std::to_string(r) + ".log";
    posix_spawn_file_actions_t fa;
    posix_spawn_file_actions_init(&fa);
    posix_spawn_file_actions_addopen(&fa, 1, log.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
    posix_spawn_file_actions_adddup2(&fa, 1, 2);
    int rc = posix_spawn(&pids[r], exe.c_str(), &fa, nullptr, argv.data(), envp.data());
    posix_spawn_file_actions_destroy(&fa);
    if (rc != 0) {
      res[r].output = "posix_spawn " + exe + ": " + std::strerror(rc);
      pids[r] = -1;
    }
  }
  auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(timeout_s);
  int left = 0;
  for (pid_t p : pids) left += p > 0;
  while (left > 0) {
    for (int r = 0; r < world; ++r) {
      if (pids[r] <= 0) continue;
      int st = 0;
      if (::waitpid(pids[r], &st, WNOHANG) == pids[r]) {
        res[r].status = WIFEXITED(st) ? WEXITSTATUS(st) : -WTERMSIG(st);
        pids[r] = -1, --left;
      }
    }
    if (left > 0 && std::chrono::steady_clock::now() > deadline) {
      for (int r = 0; r < world; ++r)
        if (pids[r] > 0) {
          ::kill(pids[r], SIGKILL);
          ::waitpid(pids[r], nullptr, 0);
          res[r].status = -1000;
          pids[r] = -1, --left;
        }
    }
    if (left > 0) std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  for (int r = 0; r < world; ++r) {
    std::string log = dir + "/rank" + std::to_string(r) + ".log";
    std::ifstream in(log);
    std::stringstream ss;
    ss << in.rdbuf();
    res[r].output += ss.str();
    std::remove(log.c_str());
  }
  ::rmdir(dir.c_str());
  return res;
}

struct Layout {
  int tp;
  bool sp;
};

void PrintTo(const Layout& l, std::ostream* os) { *os << "tp=" << l.tp << (l.sp ? " sequence-parallel" : ""); }

class TpLayers : public ::testing::TestWithParam<Layout> {};

TEST_P(TpLayers, MatchSerialLayersAndCommVolume) {
  const Layout l = GetParam();
  std::vector<std::string> args;
  if (l.sp) args.push_back("--sp");
  auto t0 = std::chrono::steady_clock::now();
  auto res = run_ranks(l.tp, args, 150);
  double secs = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  bool ok = true;
  for (auto& r : res) ok = ok && r.status == 0;
  if (!ok) {
    for (size_t r = 0; r < res.size(); ++r)
      ADD_FAILURE() << "rank " << r << " exited with " << res[r].status
                    << (res[r].status == -1000 ? " (killed at the timeout)" : "") << ", output:\n"
                    << res[r].output;
  } else {
    // rank 0's summary lines
    std::istringstream in(res[0].output);
    for (std::string line; std::getline(in, line);)
      if (line.find("checks,") != std::string::npos || line.find("GPT losses") != std::string::npos)
        std::printf("%s\n", line.c_str());
  }
  std::printf("tp=%d sp=%d: %zu ranks in %.1f s\n", l.tp, int(l.sp), res.size(), secs);
}

INSTANTIATE_TEST_SUITE_P(Layouts, TpLayers,
                         ::testing::Values(Layout{2, false}, Layout{2, true}, Layout{4, false}, Layout{4, true}),
                         [](const ::testing::TestParamInfo<Layout>& i) {
                           return "tp" + std::to_string(i.param.tp) + (i.param.sp ? "_sp" : "");
                         });

// ---- smp_tp.so through the ABI: kinds, rules and the rules' refusals ----
class TpPlugin : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    lib_ = ::dlopen((std::string(SMP_PLUGIN_DIR) + "/smp_tp.so").c_str(), RTLD_NOW | RTLD_LOCAL);
    ASSERT_NE(lib_, nullptr) << ::dlerror();
    auto entry = reinterpret_cast<smp_plugin_entry_fn>(::dlsym(lib_, SMP_PLUGIN_ENTRY_SYMBOL));
    ASSERT_NE(entry, nullptr);
    smp_error* err = nullptr;
    desc_ = entry(smp::host_api(), &err);
    ASSERT_NE(desc_, nullptr) << smp::consume_error(err);
  }
  const smp_rule* rule(const std::string& kind) {
    for (size_t i = 0; i < desc_->n_rules; ++i)
      if (kind == desc_->rules[i]->kind) return desc_->rules[i];
    return nullptr;
  }
  // "" when the rule accepts, else the error message.
  std::string check(const std::string& kind, const std::string& cfg, int tp) {
    const smp_rule* r = rule(kind);
    if (!r) return "no rule for " + kind;
    if (!r->check) return "";
    return smp::consume_error(r->check(r->state, cfg.c_str(), tp));
  }
  static void* lib_;
  static const smp_plugin_descriptor* desc_;
};
void* TpPlugin::lib_ = nullptr;
const smp_plugin_descriptor* TpPlugin::desc_ = nullptr;

TEST_F(TpPlugin, RegistersKindsAndRules) {
  std::vector<std::string> kinds;
  for (size_t i = 0; i < desc_->n_module_kinds; ++i) kinds.push_back(desc_->module_kinds[i]->name);
  for (const char* k : {"tp_linear", "column_parallel_linear", "row_parallel_linear", "vocab_parallel_embedding",
                        "vocab_parallel_cross_entropy", "parallel_attention", "parallel_mlp", "parallel_swiglu_mlp",
                        "parallel_transformer_layer", "dist_position_embedding", "dist_layer_norm", "dist_rms_norm", "dist_dropout",
                        "sharded_embedding_table", "dist_select", "parallel_moe"})
    EXPECT_NE(std::find(kinds.begin(), kinds.end(), k), kinds.end()) << k;
  const std::vector<std::pair<std::string, std::string>> want = {
      {"linear", "tp_linear"},
      {"embedding", "vocab_parallel_embedding"},
      {"cross_entropy", "vocab_parallel_cross_entropy"},
      {"attention", "parallel_attention"},
      {"mlp", "parallel_mlp"},
      {"swiglu_mlp", "parallel_swiglu_mlp"},
      {"transformer_layer", "parallel_transformer_layer"},
      {"position_embedding", "dist_position_embedding"},
      {"layer_norm", "dist_layer_norm"},
      {"rms_norm", "dist_rms_norm"},
      {"dropout", "dist_dropout"},
      {"embedding_table", "sharded_embedding_table"},
      {"select", "dist_select"},
      {"moe", "parallel_moe"}};
  // And on ep: moe -> parallel_moe, and parallel_moe (after the tp rule) stays.
  size_t ep_rules = 0;
  for (size_t i = 0; i < desc_->n_rules; ++i)
    if (std::string(desc_->rules[i]->axis) == "ep") {
      ++ep_rules;
      EXPECT_EQ(std::string(desc_->rules[i]->dist_kind), "parallel_moe");
    }
  EXPECT_EQ(ep_rules, 2u);
  // And on cp (the sequence axis, after tp): every tensor-parallel kind GPT uses keeps its kind.
  size_t cp_rules = 0;
  for (size_t i = 0; i < desc_->n_rules; ++i)
    if (std::string(desc_->rules[i]->axis) == "cp") {
      ++cp_rules;
      EXPECT_EQ(std::string(desc_->rules[i]->dist_kind), desc_->rules[i]->kind);
    }
  EXPECT_EQ(cp_rules, 15u);  // dist_select among them
  EXPECT_EQ(desc_->n_rules, want.size() + ep_rules + cp_rules);
  for (auto& [k, d] : want) {
    const smp_rule* r = rule(k);
    ASSERT_NE(r, nullptr) << k;
    EXPECT_EQ(std::string(r->dist_kind), d);
    EXPECT_NE(std::find(kinds.begin(), kinds.end(), d), kinds.end()) << d << " is a rule target but not a kind";
  }
}

TEST_F(TpPlugin, RuleChecksNameTheSizes) {
  EXPECT_EQ(check("attention", R"({"hidden": 24, "heads": 6})", 2), "");
  EXPECT_NE(check("attention", R"({"hidden": 24, "heads": 6})", 4).find("heads 6 not divisible by tp 4"),
            std::string::npos);
  EXPECT_NE(check("embedding", R"({"num": 250, "dim": 8})", 4).find("250 not divisible by tp 4"), std::string::npos);
  EXPECT_EQ(check("embedding", R"({"num": 256, "dim": 8})", 4), "");
  EXPECT_NE(check("transformer_layer", R"({"hidden": 16, "heads": 4, "ffn": 30})", 4).find("ffn 30 not divisible by tp 4"),
            std::string::npos);
  EXPECT_NE(check("transformer_layer", R"({"hidden": 16, "heads": 4})", 3).find("heads 4 not divisible by tp 3"),
            std::string::npos);
  EXPECT_NE(check("mlp", R"({"hidden": 10})", 3).find("ffn 40 not divisible by tp 3"), std::string::npos);
  EXPECT_NE(check("linear", R"({"in": 8, "out": 10})", 4).find("out 10 not divisible by tp 4"), std::string::npos);
  EXPECT_EQ(check("linear", R"({"in": 8, "out": 10, "tp_mode": "row"})", 4), "");
  EXPECT_NE(check("linear", R"({"in": 6, "out": 8, "tp_mode": "row"})", 4).find("in 6 not divisible by tp 4"),
            std::string::npos);
  EXPECT_NE(check("linear", R"({"in": 6, "out": 8, "tp_mode": "diagonal"})", 2).find("tp_mode"), std::string::npos);
  EXPECT_NE(check("embedding_table", R"({"num": 10, "dim": 4})", 4).find("num 10 not divisible by tp 4"),
            std::string::npos);
  // cross_entropy has nothing of its own to split: vocabulary-sharded logits come
  // from a producer whose rule checks the vocabulary (embedding, above); whole
  // logits, e.g. BERT's 2-class next-sentence head, take any tp.
  EXPECT_EQ(check("cross_entropy", R"({"vocab": 2})", 4), "");
  EXPECT_EQ(check("cross_entropy", "{}", 4), "");
  EXPECT_NE(check("attention", R"({"hidden": 24})", 2).find("'heads' is missing"), std::string::npos);
}

TEST_F(TpPlugin, CreateRefusesIndivisibleConfigNamingTheNode) {
  const smp_module_kind* k = nullptr;
  for (size_t i = 0; i < desc_->n_module_kinds; ++i)
    if (std::string(desc_->module_kinds[i]->name) == "parallel_attention") k = desc_->module_kinds[i];
  ASSERT_NE(k, nullptr);
  smp_module_context ctx{};
  ctx.struct_size = SMP_MODULE_CONTEXT_STRUCT_SIZE;
  ctx.node_name = "blocks.0.attn";
  smp_module* m = nullptr;
  std::string msg = smp::consume_error(k->create(k->state, R"({"hidden": 16})", &ctx, &m));
  EXPECT_NE(msg.find("blocks.0.attn"), std::string::npos) << msg;
  EXPECT_NE(msg.find("'heads'"), std::string::npos) << msg;
  // tp 1 works without a communicator
  ASSERT_EQ(smp::consume_error(k->create(k->state, R"({"hidden": 16, "heads": 4})", &ctx, &m)), "");
  k->destroy(m);
}

// ABI 2.5: the job's plugin tables reach a layer as the context's
// SMP_EXTENSION_JOB_TABLES; [tp] sequence_parallel is smp_tp's setting.
TEST(SdkModuleContext, ReadsTheJobsPluginTablesFromTheContextsExtension) {
  const std::string tables = R"({"tp": {"sequence_parallel": true}, "mem_c": {}})";
  smp_job_tables_extension ext{};
  ext.base.struct_size = SMP_JOB_TABLES_EXTENSION_STRUCT_SIZE;
  ext.base.type = SMP_EXTENSION_JOB_TABLES;
  ext.base.version = 1;
  ext.tables_json = tables.c_str();
  smp_module_context ctx{};
  ctx.struct_size = SMP_MODULE_CONTEXT_STRUCT_SIZE;
  ctx.parallel_json = "{}";
  ctx.extension_start = &ext.base;
  smp::sdk::ModuleContext m = smp::sdk::ModuleContext::from(&ctx);
  EXPECT_TRUE(m.table("tp").value("sequence_parallel", false));
  EXPECT_EQ(m.table("absent"), smp::sdk::Json::object());
  EXPECT_FALSE(m.sequence_parallel);  // one tp rank: nothing to split
  // A host of 2.4 fills a smaller context: there is no chain to read.
  ctx.struct_size = SMP_STRUCT_SIZE(smp_module_context, memory_json);
  EXPECT_EQ(smp::sdk::ModuleContext::from(&ctx).tables, smp::sdk::Json::object());
}

}  // namespace
