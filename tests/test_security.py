"""Safe defaults: loopback-only Ray, secrets never stored, refs never reach a shell."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from orchestrator.cli import main
from orchestrator.system.fingerprint import REDACTED, redact_env, whole_env
from tests.conftest import make_sim_repo

LISTENERS = r"""
import json, os, ray
from orchestrator.control.controller import start_ray

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


@pytest.mark.e2e  # starts Ray in a child process
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
        main(["trial", "target=sim", f"repo={repo}", f"runs_dir={tmp_path / 'runs'}", "env.HF_TOKEN=hf_secret"])
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


# --- Redaction: by name part, by value, in argument lists; never a level of a candidate -----

SECRET_VALUES = {  # name -> value: each must appear nowhere under a run directory
    "DATABASE_URL": "postgres://admin:hunter2pass@db.internal:5432/metrics",
    "GH_PAT": "ghp_" + "A1b2C3d4" * 5,
    "SENTRY_DSN": "https://5e4c2a1b9f8e7d6c@o1234.ingest.sentry.io/5678",
    "HF_TOKEN": "hf_" + "q" * 34,
    "MY_SERVICE_URL": "https://user:topsecret99@svc.example.com/api",
}


def test_names_are_secret_by_part_not_by_substring():
    from orchestrator.system.redact import is_secret_name

    for name in ("HF_TOKEN", "GH_PAT", "SENTRY_DSN", "OPENAI_API_KEY", "DB_PASSWORD",
                 "AWS_SECRET_ACCESS_KEY", "GITHUB_ACCESS_TOKEN", "hf-token", "api-key"):
        assert is_secret_name(name), name
    for name in ("TOKENIZERS_PARALLELISM", "NCCL_IB_PKEY", "PWD", "MAX_TOKENS_PER_BATCH",
                 "KEYBOARD_LAYOUT", "NCCL_PROTO", "tokenizer-path", "PASSTHROUGH_MODE"):
        assert not is_secret_name(name), name


def test_values_are_redacted_by_shape_and_urls_keep_their_host():
    from orchestrator.system.redact import REDACTED, redact_value, secret_in_value

    assert redact_value(SECRET_VALUES["DATABASE_URL"]) == f"postgres://{REDACTED}@db.internal:5432/metrics"
    assert redact_value(SECRET_VALUES["SENTRY_DSN"]) == f"https://{REDACTED}@o1234.ingest.sentry.io/5678"
    for value in (SECRET_VALUES["GH_PAT"], SECRET_VALUES["HF_TOKEN"], "sk-proj-" + "x1" * 15,
                  "xoxb-1234567890-abcdefghij", "AKIAIOSFODNN7EXAMPLE"):
        assert redact_value(value) == REDACTED, value
    for value in ("LL128", "/usr/local/cuda/bin:/usr/bin", "http://127.0.0.1:30000/v1", "false",
                  "0", "hf_home", "sk-1", "moonshotai/Kimi-K2.5"):
        assert not secret_in_value(value), value
    assert redact_value("python bench.py --token s3cr3t --tokenizer-path /m") == \
        f"python bench.py --token {REDACTED} --tokenizer-path /m"


def test_argument_lists_hide_the_value_after_a_credential_flag():
    from orchestrator.system.redact import REDACTED, redact_argv

    argv = ["--api-key", "k3y", "--tp-size", "8", "--hf-token=abc", "--tokenizer-path", "/m",
            "--token", "--next"]
    assert redact_argv(argv) == ["--api-key", REDACTED, "--tp-size", "8", f"--hf-token={REDACTED}",
                                 "--tokenizer-path", "/m", "--token", "--next"]


def test_config_yaml_and_store_hold_no_secret(tmp_path):
    from orchestrator.commands.parts import create_run
    from orchestrator.config.compose import compose_settings

    repo = tmp_path / "repo"
    make_sim_repo(repo, [{}])
    cfg = compose_settings("trial", [f"repo={repo}", f"runs_dir={tmp_path / 'runs'}",
                                   "target.extra_args=[--api-key,k3y-9876543,--enable-x]",
                                   "target=command", "target.bench='python b.py --token t0k-1234'"])
    run_dir, store = create_run(cfg)
    store.close()
    written = b"".join(p.read_bytes() for p in run_dir.rglob("*") if p.is_file())
    assert b"k3y-9876543" not in written and b"t0k-1234" not in written
    assert b"--enable-x" in written and b"--api-key" in written
    # The run itself keeps the real value: redaction is for what is written down.
    assert list(cfg.target.extra_args)[1] == "k3y-9876543"


def test_secret_values_in_a_candidate_are_refused(tmp_path, capsys):
    repo = tmp_path / "repo"
    make_sim_repo(repo, [{}])
    with pytest.raises(SystemExit) as exc:
        main(["trial", "target=sim", f"repo={repo}", f"runs_dir={tmp_path / 'runs'}",
              f"env.DATABASE_URL={SECRET_VALUES['DATABASE_URL']}"])
    assert exc.value.code == 2
    err = capsys.readouterr().err
    assert "DATABASE_URL" in err and "hunter2pass" not in err


def test_a_redacted_value_is_never_a_level_of_a_candidate():
    """A secret set at the reference and gone now cannot be restored from the record: the
    difference says so and is not tested; nothing can build a candidate holding the mark."""
    from orchestrator.errors import SleuthError
    from orchestrator.system.differences import Change, apply, changes_from_system
    from orchestrator.system.fingerprint_diff import NOT_FROM_RECORD, diff

    ref = {"env": {"server": {"HF_TOKEN": REDACTED, "NCCL_PROTO": "LL128"}}}
    now = {"env": {"server": {"OTHER_KEY": REDACTED}}}
    by_key = {d.key: d for d in diff(ref, now)}
    assert not by_key["HF_TOKEN"].controllable and NOT_FROM_RECORD in by_key["HF_TOKEN"].detail
    assert by_key["NCCL_PROTO"].controllable
    # Set only now (value redacted): the reference level is "unset", which can be restored.
    assert by_key["OTHER_KEY"].controllable and by_key["OTHER_KEY"].factor[2] == "<unset>"
    changes = changes_from_system(diff(ref, now))
    assert {c.key for c in changes} == {"NCCL_PROTO", "OTHER_KEY"}
    with pytest.raises(SleuthError, match="redacted"):
        apply({"commit": "a" * 40}, [Change("env", "HF_TOKEN", None, REDACTED)], [0], str)


def test_isolate_refuses_a_redacted_level_and_resume_a_redacted_config(tmp_path, capsys):
    from orchestrator.commands.isolate import refuse_redacted
    from orchestrator.config.settings import build
    from orchestrator.errors import UserError

    repo = tmp_path / "repo"
    make_sim_repo(repo, [{}])
    with pytest.raises(SystemExit) as exc:
        main(["isolate", "target=sim", f"repo={repo}", f"runs_dir={tmp_path / 'runs'}",
              "good.env.NCCL_PROTO=LL128", f"bad.env.NCCL_PROTO={REDACTED}"])
    assert exc.value.code == 2 and "redacted" in capsys.readouterr().err
    assert not (tmp_path / "runs").exists() or not any(
        p for p in (tmp_path / "runs").iterdir() if not p.name.startswith("."))
    stored = build({"target": {"name": "sim", "extra_args": ["--api-key", REDACTED]}, "env": {}})
    with pytest.raises(UserError, match="target.extra_args"):
        refuse_redacted(stored, "run-x")


def test_trial_with_secrets_on_the_node_writes_none_and_launches_real_values(tmp_path,
                                                                             ray_session):
    """TOKENIZERS_PARALLELISM=false and NCCL_IB_PKEY=0 are candidates' values, launched as
    given (the server's own environment says so); the node's credentials appear nowhere."""
    from orchestrator.commands import trial as trial_cmd
    from orchestrator.config.compose import compose_settings
    from orchestrator.store import RunStore

    repo = tmp_path / "repo"
    make_sim_repo(repo, [{}])
    node = tmp_path / "runs" / ".nodes" / "local-0"
    node.mkdir(parents=True)
    (node / "env.json").write_text(json.dumps(SECRET_VALUES))
    cfg = compose_settings("trial", [
        "target=sim", f"repo={repo}", f"runs_dir={tmp_path / 'runs'}", "target.time_scale=0.02",
        "target.load_seconds=5", "bench.requests=2", "bench.output_len=32", "bench.input_len=32",
        "bench.warmup_requests=1", "bench.repetitions=1", "trial.retries=0",
        "env.TOKENIZERS_PARALLELISM=false", "env.NCCL_IB_PKEY=0", "run_id=t"])
    assert trial_cmd.run(cfg) == 0
    (row,) = RunStore.open(tmp_path / "runs" / "t" / "trials.db").trials()
    server = row.result.fingerprint["env"]
    assert server["source"] == "process"  # read back from the server process
    assert server["server"]["TOKENIZERS_PARALLELISM"] == "false"
    assert server["server"]["NCCL_IB_PKEY"] == "0"
    assert server["server"]["HF_TOKEN"] == REDACTED
    assert server["server"]["DATABASE_URL"] == f"postgres://{REDACTED}@db.internal:5432/metrics"
    written = b"".join(p.read_bytes() for p in (tmp_path / "runs" / "t").rglob("*") if p.is_file())
    for value in SECRET_VALUES.values():
        for piece in (value, value.split("://")[-1].split("@")[0]):
            assert piece.encode() not in written, piece


def test_credentials_a_server_prints_are_scrubbed_from_its_log():
    from orchestrator.system.redact import scrub, secret_values

    argv = ["python", "-m", "sglang.launch_server", "--api-key", "k3y-ab12cd34", "--tp", "8"]
    env = {"HF_TOKEN": "hf_" + "z" * 30, "DATABASE_URL": SECRET_VALUES["DATABASE_URL"], "X": "1"}
    secrets = secret_values(argv, env)
    assert {"k3y-ab12cd34", env["HF_TOKEN"], "admin:hunter2pass"} <= secrets and "1" not in secrets
    log = (f"server_args=ServerArgs(api_key='k3y-ab12cd34', tp_size=8)\nenv HF_TOKEN={env['HF_TOKEN']}"
           f"\nconnecting to {SECRET_VALUES['DATABASE_URL']}\n")
    clean = scrub(log, secrets)
    assert "k3y-ab12cd34" not in clean and "hunter2pass" not in clean and "zzzz" not in clean
    assert "tp_size=8" in clean and "db.internal:5432" in clean


def test_command_target_trial_leaves_no_credential_under_the_run(tmp_path, ray_session):
    """A benchmark command that takes --token and prints it: command.txt, config.yaml, the
    log and the store hold the placeholder, while the command itself got the real value."""
    from orchestrator.commands import trial as trial_cmd
    from orchestrator.config.compose import compose_settings
    from orchestrator.store import RunStore

    repo = tmp_path / "repo"
    make_sim_repo(repo, [{}])
    secret = "t0ken-5ecret-98765"
    script = tmp_path / "bench.py"
    script.write_text("import sys\nprint('using', sys.argv[2])\nprint(2.5)\n")
    bench = f"{sys.executable} {script} --token {secret}"
    cfg = compose_settings("trial", [f"repo={repo}", f"runs_dir={tmp_path / 'runs'}",
                                   "target=command", f"target.bench='{bench}'", "metric=value",
                                   "bench.repetitions=2", "bench.warmup_requests=0", "run_id=c"])
    assert trial_cmd.run(cfg) == 0
    (row,) = RunStore.open(tmp_path / "runs" / "c" / "trials.db").trials()
    assert row.result.value("value") == 2.5
    written = b"".join(p.read_bytes() for p in (tmp_path / "runs" / "c").rglob("*") if p.is_file())
    assert secret.encode() not in written
    assert b"using <redacted>" in written  # the log line is kept, the value is not
# ------------------------------------------------ secrets that arrive under another name
TOKEN = "tok3n-value-4f9e2a"  # no service's shape: only its variable's name marks it


@pytest.mark.parametrize("override", ["env.X=${oc.env:HF_TOKEN}", "target.env.X=${oc.env:HF_TOKEN}"])
def test_an_interpolated_secret_is_refused_like_a_written_one(override, tmp_path, capsys,
                                                              monkeypatch):
    monkeypatch.setenv("HF_TOKEN", TOKEN)
    repo = tmp_path / "repo"
    make_sim_repo(repo, [{}])
    with pytest.raises(SystemExit) as exc:
        main(["trial", "target=sim", f"repo={repo}", f"runs_dir={tmp_path / 'runs'}", override])
    assert exc.value.code == 2
    err = capsys.readouterr().err
    assert "X holds the value of HF_TOKEN, a secret" in err and TOKEN not in err
    assert len(err.strip().splitlines()) == 1
    assert not (tmp_path / "runs").exists()


def test_an_isolate_side_with_an_interpolated_secret_is_refused(tmp_path, capsys, monkeypatch):
    monkeypatch.setenv("MY_API_KEY", TOKEN)
    repo = tmp_path / "repo"
    make_sim_repo(repo, [{}])
    with pytest.raises(SystemExit) as exc:
        main(["isolate", "target=sim", f"repo={repo}", f"runs_dir={tmp_path / 'runs'}",
              "bad.env.NCCL_PROTO=LL", "bad.env.AUTH=${oc.env:MY_API_KEY}"])
    assert exc.value.code == 2
    err = capsys.readouterr().err
    assert "AUTH" in err and "secret" in err and TOKEN not in err
    assert not (tmp_path / "runs").exists()


def test_an_interpolated_secret_elsewhere_is_stored_and_shown_redacted(tmp_path, capsys,
                                                                       monkeypatch):
    """Where a value is not refused (a server argument), what is written down and what
    `--cfg` shows hold the placeholder, never the resolved token."""
    from orchestrator.commands.parts import create_run
    from orchestrator.config.compose import compose_settings

    monkeypatch.setenv("HF_TOKEN", TOKEN)
    overrides = ["target=sim", f"runs_dir={tmp_path / 'runs'}", "run_id=r",
                 "target.extra_args=[--model-token-file,${oc.env:HF_TOKEN}]"]
    with pytest.raises(SystemExit) as exc:
        main(["trial", "--cfg", *overrides])
    assert exc.value.code == 0
    shown = capsys.readouterr().out
    assert TOKEN not in shown and "--model-token-file" in shown and REDACTED in shown
    cfg = compose_settings("trial", overrides)
    assert TOKEN in cfg.target.extra_args  # the run itself uses the real value
    run_dir, store = create_run(cfg)
    store.close()
    written = b"".join(p.read_bytes() for p in run_dir.rglob("*") if p.is_file())
    assert TOKEN.encode() not in written


def test_a_variable_holding_another_one_s_secret_is_redacted_in_a_fingerprint():
    env = {"HF_TOKEN": TOKEN, "MY_COPY": TOKEN, "URL": f"https://x.org/?t={TOKEN}", "N": "8"}
    assert redact_env(env) == {"HF_TOKEN": REDACTED, "MY_COPY": REDACTED,
                               "URL": f"https://x.org/?t={REDACTED}", "N": "8"}


def test_a_server_error_that_echoes_its_api_key_is_stored_and_printed_redacted(
        tmp_path, ray_session, capsys):
    """A server that dies before it is ready saying its arguments (as a crashing server's last
    log lines often do): the trial's detail, stored and printed, holds the placeholder, as
    command.txt and the log already did."""
    from orchestrator.commands import trial as trial_cmd
    from orchestrator.config.compose import compose_settings
    from orchestrator.store import RunStore

    repo = tmp_path / "repo"
    make_sim_repo(repo, [{}])
    secret = "k3y-ab12cd34ef56"
    script = tmp_path / "server.py"
    script.write_text("import sys\nprint('bad arguments:', ' '.join(sys.argv[1:]))\n"
                      "sys.exit(1)\n")
    server = f"{sys.executable} {script} --api-key {secret} --port {{port}}"
    cfg = compose_settings("trial", [f"repo={repo}", f"runs_dir={tmp_path / 'runs'}",
                                     "target=command", f"target.server='{server}'",
                                     "target.ready_url='http://127.0.0.1:{port}/health'",
                                     "target.bench=true", "metric=value", "trial.retries=0",
                                     "run_id=s"])
    capsys.readouterr()
    assert trial_cmd.run(cfg) == 1
    (row,) = RunStore.open(tmp_path / "runs" / "s" / "trials.db").trials()
    assert row.outcome.value == "launch_failed", row.detail
    assert "bad arguments: --api-key <redacted>" in row.detail
    out = capsys.readouterr()
    assert secret not in row.detail and secret not in out.out + out.err
    written = b"".join(p.read_bytes() for p in (tmp_path / "runs" / "s").rglob("*") if p.is_file())
    assert secret.encode() not in written


# --------------------------------------------------------------- terminal escapes

HOSTILE = "retitle\x1b]0;pwned\x07 \x1b[31mred\x1b[0m over\rwrite\x08 \x9b2J bidi\u202eexe"
CONTROLS = [chr(c) for c in (*range(0x00, 0x09), *range(0x0b, 0x20), *range(0x7f, 0xa0))]


def _clean(text: str) -> bool:
    return not any(c in text for c in CONTROLS) and "\u202e" not in text


def test_printable_drops_whole_escape_sequences():
    from orchestrator.util.safe_text import printable

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
        main(["trial", "target=sim", f"repo={repo}", f"runs_dir={tmp_path / 'runs'}", "commit='x\x1b]0;t\x07y'"])
    assert exc.value.code == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and _clean(err.rstrip("\n"))
    assert "x\\x1b]0;t\\x07y" in err  # shown, escaped, rather than sent to the terminal


def test_server_log_tails_are_cleaned(tmp_path):
    from orchestrator.runner.trial_checks import last_lines, log_tail

    log = tmp_path / "server.log"
    log.write_bytes(b"starting\n\x1b[2J\x1b]0;owned\x07fatal: \x1b[31mCUDA error\x1b[0m\r\n")
    assert _clean(log_tail(log).replace("\n", ""))
    assert last_lines(log) == "starting | fatal: CUDA error"
