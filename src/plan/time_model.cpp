// FLOPs and collective costs (see time_model.h and docs/planner.md).
#include "plan/time_model.h"

#include <algorithm>

namespace shardtrain::detail {

double training_flops_per_token(const PlanModel& model, int64_t seq_len, bool recompute) {
  // The embedding lookup does no matmul; the output head does (tied or not). A mixture of
  // experts computes with the experts a token reaches only (the active parameters).
  const int64_t block =
      model.active_block_parameters > 0 ? model.active_block_parameters : model.block_parameters;
  const double matmul_params =
      static_cast<double>(model.n_layers) * static_cast<double>(block) +
      static_cast<double>(model.vocab_size) * static_cast<double>(model.d_model);
  const double attention = static_cast<double>(model.n_layers) *
                           static_cast<double>(model.d_model) * static_cast<double>(seq_len);
  const double passes = recompute ? 4.0 : 3.0;  // forward = 1 pass, backward = 2
  return passes * (2.0 * matmul_params + 4.0 * attention);
}

GroupLink group_link(int size, int per_node, const ClusterOptions& cluster, const LinkSpec& intra,
                     const LinkSpec& inter) {
  if (size <= 1) return {intra.bandwidth, 0.0};
  if (size <= per_node || cluster.nodes_ <= 1) return {intra.bandwidth, intra.latency};
  const double node_bw = cluster.inter_bw_ > 0 ? cluster.inter_bw_
                         : inter.name == "ib"  ? inter.bandwidth * cluster.gpus_per_node_
                                               : inter.bandwidth;
  // Groups of one axis run their collectives at the same time: gpus_per_node / per_node of them
  // leave each node together and share its inter-node bandwidth.
  const double share = node_bw * per_node / cluster.gpus_per_node_;
  return {std::min(intra.bandwidth, share), std::max(intra.latency, inter.latency)};
}

double all_reduce_time(double bytes, int n, const GroupLink& link) {
  if (n <= 1 || bytes <= 0) return 0.0;
  return 2.0 * (n - 1) * link.latency + 2.0 * (n - 1) / n * bytes / link.bandwidth;
}

double all_gather_time(double bytes, int n, const GroupLink& link) {
  if (n <= 1 || bytes <= 0) return 0.0;
  return (n - 1) * link.latency + static_cast<double>(n - 1) / n * bytes / link.bandwidth;
}

double all_to_all_time(double bytes, int n, const GroupLink& link) {
  if (n <= 1 || bytes <= 0) return 0.0;
  return (n - 1) * link.latency + static_cast<double>(n - 1) / n * bytes / link.bandwidth;
}

double p2p_time(double bytes, const GroupLink& link) {
  return bytes <= 0 ? 0.0 : link.latency + bytes / link.bandwidth;
}

}  // namespace shardtrain::detail
