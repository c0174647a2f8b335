#include "common/checkpoint/manifest.h"

#include <dirent.h>

#include <algorithm>
#include <cstdio>

#include "absl/strings/escaping.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "nlohmann/json.hpp"
#include "common/checkpoint/chunk_codec.h"

namespace zshard {
namespace {

using json = nlohmann::json;
constexpr const char kFormat[] = "zshard-checkpoint-1";

// Adds "crc32c" over the canonical dump of everything else.
std::string Seal(json j) {
  j["format"] = kFormat;
  const std::string body = j.dump();
  j["crc32c"] = Crc32c(body.data(), body.size());
  return j.dump(1) + "\n";
}

absl::StatusOr<json> Unseal(const std::string& text, const std::string& what) {
  json j = json::parse(text, nullptr, /*allow_exceptions=*/false);
  if (j.is_discarded() || !j.is_object() || !j.contains("crc32c") ||
      !j["crc32c"].is_number_unsigned()) {
    return absl::DataLossError(absl::StrCat(what, " is not an intact manifest (truncated or not JSON)"));
  }
  const uint32_t want = j["crc32c"].get<uint32_t>();
  j.erase("crc32c");
  const std::string body = j.dump();
  if (Crc32c(body.data(), body.size()) != want) {
    return absl::DataLossError(absl::StrCat(what, " fails its checksum (corrupt)"));
  }
  if (!j.contains("format") || j["format"] != kFormat) {
    return absl::DataLossError(absl::StrCat(what, " is not a ", kFormat, " manifest"));
  }
  return j;
}

json StatesToJson(const std::map<uint32_t, std::string>& states) {
  json out = json::object();
  for (const auto& [rank, s] : states) out[std::to_string(rank)] = absl::BytesToHexString(s);
  return out;
}

std::map<uint32_t, std::string> StatesFromJson(const json& j) {
  std::map<uint32_t, std::string> out;
  for (auto it = j.begin(); it != j.end(); ++it) {
    uint32_t rank = 0;
    if (absl::SimpleAtoi(it.key(), &rank) && it->is_string()) {
      out[rank] = absl::HexStringToBytes(it->get<std::string>());
    }
  }
  return out;
}

}  // namespace

const char* StateArrayName(StateArray a) {
  switch (a) {
    case StateArray::kMaster: return "master";
    case StateArray::kExpAvg: return "exp_avg";
    case StateArray::kExpAvgSq: return "exp_avg_sq";
  }
  return "?";
}

std::string StepDirName(uint64_t step) {
  return absl::StrFormat("step-%08d", step);
}
std::string ShardDataName(uint32_t shard) {
  return absl::StrFormat("shard-%05d.data", shard);
}
std::string ShardManifestName(uint32_t shard) {
  return absl::StrFormat("shard-%05d.manifest.json", shard);
}

std::string SerializeShardManifest(const ShardManifest& m) {
  json j;
  j["kind"] = "shard";
  j["step"] = m.step;
  j["base_step"] = m.base_step;
  j["shard_id"] = m.shard_id;
  j["num_shards"] = m.num_shards;
  j["chunk_elements"] = m.chunk_elements;
  j["bytes_written"] = m.bytes_written;
  json groups = json::array();
  for (const GroupRecord& g : m.groups) {
    groups.push_back({{"group", g.group}, {"begin", g.begin}, {"end", g.end},
                      {"version", g.version}, {"applied", g.applied}});
  }
  j["groups"] = groups;
  // Chunks as compact rows: group, array, begin, count, file_step, offset,
  // length, crc, against_base.
  json chunks = json::array();
  for (const ChunkEntry& c : m.chunks) {
    chunks.push_back({c.group, static_cast<uint32_t>(c.array), c.begin, c.count,
                      c.file_step, c.offset, c.length, c.crc, c.against_base ? 1 : 0});
  }
  j["chunks"] = chunks;
  json files = json::object();
  for (const auto& [step, f] : m.files) {
    files[std::to_string(step)] = {{"size", f.size}, {"crc32c", f.crc}};
  }
  j["files"] = files;
  j["trainer_states"] = StatesToJson(m.trainer_states);
  j["last_step_skipped"] = m.last_step_skipped;
  return Seal(std::move(j));
}

absl::StatusOr<ShardManifest> ParseShardManifest(const std::string& text,
                                                 const std::string& what) {
  absl::StatusOr<json> sealed = Unseal(text, what);
  if (!sealed.ok()) return sealed.status();
  const json& j = *sealed;
  ShardManifest m;
  try {
    if (j.at("kind") != "shard") throw std::runtime_error("kind");
    m.step = j.at("step").get<uint64_t>();
    m.base_step = j.at("base_step").get<uint64_t>();
    m.shard_id = j.at("shard_id").get<uint32_t>();
    m.num_shards = j.at("num_shards").get<uint32_t>();
    m.chunk_elements = j.at("chunk_elements").get<uint64_t>();
    m.bytes_written = j.at("bytes_written").get<uint64_t>();
    for (const json& g : j.at("groups")) {
      m.groups.push_back(GroupRecord{g.at("group").get<uint32_t>(), g.at("begin").get<uint64_t>(),
                                     g.at("end").get<uint64_t>(), g.at("version").get<uint64_t>(),
                                     g.at("applied").get<uint64_t>()});
    }
    for (const json& c : j.at("chunks")) {
      ChunkEntry e;
      e.group = c.at(0).get<uint32_t>();
      const uint32_t a = c.at(1).get<uint32_t>();
      if (a >= kNumStateArrays) throw std::runtime_error("array");
      e.array = static_cast<StateArray>(a);
      e.begin = c.at(2).get<uint64_t>();
      e.count = c.at(3).get<uint64_t>();
      e.file_step = c.at(4).get<uint64_t>();
      e.offset = c.at(5).get<uint64_t>();
      e.length = c.at(6).get<uint64_t>();
      e.crc = c.at(7).get<uint32_t>();
      e.against_base = c.at(8).get<int>() != 0;
      m.chunks.push_back(e);
    }
    for (auto it = j.at("files").begin(); it != j.at("files").end(); ++it) {
      uint64_t step = 0;
      if (!absl::SimpleAtoi(it.key(), &step)) throw std::runtime_error("files");
      m.files[step] = DataFileRecord{it->at("size").get<uint64_t>(),
                                     it->at("crc32c").get<uint32_t>()};
    }
    m.trainer_states = StatesFromJson(j.at("trainer_states"));
    m.last_step_skipped = j.at("last_step_skipped").get<bool>();
  } catch (const std::exception& e) {
    return absl::DataLossError(absl::StrCat(what, " lacks or mistypes a field (", e.what(), ")"));
  }
  return m;
}

std::string SerializeGlobalManifest(const GlobalManifest& m) {
  json j;
  j["kind"] = "global";
  j["step"] = m.step;
  j["base_step"] = m.base_step;
  j["num_shards"] = m.num_shards;
  j["world_size"] = m.world_size;
  j["accumulation_steps"] = m.accumulation_steps;
  j["alignment"] = m.alignment;
  j["persistence_threshold"] = m.persistence_threshold;
  j["spec_hash"] = absl::StrFormat("%016x", m.spec_hash);
  j["config_hash"] = absl::StrFormat("%016x", m.config_hash);
  j["spec_crc32c"] = m.spec_crc;
  j["shard_manifest_crc32c"] = m.shard_manifest_crcs;
  j["trainer_states"] = StatesToJson(m.trainer_states);
  j["last_step_skipped"] = m.last_step_skipped;
  j["bytes_written"] = m.bytes_written;
  json history = json::array();
  for (const MembershipRecord& r : m.membership_history) {
    history.push_back({{"kind", r.kind},
                       {"rank", r.rank},
                       {"identity", r.identity},
                       {"step", r.step},
                       {"reason", r.reason},
                       {"unix_seconds", r.unix_seconds}});
  }
  j["membership_history"] = std::move(history);
  return Seal(std::move(j));
}

absl::StatusOr<GlobalManifest> ParseGlobalManifest(const std::string& text,
                                                   const std::string& what) {
  absl::StatusOr<json> sealed = Unseal(text, what);
  if (!sealed.ok()) return sealed.status();
  const json& j = *sealed;
  GlobalManifest m;
  try {
    if (j.at("kind") != "global") throw std::runtime_error("kind");
    m.step = j.at("step").get<uint64_t>();
    m.base_step = j.at("base_step").get<uint64_t>();
    m.num_shards = j.at("num_shards").get<uint32_t>();
    m.world_size = j.at("world_size").get<uint32_t>();
    m.accumulation_steps = j.at("accumulation_steps").get<uint32_t>();
    m.alignment = j.at("alignment").get<uint64_t>();
    m.persistence_threshold = j.at("persistence_threshold").get<uint64_t>();
    if (!absl::SimpleHexAtoi(j.at("spec_hash").get<std::string>(), &m.spec_hash) ||
        !absl::SimpleHexAtoi(j.at("config_hash").get<std::string>(), &m.config_hash)) {
      throw std::runtime_error("hash");
    }
    m.spec_crc = j.at("spec_crc32c").get<uint32_t>();
    m.shard_manifest_crcs = j.at("shard_manifest_crc32c").get<std::vector<uint32_t>>();
    m.trainer_states = StatesFromJson(j.at("trainer_states"));
    m.last_step_skipped = j.at("last_step_skipped").get<bool>();
    m.bytes_written = j.at("bytes_written").get<uint64_t>();
    if (j.contains("membership_history")) {
      for (const json& e : j.at("membership_history")) {
        MembershipRecord r;
        r.kind = e.at("kind").get<std::string>();
        r.rank = e.at("rank").get<uint32_t>();
        r.identity = e.at("identity").get<std::string>();
        r.step = e.at("step").get<uint64_t>();
        r.reason = e.at("reason").get<std::string>();
        r.unix_seconds = e.at("unix_seconds").get<double>();
        m.membership_history.push_back(std::move(r));
      }
    }
    if (m.shard_manifest_crcs.size() != m.num_shards || m.num_shards == 0) {
      throw std::runtime_error("num_shards");
    }
  } catch (const std::exception& e) {
    return absl::DataLossError(absl::StrCat(what, " lacks or mistypes a field (", e.what(), ")"));
  }
  return m;
}

absl::StatusOr<std::vector<uint64_t>> ListCheckpointSteps(const std::string& root) {
  DIR* d = ::opendir(root.c_str());
  if (!d) return absl::NotFoundError(absl::StrCat("cannot read checkpoint directory ", root));
  std::vector<uint64_t> steps;
  while (struct dirent* e = ::readdir(d)) {
    const std::string name = e->d_name;
    uint64_t step = 0;
    if (name.size() > 5 && name.compare(0, 5, "step-") == 0 &&
        name.find('.') == std::string::npos &&
        absl::SimpleAtoi(name.substr(5), &step)) {
      steps.push_back(step);
    }
  }
  ::closedir(d);
  std::sort(steps.begin(), steps.end());
  return steps;
}

}  // namespace zshard
