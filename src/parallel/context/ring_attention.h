// Context parallelism's communication: ring attention over a cp group.
#pragma once

#include <memory>

#include "model/context_split.h"
#include "shardtrain/dist.h"

namespace shardtrain::detail {

// The split of sequences over `group` (its ranks hold chunks context_positions says), with
// attention by ring. The group must outlive every forward and backward run through it.
std::shared_ptr<ContextSplit> ring_split(std::shared_ptr<ProcessGroup> group);

}  // namespace shardtrain::detail
