"""Configuration: Hydra schemas (`schema`) and composition (`compose`)."""
