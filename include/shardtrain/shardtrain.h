// Umbrella header: everything public in shardtrain.
#pragma once

#include "shardtrain/bench.h"
#include "shardtrain/dist.h"
#include "shardtrain/launch.h"
#include "shardtrain/mesh.h"
#include "shardtrain/rendezvous.h"
