"""Running trials: server processes (`process`), one trial (`trial`), the node actor (`node`)."""
