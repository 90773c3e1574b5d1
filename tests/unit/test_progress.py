"""The tqdm subscriber: counts pages' items, shows throttle reasons, stays quiet when disabled."""

from __future__ import annotations

from reshard.jobs.subscribers import TqdmSubscriber


def test_bar_advances_by_scanned_items_and_shows_the_throttle_reason(capsys):
    sub = TqdmSubscriber(100, initial=10, enabled=True)
    sub.on_page(0, {"scanned": 25, "moved": 20})
    sub.on_page(1, {"scanned": 5})
    sub.on_throttle("throttled on BatchWriteItem: rate 400 → 200 WCU/s")
    assert sub.bar.n == 40 and sub.bar.total == 100
    assert "throttled on BatchWriteItem" in sub.bar.postfix
    sub.on_run_done(None)
    assert "40.0/100" in capsys.readouterr().err


def test_disabled_bar_prints_nothing(capsys):
    sub = TqdmSubscriber(100, enabled=False)
    sub.on_page(0, {"scanned": 25})
    sub.on_throttle("x")
    sub.on_run_done(None)
    assert sub.bar is None and capsys.readouterr() == ("", "")
