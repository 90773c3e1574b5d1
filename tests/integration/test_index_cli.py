"""``reshard plan`` / ``start`` for an index-only migration on dynalite: what they refuse, in one line each."""

from __future__ import annotations

import json

from reshard.cli.main import main

from tests.index_support import gsi_migration, create_gsi_table, header


def test_plan_and_start_refuse_a_keys_only_gsi_also_in_a_combined_file(dynalite, dynalite_server, unique_name,
                                                                    tmp_path, capsys):
    create_gsi_table(dynalite, unique_name, projection={"ProjectionType": "KEYS_ONLY"})
    for i in range(6):
        dynalite.call("put_item", TableName=unique_name, Item=header(i, shard=i % 4))
    path = tmp_path / "gsi.toml"
    path.write_text(gsi_migration("gsi-cli", unique_name))
    glob = ["--endpoint-url", dynalite_server.endpoint, "--control-table", unique_name + "-ctl"]

    assert main([*glob, "plan", str(path), "--output", "json"]) == 1  # start refuses the KEYS_ONLY index
    r = json.loads(capsys.readouterr().out)
    (ix,) = r["indexes"]
    assert ix["items"]["indexed"] == 6 and ix["items"]["moves"] + ix["items"]["already_new"] == 6
    assert sum(ix["distribution"]["new"]["counts"]) == 6 and ix["distribution"]["new"]["shards"] == 16
    # Small items, KEYS_ONLY entries: 1 WCU table write + 1 GSI delete + 1 GSI put per rewritten item.
    assert ix["rewrite_wcu"] == {"table": ix["items"]["moves"], "index": 2 * ix["items"]["moves"],
                                 "total": 3 * ix["items"]["moves"]}
    (refusal,) = r["start_refuses"]
    assert refusal.startswith("[index.ByCountry]: GSI 'ByCountry' projects KEYS_ONLY")

    assert main([*glob, "start", str(path)]) == 2
    err = capsys.readouterr().err
    assert "projects KEYS_ONLY" in err and "Traceback" not in err

    combined = tmp_path / "both.toml"
    combined.write_text(gsi_migration("gsi-both", unique_name).replace(
        "[index.ByCountry]\n", '[from]\npartition = "{invoice}#{shard}"\nshards = 2\nshard_by = ["invoice"]\n'
        '[to]\npartition = "{invoice}#{shard}"\nshards = 4\nshard_by = ["invoice"]\n[index.ByCountry]\n', 1))
    # A combined file (table keys AND the GSI) is planned and checked as both: the table's
    # analysis, the GSI's, and start refuses what either refuses (here the KEYS_ONLY index).
    assert main([*glob, "plan", str(combined), "--output", "json"]) == 1
    r = json.loads(capsys.readouterr().out)
    assert r["indexes"][0]["items"]["indexed"] == 6 and "capacity_gsi" in r and r["items"]["sampled"] == 6
    assert r["capacity_gsi_verify"]["rcu"] >= r["capacity_gsi_verify"]["scan_rcu"] > 0
    assert r["migration"]["indexes"][0]["to"]["shards"] == 16 and r["migration"]["to"]["shards"] == 4
    assert any("projects KEYS_ONLY" in b for b in r["start_refuses"])
    assert main([*glob, "start", str(combined)]) == 2
    err = capsys.readouterr().err
    assert "projects KEYS_ONLY" in err and "Traceback" not in err
