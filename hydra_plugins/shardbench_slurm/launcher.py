"""hydra-submitit's SLURM launcher, with the sweep's wait for allocations announced and bounded
(harness/launcher/slurm.py). Kept to an import and one method: Hydra imports every module of this namespace
whenever it looks for plugins."""
from hydra_plugins.hydra_submitit_launcher.submitit_launcher import SlurmLauncher


class AnnouncingSlurmLauncher(SlurmLauncher):
    def launch(self, job_overrides, initial_job_idx):
        from harness.launcher.slurm import watched

        with watched(self):
            return super().launch(job_overrides, initial_job_idx)
