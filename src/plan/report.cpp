// The plan for people (a table), for tools (JSON) and as a picture (SVG bars of memory).
#include <algorithm>
#include <nlohmann/json.hpp>
#include <sstream>

#include "plan/text.h"
#include "report/html.h"
#include "shardtrain/plan.h"

namespace shardtrain {
namespace {

std::string gb_number(double bytes) { return detail::format("%.1f", bytes / 1e9); }

// The table's unit: GB, or MB when every candidate needs less than a gigabyte.
struct Unit {
  const char* name;
  double bytes;
};
Unit table_unit(const Plan& plan) {
  double top = 0;
  for (const auto& c : plan.candidates) {
    if (c.valid) top = std::max(top, c.memory.total());
  }
  return top < 1e9 ? Unit{"MB", 1e6} : Unit{"GB", 1e9};
}

}  // namespace

std::string format_plan(const Plan& plan) {
  std::ostringstream out;
  const auto& hw = plan.hardware;
  const auto& w = plan.workload;
  const double n = static_cast<double>(plan.model.num_parameters);
  const double active = static_cast<double>(plan.model.active_parameters);
  const std::string experts =
      plan.model.n_experts > 0
          ? detail::format(" (%.2f%s active: %lld of %lld experts per token)",
                           n >= 1e9 ? active / 1e9 : active / 1e6, n >= 1e9 ? "B" : "M",
                           static_cast<long long>(plan.model.experts_per_token),
                           static_cast<long long>(plan.model.n_experts))
          : "";
  out << detail::format("model %s: %.2f%s parameters%s, %lld layers, d_model %lld\n",
                        plan.model.name.c_str(), n >= 1e9 ? n / 1e9 : n / 1e6, n >= 1e9 ? "B" : "M",
                        experts.c_str(), static_cast<long long>(plan.model.n_layers),
                        static_cast<long long>(plan.model.d_model));
  out << detail::format(
      "cluster: %d node(s) x %d %s (%s per device), seq %lld, micro-batch %lld, "
      "%s%s, %s%s\n",
      plan.cluster.nodes_, plan.cluster.gpus_per_node_, hw.name.c_str(),
      detail::gb(hw.memory_bytes).c_str(), static_cast<long long>(w.seq_len_),
      static_cast<long long>(w.micro_batch_), w.precision_.c_str(),
      w.fp32_grads_ ? " with fp32 gradients" : "", w.optimizer_.c_str(),
      w.checkpointing_ ? ", activation checkpointing"
      : w.selective_   ? ", selective activation checkpointing"
                       : "");
  const Unit unit = table_unit(plan);
  auto num = [&](double bytes) { return detail::format("%.1f", bytes / unit.bytes); };
  out << "\nper device, " << unit.name << ":\n";
  out << detail::format("%-36s %7s %7s %7s %7s %7s %8s %4s %9s %11s %6s\n", "candidate", "params",
                        "grads", "optim", "activ", "temp", "total", "fits", "step s", "tokens/s",
                        "scale");
  for (const auto& c : plan.candidates) {
    if (!c.valid) continue;
    const auto& m = c.memory;
    out << detail::format("%-36s %7s %7s %7s %7s %7s %8s %4s %9.3f %11.0f %5.0f%%\n",
                          c.label().c_str(), num(m.params).c_str(), num(m.grads).c_str(),
                          num(m.optimizer).c_str(), num(m.activations).c_str(),
                          num(m.temporary).c_str(), num(m.total()).c_str(), c.fits ? "yes" : "no",
                          c.time.total, c.tokens_per_s, 100 * c.scaling_efficiency);
  }
  out << "\n" << plan.explanation << "\n";
  if (const Candidate* rec = plan.recommendation()) {
    out << "\nshardtrain config:\n\n" << shardtrain_toml(plan, *rec);
  }
  return out.str();
}

std::string plan_to_json(const Plan& plan) {
  nlohmann::ordered_json j;
  const auto& m = plan.model;
  j["model"] = {{"name", m.name},
                {"num_parameters", m.num_parameters},
                {"active_parameters", m.active_parameters},
                {"n_experts", m.n_experts},
                {"experts_per_token", m.experts_per_token},
                {"block_parameters", m.block_parameters},
                {"root_parameters", m.root_parameters},
                {"n_layers", m.n_layers},
                {"d_model", m.d_model}};
  j["hardware"] = {{"name", plan.hardware.name},
                   {"memory_bytes", plan.hardware.memory_bytes},
                   {"peak_bf16_flops", plan.hardware.peak_bf16_flops},
                   {"peak_fp32_flops", plan.hardware.peak_fp32_flops},
                   {"memory_bw", plan.hardware.memory_bw},
                   {"gpus_per_node", plan.cluster.gpus_per_node_},
                   {"nodes", plan.cluster.nodes_}};
  const auto& w = plan.workload;
  j["workload"] = {{"seq_len", w.seq_len_},
                   {"micro_batch", w.micro_batch_},
                   {"precision", w.precision_},
                   {"optimizer", w.optimizer_},
                   {"fp32_grads", w.fp32_grads_},
                   {"activation_checkpointing", w.checkpointing_},
                   {"selective_checkpointing", w.selective_},
                   {"safety_margin", w.safety_margin_}};
  nlohmann::ordered_json list = nlohmann::ordered_json::array();
  for (const auto& c : plan.candidates) {
    nlohmann::ordered_json e;
    e["label"] = c.label();
    e["strategy"] = to_string(c.strategy);
    e["offload"] = c.offload;
    e["tp"] = c.tp, e["pp"] = c.pp, e["dp"] = c.dp, e["cp"] = c.cp, e["ep"] = c.ep,
    e["shard"] = c.shard;
    e["valid"] = c.valid;
    e["note"] = c.note;
    if (c.valid) {
      e["grad_accum"] = c.grad_accum;
      e["fits"] = c.fits;
      e["memory"] = {{"params", c.memory.params},
                     {"grads", c.memory.grads},
                     {"optimizer", c.memory.optimizer},
                     {"activations", c.memory.activations},
                     {"temporary", c.memory.temporary},
                     {"total", c.memory.total()},
                     {"host_per_node", c.host_bytes_per_node}};
      e["time"] = {{"compute", c.time.compute},
                   {"communication", c.time.communication},
                   {"exposed_comm", c.time.exposed_comm},
                   {"offload", c.time.offload},
                   {"bubble", c.time.bubble},
                   {"step", c.time.total}};
      e["tokens_per_s"] = c.tokens_per_s;
      e["scaling_efficiency"] = c.scaling_efficiency;
    }
    list.push_back(e);
  }
  j["candidates"] = list;
  j["recommended"] = plan.recommended;
  j["explanation"] = plan.explanation;
  if (const Candidate* rec = plan.recommendation()) {
    j["configs"] = {{"shardtrain_toml", shardtrain_toml(plan, *rec)},
                    {"ds_config_json", deepspeed_json(plan, *rec)},
                    {"accelerate_yaml", accelerate_yaml(plan, *rec)}};
  }
  return j.dump(2) + "\n";
}

std::string memory_chart_svg(const Plan& plan) {
  std::vector<const Candidate*> shown;
  for (const auto& c : plan.candidates) {
    if (c.valid) shown.push_back(&c);
  }
  const double limit = plan.hardware.memory_bytes;
  // The axis reaches 3x the device memory at most: bars beyond it are cut (their totals printed),
  // so that one huge DDP bar does not flatten all the others.
  double top = limit;
  for (const auto* c : shown) top = std::max(top, c->memory.total());
  top = std::min(top, 3 * limit);
  const int label_w = 260, bar_h = 18, gap = 6, chart_w = 520, head = 50;
  const int height = head + static_cast<int>(shown.size()) * (bar_h + gap) + 40;
  const double scale = chart_w / top;
  const char* colors[] = {"#4e79a7", "#f28e2b", "#e15759", "#76b7b2", "#59a14f"};
  const char* names[] = {"params", "grads", "optimizer", "activations", "temporary"};
  std::ostringstream out;
  out << "<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"" << label_w + chart_w + 80
      << "\" height=\"" << height << "\" font-family=\"sans-serif\" font-size=\"12\">\n";
  out << "<text x=\"10\" y=\"18\" font-size=\"14\">"
      << detail::escape_html("Memory per device: " + plan.model.name + " on " +
                             std::to_string(plan.cluster.world_size()) + " x " + plan.hardware.name)
      << "</text>\n";
  for (int i = 0; i < 5; ++i) {
    out << "<rect x=\"" << 10 + i * 110 << "\" y=\"28\" width=\"12\" height=\"12\" fill=\""
        << colors[i] << "\"/><text x=\"" << 26 + i * 110 << "\" y=\"39\">" << names[i]
        << "</text>\n";
  }
  int y = head;
  for (const auto* c : shown) {
    const double parts[] = {c->memory.params, c->memory.grads, c->memory.optimizer,
                            c->memory.activations, c->memory.temporary};
    out << "<text x=\"10\" y=\"" << y + 13 << "\"" << (c->fits ? "" : " fill=\"#999\"") << ">"
        << detail::escape_html(c->label()) << "</text>\n";
    double x = label_w;
    for (int i = 0; i < 5; ++i) {
      const double wpx = std::min(parts[i] * scale, label_w + chart_w - x);
      if (wpx <= 0) continue;
      out << detail::format(
          "<rect x=\"%.1f\" y=\"%d\" width=\"%.1f\" height=\"%d\" fill=\"%s\"/>\n", x, y, wpx,
          bar_h, colors[i]);
      x += wpx;
    }
    out << detail::format("<text x=\"%.1f\" y=\"%d\">%s</text>\n", x + 4, y + 13,
                          gb_number(c->memory.total()).c_str());
    y += bar_h + gap;
  }
  const double lx = label_w + limit * scale;
  out << detail::format(
      "<line x1=\"%.1f\" y1=\"%d\" x2=\"%.1f\" y2=\"%d\" stroke=\"#000\" "
      "stroke-dasharray=\"4 3\"/>\n",
      lx, head - 4, lx, y);
  out << detail::format("<text x=\"%.1f\" y=\"%d\">device memory %s</text>\n", lx - 60, y + 16,
                        detail::gb(limit).c_str());
  out << "</svg>\n";
  return out.str();
}

}  // namespace shardtrain
