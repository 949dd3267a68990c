// The libFuzzer entry point of one fuzz program: SHARDTRAIN_FUZZ_TARGET names its target.
#include "fuzz_target.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  return shardtrain::fuzz::SHARDTRAIN_FUZZ_TARGET(data, size);
}
