"""Prometheus pages of Triton and of our target's KV cache: scraped and compared (`pages`), and
per server of a fleet behind a gateway (`backends`)."""
