"""Locust glue: options, the user, event listeners, web UI tab. Thin by design."""
