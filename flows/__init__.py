"""Prefect flows for scheduled searches (imported only by the commands that need them)."""
