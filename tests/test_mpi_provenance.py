"""provenance._checkout_commit under MPI: every rank asks git, so git must not take .git/index.lock."""
from __future__ import annotations

import subprocess

from numformer import provenance


def test_git_runs_without_optional_locks(monkeypatch):
    """GIT_OPTIONAL_LOCKS=0 on every git call: `git status` then leaves the index (and its lock) alone, so the
    ranks of an MPI run and the user's own `git commit` do not race for .git/index.lock."""
    calls = []

    def fake_run(args, **kwargs):
        calls.append((args, kwargs.get("env") or {}))
        return subprocess.CompletedProcess(args, 0, stdout="abc1234\n", stderr="")

    monkeypatch.setattr(provenance.subprocess, "run", fake_run)
    assert provenance._checkout_commit().startswith("abc1234")
    assert [args[1] for args, _ in calls] == ["rev-parse", "rev-parse", "status"]
    assert all(env.get("GIT_OPTIONAL_LOCKS") == "0" for _, env in calls), calls
