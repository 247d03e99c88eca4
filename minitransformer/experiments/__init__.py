"""Experiments: one training run for any family, variants side by side, a model sized to a budget.

    runs.py         a training run (new or resumed) from a request: the pipeline behind
                    ``minitransformer train``, the same for every family
    compare.py      train variants (the product of --vary lists) on the same data order and
                    the same initial values, then a plot and a table of the results
    seeding.py      re-initialise every parameter from a generator seeded by its name
    report.py       the comparison's figure and tables
    autosize.py     model size, context and batch picked from corpus, device speed and budget

What a family plugs in (data, model, task, its long-window loss) is in families/; the
training-health guard every run uses lives beside the trainer, in training/health.py.
"""
