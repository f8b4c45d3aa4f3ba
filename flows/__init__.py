"""Prefect flows for scheduled searches (imported only by the commands that need them).

``_jobs`` reads job files (no Prefect); ``_steps`` runs the kernel-touching steps in killable subprocesses
(no Prefect); ``_report`` holds the records of a run's report (no Prefect); ``nightly`` is the flow and its
tasks (imports Prefect); ``_serve`` serves, deploys or runs it; ``_cli`` is the ``kernsearch flows`` sub-app.
See docs/flows.md.
"""
