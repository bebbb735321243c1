// Byte-level BPE (GPT-2, Llama 3, Hugging Face `tokenizers`): text is split
// by a pre-tokenizer pattern, each piece's bytes are mapped to printable
// characters (GPT-2's bytes_to_unicode), and merges apply lowest rank first.
// Loaded from a Hugging Face tokenizer.json (model type BPE) or from GPT-2's
// vocab.json + merges.txt. The two pre-tokenizer patterns in use are written
// out by hand (the GPT-2 one, also ByteLevel's `use_regex`, and the Llama 3 /
// cl100k one); a tokenizer.json with any other pattern or normalizer is
// refused naming the file and the key. Special tokens in the text are encoded
// as ordinary text (tiktoken's encode_ordinary); documents get the
// end-of-document id appended by the caller.
#pragma once

#include <smp/data/detail/unicode_classes.hpp>
#include <smp/sdk/host.hpp>
#include <smp/sdk/input_file.hpp>
#include <smp/data/tokenizer.hpp>

#include <nlohmann/json.hpp>

#include <algorithm>
#include <cstdint>
#include <sstream>
#include <string>
#include <string_view>
#include <unordered_map>
#include <unordered_set>
#include <vector>

namespace smp::sdk {

namespace detail {

inline bool in_ranges(const CodeRange* begin, const CodeRange* end, uint32_t cp) {
  const CodeRange* it = std::upper_bound(begin, end, cp, [](uint32_t c, const CodeRange& r) { return c < r.lo; });
  return it != begin && cp <= (it - 1)->hi;
}
inline bool is_letter(uint32_t cp) {
  return cp >= 0x80 ? in_ranges(std::begin(kLetterRanges), std::end(kLetterRanges), cp)
                    : ((cp | 0x20) >= 'a' && (cp | 0x20) <= 'z');
}
inline bool is_number(uint32_t cp) {
  return cp >= 0x80 ? in_ranges(std::begin(kNumberRanges), std::end(kNumberRanges), cp) : (cp >= '0' && cp <= '9');
}
// Unicode's White_Space property (what \s matches in the patterns' engines).
inline bool is_space(uint32_t cp) {
  return (cp >= 0x9 && cp <= 0xD) || cp == 0x20 || cp == 0x85 || cp == 0xA0 || cp == 0x1680 ||
         (cp >= 0x2000 && cp <= 0x200A) || cp == 0x2028 || cp == 0x2029 || cp == 0x202F || cp == 0x205F ||
         cp == 0x3000;
}

// Code points with their byte spans; a byte that starts no valid UTF-8
// sequence is a code point of its own that is no letter, number or space.
struct CodePoints {
  std::vector<uint32_t> cp;
  std::vector<size_t> begin;  // cp.size() + 1 entries: byte offsets
};
inline CodePoints decode_utf8(std::string_view s) {
  CodePoints out;
  for (size_t i = 0; i < s.size();) {
    const auto c = static_cast<unsigned char>(s[i]);
    const int n = c < 0x80 ? 1 : (c >> 5) == 0x6 ? 2 : (c >> 4) == 0xE ? 3 : (c >> 3) == 0x1E ? 4 : 0;
    uint32_t cp = n == 1 ? c : n == 2 ? (c & 0x1Fu) : n == 3 ? (c & 0x0Fu) : (c & 0x07u);
    bool ok = n > 0 && i + static_cast<size_t>(n) <= s.size();
    for (int k = 1; ok && k < n; ++k) {
      const auto d = static_cast<unsigned char>(s[i + static_cast<size_t>(k)]);
      ok = (d >> 6) == 0x2;
      cp = (cp << 6) | (d & 0x3Fu);
    }
    out.begin.push_back(i);
    out.cp.push_back(ok ? cp : 0xFFFFFFFFu);  // not a character: matches only the "other" classes
    i += ok ? static_cast<size_t>(n) : 1;
  }
  out.begin.push_back(s.size());
  return out;
}

enum class PreTokenizer { kGpt2, kLlama3 };

// The end (code point index) of the piece starting at i under the pattern.
inline size_t next_piece(const std::vector<uint32_t>& cp, size_t i, PreTokenizer p) {
  const size_t n = cp.size();
  auto at = [&](size_t k) -> uint32_t { return k < n ? cp[k] : 0xFFFFFFFEu; };  // past the end: nothing matches
  auto letter = [&](size_t k) { return k < n && is_letter(cp[k]); };
  auto number = [&](size_t k) { return k < n && is_number(cp[k]); };
  auto space = [&](size_t k) { return k < n && is_space(cp[k]); };
  auto other = [&](size_t k) { return k < n && !is_space(cp[k]) && !is_letter(cp[k]) && !is_number(cp[k]); };
  auto newline = [&](size_t k) { return at(k) == '\r' || at(k) == '\n'; };
  auto run = [&](size_t k, auto&& pred) {
    while (pred(k)) ++k;
    return k;
  };
  const bool fold = p == PreTokenizer::kLlama3;  // Llama 3's contractions ignore case
  auto is = [&](size_t k, char c) {
    const uint32_t x = at(k);
    return x == static_cast<uint32_t>(c) || (fold && x < 0x80 && (x | 0x20) == static_cast<uint32_t>(c));
  };
  // 's 't 're 've 'm 'll 'd
  if (at(i) == '\'') {
    if (is(i + 1, 's') || is(i + 1, 't') || is(i + 1, 'm') || is(i + 1, 'd')) return i + 2;
    if ((is(i + 1, 'r') && is(i + 2, 'e')) || (is(i + 1, 'v') && is(i + 2, 'e')) || (is(i + 1, 'l') && is(i + 2, 'l')))
      return i + 3;
  }
  if (p == PreTokenizer::kGpt2) {
    //  ?\p{L}+ |  ?\p{N}+ |  ?[^\s\p{L}\p{N}]+
    const size_t s = at(i) == ' ' ? i + 1 : i;
    if (letter(s)) return run(s, letter);
    if (number(s)) return run(s, number);
    if (other(s)) return run(s, other);
  } else {
    // [^\r\n\p{L}\p{N}]?\p{L}+ | \p{N}{1,3} |  ?[^\s\p{L}\p{N}]+[\r\n]* | \s*[\r\n]+
    if (i < n && !newline(i) && !letter(i) && !number(i) && letter(i + 1)) return run(i + 1, letter);
    if (letter(i)) return run(i, letter);
    if (number(i)) return std::min(run(i, number), i + 3);
    const size_t s = at(i) == ' ' ? i + 1 : i;
    if (other(s)) return run(run(s, other), newline);
    const size_t end = run(i, space);
    for (size_t k = end; k > i; --k)
      if (newline(k - 1)) return k;  // up to the run's last CR or LF
  }
  // \s+(?!\S) | \s+ : a whitespace run leaves its last space to the next piece.
  const size_t end = run(i, space);
  if (end > i) return end == n || end - i == 1 ? end : end - 1;
  return i + 1;  // unreachable with the classes above; never loop
}

// GPT-2's bytes_to_unicode: each byte as a printable code point, UTF-8 encoded.
inline const std::vector<std::string>& byte_chars() {
  static const std::vector<std::string> table = [] {
    std::vector<uint32_t> map(256, 0);
    uint32_t extra = 0;
    for (uint32_t b = 0; b < 256; ++b) {
      const bool printable = (b >= '!' && b <= '~') || (b >= 0xA1 && b <= 0xAC) || (b >= 0xAE && b <= 0xFF);
      map[b] = printable ? b : 256 + extra++;
    }
    std::vector<std::string> out(256);
    for (int b = 0; b < 256; ++b) {
      const uint32_t c = map[static_cast<size_t>(b)];
      if (c < 0x80) {
        out[static_cast<size_t>(b)] = std::string(1, static_cast<char>(c));
      } else {
        out[static_cast<size_t>(b)] = {static_cast<char>(0xC0 | (c >> 6)), static_cast<char>(0x80 | (c & 0x3F))};
      }
    }
    return out;
  }();
  return table;
}

// A tokenizer file through the shared reading discipline (smp/sdk/input_file.hpp):
// a regular file only (a named pipe would block forever), at most
// kMaxTokenizerBytes; its errors as smp::sdk::Error.
inline std::string read_tokenizer_file(const std::string& path, const std::string& what) {
  try {
    return smp::input::read_file(path, what, smp::input::kMaxTokenizerBytes);
  } catch (const smp::input::Error& e) {
    throw Error(e.what());
  }
}

// JSON with its nesting bounded and a key given twice in one object refused
// (smp::input::parse_json).
inline nlohmann::json parse_json(const std::string& text, const std::string& what) {
  try {
    return smp::input::parse_json(text, what);
  } catch (const smp::input::Error& e) {
    throw Error(e.what());
  }
}

// Typed reads of a tokenizer.json's keys: a value of the wrong type is an
// error naming the file and the key (nlohmann's own type errors name neither).
inline std::string type_of(const nlohmann::json& v) { return v.type_name(); }
inline const nlohmann::json* field(const nlohmann::json& obj, const char* key) {
  if (!obj.is_object()) return nullptr;
  const auto it = obj.find(key);
  return it == obj.end() ? nullptr : &*it;
}
inline void need_object(const nlohmann::json& obj, const std::string& what, const std::string& where) {
  if (!obj.is_object()) throw Error(what + ": " + where + " is " + type_of(obj) + ", not an object");
}
inline std::string text_field(const nlohmann::json& obj, const char* key, const std::string& fallback,
                              const std::string& what, const std::string& where) {
  need_object(obj, what, where);
  const nlohmann::json* v = field(obj, key);
  if (!v || v->is_null()) return fallback;
  if (!v->is_string()) throw Error(what + ": " + where + "." + key + " is " + type_of(*v) + ", not a string");
  return v->get<std::string>();
}
inline bool flag_field(const nlohmann::json& obj, const char* key, bool fallback, const std::string& what,
                       const std::string& where) {
  need_object(obj, what, where);
  const nlohmann::json* v = field(obj, key);
  if (!v || v->is_null()) return fallback;
  if (!v->is_boolean()) throw Error(what + ": " + where + "." + key + " is " + type_of(*v) + ", not true or false");
  return v->get<bool>();
}
inline const nlohmann::json& array_field(const nlohmann::json& obj, const char* key, const std::string& what,
                                         const std::string& where) {
  static const nlohmann::json empty = nlohmann::json::array();
  need_object(obj, what, where);
  const nlohmann::json* v = field(obj, key);
  if (!v || v->is_null()) return empty;
  if (!v->is_array()) throw Error(what + ": " + where + "." + key + " is " + type_of(*v) + ", not an array");
  return *v;
}

}  // namespace detail

class BpeTokenizer : public Tokenizer {
 public:
  // A Hugging Face tokenizer.json, read through smp::input (a regular file
  // of at most kMaxTokenizerBytes).
  static std::unique_ptr<BpeTokenizer> from_tokenizer_json(const std::string& path) {
    return from_tokenizer_json_text(path, detail::read_tokenizer_file(path, "tokenizer " + path));
  }

  // A tokenizer.json from its bytes (`path` names it in messages).
  static std::unique_ptr<BpeTokenizer> from_tokenizer_json_text(const std::string& path, const std::string& text) {
    const std::string what = "tokenizer " + path;
    const nlohmann::json j = detail::parse_json(text, what);
    try {
      return from_tokenizer_json_value(path, text, j, what);
    } catch (const nlohmann::json::exception& e) {  // a type not checked below: still name the file
      throw Error(what + ": unexpected structure: " + e.what());
    }
  }

  // GPT-2's vocab.json + merges.txt (the GPT-2 pattern, no prefix space).
  static std::unique_ptr<BpeTokenizer> from_vocab_merges(const std::string& vocab_path, const std::string& merges_path) {
    const std::string vocab = detail::read_tokenizer_file(vocab_path, "tokenizer " + vocab_path);
    return from_vocab_merges_text(vocab_path, vocab, merges_path,
                                  detail::read_tokenizer_file(merges_path, "tokenizer merges " + merges_path));
  }

  // The same from the two files' bytes (the paths name them in messages).
  static std::unique_ptr<BpeTokenizer> from_vocab_merges_text(const std::string& vocab_path, const std::string& text,
                                                              const std::string& merges_path,
                                                              const std::string& merges_text) {
    const std::string what = "tokenizer " + vocab_path;
    const nlohmann::json v = detail::parse_json(text, what);
    if (!v.is_object()) throw Error(what + ": not a JSON object of piece -> id");
    auto t = std::unique_ptr<BpeTokenizer>(new BpeTokenizer(vocab_path));
    t->id_limit_ = id_limit_for(text);
    for (const auto& [piece, id] : v.items()) t->add_piece(piece, id_of_json(id, piece, what), what);
    std::istringstream lines(merges_text);
    std::vector<std::pair<std::string, std::string>> merges;
    std::string line;
    for (int64_t n = 1; std::getline(lines, line); ++n) {
      if (!line.empty() && line.back() == '\r') line.pop_back();
      if (line.empty() || (n == 1 && line.rfind("#version", 0) == 0)) continue;
      const size_t sp = line.find(' ', 1);
      if (sp == std::string::npos || line.find(' ', sp + 1) != std::string::npos)
        // The line is not quoted: a file that is no merges file (a secret one
        // named by a manifest) must not have its text shown in the message.
        throw Error("tokenizer merges " + merges_path + ":" + std::to_string(n) + ": not two pieces separated by a space "
                    "(not a merges.txt)");
      merges.emplace_back(line.substr(0, sp), line.substr(sp + 1));
    }
    t->set_merges(merges, "tokenizer merges " + merges_path);
    for (const auto& [piece, id] : v.items())
      if (piece.size() > 2 && piece.front() == '<' && piece.back() == '>' && piece.find("|") != std::string::npos)
        t->add_special(piece, id_of_json(id, piece, what), what);
    t->finish(what);
    return t;
  }

  std::vector<int64_t> encode(std::string_view text) const override {
    std::vector<int64_t> ids;
    std::string s;
    if (prefix_space_ && (text.empty() || text.front() != ' ')) {
      s = " ";
      s += text;
      text = s;
    }
    const detail::CodePoints cps = detail::decode_utf8(text);
    for (size_t i = 0; i < cps.cp.size();) {
      const size_t end = detail::next_piece(cps.cp, i, pattern_);
      encode_piece(text.substr(cps.begin[i], cps.begin[end] - cps.begin[i]), ids);
      i = end;
    }
    return ids;
  }

  std::string decode(const std::vector<int64_t>& ids) const override {
    std::string chars, out;
    for (const int64_t id : ids) {
      if (id < 0 || id >= static_cast<int64_t>(pieces_.size()) || pieces_[static_cast<size_t>(id)].empty())
        throw Error("tokenizer " + path_ + ": id " + std::to_string(id) + " is not in the vocabulary");
      if (special_.count(id)) {
        out += bytes_of(chars);
        chars.clear();
        out += pieces_[static_cast<size_t>(id)];
      } else {
        chars += pieces_[static_cast<size_t>(id)];
      }
    }
    return out + bytes_of(chars);
  }

  int64_t vocab() const override { return static_cast<int64_t>(pieces_.size()); }
  int64_t eod() const override { return eod_; }
  int64_t bos() const override { return bos_; }
  std::string name() const override { return "bpe:" + path_; }
  int64_t id_of(const std::string& piece) const {
    const auto it = ids_.find(piece);
    return it == ids_.end() ? -1 : it->second;
  }

 private:
  explicit BpeTokenizer(std::string path) : path_(std::move(path)) {
    const auto& chars = detail::byte_chars();
    for (int b = 0; b < 256; ++b) char_byte_[chars[static_cast<size_t>(b)]] = static_cast<char>(b);
  }

  static std::unique_ptr<BpeTokenizer> from_tokenizer_json_value(const std::string& path, const std::string& text,
                                                                 const nlohmann::json& j, const std::string& what) {
    using detail::array_field;
    using detail::flag_field;
    using detail::text_field;
    if (!j.is_object() || !j.contains("model") || !j["model"].is_object())
      throw Error(what + ": no \"model\" object (not a Hugging Face tokenizer.json)");
    const auto& m = j["model"];
    const std::string type = text_field(m, "type", "", what, "model");
    if (type != "BPE") throw Error(what + ": model.type is " + (type.empty() ? "(none)" : type) + "; only BPE is supported");
    if (j.contains("normalizer") && !j["normalizer"].is_null())
      throw Error(what + ": \"normalizer\" " +
                  (j["normalizer"].is_object() ? text_field(j["normalizer"], "type", "?", what, "normalizer") : "?") +
                  " is not supported (byte-level BPE has none)");
    auto t = std::unique_ptr<BpeTokenizer>(new BpeTokenizer(path));
    t->id_limit_ = id_limit_for(text);
    t->ignore_merges_ = flag_field(m, "ignore_merges", false, what, "model");
    t->pre_tokenizer(j.contains("pre_tokenizer") ? j["pre_tokenizer"] : nlohmann::json(), what);
    if (!m.contains("vocab") || !m["vocab"].is_object()) throw Error(what + ": model.vocab is not an object");
    for (const auto& [piece, id] : m["vocab"].items()) t->add_piece(piece, id_of_json(id, piece, what), what);
    std::vector<std::pair<std::string, std::string>> merges;
    const auto& listed = array_field(m, "merges", what, "model");
    for (size_t k = 0; k < listed.size(); ++k) {
      const auto& mg = listed[k];
      const std::string at = "model.merges[" + std::to_string(k) + "]";
      if (mg.is_string()) {
        const std::string s = mg.get<std::string>();
        const size_t sp = s.find(' ', 1);
        if (sp == std::string::npos) throw Error(what + ": " + at + " '" + s + "' is not two pieces");
        merges.emplace_back(s.substr(0, sp), s.substr(sp + 1));
      } else if (mg.is_array() && mg.size() == 2 && mg[0].is_string() && mg[1].is_string()) {
        merges.emplace_back(mg[0].get<std::string>(), mg[1].get<std::string>());
      } else {
        throw Error(what + ": " + at + " is " +
                    (mg.is_array() ? "an array of " + std::to_string(mg.size()) + " values" : std::string(mg.type_name())) +
                    ", not two pieces (\"a b\" or [\"a\", \"b\"])");
      }
    }
    t->set_merges(merges, what);
    const auto& added = array_field(j, "added_tokens", what, "the file");
    for (size_t k = 0; k < added.size(); ++k) {
      const std::string at = "added_tokens[" + std::to_string(k) + "]";
      const auto& a = added[k];
      detail::need_object(a, what, at);
      if (!a.contains("content") || !a["content"].is_string())
        throw Error(what + ": " + at + ".content is " + (a.contains("content") ? a["content"].type_name() : "missing") +
                    ", not a string");
      if (!a.contains("id")) throw Error(what + ": " + at + ".id is missing");
      const std::string content = a["content"].get<std::string>();
      t->add_special(content, id_of_json(a["id"], content, what, at + ".id"), what);
    }
    t->finish(what);
    return t;
  }

  void pre_tokenizer(const nlohmann::json& p, const std::string& what) {
    using detail::flag_field;
    using detail::text_field;
    if (p.is_null()) throw Error(what + ": no pre_tokenizer (byte-level BPE needs ByteLevel)");
    const std::string type = text_field(p, "type", "", what, "pre_tokenizer");
    if (type == "ByteLevel") {
      prefix_space_ = flag_field(p, "add_prefix_space", false, what, "pre_tokenizer");
      if (!flag_field(p, "use_regex", true, what, "pre_tokenizer"))
        throw Error(what + ": pre_tokenizer ByteLevel without use_regex is not supported");
      pattern_ = detail::PreTokenizer::kGpt2;
      return;
    }
    if (type != "Sequence" || !p.contains("pretokenizers") || !p["pretokenizers"].is_array() ||
        p["pretokenizers"].size() != 2)
      throw Error(what + ": pre_tokenizer " + type +
                  " is not supported (ByteLevel, or Sequence of Split and ByteLevel without regex)");
    const auto& split = p["pretokenizers"][0];
    const auto& bl = p["pretokenizers"][1];
    const std::string s0 = "pre_tokenizer.pretokenizers[0]", s1 = "pre_tokenizer.pretokenizers[1]";
    if (text_field(split, "type", "", what, s0) != "Split" || text_field(bl, "type", "", what, s1) != "ByteLevel" ||
        flag_field(bl, "use_regex", true, what, s1) || flag_field(bl, "add_prefix_space", false, what, s1))
      throw Error(what + ": pre_tokenizer Sequence must be [Split, ByteLevel with use_regex false]");
    if (text_field(split, "behavior", "", what, s0) != "Isolated" || flag_field(split, "invert", false, what, s0))
      throw Error(what + ": pre_tokenizer Split must have behavior Isolated, not inverted");
    const std::string re =
        split.contains("pattern") ? text_field(split["pattern"], "Regex", "", what, s0 + ".pattern") : "";
    if (re == kGpt2Pattern) {
      pattern_ = detail::PreTokenizer::kGpt2;
    } else if (re == kLlama3Pattern || re == kCl100kPattern) {
      pattern_ = detail::PreTokenizer::kLlama3;
    } else {
      throw Error(what + ": pre_tokenizer Split pattern '" + re +
                  "' is not supported (GPT-2's and Llama 3's / cl100k's are)");
    }
  }

  // A piece's id as the file gives it: an integer (nlohmann converts any
  // number, and a float outside int64's range would make that undefined).
  static int64_t id_of_json(const nlohmann::json& id, const std::string& piece, const std::string& what,
                            const std::string& key = "") {
    if (!id.is_number_integer() || (id.is_number_unsigned() && id.get<uint64_t>() > (uint64_t{1} << 31)))
      throw Error(what + ": " + (key.empty() ? "" : key + ": ") + "piece '" + piece + "' has id " +
                  (id.is_string() || id.is_number() || id.is_boolean() || id.is_null() ? id.dump() : id.type_name()) +
                  " (" + id.type_name() + "), not an integer id");
    return id.get<int64_t>();
  }

  // The table is indexed by id: an id far beyond the pieces a file lists
  // would allocate a table of holes. A file of n bytes lists fewer than n
  // pieces, and vocabularies number their ids from 0 with few holes; the
  // floor leaves room for a small file whose special ids sit high.
  static int64_t id_limit_for(const std::string& file_text) {
    return std::max<int64_t>(static_cast<int64_t>(file_text.size()), int64_t{1} << 20);
  }
  void add_piece(const std::string& piece, int64_t id, const std::string& what) {
    if (id < 0 || id > (int64_t{1} << 31)) throw Error(what + ": piece '" + piece + "' has id " + std::to_string(id));
    if (id >= id_limit_)
      throw Error(what + ": piece '" + piece + "' has id " + std::to_string(id) + ", beyond the " +
                  std::to_string(id_limit_) + " ids a file of its size can number (ids run from 0 with few holes)");
    if (piece.empty()) throw Error(what + ": an empty piece has id " + std::to_string(id));
    if (static_cast<int64_t>(pieces_.size()) <= id) pieces_.resize(static_cast<size_t>(id) + 1);
    std::string& slot = pieces_[static_cast<size_t>(id)];
    // An added token repeats its vocabulary entry (same piece, same id); two
    // pieces at one id would decode that id to one of them at random.
    if (!slot.empty() && slot != piece)
      throw Error(what + ": pieces '" + slot + "' and '" + piece + "' both have id " + std::to_string(id) +
                  " (each id must name one piece)");
    slot = piece;
    ids_[piece] = id;
  }

  void add_special(const std::string& content, int64_t id, const std::string& what) {
    add_piece(content, id, what);
    special_.insert(id);
  }

  void set_merges(const std::vector<std::pair<std::string, std::string>>& merges, const std::string& what) {
    for (size_t r = 0; r < merges.size(); ++r) {
      const int64_t a = id_of(merges[r].first), b = id_of(merges[r].second);
      const int64_t c = id_of(merges[r].first + merges[r].second);
      if (a < 0 || b < 0 || c < 0)
        throw Error(what + ": merge " + std::to_string(r + 1) + " '" + merges[r].first + " " + merges[r].second +
                    "' names a piece that is not in the vocabulary");
      merges_.emplace(pair_key(a, b), Merge{static_cast<int32_t>(r), static_cast<int32_t>(c)});
    }
  }

  void finish(const std::string& what) {
    for (int b = 0; b < 256; ++b) {
      byte_id_[b] = id_of(detail::byte_chars()[static_cast<size_t>(b)]);
      if (byte_id_[b] < 0)
        throw Error(what + ": the vocabulary lacks byte " + std::to_string(b) + " (not a byte-level BPE)");
    }
    for (const char* name : {"<|endoftext|>", "<|end_of_text|>", "</s>", "<eos>", "<|eos|>"})
      if (eod_ < 0) eod_ = id_of(name);
    for (const char* name : {"<|begin_of_text|>", "<s>", "<bos>"})
      if (bos_ < 0) bos_ = id_of(name);
    if (eod_ < 0)
      throw Error(what + ": no end-of-text token (<|endoftext|>, <|end_of_text|>, </s> or <eos>) to end documents with");
  }

  static uint64_t pair_key(int64_t a, int64_t b) { return (static_cast<uint64_t>(a) << 32) | static_cast<uint64_t>(b); }

  // One pre-tokenized piece: its bytes as ids, then merges lowest rank first
  // (leftmost on ties), as GPT-2's and Hugging Face's BPE do.
  void encode_piece(std::string_view bytes, std::vector<int64_t>& ids) const {
    if (ignore_merges_) {
      std::string whole;
      for (const char c : bytes) whole += detail::byte_chars()[static_cast<unsigned char>(c)];
      if (const int64_t id = id_of(whole); id >= 0) {
        ids.push_back(id);
        return;
      }
    }
    std::vector<int64_t> sym;
    sym.reserve(bytes.size());
    for (const char c : bytes) sym.push_back(byte_id_[static_cast<unsigned char>(c)]);
    while (sym.size() > 1) {
      int32_t best_rank = INT32_MAX, best_to = -1;
      size_t best = 0;
      for (size_t k = 0; k + 1 < sym.size(); ++k) {
        const auto it = merges_.find(pair_key(sym[k], sym[k + 1]));
        if (it != merges_.end() && it->second.rank < best_rank) best_rank = it->second.rank, best_to = it->second.to, best = k;
      }
      if (best_to < 0) break;
      // Every occurrence of that pair, left to right.
      const int64_t a = sym[best], b = sym[best + 1];
      size_t w = 0;
      for (size_t k = 0; k < sym.size(); ++w) {
        if (k + 1 < sym.size() && sym[k] == a && sym[k + 1] == b) {
          sym[w] = best_to, k += 2;
        } else {
          sym[w] = sym[k], ++k;
        }
      }
      sym.resize(w);
    }
    ids.insert(ids.end(), sym.begin(), sym.end());
  }

  std::string bytes_of(const std::string& chars) const {
    std::string out;
    for (size_t i = 0; i < chars.size();) {
      const size_t n = (static_cast<unsigned char>(chars[i]) & 0xE0) == 0xC0 ? 2 : 1;
      const auto it = char_byte_.find(chars.substr(i, n));
      if (it == char_byte_.end()) throw Error("tokenizer " + path_ + ": a piece holds a character outside the byte map");
      out += it->second;
      i += n;
    }
    return out;
  }

  static constexpr const char* kGpt2Pattern =
      R"('s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+)";
  static constexpr const char* kLlama3Pattern =
      R"((?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+)";
  static constexpr const char* kCl100kPattern =
      R"('(?i:[sdmt]|ll|ve|re)|[^\r\n\p{L}\p{N}]?+\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]++[\r\n]*|\s*[\r\n]|\s+(?!\S)|\s+)";

  struct Merge {
    int32_t rank, to;
  };
  std::string path_;
  std::vector<std::string> pieces_;  // by id ("" where no piece has the id)
  std::unordered_map<std::string, int64_t> ids_;
  std::unordered_map<uint64_t, Merge> merges_;
  std::unordered_set<int64_t> special_;
  std::unordered_map<std::string, char> char_byte_;
  int64_t byte_id_[256] = {};
  int64_t eod_ = -1, bos_ = -1;
  int64_t id_limit_ = 0;  // ids are below it (id_limit_for)
  bool prefix_space_ = false, ignore_merges_ = false;
  detail::PreTokenizer pattern_ = detail::PreTokenizer::kGpt2;
};

}  // namespace smp::sdk
