"""What measures a run inside a rank: its clocks and probes (probes.py), its peak by kind (memory_profile.py,
late_frees.py), its step time by part (time_profile.py), its work and collectives counted (work_count.py,
collective_count.py)."""
