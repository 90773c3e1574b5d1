"""The ``reshard`` command line: the group, its commands, and the one place where
errors become a line on stderr and an exit status.

Exit status: 0 done; 1 the operation failed or found differences; 2 bad input or a
refused transition; 130 interrupted. No traceback unless ``--verbose``.
"""

from __future__ import annotations

import sys
import time
import traceback

import click

from reshard import errors
from reshard.core.decode import safe_text
from reshard.cli import backfill, control, demo, doctor, iam, local, phase, plan, verify
from reshard.cli.options import STARTED_AT, global_options


@click.group(context_settings={"help_option_names": ["-h", "--help"], "max_content_width": 100})
@global_options
@click.version_option(package_name="reshard")
def cli() -> None:
    """Change the shard count of a write-sharded DynamoDB table from N to M, online.

    \b
    A migration walks these phases, one `reshard advance` at a time:
      planned -> dual_write -> dual_read -> backfill -> cutover -> cleanup -> complete
    (`rollback` goes one phase back up to cutover; `abort` returns to the old layout).

    \b
    Typical session:
      reshard plan migrations/0001_sensor_events.toml
      reshard start migrations/0001_sensor_events.toml
      reshard advance            # dual_write; then dual_read, backfill
      reshard backfill --segments 16
      reshard verify
      reshard advance            # cutover; then cleanup
      reshard cleanup
      reshard advance            # complete
      reshard wait               # the fleet caught up (moves nothing)
      reshard list               # every migration of the control table

    \b
    A running job is steered without a restart (every host, within a second):
      reshard throttle --max-wcu 500    reshard pause    reshard resume
    """


# The command modules do not know the group (no import circle); they are added here.
cli.add_command(phase.start)
cli.add_command(phase.status)
cli.add_command(phase.list_command)
cli.add_command(phase.advance)
cli.add_command(phase.rollback)
cli.add_command(phase.abort)
cli.add_command(phase.wait_command)
cli.add_command(plan.plan)
cli.add_command(backfill.backfill_command)
cli.add_command(verify.verify)
cli.add_command(verify.cleanup)
cli.add_command(doctor.doctor)
cli.add_command(iam.iam_policy)
cli.add_command(demo.demo)
cli.add_command(control.throttle)
cli.add_command(control.pause)
cli.add_command(control.resume)
cli.add_command(local.local)


def main(argv: list[str] | None = None) -> int:
    """Entry point of the console script; returns the exit status."""
    STARTED_AT.at = time.time()  # before anything is read: see operations.transition(started_at=)
    argv = list(sys.argv[1:] if argv is None else argv)
    verbose = "--verbose" in argv or "-v" in argv
    try:
        # Not standalone: click returns the code of a click.exceptions.Exit raised by a command
        # (e.g. `advance --dry-run` that would be refused) instead of exiting.
        code = cli.main(args=argv, prog_name="reshard", standalone_mode=False)
        return code if isinstance(code, int) else 0
    except errors.ReshardError as e:
        if verbose:
            _traceback()
        _error(f"reshard: error: {e}")
        return e.exit_code
    except click.exceptions.Exit as e:
        return e.exit_code
    except click.ClickException as e:
        # One line, like every other error (click's own format is usage + hint + message).
        hint = ""
        if isinstance(e, click.UsageError) and e.ctx is not None:
            hint = f" (see `{e.ctx.command_path} --help`)"
        _error(f"reshard: error: {e.format_message()}{hint}")
        return 2
    except click.exceptions.Abort as e:
        # click turns a KeyboardInterrupt (Ctrl-C, or SIGTERM through a job's handler) into Abort.
        click.echo("reshard: interrupted" if isinstance(e.__cause__, KeyboardInterrupt) else "reshard: aborted",
                   err=True)
        return 130
    except KeyboardInterrupt:
        click.echo("reshard: interrupted", err=True)
        return 130
    except BrokenPipeError:
        return 1
    except Exception as e:  # a bug of ours: still one line, unless --verbose
        if verbose:
            _traceback()
        _error(f"reshard: internal error: {type(e).__name__}: {e} (run with --verbose for the traceback)")
        return 1


def _error(line: str) -> None:
    """The error line (and a refusal's `  - ` lines): no credential a server quoted, no
    control character a row held (``errors.scrub``, ``decode.safe_text``)."""
    click.echo(safe_text(errors.scrub(line), None, keep_lines=True), err=True)


def _traceback() -> None:
    """``--verbose``'s traceback, scrubbed the same way (a chained botocore error's text too)."""
    click.echo(safe_text(errors.scrub(traceback.format_exc()), None, keep_lines=True), err=True, nl=False)


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
