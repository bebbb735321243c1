// Moved to <smp/data/bpe_tokenizer.hpp>: tokenizers, datasets and model files are the
// SDK's data tooling (sdk/data/, target smp::data), apart from the plugin SDK.
// This path forwards there, so that code written against it keeps building.
#pragma once

#include <smp/data/bpe_tokenizer.hpp>
