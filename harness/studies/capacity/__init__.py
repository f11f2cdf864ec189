"""What is the largest model each strategy trains under a memory budget? `shardbench capacity` on this machine
(search.py), `gpu-capacity` on one GPU (gpu.py; report.py writes its tables and the seeds' comparison)."""
