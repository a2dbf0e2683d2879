"""``railyard demo``: the whole mission on one machine.

A local cluster, the operator, and a tiny FSDP + tensor-parallel TrainingJob trained to
completion while a scripted fault scenario happens (a node failure, a straggler, a bit flip).
``scenario`` says what happens when, ``record`` turns what was observed into a summary (pure),
``plots`` draws it, ``runner`` does the I/O.
"""
