// smp_train: drive training from your own program through libsmp_core's public API.
//
//   smp_train <adapter plugin> <config.toml> [key=value ...]
//
// Runs in one process (or one rank when started by smp-launch / srun / mpirun):
// builds the Runtime from the config, takes train.steps steps through an
// smp::Trainer (which acts on the job's cadence keys), evaluates.
#include <smp/smp.h>

#include <iostream>

int main(int argc, char** argv) {
  if (argc < 3) {
    std::cerr << "usage: smp_train <adapter plugin> <config.toml> [key=value ...]\n";
    return 2;
  }
  try {
    const smp::Options options = smp::Options::load(argv[2]).args(argc, argv, 3);  // the file, then key=value
    auto runtime = smp::Runtime::create(options, smp::ProcessEnv::from_environment(), {argv[1]});
    // The Trainer acts on the job's cadence keys (train.val_every, run.checkpoint_every, ...).
    smp::Trainer trainer(*runtime);
    const int64_t steps = runtime->config().get_int("train.steps");
    for (int64_t i = runtime->steps_done(); i < steps && !trainer.done(); ++i) {  // a resumed run goes on where it stopped
      smp::StepResult r = trainer.step();
      std::cout << "step " << r.step + 1 << " loss " << r.loss << " (" << r.seconds * 1000 << " ms)\n";
    }
    trainer.finish();  // the last checkpoint committed, summary.json written
    std::cout << "validation loss " << runtime->evaluate(1) << "\n";
    runtime->shutdown();
    return 0;
  } catch (const std::exception& e) {
    std::cerr << "smp_train: " << e.what() << "\n";
    return 1;
  }
}
