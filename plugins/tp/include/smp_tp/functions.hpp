// Autograd functions of smp_tp that are not plain f/g collectives (those are the SDK's):
//   VocabParallelCrossEntropyFn: cross entropy over vocab-sharded logits.
//   ShardedLookupFn: row-sharded embedding lookup through all-to-all.
#pragma once

#include <smp/sdk/collectives.hpp>

#include <ATen/ATen.h>
#include <torch/csrc/autograd/custom_function.h>

#include <vector>

namespace smp_tp {

using at::Tensor;
using smp::sdk::Comm;
using torch::autograd::AutogradContext;
using torch::autograd::variable_list;

inline Comm comm_from_id(int64_t id) { return Comm(reinterpret_cast<smp_comm*>(id)); }

// Counts read on the host (they size the all-to-alls): a CUDA tensor is copied first.
inline std::vector<int64_t> to_vector(const Tensor& t) {
  Tensor c = t.to(at::kCPU, at::kLong).contiguous();
  return std::vector<int64_t>(c.data_ptr<int64_t>(), c.data_ptr<int64_t>() + c.numel());
}

// Megatron's vocab-parallel cross entropy. logits [..., V/t] (this rank's vocab slice
// [rank*V/t, (rank+1)*V/t)), targets [...] int64 global ids, identical on every rank;
// w [...] float, each token's weight, 0 where the target is ignored (the caller
// folds ignore_index in). Communication: one MAX all-reduce of N floats (row max)
// and one SUM all-reduce of 2N floats (target logit, sum of exp), N = number of
// tokens; the logits never move.
// Returns the weighted sum of the tokens' losses (fp32; the caller divides).
// Backward (no communication): (softmax - onehot(target)) * w on the local slice.
struct VocabParallelCrossEntropyFn : torch::autograd::Function<VocabParallelCrossEntropyFn> {
  static Tensor forward(AutogradContext* ctx, const Tensor& logits, const Tensor& targets, const Tensor& w,
                        int64_t comm_id) {
    Comm comm = comm_from_id(comm_id);
    const int64_t vl = logits.size(-1), lo = comm.rank() * vl;
    Tensor x = logits.reshape({-1, vl}).to(at::kFloat);
    Tensor t = targets.reshape({-1});
    Tensor wf = w.reshape({-1}).to(at::kFloat);

    Tensor m = std::get<0>(x.max(-1)).contiguous();
    comm.allreduce(m, SMP_REDUCE_MAX);
    Tensor shifted = x - m.unsqueeze(-1);

    Tensor local = t - lo;
    Tensor owned = local.ge(0).logical_and(local.lt(vl));
    Tensor idx = local.masked_fill(owned.logical_not(), 0);
    Tensor exp = shifted.exp();
    // masked_fill, not a product with `owned`: a padded class's logit is -inf (see real_vocab), and -inf * 0 is NaN.
    Tensor stats =
        at::stack({shifted.gather(1, idx.unsqueeze(1)).squeeze(1).masked_fill(owned.logical_not(), 0.0), exp.sum(-1)});
    comm.allreduce(stats);  // [2, N]: target logit, sum of exp
    Tensor sum_exp = stats[1];
    // An ignored token's target may be any id (e.g. -100): its weight is 0, and
    // masked_fill keeps a non-finite term out of the sum.
    Tensor loss = sum_exp.log().sub(stats[0]).mul(wf).masked_fill(wf.eq(0), 0.0).sum();

    ctx->save_for_backward({exp.div_(sum_exp.unsqueeze(-1)), idx, owned, wf});
    ctx->saved_data["shape"] = logits.sizes().vec();
    ctx->saved_data["dtype"] = static_cast<int64_t>(logits.scalar_type());
    return loss;
  }
  static variable_list backward(AutogradContext* ctx, variable_list grads) {
    auto s = ctx->get_saved_variables();
    Tensor grad = s[0].clone();  // softmax on the local slice
    grad.scatter_add_(1, s[1].unsqueeze(1), s[2].to(at::kFloat).neg().unsqueeze(1));
    grad.mul_(s[3].unsqueeze(1)).mul_(grads[0].to(at::kFloat));
    auto dtype = static_cast<at::ScalarType>(ctx->saved_data["dtype"].toInt());
    return {grad.view(ctx->saved_data["shape"].toIntVector()).to(dtype), Tensor(), Tensor(), Tensor()};
  }
};

// Row-wise sharded embedding lookup (recommendation-style). Rank r owns rows
// [r*rows, (r+1)*rows) of the table. Each rank may look up its own, different ids:
//   forward:  counts all-to-all (t int64 each way), ids all-to-all to their owners
//             (uneven splits), local gather, vectors all-to-all back (uneven splits).
//   backward: distinct != 0: gradients all-to-all to the owners (the reverse of the
//             forward's last step), index_add into the local shard. Contributions from
//             several ranks to one row add up (each rank's loss is its own samples').
//             distinct == 0 ("replicated": every rank of the group looked up the SAME ids
//             and holds the same full gradient, as in a tensor-parallel group): each
//             owner takes the gradient of its own rows from its local copy, without
//             communication; summing t identical copies would count them t times.
struct ShardedLookupFn : torch::autograd::Function<ShardedLookupFn> {
  static Tensor forward(AutogradContext* ctx, const Tensor& weight, const Tensor& ids, int64_t comm_id,
                        int64_t rows_per_rank, int64_t distinct) {
    Comm comm = comm_from_id(comm_id);
    const int t = comm.size(), r = comm.rank();
    const int64_t dim = weight.size(1);
    Tensor flat = ids.reshape({-1}).contiguous();
    Tensor owner = flat.div(rows_per_rank, "floor");
    Tensor order = std::get<1>(at::sort(owner, /*stable=*/true, 0, false));
    std::vector<int64_t> ones(t, 1);
    Tensor send_counts = at::bincount(owner, {}, t);
    std::vector<int64_t> sc = to_vector(send_counts);
    std::vector<int64_t> rc = to_vector(comm.alltoall(send_counts, ones, ones));

    Tensor recv_ids = comm.alltoall(flat.index_select(0, order), sc, rc);
    Tensor local = recv_ids - int64_t(r) * rows_per_rank;
    Tensor back = comm.alltoall(weight.index_select(0, local), rc, sc);  // in `order`
    Tensor out = at::empty_like(back).index_copy_(0, order, back);

    ctx->save_for_backward({order, local, flat, owner});
    ctx->saved_data["comm"] = comm_id;
    ctx->saved_data["sc"] = sc;
    ctx->saved_data["rc"] = rc;
    ctx->saved_data["rows"] = weight.size(0);
    ctx->saved_data["rows_per_rank"] = rows_per_rank;
    ctx->saved_data["distinct"] = distinct;
    std::vector<int64_t> shape = ids.sizes().vec();
    shape.push_back(dim);
    return out.view(shape);
  }
  static variable_list backward(AutogradContext* ctx, variable_list grads) {
    auto s = ctx->get_saved_variables();
    Comm comm = comm_from_id(ctx->saved_data["comm"].toInt());
    const int64_t dim = grads[0].size(-1);
    Tensor g = grads[0].reshape({-1, dim}).contiguous();
    Tensor gw = at::zeros({ctx->saved_data["rows"].toInt(), dim}, g.options());
    if (ctx->saved_data["distinct"].toInt()) {
      Tensor gr = comm.alltoall(g.index_select(0, s[0]), ctx->saved_data["sc"].toIntVector(),
                                ctx->saved_data["rc"].toIntVector());
      gw.index_add_(0, s[1], gr);
    } else {
      const int64_t rpr = ctx->saved_data["rows_per_rank"].toInt();
      Tensor mine = s[3].eq(comm.rank()).nonzero().squeeze(1);
      gw.index_add_(0, s[2].index_select(0, mine) - comm.rank() * rpr, g.index_select(0, mine));
    }
    return {gw, Tensor(), Tensor(), Tensor(), Tensor()};
  }
};

}  // namespace smp_tp
