// Umbrella header: everything public in shardtrain.
#pragma once

#include "shardtrain/bench.h"
#include "shardtrain/checkpoint.h"
#include "shardtrain/config.h"
#include "shardtrain/data.h"
#include "shardtrain/dist.h"
#include "shardtrain/hf.h"
#include "shardtrain/launch.h"
#include "shardtrain/memory.h"
#include "shardtrain/mesh.h"
#include "shardtrain/model.h"
#include "shardtrain/optim.h"
#include "shardtrain/rendezvous.h"
#include "shardtrain/sharded_checkpoint.h"
#include "shardtrain/tokenizer.h"
#include "shardtrain/train.h"
