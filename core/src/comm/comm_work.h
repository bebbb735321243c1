// What an op hands back (smp::Work over a transport's pending work) and how
// its failure is told: every error names the axis, the group, the op and the
// ranks (GroupContext), whichever transport or wait failed.
#pragma once

#include <smp/error.h>

#include "comm/c10d_compat.h"
#include "comm/communicator.h"

#include <functional>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

namespace smp {

std::string join_ranks(const std::vector<int>& v);  // "[0, 2, 4]"

// Who we are, for messages; shared by every Work so it outlives nothing.
struct GroupContext {
  std::string axis, name;
  std::vector<int> ranks;
  int rank = 0;
  int64_t timeout_ms = 0;

  std::string where(const std::string& op) const;
  // "communication error: <op> on axis ... failed[ (timed out; timeout N ms)]: <message>"
  Error failure(const std::string& op, const std::string& message, bool timed_out) const;
  Error invalid(const std::string& op, const std::string& what) const;
};

// What a trace shows of an operation: its kind ("allreduce") and bytes, and
// when it was issued (-1: not traced).
struct TraceTag {
  std::string kind;
  int64_t bytes = 0;
  int64_t issued_us = -1;
};

// Waits for `inner` (null: nothing in flight), then runs `finish` (copies a
// staged result back, reduces an emulated reduce-scatter's parts). Every
// failure becomes one smp::Error from GroupContext::failure / where.
class CommWork final : public Work {
 public:
  CommWork(std::shared_ptr<const GroupContext> ctx, std::string op, std::shared_ptr<c10d_compat::PendingWork> inner,
           std::function<void()> finish, TraceTag tag = {})
      : ctx_(std::move(ctx)), op_(std::move(op)), inner_(std::move(inner)), finish_(std::move(finish)),
        tag_(std::move(tag)) {}
  void wait() override;
  bool ready() override;

 private:
  void run_once();
  std::shared_ptr<const GroupContext> ctx_;
  std::string op_;
  std::shared_ptr<c10d_compat::PendingWork> inner_;
  std::function<void()> finish_;
  TraceTag tag_;
  std::mutex mu_;
  bool done_ = false;
  std::exception_ptr error_;
};

// An operation run on host copies of CUDA tensors: once it completed, `then`
// copies the result back to the device.
class ThenWork final : public Work {
 public:
  ThenWork(std::shared_ptr<Work> inner, std::function<void()> then) : inner_(std::move(inner)), then_(std::move(then)) {}
  void wait() override;
  bool ready() override { return inner_->ready(); }

 private:
  std::shared_ptr<Work> inner_;
  std::function<void()> then_;
  std::mutex mu_;
};

}  // namespace smp
