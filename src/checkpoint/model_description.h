// The model description the trainer stores in a checkpoint's metadata: every field of
// ModelConfig, so that tools (the Hugging Face export) can rebuild the configuration.
#pragma once

#include <nlohmann/json.hpp>

#include "shardtrain/model.h"

namespace shardtrain::detail {

nlohmann::json describe_model(const ModelConfig& config);
// Throws std::invalid_argument naming `source` when a field is missing or invalid.
ModelConfig model_from_description(const nlohmann::json& json, const std::string& source);

}  // namespace shardtrain::detail
