"""``reshard local``: the demo's embedded DynamoDB on its own, to try reshard on your own table."""

from __future__ import annotations

import json
import pathlib
import socket
import time

import click

from reshard import errors
from reshard.cli.options import Env, command

#: Where DynamoDB Local listens by default, so the printed lines stay right from one start to the next.
DEFAULT_PORT = 8000


def _items(path: str) -> list[dict]:
    """Items in DynamoDB JSON: ``aws dynamodb scan --output json``'s document ({"Items": [...]}),
    a list of items, or one item per line."""
    text = pathlib.Path(path).read_text()
    try:
        doc = json.loads(text)
    except json.JSONDecodeError:
        try:
            doc = [json.loads(line) for line in text.splitlines() if line.strip()]
        except json.JSONDecodeError as e:
            raise errors.BadInput(f"--load {path}: not JSON ({e.msg} at line {e.lineno}); give the output of "
                                  f"`aws dynamodb scan --table-name T --output json`") from None
    items = doc.get("Items") if isinstance(doc, dict) else doc
    bad = next((i for i, it in enumerate(items or []) if not isinstance(it, dict)
                or not all(isinstance(v, dict) and len(v) == 1 for v in it.values())), None) \
        if isinstance(items, list) else 0
    if bad is not None:
        raise errors.BadInput(f"--load {path}: item {bad} is not an item in DynamoDB JSON "
                              '(e.g. {"PK": {"S": "sensor-1#3"}, "temp": {"N": "21.5"}}); give the output of '
                              "`aws dynamodb scan --table-name T --output json`")
    return items


def _port(port: int) -> int:
    """The port, checked free now (a clear line instead of a server that dies on start)."""
    from reshard.aws.local import free_port
    if port == 0:
        return free_port()
    with socket.socket() as s:
        try:
            s.bind(("127.0.0.1", port))
        except OSError:
            raise errors.BadInput(f"port {port} on 127.0.0.1 is in use (another DynamoDB Local, or reshard local?): "
                                  f"stop it, or pass --port 0 for any free port") from None
    return port


@command("local")
@click.option("--port", type=click.IntRange(0, 65535), default=DEFAULT_PORT, show_default=True,
              help="Port on 127.0.0.1 (0: any free port).")
@click.option("--create", "migration_file", type=click.Path(dir_okay=False), default=None, metavar="FILE",
              help="Create the table this migration file names: its [keys] (string keys, unless --load's items "
                   "carry numbers or binaries there), on-demand, with TTL on its [cleanup] ttl_attribute.")
@click.option("--load", "load_file", type=click.Path(dir_okay=False), default=None, metavar="JSON",
              help="Put these items into that table: DynamoDB JSON as `aws dynamodb scan --output json` "
                   "prints it (a sample of your real table), a list of items, or one item per line.")
def local(env: Env, port: int, migration_file: str | None, load_file: str | None) -> None:
    """Run a local DynamoDB to try reshard on your own table; Ctrl-C stops it.

    \b
    The demo's embedded server (moto's, in memory, needs `pip install -e '.[demo]'`) on
    127.0.0.1. It prints the endpoint and the lines that point reshard, aws-cli and your
    application at it, and stays up until Ctrl-C (exit 130); its tables end with it.
    With --create FILE it creates the table that migration file names; with --load it
    fills it with items exported from your real table.

    \b
    Example:
      reshard local
      reshard local --port 0
      aws dynamodb scan --table-name SensorEvents --max-items 5000 --output json > sample.json
      reshard local --create migrations/0001_sensor_events.toml --load sample.json
    """
    from reshard.aws.dynamo import Dynamo
    from reshard.aws.local import EmbeddedDynamoDB, create_table
    from reshard.core.migration import load

    if load_file and not migration_file:
        raise click.UsageError("--load needs --create FILE: the migration file that names the table to load")
    migration = None
    if migration_file:
        if not pathlib.Path(migration_file).is_file():
            raise errors.BadInput(f"--create {migration_file}: no such file (a migration file, e.g. "
                                  "migrations/0001_sensor_events.toml)")
        migration = load(migration_file)
    if load_file and not pathlib.Path(load_file).is_file():
        raise errors.BadInput(f"--load {load_file}: no such file")
    items = _items(load_file) if load_file else []
    server = EmbeddedDynamoDB(_port(port))
    url = server.start()
    try:
        for note in server.notes():
            env.info(f"reshard local: {note}")
        made = []
        if migration is not None:
            dynamo = Dynamo(endpoint_url=url)
            keys = [k for k in (migration.keys.partition, migration.keys.sort) if k]
            types = {k: next(iter(items[0][k])) for k in keys if items and k in items[0]}
            create_table(dynamo, migration.table, migration.keys, types=types)
            ttl = migration.cleanup.ttl_attribute if migration.cleanup else None
            if ttl:
                dynamo.call("update_time_to_live", TableName=migration.table,
                            TimeToLiveSpecification={"Enabled": True, "AttributeName": ttl})
            if items:
                dynamo.batch_write(migration.table, [{"PutRequest": {"Item": it}} for it in items])
            made.append(f"table {migration.table}: created (keys {', '.join(keys)}"
                        + (f"; TTL on {ttl}" if ttl else "") + ")"
                        + (f", {len(items)} items loaded from {load_file}" if load_file else ", empty"))
        data = {"endpoint_url": url, "environment": {"AWS_ENDPOINT_URL": url, "AWS_REGION": "us-east-1",
                                                      "AWS_ACCESS_KEY_ID": "local", "AWS_SECRET_ACCESS_KEY": "local"},
                "tables": [migration.table] if migration else []}
        env.emit(data, lambda: _banner(url, made, migration_file))
        while server.running():
            time.sleep(0.5)
        raise errors.ReshardError(f"the local DynamoDB at {url} stopped by itself")
    except KeyboardInterrupt:
        click.echo(f"reshard local: stopped the DynamoDB at {url}; its tables are gone", err=True)
        raise
    finally:
        server.stop()


def _banner(url: str, made: list[str], migration_file: str | None) -> str:
    lines = [f"reshard local: a DynamoDB (moto's server, in memory) listens at {url}", *made,
             "",
             "Point reshard, aws-cli and your application at it (in another shell):",
             f"  export AWS_ENDPOINT_URL={url}",
             "  export AWS_REGION=us-east-1 AWS_ACCESS_KEY_ID=local AWS_SECRET_ACCESS_KEY=local",
             ""]
    if migration_file:
        lines += ["Then walk the migration (no application runs here: --allow-no-shims vouches for that):",
                  f"  reshard plan {migration_file}",
                  f"  reshard start {migration_file}",
                  "  reshard advance --allow-no-shims      # dual_write, dual_read, backfill; then as in the README"]
    else:
        lines += ["Try it on your own table: export a sample of it from AWS (in a shell without the lines above),",
                  "  aws dynamodb scan --table-name YOUR_TABLE --max-items 5000 --output json > sample.json",
                  "write a migration file for it (migrations/ has six examples), and start this again with both:",
                  "  reshard local --create migrations/YOUR_MIGRATION.toml --load sample.json",
                  "(or create and fill a table yourself: aws dynamodb create-table, or boto3, at the endpoint above)."]
    lines += ["", "Everything is in memory and ends with this command: Ctrl-C stops it."]
    return "\n".join(lines)
