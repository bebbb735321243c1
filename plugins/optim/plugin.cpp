// smp_optim: the standard optimizer kinds (train.optimizer = "adamw" | "sgd").
#include "optimizers.h"

#include <smp/sdk/plugin.hpp>

SMP_PLUGIN(smp::sdk::PluginBuilder("smp_optim", "1.0.0")
               .optimizer<smp_optim::AdamW>("adamw")
               .optimizer<smp_optim::Sgd>("sgd"))
