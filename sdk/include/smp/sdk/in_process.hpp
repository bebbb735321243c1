// A plugin defined in the program itself: no shared object, no dlopen.
//
//   smp::sdk::InProcessPlugin mine(std::move(smp::sdk::PluginBuilder("mine", "1.0").module<MyLayer>("my_layer")));
//   auto rt = smp::Runtime::create(config, env, {mine});   // beside names and paths
//
// The core calls its entry like a file's exported smp_plugin_entry and checks
// the descriptor the same way (ABI version, LibTorch version, capabilities):
// only the loading differs.
#pragma once

#include <smp/sdk/plugin.hpp>

#include <functional>
#include <memory>
#include <string>
#include <utility>

namespace smp::sdk {

class InProcessPlugin {
 public:
  using Entry = std::function<const smp_plugin_descriptor*(const smp_host_api*, smp_error**)>;

  // label: how messages and PluginInfo::path name it ("in process: <label>"); the builder's name by default.
  explicit InProcessPlugin(PluginBuilder builder, std::string label = "")
      : state_(std::make_shared<State>(std::move(builder))), label_(std::move(label)) {
    if (label_.empty()) label_ = state_->builder.descriptor_name();
  }

  const std::string& label() const { return label_; }

  // The entry function; it keeps the plugin alive as long as the core holds it.
  Entry entry() const {
    std::shared_ptr<State> s = state_;
    return [s](const smp_host_api* host, smp_error** error) -> const smp_plugin_descriptor* {
      using detail::HostCheck;
      const HostCheck verdict = detail::check_host(host, error);
      if (verdict == HostCheck::Refuse) return nullptr;
      try {
        if (!s->descriptor) s->descriptor = s->builder.descriptor();
        if (verdict == HostCheck::OtherMajor) return s->descriptor;
        if (!detail::has_required_extensions(s->builder, host, error)) return nullptr;
        return s->descriptor;
      } catch (const std::exception& e) {
        if (error && verdict == HostCheck::Accept)
          *error = host->error_create(SMP_ERR_INTERNAL, plugin_exception_message(e).c_str());
        return nullptr;
      }
    };
  }

  // For tests of the host's checks: the descriptor as built, to be altered
  // before the core sees it (another ABI major, another LibTorch).
  smp_plugin_descriptor* descriptor_for_test() {
    if (!state_->descriptor) state_->descriptor = state_->builder.descriptor();
    return const_cast<smp_plugin_descriptor*>(state_->descriptor);
  }

 private:
  struct State {
    explicit State(PluginBuilder b) : builder(std::move(b)) {}
    PluginBuilder builder;
    const smp_plugin_descriptor* descriptor = nullptr;  // built once, on the first call
  };
  std::shared_ptr<State> state_;
  std::string label_;
};

}  // namespace smp::sdk
