"""Which strategy should I use for this model on this hardware? `shardbench advise`: theory prunes and orders the
candidates (search.py, frontier.py, step_times.py, notes.py), short real runs decide (answer.py), and
agreement.py says how often the dry run picked what the runs picked."""
