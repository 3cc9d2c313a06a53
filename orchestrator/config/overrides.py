"""What the user's overrides may say, checked before Hydra sees them.

Hydra's grammar is larger than sleuth's command line: `+foo=bar` adds a key the schema does not
have (struct mode is bypassed for it), `~bench` deletes a whole group, a key given twice lets
the last one win without a word, and `hydra.run.dir=X` sets Hydra's runtime configuration,
which the compose API ignores. Each of those would run something other than what the user
typed, so each is refused with one line naming the override (a repeated key on the command
line only: see `check_repeats`).

Open-ended dictionaries (`env.*`, `experiment.params.*`, `good.*`, `bad.*`) take new keys
without a `+` (compose.py adds Hydra's `++` itself), so a leading `+` is never needed.
"""

from __future__ import annotations

from orchestrator.errors import UserError
from orchestrator.util.safe_text import readable

# No setting's key is longer (a file name's limit: Hydra looks a key up as a group first).
MAX_KEY = 255


def key_of(override: str) -> str:
    """The configuration key an override sets, as the user means it (`packages` is the
    `packages.pins` list, `+x` and `++x` are x)."""
    key = override.split("=", 1)[0].lstrip("+~").strip()
    return "packages.pins" if key == "packages" else key


def check_overrides(overrides: list[str]) -> None:
    """Refuse (UserError, one line) an override that adds, deletes, or reaches into Hydra's
    own configuration."""
    for o in overrides:
        key = key_of(o)
        if len(key) > MAX_KEY:  # Hydra would look it up as a config group's file first
            raise UserError(f"the key {readable(key)} is not a setting or a variable name: keys"
                            " are dotted names such as target.tp_size or env.NCCL_PROTO")
        if o.startswith("~"):
            raise UserError(f"{o!r}: deleting a setting ('~') is not supported; set it to another"
                            " value instead (key=value)")
        if o.startswith("+"):
            raise UserError(f"{o!r}: '+' adds a key the configuration does not have; write"
                            f" {o.lstrip('+')!r} (env.* and experiment.params.* take new keys"
                            " as they are)")
        if key == "hydra" or key.startswith(("hydra.", "hydra/", "hydra@")):
            # `hydra.run.dir=X` (a setting) and `hydra/launcher=basic` (a config group) alike:
            # the compose API ignores Hydra's runtime configuration, so neither would do
            # anything but look accepted.
            raise UserError(f"{o!r}: sleuth composes its configuration with Hydra's compose API"
                            " and has no Hydra runtime settings or groups (launchers, sweepers,"
                            " logging); a run's files go to runs_dir/<run_id>")


def check_repeats(overrides: list[str]) -> None:
    """Refuse a key the command line gives twice, naming both: Hydra would let the last win
    without a word. Only the command line: code that composes a base list and then overrides
    part of it (`compose_config` callers) means the last one."""
    seen: dict[str, str] = {}
    for o in overrides:
        key = key_of(o)
        if key in seen:
            raise UserError(f"{key} is given twice ({seen[key]!r} and {o!r}): give it once")
        seen[key] = o
