"""`gpulease admin quota` against the in-process server: set, list, lift, bad input."""

from __future__ import annotations

import json

from wired_cli import Cli


def test_admin_quota_set_ls_and_lift(cli: Cli) -> None:
    cli.login_as("ann")
    refused = cli("admin", "quota", "set", "4", "--user", "ann")
    assert refused.exit_code == 1 and "admin" in refused.stderr.lower()
    cli.login_as_admin()
    assert "nobody is capped" in cli("admin", "quota", "ls").output
    made = cli("admin", "quota", "set", "4", "--user", "ann")
    assert made.exit_code == 0 and "user ann: at most 4 GPUs at once" in made.stdout
    listed = json.loads(cli("admin", "quota", "ls", "-o", "json").stdout)
    assert listed == [{"kind": "user", "name": "ann", "max_gpus": 4}]
    lifted = cli("admin", "quota", "set", "none", "--user", "ann")
    assert lifted.exit_code == 0 and "no GPU cap" in lifted.stdout
    assert json.loads(cli("admin", "quota", "ls", "-o", "json").stdout) == []
    for args, said in (
        (("set", "4"), "one of --user NAME or --team NAME"),
        (("set", "four", "--user", "ann"), "not a number of GPUs"),
        (("set", "4", "--team", "nolab"), "no team 'nolab'"),
    ):
        bad = cli("admin", "quota", *args)
        assert bad.exit_code != 0 and said in bad.stderr, bad.output
