"""The Chinese learner notebooks are not run under nbval: their code cells equal the English notebooks'
cell for cell (tests/test_i18n.py), and those already run."""
collect_ignore_glob = ["*.ipynb"]
