#include "server/metrics/status_page.h"

#include <google/protobuf/util/json_util.h>

#include <cmath>
#include <sstream>

#include "absl/strings/str_cat.h"

namespace zshard {
namespace {

std::string JsonString(const std::string& s) {
  static const char kHex[] = "0123456789abcdef";
  std::string out = "\"";
  for (unsigned char c : s) {
    if (c == '"' || c == '\\') {
      out += '\\';
      out += static_cast<char>(c);
    } else if (c < 0x20) {
      out += "\\u00";
      out += kHex[c >> 4];
      out += kHex[c & 15];
    } else {
      out += static_cast<char>(c);
    }
  }
  return out + "\"";
}

std::string JsonNumber(double v) {
  if (!std::isfinite(v)) return "null";
  std::ostringstream s;
  s.precision(10);
  s << v;
  return s.str();
}

constexpr char kPage[] = R"html(<!DOCTYPE html>
<html lang="en"><head><meta charset="utf-8">
<title>zshard status</title>
<style>
body{font:14px system-ui,sans-serif;margin:20px;color:#222}
h1{font-size:20px;margin:0 0 4px} h2{font-size:15px;margin:18px 0 6px}
table{border-collapse:collapse} td,th{border:1px solid #ccc;padding:3px 8px;text-align:right}
th{background:#f3f3f3} td.l,th.l{text-align:left}
.bad{color:#b00020;font-weight:bold} .ok{color:#1b7f3b}
.charts{display:flex;gap:24px;flex-wrap:wrap}
svg{border:1px solid #ccc;background:#fcfcfc}
#summary span{margin-right:18px}
</style></head><body>
<h1>zshard</h1>
<div id="summary">
<span>shards <b id="shard-count">-</b></span>
<span>trainers <b id="trainer-count">-</b></span>
<span>step <b id="current-step">-</b></span>
<span>waiting for <b id="waiting">-</b></span>
<span>updated <b id="updated">never</b></span>
</div>
<div id="error" class="bad"></div>
<div class="charts">
<div><h2>loss</h2><svg id="loss-chart" width="520" height="220"><polyline id="loss-series" fill="none" stroke="#3060c0" stroke-width="1.5" points=""/><text id="loss-label" x="8" y="16" font-size="12"></text></svg></div>
<div><h2>throughput (samples/s, all trainers)</h2><svg id="throughput-chart" width="520" height="220"><polyline id="throughput-series" fill="none" stroke="#c06030" stroke-width="1.5" points=""/><text id="throughput-label" x="8" y="16" font-size="12"></text></svg></div>
</div>
<h2>shards</h2><table id="shards"><thead><tr><th>shard</th><th class="l">endpoint</th><th>version</th><th>elements</th><th>fetched MB</th><th>pushed MB</th><th>memory MB</th><th class="l">waiting for</th></tr></thead><tbody></tbody></table>
<h2>trainers</h2><table id="trainers"><thead><tr><th>rank</th><th class="l">id</th><th>last seen (s ago)</th><th>fetched MB</th><th>pushed MB</th><th>leases active / expired</th></tr></thead><tbody></tbody></table>
<h2>checkpoints</h2><table id="checkpoints"><thead><tr><th>shard</th><th>writes</th><th>last step</th><th>MB</th><th>stall s</th><th>write s</th><th class="l">last error</th></tr></thead><tbody></tbody></table>
<script>
"use strict";
const MB = b => (Number(b || 0) / 1e6).toFixed(2);
function cell(row, text, cls) { const td = row.insertCell(); td.textContent = text; if (cls) td.className = cls; return td; }
function fill(id, rows) {
  const body = document.querySelector("#" + id + " tbody");
  body.textContent = "";
  for (const r of rows) { const tr = body.insertRow(); for (const [t, c] of r) cell(tr, t, c); }
}
function plot(id, xs, ys) {
  const svg = document.getElementById(id + "-chart"), line = document.getElementById(id + "-series");
  const w = svg.width.baseVal.value, h = svg.height.baseVal.value, pad = 24;
  const pts = [];
  for (let i = 0; i < xs.length; ++i) if (ys[i] !== null && isFinite(ys[i])) pts.push([xs[i], ys[i]]);
  if (pts.length === 0) { line.setAttribute("points", ""); return; }
  const x0 = pts[0][0], x1 = Math.max(pts[pts.length - 1][0], x0 + 1);
  let y0 = Math.min(...pts.map(p => p[1])), y1 = Math.max(...pts.map(p => p[1]));
  if (y1 === y0) { y1 += 1; y0 -= 1; }
  line.setAttribute("points", pts.map(([x, y]) =>
    ((pad + (x - x0) / (x1 - x0) * (w - 2 * pad)).toFixed(1)) + "," +
    ((h - pad - (y - y0) / (y1 - y0) * (h - 2 * pad)).toFixed(1))).join(" "));
  line.dataset.count = pts.length;
  document.getElementById(id + "-label").textContent =
    "last " + pts[pts.length - 1][1].toFixed(4) + "  (min " + y0.toFixed(3) + ", max " + y1.toFixed(3) + ", " + pts.length + " steps)";
}
function render(s) {
  const shards = s.shards || [];
  const first = shards.find(x => !x.unreachable) || {};
  const trainers = first.trainers || [];
  document.getElementById("shard-count").textContent = shards.length;
  document.getElementById("trainer-count").textContent = trainers.length;
  const versions = shards.filter(x => !x.unreachable).map(x => Number(x.minVersion || 0));
  document.getElementById("current-step").textContent = versions.length ? Math.min(...versions) : "-";
  const waiting = new Set();
  for (const sh of shards) for (const g of (sh.groups || [])) for (const r of (g.waitingForRanks || [])) waiting.add(r);
  document.getElementById("waiting").textContent = waiting.size ? [...waiting].sort((a, b) => a - b).map(r => "rank " + r).join(", ") : "nothing";
  document.getElementById("updated").textContent = new Date(Number(s.nowUnixMs)).toLocaleTimeString();
  const down = shards.filter(x => x.unreachable);
  document.getElementById("error").textContent = down.map(x => "shard " + x.shardId + " (" + x.endpoint + ") unreachable: " + x.unreachable).join("; ");
  fill("shards", shards.map(x => x.unreachable
    ? [[x.shardId], [x.endpoint, "l"], ["unreachable", "bad"], [""], [""], [""], [""], [""]]
    : [[x.shardId || 0], [x.endpoint, "l"], [x.minVersion || 0], [x.sliceElements || 0], [MB(x.bytesFetched)], [MB(x.bytesPushed)],
       [MB((x.memory || {}).totalBytes)],
       [[...new Set((x.groups || []).flatMap(g => g.waitingForRanks || []))].join(", ") || "-", "l"]]));
  fill("trainers", trainers.map(t => [[t.rank || 0], [t.trainerId, "l"],
    [((Number(s.nowUnixMs) - Number(t.lastSeenUnixMs)) / 1000).toFixed(1)], [MB(t.bytesFetched)], [MB(t.bytesPushed)],
    [(t.activeLeases || 0) + " / " + (t.expiredLeases || 0)]]));
  fill("checkpoints", shards.filter(x => !x.unreachable).map(x => { const c = x.checkpoint || {}; return [[x.shardId || 0], [c.writesCompleted || 0],
    [c.lastWrittenStep || 0], [MB(c.lastBytesWritten)], [Number(c.lastStallSeconds || 0).toFixed(3)],
    [Number(c.lastWriteSeconds || 0).toFixed(3)], [c.lastError || "-", c.lastError ? "l bad" : "l"]]; }));
  const h = s.history || [];
  plot("loss", h.map(p => p[0]), h.map(p => p[2]));
  plot("throughput", h.map(p => p[0]), h.map(p => p[4] > 0 ? p[3] / p[4] : null));
}
async function poll() {
  try {
    const r = await fetch("status.json", {cache: "no-store"});
    if (!r.ok) throw new Error("HTTP " + r.status);
    render(await r.json());
  } catch (e) {
    document.getElementById("error").textContent = "status.json: " + e.message;
  }
  setTimeout(poll, 2000);
}
poll();
</script></body></html>
)html";

}  // namespace

const std::string& StatusPageHtml() {
  static const std::string* page = new std::string(kPage);
  return *page;
}

std::string StatusJson(const std::vector<ShardView>& shards,
                       const std::vector<StepPoint>& history, absl::Time now) {
  std::string out =
      absl::StrCat("{\"nowUnixMs\":", absl::ToUnixMillis(now), ",\"shards\":[");
  google::protobuf::util::JsonPrintOptions options;
  options.always_print_primitive_fields = true;
  for (size_t i = 0; i < shards.size(); ++i) {
    const ShardView& v = shards[i];
    if (i > 0) out += ",";
    std::string json;
    if (v.status.ok() &&
        google::protobuf::util::MessageToJsonString(*v.status, &json, options)
            .ok()) {
      out += json;
    } else {
      absl::StrAppend(
          &out, "{\"shardId\":", v.shard_id,
          ",\"endpoint\":", JsonString(v.endpoint), ",\"unreachable\":",
          JsonString(v.status.ok() ? "cannot render its status"
                                   : std::string(v.status.status().message())),
          "}");
    }
  }
  out += "],\"history\":[";
  for (size_t i = 0; i < history.size(); ++i) {
    const StepPoint& p = history[i];
    absl::StrAppend(&out, i > 0 ? "," : "", "[", p.step, ",",
                    absl::ToUnixMillis(p.time), ",", JsonNumber(p.loss), ",",
                    p.samples, ",", JsonNumber(p.step_seconds), ",", p.ranks,
                    ",", p.rpcs, "]");
  }
  out += "]}";
  return out;
}

}  // namespace zshard
