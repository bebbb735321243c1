// C++ optimizer kinds over the ABI (2.3's SMP_EXTENSION_OPTIMIZERS): derive
// from Optimizer, register with PluginBuilder::optimizer<T>("name").
//
//   class Sgd : public smp::sdk::Optimizer {
//    public:
//     explicit Sgd(const smp::sdk::OptimizerSetup& s);   // refuse unknown config keys
//     void step(const smp::sdk::OptimizerUpdate& u) override;
//     std::vector<smp::sdk::OptimizerState> state() override;  // e.g. {i, "momentum", buf[i]}
//   };
//
// The tensors it updates are the parameters, their fp32 masters or (ZeRO)
// this rank's 1-D shard segments of them: an update must be elementwise per
// tensor, or say in its docs what it needs. The host keeps the step count.
#pragma once

#include <smp/sdk/did_you_mean.hpp>
#include <smp/sdk/host.hpp>

#include <nlohmann/json.hpp>

#include <cstdint>
#include <initializer_list>
#include <string>
#include <vector>

namespace smp::sdk {

struct OptimizerSetup {
  nlohmann::json config = nlohmann::json::object();  // the job's [optimizer] table
  std::vector<at::Tensor> params;                     // what it updates, in place
  std::vector<bool> weight_decay;                     // per tensor: decay it (matrices)
  double weight_decay_rate = 0;                       // train.weight_decay (decoupled)
  std::string kind;                                   // the name it was registered under, for messages
};

struct OptimizerUpdate {
  std::vector<at::Tensor> grads;  // one per tensor; undefined = skip it; never changed
  double lr = 0;
  double grad_scale = 1;  // use grad_scale x grads[i]
  int64_t step = 1;       // updates so far, this one included
};

struct OptimizerState {
  size_t param;
  std::string name;  // "exp_avg", "momentum", ...
  at::Tensor tensor; // the live tensor, same shape as params[param]
};

class Optimizer {
 public:
  virtual ~Optimizer() = default;
  virtual void step(const OptimizerUpdate& update) = 0;
  virtual std::vector<OptimizerState> state() = 0;
};

// Reads key `key` of the [optimizer] table with errors naming "optimizer.<key>".
template <class T>
T optimizer_get(const OptimizerSetup& s, const char* key, T fallback) {
  if (!s.config.contains(key)) return fallback;
  try {
    return s.config.at(key).get<T>();
  } catch (const std::exception&) {
    throw Error(std::string("optimizer.") + key + ": wrong type for the " + s.kind + " optimizer: " +
                s.config.at(key).dump());
  }
}
// Refuses an [optimizer] key outside `known`, naming it and the known ones.
inline void expect_optimizer_keys(const OptimizerSetup& s, std::initializer_list<const char*> known) {
  for (auto it = s.config.begin(); it != s.config.end(); ++it) {
    bool ok = false;
    std::string names;
    for (const char* k : known) {
      ok = ok || it.key() == k;
      names += std::string(names.empty() ? "" : ", ") + k;
    }
    if (!ok)
      throw Error("optimizer." + it.key() + ": unknown key for the " + s.kind + " optimizer (known: " +
                  (names.empty() ? "none" : names) + ")" + did_you_mean(it.key(), known));
  }
}

namespace detail {

template <class T>
struct OptimizerKindTable {
  static smp_error* create(void* state, const smp_optimizer_create_args* a, smp_optimizer** out) {
    return guard([&] {
      OptimizerSetup s;
      s.kind = static_cast<const char*>(state);
      if (a->config_json && *a->config_json) s.config = nlohmann::json::parse(a->config_json);
      for (size_t i = 0; i < a->n_params; ++i) {
        s.params.push_back(aten(a->params[i]));
        s.weight_decay.push_back(a->weight_decay && a->weight_decay[i] != 0);
      }
      s.weight_decay_rate = a->weight_decay_rate;
      *out = reinterpret_cast<smp_optimizer*>(static_cast<Optimizer*>(new T(s)));
    });
  }
  static smp_error* step(smp_optimizer* o, const smp_optimizer_step_args* a) {
    return guard([&] {
      OptimizerUpdate u;
      u.grads.reserve(a->n_grads);
      for (size_t i = 0; i < a->n_grads; ++i) u.grads.push_back(a->grads[i] ? aten(a->grads[i]) : at::Tensor());
      u.lr = a->lr;
      u.grad_scale = a->grad_scale;
      u.step = a->step;
      reinterpret_cast<Optimizer*>(o)->step(u);
    });
  }
  static smp_error* state(smp_optimizer* o, smp_optimizer_state_visitor visit, void* user) {
    return guard([&] {
      for (const OptimizerState& s : reinterpret_cast<Optimizer*>(o)->state()) {
        TensorRef h(s.tensor);
        visit(user, s.param, s.name.c_str(), h.get());
      }
    });
  }
  static void destroy(smp_optimizer* o) { delete reinterpret_cast<Optimizer*>(o); }
};

}  // namespace detail
}  // namespace smp::sdk
