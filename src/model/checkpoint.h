// Activation checkpointing for one transformer block (LibTorch C++ has no torch.utils.checkpoint).
#pragma once

#include <ATen/ATen.h>

#include <functional>
#include <vector>

namespace shardtrain::detail {

using BlockFunction = std::function<at::Tensor(const at::Tensor&)>;

// Returns fn(input) without keeping fn's intermediate activations. The backward pass recomputes
// fn on the saved input with the random-number state of the forward pass (so dropout masks are
// the same), then backpropagates through the recomputation: gradients are accumulated into the
// .grad of every leaf fn uses (its parameters) and the input's gradient flows on.
//
// `params` are the leaves fn uses; they are inputs of the autograd node only so that the output
// requires grad when they do, even if `input` does not (frozen embeddings). Like PyTorch's
// reentrant checkpoint, the parameter gradients are accumulated by a nested backward, so
// torch::autograd::grad() with respect to those parameters is not supported through it.
//
// Exact equality with the non-checkpointed run needs fn to be deterministic given the default
// generators' state, and no other thread drawing from them while fn runs forward.
at::Tensor checkpoint(BlockFunction fn, const at::Tensor& input,
                      const std::vector<at::Tensor>& params);

// True while checkpoint()'s backward recomputes a block on this thread: what a forward counts
// (routing statistics) is then counted a second time, and should not be.
bool recomputing();

// The autograd engine's queue_callback (run `fn` when the backward pass ends), except that from
// inside checkpoint()'s nested backward the callback is handed to the enclosing backward: a
// strategy that finishes its reductions there must not run when one recomputed block is done
// (the first gradients of a LoRA model, whose head is frozen, come from inside a block).
void queue_backward_callback(std::function<void()> fn);

}  // namespace shardtrain::detail
