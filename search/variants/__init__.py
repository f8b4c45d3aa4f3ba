"""One variant, run: rebuilt from a picklable task in an isolated worker and verified, timed or re-timed there
(``_tasks``), or run whole on the interpreter for a family's author (``_run``: ``kernsearch.run``)."""
