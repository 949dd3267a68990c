// Parameter and module names: suffix tests, and the layers LoRA never adapts or stores.
#pragma once

#include <string>

#include "shardtrain/model.h"

namespace shardtrain::detail {

inline bool ends_with(const std::string& s, const std::string& suffix) {
  return s.size() >= suffix.size() &&
         s.compare(s.size() - suffix.size(), suffix.size(), suffix) == 0;
}

// `name` is `last` or ends with "." + `last`: the module path's last component is `last`.
inline bool last_component_is(const std::string& name, const std::string& last) {
  return name == last || ends_with(name, "." + last);
}

// The output head ("lm_head"): never adapted by "all-linear", never stored in the base dtype.
inline bool is_output_head(const std::string& name) { return last_component_is(name, "lm_head"); }

// A LoRA adapter's own A or B layer, which is a linear layer too.
inline bool is_adapter_layer(const std::string& name) {
  return last_component_is(name, "lora_A") || last_component_is(name, "lora_B");
}

// The token embedding a pipeline's last stage holds only as its tied head's weight: the first
// stage's copy stands for both (in the gradient norm and in checkpoints).
inline bool is_tied_head_copy(const TransformerImpl& model, const std::string& name) {
  return model.config().tie_embeddings && !model.parts().embedding && name == "tok_emb.weight";
}

}  // namespace shardtrain::detail
