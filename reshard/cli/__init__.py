"""The ``reshard`` command line: one module per area defines its commands;
:mod:`reshard.cli.main` adds them to the group."""
