"""The explorer finds a real race, reports it readably, and passes a correct protocol.

Read-modify-write of a counter: each actor reads the counter (GetItem) and writes it
back plus one (PutItem). Unconditional, two actors lose an update in some
interleavings; conditioned on the version read (retrying on ConditionalCheckFailed),
every interleaving ends at 2. The schedule counts are what the bounds imply.
"""

from __future__ import annotations

from math import comb, factorial

from reshard import errors
from tests.model.explore import World, explore, replay
from tests.model.scheduler import Killed, Scheduler

TABLE = "counters"
KEY = {"id": {"S": "c"}}


def make_table(w: World) -> None:
    w.dynamo.call("create_table", TableName=TABLE, BillingMode="PAY_PER_REQUEST",
                  KeySchema=[{"AttributeName": "id", "KeyType": "HASH"}],
                  AttributeDefinitions=[{"AttributeName": "id", "AttributeType": "S"}])
    w.dynamo.call("put_item", TableName=TABLE, Item={**KEY, "n": {"N": "0"}, "ver": {"N": "0"}})


def counter(w: World) -> int:
    return int(w.db.items(TABLE)[0]["n"]["N"])


def plain_increment(w: World) -> None:
    item = w.dynamo.call("get_item", TableName=TABLE, Key=KEY, ConsistentRead=True)["Item"]
    n = int(item["n"]["N"])
    w.dynamo.call("put_item", TableName=TABLE, Item={**KEY, "n": {"N": str(n + 1)}, "ver": {"N": "0"}})


def cas_increment(w: World) -> None:
    while True:
        item = w.dynamo.call("get_item", TableName=TABLE, Key=KEY, ConsistentRead=True)["Item"]
        n, ver = int(item["n"]["N"]), int(item["ver"]["N"])
        try:
            w.dynamo.call("put_item", TableName=TABLE, Item={**KEY, "n": {"N": str(n + 1)}, "ver": {"N": str(ver + 1)}},
                          ConditionExpression="ver = :seen", ExpressionAttributeValues={":seen": {"N": str(ver)}})
            return
        except errors.ConditionalCheckFailed:
            continue  # someone wrote since our read: read again


def scenario(increment, actors: int = 2):
    def factory(w: World):
        make_table(w)
        for i in range(actors):
            w.actor("ABCDE"[i], lambda: increment(w))

        def check(w: World) -> None:
            assert counter(w) == actors, f"counter is {counter(w)} after {actors} increments: an update was lost"
        return check
    return factory


def test_a_lost_update_is_found_and_reported_with_its_trace():
    result = explore(scenario(plain_increment))
    assert result.violation is not None
    v = result.violation
    # Depth-first, lexicographic: A, A runs A alone first; the first losing schedule reads twice before writing.
    assert v.schedule == ["A", "B", "A", "B"]
    assert "an update was lost" in v.message and "counter is 1" in v.message
    report = v.report()
    assert "get_item" in report and "put_item" in report and "counters {id=c}" in report
    lines = [s.line() for s in v.trace]
    assert "A" in lines[0] and "-> " in lines[0] and "n=0" in lines[0]  # A read n=0
    assert "B" in lines[1] and "n=0" in lines[1]                      # B read n=0 too
    assert "n=1" in lines[2] and "n=1" in lines[3]                    # both wrote 1
    # The report replays: the same schedule gives the same trace and the same violation.
    again = replay(scenario(plain_increment), v.schedule)
    assert again.violation and [s.line() for s in again.trace] == lines
    assert result.schedules == 2  # A A B B passed, A B A B failed: the search stopped there


def test_every_interleaving_of_the_plain_increment_is_counted():
    # Two actors of two calls each: C(4, 2) = 6 interleavings; 4 of them lose the update.
    result = explore(scenario(plain_increment), stop_at_first=False, keep_runs=True)
    assert result.schedules == result.complete == comb(4, 2) == 6
    assert sorted(" ".join(r.schedule) for r in result.runs) == sorted(
        ["A A B B", "A B A B", "A B B A", "B A A B", "B A B A", "B B A A"])
    assert sum(1 for r in result.runs if r.violation) == 4
    # Three actors: 6! / (2! 2! 2!) = 90.
    three = explore(scenario(plain_increment, actors=3), stop_at_first=False)
    assert three.schedules == factorial(6) // 8 == 90


def test_the_bound_truncates_schedules():
    # Up to depth 2, every prefix of two moves among two always-enabled actors: 2 * 2 = 4.
    result = explore(scenario(plain_increment), max_steps=2, stop_at_first=False)
    assert result.schedules == result.truncated == 4 and result.violation is None  # truncated runs are not checked
    checked = explore(scenario(plain_increment), max_steps=3, stop_at_first=False)
    # Depth 3: A A B (then B: would be the 4th move), A B *, B A *, B B A -> 1 + 2 + 2 + 1 = 6 schedules;
    # A A B B ends at 4 moves so nothing ends before 3 and every one is truncated.
    assert checked.schedules == checked.truncated == 6


def test_the_version_conditioned_increment_passes_every_interleaving():
    result = explore(scenario(cas_increment), stop_at_first=False, keep_runs=True)
    result.assert_ok()
    # The 2 serial orders (A A B B, B B A A: 4 moves) pass at once. In the 4 others both read
    # first (A B, B A), then whoever is stepped next writes and wins and is done; the loser's
    # put fails, it reads again and writes: its last 3 moves are forced. 2 + 4 = 6 schedules,
    # the same count as the plain version, two of them 4 moves long and four 6 moves long.
    assert result.complete == result.schedules == 6
    assert all(r.violation is None for r in result.runs)
    assert sorted(len(r.schedule) for r in result.runs) == [4, 4, 6, 6, 6, 6]
    assert sorted(" ".join(r.schedule) for r in result.runs) == sorted(
        ["A A B B", "B B A A", "A B A B B B", "A B B A A A", "B A A B B B", "B A B A A A"])
    assert any("ConditionalCheckFailed" in s.result for r in result.runs for s in r.trace)
    three = explore(scenario(cas_increment, actors=3), stop_at_first=False)
    three.assert_ok()
    assert three.schedules > 90  # retries make some runs longer, with more interleavings than the plain 90


def test_random_samples_beyond_the_bound_are_seeded_and_find_the_race():
    a = explore(scenario(plain_increment, actors=3), max_steps=1, samples=50, seed=7, stop_at_first=False)
    b = explore(scenario(plain_increment, actors=3), max_steps=1, samples=50, seed=7, stop_at_first=False)
    assert a.sampled == b.sampled == 50
    assert a.violation is not None and a.violation.sampled
    assert a.violation.schedule == b.violation.schedule  # same seed, same schedules


def test_kill_between_two_calls_and_ticks_are_moves():
    # One actor of two calls (get, put) that may be killed once, and one tick of the clock. A kill
    # ends the run; moves stop when the actor is done. Leaves: kill | tick kill | tick A A |
    # tick A kill | A A | A kill | A tick A | A tick kill = 8 schedules.
    def factory(w: World):
        make_table(w)
        w.actor("A", lambda: plain_increment(w))
        w.may_kill("A")
        w.may_tick(30.0)

        def check(w: World) -> None:
            killed = w.sched.actors["A"].killed
            assert counter(w) == (0 if killed else 1)  # killed at a call: before its put, so it never wrote
        return check

    result = explore(factory, stop_at_first=False, keep_runs=True)
    result.assert_ok()
    schedules = sorted(" ".join(r.schedule) for r in result.runs)
    assert schedules == sorted([
        "A A", "A tick A", "A kill:A", "A tick kill:A",
        "tick A A", "tick A kill:A", "tick kill:A", "kill:A",
    ])
    assert result.schedules == 8
    # The killed-after-reading run never wrote: n stays 0.
    run = next(r for r in result.runs if r.schedule == ["A", "kill:A"])
    assert any(s.op == "kill" for s in run.trace) and run.violation is None


def test_stall_resume_and_kill_by_hand():
    w = World()
    make_table(w)
    w.actor("A", lambda: plain_increment(w))
    w.actor("B", lambda: plain_increment(w))
    s: Scheduler = w.sched
    s.start()
    assert s.enabled() == ["A", "B"]
    s.step("A")                 # A read n=0
    s.stall("A")                # A pauses (GC, frozen host) ...
    assert s.enabled() == ["B"]
    s.tick(120)                 # ... for two minutes of logical time
    s.run_to_end()              # B runs to completion meanwhile
    assert counter(w) == 1
    s.resume("A")
    s.step("A")                 # A wakes and writes what it read before: B's update is lost
    assert counter(w) == 1 and s.actors["A"].state == "done"
    s.shutdown()
    assert w.clock() == 1_700_000_120.0
    text = "\n".join(x.line() for x in s.trace)
    assert "stall" in text and "tick" in text and "resume" in text

    # A killed actor never makes another call, even from cleanup code that catches everything.
    w2 = World()
    make_table(w2)
    calls_after_kill = []

    def stubborn():
        try:
            w2.dynamo.call("get_item", TableName=TABLE, Key=KEY)
            w2.dynamo.call("put_item", TableName=TABLE, Item={**KEY, "n": {"N": "99"}})
        except BaseException:
            try:
                w2.dynamo.call("delete_item", TableName=TABLE, Key=KEY)  # a "finally" that writes
            except Killed:
                calls_after_kill.append("refused")
            raise

    w2.actor("X", stubborn)
    w2.sched.start()
    w2.sched.step("X")
    w2.sched.kill("X")
    assert calls_after_kill == ["refused"] and w2.sched.actors["X"].state == "killed"
    assert counter(w2) == 0 and len(w2.db.items(TABLE)) == 1
    w2.sched.shutdown()


def test_a_call_from_a_thread_outside_the_schedule_is_refused():
    import threading
    w = World()
    make_table(w)
    seen = []

    def sneaky():
        t = threading.Thread(target=lambda: seen.append(_try(lambda: w.db.get_item(TableName=TABLE, Key=KEY))))
        t.start()
        t.join()
        w.dynamo.call("get_item", TableName=TABLE, Key=KEY)

    w.actor("A", sneaky)
    w.sched.start()
    w.sched.run_to_end()
    w.sched.shutdown()
    assert seen and "no actor" in seen[0]


def _try(fn):
    try:
        fn()
        return "ok"
    except RuntimeError as e:
        return str(e)


def test_throughput_is_reported():
    result = explore(scenario(cas_increment, actors=3), stop_at_first=False)
    assert result.per_second > 0
    print(f"\n{result.schedules} schedules in {result.seconds:.2f}s: {result.per_second:.0f} schedules/s")


def test_preemption_bounding():
    # Preemption = a switch away from an actor that could have gone on.
    # Bound 0: only the serial orders. Bound 1: also A B B A and B A A B (A is preempted once, then
    # B finishes and A resumes: no preemption). Bound 2: all six.
    counts = [explore(scenario(plain_increment), preemption_bound=k, stop_at_first=False).schedules for k in (0, 1, 2)]
    assert counts == [2, 4, 6]
    # The lost update needs a preemption: bound 0 misses it, bound 1 finds it.
    assert explore(scenario(plain_increment), preemption_bound=0).violation is None
    assert explore(scenario(plain_increment), preemption_bound=1).violation.schedule == ["A", "B", "B", "A"]


def test_a_guarded_request_in_flight_lands_before_the_clock_passes_the_longest_request():
    """With ``World.max_request_seconds``, a request whose guard passed is in flight: no other
    actor's sleep (nor a tick) may move the clock past its landing bound before it lands; a
    freeze *before* the guard is not bounded (the guard then sees it)."""
    from reshard.aws.dynamo import to_wire

    seen: list[tuple[float, float]] = []  # (guard time, landing time)

    def factory(w: World):
        w.max_request_seconds = 1.0
        w.dynamo.call("create_table", TableName="tbl", BillingMode="PAY_PER_REQUEST",
                      KeySchema=[{"AttributeName": "k", "KeyType": "HASH"}],
                      AttributeDefinitions=[{"AttributeName": "k", "AttributeType": "S"}])
        checked = {}

        def writer():
            w.dynamo.call("put_item", guard=lambda: checked.setdefault("at", w.clock()),
                          TableName="tbl", Item=to_wire({"k": "a"}))
            seen.append((checked["at"], w.clock()))

        w.actor("W", writer)
        w.actor("S", lambda: [w.sleep(0.6) for _ in range(4)])
        w.may_tick(5)
        return None

    result = explore(factory)
    assert result.schedules > 10 and len(seen) == result.schedules
    assert all(landed - checked <= 1.0 for checked, landed in seen), seen
    assert any(checked >= 5 for checked, _ in seen)  # a freeze before the guard is unbounded
