// smp::Options: typed setters that become the job's keys, in the order that
// lets a later choice win (the optimizer's implied keys, the program's
// setters, its arguments), checked by the one schema when the config is made.
#include <smp/options.h>

#include <smp/error.h>

#include <torch/optim/adam.h>
#include <torch/optim/adamw.h>
#include <torch/optim/sgd.h>

#include <cstdio>
#include <tuple>

namespace smp {

namespace {

std::string number(double v) {
  char buf[40];
  std::snprintf(buf, sizeof buf, "%.17g", v);
  std::string s = buf;
  // TOML needs a float to look like one ("1" would be an integer, "1e-3" is fine).
  if (s.find_first_of(".eEn") == std::string::npos) s += ".0";
  return s;
}

// TOML's basic string: quotes, backslashes and control characters escaped.
std::string quoted(const std::string& s) {
  std::string out = "\"";
  for (const char c : s) {
    if (c == '"' || c == '\\') {
      out += '\\';
      out += c;
    } else if (static_cast<unsigned char>(c) < 0x20) {
      char buf[8];
      std::snprintf(buf, sizeof buf, "\\u%04x", static_cast<unsigned>(c));
      out += buf;
    } else {
      out += c;
    }
  }
  return out + "\"";
}

ConfigOverride key(const std::string& name, const std::string& toml_value) { return {name + "=" + toml_value, ""}; }

std::vector<ConfigOverride> adam_keys(const char* what, double lr, std::tuple<double, double> betas, double eps,
                                      bool amsgrad) {
  if (amsgrad)
    throw Error(std::string("smp::Options::optimizer: torch::optim::") + what +
                ".amsgrad(true): smp's Adam has no AMSGrad variant; use amsgrad(false)");
  return {key("train.optimizer", "\"adamw\""), key("train.lr", number(lr)),
          key("optimizer.beta1", number(std::get<0>(betas))), key("optimizer.beta2", number(std::get<1>(betas))),
          key("optimizer.eps", number(eps))};
}

}  // namespace

Options Options::load(const std::string& path) {
  Config::load(path);  // read and checked now, so a bad file is named before anything else
  Options o;
  o.path_ = path;
  o.origin_ = path;
  return o;
}

Options Options::from_toml(const std::string& toml, const std::string& origin_name) {
  Options o;
  o.toml_ = toml;
  o.origin_ = origin_name;
  Config::from_string(toml, origin_name);  // checked now, naming the origin
  return o;
}

Options& Options::optimizer(const torch::optim::SGDOptions& o) {
  optimizer_ = {key("train.optimizer", "\"sgd\""), key("train.lr", number(o.lr())),
                key("optimizer.momentum", number(o.momentum())), key("optimizer.dampening", number(o.dampening())),
                key("optimizer.nesterov", o.nesterov() ? "true" : "false"),
                key("optimizer.l2", number(o.weight_decay())), key("train.weight_decay", "0.0")};
  return *this;
}

Options& Options::optimizer(const torch::optim::AdamOptions& o) {
  optimizer_ = adam_keys("AdamOptions", o.lr(), o.betas(), o.eps(), o.amsgrad());
  optimizer_.push_back(key("optimizer.l2", number(o.weight_decay())));
  optimizer_.push_back(key("train.weight_decay", "0.0"));
  return *this;
}

Options& Options::optimizer(const torch::optim::AdamWOptions& o) {
  optimizer_ = adam_keys("AdamWOptions", o.lr(), o.betas(), o.eps(), o.amsgrad());
  optimizer_.push_back(key("train.weight_decay", number(o.weight_decay())));
  optimizer_.push_back(key("train.weight_decay_on", "\"all\""));
  return *this;
}

Options& Options::batch_size(int64_t samples) { return set("train.batch_size", samples); }
Options& Options::steps(int64_t n) { return set("train.steps", n); }
Options& Options::seed(uint64_t s) {
  keys_.push_back(key("train.seed", std::to_string(s)));
  return *this;
}
Options& Options::grad_clip(double max_norm) { return set("train.grad_clip", max_norm); }
Options& Options::pipeline(int stages, int microbatches, const std::string& schedule) {
  return set("parallel.pp", stages).set("parallel.microbatches", microbatches).set("parallel.schedule", schedule);
}
Options& Options::tensor_parallel(int degree) { return set("parallel.tp", degree); }
Options& Options::zero(int stage) { return set("parallel.zero", stage); }
Options& Options::dir(const std::string& run_dir) { return set("run.dir", run_dir); }

Options& Options::set(const std::string& name, const std::string& value) {
  keys_.push_back(key(name, quoted(value)));
  return *this;
}
Options& Options::set(const std::string& name, int64_t value) {
  keys_.push_back(key(name, std::to_string(value)));
  return *this;
}
Options& Options::set(const std::string& name, double value) {
  keys_.push_back(key(name, number(value)));
  return *this;
}
Options& Options::set(const std::string& name, bool value) {
  keys_.push_back(key(name, value ? "true" : "false"));
  return *this;
}

Options& Options::args(int argc, const char* const* argv, int first) {
  for (int i = first; i < argc; ++i) args_.push_back({argv[i], ""});
  return *this;
}
Options& Options::args(const std::vector<std::string>& key_values) {
  for (const std::string& kv : key_values) args_.push_back({kv, ""});
  return *this;
}

Options& Options::example(Batch batch) {
  example_ = std::move(batch);
  return *this;
}

// The optimizer's keys first, then what the program set, then its
// arguments. Options made in code start from LibTorch's AdamW; a job file's
// own settings and defaults stand unless an optimizer is given here. Given
// here, the optimizer implies a constant learning rate and no clipping
// unless a key (the file's included) says otherwise.
Config Options::config() const {
  auto make = [this](const std::vector<ConfigOverride>& overrides) {
    return path_.empty() ? Config::from_string_labelled(toml_, origin_, overrides)
                         : Config::load_labelled(path_, overrides);
  };
  const bool from_file = !path_.empty() || !toml_.empty();
  std::vector<ConfigOverride> all = optimizer_;
  all.insert(all.end(), keys_.begin(), keys_.end());
  all.insert(all.end(), args_.begin(), args_.end());
  // LibTorch's AdamW unless the program names another optimizer by key.
  if (optimizer_.empty() && !from_file && make(all).get_string("train.optimizer") == "adamw") {
    Options adamw;
    adamw.optimizer(torch::optim::AdamWOptions());
    all.insert(all.begin(), adamw.optimizer_.begin(), adamw.optimizer_.end());
  }
  const Config given = make(all);
  if (from_file && optimizer_.empty()) return given;
  std::vector<ConfigOverride> implied;
  if (!given.has("train.grad_clip")) implied.push_back(key("train.grad_clip", "0.0"));
  if (!given.has("train.min_lr")) implied.push_back(key("train.min_lr", number(given.get_double("train.lr"))));
  if (implied.empty()) return given;
  implied.insert(implied.end(), all.begin(), all.end());
  return make(implied);
}

}  // namespace smp
