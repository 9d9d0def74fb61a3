"""Locust glue, in the order of a run: options (the table) -> config (typed sections) -> roles
(local, master, worker) -> prepare -> runtime and user (the running sweep) -> finish (the report).
Thin by design."""
