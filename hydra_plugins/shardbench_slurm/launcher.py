"""hydra-submitit's SLURM launcher, with the sweep's wait for allocations announced and bounded, and a
preempted job requeued to resume from its checkpoint (harness/launcher/slurm.py). Kept to an import and two
methods: Hydra imports every module of this namespace whenever it looks for plugins."""
from hydra_plugins.hydra_submitit_launcher.submitit_launcher import SlurmLauncher


class AnnouncingSlurmLauncher(SlurmLauncher):
    def launch(self, job_overrides, initial_job_idx):
        from harness.launcher.slurm import watched

        with watched(self):
            return super().launch(job_overrides, initial_job_idx)

    def checkpoint(self, *args, **kwargs):
        from harness.launcher.slurm import resumed

        return super().checkpoint(*resumed(args), **kwargs)
