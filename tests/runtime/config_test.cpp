#include <smp/config.h>
#include <smp/error.h>
#include <smp/job_config.h>
#include <smp/mesh_spec.h>

#include <ATen/Context.h>
#include <torch/version.h>
#include <gtest/gtest.h>

#include "error_of.h"

#include <sys/wait.h>
#include <unistd.h>

#include <cstdlib>
#include <fstream>
#include <functional>
#include <thread>
#include <sstream>
#include <tuple>

namespace {

using smp::Config;

const std::string kData = SMP_RUNTIME_DATA;

// The smp::Error message thrown by f ("" when it doesn't throw).
std::string error_of(const std::function<void()>& f) { return smp_test::error_of<smp::Error>(f); }

#define EXPECT_ERROR(stmt, text)                                        \
  do {                                                                  \
    std::string msg_ = error_of([&] { stmt; });                         \
    EXPECT_NE(msg_, "") << "expected an smp::Error from: " #stmt;       \
    EXPECT_NE(msg_.find(text), std::string::npos) << "message: " << msg_; \
  } while (0)

TEST(ConfigTest, DefaultsFromAnEmptyFile) {
  Config c = Config::from_string("", "job.toml");
  EXPECT_EQ(c.get_int("parallel.pp"), 1);
  EXPECT_EQ(c.get_int("parallel.tp"), 1);
  EXPECT_EQ(c.get_int("parallel.microbatches"), 1);
  EXPECT_EQ(c.get_string("parallel.schedule"), "1f1b");
  EXPECT_EQ(c.get_int("parallel.virtual_stages"), 1);
  EXPECT_EQ(c.get_string("parallel.partition"), "balanced");
  EXPECT_EQ(c.get_string("parallel.placement"), "pp,dp,tp");
  EXPECT_ERROR(c.get_bool("parallel.sequence_parallel"), "it moved to tp.sequence_parallel");
  EXPECT_TRUE(c.get_bool("parallel.tie_across_stages"));
  EXPECT_EQ(c.get_int("train.steps"), 10);
  EXPECT_EQ(c.get_int("train.batch_size"), 8);
  EXPECT_EQ(c.get_int("train.seed"), 1234);
  EXPECT_DOUBLE_EQ(c.get_double("train.lr"), 3e-4);
  EXPECT_DOUBLE_EQ(c.get_double("train.min_lr"), 3e-5);
  EXPECT_EQ(c.get_int("train.warmup_steps"), 0);
  EXPECT_DOUBLE_EQ(c.get_double("train.weight_decay"), 0.1);
  EXPECT_DOUBLE_EQ(c.get_double("train.beta1"), 0.9);
  EXPECT_DOUBLE_EQ(c.get_double("train.beta2"), 0.95);
  EXPECT_DOUBLE_EQ(c.get_double("train.eps"), 1e-8);
  EXPECT_DOUBLE_EQ(c.get_double("train.grad_clip"), 1.0);
  EXPECT_EQ(c.get_int("train.val_every"), 0);
  EXPECT_EQ(c.get_int("train.val_batches"), 2);
  EXPECT_EQ(c.get_int("train.log_every"), 1);
  EXPECT_EQ(c.get_string("run.dir"), "runs/default");
  EXPECT_TRUE(c.get_bool("run.log_to_file"));
  EXPECT_DOUBLE_EQ(c.get_double("run.timeout_s"), 300.0);
  EXPECT_EQ(c.get_int("run.threads"), 0);
  EXPECT_EQ(c.get_string("run.device"), "auto");
  EXPECT_TRUE(c.get_string_array("plugins.paths").empty());
  EXPECT_EQ(c.section_json("model"), nlohmann::json::object());
  EXPECT_FALSE(c.has("train.steps"));
  // dp is derived from the world size.
  EXPECT_ERROR(c.get_int("parallel.dp"), "parallel.dp");
  c.resolve_layout(4);
  EXPECT_EQ(c.get_int("parallel.dp"), 4);
}

TEST(ConfigTest, LoadsAFileWithAliasesAndFreeTables) {
  Config c = Config::load(kData + "/job.toml");
  EXPECT_EQ(c.origin(), kData + "/job.toml");
  EXPECT_EQ(c.get_int("parallel.pp"), 2);
  EXPECT_EQ(c.get_string("parallel.schedule"), "1f1b");            // "interleaved" -> 1f1b
  EXPECT_EQ(c.get_string("parallel.placement"), "pp,tp,dp");       // "spread"
  EXPECT_DOUBLE_EQ(c.get_double("train.lr"), 1e-3);
  EXPECT_DOUBLE_EQ(c.get_double("train.grad_clip"), 0.0);          // integer accepted as a float
  EXPECT_DOUBLE_EQ(c.get_double("run.timeout_s"), 60.0);
  EXPECT_EQ(c.get_string_array("plugins.paths"), std::vector<std::string>{"libgpt.so"});
  EXPECT_EQ(c.get_int("model.hidden"), 64);
  EXPECT_EQ(c.get_string("model.name"), "gpt");
  EXPECT_TRUE(c.has("model.attention.heads"));
  auto model = c.section_json("model");
  EXPECT_EQ(model["attention"]["heads"], 4);
  EXPECT_EQ(model["attention"]["causal"], true);
  auto part = c.section_json("partition");
  EXPECT_EQ(part["strategy"], "balanced");
  EXPECT_DOUBLE_EQ(part["weights"][1].get<double>(), 2.5);
  c.resolve_layout(8);
  auto j = c.to_json();
  EXPECT_EQ(j["parallel"]["dp"], 2);
  EXPECT_EQ(j["parallel"]["schedule"], "1f1b");
  EXPECT_EQ(j["train"]["steps"], 20);
  EXPECT_EQ(j["train"]["seed"], 1234);  // default filled in
  EXPECT_EQ(j["model"]["hidden"], 64);
  EXPECT_EQ(j["run"]["device"], "auto");
}

TEST(ConfigTest, OverridesAreTomlValues) {
  Config c = Config::from_string("[train]\nsteps = 3\n[model]\nhidden = 32\n", "job.toml",
                                 {"train.steps=5", "parallel.schedule=gpipe", "model.hidden=64", "train.lr=1e-2",
                                  "run.dir=runs/x y", "parallel.placement=\"tp,pp,dp\"", "model.new.deep=true",
                                  "plugins.paths=[\"a.so\", \"b.so\"]", "tp.sequence_parallel=true",
                                  "parallel.schedule=simple"});
  EXPECT_EQ(c.get_int("train.steps"), 5);
  EXPECT_EQ(c.get_string("parallel.schedule"), "gpipe");  // "simple" -> gpipe
  EXPECT_EQ(c.get_int("model.hidden"), 64);
  EXPECT_DOUBLE_EQ(c.get_double("train.lr"), 1e-2);
  EXPECT_EQ(c.get_string("run.dir"), "runs/x y");
  EXPECT_EQ(c.get_string("parallel.placement"), "tp,pp,dp");
  EXPECT_TRUE(c.get_bool("model.new.deep"));
  EXPECT_EQ(c.get_string_array("plugins.paths"), (std::vector<std::string>{"a.so", "b.so"}));
  EXPECT_EQ(c.plugin_tables(), (nlohmann::json{{"tp", {{"sequence_parallel", true}}}}));  // for smp_tp to check
}

TEST(ConfigTest, UnknownKeys) {
  EXPECT_ERROR(Config::from_string("[train]\nstpes = 5\n", "job.toml"), "job.toml: unknown key 'train.stpes'");
  EXPECT_ERROR(Config::from_string("[train]\nstpes = 5\n", "job.toml"), "did you mean 'train.steps'");
  // A table the core does not own may be a plugin's: kept, and refused by name
  // once the plugins are loaded if none declares it (JobErrors.APluginTable*).
  EXPECT_EQ(Config::from_string("[trian]\nsteps = 5\n", "job.toml").plugin_tables(),
            (nlohmann::json{{"trian", {{"steps", 5}}}}));
  EXPECT_ERROR(Config::from_string("[Trian]\nsteps = 5\n", "job.toml"), "job.toml: unknown key 'Trian'");
  EXPECT_ERROR(Config::from_string("", "job.toml", {"parallel.sequence_parallel=true"}),
               "--set parallel.sequence_parallel=true: unknown key 'parallel.sequence_parallel': it moved to "
               "tp.sequence_parallel");
  EXPECT_ERROR(Config::from_string("steps = 5\n", "job.toml"), "job.toml: unknown key 'steps'");
  EXPECT_ERROR(Config::from_string("[train.sub]\nx = 1\n", "job.toml"), "job.toml: unknown key 'train.sub'");
  EXPECT_ERROR(Config::from_string("", "job.toml", {"train.stpes=5"}), "--set train.stpes=5: unknown key 'train.stpes'");
  EXPECT_ERROR(Config::from_string("", "job.toml", {"Foo.bar=1"}), "unknown key 'Foo.bar'");
  Config c = Config::from_string("", "job.toml");
  EXPECT_ERROR(c.get_int("train.stpes"), "job.toml: unknown key 'train.stpes'");
  EXPECT_ERROR(c.get_int("model.hidden"), "job.toml: model.hidden: missing");
}

TEST(ConfigTest, WrongTypes) {
  EXPECT_ERROR(Config::load(kData + "/bad_type.toml"),
               kData + "/bad_type.toml: parallel.pp: expected a positive integer, got \"two\"");
  EXPECT_ERROR(Config::from_string("[parallel]\npp = 0\n", "job.toml"),
               "job.toml: parallel.pp: expected a positive integer, got 0");
  EXPECT_ERROR(Config::from_string("[train]\nlr = \"fast\"\n", "job.toml"),
               "job.toml: train.lr: expected a number >= 0, got \"fast\"");
  EXPECT_ERROR(Config::from_string("[train]\nbeta1 = 1.5\n", "job.toml"), "job.toml: train.beta1: expected a number in [0, 1)");
  EXPECT_ERROR(Config::from_string("[run]\nlog_to_file = 1\n", "job.toml"),
               "job.toml: run.log_to_file: expected a boolean (true or false), got 1");
  EXPECT_ERROR(Config::from_string("[run]\ndevice = \"tpu\"\n", "job.toml"), "job.toml: run.device: expected one of");
  EXPECT_ERROR(Config::from_string("[plugins]\npaths = \"a.so\"\n", "job.toml"),
               "job.toml: plugins.paths: expected an array of strings");
  EXPECT_ERROR(Config::from_string("[plugins]\npaths = [1]\n", "job.toml"), "plugins.paths: expected an array of strings");
  EXPECT_ERROR(Config::from_string("model = 3\n", "job.toml"), "job.toml: model: expected a table");
  EXPECT_ERROR(Config::from_string("parallel = 3\n", "job.toml"), "job.toml: parallel: expected a table");
  EXPECT_ERROR(Config::from_string("[train]\nsteps = 1.5\n", "job.toml"),
               "job.toml: train.steps: expected a non-negative integer, got 1.5");
  Config c = Config::from_string("[model]\nhidden = \"big\"\n", "job.toml");
  EXPECT_ERROR(c.get_int("model.hidden"), "job.toml: model.hidden: expected an integer, got \"big\"");
}

TEST(ConfigTest, BadSet) {
  EXPECT_ERROR(Config::from_string("", "job.toml", {"train.steps"}), "--set train.steps: malformed override, expected key=value");
  EXPECT_ERROR(Config::from_string("", "job.toml", {"=5"}), "--set =5: malformed override");
  EXPECT_ERROR(Config::from_string("", "job.toml", {"train.steps=two"}),
               "--set train.steps=two: train.steps: expected a non-negative integer, got \"two\"");
  EXPECT_ERROR(Config::from_string("", "job.toml", {"parallel=3"}), "--set parallel=3: 'parallel' is a table");
  EXPECT_ERROR(Config::from_string("", "job.toml", {"train..steps=3"}), "malformed key");
}

TEST(ConfigTest, BadScheduleAndPlacement) {
  EXPECT_ERROR(Config::from_string("[parallel]\nschedule = \"pipedream\"\n", "job.toml"),
               "job.toml: parallel.schedule: expected one of \"gpipe\", \"1f1b\", \"interleaved-1f1b\", \"zb-h1\"");
  EXPECT_ERROR(Config::from_string("", "job.toml", {"parallel.schedule=pipedream"}),
               "--set parallel.schedule=pipedream: parallel.schedule: expected one of");
  EXPECT_ERROR(Config::from_string("[parallel]\nplacement = \"pp,pp,tp\"\n", "job.toml"),
               "job.toml: parallel.placement: expected a permutation of \"pp,dp,tp\"");
  EXPECT_ERROR(Config::from_string("[parallel]\nplacement = \"compact\"\n", "job.toml"), "got \"compact\"");
  Config c = Config::from_string("[parallel]\nplacement = \" tp , dp, pp\"\n", "job.toml");
  EXPECT_EQ(c.get_string("parallel.placement"), "tp,dp,pp");
  EXPECT_EQ(Config::from_string("[parallel]\nplacement = \"cluster\"\n", "job.toml").get_string("parallel.placement"),
            "pp,dp,tp");
  EXPECT_EQ(Config::from_string("[parallel]\nschedule = \"zb-h1\"\n", "job.toml").get_string("parallel.schedule"),
            "zb-h1");
}

TEST(ConfigTest, ImpossibleLayouts) {
  Config a = Config::from_string("[parallel]\npp = 2\ntp = 2\ndp = 2\n", "job.toml");
  EXPECT_ERROR(a.resolve_layout(4),
               "job.toml: parallel.pp * parallel.tp * parallel.dp = 2 * 2 * 2 = 8, but the world size is 4");
  Config b = Config::from_string("[parallel]\npp = 3\n", "job.toml");
  EXPECT_ERROR(b.resolve_layout(4), "job.toml: parallel.pp * parallel.tp = 3 * 1 = 3 does not divide the world size 4");
  Config ok = Config::from_string("[parallel]\npp = 2\ntp = 2\ndp = 1\n", "job.toml", {"train.batch_size=4"});
  EXPECT_NO_THROW(ok.resolve_layout(4));
  EXPECT_EQ(ok.get_int("parallel.dp"), 1);
  // Expert parallelism splits dp: ep must divide it.
  Config ep = Config::from_string("[parallel]\nep = 3\n", "job.toml");
  EXPECT_ERROR(ep.resolve_layout(4), "job.toml: parallel.ep = 3 must divide parallel.dp = 4");
  Config ep_ok = Config::from_string("[parallel]\nep = 2\n", "job.toml");
  EXPECT_NO_THROW(ep_ok.resolve_layout(4));
  EXPECT_EQ(ep_ok.get_int("parallel.ep"), 2);
}

// The job's own mesh dimensions: parallel.axes (a TOML table or --set per
// entry), placed just outside tp unless the placement names them; dp derived
// over all dimensions; names checked; flattened axes join dimensions.
// An error about a key a --set argument gave names that argument, not the
// file (a key given in the file still names the file).
TEST(ConfigTest, AnErrorAboutASetKeyNamesTheSetArgument) {
  Config a = Config::from_string("[parallel]\npp = 2\n", "job.toml", {"parallel.tp=2", "parallel.dp=2"});
  EXPECT_ERROR(a.resolve_layout(4), "--set parallel.tp=2: parallel.pp * parallel.tp * parallel.dp = 2 * 2 * 2 = 8");
  Config b = Config::from_string("[parallel]\nep = 3\n", "job.toml", {"train.steps=2"});
  EXPECT_ERROR(b.resolve_layout(4), "job.toml: parallel.ep = 3 must divide parallel.dp = 4");
  Config c = Config::from_string("", "job.toml", {"run.trace_merge=true"});
  c.resolve_layout(1);
  EXPECT_ERROR(smp::JobConfig::from(c), "--set run.trace_merge=true: run.trace_merge is set but run.trace is not true");
  Config d = Config::from_string("[model]\nhidden = \"big\"\n", "job.toml", {"model.hidden=\"huge\""});
  EXPECT_ERROR(d.get_int("model.hidden"), "--set model.hidden=\"huge\": model.hidden: expected an integer");
  EXPECT_EQ(d.origin_of("model.hidden"), "--set model.hidden=\"huge\"");
  EXPECT_EQ(d.origin_of("train.steps"), "job.toml");
}

TEST(ConfigTest, JobAxesAndFlattenedAxes) {
  Config c = Config::from_string("[parallel]\ntp = 2\n[parallel.axes]\ntok = 2\n", "job.toml",
                                 {"parallel.axes.sp=1", "parallel.flatten.dp_tok=[\"dp\", \"tok\"]"});
  c.resolve_layout(8);
  EXPECT_EQ(c.get_int("parallel.dp"), 2);
  EXPECT_EQ(c.get_string("parallel.placement"), "pp,dp,sp,tok,tp");
  smp::JobConfig j = smp::JobConfig::from(c);
  EXPECT_EQ(j.parallel.axes, (std::vector<std::pair<std::string, int>>{{"sp", 1}, {"tok", 2}}));
  ASSERT_EQ(j.parallel.flatten.size(), 1u);
  EXPECT_EQ(j.parallel.flatten[0].first, "dp_tok");
  EXPECT_EQ(j.parallel.flatten[0].second, (std::vector<std::string>{"dp", "tok"}));
  EXPECT_EQ(j.parallel_json.at("axes").at("tok"), 2);  // what adapters and modules see
  Config named = Config::from_string("[parallel]\nplacement = \"tok,pp,dp,tp\"\naxes = { tok = 4 }\n", "job.toml");
  named.resolve_layout(8);
  EXPECT_EQ(named.get_string("parallel.placement"), "tok,pp,dp,tp");
  EXPECT_EQ(named.get_int("parallel.dp"), 2);
  EXPECT_ERROR(Config::from_string("[parallel.axes]\nep = 2\n", "job.toml"),
               "job.toml: parallel.axes: expected a table of axis names");
  EXPECT_ERROR(Config::from_string("", "job.toml", {"parallel.axes.Cp=2"}), "parallel.axes: expected a table");
  EXPECT_ERROR(Config::from_string("", "job.toml", {"parallel.axes.cp=0"}), "to positive integers");
  Config undeclared = Config::from_string("[parallel]\nplacement = \"pp,cp,dp,tp\"\n", "job.toml");
  EXPECT_ERROR(undeclared.resolve_layout(4),
               "job.toml: parallel.placement names \"cp\", which is neither pp, dp, tp, cp (with parallel.cp > 1) nor an "
               "axis of parallel.axes");
  Config product = Config::from_string("[parallel]\ndp = 2\naxes = { tok = 2 }\n", "job.toml");
  EXPECT_ERROR(product.resolve_layout(8),
               "parallel.pp * parallel.tp * parallel.axes.tok * parallel.dp = 1 * 1 * 2 * 2 = 4, but the world size is 8");
  Config join = Config::from_string("[parallel.flatten]\ndp_xp = [\"dp\", \"xp\"]\n", "job.toml");
  EXPECT_ERROR(join.resolve_layout(2), "parallel.flatten.dp_xp: \"xp\" is not a dimension");
}

// parallel.cp: the sequence axis, a dimension "cp" just outside tp unless the
// placement names it; parallel.axes cannot declare it.
TEST(ConfigTest, ContextParallelAxis) {
  Config c = Config::from_string("[parallel]\ntp = 2\ncp = 2\n", "job.toml");
  c.resolve_layout(8);
  EXPECT_EQ(c.get_int("parallel.dp"), 2);
  EXPECT_EQ(c.get_string("parallel.placement"), "pp,dp,cp,tp");
  EXPECT_EQ(c.get_string("parallel.cp_mode"), "ring");
  smp::JobConfig j = smp::JobConfig::from(c);
  EXPECT_EQ(j.parallel.cp, 2);
  EXPECT_TRUE(j.parallel.axes.empty());
  Config named = Config::from_string("[parallel]\ncp = 4\nplacement = \"cp,pp,dp,tp\"\n", "job.toml");
  named.resolve_layout(8);
  EXPECT_EQ(named.get_string("parallel.placement"), "cp,pp,dp,tp");
  EXPECT_EQ(named.get_int("parallel.dp"), 2);
  Config one = Config::from_string("[parallel]\ncp = 1\n", "job.toml");
  one.resolve_layout(2);
  EXPECT_EQ(one.get_string("parallel.placement"), "pp,dp,tp");
  Config declared = Config::from_string("[parallel.axes]\ncp = 2\n", "job.toml");
  EXPECT_ERROR(declared.resolve_layout(2), "parallel.axes.cp: \"cp\" is the sequence axis, set by parallel.cp");
  Config product = Config::from_string("[parallel]\ncp = 4\ndp = 1\n", "job.toml");
  EXPECT_ERROR(product.resolve_layout(8),
               "parallel.pp * parallel.tp * parallel.cp * parallel.dp = 1 * 1 * 4 * 1 = 4, but the world size is 8");
  EXPECT_ERROR(Config::from_string("[parallel]\ncp_mode = \"ulysses\"\n", "job.toml"),
               "parallel.cp_mode: expected one of \"ring\", \"alltoall\"");
}

// A job's own axis given the sequence role (parallel.sequence_axes): a
// dimension like cp, in the one mesh description with that role; naming an
// axis parallel.axes does not declare is refused.
TEST(ConfigTest, AJobAxisWithTheSequenceRole) {
  Config c = Config::from_string("[parallel]\ntp = 2\nsequence_axes = [\"seq\"]\n[parallel.axes]\nseq = 2\n", "job.toml");
  c.resolve_layout(8);
  EXPECT_EQ(c.get_string("parallel.placement"), "pp,dp,seq,tp");
  EXPECT_EQ(c.get_int("parallel.dp"), 2);
  const smp::JobConfig j = smp::JobConfig::from(c);
  EXPECT_EQ(j.parallel.sequence_axes, (std::vector<std::string>{"seq"}));
  const smp::MeshSpec spec = smp::MeshSpec::from(j.parallel);
  EXPECT_EQ(spec.role("seq"), smp::Role::Sequence);
  EXPECT_EQ(spec.names_with(smp::Role::Sequence), (std::vector<std::string>{"seq"}));
  Config undeclared = Config::from_string("[parallel]\nsequence_axes = [\"seq\"]\n", "job.toml");
  EXPECT_ERROR(undeclared.resolve_layout(1),
               "parallel.sequence_axes names \"seq\", which is not an axis of parallel.axes");
  EXPECT_ERROR(Config::from_string("", "job.toml", {"parallel.axes.edp=2"}), "parallel.axes: expected a table");
}

// The typed structs and the schema come from one list (config_keys.h): a
// default-constructed JobConfig is what an empty job file reads as, field by
// field, for every key of the lists.
TEST(ConfigTest, TheTypedDefaultsAreTheSchemas) {
  Config c = Config::from_string("", "job.toml");
  c.resolve_layout(1);
  smp::JobConfig from = smp::JobConfig::from(c), typed;
  typed.run.device = from.run.device;  // "auto", resolved by JobConfig::from
  int fields = 0;
#define SMP_CHECK_FIELD(field, key, type, check, def, presence, doc) \
  EXPECT_TRUE(from_group.field == typed_group.field) << key;          \
  ++fields;
#define SMP_CHECK_TABLE(name, list)          \
  {                                          \
    const auto& from_group = from.name;      \
    const auto& typed_group = typed.name;    \
    list(SMP_CHECK_FIELD)                    \
  }
  SMP_CONFIG_TABLES(SMP_CHECK_TABLE)
#undef SMP_CHECK_TABLE
#undef SMP_CHECK_FIELD
  EXPECT_EQ(fields, 73);  // every key of the reference
  EXPECT_EQ(smp::Config::reference().find("parallel.sequence_parallel"), std::string::npos);
}

// parallel.layout: "manual" and "planned" resolve; "auto" is the launcher's
// to resolve (smp-plan is not in the core), so a process asked to resolve it
// refuses naming the key; anything else is refused by the schema.
TEST(ConfigTest, AnAutoLayoutIsTheLaunchersToResolve) {
  for (const char* mode : {"manual", "planned"}) {
    Config c = Config::from_string(std::string("[parallel]\nlayout = \"") + mode + "\"\n", "job.toml");
    c.resolve_layout(2);
    EXPECT_EQ(c.get_int("parallel.dp"), 2) << mode;
  }
  Config c = Config::from_string("[parallel]\nlayout = \"auto\"\ncluster = \"dgx-h100\"\n", "job.toml");
  EXPECT_ERROR(c.resolve_layout(2), "job.toml: parallel.layout = \"auto\" is resolved by smp-launch");
  EXPECT_ERROR(Config::from_string("[parallel]\nlayout = \"fastest\"\n", "job.toml"),
               "parallel.layout: expected one of \"manual\", \"auto\", \"planned\"");
}

TEST(ConfigTest, JobConfigIsTheTypedConfig) {
  Config c = Config::from_string("[parallel]\ntp = 2\nep = 1\n[train]\nlr = 0.5\nbucket_mb = 2\n[model]\nadapter = \"gpt\"\nlayers = 3\n",
                                 "job.toml", {"run.threads=1"});
  c.resolve_layout(4);
  smp::JobConfig j = smp::JobConfig::from(c);
  EXPECT_EQ(j.parallel.tp, 2);
  EXPECT_EQ(j.parallel.dp, 2);
  EXPECT_EQ(j.parallel.ep, 1);
  EXPECT_DOUBLE_EQ(j.train.lr, 0.5);
  EXPECT_EQ(j.train.bucket_bytes(), 2 << 20);
  EXPECT_EQ(j.run.threads, 1);
  EXPECT_EQ(j.adapter, "gpt");
  EXPECT_EQ(j.model, (nlohmann::json{{"layers", 3}}));  // the adapter sees [model] without "adapter"
  EXPECT_EQ(j.parallel_json.at("tp"), 2);
  EXPECT_EQ(j.run.device, smp::DeviceKind::Cpu);  // "auto"
}

// train.bucket_mb by device unless given: 4 MiB on the CPU, 25 on CUDA (the
// CUDA default is not reachable here without a GPU: the job refuses "cuda").
TEST(ConfigTest, TheBucketSizeDefaultsByDevice) {
  Config cpu = Config::from_string("[run]\ndevice = \"cpu\"\n", "job.toml");
  cpu.resolve_layout(1);
  EXPECT_EQ(smp::JobConfig::from(cpu).train.bucket_bytes(), 4 << 20);
  EXPECT_FALSE(cpu.has("train.bucket_mb"));
  Config given = Config::from_string("[run]\ndevice = \"cpu\"\n[train]\nbucket_mb = 25\n", "job.toml");
  given.resolve_layout(1);
  EXPECT_EQ(smp::JobConfig::from(given).train.bucket_bytes(), 25 << 20);
  if (at::hasCUDA()) {
    Config cuda = Config::from_string("[run]\ndevice = \"cuda\"\n", "job.toml");
    cuda.resolve_layout(1);
    EXPECT_EQ(smp::JobConfig::from(cuda).train.bucket_bytes(), 25 << 20);
  }
}

TEST(ConfigTest, CudaDeviceWithoutCudaNamesTheKey) {
  if (at::hasCUDA()) GTEST_SKIP() << "this build has CUDA";
  Config c = Config::from_string("[run]\ndevice = \"cuda\"\n", "job.toml");
  c.resolve_layout(1);
  EXPECT_ERROR(smp::JobConfig::from(c), "job.toml: run.device = \"cuda\", but this smp build has no usable CUDA");
}

TEST(ConfigTest, PrecisionKeys) {
  auto job = [](const std::string& toml) {
    Config c = Config::from_string(toml, "job.toml");
    c.resolve_layout(1);
    return smp::JobConfig::from(c);
  };
  smp::JobConfig d = job("");
  EXPECT_EQ(d.train.precision, smp::Precision::Fp32);
  EXPECT_EQ(d.train.grad_reduce_dtype, smp::Precision::Fp32);
  smp::JobConfig bf = job("[train]\nprecision = \"bf16\"\ngrad_reduce_dtype = \"bf16\"\n");
  EXPECT_EQ(bf.train.precision, smp::Precision::Bf16);
  EXPECT_EQ(bf.train.grad_reduce_dtype, smp::Precision::Bf16);
  const std::string fp16 = "[train]\nprecision = \"fp16\"\ninitial_loss_scale = 1024.0\nloss_scale_window = 5\n";
#if TORCH_VERSION_MAJOR >= 2
  smp::JobConfig fp = job(fp16);
  EXPECT_DOUBLE_EQ(fp.train.initial_loss_scale, 1024);
  EXPECT_EQ(fp.train.loss_scale_window, 5);
#else
  // No fp16 GEMM on LibTorch 1's CPU: refused before any rank starts.
  EXPECT_ERROR(job(fp16), "job.toml: train.precision = \"fp16\" on the CPU needs LibTorch 2 or later");
#endif
  EXPECT_ERROR(job("[train]\nprecision = \"fp8\"\n"), "train.precision");
  EXPECT_ERROR(job("[train]\nprecision = \"bf16\"\ngrad_reduce_dtype = \"fp16\"\n"),
               "job.toml: train.grad_reduce_dtype = \"fp16\": gradients are reduced in fp32 or in the compute dtype "
               "(train.precision = \"bf16\")");
  EXPECT_ERROR(job("[train]\nprecision = \"bf16\"\ninitial_loss_scale = 1024.0\n"),
               "job.toml: train.initial_loss_scale is only used with train.precision = \"fp16\" (this job: \"bf16\")");
  EXPECT_ERROR(job("[train]\nloss_scale_window = 10\n"), "train.loss_scale_window is only used with");
  EXPECT_ERROR(job("[train]\nprecision = \"fp16\"\ninitial_loss_scale = 8.0\nmin_loss_scale = 16.0\n"),
               "train.min_loss_scale (16");
}

TEST(ConfigTest, CudaOnlyKeysOnACpuJobAreErrors) {
  auto job = [](const std::string& toml) {
    Config c = Config::from_string(toml, "job.toml");
    c.resolve_layout(1);
    return smp::JobConfig::from(c);
  };
  EXPECT_ERROR(job("[run]\ndevice = \"cpu\"\ndevices = [0]\n"),
               "job.toml: run.devices is set but the job runs on the CPU (run.device = \"cpu\")");
  EXPECT_ERROR(job("[run]\ndevice = \"cpu\"\n[comm]\ncuda_backend = \"gloo\"\n"),
               "job.toml: comm.cuda_backend is set but the job runs on the CPU");
  EXPECT_ERROR(job("[comm]\ncuda_backend = \"mpi\"\n"), "comm.cuda_backend");
  EXPECT_ERROR(job("[comm]\np2p_semantics = \"eager\"\n"), "comm.p2p_semantics: expected one of \"buffered\", \"rendezvous\"");
  EXPECT_ERROR(job("[run]\ndevices = [0, \"one\"]\n"), "run.devices");
}

TEST(ConfigTest, BatchNotDivisible) {
  Config c = Config::from_string("[parallel]\nmicrobatches = 4\n[train]\nbatch_size = 10\n", "job.toml");
  EXPECT_ERROR(c.resolve_layout(2),
               "job.toml: train.batch_size = 10 is not divisible by parallel.dp * parallel.microbatches = 2 * 4 = 8");
  Config ok = Config::from_string("[parallel]\nmicrobatches = 4\n[train]\nbatch_size = 16\n", "job.toml");
  EXPECT_NO_THROW(ok.resolve_layout(2));
}

TEST(ConfigTest, ScheduleRules) {
  Config vs = Config::from_string("[parallel]\nvirtual_stages = 2\n", "job.toml");
  EXPECT_ERROR(vs.resolve_layout(1), "job.toml: parallel.virtual_stages = 2 needs parallel.schedule = \"interleaved-1f1b\"");
  Config il = Config::from_string("[parallel]\npp = 2\nschedule = \"interleaved-1f1b\"\nvirtual_stages = 2\n"
                                  "microbatches = 3\n[train]\nbatch_size = 6\n",
                                  "job.toml");
  EXPECT_ERROR(il.resolve_layout(2), "needs parallel.microbatches (3) to be a multiple of parallel.pp (2)");
  Config good = Config::from_string("[parallel]\npp = 2\nschedule = \"interleaved-1f1b\"\nvirtual_stages = 2\n"
                                    "microbatches = 4\n",
                                    "job.toml");
  EXPECT_NO_THROW(good.resolve_layout(2));
}

// A pipeline message's tag holds the microbatch in 12 bits and the chunk in 4:
// beyond that two messages between a pair of ranks would share a tag, so such
// a job is refused at config time, naming the key; the limits themselves run.
TEST(ConfigTest, PipelineTagLimits) {
  Config many = Config::from_string("[parallel]\npp = 2\nmicrobatches = 4100\n[train]\nbatch_size = 4100\n", "job.toml");
  EXPECT_ERROR(many.resolve_layout(2), "job.toml: parallel.microbatches = 4100: at most 4096");
  Config most = Config::from_string("[parallel]\npp = 2\nmicrobatches = 4096\n[train]\nbatch_size = 4096\n", "job.toml");
  EXPECT_NO_THROW(most.resolve_layout(2));
  Config chunks = Config::from_string("[parallel]\npp = 2\nschedule = \"interleaved-1f1b\"\nvirtual_stages = 17\n"
                                      "microbatches = 4\n", "job.toml");
  EXPECT_ERROR(chunks.resolve_layout(2), "job.toml: parallel.virtual_stages = 17: at most 16");
  Config sixteen = Config::from_string("[parallel]\npp = 2\nschedule = \"interleaved-1f1b\"\nvirtual_stages = 16\n"
                                       "microbatches = 4\n", "job.toml");
  EXPECT_NO_THROW(sixteen.resolve_layout(2));
}

TEST(ConfigTest, FileErrors) {
  EXPECT_ERROR(Config::load(kData + "/does_not_exist.toml"), kData + "/does_not_exist.toml: cannot open");
  EXPECT_ERROR(Config::from_string("[train\nsteps = 1\n", "job.toml"), "job.toml:1:");
  EXPECT_ERROR(Config::from_string("[train]\nsteps = = 1\n", "job.toml"), "job.toml:2:");
}

// docs/config-reference.md is the schema rendered (smp-worker --config-reference):
// a key added, removed or changed without regenerating it fails here.
TEST(ConfigTest, ReferenceDocIsTheSchemaRendered) {
  std::ifstream in(std::string(SMP_SOURCE_DIR) + "/docs/config-reference.md");
  ASSERT_TRUE(in) << "docs/config-reference.md is missing";
  std::stringstream doc;
  doc << in.rdbuf();
  EXPECT_EQ(doc.str(), smp::Config::reference())
      << "docs/config-reference.md differs from the schema: regenerate it with "
         "build/bin/smp-worker --config-reference > docs/config-reference.md";
  for (const char* key : {"`parallel.zero`", "`train.optimizer`", "`run.trace_steps`", "`comm.shm_mb`"})
    EXPECT_NE(doc.str().find(key), std::string::npos) << key;
}

// Issue 51: a job file nested past the bound (10^5 table headers, a dotted
// key of 10^5 parts, inline tables or arrays inside each other) is refused
// naming the file and the line before toml++ parses it: parsed, it overflowed
// the stack of the worker, smp-plan and smp-launch --plan.
std::string repeated(const std::string& part, int n) {
  std::string out;
  for (int i = 0; i < n; ++i) out += part;
  return out;
}

TEST(ConfigTest, TomlNestedPastTheBoundIsRefusedNamingTheFileAndLine) {
  const int n = 100000;
  const std::vector<std::pair<std::string, std::string>> cases = {
      {"[model]\nx = 1\n[a" + repeated(".a", n) + "]\n", "job.toml:3: nested deeper than 32 levels"},
      {"[model]\nx = 1\n[[a" + repeated(".a", n) + "]]\n", "job.toml:3: nested deeper than 32 levels"},
      {"[model]\nx = 1\n\na" + repeated(".a", n) + " = 1\n", "job.toml:4: nested deeper than 32 levels"},
      {"[model]\nx = " + repeated("{a = ", n) + "1" + repeated("}", n) + "\n", "job.toml:2: nested deeper"},
      {"[model]\nx = " + repeated("[", n) + repeated("]", n) + "\n", "job.toml:2: nested deeper"},
      {"[model]\nx = " + repeated("[{a = ", n) + "\n", "job.toml:2: nested deeper"},
      // Dotted keys inside inline tables under a header: the levels add up.
      {"[model" + repeated(".m", 10) + "]\nx = {a" + repeated(".a", 10) + " = [[[[[[[[[[[[1]]]]]]]]]]]]}\n",
       "job.toml:2: nested deeper than 32 levels"},
  };
  for (const auto& [text, message] : cases) EXPECT_ERROR(Config::from_string(text, "job.toml"), message);
  // What nests within the bound, strings and comments full of brackets, dots
  // and quotes included, reads as before.
  const Config c = Config::from_string(
      "[model.a.b]\nx = [[1, 2], [3]]\ny = {p = {q = 1}}\ns = \"[[[{{{a.b.c\\\"\"\n"
      "m = \"\"\"\n[[[[\n\"\"\"\"\nl = '''a.b.c]]]}}'''\n# [[[[a.a.a.a\n[[model.rows]]\nk = 'x[y'\n",
      "job.toml");
  EXPECT_EQ(c.to_json()["model"]["a"]["b"]["m"], "[[[[\n\"");
  // From a file: the path is named; a --set value is bounded as well.
  const std::string dir = ::testing::TempDir() + "/smp-config-deep-" + std::to_string(::getpid());
  ASSERT_EQ(std::system(("mkdir -p " + dir).c_str()), 0);
  std::ofstream(dir + "/deep.toml") << "[train]\nsteps = 1\n" << "a" << repeated(".a", n) << " = 1\n";
  EXPECT_ERROR(Config::load(dir + "/deep.toml"), dir + "/deep.toml:3: nested deeper than 32 levels");
  EXPECT_ERROR(Config::from_string("", "job.toml", {"model.x=" + repeated("[", n)}), "--set model.x=[[[[");
  EXPECT_ERROR(Config::from_string("", "job.toml", {"model" + repeated(".a", n) + "=1"}),
               "more than 32 dotted parts");
  std::system(("rm -rf " + dir).c_str());
}

// A named pipe given as the job file is refused as not a regular file; read,
// it blocked the worker forever. Run in a child that an alarm ends, so that a
// regression fails here instead of hanging the suite.
TEST(ConfigTest, ANamedPipeAsTheJobFileIsRefusedNotWaitedOn) {
  const std::string dir = ::testing::TempDir() + "/smp-config-fifo-" + std::to_string(::getpid());
  ASSERT_EQ(std::system(("rm -rf " + dir + " && mkdir -p " + dir + " && mkfifo " + dir + "/job.toml").c_str()), 0);
  const pid_t child = ::fork();
  ASSERT_GE(child, 0);
  if (child == 0) {
    ::alarm(20);
    const std::string said = error_of([&] { Config::load(dir + "/job.toml"); });
    ::_exit(said.find(dir + "/job.toml is a named pipe, not a regular file") != std::string::npos ? 0 : 3);
  }
  int status = 0;
  ASSERT_EQ(::waitpid(child, &status, 0), child);
  EXPECT_TRUE(WIFEXITED(status)) << "the reader hung on the named pipe (ended by signal " << WTERMSIG(status) << ")";
  if (WIFEXITED(status)) EXPECT_EQ(WEXITSTATUS(status), 0) << "refused without naming the pipe";
  std::system(("rm -rf " + dir).c_str());
}

// comm.shm_mb is made bytes in an int64_t: 1e300 overflowed (and 1e-300 made
// 0), silently turning shared memory off. Refused naming the key.
TEST(ConfigTest, ShmMbOutsideItsRangeIsRefusedNamingTheKey) {
  for (const char* v : {"1e300", "65537", "1e-300", "-1", "inf", "nan"})
    EXPECT_ERROR(Config::from_string(std::string("[comm]\nshm_mb = ") + v + "\n", "job.toml"),
                 "job.toml: comm.shm_mb: expected 0 (everything through Gloo) or a number of MiB in [0.001, 65536]");
  for (const char* v : {"0", "0.001", "16", "65536"}) {
    const Config c = Config::from_string(std::string("[comm]\nshm_mb = ") + v + "\n", "job.toml");
    EXPECT_DOUBLE_EQ(c.get_double("comm.shm_mb"), std::stod(v));
  }
  EXPECT_EQ(smp::JobConfig::from(Config::from_string("[comm]\nshm_mb = 65536\n", "job.toml")).comm.shm_slot_bytes(),
            int64_t{65536} << 20);
}

// An int key holds what an int holds: 2^40 threads or tensor-parallel ranks
// wrapped when JobConfig read them.
TEST(ConfigTest, IntKeysPastAnIntAreRefusedNamingTheKey) {
  EXPECT_ERROR(Config::from_string("[parallel]\ntp = 1099511627776\n", "job.toml"),
               "job.toml: parallel.tp: expected a positive integer of at most 2147483647, got 1099511627776");
  EXPECT_ERROR(Config::from_string("", "job.toml", {"run.threads=4294967297"}),
               "run.threads: expected a non-negative integer of at most 2147483647");
  EXPECT_EQ(Config::from_string("[train]\nsteps = 1099511627776\n", "job.toml").get_int("train.steps"),
            int64_t{1} << 40);  // an int64_t key
}

// run.threads above the machine's cores is refused (100,000 threads made no
// progress) unless run.threads_oversubscribe = true, as MPI's --oversubscribe.
TEST(ConfigTest, RunThreadsAboveTheCoresIsRefusedUnlessOversubscribed) {
  const unsigned cores = std::thread::hardware_concurrency();
  if (cores == 0) GTEST_SKIP() << "this machine does not say how many cores it has";
  const std::string over = "run.threads=" + std::to_string(cores + 1);
  EXPECT_ERROR(smp::JobConfig::from(Config::from_string("", "job.toml", {over})),
               "--set " + over + ": run.threads = " + std::to_string(cores + 1) + " is more than this machine's " +
                   std::to_string(cores) + " cores");
  EXPECT_ERROR(smp::JobConfig::from(Config::from_string("[run]\nthreads = 100000\n", "job.toml")),
               "job.toml: run.threads = 100000 is more than this machine's");
  const smp::JobConfig forced =
      smp::JobConfig::from(Config::from_string("[run]\nthreads = 100000\nthreads_oversubscribe = true\n", "job.toml"));
  EXPECT_EQ(forced.run.threads, 100000);
  EXPECT_EQ(smp::JobConfig::from(Config::from_string("", "job.toml", {"run.threads=" + std::to_string(cores)}))
                .run.threads,
            static_cast<int>(cores));
  EXPECT_ERROR(smp::JobConfig::from(Config::from_string("[run]\nthreads_oversubscribe = true\n", "job.toml")),
               "run.threads_oversubscribe is set but run.threads is not");
}

}  // namespace
