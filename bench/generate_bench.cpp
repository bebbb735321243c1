#include "generate_bench.h"

#include "checkpoint_bench.h"
#include "jobs.h"
#include "plain_decode.h"

#include <ATen/Parallel.h>
#include <boost/filesystem.hpp>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <iostream>
#include <set>
#include <stdexcept>

namespace bench {

namespace {

namespace fs = boost::filesystem;

// The median of every value (jobs.h's, from the first).
double median(const std::vector<double>& v) { return median_from(v, 0); }

// One round under the validity rule (jobs.h's measure_valid): `round`
// measures and returns what stores its figures, called for the attempt that
// stands. r counts from 0.
template <class Round>
void valid_round(const GenerateBenchOptions& o, const std::string& label, int r, Round&& round) {
  measure_valid(label, r + 1, o.quiet_cores, o.job_wait_s, round)();
}

using Ran = CommandResult;
Ran run(const std::string& command) { return run_command(command); }

Ran must(const std::string& command) {
  Ran r = run(command);
  if (r.code != 0) throw std::runtime_error("failed (" + std::to_string(r.code) + "): " + command + "\n" + r.output);
  return r;
}

int64_t folder_bytes(const std::string& dir, const std::string& suffix) {
  int64_t total = 0;
  for (fs::recursive_directory_iterator it(dir), end; it != end; ++it)
    if (fs::is_regular_file(it->path()) && it->path().string().size() >= suffix.size() &&
        it->path().string().compare(it->path().string().size() - suffix.size(), suffix.size(), suffix) == 0)
      total += static_cast<int64_t>(fs::file_size(it->path()));
  return total;
}

// b prompts of `length` byte tokens, each from another stretch of one text.
std::vector<std::string> prompts_of(int64_t b, int64_t length) {
  const std::string text =
      "It was the best of times, it was the worst of times, it was the age of wisdom, it was the age of foolishness, "
      "it was the epoch of belief, it was the epoch of incredulity, it was the season of Light, it was the season of "
      "Darkness, it was the spring of hope, it was the winter of despair.";
  std::vector<std::string> out;
  for (int64_t i = 0; i < b; ++i) out.push_back(text.substr(static_cast<size_t>(i * 23), static_cast<size_t>(length)));
  return out;
}

}  // namespace

nlohmann::json run_generate_bench(const GenerateBenchOptions& o) {
  const Paths& P = paths();
  const std::string work = (P.work_dir.empty() ? fs::temp_directory_path().string() + "/smp-bench" : P.work_dir) +
                           "/generate";
  fs::remove_all(work);
  fs::create_directories(work);
  const std::string bin = P.bin_dir + "/";
  // The model: one training step of the bench Llama, saved.
  must(bin + "smp-launch --nproc-per-node 1 --plugin gpt --config " + o.config + " --set 'run.dir=\"" + work +
       "/train\"'");
  const std::string ckpt = work + "/train/checkpoints";
  nlohmann::json result;
  result["what"] =
      "smp-generate (1 rank, run.threads = 1, KV cache, greedy, prompts of one length) vs a plain LibTorch greedy "
      "loop with a KV cache over the exported Hugging Face folder (bench/plain_decode.cpp, at::set_num_threads(1)), "
      "tokens/s = new tokens / (prompts in to the last token out, model loaded before), each in its own round, "
      "interleaved; and smp-checkpoint export --format hf / import wall times (the process, model read and written) "
      "against the disk's sequential write throughput (write + fsync) measured in the same round";
  result["new_tokens"] = o.new_tokens;
  result["prompt_tokens"] = o.prompt_tokens;
  result["repeat"] = o.repeat;
  // Export and import, rounds interleaved with the disk probe.
  std::vector<double> export_s, import_s, disk, export_over_disk, import_over_disk;
  int64_t hf_bytes = 0, ckpt_bytes = folder_bytes(ckpt, ".safetensors");
  for (int r = 0; r < o.repeat; ++r)
    valid_round(o, "exchange", r, [&] {
      fs::remove_all(work + "/hf");
      fs::remove_all(work + "/imported");
      const Ran e = must(bin + "smp-checkpoint export " + ckpt + " " + work + "/hf --format hf");
      hf_bytes = folder_bytes(work + "/hf", ".safetensors");
      const Ran i = must(bin + "smp-checkpoint import " + work + "/hf " + work + "/imported --adapter gpt --format hf");
      const double d = disk_write_bytes_per_s(work + "/probe", {hf_bytes});
      return [&, e, i, d] {
        export_s.push_back(e.seconds), import_s.push_back(i.seconds), disk.push_back(d);
        export_over_disk.push_back(static_cast<double>(hf_bytes) / e.seconds / d);
        import_over_disk.push_back(static_cast<double>(hf_bytes) / i.seconds / d);
        std::cout << "round " << r << ": export " << fmt(e.seconds) << " s, import " << fmt(i.seconds) << " s, disk "
                  << human_bytes(d) << "/s" << std::endl;
      };
    });
  result["exchange"] = {{"checkpoint_bytes", ckpt_bytes},
                        {"hf_bytes", hf_bytes},
                        {"export_seconds", export_s},
                        {"import_seconds", import_s},
                        {"disk_write_bytes_per_s", disk},
                        {"export_throughput_over_disk", export_over_disk},
                        {"import_throughput_over_disk", import_over_disk},
                        {"median_export_seconds", median(export_s)},
                        {"median_import_seconds", median(import_s)},
                        {"median_disk_write_bytes_per_s", median(disk)},
                        {"median_export_throughput_over_disk", median(export_over_disk)},
                        {"median_import_throughput_over_disk", median(import_over_disk)}};
  // Generation at batch 1 and 8.
  at::set_num_threads(1);
  for (const int64_t b : {int64_t{1}, int64_t{8}}) {
    const std::vector<std::string> prompts = prompts_of(b, o.prompt_tokens);
    std::vector<std::vector<int64_t>> ids;
    std::string generate = bin + "smp-generate --plugin gpt --config " + o.config + " --checkpoint " + ckpt +
                           " --json --eos-id -1 --max-new-tokens " + std::to_string(o.new_tokens) +
                           " --set 'run.dir=\"" + work + "/gen\"' --set run.threads=1";
    for (const auto& p : prompts) {
      generate += " --prompt '" + p + "'";
      std::vector<int64_t> tokens(p.begin(), p.end());
      for (auto& t : tokens) t &= 0xff;
      ids.push_back(tokens);
    }
    std::vector<double> smp_rate, plain_rate, ratio;
    bool same_tokens = true;
    double logprob_gap = 0;
    size_t distinct = 0;
    for (int r = 0; r < o.repeat; ++r)
      valid_round(o, "generate batch " + std::to_string(b), r, [&] {
        const Ran s = must(generate);
        const PlainDecodeResult plain = plain_greedy_decode(work + "/hf", ids, o.new_tokens);
        return [&, s, plain] {
          const size_t at = s.output.rfind("{\"batch_size\"");
          if (at == std::string::npos) throw std::runtime_error("smp-generate printed no totals:\n" + s.output);
          const double smp =
              nlohmann::json::parse(s.output.substr(at, s.output.find('\n', at) - at))["tokens_per_s"];
          const double pl = static_cast<double>(plain.generated) / plain.seconds;
          // The same greedy tokens, prompt by prompt: the two loops compute one model.
          std::vector<std::vector<int64_t>> smp_ids;
          for (size_t p = s.output.find("{\"ids\""); p != std::string::npos; p = s.output.find("{\"ids\"", p + 1)) {
            const nlohmann::json line = nlohmann::json::parse(s.output.substr(p, s.output.find('\n', p) - p));
            smp_ids.push_back(line["ids"]);
            const std::vector<double> lp = line["logprobs"];
            const auto& theirs = plain.logprobs[smp_ids.size() - 1];
            for (size_t j = 0; j < std::min(lp.size(), theirs.size()); ++j)
              logprob_gap = std::max(logprob_gap, std::fabs(lp[j] - theirs[j]));
          }
          same_tokens = same_tokens && smp_ids == plain.ids;
          distinct = std::set<int64_t>(plain.ids[0].begin(), plain.ids[0].end()).size();
          smp_rate.push_back(smp), plain_rate.push_back(pl), ratio.push_back(smp / pl);
          std::cout << "batch " << b << " round " << r << ": smp " << fmt(smp) << " tokens/s, plain " << fmt(pl)
                    << " tokens/s" << std::endl;
        };
      });
    result["generation"]["batch_" + std::to_string(b)] = {{"batch", b},
                                                           {"smp_tokens_per_s", smp_rate},
                                                           {"plain_tokens_per_s", plain_rate},
                                                           {"smp_over_plain", ratio},
                                                           {"median_smp_tokens_per_s", median(smp_rate)},
                                                           {"median_plain_tokens_per_s", median(plain_rate)},
                                                           {"median_smp_over_plain", median(ratio)},
                                                           {"same_greedy_tokens", same_tokens},
                                                           {"largest_logprob_difference", logprob_gap},
                                                           {"distinct_tokens_of_first_prompt", distinct},
                                                           {"goal", "median smp / plain >= 1.0"},
                                                           {"goal_met", median(ratio) >= 1.0}};
  }
  fs::remove_all(work);
  return result;
}

}  // namespace bench
