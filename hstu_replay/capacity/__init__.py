"""Capacity planning: per hit ratio, step the load (users or offered rate) until an SLO breaks.

`search` is the pure logic (SLO verdicts, sustainable throughput, knee, servers needed),
`metrics` scrapes Triton's Prometheus endpoint, `driver` runs each step as a real headless
Locust run; its outputs: `result` (capacity.json's dict), `tables` (terminal and page tables),
`charts` (SVG), `page` (capacity.html), `files` (everything on disk); `cli` is `hstu-replay capacity run`.
"""
