// smp-render-docs: the figures of the docs, rendered from bench/results/*.json.
//
//   smp-render-docs --results bench/results TEMPLATE OUT     write OUT from TEMPLATE
//   smp-render-docs --results bench/results TEMPLATE OUT --check
//                                                          exit 1 when OUT differs
//
// A template is markdown in which every figure is a placeholder:
//
//   {{gpt.json:/smp_1rank_over_plain_paired/median_of_ratio_of_means|%.3f}}
//   {{range gpt.json:/smp_1rank_over_plain_paired/per_repeat_ratio_of_means|%.2f}}
//
// i.e. {{[function ]file:json-pointer[|printf format]}}. Functions over a list
// of numbers: median, min, max, range ("min-max"), count; over a number: pct
// (times 100), mib (bytes in MiB). Without a function the value itself: a number (format, default
// %g), a string, or a boolean ("yes"/"no"). The check is a test (CI), so a
// figure edited by hand in the rendered file, or a result changed without
// rendering again, fails it.
//
// A pointer step may select a list's element by a key instead of its index,
// so that a figure does not move to another element when the list's order
// changes:
//
//   {{op-profile.json:/shapes/0/ops/[name=aten::select]/smp_calls|%.0f}}
//   {{pipeline-sim.json:/runs/1f1b/[measured_step_seconds=@/summary/1f1b/median_measured_step_seconds]/delivery_ms}}
//
// [key=value] is the one element (an object) whose member key equals value: a
// string member compares with value's text; any other with value read as JSON
// (a number, true, false, null). [key=@/pointer] compares with the value at
// that pointer in the same file. No element, or more than one, is an error.
// Values hold no '|' and no unbalanced '[' or ']'.
#include <nlohmann/json.hpp>

#include <algorithm>
#include <cstdio>
#include <fstream>
#include <iostream>
#include <map>
#include <sstream>
#include <stdexcept>
#include <string>
#include <vector>

namespace {

using nlohmann::json;

std::string read_file(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) throw std::runtime_error(path + ": cannot read");
  std::ostringstream s;
  s << in.rdbuf();
  return s.str();
}

std::string format_number(double v, const std::string& fmt) {
  char buf[64];
  std::snprintf(buf, sizeof buf, fmt.empty() ? "%g" : fmt.c_str(), v);
  return buf;
}

std::vector<double> numbers(const json& v, const std::string& what) {
  if (!v.is_array() || v.empty()) throw std::runtime_error(what + ": expected a non-empty list of numbers");
  std::vector<double> out;
  for (const auto& e : v) {
    if (!e.is_number()) throw std::runtime_error(what + ": expected a list of numbers, found " + e.dump());
    out.push_back(e.get<double>());
  }
  return out;
}

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  const size_t n = v.size();
  return n % 2 ? v[n / 2] : (v[n / 2 - 1] + v[n / 2]) / 2;
}

class Renderer {
 public:
  explicit Renderer(std::string results) : results_(std::move(results)) {}

  // One placeholder's text, e.g. "range gpt.json:/a/b|%.2f".
  std::string expand(const std::string& spec, const std::string& where) {
    std::string body = spec, fmt, fn;
    if (auto bar = body.find('|'); bar != std::string::npos) fmt = body.substr(bar + 1), body = body.substr(0, bar);
    // A function is the word before the file (a selector's value may hold spaces).
    if (auto space = body.find(' '); space != std::string::npos && space < body.find(':'))
      fn = body.substr(0, space), body = body.substr(space + 1);
    const auto colon = body.find(':');
    if (colon == std::string::npos) throw std::runtime_error(where + ": {{" + spec + "}}: expected file:/pointer");
    const std::string file = body.substr(0, colon), pointer = body.substr(colon + 1);
    const json& doc = load(file);
    json::json_pointer ptr;
    try {
      ptr = json::json_pointer(resolve(doc, pointer, file));
    } catch (const std::exception& e) {
      throw std::runtime_error(where + ": {{" + spec + "}}: " + e.what());
    }
    if (!doc.contains(ptr)) throw std::runtime_error(where + ": {{" + spec + "}}: " + file + " has no " + pointer);
    const json& v = doc.at(ptr);
    const std::string what = where + ": " + file + ":" + pointer;
    if (fn.empty()) {
      if (v.is_number()) return format_number(v.get<double>(), fmt);
      if (v.is_string()) return v.get<std::string>();
      if (v.is_boolean()) return v.get<bool>() ? "yes" : "no";
      throw std::runtime_error(what + ": a list or table; give a function (median, min, max, range, count)");
    }
    if (fn == "pct") {
      if (!v.is_number()) throw std::runtime_error(what + ": pct needs a number");
      return format_number(100 * v.get<double>(), fmt);
    }
    if (fn == "mib") {
      if (!v.is_number()) throw std::runtime_error(what + ": mib needs a number");
      return format_number(v.get<double>() / (1024.0 * 1024.0), fmt);
    }
    if (fn == "count") {
      if (!v.is_array() && !v.is_object()) throw std::runtime_error(what + ": count needs a list");
      return std::to_string(v.size());
    }
    const std::vector<double> xs = numbers(v, what);
    if (fn == "median") return format_number(median(xs), fmt);
    if (fn == "min") return format_number(*std::min_element(xs.begin(), xs.end()), fmt);
    if (fn == "max") return format_number(*std::max_element(xs.begin(), xs.end()), fmt);
    if (fn == "range")
      return format_number(*std::min_element(xs.begin(), xs.end()), fmt) + "-" +
             format_number(*std::max_element(xs.begin(), xs.end()), fmt);
    throw std::runtime_error(where + ": {{" + spec + "}}: unknown function '" + fn +
                             "' (median, min, max, range, count, pct, mib)");
  }

  std::string render(const std::string& text, const std::string& name) {
    std::string out;
    size_t at = 0, line = 1;
    while (true) {
      const size_t open = text.find("{{", at);
      if (open == std::string::npos) break;
      const size_t close = text.find("}}", open);
      line += std::count(text.begin() + at, text.begin() + open, '\n');
      const std::string where = name + ":" + std::to_string(line);
      if (close == std::string::npos) throw std::runtime_error(where + ": '{{' without '}}'");
      out += text.substr(at, open - at);
      out += expand(text.substr(open + 2, close - open - 2), where);
      line += std::count(text.begin() + open, text.begin() + close, '\n');
      at = close + 2;
    }
    return out + text.substr(at);
  }

 private:
  // The pointer with every [key=value] step replaced by the index it selects.
  static std::string resolve(const json& doc, const std::string& pointer, const std::string& file) {
    std::string out;
    size_t i = 0;
    while (i < pointer.size()) {
      if (pointer[i] != '/') return out + pointer.substr(i);  // json_pointer names the error
      size_t end = ++i;
      for (int depth = 0; end < pointer.size() && (depth > 0 || pointer[end] != '/'); ++end)
        depth += pointer[end] == '[' ? 1 : pointer[end] == ']' ? -1 : 0;
      const std::string step = pointer.substr(i, end - i);
      i = end;
      const size_t eq = step.find('=');
      if (step.size() < 2 || step.front() != '[' || step.back() != ']' || eq == std::string::npos) {
        out += "/" + step;
        continue;
      }
      const std::string key = step.substr(1, eq - 1), text = step.substr(eq + 1, step.size() - eq - 2);
      const json::json_pointer at(out);
      if (!doc.contains(at) || !doc.at(at).is_array())
        throw std::runtime_error(file + ": " + (out.empty() ? "/" : out) + " is not a list, for " + step);
      // What a member must equal: as JSON (numbers compare as numbers), and as
      // text for a string member.
      json want;
      std::string want_text = text;
      if (text.rfind("@/", 0) == 0) {
        const json::json_pointer ref(resolve(doc, text.substr(1), file));
        if (!doc.contains(ref)) throw std::runtime_error(file + " has no " + text.substr(1) + ", for " + step);
        want = doc.at(ref);
        want_text = want.is_string() ? want.get<std::string>() : want.dump();
      } else {
        want = json::parse(text, nullptr, /*allow_exceptions=*/false);
        if (want.is_discarded() || want.is_structured()) want = text;
      }
      const json& list = doc.at(at);
      std::vector<size_t> hits;
      for (size_t k = 0; k < list.size(); ++k) {
        const json& e = list[k];
        if (!e.is_object() || !e.contains(key)) continue;
        const json& v = e.at(key);
        if (v.is_string() ? v.get<std::string>() == want_text : v == want) hits.push_back(k);
      }
      if (hits.size() != 1)
        throw std::runtime_error(file + ": " + std::to_string(hits.size()) + " elements of " + (out.empty() ? "/" : out) +
                                 " match " + step + " (" + key + " = " + want.dump() + "); a selector must match one");
      out += "/" + std::to_string(hits.front());
    }
    return out;
  }

  const json& load(const std::string& file) {
    auto it = docs_.find(file);
    if (it != docs_.end()) return it->second;
    const std::string path = results_ + "/" + file;
    json j;
    try {
      j = json::parse(read_file(path));
    } catch (const json::exception& e) {
      throw std::runtime_error(path + ": " + e.what());
    }
    return docs_.emplace(file, std::move(j)).first->second;
  }

  std::string results_;
  std::map<std::string, json> docs_;
};

}  // namespace

int main(int argc, char** argv) {
  std::vector<std::string> args(argv + 1, argv + argc);
  std::string results = "bench/results";
  bool check = false;
  std::vector<std::string> files;
  for (size_t i = 0; i < args.size(); ++i) {
    if (args[i] == "--results" && i + 1 < args.size()) results = args[++i];
    else if (args[i] == "--check") check = true;
    else files.push_back(args[i]);
  }
  if (files.size() != 2) {
    std::cerr << "usage: smp-render-docs [--results DIR] TEMPLATE OUT [--check]\n";
    return 2;
  }
  try {
    Renderer r(results);
    const std::string rendered = r.render(read_file(files[0]), files[0]);
    if (check) {
      std::string current;
      try {
        current = read_file(files[1]);
      } catch (const std::exception&) {
      }
      if (current == rendered) {
        std::cout << files[1] << ": up to date with " << files[0] << " and " << results << "\n";
        return 0;
      }
      // The first differing line, to say where.
      std::istringstream a(current), b(rendered);
      std::string la, lb;
      for (int n = 1;; ++n) {
        const bool ga = static_cast<bool>(std::getline(a, la)), gb = static_cast<bool>(std::getline(b, lb));
        if (!ga && !gb) break;
        if (la != lb || ga != gb) {
          std::cerr << files[1] << ":" << n << ": differs from what " << files[0] << " renders from " << results
                    << "\n  file:     " << la << "\n  rendered: " << lb
                    << "\nrender it again: smp-render-docs --results " << results << " " << files[0] << " " << files[1]
                    << "\n";
          break;
        }
      }
      return 1;
    }
    std::ofstream out(files[1], std::ios::binary);
    out << rendered;
    if (!out) throw std::runtime_error(files[1] + ": cannot write");
    return 0;
  } catch (const std::exception& e) {
    std::cerr << "smp-render-docs: " << e.what() << "\n";
    return 1;
  }
}
