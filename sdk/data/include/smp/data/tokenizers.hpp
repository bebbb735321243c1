// open_tokenizer: a tokenizer from its kind and files (see tokenizer.hpp).
//   bytes                      no files
//   sentencepiece M.model
//   bpe tokenizer.json         a Hugging Face tokenizer
//   bpe vocab.json merges.txt  GPT-2's files
// `what` names the setting in errors ("model.tokenizer", "--tokenizer").
//
// read_tokenizer_files: the bytes of a tokenizer's files, read once (regular
// files only, at most kMaxTokenizerBytes each) and loaded from those very
// bytes as a tokenizer of `kind`; what it returns is what was validated. For
// a tool that copies tokenizer files (smp-checkpoint export), so that a
// manifest naming any other file is refused rather than copied.
#pragma once

#include <smp/data/bpe_tokenizer.hpp>
#include <smp/sdk/host.hpp>
#include <smp/data/sentencepiece_tokenizer.hpp>
#include <smp/data/tokenizer.hpp>

#include <nlohmann/json.hpp>

#include <memory>
#include <string>

namespace smp::sdk {

// The files of a tokenizer as read_tokenizer_files validated them.
struct TokenizerFiles {
  std::string model;   // the bytes of model_path: tokenizer.json, vocab.json or the SentencePiece .model
  std::string merges;  // the bytes of merges_path (GPT-2's merges.txt); empty when there is none
};

// kind: "sentencepiece" or "bpe" ("bytes" has no files and is refused here).
// Throws smp::sdk::Error naming the file when a file is not a regular file,
// is over the bound, or is not a tokenizer of that kind.
inline TokenizerFiles read_tokenizer_files(const std::string& kind, const std::string& model_path,
                                           const std::string& merges_path);

inline std::unique_ptr<Tokenizer> open_tokenizer(const std::string& kind, const std::string& model,
                                                 const std::string& merges, const std::string& what) {
  if (kind == "bytes") {
    if (!model.empty() || !merges.empty()) throw Error(what + " = \"bytes\" takes no tokenizer files");
    return std::make_unique<ByteTokenizer>();
  }
  if (kind == "sentencepiece") {
    if (model.empty()) throw Error(what + " = \"sentencepiece\" needs the .model file");
    if (!merges.empty()) throw Error(what + " = \"sentencepiece\" takes no merges file");
    return std::make_unique<SentencePieceTokenizer>(model);
  }
  if (kind == "bpe") {
    if (model.empty()) throw Error(what + " = \"bpe\" needs a tokenizer.json, or a vocab.json with its merges.txt");
    if (merges.empty()) return BpeTokenizer::from_tokenizer_json(model);
    return BpeTokenizer::from_vocab_merges(model, merges);
  }
  throw Error(what + ": '" + kind + "' is not known (known: bytes, sentencepiece, bpe)");
}

inline TokenizerFiles read_tokenizer_files(const std::string& kind, const std::string& model_path,
                                           const std::string& merges_path) {
  TokenizerFiles files;
  if (kind == "sentencepiece") {
    if (model_path.empty()) throw Error("tokenizer sentencepiece: no .model file named");
    if (!merges_path.empty()) throw Error("tokenizer sentencepiece takes no merges file (" + merges_path + " named)");
    files.model = detail::read_tokenizer_file(model_path, "tokenizer " + model_path);
    SentencePieceTokenizer check(model_path, files.model);
    return files;
  }
  if (kind == "bpe") {
    if (model_path.empty()) throw Error("tokenizer bpe: no tokenizer.json or vocab.json named");
    files.model = detail::read_tokenizer_file(model_path, "tokenizer " + model_path);
    if (merges_path.empty()) {
      BpeTokenizer::from_tokenizer_json_text(model_path, files.model);
    } else {
      files.merges = detail::read_tokenizer_file(merges_path, "tokenizer merges " + merges_path);
      BpeTokenizer::from_vocab_merges_text(model_path, files.model, merges_path, files.merges);
    }
    return files;
  }
  if (kind == "bytes") throw Error("tokenizer bytes has no files to read");
  throw Error("tokenizer '" + kind + "' is not known (known: bytes, sentencepiece, bpe)");
}

// model.tokenizer ("bytes", "sentencepiece", "bpe"), model.tokenizer_model and
// model.tokenizer_merges of an adapter's [model] table; null for bytes.
inline std::unique_ptr<Tokenizer> model_tokenizer(const nlohmann::json& model) {
  auto text = [&](const char* key) -> std::string {
    if (!model.contains(key)) return "";
    if (!model[key].is_string()) throw Error(std::string("model.") + key + ": expected a string");
    return model[key].get<std::string>();
  };
  const std::string kind = model.contains("tokenizer") ? text("tokenizer") : "bytes";
  const std::string file = text("tokenizer_model"), merges = text("tokenizer_merges");
  std::unique_ptr<Tokenizer> tok;
  try {
    tok = open_tokenizer(kind, file, merges, "model.tokenizer");
  } catch (const Error& e) {
    throw Error(std::string(e.what()) + (file.empty() ? "" : " (model.tokenizer_model)"));
  }
  if (kind == "bytes") return nullptr;
  return tok;
}

// The model's vocabulary with a tokenizer: model.vocab when given (at least
// the tokenizer's, else an error naming both), else the tokenizer's.
inline int64_t model_vocab_for(const nlohmann::json& model, const Tokenizer& tokenizer, int64_t preset_vocab) {
  if (!model.contains("vocab")) return tokenizer.vocab();
  if (preset_vocab < tokenizer.vocab())
    throw Error("model.vocab = " + std::to_string(preset_vocab) + " is smaller than the vocabulary of " +
                tokenizer.name() + " (" + std::to_string(tokenizer.vocab()) +
                "); leave model.vocab out to take the tokenizer's");
  return preset_vocab;
}

}  // namespace smp::sdk
