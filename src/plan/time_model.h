// The time model's pieces, shared by the candidates: FLOPs per token and the ring alpha-beta
// cost of each collective over the slowest link its group crosses.
#pragma once

#include "shardtrain/plan.h"

namespace shardtrain::detail {

// Training FLOPs per token: 6 per matmul parameter (forward 2, backward 4) plus the attention
// scores and their use, 12 x layers x d_model x seq (PaLM, appendix B); a full recomputation
// adds one more forward (8 and 16).
double training_flops_per_token(const PlanModel& model, int64_t seq_len, bool recompute);

// Where a group of `size` ranks lies: `per_node` of them on each node it spans. Bandwidth is the
// slower of the device's intra-node link and its share of the node's inter-node bandwidth, shared
// with the other groups of the same axis that cross the node at the same time.
struct GroupLink {
  double bandwidth = 0;  // bytes/s
  double latency = 0;    // s per ring step
};
GroupLink group_link(int size, int per_node, const ClusterOptions& cluster, const LinkSpec& intra,
                     const LinkSpec& inter);

// Ring algorithms; `bytes` is the full (unsharded) buffer.
double all_reduce_time(double bytes, int n, const GroupLink& link);
double all_gather_time(double bytes, int n, const GroupLink& link);  // also reduce-scatter
double p2p_time(double bytes, const GroupLink& link);
// Every device sends `bytes` in all, (n - 1) / n of them to the others (pairwise exchange).
double all_to_all_time(double bytes, int n, const GroupLink& link);

}  // namespace shardtrain::detail
