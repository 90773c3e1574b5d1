"""The control table: migration records, compare-and-set phase changes and history, the
shim fleet's heartbeats, job runs, and the gates computed from them."""
