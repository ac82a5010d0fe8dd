"""Synthetic request logs drawn from the models the forecast assumes (presets by intent mix)."""
