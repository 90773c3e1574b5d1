"""``reshard status --watch``: redraw the status every few seconds until the job or the phase changes.

Each frame is ``status``'s own data (:func:`reshard.cli.render.status_data`), plus, per job
run in progress, ``rate_now``: items per second since the previous frame. Text on a
terminal redraws the screen; text elsewhere prints frame after frame, each after a line with
its time; ``--output json`` prints one compact JSON document per frame (JSON Lines). The
watch ends (exit 0) once the phase version, a switch, or the set of job runs and their
finished state differs from the first frame's, and says what changed; Ctrl-C ends it with
exit 130.
"""

from __future__ import annotations

import json
import sys
import time
from typing import Callable

import click

from reshard import operations
from reshard.cli import render
from reshard.cli.formats import json_default, plain
from reshard.core.progress import progress_counter


def watch_key(report: dict) -> tuple:
    """What ends the watch when it changes: the phase (version, switch) and the job runs (finished or not)."""
    return (report["phase_version"], report["switching"],
            tuple((j["job"], j["run"], bool(j["finished_at"])) for j in report["jobs"]))


def what_changed(first: dict, last: dict) -> str:
    if (first["phase_version"], first["switching"]) != (last["phase_version"], last["switching"]):
        return (f"the phase moved: {first['phase']} (v{first['phase_version']}) -> {last['phase']} "
                f"(v{last['phase_version']}{', switching' if last['switching'] else ''})")
    before = {(j["job"], j["run"]): j for j in first["jobs"]}
    for j in last["jobs"]:
        old = before.get((j["job"], j["run"]))
        if old is None:
            return f"{j['job']} run {j['run']} started"
        if bool(old["finished_at"]) != bool(j["finished_at"]):
            return f"{j['job']} run {j['run']} finished"
    return "the job runs changed"


def _rate_now(report: dict, previous: dict | None, elapsed: float) -> None:
    before = {(j["job"], j["run"]): j for j in (previous or {}).get("jobs", [])}
    for j in report["jobs"]:
        old = before.get((j["job"], j["run"]))
        if j["finished_at"] or old is None or elapsed <= 0:
            j["rate_now"] = None
            continue
        counter = progress_counter(j["job"])
        j["rate_now"] = round((j["totals"].get(counter, 0) - old["totals"].get(counter, 0)) / elapsed, 1)


def watch_status(env, mid: str, interval: float, *, sleep: Callable[[float], None] | None = None,
                 clock: Callable[[], float] = time.monotonic, tty: bool | None = None) -> None:
    """Frames until the job or the phase changes (see the module's docstring)."""
    sleep = sleep or _pause
    store = env.store()
    tty = sys.stdout.isatty() if tty is None else tty
    first = previous = None
    at = clock()
    while True:
        result = operations.status(store, mid,
                                   progress_total=lambda state: operations.progress_total(env.dynamo(), state))
        report = render.status_data(result)
        now = clock()
        _rate_now(report, previous, now - at)
        at = now
        first = first or report
        ended = watch_key(report) != watch_key(first)
        if ended:
            report["watch_ended"] = what_changed(first, report)
        _draw(env, report, tty)
        if ended:
            return
        previous = report
        sleep(interval)


def _pause(seconds: float) -> None:
    time.sleep(seconds)


def _draw(env, report: dict, tty: bool) -> None:
    if env.output == "json" and env.query is None:
        click.echo(json.dumps(plain(report), sort_keys=True, separators=(",", ":"), default=json_default))
        return
    if env.output is not None or env.query is not None:  # --output text/table or --query: the data, per frame
        env.emit(report, "")
        return
    text = render.status_text(report)
    for j in report["jobs"]:
        if j.get("rate_now") is not None:
            text += f"\n  {j['job']} run {j['run']}: {j['rate_now']:,.1f} items/s over the last frame"
    stamp = time.strftime("%Y-%m-%d %H:%M:%SZ", time.gmtime())
    footer = (f"status --watch: stopped: {report['watch_ended']}" if report.get("watch_ended")
              else f"status --watch at {stamp}: redraws until the job or the phase changes (Ctrl-C to stop)")
    if tty:
        click.echo("\x1b[H\x1b[2J" + text + "\n\n" + footer)
    else:
        click.echo(f"--- {stamp}\n{text}\n{footer}")
