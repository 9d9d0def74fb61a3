"""Offline cache analysis: what a KV cache of a given size would hold of a store's natural replay,
computed without sending a request.

`cache_curve` (the one-pass token hit ratio at every budget), `tier_curve` (the same per tier,
over a grid of GPU and host budgets), `store_curve` (a store's trace run through both),
`curve_files` and `curve_chart` (what `hstu-replay plan cache-curve` writes: curve.json, the CSVs,
curve.svg) and `cli` (that command). The trace comes from request planning (`plan.timeline`);
`capacity natural` and the benches read the curves.
"""
