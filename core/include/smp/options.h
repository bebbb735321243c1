// A runtime's options in code (Runtime::create), in LibTorch's terms: the
// optimizer as LibTorch's own option classes, typed setters for the common
// keys, and any key of the job schema (docs/config-reference.md) by name.
// TOML is one way to make them (Options::load), a program's own "key=value"
// arguments another (Options::args).
//
//   smp::Options options;
//   options.optimizer(torch::optim::SGDOptions(0.05)).batch_size(32).args(argc, argv);
//   auto rt = smp::Runtime::create(options, smp::ProcessEnv::from_environment(), {model.plugin()});
//
// What differs from a job file's defaults, because a LibTorch program does not
// expect it: an optimizer given here has LibTorch's defaults, a constant
// learning rate (its lr; a scheduler in the program calls
// Runtime::set_learning_rate) and no gradient clipping, unless a key says
// otherwise (set before or after, or in the file); options made in code
// without an optimizer have LibTorch's AdamW, options from a job file its
// settings. A program's runtime resumes a checkpoint only when the program
// asks (run.resume, or a run.checkpoint_dir it names). Every value is checked
// by the schema when the runtime is made; a message names the key=value.
#pragma once

#include <smp/batch.h>
#include <smp/config.h>

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

namespace torch::optim {
struct SGDOptions;
struct AdamOptions;
struct AdamWOptions;
}  // namespace torch::optim

// Exported from libsmp_core (built with hidden visibility): the public API.
#pragma GCC visibility push(default)
namespace smp {

class Options {
 public:
  Options() = default;
  // A job file (TOML) as the starting point; the setters below apply on top.
  static Options load(const std::string& path);
  static Options from_toml(const std::string& toml, const std::string& origin_name = "options");

  // LibTorch's optimizers, with their options and defaults (weight_decay:
  // SGD's and Adam's added to the gradient of every parameter, AdamW's
  // decoupled and on every parameter). What smp's optimizers cannot do is
  // refused naming it (amsgrad). Sets train.optimizer, train.lr and the
  // optimizer's keys, and unless set otherwise a constant learning rate and
  // no clipping.
  Options& optimizer(const torch::optim::SGDOptions& o);
  Options& optimizer(const torch::optim::AdamOptions& o);
  Options& optimizer(const torch::optim::AdamWOptions& o);

  // The common keys, typed.
  Options& batch_size(int64_t samples);           // train.batch_size: the global batch of a step
  Options& steps(int64_t n);                      // train.steps: what the learning-rate schedule spans
  Options& seed(uint64_t seed);                   // train.seed
  Options& grad_clip(double max_norm);            // train.grad_clip (0: none)
  Options& pipeline(int stages, int microbatches, const std::string& schedule = "1f1b");  // parallel.pp/...
  Options& tensor_parallel(int degree);           // parallel.tp
  Options& zero(int stage);                       // parallel.zero (0-3)
  Options& dir(const std::string& run_dir);       // run.dir: logs, summary.json

  // Any key by name; the value as TOML writes it ("gpipe", 2, 0.5, true).
  Options& set(const std::string& key, const std::string& value);
  Options& set(const std::string& key, const char* value) { return set(key, std::string(value)); }
  Options& set(const std::string& key, int64_t value);
  Options& set(const std::string& key, int value) { return set(key, static_cast<int64_t>(value)); }
  Options& set(const std::string& key, double value);
  Options& set(const std::string& key, bool value);
  // The program's own "key=value" arguments, applied after everything else:
  // argv[first] .. argv[argc - 1]. A message names the argument at fault.
  Options& args(int argc, const char* const* argv, int first = 1);
  Options& args(const std::vector<std::string>& key_values);

  // A batch like those the program will pass to train_step (RuntimeOptions::example).
  Options& example(Batch batch);
  const Batch& example() const { return example_; }

  // The job configuration these make, checked; throws smp::Error naming the key=value.
  Config config() const;

 private:
  std::string path_;  // a job file, read when the config is made; else toml_
  std::string toml_, origin_ = "options";
  std::vector<ConfigOverride> optimizer_, keys_, args_;  // in this order: later ones win
  Batch example_;
};

}  // namespace smp
#pragma GCC visibility pop
