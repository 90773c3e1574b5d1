"""The ``reshard`` command line: one module per area, each adding its commands to the
group in :mod:`reshard.cli.main`."""
