// How deep a TOML text nests, bounded before toml++ parses it.
//
// toml++ builds one table per segment of a table header or a dotted key and
// one node per array or inline table, and frees, copies and prints them by
// recursion: a job or cluster file of 10^5 nested tables (`[a.a.a....]`, a
// dotted key `a.a.a.... = 1`, `x = {a = {a = ...}}`) overflows the stack of
// whatever reads it. This scanner, a lexer that skips strings (basic, literal,
// multi-line) and comments, measures the depth every table path reaches (a
// header's segments, then a key's dotted segments, then each array or inline
// table the value opens) and refuses a text deeper than `max_depth`, or
// larger than `max_bytes`, naming the origin and the line. It accepts what
// toml++ accepts as long as it nests no deeper; what it lets through that is
// not TOML, toml++ refuses.
//
// Header-only, no LibTorch; throws smp::input::Error (input_file.hpp).
#pragma once

#include <smp/common/input_file.hpp>

#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

namespace smp::input {

// Far deeper than any job or cluster file nests (a plugin's free-form table
// with a nested table and an array of tables inside is 4 or 5).
inline constexpr int kMaxTomlDepth = 32;

namespace detail {

class TomlNestingScanner {
 public:
  TomlNestingScanner(std::string_view text, const std::string& origin, int max_depth)
      : s_(text), origin_(origin), max_(max_depth) {}

  void run() {
    bool statement_start = true;  // at the top level, where a header or a key may begin
    int value_level = -1;         // at the top level: the level of the value after '=' (-1: none expected)
    while (i_ < s_.size()) {
      const char c = s_[i_];
      if (c == '\n') {
        ++line_;
        ++i_;
        if (stack_.empty()) statement_start = true, value_level = -1;
        continue;
      }
      if (c == ' ' || c == '\t' || c == '\r') {
        ++i_;
        continue;
      }
      if (c == '#') {
        skip_comment();
        continue;
      }
      if (stack_.empty()) {
        if (statement_start) {
          statement_start = false;
          if (c == '[') {
            header_ = scan_header();
            check(header_, "a table header");
          } else {
            const int k = scan_key(false);
            value_level = header_ + k;
            check(value_level, "a dotted key");
          }
          continue;
        }
        if (value_level >= 0) {
          const int level = value_level;
          value_level = -1;
          begin_value(level);
          continue;
        }
        skip_token();  // what follows a value on its line: toml++ refuses it
        continue;
      }
      Frame& f = stack_.back();
      if (c == ']' || c == '}') {  // a mismatched one is refused by toml++; popped all the same
        stack_.pop_back();
        ++i_;
        continue;
      }
      if (c == ',') {
        if (f.close == '}') f.expect_key = true;
        ++i_;
        continue;
      }
      if (f.close == ']') {
        begin_value(f.level + 1);
        continue;
      }
      if (f.expect_key) {
        const int k = scan_key(true);
        f.expect_key = false;
        f.value_level = f.level + k;
        check(f.value_level, "a dotted key in an inline table");
        continue;
      }
      begin_value(f.value_level < 0 ? f.level + 1 : f.value_level);
    }
  }

 private:
  struct Frame {
    char close;            // ']' or '}'
    int level;             // the level of the array or table itself
    bool expect_key;       // an inline table: a key comes next
    int value_level = -1;  // an inline table: the level of the value after its key
  };

  void check(int level, const char* what) const {
    if (level > max_)
      throw Error(origin_ + ":" + std::to_string(line_) + ": nested deeper than " + std::to_string(max_) +
                  " levels (" + what +
                  "; tables, dotted keys, arrays and inline tables count together): no job or cluster file nests so");
  }

  bool at(std::string_view lit) const { return s_.substr(i_, lit.size()) == lit; }

  void skip_comment() {
    while (i_ < s_.size() && s_[i_] != '\n') ++i_;
  }

  // A string of any of TOML's four kinds, starting at its opening quote.
  // An unterminated one ends at its line's end (single-line) or the text's.
  void skip_string() {
    const char q = s_[i_];
    const bool basic = q == '"';
    if (at(basic ? "\"\"\"" : "'''")) {
      i_ += 3;
      while (i_ < s_.size()) {
        const char c = s_[i_];
        if (basic && c == '\\') {
          if (i_ + 1 < s_.size() && s_[i_ + 1] == '\n') ++line_;
          i_ += 2;
          continue;
        }
        if (c == '\n') ++line_;
        if (c == q && at(basic ? "\"\"\"" : "'''")) {
          i_ += 3;
          // Up to two more quotes belong to the content ("""a""""").
          for (int extra = 0; extra < 2 && i_ < s_.size() && s_[i_] == q; ++extra) ++i_;
          return;
        }
        ++i_;
      }
      return;
    }
    ++i_;
    while (i_ < s_.size()) {
      const char c = s_[i_];
      if (c == '\n') return;
      if (basic && c == '\\') {
        i_ += 2;
        continue;
      }
      ++i_;
      if (c == q) return;
    }
  }

  // A scalar (number, boolean, date, or something toml++ refuses).
  void skip_token() {
    if (s_[i_] == '"' || s_[i_] == '\'') {
      skip_string();
      return;
    }
    bool moved = false;
    while (i_ < s_.size()) {
      const char c = s_[i_];
      if (c == ',' || c == ']' || c == '}' || c == '[' || c == '{' || c == '#' || c == '\n' || c == ' ' ||
          c == '\t' || c == '\r' || c == '"' || c == '\'')
        break;
      ++i_;
      moved = true;
    }
    if (!moved) ++i_;  // a bracket where none belongs: toml++ refuses it
  }

  void begin_value(int level) {
    const char c = s_[i_];
    if (c == '[' || c == '{') {
      check(level, c == '[' ? "an array" : "an inline table");
      stack_.push_back(Frame{c == '[' ? ']' : '}', level, c == '{'});
      ++i_;
      return;
    }
    skip_token();
  }

  // The segments of a key up to its '=' (consumed), or of an inline table's
  // key; stops without consuming at a line's end, a comment, or (in an inline
  // table) a closing brace or comma.
  int scan_key(bool inline_table) {
    int segments = 1;
    while (i_ < s_.size()) {
      const char c = s_[i_];
      if (c == '=') {
        ++i_;
        return segments;
      }
      if (c == '\n' || c == '#' || (inline_table && (c == '}' || c == ','))) return segments;
      if (c == '"' || c == '\'') {
        skip_string();
        continue;
      }
      if (c == '.') ++segments;
      ++i_;
    }
    return segments;
  }

  // `[a.b]` or `[[a.b]]`, from its first bracket: its segments.
  int scan_header() {
    ++i_;
    if (i_ < s_.size() && s_[i_] == '[') ++i_;
    int segments = 1;
    while (i_ < s_.size()) {
      const char c = s_[i_];
      if (c == ']') {
        ++i_;
        if (i_ < s_.size() && s_[i_] == ']') ++i_;
        return segments;
      }
      if (c == '\n' || c == '#') return segments;
      if (c == '"' || c == '\'') {
        skip_string();
        continue;
      }
      if (c == '.') ++segments;
      ++i_;
    }
    return segments;
  }

  std::string_view s_;
  const std::string& origin_;
  int max_;
  size_t i_ = 0;
  int64_t line_ = 1;
  int header_ = 0;
  std::vector<Frame> stack_;  // at most max_ deep: a deeper push is refused first
};

}  // namespace detail

// Refuses `text` (a TOML document from `origin`: a file's path, "--set k=v")
// larger than `max_bytes` or nesting any table path deeper than `max_depth`
// levels, naming the origin and the line. Call it before toml::parse.
inline void check_toml_nesting(std::string_view text, const std::string& origin, int max_depth = kMaxTomlDepth,
                               int64_t max_bytes = kMaxConfigBytes) {
  if (static_cast<int64_t>(text.size()) > max_bytes)
    throw Error(origin + ": " + std::to_string(text.size()) + " bytes of TOML, more than the " +
                std::to_string(max_bytes) + " such a file may have");
  detail::TomlNestingScanner(text, origin, max_depth).run();
}

// A TOML file from outside, read under the one discipline (a regular file of
// at most `max_bytes`: a named pipe is refused, not waited on) and checked by
// check_toml_nesting; the text, ready for toml::parse.
inline std::string read_toml_file(const std::string& path, const std::string& what, int max_depth = kMaxTomlDepth,
                                  int64_t max_bytes = kMaxConfigBytes) {
  std::string text = read_file(path, what, max_bytes);
  check_toml_nesting(text, path, max_depth, max_bytes);
  return text;
}

}  // namespace smp::input
