// ProgramBatch cuts a program's batch into microbatches: a training step's
// evenly (train.batch_size's rule), forward's like torch.tensor_split when the
// rows do not divide (issue 54: forward refused 3 samples under 2 microbatches).
#include "error_of.h"
#include "runtime/data_source.h"

#include <smp/error.h>

#include <ATen/ATen.h>
#include <gtest/gtest.h>

#include <string>
#include <vector>

namespace {

smp::ProgramBatch batch_of(int64_t rows, int microbatches, bool uneven) {
  smp::ProgramBatch::Rules rules;
  rules.microbatches = microbatches;
  rules.uneven = uneven;
  rules.allow_missing = uneven;
  rules.where = "rank 0: forward";
  const at::Tensor x = at::arange(rows * 2, at::kFloat).reshape({rows, 2});
  return smp::ProgramBatch({{"x", x}, {"y", at::arange(rows)}}, {"x", "y"}, rules);
}

// The sizes of the microbatches, and each one's samples in order.
std::vector<int64_t> cut(int64_t rows, int microbatches) {
  const smp::ProgramBatch b = batch_of(rows, microbatches, true);
  std::vector<int64_t> sizes;
  int64_t next = 0;
  for (int mb = 0; mb < microbatches; ++mb) {
    const std::vector<at::Tensor> in = b.microbatch(smp::DataSplit::Train, 0, mb);
    EXPECT_EQ(in.at(0).size(0), in.at(1).size(0));
    for (int64_t i = 0; i < in.at(1).size(0); ++i) EXPECT_EQ(in.at(1)[i].item<int64_t>(), next++);  // in order, no gap
    sizes.push_back(in.at(1).size(0));
  }
  EXPECT_EQ(next, rows);
  return sizes;
}

TEST(ProgramBatch, ForwardCutsUnevenBatchesLikeTensorSplit) {
  EXPECT_EQ(cut(3, 2), (std::vector<int64_t>{2, 1}));
  EXPECT_EQ(cut(5, 4), (std::vector<int64_t>{2, 1, 1, 1}));
  EXPECT_EQ(cut(7, 3), (std::vector<int64_t>{3, 2, 2}));
  EXPECT_EQ(cut(8, 4), (std::vector<int64_t>{2, 2, 2, 2}));
  EXPECT_EQ(cut(2, 2), (std::vector<int64_t>{1, 1}));
  // The same sizes as LibTorch's own tensor_split.
  for (int64_t rows = 1; rows <= 9; ++rows)
    for (int m = 1; m <= rows; ++m) {
      std::vector<int64_t> want;
      for (const at::Tensor& t : at::arange(rows).tensor_split(m)) want.push_back(t.size(0));
      EXPECT_EQ(cut(rows, m), want) << rows << " rows, " << m << " microbatches";
    }
}

TEST(ProgramBatch, ForwardRefusesFewerSamplesThanMicrobatches) {
  const std::string e = smp_test::error_of<smp::Error>([] { batch_of(1, 2, true); });
  EXPECT_NE(e.find("rank 0: forward: the batch's 1 samples are fewer than parallel.microbatches = 2 (each microbatch "
                   "needs at least one)"),
            std::string::npos)
      << (e.empty() ? "1 sample under 2 microbatches was accepted" : e);
}

TEST(ProgramBatch, ATrainingStepStillNeedsEqualMicrobatches) {
  const std::string e = smp_test::error_of<smp::Error>([] { batch_of(3, 2, false); });
  EXPECT_NE(e.find("the batch's 3 samples do not split into parallel.microbatches = 2 equal microbatches"),
            std::string::npos)
      << (e.empty() ? "3 samples under 2 microbatches were accepted for training" : e);
  const smp::ProgramBatch even = batch_of(4, 2, false);
  EXPECT_EQ(even.microbatch(smp::DataSplit::Train, 0, 1).at(1)[0].item<int64_t>(), 2);
}

}  // namespace
