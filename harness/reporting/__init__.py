"""Reporting, from records on disk: one run's figures (run_summary.py, computed by rank 0 from every rank's
report), and a sweep's tables, plots and HTML report (collect, tables, plots, html_report, sweep_report).
Imports no torch; matplotlib and wandb load only when a report is drawn or logged."""
