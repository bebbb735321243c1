#include "comm/comm_work.h"

#include "base/trace.h"
#include "comm/wait.h"

#include <c10/util/Exception.h>

#include <sstream>

namespace smp {

std::string join_ranks(const std::vector<int>& v) {
  std::ostringstream os;
  os << "[";
  for (size_t i = 0; i < v.size(); ++i) os << (i ? ", " : "") << v[i];
  os << "]";
  return os.str();
}

std::string GroupContext::where(const std::string& op) const {
  return "communication error: " + op + " on axis '" + axis + "' (group '" + name + "', world ranks " +
         join_ranks(ranks) + ", this process is group rank " + std::to_string(rank) + " = world rank " +
         std::to_string(ranks[rank]) + ")";
}

Error GroupContext::failure(const std::string& op, const std::string& message, bool timed_out) const {
  std::string m = where(op) + " failed";
  if (timed_out) m += " (timed out; timeout " + std::to_string(timeout_ms) + " ms)";
  return Error(m + ": " + message);
}

Error GroupContext::invalid(const std::string& op, const std::string& what) const {
  return Error("invalid " + op + " on axis '" + axis + "' (group '" + name + "', world ranks " + join_ranks(ranks) +
               "): " + what);
}

void CommWork::wait() {
  std::lock_guard<std::mutex> lock(mu_);
  if (!done_) {
    done_ = true;
    run_once();
  }
  if (error_) std::rethrow_exception(error_);
}

void CommWork::run_once() {
  const int64_t wait_start = tag_.issued_us >= 0 ? trace::now_us() : -1;
  struct Traced {  // records the wait and the operation's life once it completed
    const TraceTag& tag;
    const std::string& axis;
    int64_t wait_start;
    ~Traced() {
      if (wait_start < 0) return;
      const int64_t end = trace::now_us();
      const trace::Args args{{"axis", axis}, {"bytes", static_cast<double>(tag.bytes)}};
      trace::async_slice("comm", tag.kind + " " + axis, tag.issued_us, end, args);
      if (end - wait_start >= 1) trace::complete("wait", "wait " + tag.kind + " " + axis, wait_start, end, args);
    }
  } traced{tag_, ctx_->axis, wait_start};
  try {
    if (inner_) inner_->wait();
    if (finish_) finish_();
  } catch (const c10d_compat::Failure& f) {
    error_ = std::make_exception_ptr(ctx_->failure(op_, f.what(), f.timed_out()));
  } catch (const WaitFailed& f) {  // a shared-memory receive waits in wait()
    error_ = std::make_exception_ptr(ctx_->failure(op_, f.what(), f.timed_out()));
  } catch (const Error&) {
    error_ = std::current_exception();
  } catch (const c10::Error& e) {
    error_ = std::make_exception_ptr(Error(ctx_->where(op_) + " failed: " + e.what_without_backtrace()));
  } catch (const std::exception& e) {
    error_ = std::make_exception_ptr(Error(ctx_->where(op_) + " failed: " + e.what()));
  }
  inner_.reset();
  finish_ = nullptr;
}

bool CommWork::ready() {
  std::lock_guard<std::mutex> lock(mu_);
  if (done_ || !inner_) return true;
  try {
    return inner_->ready();
  } catch (...) {
    return true;  // wait() reports the failure
  }
}

void ThenWork::wait() {
  std::lock_guard<std::mutex> lock(mu_);
  inner_->wait();
  if (then_) {
    auto f = std::move(then_);
    then_ = nullptr;
    f();
  }
}

}  // namespace smp
