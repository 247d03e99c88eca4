"""Experiments: compare variants side by side, watch a run's health, size a model to a budget.

    compare.py      train variants (the product of --vary lists) on the same data order and
                    the same initial values, then a plot and a table of the results
    families.py     what a model family plugs in to be compared (its task and model builder,
                    and its loss on windows longer than the training context)
    seeding.py      re-initialise every parameter from a generator seeded by its name
    report.py       the comparison's figure and tables
    autosize.py     model size, context and batch picked from corpus, device speed and budget
    cli.py          the ``compare`` subcommand

The training-health guard every run uses lives beside the trainer, in training/health.py.
"""
