#include "messages.h"

#include <algorithm>
#include <climits>

namespace smp::rdzv {

namespace {

using nlohmann::json;

const json* field(const json& j, const char* key) {
  auto it = j.find(key);
  return it == j.end() ? nullptr : &*it;
}

int int_field(const json& j, const char* key, int64_t lo, int64_t hi) {
  const json* v = field(j, key);
  if (!v) throw Refused(std::string("message without \"") + key + "\"");
  if (!v->is_number_integer()) throw Refused(std::string("\"") + key + "\": expected an integer, got " + v->dump());
  const int64_t x = v->get<int64_t>();
  if (x < lo || x > hi)
    throw Refused(std::string("\"") + key + "\": " + std::to_string(x) + " is outside [" + std::to_string(lo) + ", " +
                  std::to_string(hi) + "]");
  return static_cast<int>(x);
}

std::string text_field(const json& j, const char* key, size_t max, bool required = true) {
  const json* v = field(j, key);
  if (!v) {
    if (required) throw Refused(std::string("message without \"") + key + "\"");
    return "";
  }
  if (!v->is_string()) throw Refused(std::string("\"") + key + "\": expected a string");
  std::string s = v->get<std::string>();
  if (s.size() > max) throw Refused(std::string("\"") + key + "\": longer than " + std::to_string(max) + " bytes");
  for (unsigned char c : s)
    if (c < 0x20 || c == 0x7f) throw Refused(std::string("\"") + key + "\": holds a control character");
  return s;
}

}  // namespace

// A reason is bounded as decode bounds it: the rest is cut, not the message.
std::string bounded(const std::string& why) {
  return why.size() <= kMaxWhy ? why : why.substr(0, kMaxWhy - 4) + " ...";
}

std::string encode(const Message& m) {
  json j = {{"t", m.type}};
  if (m.type == "hello")
    j.update({{"name", m.name}, {"nproc", m.nproc}, {"port", m.port}, {"min", m.min_nodes}, {"max", m.max_nodes},
              {"restarts", m.max_restarts}, {"grow", m.grow_now ? "now" : "checkpoint"}, {"job", m.job}});
  else if (m.type == "ready")
    j["port"] = m.port;
  else if (m.type == "committed")
    j["step"] = m.step;
  else if (m.type == "failed")
    j.update({{"round", m.round}, {"why", bounded(m.why)}});
  else if (m.type == "done")
    j["round"] = m.round;
  else if (m.type == "round")
    j.update({{"round", m.round}, {"node_rank", m.node_rank}, {"nnodes", m.nnodes}, {"nproc", m.nproc},
              {"world", m.world}, {"master_addr", m.master_addr}, {"port", m.port}, {"name", m.name},
              {"members", std::vector<std::string>(m.members.begin(),
                                                   m.members.begin() + std::min(m.members.size(), kMaxMembers))},
              {"reason", bounded(m.reason)}, {"previous_world", m.previous_world}});
  else if (m.type == "stop")
    j.update({{"round", m.round}, {"why", bounded(m.why)}});
  else if (m.type == "refuse")
    j["why"] = bounded(m.why);
  return j.dump(-1, ' ', false, json::error_handler_t::replace);
}

Message decode(const std::string& line) {
  if (line.size() > kMaxLine) throw Refused("a message longer than " + std::to_string(kMaxLine) + " bytes");
  const json j = json::parse(line, nullptr, /*allow_exceptions=*/false);
  if (j.is_discarded()) throw Refused("a message that is not JSON");
  if (!j.is_object()) throw Refused("a message that is not a JSON object");
  Message m;
  m.type = text_field(j, "t", 16);
  const std::string& t = m.type;
  constexpr int64_t kPortMax = 65535, kIntMax = INT_MAX;
  if (t == "hello") {
    m.name = text_field(j, "name", kMaxName);
    if (m.name.empty()) throw Refused("\"name\": empty");
    m.nproc = int_field(j, "nproc", 1, 4096);
    m.port = int_field(j, "port", 1, kPortMax);
    m.min_nodes = int_field(j, "min", 1, kMaxNodes);
    m.max_nodes = int_field(j, "max", 1, kMaxNodes);
    m.max_restarts = int_field(j, "restarts", 0, 1000000);
    const std::string grow = text_field(j, "grow", 16);
    if (grow != "now" && grow != "checkpoint") throw Refused("\"grow\": expected \"now\" or \"checkpoint\"");
    m.grow_now = grow == "now";
    m.job = text_field(j, "job", 64);
    if (m.name.size() > kMaxName - 8) throw Refused("\"name\": longer than " + std::to_string(kMaxName - 8) + " bytes");
  } else if (t == "ready") {
    m.port = int_field(j, "port", 1, kPortMax);
  } else if (t == "committed") {
    const json* v = field(j, "step");
    if (!v || !v->is_number_integer() || v->get<int64_t>() < 0)
      throw Refused("\"step\": expected a step number");
    m.step = v->get<int64_t>();
  } else if (t == "failed") {
    m.round = int_field(j, "round", 0, kIntMax);
    m.why = text_field(j, "why", kMaxWhy, false);
  } else if (t == "done") {
    m.round = int_field(j, "round", 0, kIntMax);
  } else if (t == "round") {
    m.round = int_field(j, "round", 0, kIntMax);
    m.nnodes = int_field(j, "nnodes", 1, kMaxNodes);
    m.node_rank = int_field(j, "node_rank", 0, m.nnodes - 1);
    m.nproc = int_field(j, "nproc", 1, 4096);
    m.world = int_field(j, "world", 1, kIntMax);
    if (static_cast<int64_t>(m.nnodes) * m.nproc != m.world) throw Refused("\"world\": not nnodes x nproc");
    m.master_addr = text_field(j, "master_addr", 256);
    m.port = int_field(j, "port", 1, kPortMax);
    m.reason = text_field(j, "reason", kMaxWhy, false);
    m.previous_world = int_field(j, "previous_world", 0, kIntMax);
    m.name = text_field(j, "name", kMaxName);
    const json* members = field(j, "members");
    if (!members || !members->is_array() || members->size() > std::min<size_t>(m.nnodes, kMaxMembers))
      throw Refused("\"members\": expected the names of the first nodes");
    for (const json& n : *members) {
      if (!n.is_string() || n.get<std::string>().size() > kMaxName) throw Refused("\"members\": expected names");
      m.members.push_back(n.get<std::string>());
    }
  } else if (t == "stop") {
    m.round = int_field(j, "round", 0, kIntMax);
    m.why = text_field(j, "why", kMaxWhy, false);
  } else if (t == "refuse") {
    m.why = text_field(j, "why", kMaxWhy, false);
  } else if (t != "finish" && t != "ping") {
    throw Refused("\"t\": unknown message type \"" + t + "\"");
  }
  return m;
}

std::vector<std::string> take_lines(std::string& pending, const char* data, size_t n) {
  std::vector<std::string> lines;
  for (size_t i = 0; i < n; ++i) {
    if (data[i] == '\n') {
      lines.push_back(std::move(pending));
      pending.clear();
      continue;
    }
    if (pending.size() >= kMaxLine) throw Refused("a message longer than " + std::to_string(kMaxLine) + " bytes");
    pending.push_back(data[i]);
  }
  return lines;
}

}  // namespace smp::rdzv
