"""Safe defaults: loopback-only Ray, secrets never stored, refs never reach a shell."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from orchestrator.cli import main
from orchestrator.fingerprint import REDACTED, redact_env, whole_env
from tests.conftest import make_sim_repo

LISTENERS = r"""
import json, os, ray
from orchestrator.controller import start_ray

def children(pid):
    kids = []
    for e in os.listdir("/proc"):
        if e.isdigit():
            try:
                stat = open(f"/proc/{e}/stat").read()
            except OSError:
                continue
            if int(stat[stat.rfind(")") + 2:].split()[1]) == pid:
                kids.append(int(e))
    return kids + [g for k in kids for g in children(k)]

def listening():
    socks = {}
    for name in ("tcp", "tcp6"):
        for line in open(f"/proc/net/{name}").read().splitlines()[1:]:
            f = line.split()
            if f[3] == "0A":  # LISTEN
                hexip = f[1].split(":")[0]
                socks[f[9]] = hexip
    return socks

def ip(hexip):
    if len(hexip) == 8:
        return ".".join(str(int(hexip[i:i + 2], 16)) for i in (6, 4, 2, 0))
    return "::1" if hexip.endswith("01000000") and hexip.startswith("0" * 24) else (
        "v4mapped:" + ".".join(str(int(hexip[24:32][i:i + 2], 16)) for i in (6, 4, 2, 0))
        if hexip[:24] == "0000000000000000FFFF0000" else hexip)

start_ray({"kind": "local", "num_cpus": 1})
socks = listening()
found = set()
for pid in [os.getpid(), *children(os.getpid())]:
    try:
        fds = os.listdir(f"/proc/{pid}/fd")
    except OSError:
        continue
    for fd in fds:
        try:
            link = os.readlink(f"/proc/{pid}/fd/{fd}")
        except OSError:
            continue
        if link.startswith("socket:[") and link[8:-1] in socks:
            found.add(ip(socks[link[8:-1]]))
print(json.dumps({"node": ray.nodes()[0]["NodeManagerAddress"], "listen": sorted(found)}))
ray.shutdown()
"""


def test_local_ray_listens_on_loopback_only(tmp_path):
    out = subprocess.run([sys.executable, "-c", LISTENERS], cwd=tmp_path, capture_output=True,
                         text=True, timeout=180, check=True).stdout.strip().splitlines()[-1]
    doc = json.loads(out)
    assert doc["node"] == "127.0.0.1"
    assert doc["listen"], "no listening socket found for Ray's processes"
    assert all(ip in ("127.0.0.1", "v4mapped:127.0.0.1", "::1") for ip in doc["listen"]), doc


def test_secret_variables_are_redacted():
    env = {"HF_TOKEN": "hf_abc", "AWS_SECRET_ACCESS_KEY": "x", "DB_PASSWORD": "p",
           "OPENAI_API_KEY": "k", "NCCL_PROTO": "LL128", "MY_TOKEN": "t"}
    red = redact_env(env)
    assert red["NCCL_PROTO"] == "LL128"
    assert all(red[k] == REDACTED for k in env if k != "NCCL_PROTO")
    assert whole_env(env)["HF_TOKEN"] == REDACTED


def test_secrets_in_config_are_refused(tmp_path, capsys):
    repo = tmp_path / "repo"
    make_sim_repo(repo, [{}])
    with pytest.raises(SystemExit) as exc:
        main(["trial", f"repo={repo}", f"runs_dir={tmp_path / 'runs'}", "env.HF_TOKEN=hf_secret"])
    assert exc.value.code == 2
    err = capsys.readouterr().err
    assert "HF_TOKEN" in err and "hf_secret" not in err
    assert not (tmp_path / "runs").exists() or not any(
        p for p in (tmp_path / "runs").iterdir() if not p.name.startswith("."))


def test_hostile_commit_message_is_inert(tmp_path, capsys):
    from tests.conftest import git

    repo = tmp_path / "repo"
    make_sim_repo(repo, [{}])
    (repo / "f.txt").write_text("x")
    git(repo, "add", "-A")
    git(repo, "commit", "-q", "-m", "$(touch pwned) `touch pwned2` <script>alert(1)</script>")
    from orchestrator.workspace import Workspace

    ws = Workspace(repo, tmp_path / "cache")
    commits = ws.commits_between("HEAD~1", "HEAD")
    assert "$(touch pwned)" in commits[-1].subject
    ws.checkout(commits[-1].sha)
    assert not (tmp_path / "pwned").exists() and not (repo / "pwned").exists()


# --------------------------------------------------------------- terminal escapes

HOSTILE = "retitle\x1b]0;pwned\x07 \x1b[31mred\x1b[0m over\rwrite\x08 \x9b2J bidi\u202eexe"
CONTROLS = [chr(c) for c in (*range(0x00, 0x09), *range(0x0b, 0x20), *range(0x7f, 0xa0))]


def _clean(text: str) -> bool:
    return not any(c in text for c in CONTROLS) and "\u202e" not in text


def test_printable_drops_whole_escape_sequences():
    from orchestrator.safe_text import printable

    assert printable(HOSTILE) == "retitle red overwrite  bidiexe"
    assert printable("line one\r\nline two\ttab") == "line one\nline two\ttab"
    assert printable("a\nb", newlines=False) == "a b"
    assert printable("plain subject") == "plain subject"


def test_commit_text_is_cleaned_where_it_enters(tmp_path):
    from tests.conftest import git

    repo = tmp_path / "repo"
    make_sim_repo(repo, [{}])
    (repo / "f.txt").write_text("x")
    git(repo, "add", "-A")
    subprocess.run(["git", "-c", "user.name=Mallory\x1b[8m", "-c", "user.email=m@example.com",
                    "commit", "-q", "-m", HOSTILE], cwd=repo, check=True)
    from orchestrator.workspace import Workspace

    (commit,) = Workspace(repo, tmp_path / "cache").commits_between("HEAD~1", "HEAD")[1:]
    assert commit.subject == "retitle red overwrite  bidiexe"
    assert _clean(commit.author) and "Mallory" in commit.author


def test_no_escape_from_repository_text_reaches_the_terminal_or_a_report(
        tmp_path, capsys, monkeypatch):
    from tests import test_report_render

    monkeypatch.setattr(test_report_render, "EVIL", HOSTILE)
    run = test_report_render.build_bisect_run(tmp_path / "runs", run_id="evil")
    with pytest.raises(SystemExit) as exc:
        main(["report", str(run["run_dir"])])
    assert exc.value.code == 0
    printed = capsys.readouterr().out
    assert "retitle red" in printed  # the subject is shown, its escapes are not
    assert _clean(printed.replace("\n", "")), repr(printed)
    for name in ("report.md", "report.html"):
        text = (run["run_dir"] / name).read_text()
        assert "retitle red" in text and _clean(text.replace("\n", "")), name


def test_a_hostile_ref_is_not_echoed_raw_in_the_error_line(tmp_path, capsys):
    repo = tmp_path / "repo"
    make_sim_repo(repo, [{}])
    with pytest.raises(SystemExit) as exc:
        main(["trial", f"repo={repo}", f"runs_dir={tmp_path / 'runs'}", "commit='x\x1b]0;t\x07y'"])
    assert exc.value.code == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and _clean(err.rstrip("\n"))
    assert "x\\x1b]0;t\\x07y" in err  # shown, escaped, rather than sent to the terminal


def test_server_log_tails_are_cleaned(tmp_path):
    from orchestrator.runner.trial import last_lines, log_tail

    log = tmp_path / "server.log"
    log.write_bytes(b"starting\n\x1b[2J\x1b]0;owned\x07fatal: \x1b[31mCUDA error\x1b[0m\r\n")
    assert _clean(log_tail(log).replace("\n", ""))
    assert last_lines(log) == "starting | fatal: CUDA error"
