"""The commands of ``kernsearch``, one module a concept; ``kernsearch.cli`` assembles them into the app."""
