"""The parent process of a run: validate, prepare the run dir, start torchrun (torchrun.py), collect what the
ranks left into a summary (outcome.py), and the Hydra callback of a sweep (sweep_callback.py). No torch."""
