// smp-data: prepares training data.
//
//   smp-data prepare --input PATH [PATH ...] --output-prefix P [--json-key text]
//                    [--tokenizer bytes|sentencepiece|bpe --tokenizer-model FILE [--merges FILE]]
//                    [--workers N] [--split-sentences]
//   smp-data tokenizer --type bpe|unigram --vocab N --input PATH [PATH ...] --output-prefix M
//   smp-data encode --tokenizer KIND --tokenizer-model FILE [--merges FILE] < text   (ids as JSON)
//   smp-data decode --tokenizer KIND --tokenizer-model FILE [--merges FILE] --prefix P --document D
//
// Tokenizers (smp/data/tokenizers.hpp): bytes; any SentencePiece .model (T5's,
// Llama 2's, or one `tokenizer` trained here on text files or folders); byte-level
// BPE from a Hugging Face tokenizer.json or GPT-2's vocab.json + merges.txt.
// The tokenizer's end-of-text id ends each document.
//
// Text files, folders of them (regular files in name order) or JSON-lines
// files (--json-key: one document per line, its text under that key) become
// a dataset in Megatron's indexed format (<P>.bin, <P>.idx; MMIDIDX version 1,
// uint16 tokens when the vocabulary fits, int32 otherwise), one sequence per
// document followed by the end-of-document token, or with --split-sentences a
// sequence per non-blank line (the encoder adapters' sentences) and no end token. Tokenizing runs on
// --workers threads; the documents keep their input order. A progress line
// on stderr shows bytes, documents, tokens/s and the time left. Invalid UTF-8
// is counted and reported, not fatal. Nothing is left behind on an error.
#include <smp/sdk/input_file.hpp>
#include <smp/data/indexed_dataset.hpp>
#include <smp/data/text_files.hpp>
#include <smp/data/tokenizers.hpp>

#include <CLI/CLI.hpp>
#include <boost/filesystem.hpp>
#include <nlohmann/json.hpp>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdio>
#include <fstream>
#include <iostream>
#include <sstream>
#include <thread>

#ifdef SMP_HAVE_SENTENCEPIECE
#include <sentencepiece_trainer.h>
#endif

namespace {

using smp::sdk::Error;

struct Document {
  std::string text, origin;  // origin: "file" or "file:line"
};

// Bytes that are not part of a well-formed UTF-8 sequence.
int64_t invalid_utf8(const std::string& s) {
  int64_t bad = 0;
  for (size_t i = 0; i < s.size();) {
    const unsigned char c = static_cast<unsigned char>(s[i]);
    const int n = c < 0x80 ? 1 : (c >> 5) == 0x6 ? 2 : (c >> 4) == 0xe ? 3 : (c >> 3) == 0x1e ? 4 : 0;
    bool ok = n > 0 && i + static_cast<size_t>(n) <= s.size();
    for (int k = 1; ok && k < n; ++k) ok = (static_cast<unsigned char>(s[i + static_cast<size_t>(k)]) >> 6) == 0x2;
    if (ok) {
      i += static_cast<size_t>(n);
    } else {
      ++bad, ++i;
    }
  }
  return bad;
}

std::vector<Document> read_documents(const std::vector<std::string>& inputs, const std::string& json_key) {
  std::vector<Document> docs;
  for (const auto& input : inputs)
    for (auto& f : smp::sdk::read_text_files(input, "--input")) {
      if (json_key.empty()) {
        docs.push_back({std::move(f.bytes), f.path});
        continue;
      }
      std::istringstream lines(f.bytes);
      std::string line;
      for (int64_t n = 1; std::getline(lines, line); ++n) {
        if (line.find_first_not_of(" \t\r") == std::string::npos) continue;
        const std::string where = f.path + ":" + std::to_string(n);
        nlohmann::json j;
        try {
          j = smp::input::parse_json(line, where);  // nesting bounded, no key twice
        } catch (const smp::input::Error& e) {
          throw Error(e.what());
        }
        if (!j.is_object() || !j.contains(json_key) || !j[json_key].is_string())
          throw Error(where + ": no string under the key '" + json_key + "' (--json-key)");
        docs.push_back({j[json_key].get<std::string>(), where});
      }
    }
  if (docs.empty()) throw Error("the inputs hold no documents");
  return docs;
}

// --tokenizer, --tokenizer-model and --merges.
struct TokenizerFlags {
  std::string kind = "bytes", model, merges;
  std::unique_ptr<smp::sdk::Tokenizer> open() const { return smp::sdk::open_tokenizer(kind, model, merges, "--tokenizer"); }
};

// A document's non-blank lines, without their line breaks (CR LF too): the
// sentences of --split-sentences, as the encoder adapters read raw text.
std::vector<std::string_view> sentence_lines(const std::string& text) {
  std::vector<std::string_view> out;
  size_t start = 0;
  for (size_t i = 0; i <= text.size(); ++i) {
    if (i < text.size() && text[i] != '\n') continue;
    size_t end = i;
    if (end > start && text[end - 1] == '\r') --end;
    const std::string_view line(text.data() + start, end - start);
    if (line.find_first_not_of(" \t\r\f\v") != std::string_view::npos) out.push_back(line);
    start = i + 1;
  }
  return out;
}

int prepare(const std::vector<std::string>& inputs, const std::string& prefix, const std::string& json_key,
            const TokenizerFlags& flags, int workers, bool split_sentences) {
  const std::unique_ptr<smp::sdk::Tokenizer> tok_ptr = flags.open();
  const smp::sdk::Tokenizer& tok = *tok_ptr;
  using clock = std::chrono::steady_clock;
  const auto t0 = clock::now();
  const std::vector<Document> docs = read_documents(inputs, json_key);
  int64_t total_bytes = 0;
  for (const auto& d : docs) total_bytes += static_cast<int64_t>(d.text.size());
  smp::sdk::IndexedDatasetWriter writer(prefix, smp::sdk::token_type_for(tok.vocab()));
  // Workers tokenize blocks of documents; the writer takes the blocks in order.
  const int64_t n = static_cast<int64_t>(docs.size()), block = 256;
  const int64_t blocks = (n + block - 1) / block;
  // done[block][document][sequence]: one sequence per document ending in the
  // end-of-document id, or (split_sentences) a sequence per non-blank line.
  std::vector<std::vector<std::vector<std::vector<int64_t>>>> done(static_cast<size_t>(blocks));
  std::vector<std::atomic<bool>> ready(static_cast<size_t>(blocks));
  std::atomic<int64_t> next{0}, bad_utf8{0};
  auto work = [&] {
    for (int64_t b; (b = next++) < blocks;) {
      auto& out = done[static_cast<size_t>(b)];
      for (int64_t i = b * block; i < std::min(n, (b + 1) * block); ++i) {
        const std::string& text = docs[static_cast<size_t>(i)].text;
        bad_utf8 += invalid_utf8(text);
        out.emplace_back();
        if (!split_sentences) {
          out.back().push_back(tok.encode(text));
          out.back().back().push_back(tok.eod());
          continue;
        }
        for (const std::string_view line : sentence_lines(text)) out.back().push_back(tok.encode(line));
      }
      ready[static_cast<size_t>(b)].store(true, std::memory_order_release);
    }
  };
  std::vector<std::thread> pool;
  for (int w = 0; w < std::max(1, workers); ++w) pool.emplace_back(work);
  int64_t written_bytes = 0;
  auto last_print = clock::now();
  try {
    for (int64_t b = 0; b < blocks; ++b) {
      while (!ready[static_cast<size_t>(b)].load(std::memory_order_acquire)) std::this_thread::yield();
      auto& out = done[static_cast<size_t>(b)];
      for (size_t i = 0; i < out.size(); ++i) {
        for (const auto& sequence : out[i]) writer.add_sequence(sequence);
        writer.end_document();
        written_bytes += static_cast<int64_t>(docs[static_cast<size_t>(b * block) + i].text.size());
      }
      out.clear();
      out.shrink_to_fit();
      const double s = std::chrono::duration<double>(clock::now() - t0).count();
      if (std::chrono::duration<double>(clock::now() - last_print).count() > 0.5 || b + 1 == blocks) {
        last_print = clock::now();
        const double frac = total_bytes ? static_cast<double>(written_bytes) / static_cast<double>(total_bytes) : 1.0;
        std::fprintf(stderr, "\rprepare: %.1f / %.1f MB, %lld documents, %.2fM tokens/s, %.0f s left   ",
                     static_cast<double>(written_bytes) / 1e6, static_cast<double>(total_bytes) / 1e6,
                     static_cast<long long>(writer.documents()), static_cast<double>(writer.tokens()) / s / 1e6,
                     frac > 0 ? s / frac - s : 0.0);
      }
    }
  } catch (...) {
    for (auto& t : pool) t.join();
    throw;
  }
  for (auto& t : pool) t.join();
  writer.finish();
  const double s = std::chrono::duration<double>(clock::now() - t0).count();
  std::fprintf(stderr, "\n");
  std::cout << nlohmann::json{{"prefix", prefix},
                              {"documents", writer.documents()},
                              {"tokens", writer.tokens()},
                              {"bytes", total_bytes},
                              {"tokenizer", tok.name()},
                              {"vocab", tok.vocab()},
                              {"eod", tok.eod()},
                              {"invalid_utf8_bytes", bad_utf8.load()},
                              {"workers", std::max(1, workers)},
                              {"split_sentences", split_sentences},
                              {"sequences", writer.sequences()},
                              {"seconds", s}}
                   .dump()
            << "\n";
  if (bad_utf8 > 0)
    std::cerr << "smp-data prepare: " << bad_utf8.load() << " bytes of the input are not valid UTF-8 (kept as bytes)\n";
  return 0;
}

int train_tokenizer(const std::vector<std::string>& inputs, const std::string& prefix, const std::string& type,
                    int vocab) {
  if (type != "bpe" && type != "unigram") throw Error("--type: '" + type + "' is not known (known: bpe, unigram)");
#ifdef SMP_HAVE_SENTENCEPIECE
  std::string files;
  for (const auto& input : inputs)
    for (const auto& f : smp::sdk::read_text_files(input, "--input")) files += (files.empty() ? "" : ",") + f.path;
  const std::string args = "--input=" + files + " --model_prefix=" + prefix + " --model_type=" + type +
                           " --vocab_size=" + std::to_string(vocab) +
                           " --character_coverage=1.0 --byte_fallback=true --minloglevel=1"
                           // Text decodes back to itself: no normalization, every space kept.
                           " --normalization_rule_name=identity --remove_extra_whitespaces=false"
                           " --split_by_whitespace=true --max_sentence_length=1000000";
  const auto status = sentencepiece::SentencePieceTrainer::Train(args);
  if (!status.ok()) throw Error("SentencePiece training failed: " + status.ToString());
  std::cout << nlohmann::json{{"model", prefix + ".model"}, {"type", type}, {"vocab", vocab}}.dump() << "\n";
  return 0;
#else
  (void)inputs, (void)prefix, (void)vocab;
  throw Error("tokenizer: this smp-data was built without SentencePiece (install libsentencepiece-dev and rebuild)");
#endif
}

// A prepared document's text: its ids decoded, the end-of-document id dropped.
int decode(const TokenizerFlags& flags, const std::string& prefix, int64_t doc) {
  const std::unique_ptr<smp::sdk::Tokenizer> tok = flags.open();
  smp::sdk::IndexedDataset ds(prefix);
  if (doc < 0 || doc >= ds.documents())
    throw Error("--document " + std::to_string(doc) + ": " + prefix + " has " + std::to_string(ds.documents()));
  std::vector<int64_t> ids;
  for (int64_t q = ds.document_start(doc); q < ds.document_start(doc + 1); ++q) {
    const int64_t first = ds.offset(q) / smp::sdk::token_bytes(ds.type());
    for (int64_t i = 0; i < ds.length(q); ++i) ids.push_back(ds.token_at(first + i));
  }
  if (!ids.empty() && ids.back() == tok->eod()) ids.pop_back();
  std::cout << tok->decode(ids);
  return 0;
}

// Standard input's text as ids (a JSON array), for checks against other tools.
int encode(const TokenizerFlags& flags) {
  const std::unique_ptr<smp::sdk::Tokenizer> tok = flags.open();
  std::ostringstream text;
  text << std::cin.rdbuf();
  std::cout << nlohmann::json(tok->encode(text.str())).dump() << "\n";
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"smp-data: prepare training data in Megatron's indexed format"};
  app.require_subcommand(1);
  std::vector<std::string> inputs;
  std::string prefix, json_key;
  int workers = static_cast<int>(std::max(1u, std::thread::hardware_concurrency()));
  auto* p = app.add_subcommand("prepare", "text, folders or JSON lines -> <prefix>.bin / <prefix>.idx");
  p->add_option("--input", inputs, "text files, folders of them, or JSON-lines files (with --json-key)")->required();
  p->add_option("--output-prefix", prefix, "write <prefix>.bin and <prefix>.idx")->required();
  p->add_option("--json-key", json_key, "the inputs are JSON lines; each line's text is under this key");
  TokenizerFlags tf;
  auto tokenizer_options = [&tf](CLI::App* c) {
    c->add_option("--tokenizer", tf.kind, "bytes (ids 0..255, end of document 256), sentencepiece or bpe")
        ->capture_default_str();
    c->add_option("--tokenizer-model", tf.model, "the SentencePiece .model, or the BPE tokenizer.json / vocab.json");
    c->add_option("--merges", tf.merges, "GPT-2's merges.txt (--tokenizer bpe with a vocab.json)");
  };
  tokenizer_options(p);
  // Threads are a machine's: past 1024 creating them fails (std::system_error, terminate).
  p->add_option("--workers", workers, "tokenizing threads (1 to 1024)")->capture_default_str()->check(CLI::Range(1, 1024));
  bool split_sentences = false;
  p->add_flag("--split-sentences", split_sentences,
              "a sequence per non-blank line, no end-of-document id (BERT / RoBERTa data; a document per file or JSON line)");
  std::vector<std::string> t_inputs;
  std::string t_prefix, t_type = "unigram";
  int t_vocab = 8000;
  auto* t = app.add_subcommand("tokenizer", "train a SentencePiece model (<prefix>.model, <prefix>.vocab)");
  t->add_option("--input", t_inputs, "text files or folders")->required();
  t->add_option("--output-prefix", t_prefix, "write <prefix>.model and <prefix>.vocab")->required();
  t->add_option("--type", t_type, "bpe or unigram")->capture_default_str();
  // Far above any real vocabulary (2^18); 2^31 had SentencePiece's trainer run without end.
  t->add_option("--vocab", t_vocab, "vocabulary size (2 to 1048576)")->capture_default_str()->check(CLI::Range(2, 1 << 20));
  std::string d_prefix;
  int64_t d_doc = 0;
  auto* dc = app.add_subcommand("decode", "print a prepared document's text");
  tokenizer_options(dc);
  dc->add_option("--prefix", d_prefix, "the prepared dataset")->required();
  dc->add_option("--document", d_doc, "the document's index")->capture_default_str();
  auto* ec = app.add_subcommand("encode", "standard input's text as a JSON array of ids");
  tokenizer_options(ec);
  CLI11_PARSE(app, argc, argv);
  try {
    if (*dc) return decode(tf, d_prefix, d_doc);
    if (*ec) return encode(tf);
    // An output prefix's folder is made when missing (data/corpus with no data/ yet).
    auto make_parent = [](const std::string& out_prefix) {
      const boost::filesystem::path parent = boost::filesystem::absolute(out_prefix).parent_path();
      boost::filesystem::create_directories(parent);
    };
    if (*p) {
      make_parent(prefix);
      return prepare(inputs, prefix, json_key, tf, workers, split_sentences);
    }
    if (*t) {
      make_parent(t_prefix);
      return train_tokenizer(t_inputs, t_prefix, t_type, t_vocab);
    }
  } catch (const std::exception& e) {
    std::cerr << "\nsmp-data: error: " << e.what() << "\n";
    return 1;
  }
  return 0;
}
