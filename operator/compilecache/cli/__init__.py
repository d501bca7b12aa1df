"""The ``compilecache`` command: one entry point for every program (:mod:`.main`), and how commands fail.

Failing (one-line errors, exit codes, Ctrl-C) is :mod:`.errors`.
"""
