"""Secret redaction: the one set of rules for every value sleuth writes down.

A run directory is meant to be shared (attached to a bug, copied to a laptop), so nothing that
looks like a credential may reach `trials.db`, `config.yaml`, `command.txt` or a report. Three
rules, applied everywhere a value is written:

* **by name**: a variable whose name has a credential word as one of its parts (`HF_TOKEN`,
  `OPENAI_API_KEY`, `DB_PASSWORD`, `GH_PAT`, `SENTRY_DSN`). Parts, not substrings: neither
  `TOKENIZERS_PARALLELISM` nor `NCCL_IB_PKEY` is a secret, and redacting them would corrupt
  candidates that set them;
* **by value**: credentials inside a URL (`postgres://admin:pass@db/x` keeps its shape as
  `postgres://<redacted>@db/x`) and the token shapes of common services (`ghp_...`, `hf_...`,
  `sk-...`, `xoxb-...`, `AKIA...`, JWTs);
* **in argument lists**: the value after a flag whose name is a credential (`--api-key KEY`,
  `--token=T`, `--hf-token T`).

and one more, for values that came from elsewhere: **by the environment's secrets**, a value
that holds the value of a variable whose name is a secret (`env.X=${oc.env:HF_TOKEN}`, a node
exporting `X=$HF_TOKEN`, a server's error text echoing its `--api-key`): what a credential is
called on the way does not make it less of one.

A redacted value is a record, never a setting: a stored value holding :data:`REDACTED` must not
be launched, and a difference whose recorded side was redacted is "not controllable from the
record" (:func:`is_redacted` says which).
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping, Sequence

REDACTED = "<redacted>"

# Parts of a name that mark a credential. KEY only as a whole part (NCCL_IB_PKEY is a partition
# key number); TOKEN, SECRET and the password words also as the end of a part (ACCESSTOKEN).
_WHOLE_PARTS = frozenset({"KEY", "KEYS", "PAT", "DSN", "APIKEY", "AUTHKEY", "CREDENTIAL",
                          "CREDENTIALS", "COOKIE", "PASS", "PRIVATEKEY"})
_SUFFIXES = ("TOKEN", "SECRET", "PASSWORD", "PASSWD", "PASSPHRASE")

# Service token shapes (prefix + enough entropy that a plain word never matches).
_TOKEN_SHAPES = re.compile(
    r"(?<![A-Za-z0-9])("
    r"gh[pousr]_[A-Za-z0-9]{20,}"  # GitHub tokens
    r"|github_pat_[A-Za-z0-9_]{20,}"
    r"|hf_[A-Za-z0-9]{20,}"  # Hugging Face
    r"|sk-[A-Za-z0-9_-]{20,}"  # OpenAI / Anthropic style secret keys
    r"|xox[abprs]-[A-Za-z0-9-]{10,}"  # Slack
    r"|glpat-[A-Za-z0-9_-]{20,}"  # GitLab
    r"|AKIA[0-9A-Z]{16}"  # AWS access key id
    r"|AIza[0-9A-Za-z_-]{35}"  # Google API key
    r"|npm_[A-Za-z0-9]{36}"
    r"|pypi-[A-Za-z0-9_-]{40,}"
    r"|eyJ[A-Za-z0-9_-]{10,}\.[A-Za-z0-9_-]{10,}\.[A-Za-z0-9_-]{10,}"  # JWT
    r")"
)
# scheme://userinfo@host: the userinfo (user, or user:password) is a credential (a Sentry DSN
# carries its key there, a database URL its password).
_URL_USERINFO = re.compile(r"(?P<scheme>[A-Za-z][A-Za-z0-9+.-]*://)(?P<userinfo>[^/@\s:]*(:[^/@\s]*)?)@")


# A credential flag inside a command line kept as one string (`target.bench="... --token T"`).
_FLAG_IN_TEXT = re.compile(r"(?P<flag>(?<![\w-])--?(?P<name>[A-Za-z][\w-]*))(?P<sep>=|\s+)"
                           r"(?P<value>'[^']*'|\"[^\"]*\"|(?!-)[^\s'\"]+)")


def _parts(name: str) -> list[str]:
    return [p for p in re.split(r"[^A-Za-z0-9]+", name.upper()) if p]


def is_secret_name(name: str) -> bool:
    """Whether a variable (or flag) name marks its value as a credential."""
    return any(p in _WHOLE_PARTS or p.endswith(_SUFFIXES) for p in _parts(name))


def redact_value(value: str) -> str:
    """`value` with every credential inside it replaced (unchanged when it holds none)."""
    text = _URL_USERINFO.sub(lambda m: m.group("scheme") + REDACTED + "@"
                             if m.group("userinfo") else m.group(0), str(value))
    text = _FLAG_IN_TEXT.sub(lambda m: m.group("flag") + m.group("sep") + REDACTED
                             if is_secret_name(m.group("name")) else m.group(0), text)
    return _TOKEN_SHAPES.sub(REDACTED, text)


# A secret this short is not looked for inside other values (it would match by chance).
MIN_SECRET_LEN = 6


def environment_secrets(environ: Mapping[str, str] | None = None) -> dict[str, str]:
    """`{value: name}` of the variables of `environ` (this process's by default) whose names
    are secrets: what a configuration or a record must never hold by value."""
    import os

    env = os.environ if environ is None else environ
    return {str(v): str(k) for k, v in env.items()
            if is_secret_name(str(k)) and len(str(v)) >= MIN_SECRET_LEN}


def secret_source(value: str, environ: Mapping[str, str] | None = None) -> str | None:
    """The name of the secret variable whose value `value` holds, or None."""
    text = str(value)
    for secret, name in environment_secrets(environ).items():
        if secret in text:
            return name
    return None


def secret_in_value(value: str, environ: Mapping[str, str] | None = None) -> bool:
    """A credential shape inside `value`, or the value of one of the environment's secrets."""
    return redact_value(value) != str(value) or secret_source(value, environ) is not None


def is_redacted(value: object) -> bool:
    """True when a recorded value was (partly) redacted: it is not the value that was set."""
    return isinstance(value, str) and REDACTED in value


def redact_env(env: Mapping[str, str]) -> dict[str, str]:
    """An environment as it may be written down: secret names fully, secret values in part,
    and a variable holding another one's secret (`X=$HF_TOKEN`) like that one."""
    known = set(environment_secrets(env))
    return {str(k): (REDACTED if is_secret_name(str(k)) else scrub(str(v), known))
            for k, v in sorted(env.items())}


def _flag_name(arg: str) -> str | None:
    if not arg.startswith("-") or arg in ("-", "--"):
        return None
    return arg.lstrip("-").split("=", 1)[0]


def redact_argv(argv: Sequence[object]) -> list[str]:
    """An argument list as it may be written down: the value of a credential flag (`--api-key
    K`, `--token=T`) and any credential-shaped argument replaced."""
    out: list[str] = []
    hide_next = False
    for raw in argv:
        arg = str(raw)
        if hide_next and not arg.startswith("--"):
            out.append(REDACTED)
            hide_next = False
            continue
        hide_next = False
        name = _flag_name(arg)
        if name is not None and is_secret_name(name):
            if "=" in arg:
                out.append(arg.split("=", 1)[0] + "=" + REDACTED)
            else:
                out.append(arg)
                hide_next = True
            continue
        out.append(redact_value(arg))
    return out


def redact_config(node: object, path: str = "", known: Iterable[str] | None = None) -> object:
    """A configuration tree (plain dicts and lists) as it may be written down: mappings named
    `env` by variable, lists by argument, every other string by value; and any value holding
    one of the `known` secrets (by default the values of this process's secret variables: what
    an interpolation such as `${oc.env:HF_TOKEN}` resolved to) without it."""
    secrets = tuple(sorted(environment_secrets() if known is None else set(known), key=len,
                           reverse=True))
    return _redact_tree(node, path, secrets)


def _redact_tree(node: object, path: str, secrets: tuple[str, ...]) -> object:
    if isinstance(node, Mapping):
        if path.endswith("env") or path == "env":
            return {k: (REDACTED if is_secret_name(str(k))
                        else _redact_tree(v, f"{path}.{k}", secrets)) for k, v in node.items()}
        return {k: _redact_tree(v, f"{path}.{k}" if path else str(k), secrets)
                for k, v in node.items()}
    if isinstance(node, list | tuple):
        if all(isinstance(x, str | int | float) for x in node):
            if not any(isinstance(x, str) for x in node):
                return list(node)
            return [_known(x, secrets) for x in redact_argv(node)]
        return [_redact_tree(x, f"{path}[{i}]", secrets) for i, x in enumerate(node)]
    if isinstance(node, str):
        return _known(redact_value(node), secrets)
    return node


def _known(text: str, secrets: tuple[str, ...]) -> str:
    for value in secrets:
        text = text.replace(value, REDACTED)
    return text


def redacted_paths(node: object, path: str = "") -> list[str]:
    """Where a stored configuration holds a redacted value (e.g. `target.extra_args`)."""
    if isinstance(node, Mapping):
        return [p for k, v in node.items()
                for p in redacted_paths(v, f"{path}.{k}" if path else str(k))]
    if isinstance(node, list | tuple):
        return [path] if any(is_redacted(x) for x in node) else [
            p for i, x in enumerate(node) for p in redacted_paths(x, f"{path}[{i}]")]
    return [path] if is_redacted(node) else []


def secret_values(argv: Sequence[object], env: Mapping[str, str], min_len: int = 6) -> set[str]:
    """The credentials a trial hands its server (values of secret names, credential flags,
    URL userinfo, token shapes): what must be scrubbed from what the server writes."""
    found: set[str] = set()
    texts = [str(v) for v in env.values()] + [str(a) for a in argv]
    for name, value in env.items():
        if is_secret_name(str(name)):
            found.add(str(value))
    args = [str(a) for a in argv]
    for i, arg in enumerate(args):
        name = _flag_name(arg)
        if name is None or not is_secret_name(name):
            continue
        if "=" in arg:
            found.add(arg.split("=", 1)[1])
        elif i + 1 < len(args) and not args[i + 1].startswith("--"):
            found.add(args[i + 1])
    for text in texts:
        found |= {m.group(0) for m in _TOKEN_SHAPES.finditer(text)}
        found |= {m.group("userinfo") for m in _URL_USERINFO.finditer(text) if m.group("userinfo")}
    return {v for v in found if len(v) >= min_len}


def scrub(text: str, secrets: Iterable[str]) -> str:
    """`text` (a server's log) with every known secret and every credential shape replaced."""
    for value in sorted(set(secrets), key=len, reverse=True):
        text = text.replace(value, REDACTED)
    return redact_value(text)
