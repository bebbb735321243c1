// The public face of a runtime's Checkpointing: the runtime owns both (its
// pending save is waited for before the state goes), the program holds a
// reference.
#include <smp/checkpointer.h>

#include "checkpoint/checkpoint.h"
#include "runtime/checkpointer_impl.h"
#include "runtime/checkpointing.h"
#include "runtime/train_state.h"

#include <cstdlib>

namespace smp {

Checkpointer::Checkpointer(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}
Checkpointer::~Checkpointer() = default;

void Checkpointer::save(const std::string& path) { impl_->checkpoints->save(path); }
void Checkpointer::load(const std::string& path) { impl_->checkpoints->load(path); }
void Checkpointer::save_step() { impl_->checkpoints->save_step(); }
void Checkpointer::save_snapshot() { impl_->checkpoints->save_snapshot(); }
void Checkpointer::remove_snapshots() { impl_->checkpoints->remove_snapshots(); }
void Checkpointer::wait() { impl_->checkpoints->writer().wait(); }
std::string Checkpointer::resume() { return impl_->checkpoints->resume(); }
void Checkpointer::init_from(const std::string& path) { impl_->checkpoints->init_from(path); }
ResumePoint Checkpointer::resumed() const { return impl_->resumed; }
ResumePoint Checkpointer::resume_if_asked() {
  if (impl_->resume_done) return impl_->resumed;
  // Asked: run.resume or run.checkpoint_dir given (a run started twice in
  // one folder is two runs, not one continued; smp-worker asks), or a rank
  // smp-launch restarted (--max-restarts), which asks by being restarted.
  const char* restarts = std::getenv("SMP_RESTART_COUNT");
  const bool restarted = restarts && *restarts && std::string(restarts) != "0";
  impl_->resumed = impl_->checkpoints->resume_if_asked(restarted || impl_->asked);
  impl_->resume_done = true;
  return impl_->resumed;
}
std::string Checkpointer::dir() const { return impl_->checkpoints->dir(); }
double Checkpointer::blocking_seconds() const { return impl_->checkpoints->writer().last_blocking_seconds(); }
double Checkpointer::total_seconds() const { return impl_->checkpoints->writer().last_total_seconds(); }
int64_t Checkpointer::bytes() const { return impl_->checkpoints->writer().last_bytes(); }
std::vector<StateEntry> Checkpointer::entries() const { return impl_->state->entries(); }
void Checkpointer::load_entries(const std::vector<StateEntry>& entries) {
  impl_->checkpoints->writer().wait_for_snapshot();
  impl_->state->load(entries);
}

}  // namespace smp
