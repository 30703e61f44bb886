"""Model presets and importers producing a ModelSpec; parameter counting in planner.models.counting."""
