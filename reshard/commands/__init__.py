"""One module per area of the command line; each adds its commands to ``reshard.cli.cli``.

The functions here are thin: parse options, call the library, print. The work
lives in the library modules so tests and the demo call it without click.
"""
