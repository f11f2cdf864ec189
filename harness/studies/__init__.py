"""The studies: each package answers one question a user asks of the strategies, and its commands are rows of the
command table (harness/commands.py).

    advise/       which strategy should I use here? (the search, its answer, its frontier, its agreement with runs)
    predict/      what will it cost, before I rent GPUs? (estimate, scale check, hybrid, published runs)
    memory/       does the memory model hold? (the memory check: measured peaks by kind against theory)
    capacity/     what is the largest model each strategy trains under a budget, on CPU or on one GPU?
    timing/       does the time model hold? (time check, extrapolation, device costs, cold start, collectives)
    bench/        is the harness the bottleneck? (against an independent loop)
    axes/         what do compile, checkpointing, float8 and precision change? (the axes table, loss agreement)
    checkpoints/  what do saving and resuming cost? (and a checkpoint's export, a small pretrained one)
    faults/       what does each fault become, and how fast is it detected?
    gpu/          what holds on a lent GPU? (the GPU check, the GPU axes, the time model on a GPU)

flags.py holds the command lines that are checked before torch loads (estimate, advise, gpu-capacity). A helper
that two commands share lives in a module of its own, not in either command's.
"""
