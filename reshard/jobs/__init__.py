"""The data jobs (backfill, verify, cleanup): each a page function run by one segment
engine (leases, checkpoints, workers) under one job runner."""
