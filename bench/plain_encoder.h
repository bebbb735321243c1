// The plain LibTorch reference for `smp-bench bert` and `smp-bench roberta`: the
// same encoder (embeddings, post-LN bidirectional layers with a padding mask,
// the MLM head tied to the token embedding; BERT's pooler and NSP classifier),
// the same batches (the adapters' own data code, adapters/encoder), the loss of
// one whole batch (MLM mean over masked tokens, + NSP mean for BERT), clipping
// and AdamW, written directly with at:: ops in one process. Run as
// `smp-bench plain-encoder --model bert|roberta`.
#pragma once

#include "plain_gpt.h"  // PlainOptions

#include <nlohmann/json.hpp>

#include <string>

namespace bench {

// model: "bert" (MLM + NSP, segment embeddings) or "roberta" (MLM only). Returns
// a summary shaped like smp's (losses, step_seconds excluding the first, tokens_per_s).
nlohmann::json run_plain_encoder(const PlainOptions& o, const std::string& model);

}  // namespace bench
